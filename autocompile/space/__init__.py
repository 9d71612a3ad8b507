"""The search space: which compile settings exist, where they mean something, and their defaults.

A configuration is a plain JSON-able dict (the keys of `DEFAULTS`). The space is a list of
`Dimension`s, each with the values it may take and a condition on the values chosen before
it, so one definition serves three uses: sampling define-by-run from an Optuna trial
(`SearchSpace.suggest`), listing (`SearchSpace.describe`, shown by `autocompile space`) and
validating a configuration a user wrote by hand (`SearchSpace.validate`).

Only what the installed torch and the device support is offered; what is left out is listed
with the reason. Conditions keep the search from sampling combinations that mean nothing;
`SearchSpace.rejection` names those that slip past them (a hand-written configuration, a
pinned value), so they are turned away before any trial starts. Users narrow or extend the
space with a space file (`load_space_file`: values to pin, to leave out, extra Inductor
options to try).

The parts have modules of their own: `dimensions` (DEFAULTS, the modes, scopes, paddings and
Inductor option groups, `Dimension`, what each setting shapes of the compiled graphs: `GRAPHS`),
`capabilities` (what the installed torch and device support), `rules` (rejections and doomed
configurations, each with its reason) and `spacefile` (the user's file). This module holds
`SearchSpace` and re-exports their public names.
"""

from __future__ import annotations

import json
from dataclasses import replace

from autocompile.errors import UserError
from autocompile.space import rules
from autocompile.space.capabilities import _MISSING, Capabilities, _inductor_default
from autocompile.space.dimensions import (
    ACTIVATION_BUDGETS,
    ATTENTION,
    CHECKPOINTING,
    CUDA_GRAPH_MODES,
    DEFAULTS,
    EXPERTS,
    LM_LOSS,
    EAGER,
    GRAPHS,
    INDUCTOR_OPTIONS,
    INDUCTOR_OPTIONS_AUTOTUNE,
    INDUCTOR_OPTIONS_CUDA,
    INDUCTOR_OPTIONS_CUDAGRAPHS,
    INDUCTOR_OPTIONS_HOST,
    MARK_DYNAMIC,
    MODES,
    PACK_ATTENTION,
    PACK_LENGTHS,
    PADDINGS,
    PARALLEL,
    PARALLEL_KEYS,
    RECIPE_NEEDS,
    SCOPES,
    STARTING_POINTS,
    Dimension,
    Graphs,
    WorkloadTraits,
    bucket_lengths,
    _member,
    _OPTION_GROUPS,
    _show,
    shaping,
    uses_autotune,
    uses_cuda_graphs,
)
from autocompile.space.rules import doomed
from autocompile.space.spacefile import SpaceFile, load_space_file


# What other modules import from `autocompile.space`: the names defined in its modules.
__all__ = [
    "ACTIVATION_BUDGETS",
    "CHECKPOINTING",
    "CUDA_GRAPH_MODES",
    "DEFAULTS",
    "PARALLEL",
    "PARALLEL_KEYS",
    "EAGER",
    "GRAPHS",
    "INDUCTOR_OPTIONS",
    "INDUCTOR_OPTIONS_AUTOTUNE",
    "INDUCTOR_OPTIONS_CUDA",
    "INDUCTOR_OPTIONS_CUDAGRAPHS",
    "INDUCTOR_OPTIONS_HOST",
    "MARK_DYNAMIC",
    "MODES",
    "PADDINGS",
    "SCOPES",
    "STARTING_POINTS",
    "Capabilities",
    "Dimension",
    "Graphs",
    "SearchSpace",
    "SpaceFile",
    "WorkloadTraits",
    "bucket_lengths",
    "doomed",
    "load_space_file",
    "shaping",
    "uses_autotune",
    "uses_cuda_graphs",
]


