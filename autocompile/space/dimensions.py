"""The dimensions of the space: DEFAULTS, modes, scopes, paddings, the Inductor option groups, `Dimension`.

A configuration is a plain JSON-able dict (the keys of `DEFAULTS`); `Dimension` is one searched
setting with the values it may take and a condition on the values chosen before it. What each
setting shapes of the compiled graphs (`GRAPHS`) is declared once, beside DEFAULTS.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Callable

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
SCOPES = ("full", "regional", "modular")
PADDINGS = ("longest", "multiple", "buckets", "max", "pack")
PACK_LENGTHS = ("longest", "batch")  # packed rows of the workload's longest sequence, or the whole batch in one row
# under packing: the model's own attention, FlexAttention with a document mask, or Flash Attention over each
# sequence (torch's varlen_attn)
PACK_ATTENTION = ("model", "flex", "varlen")
MARK_DYNAMIC = ("off", "mark", "maybe")
# The kernel a Hugging Face model's SDPA attention runs: torch's own choice at each call, or Flash Attention
# (the memory-efficient kernel where a mask needs one) without cuDNN's, which plans each new length on the host
ATTENTION = ("model", "flash")
# How a Hugging Face mixture of experts computes its experts (transformers' ExpertsInterface): as built, a loop over
# the experts a batch hits, one grouped matrix product per projection, or one batched product over each token's top-k
EXPERTS = ("model", "eager", "grouped_mm", "batched_mm")
# A Hugging Face causal LM's loss over its vocabulary: its own (the whole [tokens, vocabulary] logits), torch's
# fused linear cross-entropy (torch.nn.functional.linear_cross_entropy, chunked), or the snippet's compiled chunked
# one; the two last take the last hidden states and the head's weight, so that the logits never exist whole
LM_LOSS = ("model", "fused", "chunked")
PARALLEL = ("none", "ddp", "fsdp2")  # how a trial's ranks share the model (--parallel)
PARALLEL_KEYS = ("optimize_ddp", "fsdp_compile_order", "reshard_after_forward")
# The model's own activation checkpointing (autocompile.workloads.checkpointing): as the workload built
# it, off (compile's partitioner recomputes what the budget says instead), or selective (a policy that
# keeps what matrix multiplications and attention compute, and recomputes the rest)
CHECKPOINTING = ("as_built", "off", "selective")

# The configuration of plain `torch.compile(model)`: every key a configuration may hold.
DEFAULTS: dict[str, Any] = {
    "compile": True,
    "scope": "full",  # full model | regional: each repeated block | modular: the workload's parts
    "mode": "default",
    "part_modes": {},  # modular scope: part -> mode
    "dynamic": None,
    "fullgraph": False,
    # Dynamo traces data-dependent scalars (Tensor.item()) and output shapes (nonzero) into its graphs instead
    # of breaking them there (capture_scalar_outputs, capture_dynamic_output_shape_ops)
    "capture_data_dependent": False,
    "compile_optimizer": False,  # torch.compile(optimizer.step)
    "lr_tensor": False,  # with compile_optimizer: the learning rate as a tensor, so a scheduler does not recompile the step
    "fused_optimizer": False,  # switch the optimizer to its fused (single-kernel) implementation
    "compile_loss": False,  # compile the workload's criterion (outputs, batch) -> loss apart from the model
    "padding": "longest",  # of the varying batch dimensions; "pack": the batch's sequences packed into rows
    "pad_multiple": None,  # with padding == "multiple", or a packed row's length (pack_length "batch")
    "pack_length": "longest",  # with padding == "pack": rows of the workload's longest, or one row for the batch
    "pack_attention": "model",  # with padding == "pack": the model's attention, FlexAttention (a document mask) or varlen
    "mark_dynamic": "off",  # mark the varying dimensions dynamic: off | mark | maybe
    "attention": "model",  # the SDPA kernel of the model's own attention: model (torch's choice) | flash
    "experts": "model",  # a mixture of experts' implementation: model (as built) | eager | grouped_mm | batched_mm
    "lm_loss": "model",  # a causal LM's loss over its vocabulary: model (its logits) | fused | chunked
    "inductor": {},  # Inductor config options that differ from the installed defaults
    "recompile_limit": None,  # None: torch's own
    "matmul_precision": None,  # None: torch's own ("highest"); "high" allows TF32
    # The model's own activation checkpointing, where it has some: as_built | off | selective
    "activation_checkpointing": "as_built",
    # AOTAutograd's partitioner: the share of activation memory kept for the backward, the rest
    # recomputed (torch._functorch.config.activation_memory_budget; None: torch's own, 1.0)
    "activation_memory_budget": None,
    # Compiled Autograd: the backward pass traced by the autograd engine and compiled as a graph
    # of its own (the snippet's backward(loss)); AOTAutograd's own backward graphs otherwise
    "compiled_autograd": False,
    # Gradients zeroed in place and marked static (torch._dynamo.mark_static_address) before the
    # compiled optimizer step, so CUDA graphs read them where they are instead of copying each one
    # in (001 step #3); with compile_optimizer where the model's mode records CUDA graphs (the step
    # itself compiles in the default mode)
    "static_grads": False,
    # The compiled optimizer step under CUDA graphs of its own (mode reduce-overhead), whatever the
    # model's mode: its gradients marked static (as static_grads does) and its tensor LR on the device,
    # so that each step replays one graph instead of launching the step's kernels
    "graph_step": False,
    # The optimizer step as one compiled function of foreach_map ops (Adam and AdamW; 001 step #4),
    # instead of torch's own foreach, fused or compiled step
    "foreach_map_optimizer": False,
    # A Trainer's gradient clipping folded into its fused Adam/AdamW step: the norm computed, and each gradient
    # divided by the clip's scale inside the step's kernel (as it unscales a GradScaler's), not in a pass of its own
    "clip_in_step": False,
    # Each repeated block's optimizer step run in the backward, as soon as the block's gradients are in, on a CUDA
    # stream of its own: the memory-bound step beside the matmuls of the blocks' backward before it
    "step_in_backward": False,
    # Under `--parallel` only (autocompile.parallel); at these values they change nothing:
    "optimize_ddp": None,  # DDP: torch._dynamo.config.optimize_ddp (None: torch's own, graphs split at buckets)
    "fsdp_compile_order": "before",  # FSDP2: each block compiled before fully_shard (torchtitan's order) or after
    "reshard_after_forward": True,  # FSDP2: free the gathered parameters after the forward (fully_shard's default)
}
EAGER: dict[str, Any] = {**DEFAULTS, "compile": False}


class Graphs(enum.Flag):
    """What a setting shapes of the graphs a trial compiles (`GRAPHS`); a setting may shape several."""

    TRACED = enum.auto()  # the graphs Dynamo traces, and so their guards and shape constraints
    MODEL = enum.auto()  # the model's compiled graphs: a move of a setting without it reuses them
    STEP = enum.auto()  # the optimizer step's compiled graphs
    SHAPES = enum.auto()  # the shapes the graphs are compiled for
    BESIDES = enum.auto()  # a graph compiled besides the model's: the step, the loss, the backward again


_T, _M, _S, _SH, _B = Graphs.TRACED, Graphs.MODEL, Graphs.STEP, Graphs.SHAPES, Graphs.BESIDES
# What each setting (each key of DEFAULTS) shapes; each user asks for the kind it needs (`shaping`).
# Traced: which graphs are traced (scope, the loss apart, the backward again under compiled autograd,
# graphs split at DDP buckets or around FSDP2's shards), whether a graph may break, how sizes are
# treated and which lengths the batches bring; the step, the LR handling, Inductor's options and
# the mode compile the same traced graphs with the same guards. The loss compiled apart is traced
# and a graph besides the model's, whose compiled graphs it leaves as they are.
GRAPHS: dict[str, Graphs] = {
    "compile": _M,
    "scope": _T | _M,
    "mode": _M | _S,
    "part_modes": _M,
    "dynamic": _T | _M | _SH,
    "fullgraph": _T | _M,
    "capture_data_dependent": _T | _M,
    "compile_optimizer": _S | _B,
    "lr_tensor": _S,
    "fused_optimizer": _S,
    "compile_loss": _T | _B,
    "padding": _T | _M | _SH,
    "pad_multiple": _T | _M | _SH,
    "pack_length": _M,
    "pack_attention": _M,
    "mark_dynamic": _M | _SH,
    "attention": _T | _M,
    "experts": _T | _M,
    "lm_loss": _T | _M | _B,
    "inductor": _M,
    "recompile_limit": _M,
    "matmul_precision": _M,
    "activation_checkpointing": _M,
    "activation_memory_budget": _M,
    "compiled_autograd": _T | _M | _B,
    "static_grads": _M,
    "graph_step": _S,
    "foreach_map_optimizer": _M | _B,
    "clip_in_step": Graphs(0),  # no compiled graph: the fused step's kernel is torch's own
    "step_in_backward": Graphs(0),  # no compiled graph: the optimizer's own step, a block at a time
    "optimize_ddp": _T | _M,
    "fsdp_compile_order": _T | _M,
    "reshard_after_forward": _M,
}


def shaping(kind: Graphs) -> tuple[str, ...]:
    """The settings (keys of DEFAULTS) that shape `kind` of the compiled graphs, in DEFAULTS' order."""
    return tuple(key for key in DEFAULTS if kind in GRAPHS[key])


