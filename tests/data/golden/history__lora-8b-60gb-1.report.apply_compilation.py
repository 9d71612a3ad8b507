"""Compile settings for lora-8b (study 'lora-8b-60gb-1', trial 3), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 2.01 steps/s steady (2.04x eager, torch.compile defaults not measured to a steady speed), warm-up 35.7 s. The steady speed pools its runs in the finalist round: 2.03 then 1.99 steps/s. Peak memory 52.3 GB (cuda max allocated), eager as built 29.2 GB.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.

It turns the model's own activation checkpointing off (Hugging Face activation checkpointing on LlamaForCausalLM inside PeftModelForCausalLM (is_gradient_checkpointing)): each block's
forward runs once, and compile's partitioner recomputes what it does not keep instead.
"""
import torch

ACTIVATION_MEMORY_BUDGET = 0.5  # activations kept for the backward; the rest is recomputed
COMPILE_KWARGS = {}
REGIONS = ['base_model.model.model.layers']  # lists of repeated blocks, each compiled alone
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'input_ids': (1, 0), 'labels': (1, -100), 'attention_mask': (1, 0)}  # key: (dim, pad value)
PAD_MULTIPLE = 64  # the longest in the batch, rounded up


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    import torch._functorch.config  # AOTAutograd's partitioner reads it at each compile
    torch._functorch.config.activation_memory_budget = ACTIVATION_MEMORY_BUDGET
    model_checkpointing_off(model)  # the model's own activation checkpointing off: compile recomputes instead
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    for group in optimizer.param_groups:  # one fused kernel per step instead of foreach
        group["foreach"], group["fused"] = False, True
    return model, optimizer


# Hugging Face's switches, newest names first (transformers 5 renamed them from gradient_ to activation_)
_DISABLE = ("activation_checkpointing_disable", "gradient_checkpointing_disable")
_ENABLE = (("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
           ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"))


def _checkpointing_model(model):
    """The Hugging Face model in `model`: itself, or the one a wrapper (peft's PeftModel) holds."""
    for module in model.modules():
        if any(callable(getattr(type(module), name, None)) for name in _DISABLE):
            return module
    raise ValueError("no Hugging Face model with activation checkpointing in this model")


def _method(owner, names):
    return next(getattr(owner, name) for name in names if callable(getattr(type(owner), name, None)))


def model_checkpointing_off(model):
    """Turn the model's own activation checkpointing off: each block's forward runs once, and
    compile's partitioner chooses what to recompute in the backward (ACTIVATION_MEMORY_BUDGET)."""
    _method(_checkpointing_model(model), _DISABLE)()


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return torch.compile(loss_fn, fullgraph=True, **LOSS_COMPILE_KWARGS)


def backward(loss):
    """The backward pass (call it where you called loss.backward())."""
    loss.backward()


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