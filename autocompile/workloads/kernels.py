"""The model's own implementation choices that the search can switch: which of torch's SDPA kernels its
attention runs, and how a mixture of experts computes its experts."""

from __future__ import annotations


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


def experts_implementations(model) -> tuple[str, tuple[str, ...]]:
    """The implementation of a Hugging Face mixture-of-experts model's experts (itself, or inside a wrapper such as
    peft's) and the others the installed transformers can switch it to (set_experts_implementation); ("", ())
    for a model without such experts."""
    for module in model.modules():
        if callable(getattr(type(module), "set_experts_implementation", None)):
            if not type(module)._can_set_experts_implementation():
                return "", ()
            from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

            current = module.config._experts_implementation
            return current, tuple(how for how in EXPERTS if how != current and (how == "eager" or how in ALL_EXPERTS_FUNCTIONS))
    return "", ()