# Recipes from the seed texts, tried right after the baselines so that a short search starts
# from known-good ground (each applies only where its values are offered).
STARTING_POINTS: list[dict] = [
    # Where the model checkpoints its activations: its checkpointing off, compile's partitioner keeping
    # half of them (1.5x the steps/s of its own checkpointing on a LoRA 8B: docs/decisions.md), its
    # batches packed where they can be, else padded
    {
        "scope": "regional",
        "activation_checkpointing": "off",
        "activation_memory_budget": 0.5,
        "fused_optimizer": True,
        "compile_loss": True,
        "padding": "pack",
        "pack_length": "batch",
        "pad_multiple": 64,
    },
    {
        "scope": "regional",
        "activation_checkpointing": "off",
        "activation_memory_budget": 0.5,
        "fused_optimizer": True,
        "compile_loss": True,
        "padding": "multiple",
        "pad_multiple": 64,
    },
    {"scope": "regional"},  # each block compiled once: short warm-up, usually near full speed
    # Where lengths vary on a GPU, a Hugging Face model's SDPA attention kept off cuDNN's kernel, whose per-length
    # plans kept the host busier than the GPU (a Trainer's Llama 8B job: docs/results.md)
    {"scope": "regional", "attention": "flash"},
    # Where Flash Attention over each packed sequence is offered (CUDA, a causal Hugging Face decoder): the batch
    # in one row, the optimizer step compiled with a tensor LR (llama-8b: 6.59 steps/s against 6.43 under the
    # model's attention and 6.03 with fused AdamW, H200: docs/decisions.md)
    {
        "scope": "regional",
        "compile_optimizer": True,
        "lr_tensor": True,
        "compile_loss": True,
        "padding": "pack",
        "pack_length": "batch",
        "pad_multiple": 64,
        "pack_attention": "varlen",
    },
    # Where the batches can be packed: the whole batch in one row, no padding computed but its tail (llama-8b
    # computed 27% padding padded to its longest, a LoRA fine-tune's batches of 4 50%)
    {
        "scope": "regional",
        "fused_optimizer": True,
        "compile_loss": True,
        "padding": "pack",
        "pack_length": "batch",
        "pad_multiple": 64,
    },
    {"scope": "regional", "fused_optimizer": True, "compile_loss": True, "padding": "multiple", "pad_multiple": 64},
    # (lr_tensor applies where the workload has an LR schedule: else each new LR recompiles the step)
    {"scope": "regional", "compile_optimizer": True, "lr_tensor": True, "padding": "multiple", "pad_multiple": 64},
    # CUDA only (skipped where reduce-overhead is not offered): CUDA graphs on a few fixed shapes
    {"scope": "regional", "mode": "reduce-overhead", "padding": "buckets", "compile_optimizer": True, "lr_tensor": True},
    # The seed's best by hand: the whole model, its varying length marked dynamic
    {"scope": "full", "mark_dynamic": "maybe", "fused_optimizer": True, "compile_loss": True},
    {"scope": "full", "mode": "max-autotune-no-cudagraphs", "compile_optimizer": True, "lr_tensor": True},
]

