"""What cannot work, or cannot pay off, before any process starts: each rule with its reason.

`rejection(space, config)` (`SearchSpace.rejection`) names a valid configuration that cannot
work here or means nothing: CUDA graphs off CUDA, a scope or option the workload cannot use,
settings that contradict each other, a value the user pinned another way or excluded.
`doomed(config, traits, caps)` names a configuration that would run but is known to fail or
to waste its trial: more distinct compiled shapes than the recompile limit allows, or a code
path the GPU studies saw fail on this torch release. The search records such a configuration
infeasible with the reason, at no process cost (like `rejection`'s cases).
"""

from __future__ import annotations

import json
import math

from autocompile.space.capabilities import _MISSING
from autocompile.space.dimensions import (
    CUDA_GRAPH_MODES,
    DEFAULTS,
    EAGER,
    _member,
    _OPTION_GROUPS,
    _show,
    bucket_lengths,
    uses_cuda_graphs,
)

# Failures seen on the GPU, keyed by the torch releases they were seen on (prefix of the version):
# (releases, predicate on the configuration, reason).
SEEN_FAILING = (
    (
        ("2.11",),
        lambda c: c["inductor"].get("triton.cudagraph_trees") is False,
        "Inductor's non-tree CUDA-graph path (triton.cudagraph_trees=false) failed in training with "
        "`assert dst.data_ptr() == src.data_ptr()` on two models under torch 2.11 (llama-8b and a 24-block "
        "encoder: docs/decisions.md)",
    ),
    (
        ("2.11",),
        lambda c: c["inductor"].get("cpp_wrapper") is True,
        "Inductor's C++ wrapper (cpp_wrapper=true) failed to compile llama-8b's training step in both configurations "
        "tried under torch 2.11: `arg type List[int] is not yet supported by custom_op_wrapper` (varlen attention) "
        "and `CudaKernelParamCache not populated` (the compiled loss's kernel) (H200: docs/decisions.md)",
    ),
)


def compiled_shapes(
    padding: str,
    pad_multiple: int | None,
    lengths: tuple[int, int],
    buckets: list[int],
    rows: int = 1,
    pack_length: str = "longest",
) -> int:
    """How many distinct lengths a varying dimension takes after padding, over its whole range
    (lowest, highest): what a training run sees, not only the batches a trial measures. Packed: rows of
    the longest take one length and up to `rows` row counts; one row takes the batch's whole length."""
    low, high = lengths
    if padding == "pack" and pack_length == "longest":
        return rows
    if padding == "pack":
        return math.ceil(rows * high / pad_multiple) - math.ceil(low / pad_multiple) + 1
    if padding == "max":
        return 1
    if padding == "buckets":
        # bucket b takes the lengths above the bucket before it, up to b
        return sum(1 for i, b in enumerate(buckets) if b >= low and (i == 0 or buckets[i - 1] < high))
    if padding == "multiple":
        return math.ceil(high / pad_multiple) - math.ceil(low / pad_multiple) + 1
    return high - low + 1  # longest in the batch: every length


# CUDA graphs under the model's own non-reentrant checkpointing, open upstream (pytorch/pytorch#154306):
# the releases it was seen on, and those not known to be rid of it (every release this package allows).
CUDA_GRAPHS_UNDER_CHECKPOINTING = ("2.11", "2.12", "2.13", "2.14")


def doomed(config: dict, traits, caps) -> str | None:
    """Why a configuration that may run cannot work or cannot pay off here, or None."""
    if not config["compile"]:
        return None
    for releases, applies, reason in SEEN_FAILING:
        if caps.torch_version.startswith(releases) and applies(config):
            return reason
    return (
        _cuda_graphs_under_checkpointing(config, traits, caps)
        or _a_float_lr_under_a_schedule(config, traits)
        or _over_the_recompile_limit(config, traits, caps)
    )


