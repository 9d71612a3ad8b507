"""Mixture-of-experts workloads: the Qwen3-MoE architecture at about 2B parameters with random weights, and a
tiny sibling.

A token passes through the dense parts (embeddings, attention, routers, norms, the LM head) and the
`num_experts_per_tok` experts its router picks of `num_experts`: its model FLOPs are 6 x the active parameters
(`active_parameters`), not 6 x all of them.
"""

from __future__ import annotations

import torch

from autocompile.workloads import Workload, WorkloadOptions
from autocompile.workloads._llama import built_in_place, decoder_workload

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
    config.output_router_logits = False
    return built_in_place(Qwen3MoeForCausalLM, config, options, dtype)


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
    def build_model(options: WorkloadOptions, longest: int):
        dtype = dtype_on_cuda if options.device.startswith("cuda") else dtype_on_cpu
        return moe_model(config_kwargs, options, longest, dtype)

    def flops_per_item(model) -> int:
        return 6 * active_parameters(model)

    return decoder_workload(
        name, description, build_model, config_kwargs["vocab_size"], batch_size, seq_len, pool, flops_per_item, gpu_only
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
