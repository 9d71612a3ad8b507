"""The model's own implementation choices that the search can switch: which of torch's SDPA kernels its
attention runs, how a mixture of experts computes its experts, and how a causal LM computes its loss."""

from __future__ import annotations

import torch

from autocompile.workloads._batching import causal_lm


def sdpa_attention(model) -> bool:
    """Whether the model is a Hugging Face model (itself, or inside a wrapper such as peft's) whose attention is
    torch's scaled_dot_product_attention and which takes an attention function registered with its
    AttentionInterface: its SDPA kernel can then be chosen inside its forward (the snippet's sdpa_flash)."""
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
            return implementation == "sdpa" and bool(getattr(module, "_supports_attention_backend", False))
    return False


# The experts' implementations of transformers' ExpertsInterface that need no package besides torch: a loop over
# the experts a batch hits, one grouped matrix product per projection, or one batched product over each token's top-k
EXPERTS = ("eager", "grouped_mm", "batched_mm")
# batched_mm gathers a copy of each routed expert's weights per token, kept for the backward in every layer: past
# this much for the workload's largest batch (a tenth of an 80 GB card) it cannot pay off
BATCHED_MM_LIMIT_GB = 8


def experts_implementations(model, tokens: int = 0) -> tuple[str, tuple[str, ...], dict[str, str]]:
    """The implementation of a Hugging Face mixture-of-experts model's experts (itself, or inside a wrapper such as
    peft's), the others the installed transformers can switch it to (set_experts_implementation), and those left
    out with why (batched_mm where its copies of the weights for `tokens` tokens pass BATCHED_MM_LIMIT_GB);
    ("", (), {}) for a model without such experts."""
    for module in model.modules():
        if callable(getattr(type(module), "set_experts_implementation", None)):
            if not type(module)._can_set_experts_implementation():
                return "", (), {}
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            current = module.config._experts_implementation
            others = [how for how in EXPERTS if how != current and (how == "eager" or how in ALL_EXPERTS_FUNCTIONS)]
            gathered = _batched_mm_gb(model, tokens)
            refused = {}
            if "batched_mm" in others and gathered > BATCHED_MM_LIMIT_GB:
                others.remove("batched_mm")
                refused["batched_mm"] = (
                    f"copies each token's experts' weights, kept for the backward: {gathered:.0f} GB for a batch of "
                    f"{tokens} tokens, above {BATCHED_MM_LIMIT_GB} GB"
                )
            return current, tuple(others), refused
    return "", (), {}


def _batched_mm_gb(model, tokens: int) -> float:
    """What batched_mm's gathered weights hold over all layers for `tokens` tokens, in GB."""
    total = 0
    for module in model.modules():
        weights = [getattr(module, name, None) for name in ("gate_up_proj", "down_proj")]
        top_k = getattr(getattr(module, "config", None), "num_experts_per_tok", 0)
        if top_k and all(isinstance(w, torch.nn.Parameter) and w.dim() == 3 for w in weights):
            total += sum(w[0].numel() * w.element_size() for w in weights) * top_k * tokens
    return total / 1e9


# Config fields by which a Hugging Face causal LM changes its logits between its head and its loss (Gemma's
# softcapping, Cohere's and Granite's scales): the loss then needs the whole logits
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def lm_loss_refusal(model, own_loss: bool) -> str | None:
    """Why a causal LM's loss cannot be computed from its last hidden states and its head's weight (the snippet's
    linear_loss_on), or None: it must be a Hugging Face causal LM (itself, or inside a wrapper such as peft's) whose
    loss is transformers' ForCausalLMLoss over a plain linear head's logits, and the job's loss that one
    (`own_loss`: a Trainer's job whose loss is the model's loss_function, and whose compute_loss reads no logits)."""
    found = causal_lm(model)
    if found is None or not callable(getattr(found, "get_output_embeddings", None)):
        return "the model is not a Hugging Face causal LM"
    from transformers.loss.loss_utils import LOSS_MAPPING

    if found.loss_function is not LOSS_MAPPING["ForCausalLM"]:
        return "the model's loss_function is not transformers' ForCausalLMLoss"
    head = found.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return f"the model's output head is a {type(head).__name__}, not a plain torch.nn.Linear without bias"
    config = found.config
    changed = [name for name in LOGIT_TRANSFORMS if getattr(config, name, None) not in (None, 1, 1.0)]
    if changed:
        return f"the model changes its logits between its head and its loss (config.{changed[0]})"
    if not own_loss:
        return (
            "the workload's criterion takes the model's logits: only the model's own loss_function (a Trainer's job "
            "whose compute_loss is transformers' own) is given the hidden states instead"
        )
    return None
