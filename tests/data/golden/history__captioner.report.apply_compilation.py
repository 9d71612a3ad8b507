"""Compile settings for captioner (study 'captioner', trial 5), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 20.4 steps/s steady (1.82x eager, 1.55x torch.compile defaults), warm-up 196.5 s.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn).
"""
import torch

COMPILE_KWARGS = {'mode': 'reduce-overhead'}
REGIONS = ['encoder.layers', 'decoder.transformer.h']  # lists of repeated blocks, each compiled alone

VARYING = {'decoder_input_ids': (1, 0), 'labels': (1, -100), 'decoder_attention_mask': (1, 0)}  # key: (dim, pad value)
BUCKETS = [16, 32, 64, 128, 256]  # a few fixed lengths: one graph each


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    optimizer.step = torch.compile(optimizer.step)
    return model, optimizer


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return loss_fn  # not compiled in this configuration


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    for key, (dim, pad_value) in VARYING.items():
        tensor = batch[key]
        length = tensor.shape[dim]
        target = next(b for b in BUCKETS if b >= length)
        if target > length:
            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]
            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)
    # CUDA graphs reuse their output buffers: tell them a new training step begins
    torch.compiler.cudagraph_mark_step_begin()
    return batch
