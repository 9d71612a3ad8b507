"""Whether a workload's variable-length batches can be packed, and whether its model's attention can be
switched to FlexAttention, or to torch's varlen_attn, under packing.

Packed, a batch's sequences share rows (first fit, longest first), each sequence whole in one row, so
no padding is computed but the rows' tail; each sequence must attend only to itself, which the model
learns from the position ids (a causal decoder of Hugging Face's) or a block-diagonal mask (an
encoder). What the workload declares for it, or what is found from its model where it declares nothing, is
its `SequenceLayout` (workloads/layout.py); the snippet's `pack` does it.
"""

from __future__ import annotations


def refusal(workload, layout=None, why: str = "") -> str | None:
    """Why the workload's batches cannot be packed, or None. `layout`: its layout, declared or found from its
    model (workloads/layout.py: `resolve`), and `why` there is none where there is none; the declared one
    where not given."""
    layout = layout or workload.layout
    if not workload.varying:
        return "the workload has no varying dimension"
    if layout is None:
        return (
            "the workload declares no SequenceLayout (Workload.layout): which key its forward passes as "
            "position ids, and its mask, so that packed sequences attend only to themselves"
            + (f"; none found from its model: {why}" if why else "")
        )
    if layout.packed:
        return "the job packs its batches itself (TRL's packing or padding_free, a flattening collator): not packed twice"
    if layout.positions is None:
        return (
            "the workload's forward passes no position ids (SequenceLayout.positions is None): packed "
            "sequences would attend to each other"
        )
    along = {key: dim for key, (dim, _) in workload.varying.items() if dim != 1}
    if along:
        return f"packing joins sequences along dimension 1, and {', '.join(f'{k} varies along {d}' for k, d in along.items())}"
    if not layout.causal and layout.mask is None:
        return "an encoder's packed sequences need a block-diagonal mask, and its SequenceLayout names no mask key"
    if layout.mask is not None and layout.mask not in workload.varying:
        return f"the mask key {layout.mask!r} is not one of the varying keys, so it is not packed with them"
    return None


def flex_switchable(model) -> bool:
    """Whether the model is a Hugging Face model (itself, or inside a wrapper) that can switch its attention
    to FlexAttention (`set_attn_implementation("flex_attention")`), with torch's FlexAttention here."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return _hugging_face_flag(model, "_supports_flex_attn")


def varlen_switchable(model) -> bool:
    """Whether the model is a Hugging Face model (itself, or inside a wrapper) that takes an attention function
    registered with its AttentionInterface (`_supports_attention_backend`), with torch's varlen_attn here."""
    try:
        import torch.nn.attention.varlen  # noqa: F401
    except ImportError:
        return False
    return _hugging_face_flag(model, "_supports_attention_backend")


def _hugging_face_flag(model, flag: str) -> bool:
    """The flag on the outermost Hugging Face model in `model` (False where there is none)."""
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            return bool(getattr(module, flag, False))
    return False