# A recipe that names one of these applies only where the space has it (elsewhere its other values
# would make another recipe: a budget without the checkpointing it stands in for).
RECIPE_NEEDS = ("activation_checkpointing", "attention")

# Activation memory budgets tried where memory is the constraint, or the model's own checkpointing is
# off: None keeps what the partitioner keeps by default, lower values recompute more activations in
# the backward to save memory, down to nearly all of them.
ACTIVATION_BUDGETS = (None, 0.8, 0.5, 0.2, 0.05)

# Inductor options searched, with the values tried; each is offered only if the installed
# torch has the key with a value of the same type.
INDUCTOR_OPTIONS: dict[str, tuple] = {
    "shape_padding": (True, False),
    "epilogue_fusion": (True, False),
    "aggressive_fusion": (False, True),
}
INDUCTOR_OPTIONS_CUDA: dict[str, tuple] = {
    "coordinate_descent_tuning": (False, True),
}
# The host's work between kernels, where a step waits on it (llama-8b packed: 118 ms of kernels in a step of
# 152-165 ms, the GPU idle while the host ran the compiled graphs' Python wrappers and Dynamo's guards,
# studies/README.md "One host of four H200s an eighth time"): the wrapper's size and stride checks left
# out, the wrapper itself as C++ (each graph's wrapper compiled too: more warm-up).
INDUCTOR_OPTIONS_HOST: dict[str, tuple] = {
    "size_asserts": (True, False),
    "cpp_wrapper": (False, True),
}
INDUCTOR_OPTIONS_AUTOTUNE: dict[str, tuple] = {
    "max_autotune_gemm_backends": ("ATEN,TRITON", "TRITON", "ATEN"),
}
INDUCTOR_OPTIONS_CUDAGRAPHS: dict[str, tuple] = {
    "triton.cudagraph_trees": (True, False),
    # variable lengths: record a graph per shape (default) or run dynamic-shape graphs without
    "triton.cudagraph_skip_dynamic_graphs": (False, True),
    # re-recordings (new input addresses) allowed before a function falls back to no CUDA graph
    "triton.cudagraph_unexpected_rerecord_limit": (128, 16),
    # split graphs around ops CUDA graphs cannot hold, so the rest is still captured
    "graph_partition": (True, False),
}


