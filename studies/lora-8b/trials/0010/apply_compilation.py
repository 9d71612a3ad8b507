"""Compile settings for lora-8b (study 'lora-8b-fresh-2', trial 10), found by autocompile.

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

ACTIVATION_MEMORY_BUDGET = 0.2  # activations kept for the backward; the rest is recomputed
COMPILE_KWARGS = {}
REGIONS = ['base_model.model.model.layers']  # lists of repeated blocks, each compiled alone
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'input_ids': (1, 0), 'labels': (1, -100), 'attention_mask': (1, 0)}  # key: (dim, pad value)
PACK_LENGTH = None  # the whole batch in one row, its length a multiple of PACK_MULTIPLE
PACK_MULTIPLE = 64
POSITIONS = 'position_ids'  # the key the forward passes to the model as its position ids
MASK = 'attention_mask'  # the key of the padding mask the forward passes, if any
CAUSAL = True  # a causal decoder: its mask comes from the position ids
SHIFTED = ()  # labels the loss shifts: each sequence's first ignored
MASK_DTYPE = None  # no block-diagonal mask: MASK is None or CAUSAL


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


def pack_plan(batch):
    """Where each packed token comes from: the batch's sequences, read as right-padded rows, placed whole
    into rows of PACK_LENGTH tokens (the whole batch in one row of a multiple of PACK_MULTIPLE where
    PACK_LENGTH is None), first fit, longest first. Returns, for each packed token, its flat index in the
    batch (-1: the row's padded tail), its position, its sequence in the row, whether it starts one; and
    the packed shape."""
    real = batch[MASK].bool() if MASK else torch.stack([batch[k] != pad for k, (_, pad) in VARYING.items()]).any(0)
    width = real.shape[1]
    lengths = torch.where(real.any(1), width - real.flip(1).int().argmax(1), 0).tolist()
    capacity = max(PACK_LENGTH or sum(lengths), max(lengths))
    rows, room = [], []
    for i in sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i]):
        j = next((j for j, free in enumerate(room) if free >= lengths[i]), None)
        if j is None:
            rows.append([])
            room.append(capacity)
            j = len(rows) - 1
        rows[j].append(i)
        room[j] -= lengths[i]
    length = capacity if PACK_LENGTH else -(-capacity // PACK_MULTIPLE) * PACK_MULTIPLE
    source, positions, sequence, starts = [], [], [], []
    for members in rows:
        for k, i in enumerate(members):
            source += range(i * width, i * width + lengths[i])
            positions += range(lengths[i])
            sequence += [k] * lengths[i]
            starts += [True] + [False] * (lengths[i] - 1)
        tail = length - sum(lengths[i] for i in members)
        source += [-1] * tail
        positions += range(tail)  # the tail is a sequence of its own: it sees nothing real, nothing real sees it
        sequence += [len(members)] * tail
        starts += [False] * tail
    return source, positions, sequence, starts, (len(rows), length)


def pack(batch):
    """The batch with its sequences packed (pack_plan), position ids added, and its mask as the model
    needs it under packing."""
    source, positions, sequence, starts, shape = pack_plan(batch)
    device = batch[next(iter(VARYING))].device
    source = torch.tensor(source, device=device)
    tail, first = source < 0, torch.tensor(starts, device=device)
    for key, (_, pad_value) in VARYING.items():
        values = batch[key].reshape(-1)[source.clamp(min=0)].masked_fill(tail, pad_value)
        if key in SHIFTED:  # a loss that shifts its labels: no sequence learns to predict the next one's start
            values = values.masked_fill(first, pad_value)
        batch[key] = values.view(shape)
    batch[POSITIONS] = torch.tensor(positions, device=device).view(shape)
    if MASK and CAUSAL:
        batch[MASK] = None  # a causal decoder takes its packed mask from the position ids
    elif MASK:
        sequence = torch.tensor(sequence, device=device).view(shape)
        apart = sequence[:, None, :, None] != sequence[:, None, None, :]
        batch[MASK] = torch.zeros(apart.shape, dtype=MASK_DTYPE, device=device).masked_fill(
            apart, torch.finfo(MASK_DTYPE).min)
    return batch


def prepare_batch(batch):
    """Packs the batch's sequences into rows for the compiled model (call it where the collate ends).

    The keys of VARYING come back packed: each sequence whole in one row, rows filled longest first, so
    no padding is computed but the rows' tails. POSITIONS is added: position ids that restart at each
    sequence, which the forward must pass to the model (they tell it where each sequence starts). MASK,
    where set: None for a causal decoder (it takes its mask from the position ids), or, for an encoder,
    a block-diagonal mask that keeps each sequence to itself. The loss covers the same tokens as the
    padded batch's: the real items are unchanged.
    """
    batch = pack(batch)
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