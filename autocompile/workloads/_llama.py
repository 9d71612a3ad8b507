"""Llama workloads: the Llama 3.1 8B architecture with random weights, and a tiny sibling."""

from __future__ import annotations

import random

import torch

from autocompile.workloads import SequenceLayout, Workload, WorkloadOptions, warmup_cosine
from autocompile.workloads._batching import ModelsLoss, count_labels, sample_length, token_batch

# Fine-tuning data: most sequences well below the maximum, a tail up to it (fractions of max).
LENGTH_BINS = [(1 / 16, 1 / 4, 0.50), (1 / 4, 1 / 2, 0.35), (1 / 2, 1.0, 0.15)]
PAD_ID = 0
# The Llama 3.1 8B architecture, and a toy of it for the CPU
LLAMA_3_1_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TINY_LLAMA = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
)


def llama_model(
    config_kwargs: dict, options: WorkloadOptions, longest: int, dtype_on_cuda, dtype_on_cpu, attention: str = "sdpa"
):
    """A LlamaForCausalLM of random weights built in place on the device (no download, no copy), in
    training mode, with no KV cache (it would also cost recompiles)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = dtype_on_cuda if options.device.startswith("cuda") else dtype_on_cpu
    config = LlamaConfig(**config_kwargs, max_position_embeddings=max(longest, 2048))
    return built_in_place(LlamaForCausalLM, config, options, dtype, attention)


def built_in_place(model_class, config, options: WorkloadOptions, dtype, attention: str = "sdpa"):
    """`model_class(config)` of random weights (the options' seed) built in place on the device in `dtype`, in
    training mode, with no KV cache; under screening, with the options' fewer decoder layers."""
    if options.blocks:  # screening: fewer decoder layers, built that way (never built full)
        config.num_hidden_layers = min(options.blocks, config.num_hidden_layers)
    config._attn_implementation = attention
    config.use_cache = False
    torch.manual_seed(options.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(options.device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(previous)
    model.train()
    return model


def text_batches(options: WorkloadOptions, n: int, size: int, longest: int, vocab: int, bins=LENGTH_BINS) -> list[dict]:
    """n batches of `size` texts of a fine-tuning length mix (fractions of `longest`), each padded to
    its longest: input_ids and next-token labels."""
    rng = random.Random(options.seed)
    bins = [(max(2, int(lo * longest)), max(2, int(hi * longest)), w) for lo, hi, w in bins]
    out = []
    for _ in range(n):
        lengths = [sample_length(rng, bins) for _ in range(size)]
        input_ids, labels = token_batch(rng, lengths, vocab, PAD_ID, None)
        out.append({"input_ids": input_ids.to(options.device), "labels": labels.to(options.device)})
    return out


def _make(
    name, description, config_kwargs, batch_size, seq_len, dtype_on_cuda, dtype_on_cpu, pool, gpu_only=False, attention="sdpa"
):
    def build_model(options: WorkloadOptions, longest: int):
        return llama_model(config_kwargs, options, longest, dtype_on_cuda, dtype_on_cpu, attention)

    def flops_per_item(model) -> int:  # a dense model: every parameter
        return 6 * sum(p.numel() for p in model.parameters())

    return decoder_workload(
        name, description, build_model, config_kwargs["vocab_size"], batch_size, seq_len, pool, flops_per_item, gpu_only
    )


def decoder_workload(
    name, description, build_model, vocab_size, batch_size, seq_len, pool, flops_per_item, gpu_only=False
) -> Workload:
    """A causal decoder's workload: `build_model(options, longest)` trained with AdamW under warm-up + cosine LR
    on padded batches of the fine-tuning length mix, its loss over the shifted labels."""

    criterion = ModelsLoss()

    def max_len(options: WorkloadOptions) -> int:
        return options.seq_len or seq_len

    def build(options: WorkloadOptions):
        model = criterion.of(build_model(options, max_len(options)))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        return model, optimizer

    def batches(options: WorkloadOptions, n: int) -> list[dict]:
        # Right padding under causal attention leaves real tokens untouched, and padded labels are
        # ignored, so no attention mask is needed (and SDPA keeps its fast path).
        return text_batches(options, n, options.batch_size or batch_size, max_len(options), vocab_size)

    def forward(model, batch):
        return model(input_ids=batch["input_ids"], position_ids=batch.get("position_ids")).logits

    return Workload(
        name=name,
        description=description,
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        own_loss=True,  # nothing but the model's loss_function reads its logits
        # What LLM training does: linear warm-up over 100 steps, cosine decay over 10000.
        schedule=warmup_cosine,
        count=count_labels,
        unit="tokens",
        varying={"input_ids": (1, PAD_ID), "labels": (1, -100)},
        max_len=max_len,
        parts=(),
        layout=SequenceLayout(positions="position_ids"),
        flops_per_item=flops_per_item,
        batch_pool=pool,
        gpu_only=gpu_only,
    )


def llama_8b() -> Workload:
    return _make(
        "llama-8b",
        "Llama 3.1 8B architecture, random bf16 weights, AdamW with warm-up + cosine LR, batch 2 x up to 2048 tokens (GPU)",
        LLAMA_3_1_8B,
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
        TINY_LLAMA,
        batch_size=8,
        seq_len=64,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.float32,
        pool=8,
        attention="eager",
    )
