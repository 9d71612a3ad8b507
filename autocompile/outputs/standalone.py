"""An unreduced repro that runs alone: a failed trial's snippet pasted above a plain training loop on its workload.

For a failure torch's minifier cannot take (autocompile.outputs.repro): one raised at run time,
outside the compiled graphs it wraps, as CUDA graphs' "accessing tensor output of CUDAGraphs that
has been overwritten by a subsequent run" is, inside loss.backward(): the minifier then writes no
launcher; or one raised inside a compiled graph by what earlier steps left (Inductor's non-tree
CUDA-graph AssertionError), whose launcher's graph passes alone (both seen: docs/decisions.md).
002_86f4e0ea9600b3b4.txt: minifiers are of limited reliability; where possible, build a small
self-contained repro script. `write_script` writes one: the very text of the trial's
apply_compilation.py first (as a user pastes it), then the workload built by name through
autocompile's registry as the worker built it (model, seed, batch size, device from spec.json), and
the worker's training step (autocompile.trial.worker.Training.step) in a plain loop, until the
exception or the trial's warm-up bound. `python repro.py` exits 1 with the exception when it fails,
0 with a line saying it did not.
"""

from __future__ import annotations

import json
import os

from autocompile.workloads import get_workload

SCRIPT = "repro.py"

HEADER = """\
# Unreduced repro of the trial in {folder}, written by `autocompile repro`; it failed with
#   {reason}
# while {phase}, outside the compiled graphs torch's minifier watches: there is no minified graph.
# Below: the trial's apply_compilation.py {ran} (pasted as is), then its workload ({model!r})
# in a plain training loop. Run it with `python repro.py` where autocompile (and the workload's
# module) imports: it exits 1 with the exception when the failure recurs. The trial compiled cold
# (empty caches): `TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python repro.py` does too.
"""

LOOP = """

# ---- autocompile repro: the snippet above, on the trial's workload, in a plain training loop ----
import sys
import traceback

import torch

from autocompile.workloads import WorkloadOptions, get_workload

MODEL = {model!r}
OPTIONS = WorkloadOptions(device={device!r}, batch_size={batch_size!r}, seq_len={seq_len!r}, seed={seed!r})
BLOCKS = {blocks!r}  # a screened trial's repeated blocks cut to this many (None: all of them)
POOL = {pool!r}  # distinct batches, cycled through as the trial did
STEPS = {steps!r}  # {steps_why}
TRIAL_FAILED_WITH = {reason!r}


def workload():
    built = get_workload(MODEL)
    if BLOCKS:
        from autocompile.trial.screened import screened

        built = screened(built, BLOCKS)
    return built


def train(job) -> None:
    model, optimizer = job.build(OPTIONS)
    batches = job.batches(OPTIONS, POOL)
    scheduler = job.schedule(optimizer) if job.schedule else None  # before apply_compilation, as the snippet says
    model, optimizer = apply_compilation(model, optimizer)
    if job.split_loss:  # the criterion apart from the model, compiled where the configuration says so
        criterion = compile_loss(job.criterion)
        compute_loss = lambda batch: criterion(job.forward(model, batch), batch)
    else:
        compute_loss = lambda batch: job.loss(model, batch)
    run_backward = globals().get("backward") or (lambda loss: loss.backward())
    for step in range(STEPS):
        batch = prepare_batch(dict(batches[step % POOL]))
        run_backward(compute_loss(batch))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if OPTIONS.device.startswith("cuda"):
            torch.cuda.synchronize()  # a failure shows at the step that made it, as in the trial's warm-up
        print(f"step {{step + 1}} done", flush=True)


if __name__ == "__main__":
    try:
        train(workload())
    except Exception as error:
        traceback.print_exc()
        first = f"{{type(error).__name__}}: {{(str(error).strip().splitlines() or [''])[0]}}"
        same = first.split(":")[0] == TRIAL_FAILED_WITH.split(":")[0]
        print(f"failed, {{'as the trial did' if same else 'not as the trial did (' + TRIAL_FAILED_WITH + ')'}}: "
              f"{{first}}", file=sys.stderr)
        sys.exit(1)
    print(f"did not reproduce: {{STEPS}} steps ran cleanly; the trial failed with {{TRIAL_FAILED_WITH}}")
"""


def write_script(folder: str, out: str, record: dict, snippet_path: str | None = None) -> str:
    """repro.py in `out` for the failed trial in `folder` (its spec.json and apply_compilation.py,
    or `snippet_path` where the folder was rebuilt from the study and the rerun rendered the
    snippet; its record's reason and failed_phase); its path."""
    with open(os.path.join(folder, "spec.json")) as f:
        spec = json.load(f)
    snippet_path = snippet_path or os.path.join(folder, "apply_compilation.py")
    with open(snippet_path) as f:
        snippet = f.read()
    fields = _fields(spec, record.get("reason", ""), record.get("failed_phase") or "running")
    ran = (
        "as it ran"
        if os.path.dirname(os.path.abspath(snippet_path)) == os.path.abspath(folder)
        else "as the rerun rendered it from the trial's configuration (the folder was rebuilt from the study)"
    )
    text = HEADER.format(folder=os.path.abspath(folder), ran=ran, **fields) + snippet.rstrip("\n") + "\n" + LOOP.format(**fields)
    path = os.path.join(out, SCRIPT)
    with open(path, "w") as f:
        f.write(text)
    return path


def _fields(spec: dict, reason: str, phase: str) -> dict:
    """What the loop needs from the trial's spec: the workload as the worker built it
    (autocompile.trial.worker._build), and steps enough to reach where the trial failed."""
    pool = spec.get("batch_pool") or get_workload(spec["model"]).batch_pool
    steps = spec.get("max_warmup_steps", 20 * pool)  # the worker's bound on its warm-up
    why = f"the trial's warm-up bound (it failed while {phase})"
    if phase == "measuring":  # past the warm-up: its measuring windows ran tens of steps more
        steps, why = 10 * steps, "ten times the trial's warm-up bound (it failed while measuring, after it)"
    return {
        "model": _model_name(spec["model"]),
        "device": spec["device"],
        "batch_size": spec.get("batch_size"),
        "seq_len": spec.get("seq_len"),
        "seed": spec.get("seed", 0),
        "blocks": spec.get("blocks"),
        "pool": pool,
        "steps": steps,
        "steps_why": why,
        "reason": reason,
        "phase": phase,
    }


def _model_name(name: str) -> str:
    """The --model name, a file's path made absolute (the script may run in another folder)."""
    target, _, attr = name.rpartition(":")
    if target.endswith(".py") and os.path.exists(target):
        return f"{os.path.abspath(target)}:{attr}"
    return name


def script_lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for line in f if line.strip())
