"""Which optimizers the snippet's foreach_map step stands in for (torch's Adam and AdamW), and why not others.

The step (apply.py, `foreach_map_optimizer`) is written to torch's Adam/AdamW arithmetic with
amsgrad, maximize and differentiable off; any other optimizer, or those flags on, would train
differently, so the dimension is left out with the reason (and the snippet carries this very function,
to refuse such an optimizer at run time with the same words: a loop it was not searched on).
"""

from __future__ import annotations


def clip_refusal(workload, optimizer) -> str | None:
    """Why the framework's gradient clipping cannot be folded into `optimizer`'s step, or None; "" where the
    workload's step clips nothing of a framework's. Only torch's fused Adam/AdamW step divides each gradient
    by a scale of the optimizer's (`grad_scale`, as a GradScaler's unscaling sets it)."""
    import torch

    if workload.framework != "trainer":
        return ""
    if not workload.clip_norm:
        return "the Trainer clips no gradients (max_grad_norm 0)"
    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or not optimizer.defaults.get("fused"):
        return f"the optimizer is {name} without fused=True: only torch's fused Adam/AdamW step takes a gradient scale"
    return None


def foreach_map_refusal(optimizer) -> str | None:
    """Why the foreach_map Adam/AdamW step cannot stand in for `optimizer`'s own step, or None."""
    import torch

    name = type(optimizer).__name__
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"the optimizer is {name}: the foreach_map step is written for torch's Adam and AdamW"
    for group in optimizer.param_groups:
        for flag in ("amsgrad", "maximize", "differentiable"):
            if group.get(flag):
                return f"the optimizer ({name}) has {flag}=True: the foreach_map step is written for {flag}=False only"
        if any(isinstance(beta, torch.Tensor) for beta in group["betas"]):
            return f"the optimizer ({name}) has its betas as tensors: the foreach_map step takes them as numbers"
        if any(p.is_complex() for p in group["params"]):
            return f"the optimizer ({name}) has complex parameters: the foreach_map step is written for real ones"
    return None


def step_in_backward_refusal(workload, optimizer) -> str | None:
    """Why `optimizer`'s step cannot run a block at a time in the backward (the snippet's step_in_backward), or
    None: a framework's loop may read every gradient between its backward and its step (clipping, accumulation),
    and only an optimizer whose step is each parameter's own (torch's Adam, AdamW, SGD) gives the same update."""
    import torch

    if workload.framework:
        return f"a {workload.framework}'s loop may clip or accumulate the gradients between its backward and its step"
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        return f"the optimizer is {type(optimizer).__name__}: only torch's Adam, AdamW and SGD step each parameter on its own"
    return None
