"""Tiny Hugging Face Trainer jobs for the CPU tests of `search --trainer` and `apply_to_trainer`.

Each factory takes no argument and returns a Trainer built but not trained, as a user writes one: a tiny
Llama of random weights, a tokenizer made here (no download), token ids of a fine-tuning length mix.
AUTOCOMPILE_TEST_OUT names the folder the Trainers write to (a temporary one by default).
"""

from __future__ import annotations

import os
import random
import tempfile
import time

import torch

VOCAB = 128
STEPS = 8


def tokenizer():
    """A word-level tokenizer of VOCAB tokens, pad token 0, built here."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    return tok


def dataset(n: int = 64, longest: int = 48, seed: int = 0):
    """n token-id sequences of 4 to `longest` tokens, most of them short."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(4, longest // 3) if rng.random() < 0.7 else rng.randint(longest // 3, longest)
        rows.append({"input_ids": [rng.randrange(3, VOCAB) for _ in range(length)]})
    return Dataset.from_list(rows)


def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def _out() -> str:
    return os.environ.get("AUTOCOMPILE_TEST_OUT") or tempfile.mkdtemp(prefix="trainer-job-")


def arguments(**overrides):
    from transformers import TrainingArguments

    settings = dict(
        output_dir=_out(),
        per_device_train_batch_size=4,
        max_steps=STEPS,
        learning_rate=1e-3,
        warmup_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


def language_modeling():
    """A Trainer of one's own: a causal LM with DataCollatorForLanguageModeling, padded to each batch's longest."""
    from transformers import DataCollatorForLanguageModeling, Trainer

    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    return Trainer(model=model(), args=arguments(), train_dataset=dataset(), data_collator=collator)


# What the model's first forward of each new sequence length costs in `per_length_cost`, as cuDNN attention's plan
# for a new shape does on a GPU: longer than any step of the tiny model itself, so its speed shows who paid it.
PLAN_S = 0.1


def per_length_cost():
    """language_modeling at batch 1, each batch of a length of its own, the model paying PLAN_S the first time it
    sees a length: a run over the dataset pays it at every step."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer

    rng = random.Random(0)
    lengths = list(range(8, 168))
    rng.shuffle(lengths)
    rows = [{"input_ids": [rng.randrange(3, VOCAB) for _ in range(n)]} for n in lengths]
    seen = set()

    def plan(module, args, kwargs):
        length = kwargs["input_ids"].shape[1]
        if length not in seen:
            seen.add(length)
            time.sleep(PLAN_S)

    built = model()
    built.register_forward_pre_hook(plan, with_kwargs=True)
    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    args = arguments(per_device_train_batch_size=1)
    return Trainer(model=built, args=args, train_dataset=Dataset.from_list(rows), data_collator=collator)


def label_smoothing():
    """language_modeling with the Trainer's label smoothing: its loss is not the model's own."""
    from transformers import DataCollatorForLanguageModeling, Trainer

    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    args = arguments(label_smoothing_factor=0.1)
    return Trainer(model=model(), args=args, train_dataset=dataset(), data_collator=collator)


def _sft(**overrides):
    """TRL's SFTTrainer of the tiny Llama on `dataset()`, its SFTConfig's settings with `overrides`."""
    from trl import SFTConfig, SFTTrainer

    settings = dict(
        output_dir=_out(),
        per_device_train_batch_size=2,
        max_steps=STEPS,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        max_length=64,
        disable_tqdm=True,
    )
    config = SFTConfig(**{**settings, **overrides})
    return SFTTrainer(model=model(), args=config, train_dataset=dataset(), processing_class=tokenizer())


def sft_packed():
    """TRL's SFTTrainer with packing=True: its batches come packed, with position ids."""
    return _sft(packing=True)


def sft_padded_to_16():
    """TRL's SFTTrainer, not packed, its collator padding each batch's length up to a multiple of 16."""
    return _sft(pad_to_multiple_of=16)


def sft_one_row():
    """TRL's SFTTrainer, not packed, at batch 1: every batch's attention_mask all ones."""
    return _sft(per_device_train_batch_size=1)


def lora_checkpointing():
    """peft's LoRA on the tiny Llama, with the Trainer's gradient checkpointing on."""
    import peft
    from transformers import DataCollatorForLanguageModeling, Trainer

    lora = peft.get_peft_model(
        model(), peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    args = arguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    return Trainer(model=lora, args=args, train_dataset=dataset(), data_collator=collator)


def not_a_trainer():
    return model()


def raises():
    raise RuntimeError("the dataset is not there")


def trained():
    trainer = language_modeling()
    trainer.args.max_steps = 1
    trainer.train()
    return trainer
