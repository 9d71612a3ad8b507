"""A trial process started ahead: it imports torch while the trial before it runs.

Every trial is a fresh process, and its first seconds go on imports that teach nothing: torch,
Dynamo and Inductor, transformers (2.4-4.1 s of `import_torch` and most of the 3.3-5.3 s of
`prepare` in every llama-8b trial; 6.4 s on 2 CPU cores: docs/decisions.md). With `prestart`,
the process of the next trial is started as soon as a trial is launched: it imports those modules
and waits, on its stdin, for the trial it will run. What it cannot do before it knows the trial
stays for then: its Inductor, Triton and trace folders are the trial's, so they are set from the
trial's environment once it is handed over (they are read when first used, after the imports), and
the GPU, the compile workers and the model are started by the trial itself, as in a fresh process.

Only a process started with the very environment the trial would get (but for those folders) is
used; any other is stopped and the trial starts a fresh one. A process waits for one trial only.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import runpy
import signal
import subprocess
import sys
import threading

from autocompile.trial.protocol import STACK_SIGNAL

# The environment a trial's process gets of its own, read by torch after the imports (when first
# used): handed over with the trial, the rest must be the prestarted process's own.
PER_TRIAL = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_TRACE")
PRELOAD = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.async_compile", "transformers")

_lock = threading.Lock()
_waiting: dict[tuple, subprocess.Popen] = {}  # (python, cwd, environment) -> the process waiting for a trial


def _key(env: dict) -> tuple:
    return sys.executable, os.getcwd(), tuple(sorted((k, v) for k, v in env.items() if k not in PER_TRIAL))


def start(env: dict, preexec_fn=None) -> None:
    """Start a process for the next trial of this environment, unless one waits already."""
    key = _key(env)
    with _lock:
        if key in _waiting and _waiting[key].poll() is None:
            return
        base = {k: v for k, v in env.items() if k not in PER_TRIAL}
        _waiting[key] = subprocess.Popen(
            [sys.executable, "-m", "autocompile.trial.prestart"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=base,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )  # noqa: PLW1509 - die_with_parent: one prctl, as for every trial


def take(env: dict) -> subprocess.Popen | None:
    """The process started ahead for this environment, still waiting; None if there is none."""
    with _lock:
        process = _waiting.pop(_key(env), None)
    if process is not None and process.poll() is not None:
        return None
    return process


def hand_over(process: subprocess.Popen, spec_path: str, env: dict, log_path: str) -> bool:
    """Give the waiting `process` its trial; False if it died meanwhile (start a fresh one then)."""
    order = {"spec": spec_path, "env": env, "log": log_path}
    try:
        process.stdin.write((json.dumps(order) + "\n").encode())
        process.stdin.close()
        return True
    except (BrokenPipeError, OSError):
        _kill(process)
        return False


def stop_all() -> None:
    """Stop every process still waiting (at the end of a search: no trial will come)."""
    with _lock:
        waiting = list(_waiting.values())
        _waiting.clear()
    for process in waiting:
        _kill(process)


atexit.register(stop_all)


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _preload() -> None:
    for name in PRELOAD:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S110 - not installed, or broken: the trial meets it as a fresh process would
            pass


def _adopt(order: dict) -> None:
    """Become the trial's process: its environment, its log as stdout and stderr, and torch's
    logging and Inductor's folders read again from that environment."""
    os.environ.clear()
    os.environ.update(order["env"])
    fd = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if "torch" in sys.modules:
        from torch._logging._internal import _init_logs  # TORCH_TRACE and TORCH_LOGS are read at import

        _init_logs()
        try:
            from torch._inductor.utils import clear_caches  # anything that remembered a folder

            clear_caches()
        except (ImportError, AttributeError):  # an older torch: nothing compiled yet to remember one
            return


def main() -> int:
    faulthandler.register(STACK_SIGNAL, all_threads=True)  # to fd 2: the trial's log once handed over
    _preload()
    line = sys.stdin.readline()
    if not line:  # the search ended without a trial for it
        return 0
    order = json.loads(line)
    _adopt(order)
    # From here on, what `python -m autocompile.trial.worker SPEC` is (it ends the process itself)
    sys.argv = ["autocompile.trial.worker", order["spec"]]
    runpy.run_module("autocompile.trial.worker", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    os._exit(main())