def _cuda_graphs_under_checkpointing(config: dict, traits, caps) -> str | None:
    """CUDA graphs fail to record where the model's own checkpointing recomputes its blocks (its freed
    activations break the recording; the run that showed it: docs/decisions.md)."""
    on = config.get("activation_checkpointing", "as_built") != "off"
    if not (
        traits.checkpointing
        and on
        and uses_cuda_graphs(config)
        and caps.torch_version.startswith(CUDA_GRAPHS_UNDER_CHECKPOINTING)
    ):
        return None
    return (
        "CUDA graphs under the model's own activation checkpointing fail in training: \"graph recording observed "
        'an input tensor deallocate during graph recording that did not occur during replay" '
        f"(pytorch/pytorch#154306, open; torch {caps.torch_version}); turn the model's checkpointing off "
        "(activation_checkpointing off) to use them"
    )


def _a_float_lr_under_a_schedule(config: dict, traits) -> str | None:
    """A compiled optimizer step guards on its learning rate as a Python float: under a schedule
    each new value compiles the step again (test_apply shows it on the CPU; on the GPU: docs/decisions.md)."""
    if config["compile_optimizer"] and traits.schedule and not config["lr_tensor"]:
        return (
            "a compiled optimizer step with the learning rate as a float compiles again for each new "
            "value the LR schedule gives it; set lr_tensor (the learning rate as a tensor)"
        )
    return None


def _over_the_recompile_limit(config: dict, traits, caps) -> str | None:
    """dynamic=False compiles every distinct shape anew: more of them than the recompile limit
    and the rest falls back to eager (FailOnRecompileLimitHit, or a trial made infeasible)."""
    if config["dynamic"] is not False or not traits.varying or not traits.lengths:
        return None
    limit = config.get("recompile_limit") or caps.recompile_limit
    if not limit:
        return None
    shapes = compiled_shapes(
        config["padding"],
        config["pad_multiple"],
        traits.lengths,
        bucket_lengths(traits.lengths[1]),
        traits.rows,
        config.get("pack_length", "longest"),
    )
    if shapes <= limit:
        return None
    how = {
        "longest": "padded to the longest in each batch",
        "max": "padded to the maximum",
        "pack": f"packed ({config.get('pack_length', 'longest')})",
        "buckets": "padded to buckets",
        "multiple": f"padded to a multiple of {config['pad_multiple']}",
    }
    return (
        f"dynamic=False compiles each distinct length anew: lengths {traits.lengths[0]}-{traits.lengths[1]} "
        f"{how[config['padding']]} give {shapes} shapes, above the recompile limit of {limit} (the rest "
        "would run eager); pad to fewer lengths (buckets, a larger multiple, max) or let dynamic shapes in"
    )


def rejection(space, config: dict) -> str | None:
    """Why a (valid) configuration cannot work here, or means nothing; None if it may run.

    Conditions keep the sampler away from most of these; this catches the rest (a
    configuration written by hand, a pinned value, a recipe) before a trial is started.
    The baselines (eager, plain torch.compile) are references measured whatever the user
    pinned or excluded: only what cannot run at all is said of them.
    """
    c = {**json.loads(json.dumps(DEFAULTS)), **config}
    if not c["compile"]:
        return None
    caps, traits = space.caps, space.traits
    why = (
        _device_rejection(c, caps)
        or _scope_rejection(c, traits)
        or _mark_dynamic_rejection(c, caps, traits)
        or _parallel_rejection(space, c)
        or _checkpointing_rejection(space, c)
        or _packing_rejection(space, c)
        or _attention_rejection(space, c)
        or _multiple_rejection(space, c)
        or _experts_rejection(space, c)
        or _lm_loss_rejection(space, c)
        or _optimizer_rejection(c, traits)
        or _static_grads_rejection(c, caps)
        or _graph_step_rejection(c, caps, traits)
        or _foreach_map_rejection(c, caps, traits)
        or _clip_rejection(c, traits)
        or _step_in_backward_rejection(space, c)
        or _inductor_rejection(c, caps)
    )
    if why:
        return why
    if not _baseline(c):
        return _narrowing_rejection(space, c) or doomed(c, traits, caps)
    return None


