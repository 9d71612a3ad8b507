"""Compile settings for llama-8b (study 'llama-8b', trial 2), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 3.94 steps/s steady (1.14x eager, - torch.compile defaults), warm-up 24.0 s.

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
