"""How a workload's variable-length sequences reach its model: declared, or found from a Hugging Face model
and a batch.

A `SequenceLayout` says what packing needs to know (workloads/__init__.py). A workload may declare one, and a
declared one wins; for a Hugging Face model (peft-wrapped or not) that declares none it is found here:
its forward takes position ids or not; its attention modules say whether it is a causal decoder (whose
packed mask comes from the position ids) or an encoder (which needs a block-diagonal mask); a causal decoder's
loss is taken to shift its labels, as a Hugging Face causal LM's own loss does. Whether the
workload's loss does is not read off the model: the packing check asks the loss itself before a packed
trial runs (trial/packing_check.py), and refuses the configuration, with its reason, where the layout found
is wrong, before anything is compiled or measured.
"""

from __future__ import annotations

import inspect

from autocompile.workloads import SequenceLayout

IGNORE_INDEX = -100  # what a Hugging Face loss skips: the label value of padding
# collators that pack (or flatten) the batch's sequences into one row themselves
PACKING_COLLATORS = ("DataCollatorWithFlattening",)
DECLARED = "declared by the workload (Workload.layout)"
LABELS = "labels"  # the key of a Hugging Face model's labels: the one whose shift the packing check asks


def resolve(workload, model, batch: dict) -> tuple[SequenceLayout | None, str]:
    """The workload's layout (its declared one, else the one found from `model` and `batch`), and where it
    came from in words (or why there is none)."""
    if workload.layout is not None:
        return workload.layout, workload.layout.source or DECLARED
    if model is None:
        return None, "the model could not be built here to find its layout from"
    return infer_layout(model, batch, workload.varying)


def infer_layout(model, batch: dict, varying: dict) -> tuple[SequenceLayout | None, str]:
    """The layout of `model`'s sequences in batches like `batch`, and where it came from (or why there is none)."""
    from autocompile.workloads.checkpointing import huggingface_model

    found, _ = huggingface_model(model)
    if found is None:
        return None, "it is not a Hugging Face model"
    name = type(found).__name__
    causal = _causal(found)
    why = _why_not(name, causal, _forward_parameters(found), batch, varying)
    if why:
        return None, why
    mask = "attention_mask" if "attention_mask" in varying else None
    shifted = (LABELS,) if causal else ()  # a causal LM's own loss (labels=input_ids) shifts them
    kind = "a causal decoder (its packed mask from the position ids" if causal else f"an encoder ({mask!r} made block-diagonal"
    source = f"found from {name}: {kind}, 'position_ids' taken by its forward); {_shift_words(shifted, varying)}"
    return SequenceLayout(positions="position_ids", mask=mask, causal=causal, shifted=shifted, source=source), source


def _why_not(name: str, causal: bool | None, parameters, batch: dict, varying: dict) -> str | None:
    """Why no layout is found for a model of class `name` and batches like `batch`, or None."""
    if "position_ids" not in parameters:
        return f"{name}'s forward takes no position_ids"
    if causal is None:
        return f"{name} has causal and bidirectional attention both (an encoder-decoder?): declare Workload.layout"
    unknown = [key for key in varying if key not in parameters]
    if unknown:
        keys = ", ".join(map(repr, unknown))
        return f"{keys} of the batch is no argument of {name}'s forward: what it is to packing is not known"
    rows = {value.shape[0] for key, value in batch.items() if key in varying and hasattr(value, "shape")}
    apart = [k for k, v in batch.items() if k not in varying and getattr(v, "dim", lambda: 0)() >= 1 and v.shape[0] in rows]
    if apart:
        return f"{', '.join(map(repr, apart))} of the batch has a row per sequence but is not packed with them (not varying)"
    if causal and LABELS not in varying:
        return f"{name} is a causal decoder and its batches carry no labels: what its loss trains on is not known"
    if not causal and "attention_mask" not in varying:
        return f"{name} is an encoder and its batches carry no attention_mask to make block-diagonal"
    return None


def _causal(model) -> bool | None:
    """Whether the model's attention is causal (its attention modules' `is_causal`; a ``...ForCausalLM``
    where they say nothing); None where some are causal and some not."""
    seen = {module.is_causal for module in model.modules() if isinstance(getattr(module, "is_causal", None), bool)}
    if len(seen) > 1:
        return None
    return seen.pop() if seen else type(model).__name__.endswith("ForCausalLM")


def _forward_parameters(model) -> set[str]:
    return set(inspect.signature(type(model).forward).parameters)


def _shift_words(shifted: tuple, varying: dict) -> str:
    """What the layout takes of the labels, in words."""
    if LABELS not in varying:
        return "no labels"
    how = "shifted by the loss (a causal LM's own loss shifts them)" if shifted else "the loss's targets as they are"
    return f"{LABELS!r} taken to be {how}, which the packing check asks of the loss before a packed trial"


def packed_already(trainer, batch: dict) -> bool:
    """Whether the job packs its batches itself: TRL's packing or padding_free, a flattening collator, or batches
    whose position ids restart inside a row."""
    args = trainer.args
    if getattr(args, "packing", False) or getattr(args, "padding_free", False):
        return True
    if type(trainer.data_collator).__name__ in PACKING_COLLATORS:
        return True
    positions = batch.get("position_ids")
    return positions is not None and bool((positions[:, 1:] == 0).any())