def _device_rejection(c: dict, caps) -> str | None:
    """CUDA graphs, by a mode or by Inductor's option, only on a CUDA device."""
    modes = list(c["part_modes"].values()) if c["scope"] == "modular" else [c["mode"]]
    graph_modes = [m for m in modes if m in CUDA_GRAPH_MODES]
    if graph_modes and not caps.cuda:
        return f"mode {graph_modes[0]!r} uses CUDA graphs, which need a CUDA device (this is {caps.device})"
    if c["inductor"].get("triton.cudagraphs") is True and not caps.cuda:
        return f"inductor triton.cudagraphs=true: CUDA graphs need a CUDA device (this is {caps.device})"
    return None


def _scope_rejection(c: dict, traits) -> str | None:
    """Scope modular only for a workload with parts (the part_modes its own), regional only for a
    model with repeated blocks."""
    if c["scope"] == "modular":
        if len(traits.parts) < 2:
            return "scope 'modular' compiles the workload's natural parts, and this one declares none"
        unknown = sorted(set(c["part_modes"]) - set(traits.parts))
        if unknown:
            return f"part_modes names part(s) {unknown} the workload does not have; parts: {list(traits.parts)}"
    if c["scope"] == "regional" and traits.regions == []:
        return "scope 'regional' compiles each repeated block, and this model has none (no ModuleList of identical modules)"
    return None


def _mark_dynamic_rejection(c: dict, caps, traits) -> str | None:
    """Marks on the varying dimensions only where they vary and the marks change something."""
    if c["mark_dynamic"] == "off":
        return None
    how = "mark_dynamic" if c["mark_dynamic"] == "mark" else "maybe_mark_dynamic"
    if not traits.varying:
        return f"{how}: the workload has no varying dimension to mark"
    if c["padding"] == "max":
        return f"{how} with padding 'max': every batch is padded to one length, so nothing varies to mark"
    if c["padding"] == "pack":
        return (
            f"{how} with padding 'pack': the packed keys are new tensors (and the position ids); Dynamo's "
            "automatic dynamic shapes mark what varies after its first change"
        )
    if c["dynamic"] is True:
        return f"{how} with dynamic=True: every dimension is compiled dynamic already, the marks change nothing"
    if c["dynamic"] is False:
        return (
            f"{how} with dynamic=False: the marks win (torch {caps.torch_version} compiles the marked "
            "dimensions dynamic, one graph for all lengths), so this is dynamic=None with the marks "
            "under another name"
        )
    return None


def _optimizer_rejection(c: dict, traits) -> str | None:
    """The optimizer's step compiled or fused, not both; its learning rate a tensor only where a compiled
    step reads a schedule's; the criterion compiled only where the workload has one."""
    if c["compile_optimizer"] and c["fused_optimizer"]:
        return (
            "compile_optimizer with fused_optimizer: Dynamo does not trace into the fused step "
            "(torch wraps it in torch.compiler.disable, 'don't trace into fused optimizer'), so the "
            "compiled step runs the same fused kernel eagerly and only adds graph breaks; choose one"
        )
    if c["fused_optimizer"] and not traits.fusable_optimizer:
        return "fused_optimizer: the workload's optimizer has no fused implementation"
    if c["lr_tensor"] and not c["compile_optimizer"]:
        return "lr_tensor keeps LR changes from recompiling a compiled optimizer step; the step is not compiled"
    if c["lr_tensor"] and not traits.schedule:
        return "lr_tensor: the workload has no LR schedule, so its learning rate never changes"
    if c["compile_loss"] and not traits.criterion:
        return "compile_loss: the workload gives its loss as one function, with no criterion to compile apart"
    return None


