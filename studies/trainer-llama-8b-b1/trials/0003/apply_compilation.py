"""Compile settings for trainer:examples/trainer_llama.py:llama_8b (study 'trainer-llama-8b-b1', trial 3), found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['model.layers']  # lists of repeated blocks, each compiled alone
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'input_ids': (1, 0), 'attention_mask': (1, 0), 'labels': (1, -100)}  # key: (dim, pad value)
PACK_LENGTH = None  # the whole batch in one row, its length a multiple of PACK_MULTIPLE
PACK_MULTIPLE = 64
POSITIONS = 'position_ids'  # the key the forward passes to the model as its position ids
MASK = 'attention_mask'  # the key of the padding mask the forward passes, if any
CAUSAL = True  # a causal decoder: its mask comes from the position ids
SHIFTED = ('labels',)  # labels the loss shifts: each sequence's first ignored
MASK_DTYPE = None  # no block-diagonal mask: MASK is None or CAUSAL


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
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

    Give it the batch on the host, in the collate or before moving it to the GPU: it reads each
    sequence's length, which on a GPU batch waits for the GPU to finish the step before. Then move the
    packed batch pinned and with non_blocking=True, as a DataLoader with pin_memory=True does.
    """
    batch = pack(batch)
    return batch

def apply_to_trainer(trainer):
    """Apply these settings to a Hugging Face Trainer (TRL's SFTTrainer too): call it once, after
    building the Trainer and before trainer.train(); returns the trainer. The Trainer's own
    torch_compile is turned off, so nothing compiles twice. apply_compilation runs when the Trainer
    creates its optimizer (after it sets its activation checkpointing), on the model and that
    optimizer; every batch goes through prepare_batch before the Trainer's training step."""
    trainer_compile_off(trainer)
    create_optimizer = trainer.create_optimizer

    def create_optimizer_and_compile(*args, **kwargs):
        optimizer = create_optimizer(*args, **kwargs)
        if not getattr(trainer, "compiled_by_apply_to_trainer", False):
            apply_compilation(trainer.model, optimizer)
            trainer.compiled_by_apply_to_trainer = True
        return optimizer

    trainer.create_optimizer = create_optimizer_and_compile
    training_step = trainer.training_step

    def training_step_prepared(model, inputs, *args, **kwargs):
        return training_step(model, prepare_batch(inputs), *args, **kwargs)

    trainer.training_step = training_step_prepared
    trainer.compute_loss_func = compile_loss(model_loss(trainer.model))  # the model's own loss, compiled apart
    return trainer


def trainer_compile_off(trainer):
    """The Trainer's own torch_compile off: accelerate would compile the whole model again."""
    trainer.args.torch_compile = False
    plugin = getattr(trainer.accelerator.state, "dynamo_plugin", None)
    if plugin is not None:
        from accelerate.utils import DynamoBackend

        plugin.backend = DynamoBackend.NO


def model_loss(model):
    """The model's own loss (a causal LM head's loss_function: labels shifted, float32, padding
    ignored) as the Trainer's compute_loss_func takes it: (outputs, labels, num_items_in_batch)."""
    loss_function = model.loss_function

    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"]
        return loss_function(logits, labels, vocab_size=logits.shape[-1], num_items_in_batch=num_items_in_batch)

    return loss

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