def uses_cuda_graphs(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return any(mode in CUDA_GRAPH_MODES for mode in modes) or config["inductor"].get("triton.cudagraphs") is True


def uses_autotune(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return any(mode.startswith("max-autotune") for mode in modes) or config["inductor"].get("max_autotune") is True


# Where a grouped Inductor option means something, and why it is left out elsewhere.
_OPTION_GROUPS = (
    (INDUCTOR_OPTIONS, None, lambda c: True, None),
    (INDUCTOR_OPTIONS_CUDA, "tunes Triton kernels: needs CUDA", lambda c: True, None),
    (INDUCTOR_OPTIONS_HOST, "the host's launch work between GPU kernels: needs CUDA", lambda c: True, None),
    (
        INDUCTOR_OPTIONS_AUTOTUNE,
        "max-autotune GEMM backends: needs CUDA",
        uses_autotune,
        "only matters with max-autotune (mode max-autotune or max-autotune-no-cudagraphs)",
    ),
    (
        INDUCTOR_OPTIONS_CUDAGRAPHS,
        "CUDA-graph option: needs CUDA",
        uses_cuda_graphs,
        "only matters with CUDA graphs (mode reduce-overhead or max-autotune)",
    ),
)


def _member(value, choices) -> bool:
    """`value in choices`, but True is not 1 and 1.0 is not 1."""
    return any(type(value) is type(choice) and value == choice for choice in choices)


def _show(value) -> str:
    return json.dumps(value)


@dataclass
class Dimension:
    name: str  # the Optuna parameter name
    choices: tuple
    help: str
    active: Callable[[dict], bool] = lambda config: True
    where: str = ""  # `active` in words, where it is not everywhere (shown by `autocompile space`)

    @property
    def graphs(self) -> Graphs:
        """What this dimension shapes of the compiled graphs: its setting's `GRAPHS` (an Inductor
        option's and a part's mode, those of `inductor` and `part_modes`)."""
        return GRAPHS[self.key_path()[0]]

    def key_path(self) -> tuple[str, ...]:
        """Where the value goes in a configuration: ("mode",) or ("inductor", "shape_padding")."""
        if self.name.startswith("inductor."):
            return ("inductor", self.name[len("inductor.") :])
        if self.name.startswith("mode."):
            return ("part_modes", self.name[len("mode.") :])
        return (self.name,)


@dataclass
class WorkloadTraits:
    """What the space needs to know of a workload: found without running it."""

    varying: dict[str, tuple[int, int]] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    regions: list[str] | None = None  # repeated-block lists; None: not known before building
    blocks: int = 0  # the repeated blocks in them, all lists together
    fusable_optimizer: bool = False  # the optimizer has a fused implementation (Adam, AdamW, SGD)
    criterion: bool = False  # the loss comes as forward + criterion: the criterion can be compiled apart
    schedule: bool = False  # the learning rate follows a scheduler, changing during training
    lengths: tuple[int, int] | None = None  # the varying dimension's range (lowest, highest): None if unknown
    rows: int = 1  # the rows (sequences) of a batch: what packing may make fewer
    memory_bound: str | None = None  # why memory is the constraint (--max-memory-gb, eager's peak), or None
    # the model's own activation checkpointing, on as built, in words (workloads.checkpointing.find), or None
    checkpointing: str | None = None
    selective_checkpointing: bool = False  # a selective policy can be given to it
    checkpoint_in_forward: bool = False  # inside each block's forward: a block compiled alone traces it
    # why its variable-length batches cannot be packed (workloads.packing.refusal), or None
    pack_refusal: str | None = "the workload's batch layout is not known"
    # where its SequenceLayout came from, in words (declared, or what was found from its model), or None
    layout_source: str | None = None
    flex_attention: bool = False  # its model's attention can be switched to FlexAttention
    varlen_attention: bool = False  # ... or to a function of the snippet's (varlen_attn over each packed sequence)
    sdpa_attention: bool = False  # a Hugging Face model's SDPA attention, whose kernel the snippet can choose
    pad_multiple: int | None = None  # the multiple the job's own collator pads lengths to, as built (pad_to_multiple_of)
    experts: str = ""  # a Hugging Face mixture of experts' implementation as built ("": no such experts)
    other_experts: tuple[str, ...] = ()  # ... and those the installed transformers can switch it to
    experts_refused: dict[str, str] = field(default_factory=dict)  # ... and of those, the ones left out: why
    # why the causal LM's loss cannot take the hidden states and the head's weight instead of the logits, or None
    lm_loss_refusal: str | None = "the workload's model is not known"
    # why the foreach_map step cannot stand in for the optimizer's (space/optimizer.py), or None
    foreach_map_refusal: str | None = "the workload's optimizer is not known"
    # why the framework's gradient clipping cannot be folded into its optimizer's step (space/optimizer.py), or None;
    # "" where the workload's step clips nothing of a framework's (nothing to say)
    clip_refusal: str | None = ""
    # why the optimizer's step cannot run a block at a time in the backward (space/optimizer.py), or None
    step_in_backward_refusal: str | None = "the workload's optimizer is not known"


def bucket_lengths(max_len: int, limit: int = 8) -> list[int]:
    """Powers of two from 16 up to max_len (max_len itself last), at most `limit` of them."""
    lengths, n = [], 16
    while n < max_len:
        lengths.append(n)
        n *= 2
    lengths.append(max_len)
    return lengths[-limit:]