def _inductor_rejection(c: dict, caps) -> str | None:
    """An Inductor option set away from its default only on the device it is for, and only where it
    acts (its group's condition)."""
    for options, why_not_here, active, why_inactive in _OPTION_GROUPS:
        for key in options:
            if key not in c["inductor"] or c["inductor"][key] == caps.inductor_defaults.get(key, _MISSING):
                continue
            if why_not_here and not caps.cuda:
                return f"inductor.{key}: {why_not_here}"
            if why_inactive and not active(c):
                return f"inductor.{key} {why_inactive}"
    return None


def _attention_rejection(space, c: dict) -> str | None:
    """The kernel of the model's own attention chosen where it is Hugging Face's SDPA on a GPU, and only where
    the model's own attention runs (not FlexAttention or varlen_attn under packing)."""
    how = c.get("attention", "model")
    if how == "model":
        return None
    if not (space.traits.sdpa_attention and space.caps.cuda):
        return f"attention {how}: chosen for a Hugging Face model's SDPA attention on a GPU only"
    if c["padding"] == "pack" and c.get("pack_attention", "model") != "model":
        return f"attention {how}: the model's own attention, not pack_attention {c['pack_attention']}"
    return None


def _multiple_rejection(space, c: dict) -> str | None:
    """Padding to a multiple that the job's own collator's multiple is a multiple of: the batches as built."""
    built = space.traits.pad_multiple
    if c["padding"] == "multiple" and built and built % c["pad_multiple"] == 0:
        return f"padding multiple {c['pad_multiple']}: the job's collator pads to a multiple of {built} already (padding longest)"
    return None


def _packing_rejection(space, c: dict) -> str | None:
    """Packing where the workload's layout allows it; its attention switched where the model can."""
    if c["padding"] != "pack":
        how = c.get("pack_attention", "model")
        return f"pack_attention {how}: only with padding pack" if how != "model" else None
    if space.traits.pack_refusal:
        return f"padding pack: {space.traits.pack_refusal}"
    if c.get("pack_attention", "model") == "flex" and not space.traits.flex_attention:
        return "pack_attention flex: the model's attention cannot be switched to FlexAttention here"
    if c.get("pack_attention", "model") == "varlen" and not (space.traits.varlen_attention and space.caps.cuda):
        return "pack_attention varlen: Flash Attention over each sequence needs a GPU and a causal Hugging Face model here"
    return None


def _lm_loss_rejection(space, c: dict) -> str | None:
    """The loss from the hidden states only where it is a Hugging Face causal LM's own; torch's fused one only
    where this torch has it."""
    how = c.get("lm_loss", "model")
    if how == "model":
        return None
    if space.traits.lm_loss_refusal:
        return f"lm_loss {how}: {space.traits.lm_loss_refusal}"
    if how == "fused" and not space.caps.has_linear_cross_entropy:
        return f"lm_loss fused: torch {space.caps.torch_version} has no torch.nn.functional.linear_cross_entropy"
    return None


def _experts_rejection(space, c: dict) -> str | None:
    """Another implementation of the experts only where the model's can switch to it; the per-expert loop
    never under fullgraph, since its loop over the experts a batch routes to breaks the graph."""
    how = c.get("experts", "model")
    if how == "model":
        return None
    if how == space.traits.experts:
        return f"experts {how}: the model's own implementation (experts model)"
    if how in space.traits.experts_refused:
        return f"experts {how}: {space.traits.experts_refused[how]}"
    if how not in space.traits.other_experts:
        return f"experts {how}: not an implementation this model's experts can switch to"
    if how == "eager" and c["fullgraph"]:
        return "experts eager: its loop over the experts a batch routes to breaks the graph, which fullgraph refuses"
    return None


