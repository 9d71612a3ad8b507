"""The model's own activation checkpointing: found on a built model, declared by a workload.

Fine-tuning jobs checkpoint activations so that they fit a card (Hugging Face's
`gradient_checkpointing_enable()`, `torch.utils.checkpoint` in a model of one's own): each block's
forward runs again in the backward. With the model's checkpointing off, torch.compile's partitioner
makes the same trade per graph (`activation_memory_budget`), so the search offers it as a dimension
(`activation_checkpointing`: as built, off, selective) wherever `find` finds it:

- a Hugging Face model, itself or inside a wrapper (peft's `PeftModel`), whose flag
  (`is_activation_checkpointing`, `is_gradient_checkpointing` before transformers 5) says it is on;
- a model of the workload's own that declares how to switch it (`Workload.checkpointing`).
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Callable

HUGGING_FACE = "huggingface"
DECLARED = "declared"
# Hugging Face's flag, newest name first (transformers 5 renamed is_gradient_checkpointing)
_FLAGS = ("is_activation_checkpointing", "is_gradient_checkpointing")


@dataclass(frozen=True)
class Checkpointing:
    """How a workload's own model switches its activation checkpointing, for models that are not
    Hugging Face's. Each hook is a plain function (a `def`, not a lambda) that may use only torch and
    its arguments: its source is copied into the snippet, which calls it.

    off(model): turn the model's checkpointing off (each block's forward then runs once).
    selective(model, context_fn): keep it on, each checkpoint given `context_fn` (what
        torch.utils.checkpoint.checkpoint takes: a selective policy's contexts); optional.
    """

    off: Callable[[Any], None]
    selective: Callable[[Any, Callable], None] | None = None

    def __post_init__(self):
        for hook in (self.off, self.selective):
            if hook is not None and (not inspect.isfunction(hook) or hook.__name__ == "<lambda>"):
                raise TypeError("Checkpointing hooks are plain functions (def): their source goes into the snippet")


@dataclass(frozen=True)
class ModelCheckpointing:
    """A model's own activation checkpointing, as found: whose it is, in words, and whether a
    selective policy can be given to it."""

    kind: str  # HUGGING_FACE or DECLARED
    where: str  # how it was found, e.g. "Hugging Face activation checkpointing on LlamaForCausalLM"
    selective: bool
    # the checkpoint runs inside each block's forward, so a block compiled alone (scope regional) traces
    # it, as transformers 5.24 does; False where it wraps the block's call from outside, as 5.17 does
    in_forward: bool = False
    hooks: tuple[str, ...] = ()  # DECLARED: the source of the off and selective hooks
    off_name: str = ""
    selective_name: str = ""


def huggingface_model(model):
    """The Hugging Face model in `model` (itself, or the one a wrapper such as peft's holds) and its
    checkpointing flag's name, or (None, None)."""
    for module in model.modules():
        for flag in _FLAGS:
            if isinstance(getattr(type(module), flag, None), property):
                return module, flag
    return None, None


def _on(module, flag: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the older name is deprecated in transformers 5
        return bool(getattr(module, flag))


def find(model, declared: Checkpointing | None = None) -> ModelCheckpointing | None:
    """The model's own activation checkpointing where it is on as built, else None (a declared one
    is on as built, and found without a model)."""
    if declared is not None:
        hooks = [h for h in (declared.off, declared.selective) if h is not None]
        return ModelCheckpointing(
            DECLARED,
            "the workload's own checkpointing (Workload.checkpointing)",
            selective=declared.selective is not None,
            hooks=tuple(textwrap.dedent(inspect.getsource(h)) for h in hooks),
            off_name=declared.off.__name__,
            selective_name=declared.selective.__name__ if declared.selective else "",
        )
    if model is None:
        return None
    owner, flag = huggingface_model(model)
    if owner is None or not _on(owner, flag):
        return None
    wrapped = f" inside {type(model).__name__}" if owner is not model else ""
    return ModelCheckpointing(
        HUGGING_FACE,
        f"Hugging Face activation checkpointing on {type(owner).__name__}{wrapped} ({flag})",
        selective=True,
        in_forward=_in_forward(owner),
    )


def _in_forward(model) -> bool:
    """Whether the model's checkpointed blocks checkpoint inside their forward: none of them overrides
    the module's call to wrap it (transformers' GradientCheckpointingLayer did before 5.24)."""
    import torch

    blocks = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    return bool(blocks) and all(type(m).__call__ is torch.nn.Module.__call__ for m in blocks)
