"""A trial's process forked from one that imported torch ahead: the imports are paid once, not per trial.

Every trial is a fresh process, and its first seconds go on imports that teach nothing: torch,
Dynamo and Inductor, transformers (2.4-4.1 s of `import_torch` and most of the 3.3-5.3 s of
`prepare` in every llama-8b trial; 6.4 s on 2 CPU cores: docs/decisions.md). With `prestart`, a
waiting process is started as soon as a compiled trial is launched: it imports those modules once
and waits, on its stdin, for trials. For each one it forks: the child becomes the trial's process
(a session of its own, so that the search kills it and its compile workers as one group), and the
waiting process tells the search the child's pid, then its exit status, on its stdout (`Forked`:
what `subprocess.Popen` gives the search of a fresh process). What the child cannot inherit stays
for then: its Inductor, Triton and trace folders are the trial's, set from the trial's environment
(they are read when first used, after the imports), and the GPU, the compile workers and the model
are started by the trial itself, as in a fresh process; the waiting process never touches the GPU.

Only a process started with the very environment the trial would get (but for those folders) is
used; a trial that finds it busy with another trial starts a fresh process.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading

from autocompile.trial.protocol import STACK_SIGNAL, die_with_parent

# The environment a trial's process gets of its own, read by torch after the imports (when first
# used): handed over with the trial, the rest must be the prestarted process's own.
PER_TRIAL = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_TRACE")
# What every compiled trial imports; with a GPU, transformers too. On the CPU a trial's peak memory is its
# process's peak RSS, which a forked child inherits: there, nothing a trial of a plain model would not import.
PRELOAD = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.async_compile")
PRELOAD_GPU = (*PRELOAD, "transformers")

# How long a trial waits for the forking process's imports, then for its fork, before it starts a fresh
# process instead (an import that hangs must not hang the search: the trial's clock is not yet watched).
READY_WAIT_S = 300.0
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"  # torch.cuda.is_available() without starting CUDA (torch's docs)
FORK_WAIT_S = 30.0

_lock = threading.Lock()
_waiting: dict[tuple, subprocess.Popen] = {}  # (python, cwd, environment) -> the process waiting for a trial
_busy: dict[tuple, subprocess.Popen] = {}  # the same, each serving a trial now (returned to _waiting after it)
_unsafe: set[tuple] = set()  # environments whose imports started CUDA: their trials start fresh processes


def _key(env: dict) -> tuple:
    return sys.executable, os.getcwd(), tuple(sorted((k, v) for k, v in env.items() if k not in PER_TRIAL))


def start(env: dict, preexec_fn=None, modules: tuple = PRELOAD, toolchain_dir: str | None = None) -> None:
    """Start a process that imports `modules` and forks the trials of this environment, unless one is there.
    With `toolchain_dir`, it also probes the CPU's vector instructions there (caches.warm_cpu_toolchain)."""
    key = _key(env)
    with _lock:
        if (key in _waiting and _waiting[key].poll() is None) or key in _busy or key in _unsafe:
            return
        base = {k: v for k, v in env.items() if k not in PER_TRIAL}
        _waiting[key] = subprocess.Popen(
            [sys.executable, "-m", "autocompile.trial.prestart", *modules, *([TOOLCHAIN, toolchain_dir] * bool(toolchain_dir))],
            bufsize=0,  # its replies read a line at a time, none ahead into a buffer select() cannot see
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=base,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )  # noqa: PLW1509 - die_with_parent: one prctl, as for every trial


def take(env: dict) -> subprocess.Popen | None:
    """The waiting process of this environment, its imports done (waited for where they are not yet),
    now busy with the caller's trial; None if there is none or it died."""
    key = _key(env)
    with _lock:
        process = _waiting.pop(key, None)
        if process is None or process.poll() is not None:
            return None
        _busy[key] = process
    if not getattr(process, "ready", False):
        said = _line(process, READY_WAIT_S)
        process.ready = said == b"ready\n"
        if not process.ready:
            if said.startswith(b"unsafe"):
                _unsafe.add(key)
                print(f"autocompile: trials start fresh processes: {said.decode().strip()}", file=sys.stderr)
            _release(key, process, alive=False)
            return None
    return process


def hand_over(process: subprocess.Popen, spec_path: str, env: dict, log_path: str) -> Forked | None:
    """Have the waiting `process` fork the trial; None if it died meanwhile (start a fresh one then)."""
    order = {"spec": spec_path, "env": env, "log": log_path}
    try:
        process.stdin.write((json.dumps(order) + "\n").encode())
        process.stdin.flush()
        pid = int(_line(process, FORK_WAIT_S))
    except (BrokenPipeError, OSError, ValueError):
        _release(_key(env), process, alive=False)
        return None
    return Forked(process, _key(env), pid)


