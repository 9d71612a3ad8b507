"""Compile settings for moe-2b (study 'moe-2b-fresh-1', trial 14), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.
"""
import torch


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    # eager: nothing compiled
    return model, optimizer


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return loss_fn  # not compiled in this configuration


def backward(loss):
    """The backward pass (call it where you called loss.backward())."""
    loss.backward()


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
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