"""What the installed torch and the chosen device support (version-aware): `Capabilities`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autocompile.space.dimensions import _OPTION_GROUPS


@dataclass
class Capabilities:
    """What the installed torch and the chosen device support."""

    device: str
    torch_version: str
    inductor_defaults: dict[str, Any]  # searched Inductor keys present here -> installed default
    has_mark_dynamic: bool
    has_maybe_mark_dynamic: bool
    recompile_limit_key: str | None
    recompile_limit: int | None = None  # Dynamo's default: compiles of one function before it runs eager
    has_activation_memory_budget: bool = False  # torch._functorch.config.activation_memory_budget
    # torch.utils.checkpoint.create_selective_checkpoint_contexts (selective activation checkpointing)
    has_selective_checkpointing: bool = False
    compiled_autograd_api: str | None = None  # torch._dynamo.compiled_autograd's context manager: "_enable" or "enable"
    has_mark_static_address: bool = False  # torch._dynamo.mark_static_address (static_grads)
    has_foreach_map: bool = False  # torch._higher_order_ops.foreach_map (foreach_map_optimizer)
    optimize_ddp_modes: tuple = ()  # torch._dynamo.config.optimize_ddp's values here (DDP's graph splitting)
    has_fully_shard: bool = False  # FSDP2: torch.distributed.fsdp.fully_shard
    # torch._dynamo.config.capture_scalar_outputs and capture_dynamic_output_shape_ops (capture_data_dependent)
    has_data_dependent_capture: bool = False
    # torch.nn.functional.linear_cross_entropy with its chunked path (torch.nn.LinearCrossEntropyOptions)
    has_linear_cross_entropy: bool = False

    @classmethod
    def detect(cls, device: str) -> "Capabilities":
        import torch
        import torch._dynamo
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        wanted = {key: values for options, *_ in _OPTION_GROUPS for key, values in options.items()}
        present = {}
        for key in wanted:
            value = _inductor_default(inductor_config, key)
            if value is not _MISSING:
                present[key] = value
        import torch._functorch.config as functorch_config
        import torch.utils.checkpoint

        limit_key = next((k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)), None)
        return cls(
            device=device,
            torch_version=torch.__version__,
            inductor_defaults=present,
            has_mark_dynamic=hasattr(torch._dynamo, "mark_dynamic"),
            has_maybe_mark_dynamic=hasattr(torch._dynamo, "maybe_mark_dynamic"),
            recompile_limit_key=limit_key,
            recompile_limit=getattr(dynamo_config, limit_key) if limit_key else None,
            has_activation_memory_budget=hasattr(functorch_config, "activation_memory_budget"),
            has_selective_checkpointing=hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"),
            compiled_autograd_api=compiled_autograd_api_name(),
            has_mark_static_address=callable(getattr(torch._dynamo, "mark_static_address", None)),
            has_foreach_map=has_foreach_map(),
            optimize_ddp_modes=optimize_ddp_modes(),
            has_fully_shard=has_fully_shard(),
            has_data_dependent_capture=all(hasattr(dynamo_config, k) for k in DATA_DEPENDENT_CAPTURE),
            has_linear_cross_entropy=hasattr(torch.nn.functional, "linear_cross_entropy")
            and hasattr(torch.nn, "LinearCrossEntropyOptions"),
        )

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


_MISSING = object()
# Dynamo's settings that trace data-dependent scalars (Tensor.item()) and data-dependent output shapes (nonzero)
DATA_DEPENDENT_CAPTURE = ("capture_scalar_outputs", "capture_dynamic_output_shape_ops")


def optimize_ddp_modes() -> tuple:
    """The values torch._dynamo.config.optimize_ddp takes here: its named modes where torch lists
    them ("ddp_optimizer", "python_reducer", ...), else True/False where the flag exists, else ()."""
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "optimize_ddp"):
        return ()
    try:
        from torch._dynamo.utils import _ddp_optimization_mode
    except ImportError:
        return (True, False)
    return tuple(_ddp_optimization_mode)


def has_fully_shard() -> bool:
    """Whether FSDP2's fully_shard is importable from its public place (torch 2.6 and later)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def compiled_autograd_api_name() -> str | None:
    """The name of the context manager that turns Compiled Autograd on around a backward pass
    (`_enable` in torch 2.6 and later, `enable` before), or None where there is none."""
    try:
        import torch._dynamo.compiled_autograd as compiled_autograd
    except ImportError:
        return None
    return next((name for name in ("_enable", "enable") if callable(getattr(compiled_autograd, name, None))), None)


def has_foreach_map() -> bool:
    """Whether the installed torch has the foreach_map higher-order op (a prototype since 2.7):
    one function mapped over lists of tensors, which Inductor fuses horizontally."""
    try:
        import torch._higher_order_ops as higher_order_ops
    except ImportError:
        return False
    return callable(getattr(higher_order_ops, "foreach_map", None))


def _inductor_default(inductor_config, key: str):
    node = inductor_config
    for part in key.split("."):
        try:
            node = getattr(node, part)
        except AttributeError:
            return _MISSING
    return node
