"""The model's own implementation choices that the search can switch: which of torch's SDPA kernels its
attention runs."""

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
