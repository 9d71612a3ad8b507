"""A Hugging Face Trainer (TRL's SFTTrainer too) as a Workload: the job as `trainer.train()` runs it.

The user's factory takes no argument and returns a Trainer, built but not trained. Everything a trial
needs is derived from it: the model as the Trainer holds it (peft-wrapped or not), the optimizer and LR
scheduler the Trainer creates, batches from its own dataloader and collator, the loss as its
`compute_loss` computes it, and its step: the Trainer's `training_step` (forward, loss, backward),
its gradient clipping (`max_grad_norm`), the optimizer's step and the scheduler's. The snippet goes in
through the emitted `apply_to_trainer(trainer)` (apply.py), exactly as the user calls it.

A process calls the factory once per model it builds. The first call also gives the batches and the
facts the Workload declares (which keys vary in length, how packed sequences would reach the model);
its Trainer is kept for the first build, so a trial builds its model once.
"""

from __future__ import annotations

import gc
import math
from typing import Any, Callable

from autocompile.errors import UserError
from autocompile.workloads import FRESH_WINDOWS, SequenceLayout, Workload, WorkloadOptions
from autocompile.workloads.layout import IGNORE_INDEX, infer_layout, packed_already

PREFIX = "trainer:"  # --trainer FILE.py:FACTORY is the model "trainer:FILE.py:FACTORY"
# Batches in the warm-up's pass and in each measuring window: the windows take batches the warm-up did not, so each
# one's shapes are as new to the device's per-shape caches (cuDNN attention's plans, say) as in `trainer.train()`.
PASS = 64
POOL = PASS * (2 + FRESH_WINDOWS)  # the warm-up's pass, a longer warm-up's steps, the windows


def is_trainer_target(name: str) -> bool:
    return name.startswith(PREFIX)


class TrainerJob:
    """The user's Trainer factory, called once for each model a process builds."""

    def __init__(self, target: str, factory: Callable[[], Any]):
        self.target = target
        self.factory = factory
        self.pending = None  # the Trainer the probe built, kept for the first build
        self.current = None  # the Trainer of the model built last: its step, loss and hooks

    def new_trainer(self, seed: int = 0):
        """The factory's Trainer, checked: one line and exit 2 for anything that is not one to search."""
        import torch

        torch.manual_seed(seed)  # the same weights in every build of a process, whatever the factory seeds
        try:
            trainer = self.factory()
        except UserError:
            raise
        except Exception as exc:  # the user's code failed: say where, in one line
            raise UserError(f"the Trainer factory {self.target} raised {type(exc).__name__}: {_first_line(exc)}") from None
        _check(trainer, self.target)
        return trainer

    def take(self, seed: int = 0):
        trainer, self.pending = self.pending, None
        return trainer or self.new_trainer(seed)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _check(trainer, target: str) -> None:
    """A Trainer built but not trained, of one process, with a step a trial can run."""
    try:
        from transformers import Trainer
    except ImportError:
        raise UserError("--trainer needs transformers: pip install transformers") from None
    if not isinstance(trainer, Trainer):
        raise UserError(f"{target} did not give a transformers Trainer (got {type(trainer).__name__})")
    if trainer.state.global_step > 0:
        raise UserError(
            f"{target} gave a Trainer that has trained {trainer.state.global_step} steps already: give one built but not trained"
        )
    args = trainer.args
    if trainer.train_dataset is None:
        raise UserError(f"{target} gave a Trainer without a train_dataset: there is nothing to train on")
    if args.gradient_accumulation_steps != 1:
        raise UserError(
            f"{target}: gradient_accumulation_steps={args.gradient_accumulation_steps}; a trial steps the optimizer "
            "after every batch: build the Trainer with gradient_accumulation_steps=1 for the search"
        )
    if args.fp16:
        raise UserError(f"{target}: fp16 (a gradient scaler) is not searched; build the Trainer with bf16=True or neither")
    if args.world_size > 1:
        raise UserError(f"{target}: a Trainer of {args.world_size} processes; search it as one process (--nproc for ranks)")


