"""Compile settings for llama-8b (study 'llama-8b', trial 2), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both, and
prepare_batch(batch) on every batch, right before the forward pass.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['model.layers']  # lists of repeated blocks, each compiled alone


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    return model, optimizer


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    return batch