class SearchSpace:
    """The dimensions searched for one workload on one device with one torch."""

    def __init__(
        self,
        caps: Capabilities,
        traits: WorkloadTraits,
        fixed: dict | None = None,
        space_file: SpaceFile | None = None,
        parallel: str = "none",
    ):
        self.caps = replace(caps, inductor_defaults=dict(caps.inductor_defaults))  # extended by a space file
        self.traits = traits
        self.parallel = parallel  # --parallel: its dimensions are offered only there (see _parallel_dimensions)
        self.dimensions: list[Dimension] = []
        self.left_out: list[tuple[str, str]] = []  # (dimension or value, why)
        self.space_file = space_file
        self.excluded: dict[str, list] = {}  # dimension -> values a space file left out
        self._build()
        if space_file:
            self._extend(space_file)
            self._exclude(space_file)
        self.fixed = {}
        self.pinned_by: dict[str, str] = {}
        for name, value in (space_file.fix if space_file else {}).items():
            if name not in (fixed or {}):
                try:
                    self.fix(name, value, by=space_file.label)
                except UserError as exc:
                    raise UserError(f"{space_file.path}: [fix] {exc}") from None
        for name, value in (fixed or {}).items():
            self.fix(name, value)

    # -- building ---------------------------------------------------------------------------
    def _add(self, name, choices, help, active=lambda c: True, where: str = ""):
        self.dimensions.append(Dimension(name, tuple(choices), help, active, where))

    def _build(self) -> None:
        """Every dimension the workload, the device and the installed torch offer, in the order they are
        sampled; what is not offered goes to left_out with the reason."""
        caps, traits = self.caps, self.traits
        self._scope_dimensions()
        self._add("dynamic", (None, True, False), "torch.compile dynamic: None = automatic")
        self._add("fullgraph", (False, True), "fail on graph breaks instead of falling back to eager")
        if caps.has_data_dependent_capture:
            self._add(
                "capture_data_dependent",
                (False, True),
                "Dynamo traces data-dependent scalars (Tensor.item()) and output shapes (nonzero) instead of breaking the graph",
            )
        else:
            self.left_out.append(("capture_data_dependent", f"torch {caps.torch_version} has no such Dynamo settings"))
        self._optimizer_dimensions()
        if traits.criterion:
            self._add("compile_loss", (False, True), "torch.compile the criterion (outputs, batch) -> loss apart")
        else:
            self.left_out.append(("compile_loss", "the workload gives its loss as one function, not as forward + criterion"))
        if traits.varying:
            self._padding_dimensions()
            self._mark_dynamic_dimension()
        else:
            self.left_out.append(("padding, mark_dynamic", "the workload has no varying dimension"))
        self._attention_dimension()
        self._experts_dimension()
        self._lm_loss_dimension()
        self._inductor_dimensions()
        self._memory_dimension()
        if caps.compiled_autograd_api:
            self._add(
                "compiled_autograd",
                (False, True),
                "the backward pass compiled as one graph by Compiled Autograd (002: dynamic backward graphs, hooks, FSDP)",
            )
        else:
            self.left_out.append(
                ("compiled_autograd", f"torch {caps.torch_version} has no torch._dynamo.compiled_autograd context manager")
            )
        self.left_out.append(("matmul_precision, recompile_limit", "change numerics or limits: only set with --set"))
        self._parallel_dimensions()

    def _scope_dimensions(self) -> None:
        """What is compiled (the whole model, each repeated block, each part) and in which mode: the
        modes of CUDA graphs only on a CUDA device, a mode per part under scope modular."""
        caps, traits = self.caps, self.traits
        self.modes = modes = [m for m in MODES if caps.cuda or m not in CUDA_GRAPH_MODES]
        if not caps.cuda:
            self.left_out += [(f"mode={m}", "CUDA graphs need a CUDA device") for m in CUDA_GRAPH_MODES]

        scopes = ["full"]
        if traits.regions is None or traits.regions:
            scopes.append("regional")
        else:
            self.left_out.append(("scope=regional", "no repeated blocks (ModuleList of identical modules) found"))
        if len(traits.parts) >= 2:
            scopes.append("modular")
        else:
            self.left_out.append(("scope=modular", "the workload declares no natural parts"))
        self._add("scope", scopes, "what is compiled: the whole model, each repeated block, or each part")
        self._add("mode", modes, "torch.compile mode", lambda c: c["scope"] != "modular")
        for part in traits.parts if "modular" in scopes else ():
            self._add(f"mode.{part}", modes, f"mode for part {part!r}", lambda c: c["scope"] == "modular")

    def _optimizer_dimensions(self) -> None:
        """The optimizer's step: compiled (its learning rate a tensor under a schedule), or fused where the
        optimizer has a fused implementation; then the step under CUDA graphs, static_grads and the foreach_map step."""
        traits = self.traits
        self._add("compile_optimizer", (False, True), "torch.compile(optimizer.step)")
        if traits.schedule:
            self._add(
                "lr_tensor",
                (False, True),
                "the learning rate as a tensor: a scheduler's new value does not recompile the compiled step",
                lambda c: c["compile_optimizer"],
            )
        else:
            self.left_out.append(("lr_tensor", "the workload has no LR schedule: its learning rate never changes"))
        if traits.fusable_optimizer:
            self._add(
                "fused_optimizer",
                (False, True),
                "the optimizer's fused implementation instead of foreach",
                lambda c: not c["compile_optimizer"],
            )
        else:
            self.left_out.append(("fused_optimizer", "the workload's optimizer has no fused implementation"))
        self._step_dimensions()
        if traits.clip_refusal is None:
            self._add(
                "clip_in_step",
                (False, True),
                "the Trainer's gradient clipping folded into its fused Adam/AdamW step: the norm computed, each "
                "gradient divided by the clip's scale in the step's kernel instead of a pass of its own; where the "
                "step is the optimizer's own (not compiled, nor foreach_map)",
                lambda c: not c["compile_optimizer"] and not c.get("foreach_map_optimizer"),
            )
        elif traits.clip_refusal:
            self.left_out.append(("clip_in_step", traits.clip_refusal))
        self._step_in_backward_dimension()

    def _step_in_backward_dimension(self) -> None:
        """Each block's optimizer step in the backward, where its optimizer steps each parameter on its own and
        nothing reads the gradients between the backward and the step."""
        why = rules.step_in_backward_refusal(self.traits, self.parallel)
        if why:
            self.left_out.append(("step_in_backward", why))
            return
        self._add(
            "step_in_backward",
            (False, True),
            "each repeated block's optimizer step as soon as the backward has its gradients, on a CUDA stream of its "
            "own: the memory-bound step beside the matmuls of the backward; with the optimizer's own step or the "
            "foreach_map step (one compiled graph for every block of the same shapes), not the compiled step",
            lambda c: not c["compile_optimizer"] and not c.get("clip_in_step"),
        )

    def _mark_dynamic_dimension(self) -> None:
        """The varying dimensions marked dynamic, by the marks this torch has, where they are padded to
        a length that varies and dynamic is automatic."""
        marks = ["off"]
        if self.caps.has_mark_dynamic:
            marks.append("mark")
        if self.caps.has_maybe_mark_dynamic:
            marks.append("maybe")
        self._add(
            "mark_dynamic",
            marks,
            "mark the varying dimensions dynamic",
            lambda c: c["padding"] in ("longest", "multiple") and c["dynamic"] is None,
        )

    def _inductor_dimensions(self) -> None:
        """The searched Inductor options this torch has with a value of the same type, each on the device
        it is for, the installed default first."""
        caps = self.caps
        for options, why_not_here, active, _ in _OPTION_GROUPS:
            for key, values in options.items():
                if why_not_here and not caps.cuda:
                    self.left_out.append((f"inductor.{key}", why_not_here))
                elif key not in caps.inductor_defaults:
                    self.left_out.append((f"inductor.{key}", f"torch {caps.torch_version} has no such Inductor option"))
                elif not all(_fits(v, caps.inductor_defaults[key]) for v in values):
                    self.left_out.append(
                        (f"inductor.{key}", f"installed type {type(caps.inductor_defaults[key]).__name__} differs")
                    )
                else:  # the installed default first: it is what a recipe leaves unchanged
                    default = caps.inductor_defaults[key]
                    values = (default, *[v for v in values if v != default])
                    self._add(f"inductor.{key}", values, f"Inductor option {key}", active)

    def _padding_dimensions(self) -> None:
        """How varying lengths reach the model: padded (to the longest, a multiple, buckets, the maximum),
        or packed into rows where the workload's layout allows it, with the attention that packing needs."""
        paddings = [p for p in PADDINGS if p != "pack" or not self.traits.pack_refusal]
        if self.traits.pack_refusal:
            self.left_out.append(("padding=pack", self.traits.pack_refusal))
        self._add("padding", paddings, "how varying lengths are padded before the forward pass, or packed")
        packs = lambda c: c["padding"] == "pack"  # noqa: E731
        if "pack" in paddings:
            self._add(
                "pack_length",
                PACK_LENGTHS,
                "packed rows: as long as the workload's longest sequence, "
                "several per batch (the row count varies), or the whole batch in one row",
                packs,
                where="padding is pack",
            )
        built = self.traits.pad_multiple  # the job's collator pads to it already: "longest" is that multiple
        self._add(
            "pad_multiple",
            tuple(sorted({8, 32, 64} | ({built} if built else set()))),
            "pad the longest (or a batch packed in one row) up to a multiple of"
            + (f" (the job's collator pads to a multiple of {built} as built: padding longest)" if built else ""),
            lambda c: c["padding"] == "multiple" or (packs(c) and c["pack_length"] == "batch"),
            where="padding is multiple, or pack in one row" if "pack" in paddings else "",
        )
        if "pack" in paddings:
            self._pack_attention_dimension(packs)

    def _pack_attention_dimension(self, packs) -> None:
        """Under packing, the attention: the model's own (a dense block-diagonal mask), FlexAttention (a
        document mask) or varlen_attn (Flash Attention over each sequence), each where the model's attention
        can be switched to it here; what is left out says why."""
        caps, traits = self.caps, self.traits
        why_not = {}
        if not traits.flex_attention:
            why_not["flex"] = (
                "FlexAttention under packing is offered for causal decoders of Hugging Face's that support it "
                "(they build its document mask from the position ids), with FlexAttention in this torch"
            )
        elif not caps.cuda:
            why_not["flex"] = (
                f"FlexAttention has no backward on the CPU (torch {caps.torch_version}): training with it needs a GPU"
            )
        if not traits.varlen_attention:
            why_not["varlen"] = (
                "varlen_attn under packing is offered for causal decoders of Hugging Face's that take a registered "
                "attention function, with torch.nn.attention.varlen in this torch"
            )
        elif not caps.cuda:
            why_not["varlen"] = "varlen_attn runs Flash Attention's CUDA kernels: it needs a GPU"
        choices = [how for how in PACK_ATTENTION if how not in why_not]
        if len(choices) > 1:
            self._add(
                "pack_attention",
                choices,
                "the model's own attention under packing (a dense block-diagonal mask), FlexAttention with a "
                "document mask (blocks across sequences skipped), or Flash Attention over each sequence (varlen_attn)",
                packs,
                where="padding is pack",
            )
        for how, why in why_not.items():
            self.left_out.append((f"pack_attention={how}", why))

    def _attention_dimension(self) -> None:
        """The SDPA kernel of the model's own attention: torch's choice at each call, or Flash Attention without
        cuDNN's (whose per-length plans can keep the host busier than the GPU where lengths vary). Offered for
        Hugging Face models whose attention is SDPA, on CUDA, where cuDNN's kernel is one of torch's choices."""
        if not self.traits.sdpa_attention:
            self.left_out.append(("attention=flash", "the model's attention is not a Hugging Face model's SDPA"))
        elif not self.caps.cuda:
            self.left_out.append(("attention=flash", "keeps SDPA off cuDNN's kernel, which only CUDA has: needs a GPU"))
        else:
            self._add(
                "attention",
                ATTENTION,
                "the kernel of the model's SDPA attention: torch's own choice, or Flash Attention without cuDNN's",
                lambda c: c["padding"] != "pack" or c.get("pack_attention", "model") == "model",
                where="not under FlexAttention or varlen_attn",
            )

    def _experts_dimension(self) -> None:
        """How a Hugging Face mixture of experts computes its experts: as built, or another implementation the
        installed transformers has. Each runs on the CPU too (torch's grouped_mm has a CPU kernel; under compile,
        for a dtype other than bf16, transformers calls its own per-expert op instead), so none is left out there."""
        for how, why in self.traits.experts_refused.items():
            self.left_out.append((f"experts={how}", why))
        if not self.traits.other_experts:
            if not self.traits.experts:
                self.left_out.append(("experts", "the model has no Hugging Face experts whose implementation can be switched"))
            return
        self._add(
            "experts",
            ("model", *self.traits.other_experts),
            f"how the mixture of experts computes its experts: as built ({self.traits.experts}), or another of transformers'",
        )

    def _lm_loss_dimension(self) -> None:
        """A causal LM's loss from its last hidden states and its head's weight, a chunk of tokens at a time, so that
        the [tokens, vocabulary] logits never exist whole: torch's fused linear cross-entropy where this torch has it,
        the snippet's compiled chunked one everywhere. Offered where the loss is a Hugging Face causal LM's own."""
        if self.traits.lm_loss_refusal:
            self.left_out.append(("lm_loss", self.traits.lm_loss_refusal))
            return
        choices = ["model", "fused", "chunked"]
        if not self.caps.has_linear_cross_entropy:
            choices.remove("fused")
            self.left_out.append(
                ("lm_loss=fused", f"torch {self.caps.torch_version} has no torch.nn.functional.linear_cross_entropy")
            )
        self._add(
            "lm_loss",
            tuple(choices),
            "the causal LM's loss: from its whole logits, or torch's fused or the snippet's chunked linear cross-entropy",
        )

    def _parallel_dimensions(self) -> None:
        """What exists only under DDP or FSDP2. Never offered without --parallel, so a
        single-process study's space (and Optuna's distributions) stays as it was."""
        caps = self.caps
        if self.parallel == "ddp" and caps.optimize_ddp_modes:
            # null is torch's own (True: ddp_optimizer), so plain torch.compile's baseline is its first value
            modes = [None] + [
                m for m in caps.optimize_ddp_modes if m not in (True, "ddp_optimizer", "python_reducer_without_compiled_forward")
            ]
            self._add(
                "optimize_ddp",
                modes,
                "DDP's graph split at gradient buckets (null: torch's own, "
                "ddp_optimizer), one graph (no_optimization), or the Python reducer traced by Compiled "
                "Autograd (python_reducer)",
                lambda c: c["scope"] == "full",
            )
        elif self.parallel == "ddp":
            self.left_out.append(("optimize_ddp", f"torch {caps.torch_version} has no torch._dynamo.config.optimize_ddp"))
        if self.parallel == "fsdp2":
            self._add(
                "fsdp_compile_order",
                ("before", "after"),
                "each block compiled before fully_shard (torchtitan's order) or after it",
                lambda c: c["scope"] == "regional",
            )
            self._add(
                "reshard_after_forward",
                (True, False),
                "FSDP2 frees the gathered parameters after the forward (and gathers them again for the backward), or keeps them",
            )
        if self.parallel == "none":
            self.left_out.append(("optimize_ddp, fsdp_compile_order, reshard_after_forward", "only under --parallel ddp|fsdp2"))

    def _step_dimensions(self) -> None:
        """The step under CUDA graphs of its own, static_grads and the foreach_map step (001 steps #3 and #4),
        each where it means something."""
        caps, traits = self.caps, self.traits
        if not caps.has_mark_static_address:
            self.left_out.append(("static_grads", f"torch {caps.torch_version} has no torch._dynamo.mark_static_address"))
            self.left_out.append(("graph_step", f"torch {caps.torch_version} has no torch._dynamo.mark_static_address"))
        elif not caps.cuda:
            self.left_out.append(
                ("static_grads", "its effect is on CUDA graphs (mode reduce-overhead or max-autotune), which need a CUDA device")
            )
            self.left_out.append(("graph_step", "the step under CUDA graphs of its own: CUDA graphs need a CUDA device"))
        else:
            self._add(
                "graph_step",
                (False, True),
                "the compiled step under CUDA graphs of its own (mode reduce-overhead), its gradients static and "
                "its tensor LR on the device: one graph replayed a step instead of the step's launches, where "
                "the model's graphs cannot be recorded (varying lengths, packed rows); with compile_optimizer, "
                "and lr_tensor under a schedule",
                lambda c: c["compile_optimizer"] and (c["lr_tensor"] or not traits.schedule),
            )
            self._add(
                "static_grads",
                (False, True),
                "gradients zeroed in place and marked static before the compiled "
                "step, for CUDA graphs to read them in place instead of copying them in (001 step #3); offered "
                "where the model's mode records CUDA graphs (reduce-overhead, max-autotune), though the step "
                "itself compiles in the default mode (measured slower on llama-8b and the captioner)",
                lambda c: c["compile_optimizer"] and uses_cuda_graphs(c) and not c["graph_step"],
            )
        if not caps.has_foreach_map:
            self.left_out.append(
                ("foreach_map_optimizer", f"torch {caps.torch_version} has no torch._higher_order_ops.foreach_map")
            )
        elif traits.foreach_map_refusal:
            self.left_out.append(("foreach_map_optimizer", traits.foreach_map_refusal))
        else:
            self._add(
                "foreach_map_optimizer",
                (False, True),
                "the Adam/AdamW step as one compiled function of "
                "foreach_map ops, fused horizontally (001 step #4); where the step is neither compiled "
                "(compile_optimizer) nor fused (fused_optimizer)",
                lambda c: not c["compile_optimizer"] and not c["fused_optimizer"],
            )

    def _memory_dimension(self) -> None:
        """Memory against speed: the model's own activation checkpointing, where it has some, and the
        partitioner's activation memory budget, where that checkpointing is off or memory is the
        constraint (a lower budget recomputes activations in the backward instead of keeping them:
        slower, and it fits)."""
        checkpoints = bool(self.traits.checkpointing)
        if checkpoints:
            self._checkpointing_dimension()
        else:
            self.left_out.append(
                (
                    "activation_checkpointing",
                    "the model does not checkpoint its activations (no Hugging Face checkpointing on, no Workload.checkpointing)",
                )
            )
        self._budget_dimension(checkpoints)

    def _checkpointing_dimension(self) -> None:
        """The model's own activation checkpointing as built, off, or selective where the workload gives
        a selective hook and this torch has selective checkpointing."""
        caps, traits = self.caps, self.traits
        choices = ["as_built", "off"]
        if traits.selective_checkpointing and caps.has_selective_checkpointing:
            choices.append("selective")
        elif traits.selective_checkpointing:
            self.left_out.append(
                (
                    "activation_checkpointing=selective",
                    f"torch {caps.torch_version} has no torch.utils.checkpoint.create_selective_checkpoint_contexts",
                )
            )
        else:
            self.left_out.append(
                ("activation_checkpointing=selective", "the workload's Checkpointing declares no selective hook")
            )
        self._add(
            "activation_checkpointing",
            choices,
            f"the model's own activation checkpointing ({traits.checkpointing}): as built, off (compile's "
            "partitioner recomputes instead, by the budget), or selective (matrix products and attention "
            "kept, the rest recomputed)",
            where=""
            if traits.checkpoint_in_forward or "selective" not in choices
            else "selective: with scope full or modular, where the compile traces the model's checkpoint",
        )

    def _budget_dimension(self, checkpoints: bool) -> None:
        """The partitioner's activation memory budget: where the model's checkpointing is off (`checkpoints`:
        the model has some), else where memory is the constraint."""
        caps, traits = self.caps, self.traits
        if not caps.has_activation_memory_budget:
            self.left_out.append(
                (
                    "activation_memory_budget",
                    f"torch {caps.torch_version} has no torch._functorch.config.activation_memory_budget",
                )
            )
        elif checkpoints:
            self._add(
                "activation_memory_budget",
                ACTIVATION_BUDGETS,
                "activations kept for the backward, the rest recomputed by compile's partitioner",
                lambda c: c["activation_checkpointing"] == "off",
                where="activation_checkpointing is off",
            )
        elif not traits.memory_bound:
            self.left_out.append(
                (
                    "activation_memory_budget",
                    "memory is not the constraint: offered with "
                    "--max-memory-gb, where eager's peak is within 10% of the device's memory, or where "
                    "the model checkpoints its activations",
                )
            )
        else:
            self._add(
                "activation_memory_budget",
                ACTIVATION_BUDGETS,
                f"activations kept for the backward, the rest recomputed ({traits.memory_bound})",
            )

    def _extend(self, space_file: SpaceFile) -> None:
        """[inductor]: extra Inductor options to try, each checked against the installed torch."""
        import torch._inductor.config as inductor_config

        grouped = {key: group for group in _OPTION_GROUPS for key in group[0]}
        for key, values in space_file.inductor.items():
            key = key.removeprefix("inductor.")
            where = f"{space_file.path}: [inductor] {key}"
            default = _inductor_default(inductor_config, key)
            if default is _MISSING:
                raise UserError(f"{where}: torch {self.caps.torch_version} has no such Inductor option")
            if not _fits(default, default):  # a group of options, a callable, an object
                raise UserError(
                    f"{where}: not an option a configuration can set (a {type(default).__name__} in torch._inductor.config)"
                )
            for value in values:
                if not _fits(value, default):
                    raise UserError(
                        f"{where}: {_show(value)} does not fit the installed option "
                        f"(a {type(default).__name__}, default {default!r})"
                    )
            choices = (default, *[v for v in values if not _member(v, (default,))])
            name = f"inductor.{key}"
            existing = next((d for d in self.dimensions if d.name == name), None)
            if existing:
                existing.choices = choices
            elif key in grouped and grouped[key][1] and not self.caps.cuda:
                continue  # a CUDA-only option on another device: stays left out, with its reason
            else:
                active = grouped[key][2] if key in grouped else (lambda c: True)
                self._add(name, choices, f"Inductor option {key} (from {space_file.label})", active)
                self.left_out = [(n, why) for n, why in self.left_out if n != name]
            self.caps.inductor_defaults[key] = default

    def _known_names(self) -> set[str]:
        """Dimension names a space could have, here or elsewhere: those left out here included."""
        names = {d.name for d in self.dimensions}
        for name, _ in self.left_out:
            names.update(part.split("=", 1)[0].strip() for part in name.split(","))
        return names

    def _exclude(self, space_file: SpaceFile) -> None:
        """[exclude]: values taken out of their dimensions, each listed as left out."""
        known = self._known_names()
        here = {d.name: d for d in self.dimensions}
        elsewhere = {"scope": SCOPES, "mode": MODES, "mark_dynamic": MARK_DYNAMIC}  # values offered on other devices
        for name, values in space_file.exclude.items():
            where = f"{space_file.path}: [exclude] {name}"
            if name in ("matmul_precision", "recompile_limit"):
                raise UserError(f"{where}: not searched, so nothing to exclude; pin it in [fix]")
            if name not in known:
                raise UserError(f"{where}: no such dimension; known: {', '.join(sorted(known))}")
            dim = here.get(name)
            if dim is None:
                continue  # left out here already (another device, another workload)
            possible = dim.choices + tuple(elsewhere.get(name.split(".")[0], ()))
            for value in values:
                value = _toml_none(value, possible)
                if _member(value, dim.choices):
                    dim.choices = tuple(c for c in dim.choices if not _member(c, (value,)))
                    self.excluded.setdefault(name, []).append(value)
                    self.left_out.append((f"{name}={_show(value)}", f"excluded by {space_file.label}"))
                elif not _member(value, possible + tuple(self.excluded.get(name, ()))):
                    raise UserError(f"{where}: {_show(value)} is not one of its values {_show(list(possible))}")
            if not dim.choices:
                raise UserError(f"{where}: leaves the dimension with no value to try")

    def dimension(self, name: str) -> Dimension:
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        raise UserError(f"unknown search dimension {name!r}; known: {', '.join(d.name for d in self.dimensions)}")

    def fix(self, name: str, value, by: str = "--set") -> None:
        """Pin a dimension to one value (it is then not searched), or set an unsearched key."""
        if name in ("matmul_precision", "recompile_limit"):
            self.fixed[name] = value
            self.pinned_by[name] = by
            return
        dim = self.dimension(name)
        value = _toml_none(value, dim.choices + tuple(self.excluded.get(name, ())))
        if _member(value, self.excluded.get(name, ())):
            raise UserError(f"{name}={_show(value)} is pinned ({by}) but excluded by {self.space_file.label}")
        if not _member(value, dim.choices) and not _any_multiple(name, value):
            choices = _show(list(dim.choices)) + (", or pinned, any positive integer" if name == "pad_multiple" else "")
            raise UserError(f"{name}={_show(value)} is not offered here; choices: {choices}")
        self.fixed[name] = value
        self.pinned_by[name] = by

    # -- using ------------------------------------------------------------------------------
    def params_for(self, partial: dict) -> dict:
        """Optuna parameters for a configuration given in part: the rest at plain defaults.

        Returns {} where a value is not offered here (the recipe does not apply).
        """
        config = json.loads(json.dumps(DEFAULTS))
        params = {}
        for dim in self.dimensions:
            if not dim.active(config):
                continue
            node = DEFAULTS
            for key in dim.key_path():
                node = node.get(key) if isinstance(node, dict) else None
            value = self.fixed.get(dim.name, partial.get(dim.name, node if _member(node, dim.choices) else dim.choices[0]))
            if not _member(value, dim.choices):
                return {}
            if dim.name not in self.fixed:
                params[dim.name] = value
            _set(config, dim.key_path(), value)
        return params

    def starting_points(self) -> list[dict]:
        """Known-good recipes tried right after the baselines, as Optuna parameters."""
        points = []
        names = {d.name for d in self.dimensions}
        for recipe in STARTING_POINTS:
            if any(key in recipe and key not in names for key in RECIPE_NEEDS):
                continue  # a recipe about the model's own checkpointing, for a model without any
            params = self.params_for(recipe)
            if params and params not in points:
                points.append(params)
        return points

    def suggest(self, trial) -> dict:
        """Sample a configuration define-by-run: a dimension is asked only where it is active."""
        config = json.loads(json.dumps(DEFAULTS))
        for dim in self.dimensions:
            if not dim.active(config):
                continue
            if dim.name in self.fixed:
                value = self.fixed[dim.name]
            else:
                try:
                    value = trial.suggest_categorical(dim.name, list(dim.choices))
                except ValueError as exc:  # Optuna: a categorical's choices may not change within a study
                    if "dynamic value space" not in str(exc):
                        raise
                    raise UserError(
                        f"this study searched {dim.name} over other values than {_show(list(dim.choices))} "
                        "(a different space file or torch?): Optuna cannot change a dimension's values "
                        "within a study; use the same space file, or choose a new --study"
                    ) from None
            _set(config, dim.key_path(), value)
        for name in ("matmul_precision", "recompile_limit"):
            if name in self.fixed:
                config[name] = self.fixed[name]
        return self.normalize(config)

    def normalize(self, config: dict) -> dict:
        """Drop Inductor options equal to the installed defaults, so snippets stay minimal."""
        config["inductor"] = {k: v for k, v in config["inductor"].items() if self.caps.inductor_defaults.get(k, _MISSING) != v}
        return config

    def validate(self, config: dict) -> dict:
        """Check a hand-written configuration's keys, types and values; fill in defaults; raise
        UserError on bad ones. Whether the combination can run here is `rejection`'s question."""
        if not isinstance(config, dict):
            raise UserError('a configuration is a JSON object, e.g. {"scope": "regional"}')
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise UserError(f"unknown configuration key(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
        full = {**json.loads(json.dumps(DEFAULTS)), **config}
        if not isinstance(full["compile"], bool):
            raise UserError("compile must be true or false")
        if not full["compile"]:
            return {**EAGER, **{k: full[k] for k in ("padding", "pad_multiple", "pack_length", "pack_attention")}}
        _check_modes(full, self.traits.parts)
        _check_switches(full)
        _check_padding(full)
        _check_inductor(full, self.caps.torch_version)
        limit = full["recompile_limit"]
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise UserError("recompile_limit must be a positive integer")
        _check("matmul_precision", full["matmul_precision"], (None, "highest", "high", "medium"))
        _check("experts", full["experts"], EXPERTS)
        _check("lm_loss", full["lm_loss"], LM_LOSS)
        _check("optimize_ddp", full["optimize_ddp"], (None, True, False, *self.caps.optimize_ddp_modes))
        _check("fsdp_compile_order", full["fsdp_compile_order"], ("before", "after"))
        _check("reshard_after_forward", full["reshard_after_forward"], (True, False))
        return full

    def rejection(self, config: dict) -> str | None:
        """Why a (valid) configuration cannot work here, or means nothing; None if it may run: `rules.rejection`."""
        return rules.rejection(self, config)

    def _value(self, dim: Dimension, config: dict):
        """A dimension's value in a full configuration (an Inductor option at its installed default)."""
        path = dim.key_path()
        if path[0] == "inductor":
            return config["inductor"].get(path[1], self.caps.inductor_defaults.get(path[1]))
        if len(path) == 2:
            return config[path[0]].get(path[1])
        return config[path[0]]

    def searched_values(self, config: dict) -> dict:
        """Each searched (not pinned) dimension's value in a configuration, where it applies."""
        c = {**json.loads(json.dumps(DEFAULTS)), **config}
        return {d.name: self._value(d, c) for d in self.dimensions if d.name not in self.fixed and d.active(c)}

    def layout_source(self) -> str | None:
        """Where the layout packing follows came from (declared, or found from the model), where pack is offered."""
        offered = any(d.name == "padding" and "pack" in d.choices for d in self.dimensions)
        return self.traits.layout_source if offered else None

    def describe(self) -> dict:
        """What `autocompile space --json` prints."""
        return {
            "device": self.caps.device,
            "torch": self.caps.torch_version,
            "parallel": self.parallel,
            "space_file": self.space_file.path if self.space_file else None,
            "dimensions": [
                {
                    "name": d.name,
                    "choices": list(d.choices),
                    "help": d.help,
                    **({"where": d.where} if d.where else {}),
                    **({"fixed": self.fixed[d.name]} if d.name in self.fixed else {}),
                }
                for d in self.dimensions
            ],
            "left_out": [{"name": name, "why": why} for name, why in self.left_out],
            "layout": self.layout_source(),
            "defaults": DEFAULTS,
        }


def _check(name: str, value, choices) -> None:
    """UserError unless `value` is one of `choices`."""
    if not _member(value, choices):
        raise UserError(f"invalid value {_show(value)} for {name}; choices: {_show(list(choices))}")


def _check_modes(full: dict, parts: tuple[str, ...]) -> None:
    """The scope and the mode; under scope modular, a mode for each of the workload's parts (the
    configuration's mode where it names none), set in `full`."""
    _check("scope", full["scope"], SCOPES)
    _check("mode", full["mode"], MODES)
    if not isinstance(full["part_modes"], dict):
        raise UserError("part_modes must be an object: part -> mode")
    if full["scope"] == "modular":
        modes = {part: full["part_modes"].get(part, full["mode"]) for part in parts}
        for part, mode in {**full["part_modes"], **modes}.items():
            _check(f"part_modes.{part}", mode, MODES)
        full["part_modes"] = {**full["part_modes"], **modes}


def _check_switches(full: dict) -> None:
    """The settings that are on or off, dynamic, and the model's own checkpointing with the
    partitioner's activation memory budget (a share of the activations)."""
    for name in (
        "fullgraph",
        "compile_optimizer",
        "lr_tensor",
        "fused_optimizer",
        "compile_loss",
        "compiled_autograd",
        "static_grads",
        "graph_step",
        "foreach_map_optimizer",
        "clip_in_step",
        "step_in_backward",
    ):
        _check(name, full[name], (False, True))
    _check("dynamic", full["dynamic"], (None, True, False))
    _check("activation_checkpointing", full["activation_checkpointing"], CHECKPOINTING)
    budget = full["activation_memory_budget"]
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget <= 1):
        raise UserError(f"activation_memory_budget must be null or a share of the activations in (0, 1], got {_show(budget)}")