def _line(process: subprocess.Popen, wait_s: float) -> bytes:
    """The next line the forking process says, or b"" where it says none within `wait_s`."""
    return process.stdout.readline() if select.select([process.stdout], [], [], wait_s)[0] else b""


class Forked:
    """A trial's process forked by the waiting `server`: its pid, and its exit status as the server
    relays it, read as subprocess.Popen's `poll`, `wait` and `returncode` are."""

    def __init__(self, server: subprocess.Popen, key: tuple, pid: int):
        self.server, self.key, self.pid = server, key, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.server.stdout], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._read()
        return self.returncode

    def _read(self) -> None:
        line = self.server.stdout.readline().decode()
        alive = line.startswith("exit ")
        # the server died (or was killed with the search): the trial, its child, died with it
        self.returncode = int(line.split()[1]) if alive else -signal.SIGKILL
        _release(self.key, self.server, alive)


def _release(key: tuple, process: subprocess.Popen, alive: bool) -> None:
    """After its trial: the server waits for the next one, unless it died or another waits already."""
    with _lock:
        _busy.pop(key, None)
        if alive and key not in _waiting:
            _waiting[key] = process
            return
    _kill(process)


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


TOOLCHAIN = "--toolchain"


def _preload(arguments: list[str]) -> None:
    """The imports, then, where a toolchain folder is named, the CPU's vector-instruction probe: Inductor dry-compiles
    a program per instruction set (cached in that folder) and loads each in a process of its own, a second or
    more in every trial's process; its answer, cached in memory, is inherited by each trial forked here."""
    modules, toolchain_dir = arguments, None
    if TOOLCHAIN in arguments:
        at = arguments.index(TOOLCHAIN)
        modules, toolchain_dir = arguments[:at], arguments[at + 1]
    for name in modules:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001, S110 - not installed, or broken: the trial meets it as a fresh process would
            pass
    if toolchain_dir and "torch" in sys.modules:
        from autocompile.trial.caches import warm_cpu_toolchain

        warm_cpu_toolchain(toolchain_dir, [])


def fork_safe() -> bool:
    """Whether a child forked now can still use the GPU: none of the imports started CUDA here.
    Asked of a child forked for it, as torch marks only a child in a "bad fork"."""
    torch = sys.modules.get("torch")
    if torch is None:
        return True
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


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
        from torch._logging import _internal as logs  # TORCH_TRACE and TORCH_LOGS are read at import

        logs.LOG_TRACE_HANDLER = None  # made at import, with no TORCH_TRACE: made again with the trial's
        logs._init_logs()
        try:
            from torch._inductor.utils import clear_caches  # anything that remembered a folder

            clear_caches()
        except (ImportError, AttributeError):  # an older torch: nothing compiled yet to remember one
            return


def main() -> int:
    faulthandler.register(STACK_SIGNAL, all_threads=True)  # to fd 2: each trial's log once forked
    # An import that asks torch.cuda.is_available() must not start CUDA's driver here: a child forked
    # after that cannot use the GPU ("Cannot re-initialize CUDA in forked subprocess"). Through NVML
    # it does not; the trial's own environment comes back in _adopt.
    os.environ[NVML_CHECK] = "1"
    _preload(sys.argv[1:])
    if not fork_safe():
        os.write(1, b"unsafe: the imports started CUDA in the forking process\n")
        return 0  # each trial of this environment starts a fresh process
    os.write(1, b"ready\n")
    while line := sys.stdin.readline():  # stdout (fd 1) tells the search each trial's pid and exit status
        order = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_trial(order)  # never returns
        os.write(1, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(1, f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
    return 0  # the search ended: no trial will come


def _become_trial(order: dict) -> None:
    """In the forked child: a session of its own (the search kills it with its compile workers as
    one group), SIGKILL when the server dies, then what `python -m autocompile.trial.worker SPEC` is
    (the worker ends the process itself)."""
    try:
        os.setsid()
        die_with_parent()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the server's orders; its replies' fd 1 becomes the log in _adopt
        os.close(null)
        _adopt(order)
        sys.argv = ["autocompile.trial.worker", order["spec"]]
        runpy.run_module("autocompile.trial.worker", run_name="__main__", alter_sys=True)
    finally:
        os._exit(1)  # the worker did not end the process: it raised before its own handler


if __name__ == "__main__":
    os._exit(main())
