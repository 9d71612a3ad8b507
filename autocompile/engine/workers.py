"""Several workers on one study: `search --gpus N` (a worker process per GPU of this host) and `autocompile worker` (joining).

The search creates the study and its budget (autocompile.engine.storage), starts one `autocompile worker`
process per GPU (each sees only its GPU through CUDA_VISIBLE_DEVICES; on the CPU, N workers for
testing), relays their lines prefixed by worker, waits for the last, then runs the finalist round once,
its finalists split over the same GPUs, all at once, and writes the same table and winner as a single
search. A worker on another host joins with `autocompile worker --study NAME --storage URL` and works
until the study's budget is spent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import optuna

from autocompile.errors import UserError
from autocompile.engine.records import Record, Role
from autocompile.engine.storage import load_study
from autocompile.trial import die_with_parent

WAIT_FOR_OTHERS_S = 5.0  # how often the search looks whether other hosts' workers are done


def parse_gpus(text: str, environ=None) -> list[str]:
    """--gpus: a count ("4": the first 4 GPUs this process was given), "all" (every one of them) or a comma
    list of their indices ("0,2", "3,"), counted within CUDA_VISIBLE_DEVICES where it is set (`given`)."""
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if str(text).strip() == "all":
        count = len(given(environ))
        if not count:
            raise UserError("--gpus all: this process was given no GPU (CUDA_VISIBLE_DEVICES, or none found)")
        return [str(i) for i in range(count)]
    if "," not in str(text) and len(items) == 1 and items[0].isdigit() and int(items[0]) >= 1:
        return [str(i) for i in range(int(items[0]))]
    if items and all(item.isdigit() for item in items) and len(set(items)) == len(items):
        return items
    raise UserError(f"--gpus takes a count (e.g. 4), all, or a comma list of GPU indices (e.g. 0,2), not {text!r}")


def given(environ=None) -> list[str]:
    """The GPUs this process was given, as the names its workers' CUDA_VISIBLE_DEVICES must use: the entries of
    its own CUDA_VISIBLE_DEVICES (indices or UUIDs, as a scheduler's allocation or a shared host sets them),
    else every GPU torch sees, by index."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = []
        for name in (v.strip() for v in visible.split(",")):
            if not name or name.startswith("-"):  # CUDA reads no further than an empty or negative entry
                break
            names.append(name)
        return names
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def assign(gpus: list[str], environ=None) -> list[str]:
    """--gpus' indices (within the GPUs this process was given) as the GPUs' own names: a worker's
    CUDA_VISIBLE_DEVICES then holds exactly its own, the job's third GPU where it was given 4,5,6."""
    environ = os.environ if environ is None else environ
    if environ.get("CUDA_VISIBLE_DEVICES") is None:
        return gpus  # every GPU of the host is this process's: indices name them
    names = given(environ)
    for index in gpus:
        if int(index) >= len(names):
            raise UserError(
                f"--gpus {','.join(gpus)}: this process was given {len(names)} GPU"
                f"{'s' if len(names) != 1 else ''} (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']})"
            )
    return [names[int(index)] for index in gpus]


def _worker_command(study: str, url: str, directory: str, verbosity: int, timeout_s: float | None) -> list[str]:
    flags = {0: ["-q"], 2: ["-v"]}.get(verbosity, [])
    return [
        sys.executable,
        "-m",
        "autocompile",
        *flags,
        "worker",
        "--study",
        study,
        "--storage",
        url,
        "--dir",
        directory,
        "--gpus",
        "1",
    ] + (["--timeout", str(timeout_s)] if timeout_s else [])


def _worker_env(gpu: str, device: str) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", AUTOCOMPILE_WORKER=gpu)  # its trials record it (storage.this_worker)
    if device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = gpu
    paths = [p for p in sys.path if p] + env.get("PYTHONPATH", "").split(os.pathsep)  # the same imports as here
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    return env


def _relay(process: subprocess.Popen, label: str, stream) -> None:
    for line in process.stdout:
        stream.write(f"[{label}] {line}")
        stream.flush()


def run_workers(
    study: str,
    url: str,
    directory: str,
    gpus: list[str],
    device: str,
    verbosity: int = 1,
    timeout_s: float | None = None,
    stream=None,
) -> list[int]:
    """Start a worker per GPU (they die with this process), relay their lines, wait; their exit codes.
    Ctrl-C is passed on, once (the workers have sessions of their own): each stops its trial and keeps what finished."""
    stream = stream or sys.stderr
    labels = [f"gpu {gpu}" if device.startswith("cuda") else f"worker {gpu}" for gpu in gpus]
    processes = [
        subprocess.Popen(
            _worker_command(study, url, directory, verbosity, timeout_s),
            env=_worker_env(gpu, device),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        for gpu in gpus
    ]
    relays = [threading.Thread(target=_relay, args=(p, label, stream), daemon=True) for p, label in zip(processes, labels)]
    for relay in relays:
        relay.start()
    try:
        codes = [p.wait() for p in processes]
    except KeyboardInterrupt:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in processes:
            p.wait()
        raise
    for relay in relays:
        relay.join(timeout=5)
    for label, code in zip(labels, codes):
        if code not in (0, 1):
            stream.write(f"[{label}] worker ended with exit status {code}\n")
    return codes


def _wait_for_others(runner) -> None:
    """Trials still running on other hosts' workers: the finalist round waits for them (failing stale ones)."""
    from autocompile.engine.storage import fail_stale

    running = (optuna.trial.TrialState.RUNNING,)
    while True:
        fail_stale(runner.study)
        trials = runner.study.get_trials(deepcopy=False, states=running)
        others = [t for t in trials if Record.of(t).role != Role.FINALIST]
        if not others:
            return
        runner.progress.line(f"waiting for {len(others)} trials of other workers: {', '.join(str(t.number) for t in others)}")
        time.sleep(WAIT_FOR_OTHERS_S)


def search_on_workers(settings, gpus: list[str], verbosity: int = 1, progress=None, callbacks=()):
    """`search --gpus N`: the study and its budget made here, the trials run by a worker per GPU,
    the finalist round run here once the last worker stops, its finalists split over the workers' GPUs
    (engine/finalists/lanes.py); the runner, as search_study returns it."""
    from autocompile.engine.study import conclude, open_search, plan

    runner = open_search(settings, progress, callbacks, workers=len(gpus))  # callbacks: the finalist round's
    if len(gpus) > 1 and not runner.url.startswith(("journal", "postgresql", "mysql")):
        runner.progress.line(
            f"note: {runner.url} is shared by {len(gpus)} workers; Optuna recommends its journal "
            "file (or a PostgreSQL server) for several processes"
        )
    plan(runner, settings.trials, settings.timeout_s, len(gpus))
    first = len(runner.study.get_trials(deepcopy=False))
    runner.progress.line(f"{len(gpus)} workers share study {settings.study!r}: {settings.trials} trials")
    codes = run_workers(settings.study, runner.url, settings.directory, gpus, settings.device, verbosity)
    if 130 in codes:
        raise KeyboardInterrupt
    _wait_for_others(runner)
    runner.trials_wall = sum(Record.of(t).wall_s or 0 for t in runner.study.get_trials(deepcopy=False)[first:])
    return conclude(runner, gpus)  # each of the round's trials is given its GPU (TrialRequest.gpus)


def join(study_name: str, url: str, directory: str, progress=None, timeout_s: float | None = None, callbacks=()) -> int:
    """`autocompile worker`: run trials of a study made by `autocompile search` until its budget or
    deadline (or this worker's `timeout_s`) is spent; returns how many trials the study counts."""
    from autocompile.engine.claims import work
    from autocompile.engine.storage import counted
    from autocompile.engine.settings import SearchSettings
    from autocompile.engine.study import open_search

    study = load_study(study_name, url)
    stored, budget = study.user_attrs.get("search_settings"), study.user_attrs.get("budget")
    if not stored or not budget:
        raise UserError(
            f"study {study_name!r} in {url} was not started by `autocompile search` "
            "(it has no budget to work through): start it with `autocompile search` first"
        )
    settings = SearchSettings(**{**stored, "storage": url, "directory": directory})
    runner = open_search(settings, progress, callbacks, seed_offset=os.getpid())  # workers' samplers differ
    deadlines = [d for d in (budget.get("deadline"), timeout_s and time.time() + timeout_s) if d]
    runner.deadline = min(deadlines) if deadlines else None
    runner.progress.total = budget["trials"]
    work(runner, budget, study_wide=True)
    return counted(runner.study)
