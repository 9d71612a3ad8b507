"""Compile settings for llama-8b (study 'llama-8b-fresh-5', trial 4), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 5.19 steps/s steady (1.55x eager, 1.40x torch.compile defaults), warm-up 91.3 s.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn). To start warm,
call load_compile_cache(path) first with a cache from `autocompile export`.
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
    # The learning rate as a tensor, so an LR scheduler's new value does not recompile the
    # compiled optimizer step (a float LR is a constant of the compiled code).
    for group in optimizer.param_groups:
        device = group["params"][0].device
        # A fused kernel reads a tensor LR on the parameters' device (a CPU one it reads back
        # as a number, which a CUDA graph would freeze); compiled steps take it on the CPU.
        group["lr"] = torch.tensor(float(group["lr"]), device=device if group.get("fused") else "cpu")
        if group.get("foreach") and not group.get("capturable") and device.type == "cpu":
            # foreach takes a tensor LR only when capturable, which needs an accelerator
            # (on a GPU, torch.compile makes a fresh optimizer capturable itself)
            group["foreach"] = False
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
        target = -(-length // PAD_MULTIPLE) * PAD_MULTIPLE
        if target > length:
            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]
            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)
    return batch


def compile_cache_key():
    """What a compile cache is only valid for: the torch, triton and device that made it."""
    try:
        import triton
    except ImportError:
        triton = None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "triton": getattr(triton, "__version__", None), "device": device}


def load_compile_cache(path):
    """Load the compile cache that `autocompile export` saved at `path` (a .bin file, its key
    in path + ".json"), so the first steps reuse its compiled code instead of compiling it.
    Call it once before the first compiled step. It loads only when its key is the running
    torch, triton and device; otherwise it says why and does nothing. Returns whether it loaded.

    The file holds code that torch will run: load only a cache from your own export.
    """
    import json

    with open(path + ".json") as f:
        made_with = json.load(f)["key"]
    running = compile_cache_key()
    if made_with != running:
        print(f"load_compile_cache: not loaded: {path} was made with {made_with}, this is {running}")
        return False
    with open(path, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
    return True