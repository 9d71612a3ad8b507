"""Llama workloads: the Llama 3.1 8B architecture with random weights, and a tiny sibling."""

from __future__ import annotations

import random

import torch

from autocompile.workloads import Workload, WorkloadOptions, warmup_cosine
from autocompile.workloads._batching import causal_lm_loss, count_labels, sample_length, token_batch

# Fine-tuning data: most sequences well below the maximum, a tail up to it (fractions of max).
LENGTH_BINS = [(1 / 16, 1 / 4, 0.50), (1 / 4, 1 / 2, 0.35), (1 / 2, 1.0, 0.15)]
PAD_ID = 0


def _make(name, description, config_kwargs, batch_size, seq_len, dtype_on_cuda, dtype_on_cpu, pool, gpu_only=False,
          attention="sdpa"):
    def max_len(options: WorkloadOptions) -> int:
        return options.seq_len or seq_len

    def build(options: WorkloadOptions):
        from transformers import LlamaConfig, LlamaForCausalLM

        dtype = dtype_on_cuda if options.device.startswith("cuda") else dtype_on_cpu
        config = LlamaConfig(**config_kwargs, max_position_embeddings=max(max_len(options), 2048))
        if options.blocks:  # screening: fewer decoder layers, built that way (never built full)
            config.num_hidden_layers = min(options.blocks, config.num_hidden_layers)
        config._attn_implementation = attention
        config.use_cache = False  # training: no KV cache (it would also cost recompiles)
        torch.manual_seed(options.seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(options.device):  # random weights built in place: no download, no copy
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        return model, optimizer

    def batches(options: WorkloadOptions, n: int) -> list[dict]:
        rng = random.Random(options.seed)
        longest = max_len(options)
        size = options.batch_size or batch_size
        bins = [(max(2, int(lo * longest)), max(2, int(hi * longest)), w) for lo, hi, w in LENGTH_BINS]
        out = []
        for _ in range(n):
            lengths = [sample_length(rng, bins) for _ in range(size)]
            input_ids, labels = token_batch(rng, lengths, config_kwargs["vocab_size"], PAD_ID, None)
            # Right padding under causal attention leaves real tokens untouched, and padded
            # labels are ignored, so no attention mask is needed (and SDPA keeps its fast path).
            out.append({"input_ids": input_ids.to(options.device), "labels": labels.to(options.device)})
        return out

    def forward(model, batch):
        return model(input_ids=batch["input_ids"]).logits

    def criterion(logits, batch):
        return causal_lm_loss(logits, batch["labels"])

    return Workload(
        name=name,
        description=description,
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        # What LLM training does: linear warm-up over 100 steps, cosine decay over 10000.
        schedule=warmup_cosine,
        count=count_labels,
        unit="tokens",
        varying={"input_ids": (1, PAD_ID), "labels": (1, -100)},
        max_len=max_len,
        parts=(),
        batch_pool=pool,
        gpu_only=gpu_only,
    )


def llama_8b() -> Workload:
    return _make(
        "llama-8b",
        "Llama 3.1 8B architecture, random bf16 weights, AdamW with warm-up + cosine LR, batch 2 x up to 2048 tokens (GPU)",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
        batch_size=2,
        seq_len=2048,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.bfloat16,
        pool=16,
        gpu_only=True,
    )


def tiny_llama() -> Workload:
    # Sized for the CPU quickstart (2 cores): a step is a few milliseconds of many small ops
    # (eager attention, RMSNorm, RoPE, SiLU, AdamW's per-parameter updates), which is where
    # Inductor's C++ fusion and a compiled optimizer step pay off (README: Measured on the CPU).
    return _make(
        "tiny-llama",
        "Llama architecture at toy size (2 layers, hidden 32, eager attention), AdamW with warm-up + cosine LR, "
        "batch 8 x up to 64 tokens",
        dict(
            vocab_size=256,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        ),
        batch_size=8,
        seq_len=64,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.float32,
        pool=8,
        attention="eager",
    )