def trainer_workload(target: str) -> Workload:
    """The Workload of the Trainer that `target` (FILE.py:FACTORY or package.module:factory) builds."""
    from autocompile.workloads import load_factory

    job = TrainerJob(target, load_factory(target))
    trainer = job.pending = job.new_trainer()
    batches = _pool(trainer)
    varying = _varying(trainer, batches)
    layout, _why = _layout(trainer, batches, varying)
    causal_loss = _has_causal_lm_loss(trainer.model) and "labels" in batches[0] and _loss_is_models(trainer)
    description = _describe(trainer, batches)
    longest = _longest(trainer, batches, varying)

    def build(options: WorkloadOptions):
        trainer = job.take(options.seed)
        _checkpointing_as_args(trainer)  # what train() does first
        optimizer = trainer.create_optimizer()  # the Trainer's own; apply_to_trainer's hook gets it again
        if options.device == "meta":  # the parent's look at the model: free the device at once
            return _to_meta(trainer.model, optimizer)
        job.current = trainer
        return trainer.model, optimizer

    def pool(options: WorkloadOptions, n: int) -> list[dict]:
        return [_to_device(batches[i % len(batches)], options.device) for i in range(n)]

    def loss(model, batch):  # the Trainer's compute_loss, in its context (a forward only: the checks')
        trainer = job.current
        with trainer.compute_loss_context_manager():
            return trainer.compute_loss(model, dict(batch))

    def forward(model, batch):
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        return model(**inputs)["logits"]

    def criterion(logits, batch):  # the model's own loss, as the snippet's model_loss gives it to the Trainer
        loss_function = _unwrapped(job.current.model).loss_function
        return loss_function(logits, batch["labels"], vocab_size=logits.shape[-1])

    def attach(namespace: dict, model, optimizer):
        return _attach(job.current, namespace)

    def train_step(model, batch):
        return _train_step(job.current, model, batch)

    return Workload(
        name=PREFIX + target,
        description=description,
        build=build,
        batches=pool,
        loss=loss,
        # nothing but the model's loss reads its logits: they may give way to the hidden states (lm_loss)
        own_loss=causal_loss and type(trainer).compute_loss is _trainer_class().compute_loss,
        forward=forward if causal_loss else None,
        criterion=criterion if causal_loss else None,
        schedule=lambda optimizer: job.current.create_scheduler(max_steps(job.current), optimizer),  # the Trainer's own
        count=_count,
        unit="tokens",
        varying=varying,
        max_len=lambda options: longest,
        batch_pool=len(batches),
        fresh_pass=_fresh_pass(len(batches)),
        pad_multiple=_pad_multiple(trainer) if varying else None,
        gpu_only=False,
        layout=layout,
        attach=attach,
        train_step=train_step,
        framework="trainer",
        clip_norm=trainer.args.max_grad_norm or None,
    )


def _pool(trainer) -> list[dict]:
    """The first POOL batches of the Trainer's own dataloader and collator, kept on the host."""
    batches = []
    for batch in trainer.get_train_dataloader():
        batches.append({key: value.cpu() for key, value in batch.items() if hasattr(value, "cpu")})
        if len(batches) == POOL:
            break
    if not batches:
        raise UserError("the Trainer's train dataloader gave no batch")
    return batches


def _fresh_pass(pool: int) -> int:
    """The warm-up's pass and each window's, in batches: PASS, fewer for a dataset of fewer batches; 0 (every window
    over the whole pool) below 4 batches a pass."""
    fresh = min(PASS, pool // (2 + FRESH_WINDOWS))
    return fresh if fresh >= 4 else 0


def _pad_multiple(trainer) -> int | None:
    """The multiple the job's collator pads each batch's length up to: its pad_to_multiple_of (TRL's from its
    SFTConfig too), where above 1."""
    for owner in (trainer.data_collator, trainer.args):
        value = getattr(owner, "pad_to_multiple_of", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return value
    return None


def _to_device(batch: dict, device: str) -> dict:
    return {key: value.to(device) for key, value in batch.items()}


def _varying(trainer, batches: list[dict]) -> dict[str, tuple[int, int]]:
    """The keys padded along dimension 1 to the batch's longest, with their pad values: those whose length
    follows input_ids' and changes between batches (none where every batch is as long as the others)."""
    lengths = {batch["input_ids"].shape[1] for batch in batches if "input_ids" in batch}
    if len(lengths) < 2:
        return {}
    keys = [k for k, v in batches[0].items() if v.dim() >= 2 and all(b[k].shape[1] == b["input_ids"].shape[1] for b in batches)]
    pads = {"labels": IGNORE_INDEX, "attention_mask": 0, "position_ids": 0, "token_type_ids": 0}
    return {key: (1, pads.get(key, _pad_id(trainer, batches))) for key in keys}


def _pad_id(trainer, batches: list[dict]) -> int:
    """The pad token: the collator's, the tokenizer's, else what fills a padded row's tail."""
    for owner in (trainer.data_collator, getattr(trainer.data_collator, "tokenizer", None), trainer.processing_class):
        value = getattr(owner, "pad_token_id", None)
        if isinstance(value, int):
            return value
    for batch in batches:
        if "attention_mask" in batch and (batch["attention_mask"] == 0).any():
            return int(batch["input_ids"][batch["attention_mask"] == 0][0])
    return 0


def _layout(trainer, batches: list[dict], varying: dict) -> tuple[SequenceLayout | None, str]:
    if packed_already(trainer, batches[0]):
        why = "the job packs its batches itself"
        return SequenceLayout(positions="position_ids", packed=True, source=why), why
    return infer_layout(trainer.model, batches[0], varying)


def _longest(trainer, batches: list[dict], varying: dict) -> int:
    """The longest sequence training can meet: the dataset's longest where it holds token ids, else the
    job's own bound (TRL's max_length), else the pool's longest."""
    seen = max(batch["input_ids"].shape[1] for batch in batches) if "input_ids" in batches[0] else 0
    dataset = trainer.train_dataset
    try:
        column = dataset["input_ids"]
        return max(seen, max(len(ids) for ids in column))
    except (KeyError, TypeError, ValueError, IndexError):
        pass
    bound = getattr(trainer.args, "max_length", None) or getattr(trainer.data_collator, "max_length", None)
    return max(seen, bound or 0)


def _count(batch: dict) -> int:
    """Real tokens: the labels that are not padding, else the attention mask's ones, else every token."""
    if "labels" in batch:
        return int((batch["labels"] != IGNORE_INDEX).sum())
    if batch.get("attention_mask") is not None:
        return int(batch["attention_mask"].sum())
    return int(batch["input_ids"].numel())


def _describe(trainer, batches: list[dict]) -> str:
    model = _unwrapped(trainer.model)
    args = trainer.args
    precision = "bf16" if args.bf16 else str(next(model.parameters()).dtype).removeprefix("torch.")
    rows = batches[0]["input_ids"].shape[0] if "input_ids" in batches[0] else args.per_device_train_batch_size
    width = max((batch["input_ids"].shape[1] for batch in batches if "input_ids" in batch), default=0)
    peft = " (peft)" if model is not trainer.model else ""
    optim = getattr(args.optim, "value", args.optim)
    return (
        f"{type(trainer).__name__} of {type(model).__name__}{peft}, {precision}, optim {optim}, "
        f"batch {rows} x up to {width} tokens, max_grad_norm {args.max_grad_norm:g}"
    )


def _unwrapped(model):
    """The Hugging Face model in a wrapper such as peft's (the model itself where there is none)."""
    from autocompile.workloads.checkpointing import huggingface_model

    found, _ = huggingface_model(model)
    return found if found is not None else model


def _loss_is_models(trainer) -> bool:
    """Whether the Trainer's loss is its model's own: no compute_loss_func of the user's, no label smoothing."""
    return trainer.compute_loss_func is None and not trainer.args.label_smoothing_factor


def _trainer_class():
    from transformers import Trainer

    return Trainer


def _has_causal_lm_loss(model) -> bool:
    """Whether the model has a loss of its own the Trainer can compile apart: a causal LM head's `loss_function`
    (labels shifted, float32, padding ignored)."""
    model = _unwrapped(model)
    return type(model).__name__.endswith("ForCausalLM") and hasattr(model, "loss_function")


def _checkpointing_as_args(trainer) -> None:
    """The model's activation checkpointing as the Trainer's arguments say, as train() sets it first."""
    args = trainer.args
    on = getattr(args, "activation_checkpointing", None)
    if on is None:
        on = getattr(args, "gradient_checkpointing", False)
    if not on:
        return
    kwargs = dict(
        getattr(args, "activation_checkpointing_kwargs", None) or getattr(args, "gradient_checkpointing_kwargs", None) or {}
    )
    model = trainer.model
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs or None)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)


