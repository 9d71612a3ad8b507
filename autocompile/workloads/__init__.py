"""Workloads: one name selects a whole training job (model, optimizer, batches, loss).

Like torchtitan's train specs, a `Workload` bundles the builders a trial needs, so that a
trial, a test and a user's plugin all describe their job the same way. Names resolve, in
order, to: a built-in workload, a workload registered by an installed package through the
entry-point group ``autocompile.workloads``, ``package.module:factory`` or
``path/to/file.py:factory``. A factory is a callable with no required argument that returns
a `Workload`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from autocompile.errors import UserError
from autocompile.workloads.checkpointing import Checkpointing

ENTRY_POINT_GROUP = "autocompile.workloads"
FRESH_WINDOWS = 3  # measuring windows on fresh batches (Workload.fresh_pass): a fixed count, the same batches in every trial


@dataclass(frozen=True)
class WorkloadOptions:
    """What a user may change about a workload from the command line."""

    device: str = "cpu"
    batch_size: int | None = None  # None: the workload's own default
    seq_len: int | None = None  # longest sequence a batch may hold; None: the default
    seed: int = 0
    blocks: int | None = None  # screening: the model's repeated blocks cut to this many (None: all)


@dataclass(frozen=True)
class SequenceLayout:
    """How a batch's variable-length sequences reach the model: what packing them needs to know.

    The sequences are the workload's `varying` keys (each along dimension 1). Packed, a batch's sequences
    share rows, and the model must see where each starts:
    positions: the key under which the forward passes position ids to the model (restarting at each
        packed sequence); None where the forward passes none, and then nothing is packed.
    mask: the key of the padding mask the forward passes (1 on real tokens), if any.
    causal: a causal decoder takes its packed mask from the position ids (Hugging Face's do), and the
        mask key is set to None; an encoder (False) gets a block-diagonal mask in `mask`, which it needs.
    shifted: label keys the loss shifts itself (Hugging Face's labels=input_ids): the first label of each
        packed sequence is ignored, so that no sequence is trained to predict the next one's start.
    packed: the batches come packed already (the job packs them itself, as TRL's packing does): they are
        not packed twice.
    source: where the layout was found, in words, where it was found rather than declared (workloads/layout.py);
        empty for a declared one.
    """

    positions: str | None = "position_ids"
    mask: str | None = None
    causal: bool = True
    shifted: tuple[str, ...] = ()
    packed: bool = False
    source: str = ""


@dataclass
class Workload:
    """A training job to compile.

    build(options) -> (model, optimizer), on options.device. A builder may honour
        options.blocks (build only that many of each list of repeated blocks, as the built-in
        ones do); any other is cut after it is built (autocompile.trial.screened).
    batches(options, n) -> n batches (dicts of tensors on the device), each padded to its
        longest sequence, the way a typical collate function leaves them.
    loss(model, batch) -> scalar loss tensor (explicit, so it never breaks the graph). May be
        left out when forward and criterion are given: it is then criterion(forward(...)).
    forward(model, batch) -> the model's outputs (e.g. logits), and criterion(outputs, batch)
        -> scalar loss: optional, the loss split in two so the search can compile the
        criterion apart (`compile_loss`). Give both or neither.
    schedule(optimizer) -> a torch.optim.lr_scheduler.LRScheduler, stepped after every
        optimizer step; optional (None: a constant learning rate). It is built before the
        snippet's apply_compilation runs (torch's LRScheduler wraps optimizer.step and
        cannot wrap a compiled one).
    checkpointing: how a model of the workload's own switches its activation checkpointing
        (`Checkpointing`), where it has some; a Hugging Face model's is found without it.
    layout: how its variable-length sequences reach the model (`SequenceLayout`), so that the search
        may pack them; None: found from the model where it is a Hugging Face one (workloads/layout.py),
        else never packed.
    varying: batch keys whose length varies between batches -> (dim, pad value); the
        search pads and marks exactly these.
    parts: the model's natural submodules (e.g. encoder, decoder) for modular compilation.
    count(batch) -> real (unpadded) items in a batch, in `unit`, for items/s.
    max_len(options) -> the longest length a varying dimension can take.
    flops_per_item(model) -> a training step's model FLOPs per item (6 x the parameters an item passes through:
        a mixture of experts' active ones), from which a trial reports model TFLOP/s and so MFU; None: not declared.
    A framework's job (a Hugging Face Trainer: workloads/trainer.py) gives three more:
    attach(namespace, model, optimizer) -> (model, optimizer, scheduler): the snippet goes in through the
        framework's own hook (the snippet's apply_to_trainer), then what the framework does before its first
        step; None: the schedule is built, then the snippet's apply_compilation.
    train_step(model, batch) -> loss: one step's forward, backward and gradient clipping as the framework
        runs them, the snippet's prepare_batch inside; None: prepare_batch, loss, then the snippet's backward.
    framework: whose job it is ("trainer"), so the snippet emits its hook; "" for a Workload of one's own.
    clip_norm: the gradient norm train_step clips to (a Trainer's max_grad_norm); None: it clips nothing.
    """

    name: str
    description: str
    build: Callable[[WorkloadOptions], tuple[Any, Any]]
    batches: Callable[[WorkloadOptions, int], list[dict]]
    loss: Callable[[Any, dict], Any] | None = None  # None: criterion(forward(model, batch), batch)
    count: Callable[[dict], int] | None = None  # required: checked in __post_init__
    unit: str = "samples"
    varying: dict[str, tuple[int, int]] = field(default_factory=dict)
    max_len: Callable[[WorkloadOptions], int] = lambda options: 0
    parts: tuple[str, ...] = ()
    batch_pool: int = 8  # distinct batches cycled through during a trial
    # >0: the warm-up passes this many batches of the pool and the measuring windows go on to the next ones, new to
    # the device's per-shape caches as in a run over a dataset of many lengths; 0: every window passes the whole pool
    fresh_pass: int = 0
    own_loss: bool = False  # the job's loss is its model's loss_function, and nothing else reads the logits
    pad_multiple: int | None = None  # the multiple the job's own collator pads lengths to (pad_to_multiple_of), as built
    gpu_only: bool = False
    forward: Callable[[Any, dict], Any] | None = None
    criterion: Callable[[Any, dict], Any] | None = None
    schedule: Callable[[Any], Any] | None = None
    checkpointing: Checkpointing | None = None
    layout: SequenceLayout | None = None
    attach: Callable[[dict, Any, Any], tuple[Any, Any, Any]] | None = None
    train_step: Callable[[Any, dict], Any] | None = None
    framework: str = ""
    clip_norm: float | None = None
    flops_per_item: Callable[[Any], float] | None = None

    def __post_init__(self):
        if (self.forward is None) != (self.criterion is None):
            raise TypeError(f"workload {self.name!r}: give forward and criterion together, or neither")
        if self.loss is None:
            if self.forward is None:
                raise TypeError(f"workload {self.name!r} needs loss, or forward and criterion")
            forward, criterion = self.forward, self.criterion
            self.loss = lambda model, batch: criterion(forward(model, batch), batch)
        if self.count is None:
            raise TypeError(f"workload {self.name!r} needs count(batch): the real items in a batch")

    @property
    def split_loss(self) -> bool:
        """The loss comes as forward + criterion, so the criterion can be compiled apart."""
        return self.forward is not None and self.criterion is not None


def warmup_cosine(optimizer, warmup_steps: int = 100, decay_steps: int = 10000, final_ratio: float = 0.1):
    """The usual LLM schedule: linear warm-up over `warmup_steps`, then cosine decay over
    `decay_steps` down to `final_ratio` of the peak learning rate (a LambdaLR)."""
    import math

    import torch

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, decay_steps))
        return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


_BUILTIN: dict[str, str] = {
    "llama-8b": "autocompile.workloads._llama:llama_8b",
    "tiny-llama": "autocompile.workloads._llama:tiny_llama",
    "captioner": "autocompile.workloads._captioner:captioner",
    "tiny-captioner": "autocompile.workloads._captioner:tiny_captioner",
    "lora-8b": "autocompile.workloads._lora:lora_8b",
    "tiny-lora": "autocompile.workloads._lora:tiny_lora",
    "moe-2b": "autocompile.workloads._moe:moe_2b",
    "tiny-moe": "autocompile.workloads._moe:tiny_moe",
}


def builtin_names() -> list[str]:
    return list(_BUILTIN)


def plugin_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _call_factory(factory: Any, where: str) -> Workload:
    workload = factory() if callable(factory) and not isinstance(factory, Workload) else factory
    if not isinstance(workload, Workload):
        raise UserError(f"{where} did not give an autocompile Workload (got {type(workload).__name__})")
    return workload


def _load_from_file(path: str, attr: str) -> Any:
    if not os.path.isfile(path):
        raise UserError(f"workload file not found: {path}")
    module_name = "autocompile_user_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code failed to import: say where
        raise UserError(f"could not import {path}: {type(exc).__name__}: {exc}") from exc
    if not hasattr(module, attr):
        raise UserError(f"{path} has no attribute {attr!r}")
    return getattr(module, attr)


def _load_from_module(module_name: str, attr: str) -> Any:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"could not import workload module {module_name!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise UserError(f"module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_factory(target: str) -> Any:
    """The callable that `package.module:factory` or `path/to/file.py:factory` names."""
    if ":" not in target:
        raise UserError(f"{target!r}: give path/to/file.py:factory or package.module:factory")
    module, attr = target.rsplit(":", 1)
    if module.endswith(".py") or os.sep in module:
        return _load_from_file(module, attr)
    return _load_from_module(module, attr)


_TRAINER_JOBS: dict[str, Workload] = {}  # a Trainer's job is read once a process: its factory builds a model


def get_workload(name: str) -> Workload:
    """Resolve a --model value to a Workload, or raise a UserError naming the choices."""
    from autocompile.workloads import trainer

    if trainer.is_trainer_target(name):
        if name not in _TRAINER_JOBS:
            _TRAINER_JOBS[name] = trainer.trainer_workload(name.removeprefix(trainer.PREFIX))
        return _TRAINER_JOBS[name]
    if name in _BUILTIN:
        module_name, attr = _BUILTIN[name].split(":")
        return _call_factory(_load_from_module(module_name, attr), name)
    plugins = plugin_entry_points()
    if name in plugins:
        return _call_factory(plugins[name].load(), f"plugin {name!r}")
    if ":" in name:
        return _call_factory(load_factory(name), name)
    known = ", ".join(builtin_names() + sorted(plugins))
    raise UserError(f"unknown model {name!r}; known: {known} (or give package.module:factory or path/to/file.py:factory)")


def list_workloads() -> list[tuple[str, str]]:
    """(name, description) of every built-in and plugin workload."""
    rows = []
    for name in builtin_names():
        rows.append((name, get_workload(name).description))
    for name, ep in sorted(plugin_entry_points().items()):
        try:
            rows.append((name, _call_factory(ep.load(), name).description + f"  [plugin {ep.value}]"))
        except Exception as exc:  # a broken plugin must not hide the others
            rows.append((name, f"(plugin {ep.value} failed to load: {exc})"))
    return rows
