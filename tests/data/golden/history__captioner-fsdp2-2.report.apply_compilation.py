"""Compile settings for captioner (study 'captioner-fsdp2-2', trial 2), found by autocompile.

Measured on NVIDIA H200 with torch 2.11.0+cu130: 4.59 steps/s steady (1.09x eager, torch.compile defaults not measured to a steady speed), warm-up 34.2 s. The steady speed pools its runs in the finalist round: 4.67 then 4.51 steps/s.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.

Distributed (FSDP2): call apply_compilation on every rank after
torch.distributed.init_process_group, with the bare model on this rank's device: it shards
each repeated block, then the root, with fully_shard itself (apply_fsdp2), and moves the
optimizer (the same object, so an LR scheduler built on it stays valid) onto the sharded
parameters. Build the optimizer before, as for one process.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['encoder.layers', 'decoder.transformer.h']  # lists of repeated blocks, each compiled alone
FSDP_BLOCKS = ['encoder.layers', 'decoder.transformer.h']  # lists of repeated blocks, each sharded on its own
RESHARD_AFTER_FORWARD = True  # free the gathered parameters after the forward
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'decoder_input_ids': (1, 0), 'labels': (1, -100), 'decoder_attention_mask': (1, 0)}  # key: (dim, pad value)
PAD_MULTIPLE = 64  # the longest in the batch, rounded up


def apply_fsdp2(model, optimizer, compile_block=None):
    """fully_shard on each repeated block, then on the root (torchtitan's order). With
    compile_block, each block is compiled first and the compiled module is sharded in its place
    (FSDP2's hooks then run outside the compiled graph). The optimizer, built on the unsharded
    parameters, takes the sharded ones in their place (it holds no state before its first step)."""
    from torch.distributed.fsdp import fully_shard

    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    for path in FSDP_BLOCKS:
        blocks = model.get_submodule(path)
        for i, block in enumerate(blocks):
            if compile_block is not None:
                block = blocks[i] = compile_block(block)
            fully_shard(block, reshard_after_forward=RESHARD_AFTER_FORWARD)
    fully_shard(model, reshard_after_forward=RESHARD_AFTER_FORWARD)
    sharded = {n.replace("._orig_mod", ""): p for n, p in model.named_parameters()}
    for group, group_names in zip(optimizer.param_groups, groups):
        group["params"] = [sharded[n] for n in group_names]
    return model

def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    # each block compiled, then sharded (torchtitan's order)
    model = apply_fsdp2(model, optimizer, compile_block=lambda block: torch.compile(block, **COMPILE_KWARGS))
    for group in optimizer.param_groups:  # one fused kernel per step instead of foreach
        group["foreach"], group["fused"] = False, True
    return model, optimizer


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