def _checkpointing_rejection(space, c: dict) -> str | None:
    """The model's own checkpointing is switched only where it has some, selectively only where the
    compile traces the checkpoint (not around each compiled block, as under scope regional)."""
    how = c.get("activation_checkpointing", "as_built")
    if how == "as_built":
        return None
    traits = space.traits
    if not traits.checkpointing:
        return f"activation_checkpointing {how}: the model does not checkpoint its activations"
    if how == "selective" and not (traits.selective_checkpointing and space.caps.has_selective_checkpointing):
        return "activation_checkpointing selective: not offered here (see `autocompile space`)"
    if how == "selective" and c["scope"] == "regional" and not traits.checkpoint_in_forward:
        return (
            "activation_checkpointing selective with scope regional: the model's checkpoint wraps each compiled "
            "block from outside, where a selective policy sees compiled kernels, not the operations it chooses "
            "among; use scope full or modular"
        )
    return None


def _static_grads_rejection(c: dict, caps) -> str | None:
    """static_grads marks the gradients a compiled step reads, for CUDA graphs' sake."""
    if not c.get("static_grads"):
        return None
    if not caps.has_mark_static_address:
        return f"static_grads: torch {caps.torch_version} has no torch._dynamo.mark_static_address"
    if not caps.cuda:
        return f"static_grads: its effect is on CUDA graphs, which need a CUDA device (this is {caps.device})"
    if not c["compile_optimizer"]:
        return "static_grads marks the gradients a compiled optimizer step reads; the step is not compiled"
    if not uses_cuda_graphs(c):
        return (
            "static_grads: its effect is on CUDA graphs (mode reduce-overhead or max-autotune), and this configuration uses none"
        )
    return None


def _graph_step_rejection(c: dict, caps, traits) -> str | None:
    """The compiled step under CUDA graphs of its own: on CUDA, its gradients marked static, its LR a
    tensor where a schedule changes it (a float LR is a constant of the recorded graph)."""
    if not c.get("graph_step"):
        return None
    if not caps.has_mark_static_address:
        return f"graph_step: torch {caps.torch_version} has no torch._dynamo.mark_static_address"
    if not caps.cuda:
        return f"graph_step: CUDA graphs need a CUDA device (this is {caps.device})"
    if not c["compile_optimizer"]:
        return "graph_step records the compiled optimizer step under CUDA graphs; the step is not compiled"
    if traits.schedule and not c["lr_tensor"]:
        return "graph_step under an LR schedule needs lr_tensor: a float LR is a constant of the step's graph"
    if c["static_grads"]:
        return "graph_step marks the gradients static itself; static_grads is for a step in the default mode"
    return None


def _foreach_map_rejection(c: dict, caps, traits) -> str | None:
    """The foreach_map step replaces the optimizer's step: not beside another implementation of it."""
    if not c.get("foreach_map_optimizer"):
        return None
    if not caps.has_foreach_map:
        return f"foreach_map_optimizer: torch {caps.torch_version} has no torch._higher_order_ops.foreach_map"
    if traits.foreach_map_refusal:
        return f"foreach_map_optimizer: {traits.foreach_map_refusal}"
    for other in ("compile_optimizer", "fused_optimizer"):
        if c[other]:
            return (
                f"foreach_map_optimizer with {other}: the foreach_map step replaces the optimizer's own step, "
                f"which {other} would change; choose one"
            )
    return None


def _clip_rejection(c: dict, traits) -> str | None:
    """Clipping folded into the optimizer's own fused step: not where another step replaces it."""
    if not c.get("clip_in_step"):
        return None
    if traits.clip_refusal is not None:
        return f"clip_in_step: {traits.clip_refusal or 'the workload clips no gradients in a Trainer step'}"
    for other in ("compile_optimizer", "foreach_map_optimizer"):
        if c.get(other):
            return (
                f"clip_in_step with {other}: the clip's scale is read by the optimizer's own fused step, which {other} replaces"
            )
    return None