def _check_padding(full: dict) -> None:
    """How varying lengths are padded or packed, the multiple where one is needed, and the marks."""
    _check("padding", full["padding"], PADDINGS)
    _check("pack_length", full["pack_length"], PACK_LENGTHS)
    _check("pack_attention", full["pack_attention"], PACK_ATTENTION)
    if full["padding"] == "multiple" or (full["padding"] == "pack" and full["pack_length"] == "batch"):
        if not isinstance(full["pad_multiple"], int) or isinstance(full["pad_multiple"], bool) or full["pad_multiple"] < 1:
            raise UserError("padding 'multiple' (and pack in one row) needs pad_multiple, a positive integer")
    _check("mark_dynamic", full["mark_dynamic"], MARK_DYNAMIC)


def _check_inductor(full: dict, torch_version: str) -> None:
    """Each Inductor option one this torch has, with a value of its type."""
    if not isinstance(full["inductor"], dict):
        raise UserError("inductor must be an object of Inductor options")
    import torch._inductor.config as inductor_config

    for key, value in full["inductor"].items():
        default = _inductor_default(inductor_config, key)
        if default is _MISSING:
            raise UserError(f"torch {torch_version} has no Inductor option {key!r}")
        if not _fits(value, default):
            raise UserError(f"Inductor option {key!r} takes a {type(default).__name__}, got {_show(value)}")


def _fits(value, default) -> bool:
    """Whether `value` may be given for an Inductor option whose installed default is `default`
    (bool and int kept apart: True is an int to Python, not to a config)."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, dict):
        return isinstance(value, dict)
    if default is None:  # an optional setting: its type is not known from the default
        return value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))
    return False  # a group of options, a callable, an object: not something a configuration carries


def _set(config: dict, path: tuple[str, ...], value) -> None:
    if len(path) == 1:
        config[path[0]] = value
    else:
        config[path[0]] = {**config[path[0]], path[1]: value}


def _any_multiple(name: str, value) -> bool:
    """pad_multiple pins to any positive integer: the search samples a few multiples, a pin may take another
    (a packed row's lengths as few as CUDA graphs can record). Pinned, it is no Optuna parameter."""
    return name == "pad_multiple" and isinstance(value, int) and not isinstance(value, bool) and value > 0


def _toml_none(value, choices):
    """TOML has no null: "none" or "null" stands for None where None is a choice."""
    if isinstance(value, str) and value.lower() in ("none", "null") and _member(None, choices):
        return None
    return value
