"""Where a configuration's numerics part from eager's: the first module whose output or gradient departs.

When the numerics guard finds a configuration's loss off eager's (autocompile.engine.scoring), the
failure names no place. `locate` reruns the configuration in a trial process of its own that
compares it with eager module by module (002_86f4e0ea9600b3b4.txt: "compare the compiled and eager
model layer by layer"): one training step from fresh weights on the replay's batch, with the
replay's seed and dropout handling (autocompile.trial.worker._replay), hooks on the repeated blocks,
the workload's parts and the model's top-level children recording each one's output (forward) and
the gradient of that output (backward). The first module, in the order eager ran them, whose
output departs beyond the guard's tolerance is `diverges_at`; if no output does, the first whose
gradient does, in the order the backward pass reached them.

`repro --accuracy` then compiles that module alone (the worker's `accuracy_module`) on the inputs
`Inputs` caught it getting in an eager forward pass, under the minifier's accuracy mode.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Callable

from autocompile.trial.process import TrialRequest, run_trial
from autocompile.trial.result import Status

ROOT = "(model)"  # the whole model's output: a difference made in its own forward, outside every watched module
DIVERGENCE_MEASURE = {"numerics_replay": False}


def watched_modules(model, regions: list[str], parts: tuple[str, ...]) -> dict[str, object]:
    """The modules compared, by name: each repeated block, each part, each top-level child, the model."""
    names = [f"{region}.{i}" for region in regions for i in range(len(model.get_submodule(region)))]
    names += [p for p in parts if p] + [n for n, _ in model.named_children() if n not in regions]
    found = {name: model.get_submodule(name) for name in dict.fromkeys(names)}
    found[ROOT] = model
    return found


def first_tensor(value):
    """The first floating-point tensor of a module's output (a tensor, a tuple, a dict, a ModelOutput)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    for item in items:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return item
    return None


class Recorder:
    """Forward hooks that keep each watched module's first output, and a hook on that output that
    keeps its gradient; both in the order they ran. The hooks run inside compiled code too (Dynamo
    traces them), so the configuration's side records what its compiled graphs computed."""

    def __init__(self, modules: dict[str, object]):
        self.forward: dict[str, list] = {name: [] for name in modules}
        self.backward: dict[str, list] = {name: [] for name in modules}
        self.fired: dict[str, list[str]] = {"forward": [], "backward": []}  # names, in the order their hooks ran
        for name, module in modules.items():
            module.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Callable:
        def hook(module, inputs, output):
            tensor = first_tensor(output)
            if tensor is None:
                return
            self.forward[name].append(tensor.detach().clone())
            self.fired["forward"].append(name)
            if tensor.requires_grad:
                tensor.register_hook(lambda grad: self._grad(name, grad))

        return hook

    def _grad(self, name: str, grad) -> None:
        self.backward[name].append(grad.detach().clone())
        self.fired["backward"].append(name)

    def finish(self) -> dict:
        """What was recorded, on the CPU in float32: {"forward": {name: t}, "backward": {name: t}}
        (each module's first call), and the order the hooks ran in: {"forward": [names], ...}."""
        values = {
            kind: {name: kept[0].float().cpu() for name, kept in store.items() if kept}
            for kind, store in (("forward", self.forward), ("backward", self.backward))
        }
        return values, {kind: list(dict.fromkeys(names)) for kind, names in self.fired.items()}


class Inputs:
    """A forward pre-hook that keeps the arguments of a module's first call, detached copies that
    require gradients where the originals did (so its compile makes a backward graph as in training)."""

    def __init__(self, module):
        self.args: tuple | None = None
        self.kwargs: dict = {}
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if self.args is None:
            self.args, self.kwargs = _copied(args), _copied(kwargs)

    def caught(self) -> tuple[tuple, dict]:
        self.handle.remove()
        if self.args is None:
            raise RuntimeError("the module was not called in the forward pass: no inputs to compile it on")
        return self.args, self.kwargs


def _copied(value):
    """`value` (a tensor, or a tuple, list or dict of them) with each tensor a detached copy."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_copied(item) for item in value)
    return value


def relative_error(trial, eager) -> float:
    if trial.shape != eager.shape:
        return float("inf")
    return float((trial - eager).norm() / max(float(eager.norm()), 1e-12))


def first_divergence(eager: dict, trial: dict, order: dict[str, list[str]], tolerance: float) -> dict:
    """The first module whose output departs beyond `tolerance`, else the first whose gradient
    does, with every module's relative errors; `diverges_at` None when none departs."""
    errors: dict[str, dict[str, float]] = {}
    for kind in ("forward", "backward"):
        both = [name for name in order[kind] if name in trial[kind] and name in eager[kind]]
        errors[kind] = {name: relative_error(trial[kind][name], eager[kind][name]) for name in both}
    found = None
    for kind in ("forward", "backward"):
        found = next(
            ({"module": name, "pass": kind, "rel_error": error} for name, error in errors[kind].items() if error > tolerance),
            None,
        )
        if found:
            break
    return {"diverges_at": found, "tolerance": tolerance, "errors": errors}


def describe(found: dict | None) -> str:
    """The reason's part: where the numerics part, or that no watched module departs."""
    if not found:
        return "no watched module's output or gradient departs from eager's"
    return f"diverges first at {found['module']} ({found['pass']}, relative error {found['rel_error']:.2%})"


def locate(request: TrialRequest, record: dict, tolerance: float, time_left: float | None = None, heartbeat=None) -> dict:
    """Rerun a configuration whose numerics failed, comparing it with eager module by module (in a
    trial process: see the worker's `divergence_tolerance`); the record gets `diverges_at` and the
    comparison under `divergence`, and its reason says where."""
    limit = min(request.timeout_s, time_left) if time_left is not None else request.timeout_s
    if request.config.get("padding") == "pack":
        record.setdefault("notes", []).append(
            "where the numerics part: not looked for under packing (the modules see packed rows, eager the padded batch)"
        )
        return record
    if limit < 10:
        record.setdefault("notes", []).append("where the numerics part: not looked for, no time left")
        return record
    run = run_trial(
        replace(
            request,
            timeout_s=limit,
            trial_dir=os.path.join(request.trial_dir, "divergence"),
            measure={**request.measure, **DIVERGENCE_MEASURE, "divergence_tolerance": tolerance},
        ),
        heartbeat=heartbeat,
    )
    found = run.get("divergence")
    if run["status"] != Status.OK or not found:
        record.setdefault("notes", []).append(
            f"where the numerics part: not found ({run['status']}: {run.get('reason', '')[:200]})"
        )
        return record
    record["divergence"] = {**found, "wall_s": run["wall_s"]}
    record["diverges_at"] = found["diverges_at"]
    record["reason"] += "; " + describe(found["diverges_at"])
    return record