def step_in_backward_refusal(traits, parallel: str) -> str | None:
    """Why no block of this workload can step in the backward, or None: an optimizer or a loop that would train
    otherwise (space/optimizer.py), no repeated blocks, or gradients that are whole only once ranks reduce them."""
    if traits.step_in_backward_refusal:
        return traits.step_in_backward_refusal
    if not traits.regions:
        return "the model has no repeated blocks to step one at a time"
    if parallel != "none":
        return f"under --parallel {parallel} a block's gradients are whole only once its ranks reduce them"
    return None


def _step_in_backward_rejection(space, c: dict) -> str | None:
    """The optimizer's own step or the foreach_map step, a block at a time in the backward: where the workload
    allows it, and not where the whole step is compiled or clips."""
    if not c.get("step_in_backward"):
        return None
    why = step_in_backward_refusal(space.traits, space.parallel)
    if why:
        return f"step_in_backward: {why}"
    for other in ("compile_optimizer", "clip_in_step"):
        if c.get(other):
            return f"step_in_backward with {other}: the blocks step with the optimizer's own or the foreach_map step, not {other}"
    return None


# What each --parallel setting owns, and its value where it changes nothing.
_PARALLEL_OWNER = {
    "optimize_ddp": ("ddp", None),
    "fsdp_compile_order": ("fsdp2", "before"),
    "reshard_after_forward": ("fsdp2", True),
}
_SPLITS = (None, True, "ddp_optimizer")  # optimize_ddp values under which DDP's graph is split at buckets


def _parallel_rejection(space, c: dict) -> str | None:
    """The settings of DDP and FSDP2: each only under its strategy, and only where it can hold."""
    parallel = getattr(space, "parallel", "none")
    for key, (owner, neutral) in _PARALLEL_OWNER.items():
        if c[key] != neutral and parallel != owner:
            return f"{key} is a setting of --parallel {owner}, and this search is --parallel {parallel}"
    if parallel == "ddp" and c["compiled_autograd"] and not str(c["optimize_ddp"]).startswith("python_reducer"):
        return (
            "compiled_autograd under DDP needs optimize_ddp='python_reducer' (scope full): torch 2.13 raises "
            "'Compiled autograd is not compatible with C++ DDP Reducer' (a 2-rank gloo trial)"
        )
    if parallel == "ddp" and c["scope"] == "full":
        mode = c["optimize_ddp"]
        if c["fullgraph"] and mode in _SPLITS:
            return (
                "fullgraph under DDP with optimize_ddp splitting the graph at gradient buckets: the split is "
                "graph breaks by design (001, step 5: fullgraph had to be turned off for DDP)"
            )
        if str(mode).startswith("python_reducer") and not c["compiled_autograd"]:
            return f"optimize_ddp={mode!r} traces DDP's Python reducer with Compiled Autograd: set compiled_autograd"
    if parallel == "fsdp2" and c["foreach_map_optimizer"]:
        return (
            "foreach_map_optimizer under FSDP2: its step is written for plain tensors, and FSDP2's parameters "
            "are DTensors (not measured together)"
        )
    if parallel == "fsdp2" and c["fsdp_compile_order"] == "after" and c["scope"] != "regional":
        return "fsdp_compile_order: a block is compiled before or after fully_shard only with scope 'regional'"
    return None


def _baseline(config: dict) -> bool:
    keys = [k for k in DEFAULTS if k not in ("matmul_precision", "recompile_limit")]
    return any(all(config[k] == base[k] for k in keys) for base in (DEFAULTS, EAGER))


def _narrowing_rejection(space, config: dict) -> str | None:
    """A value the user pinned another way, or excluded, where its dimension applies."""
    for dim in space.dimensions:
        if not dim.active(config):
            continue
        value = space._value(dim, config)
        if dim.name in space.fixed and not _member(value, (space.fixed[dim.name],)):
            return f"{dim.name} is pinned to {_show(space.fixed[dim.name])} ({space.pinned_by[dim.name]}), not {_show(value)}"
        if _member(value, space.excluded.get(dim.name, ())):
            return f"{dim.name}={_show(value)} is excluded by {space.space_file.label}"
    return None
