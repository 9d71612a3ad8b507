"""Compile settings for captioner (study 'captioner', trial 4), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both, and
prepare_batch(batch) on every batch, right before the forward pass.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['encoder.layers', 'decoder.transformer.h']  # lists of repeated blocks, each compiled alone

VARYING = {'decoder_input_ids': (1, 0), 'labels': (1, -100), 'decoder_attention_mask': (1, 0)}  # key: (dim, pad value)
PAD_MULTIPLE = 64  # the longest in the batch, rounded up


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    optimizer.step = torch.compile(optimizer.step)
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
