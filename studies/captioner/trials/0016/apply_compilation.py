"""Compile settings for captioner (study 'captioner', trial 16), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn).
"""
import torch

COMPILE_KWARGS = {}


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    model.compile(**COMPILE_KWARGS)  # in place: state_dict keys are unchanged
    return model, optimizer


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return loss_fn  # not compiled in this configuration


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    return batch
