"""Compile settings for llama-8b (study 'llama-8b', trial 7), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 5.02 steps/s steady (1.45x eager, torch.compile defaults not measured to a steady speed), warm-up 21.2 s.

Call apply_compilation(model, optimizer) once, after building both, and
prepare_batch(batch) on every batch, right before the forward pass.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['model.layers']  # lists of repeated blocks, each compiled alone

VARYING = {'input_ids': (1, 0), 'labels': (1, -100)}  # key: (dim, pad value)
PAD_MULTIPLE = 64  # the longest in the batch, rounded up


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    for group in optimizer.param_groups:  # one fused kernel per step instead of foreach
        group["foreach"], group["fused"] = False, True
    return model, optimizer


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    for key, (dim, pad_value) in VARYING.items():
        tensor = batch[key]
        length = tensor.shape[dim]
        target = -(-length // PAD_MULTIPLE) * PAD_MULTIPLE
        if target > length:
            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]
            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)
    return batch
