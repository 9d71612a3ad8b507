"""How a Hugging Face model's variable-length sequences reach it, found from the model and a batch.

A `SequenceLayout` says what packing needs to know (workloads/__init__.py). A workload may declare one;
for a Hugging Face model (peft-wrapped or not) that declares none it is found here: its forward takes
position ids or not, a causal LM head (``...ForCausalLM``) is a causal decoder whose packed mask comes from
the position ids and whose loss shifts the labels itself, and anything else is an encoder, which needs a
block-diagonal mask. What is found is checked by the packing check before a packed trial runs
(trial/packing_check.py), so a wrong guess refuses the configuration with its reason; it never trains.
"""

from __future__ import annotations

import inspect

from autocompile.workloads import SequenceLayout

IGNORE_INDEX = -100  # what a Hugging Face loss skips: the label value of padding
# collators that pack (or flatten) the batch's sequences into one row themselves
PACKING_COLLATORS = ("DataCollatorWithFlattening",)


def infer_layout(model, batch: dict, varying: dict) -> tuple[SequenceLayout | None, str]:
    """The layout of `model`'s sequences in batches like `batch`, and where it came from (or why there is none)."""
    from autocompile.workloads.checkpointing import huggingface_model

    found, _ = huggingface_model(model)
    if found is None:
        return None, "not a Hugging Face model: declare Workload.layout"
    if "position_ids" not in inspect.signature(type(found).forward).parameters:
        return None, f"{type(found).__name__}'s forward takes no position_ids"
    causal = type(found).__name__.endswith("ForCausalLM")
    mask = "attention_mask" if "attention_mask" in varying else None
    if not causal and mask is None:
        return None, f"{type(found).__name__} is an encoder and its batches carry no attention_mask to make block-diagonal"
    shifted = ("labels",) if causal and "labels" in batch else ()
    kind = "a causal LM (its loss shifts the labels)" if causal else "an encoder (a block-diagonal mask)"
    return SequenceLayout(positions="position_ids", mask=mask, causal=causal, shifted=shifted), (
        f"found from {type(found).__name__}: {kind}, position ids taken by its forward"
    )


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
