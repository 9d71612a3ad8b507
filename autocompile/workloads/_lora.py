"""LoRA fine-tunes: seed 000's job as it runs on one card, and its CPU-size twin.

The Llama 3.1 8B architecture with random weights, peft's LoRA (r=16) on the attention and MLP
projections, Hugging Face activation checkpointing on (non-reentrant, as fine-tuning scripts turn it
on to fit a card), AdamW on the adapters alone, batches of a fine-tuning length mix given with their
attention mask, as a collate function leaves them. peft is an optional dependency
(`pip install "autocompile[lora]"`).
"""

from __future__ import annotations

import warnings

import torch

from autocompile.errors import UserError
from autocompile.workloads import SequenceLayout, Workload, WorkloadOptions, warmup_cosine
from autocompile.workloads._batching import ModelsLoss, count_labels
from autocompile.workloads._llama import LLAMA_3_1_8B, PAD_ID, TINY_LLAMA, llama_model, text_batches

# peft's LoRA on every projection of the attention and the MLP
LORA = dict(
    r=16,
    lora_alpha=32,
    lora_dropout=0.05,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError('the LoRA workloads need peft: pip install "autocompile[lora]" (or pip install peft)') from None
    return peft


def _make(name, description, config_kwargs, batch_size, seq_len, dtype_on_cuda, dtype_on_cpu, pool, gpu_only=False):
    criterion = ModelsLoss()

    def max_len(options: WorkloadOptions) -> int:
        return options.seq_len or seq_len

    def build(options: WorkloadOptions):
        peft = _peft()
        model = llama_model(config_kwargs, options, max_len(options), dtype_on_cuda, dtype_on_cpu)
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with warnings.catch_warnings():  # peft reads the flag under its deprecated name
            warnings.simplefilter("ignore", FutureWarning)
            model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **LORA))
        model.train()
        criterion.of(model)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
        return model, optimizer

    def batches(options: WorkloadOptions, n: int) -> list[dict]:
        out = text_batches(options, n, options.batch_size or batch_size, max_len(options), config_kwargs["vocab_size"])
        for batch in out:  # the padding mask a collate function gives: 1 on real tokens
            batch["attention_mask"] = (batch["labels"] != -100).long()
        return out

    def forward(model, batch):
        return model(
            input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), position_ids=batch.get("position_ids")
        ).logits

    return Workload(
        name=name,
        description=description,
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        own_loss=True,  # nothing but the model's loss_function reads its logits
        schedule=warmup_cosine,
        count=count_labels,
        unit="tokens",
        varying={"input_ids": (1, PAD_ID), "labels": (1, -100), "attention_mask": (1, 0)},
        max_len=max_len,
        batch_pool=pool,
        gpu_only=gpu_only,
        layout=SequenceLayout(positions="position_ids", mask="attention_mask"),
    )


def lora_8b() -> Workload:
    return _make(
        "lora-8b",
        "LoRA r=16 fine-tune of the Llama 3.1 8B architecture (peft), random bf16 weights, Hugging Face activation "
        "checkpointing on, AdamW on the adapters, batch 4 x up to 2048 tokens with their attention mask (GPU)",
        LLAMA_3_1_8B,
        batch_size=4,
        seq_len=2048,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.bfloat16,
        pool=8,
        gpu_only=True,
    )


def tiny_lora() -> Workload:
    return _make(
        "tiny-lora",
        "LoRA r=16 fine-tune of the Llama architecture at toy size (peft), Hugging Face activation checkpointing on, "
        "AdamW on the adapters, batch 4 x up to 64 tokens with their attention mask",
        TINY_LLAMA,
        batch_size=4,
        seq_len=64,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.float32,
        pool=8,
    )
