"""Compile settings for trainer:examples/trainer_llama.py:llama_8b (study 'trainer-llama-8b-b5', trial 0), found by autocompile.

For a Hugging Face Trainer (TRL's SFTTrainer too): call apply_to_trainer(trainer) once, after
building the Trainer and before trainer.train(). To start warm, call load_compile_cache(path)
first with a cache from `autocompile export`.
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