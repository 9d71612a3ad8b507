"""Compile settings for moe-2b (study 'moe-2b-fresh-1', trial 12), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.
"""
import torch

COMPILE_KWARGS = {'mode': 'reduce-overhead'}
REGIONS = ['model.layers']  # lists of repeated blocks, each compiled alone
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'input_ids': (1, 0), 'labels': (1, -100)}  # key: (dim, pad value)
PACK_LENGTH = None  # the whole batch in one row, its length a multiple of PACK_MULTIPLE
PACK_MULTIPLE = 64
POSITIONS = 'position_ids'  # the key the forward passes to the model as its position ids
MASK = None  # the key of the padding mask the forward passes, if any
CAUSAL = True  # a causal decoder: its mask comes from the position ids
SHIFTED = ()  # labels the loss shifts: each sequence's first ignored
MASK_DTYPE = None  # no block-diagonal mask: MASK is None or CAUSAL
MAX_SEQUENCES = 16  # varlen attention: sequences in a packed batch, tails too, at most
MAX_LEN = 2048  # varlen attention: the longest sequence


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    varlen_attention_on(model)  # packed rows: Flash Attention over each sequence, nothing across
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


from torch.nn.attention.varlen import varlen_attn


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None, **kwargs):
    """A packed row's attention as Flash Attention over variable-length sequences (torch's varlen_attn):
    each sequence (where its position ids restart at 0) attends causally to itself only, and nothing
    across sequences is computed, not even masked. The model builds no mask for it (attention_mask None)."""
    if dropout:
        raise ValueError("varlen_attention: attention dropout is not supported")
    batch, heads, length, dim = query.shape
    if position_ids is None or position_ids.numel() != batch * length:
        raise ValueError("varlen_attention: the forward must pass the packed batch's position ids")
    # Where each sequence ends (the next token's position is 0, or the row's last token), in a fixed count
    # of MAX_SEQUENCES: the count not used ends where the last sequence does (zero-length sequences). No
    # value depends on the row's length, so one compiled graph serves every length.
    positions = position_ids.reshape(-1)
    ends = torch.cat([positions[1:] == 0, torch.ones_like(positions[:1], dtype=torch.bool)])
    ends = torch.nonzero_static(ends, size=MAX_SEQUENCES, fill_value=-1).reshape(-1) + 1
    cu_seq = torch.cat([torch.zeros_like(ends[:1]), ends.cummax(0).values]).to(torch.int32)
    query, key, value = (x.transpose(1, 2).reshape(batch * length, x.shape[1], dim) for x in (query, key, value))
    if key.shape[1] != heads:  # grouped key/value heads: this torch's varlen_attn takes them repeated
        key, value = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (key, value))
    out = varlen_attn(query, key, value, cu_seq, cu_seq, MAX_LEN, MAX_LEN, window_size=(-1, 0), scale=scaling)
    return out.view(batch, length, heads, dim), None


def varlen_attention_on(model):
    """The model's attention as varlen_attention (registered with Hugging Face's AttentionInterface, set on
    the model, or on the one a wrapper such as peft's holds)."""
    from transformers import AttentionInterface

    AttentionInterface.register("autocompile_varlen", varlen_attention)
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            module.set_attn_implementation("autocompile_varlen")
            return
    raise ValueError("varlen_attention_on: no Hugging Face model in this model")


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
    if positions.count(0) > MAX_SEQUENCES:  # each sequence, and each row's tail, starts at position 0
        raise ValueError(f"pack: {positions.count(0)} sequences in a packed batch, MAX_SEQUENCES is {MAX_SEQUENCES}")
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

    Give it the batch on the host, in the collate or before moving it to the GPU: it reads each
    sequence's length, which on a GPU batch waits for the GPU to finish the step before. Then move the
    packed batch pinned and with non_blocking=True, as a DataLoader with pin_memory=True does.
    """
    batch = pack(batch)
    # CUDA graphs reuse their output buffers: tell them a new training step begins
    torch.compiler.cudagraph_mark_step_begin()
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