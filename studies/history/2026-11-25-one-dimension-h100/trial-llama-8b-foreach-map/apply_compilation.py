"""Compile settings found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.
"""
import torch

COMPILE_KWARGS = {}
REGIONS = ['model.layers']  # lists of repeated blocks, each compiled alone
STEP_COMPILE_KWARGS = {}  # the foreach_map optimizer step: a graph of its own

VARYING = {'input_ids': (1, 0), 'labels': (1, -100)}  # key: (dim, pad value)
PAD_MULTIPLE = 64  # the longest in the batch, rounded up


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    foreach_map_step(optimizer)  # the Adam/AdamW step as one compiled foreach_map function
    return model, optimizer


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


def _first_moment(exp_avg, grad, beta1):
    return exp_avg.lerp(grad, 1 - beta1)


def _second_moment(exp_avg_sq, grad, beta2):
    return exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)


def _first_moment_l2(exp_avg, grad, param, beta1, weight_decay):  # Adam's weight decay: added to the gradient
    return _first_moment(exp_avg, grad.add(param, alpha=weight_decay), beta1)


def _second_moment_l2(exp_avg_sq, grad, param, beta2, weight_decay):
    return _second_moment(exp_avg_sq, grad.add(param, alpha=weight_decay), beta2)


def _decayed(param, lr, weight_decay):  # AdamW's (decoupled) weight decay
    return param.mul(1 - lr * weight_decay)


def _updated(param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps):
    step_size = lr / (1 - torch.pow(beta1, step))
    bias_correction2_sqrt = (1 - torch.pow(beta2, step)).sqrt()
    return param - step_size * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps)


def _foreach_map_adam(groups):
    """One Adam/AdamW step over every parameter group, as foreach_map ops (state updated in place)."""
    foreach_map = torch._higher_order_ops.foreach_map
    for params, grads, exp_avgs, exp_avg_sqs, steps, lr, (beta1, beta2, eps, weight_decay, decoupled) in groups:
        torch._foreach_add_(steps, 1)
        if weight_decay != 0 and decoupled:
            torch._foreach_copy_(params, foreach_map(_decayed, params, lr, weight_decay))
        if weight_decay != 0 and not decoupled:
            exp_avgs_new = foreach_map(_first_moment_l2, exp_avgs, grads, params, beta1, weight_decay)
            exp_avg_sqs_new = foreach_map(_second_moment_l2, exp_avg_sqs, grads, params, beta2, weight_decay)
        else:
            exp_avgs_new = foreach_map(_first_moment, exp_avgs, grads, beta1)
            exp_avg_sqs_new = foreach_map(_second_moment, exp_avg_sqs, grads, beta2)
        params_new = foreach_map(_updated, params, exp_avgs_new, exp_avg_sqs_new, steps, lr, beta1, beta2, eps)
        # a higher-order op does not mutate its inputs: the new values are copied back in place
        torch._foreach_copy_(exp_avgs, exp_avgs_new)
        torch._foreach_copy_(exp_avg_sqs, exp_avg_sqs_new)
        torch._foreach_copy_(params, params_new)


def _adam_state(optimizer, param):
    """The parameter's Adam state under torch's names (a checkpoint loads either way), its step
    count on the parameter's device as torch's capturable and fused steps keep it."""
    state = optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    elif state["step"].device != param.device or state["step"].dtype != torch.float32:  # torch's own, on the CPU
        state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
    return state


def foreach_map_step(optimizer):
    """Replace optimizer.step with the Adam/AdamW step as one compiled function of foreach_map ops,
    fused horizontally (001 step #4). It reads the hyper-parameters from optimizer.param_groups at
    every step (an LR scheduler's values included) and keeps its state in optimizer.state."""
    import functools
    import torch._higher_order_ops  # noqa: F401  (foreach_map)

    refusal = foreach_map_refusal(optimizer)
    if refusal:
        raise ValueError(f"foreach_map_step: {refusal}")
    compiled = torch.compile(_foreach_map_adam, **STEP_COMPILE_KWARGS)
    lrs = {}  # group index -> its learning rate as a tensor on its parameters' device

    @functools.wraps(optimizer.step)
    @torch.no_grad()
    def step(closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = []
        for index, group in enumerate(optimizer.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [_adam_state(optimizer, p) for p in params]
            if index not in lrs:
                lrs[index] = torch.zeros((), dtype=torch.float32, device=params[0].device)
            lrs[index].fill_(group["lr"])
            decoupled = group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW))
            groups.append((params, [p.grad for p in params], [s["exp_avg"] for s in states],
                           [s["exp_avg_sq"] for s in states], [s["step"] for s in states], lrs[index],
                           (*group["betas"], group["eps"], group["weight_decay"], bool(decoupled))))
        compiled(groups)
        optimizer._opt_called = True  # what an LR scheduler's wrapper of the replaced step records
        return loss

    optimizer.step = step


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return loss_fn  # not compiled in this configuration


def backward(loss):
    """The backward pass (call it where you called loss.backward())."""
    loss.backward()


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    for key, (dim, pad_value) in VARYING.items():
        tensor = batch[key]
        length = tensor.shape[dim]
        target = -(-length // PAD_MULTIPLE) * PAD_MULTIPLE
        if target > length:
            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]
            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)
    return batch


def compile_cache_key():
    """What a compile cache is only valid for: the torch, triton and device that made it."""
    try:
        import triton
    except ImportError:
        triton = None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "triton": getattr(triton, "__version__", None), "device": device}


def load_compile_cache(path):
    """Load the compile cache that `autocompile export` saved at `path` (a .bin file, its key
    in path + ".json"), so the first steps reuse its compiled code instead of compiling it.
    Call it once before the first compiled step. It loads only when its key is the running
    torch, triton and device; otherwise it says why and does nothing. Returns whether it loaded.

    The file holds code that torch will run: load only a cache from your own export.
    """
    import json

    with open(path + ".json") as f:
        made_with = json.load(f)["key"]
    running = compile_cache_key()
    if made_with != running:
        print(f"load_compile_cache: not loaded: {path} was made with {made_with}, this is {running}")
        return False
    with open(path, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
    return True