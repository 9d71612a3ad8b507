"""Mixture-of-experts workloads: the Qwen3-MoE architecture at about 2B parameters with random weights, and a
tiny sibling.

A token passes through the dense parts (embeddings, attention, routers, norms, the LM head) and the
`num_experts_per_tok` experts its router picks of `num_experts`: its model FLOPs are 6 x the active parameters
(`active_parameters`), not 6 x all of them.
"""

from __future__ import annotations

import torch

from autocompile.workloads import SequenceLayout, Workload, WorkloadOptions, warmup_cosine
from autocompile.workloads._batching import causal_lm_loss, count_labels
from autocompile.workloads._llama import PAD_ID, text_batches

# Qwen3-30B-A3B's layer (hidden 2048, 32 heads of 128, 4 KV heads, experts of 768) with 32 experts, top-4, 8 layers
QWEN3_MOE_2B = dict(
    vocab_size=151936,
    hidden_size=2048,
    num_hidden_layers=8,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    moe_intermediate_size=768,
    num_experts=32,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
TINY_MOE = dict(
    vocab_size=256,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    moe_intermediate_size=16,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    tie_word_embeddings=False,
)


def moe_model(config_kwargs: dict, options: WorkloadOptions, longest: int, dtype):
    """A Qwen3MoeForCausalLM of random weights built in place on the device, in training mode, with no KV cache
    and no router logits: a fine-tune from Qwen3-MoE's released config (output_router_logits false) adds no
    load-balancing loss, and asking for the logits installs transformers' output-capturing hooks, whose
    ContextVar.get breaks each compiled block's graph (transformers 5.17)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**config_kwargs, max_position_embeddings=max(longest, 2048))
    if options.blocks:  # screening: fewer decoder layers, built that way (never built full)
        config.num_hidden_layers = min(options.blocks, config.num_hidden_layers)
    config._attn_implementation = "sdpa"
    config.use_cache = False
    config.output_router_logits = False
    torch.manual_seed(options.seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(options.device):
            model = Qwen3MoeForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.train()
    return model


def expert_parameters(model) -> int:
    """The parameters of the model's experts (the 3-D weights of each layer's experts module)."""
    return sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)


def active_parameters(model) -> int:
    """The parameters one token passes through: all the dense ones, and top-k of n of the experts' (its model
    FLOPs are 6 x this: a forward's multiply-add and a backward's two per active parameter)."""
    config = model.config
    experts = expert_parameters(model)
    dense = sum(p.numel() for p in model.parameters()) - experts
    return dense + experts * config.num_experts_per_tok // config.num_experts


def _make(name, description, config_kwargs, batch_size, seq_len, dtype_on_cuda, dtype_on_cpu, pool, gpu_only=False):
    def max_len(options: WorkloadOptions) -> int:
        return options.seq_len or seq_len

    def build(options: WorkloadOptions):
        dtype = dtype_on_cuda if options.device.startswith("cuda") else dtype_on_cpu
        model = moe_model(config_kwargs, options, max_len(options), dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        return model, optimizer

    def batches(options: WorkloadOptions, n: int) -> list[dict]:
        # Right padding under causal attention, padded labels ignored: no attention mask needed (as llama's)
        return text_batches(options, n, options.batch_size or batch_size, max_len(options), config_kwargs["vocab_size"])

    def forward(model, batch):
        return model(input_ids=batch["input_ids"], position_ids=batch.get("position_ids")).logits

    def criterion(logits, batch):
        return causal_lm_loss(logits, batch["labels"])

    return Workload(
        name=name,
        description=description,
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        schedule=warmup_cosine,
        count=count_labels,
        unit="tokens",
        varying={"input_ids": (1, PAD_ID), "labels": (1, -100)},
        max_len=max_len,
        layout=SequenceLayout(positions="position_ids"),
        flops_per_item=lambda model: 6 * active_parameters(model),
        batch_pool=pool,
        gpu_only=gpu_only,
    )


def moe_2b() -> Workload:
    return _make(
        "moe-2b",
        "Qwen3-MoE architecture at 1.98B parameters, 0.92B active (8 layers, hidden 2048, 32 experts of 768, top-4), "
        "random bf16 weights, no router aux loss (output_router_logits off, as Qwen3-MoE's config), AdamW with "
        "warm-up + cosine LR, batch 8 x up to 2048 tokens (GPU)",
        QWEN3_MOE_2B,
        batch_size=8,
        seq_len=2048,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.bfloat16,
        pool=16,
        gpu_only=True,
    )


def tiny_moe() -> Workload:
    return _make(
        "tiny-moe",
        "Qwen3-MoE architecture at toy size (2 layers, hidden 32, 4 experts of 16, top-2), no router aux loss, "
        "AdamW with warm-up + cosine LR, batch 8 x up to 64 tokens",
        TINY_MOE,
        batch_size=8,
        seq_len=64,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.float32,
        pool=8,
    )