def _to_meta(model, optimizer):
    """The model on the meta device, and its optimizer following it, so the parent holds no device memory."""
    import torch

    names = {id(p): name for name, p in model.named_parameters()}
    model.to("meta")
    params = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [params[names[id(p)]] for p in group["params"] if id(p) in names]
    optimizer.state.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return model, optimizer


def max_steps(trainer) -> int:
    """The optimizer steps of the whole run, as the Trainer counts them for its scheduler."""
    args = trainer.args
    if args.max_steps > 0:
        return args.max_steps
    per_epoch = max(1, len(trainer.get_train_dataloader()) // args.gradient_accumulation_steps)
    return per_epoch * math.ceil(args.num_train_epochs)


def _attach(trainer, namespace: dict):
    """The snippet into the Trainer through apply_to_trainer, then what train() does before its first step,
    through the Trainer's own methods: its optimizer (compiled by the hook), accelerate's prepare (mixed
    precision's autocast, device placement), its LR scheduler."""
    namespace["apply_to_trainer"](trainer)
    optimizer = trainer.create_optimizer()
    model, trainer.optimizer = trainer.accelerator.prepare(trainer.model, optimizer)
    trainer.model_wrapped = model
    trainer.current_gradient_accumulation_steps = 1
    scheduler = trainer.create_scheduler(num_training_steps=max_steps(trainer), optimizer=trainer.optimizer)
    return model, trainer.optimizer, scheduler


def _train_step(trainer, model, batch: dict):
    """One step as the Trainer's loop runs it, but the optimizer's and the scheduler's steps: its count of
    the batch's items, its training_step (forward, loss, backward), its gradient clipping."""
    device = trainer.args.device
    if hasattr(trainer, "get_batch_samples"):
        _, items = trainer.get_batch_samples(iter([batch]), 1, device)
    else:
        items = None
    loss = trainer.training_step(model, batch, items)
    if trainer.args.max_grad_norm and trainer.args.max_grad_norm > 0:
        clip = getattr(trainer, "_clip_grad_norm", None)  # as the loop calls it (transformers 5)
        if clip is not None:
            clip(model)
        else:
            trainer.accelerator.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
    return loss


__all__ = ["PREFIX", "TrainerJob", "is_trainer_target", "max_steps", "trainer_workload"]
