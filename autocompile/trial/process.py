"""Running one trial in its own process, with cold compile caches and a time limit.

The parent side of a trial: it writes the trial's spec, starts `autocompile.trial.worker` in a new
process session with empty Inductor and Triton cache folders, follows its progress, kills
it at the time limit, and always returns a record: the worker's own measurement, or a
failure record saying how and in which phase the process ended.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from autocompile.trial import caches, graphs, prestart
from autocompile.trial.protocol import STACK_SIGNAL, STACKS_WAIT_S, die_with_parent
from autocompile.trial.result import STOPPED, Result, Status


def default_toolchain_dir() -> str:
    """Where facts about the machine (the CPU's vector ISA, probed by Inductor) are cached for
    every trial: $AUTOCOMPILE_TOOLCHAIN_CACHE, else ~/.cache/autocompile/toolchain."""
    return os.environ.get("AUTOCOMPILE_TOOLCHAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autocompile", "toolchain"
    )


@dataclass
class TrialRequest:
    model: str
    config: dict
    device: str
    trial_dir: str
    batch_size: int | None = None
    seq_len: int | None = None
    seed: int = 0
    timeout_s: float = 900.0
    toolchain_dir: str = field(default_factory=default_toolchain_dir)  # see caches.warm_cpu_toolchain
    header: str = ""
    measure: dict = field(default_factory=dict)  # overrides of the worker's measurement knobs
    trace: bool = False  # write a TORCH_TRACE to trial_dir/trace, for the dashboard's tlparse report
    blocks: int | None = None  # screening: the model's repeated blocks cut to this many
    cache_dir: str | None = None  # compile caches it starts from (screens', a finalist's first run's), kept after it
    keep_cache: bool = False  # keep its own caches after a clean run (`caches`: its finalist rerun starts from them)
    ledger: bool = False  # cache_dir is a study's shared cache: its graphs go to its ledger, its warm-up is reconstructed
    env: dict = field(default_factory=dict)  # extra environment of the trial process (the minifier's, `outputs/repro.py`)
    nproc: int = 1  # ranks of the trial (autocompile.trial.ranks), under `parallel`
    parallel: str = "none"  # none | ddp | fsdp2: how the ranks share the model (autocompile.parallel)
    prestart: bool = False  # a compiled trial forked from a process that imported torch once (`prestart`)
    # an earlier trial of the study whose hard mark_dynamic Dynamo refused under the same graphs: a
    # config asking for "mark" measures "maybe" at once (run_trial; the engine decides, engine/learned.py)
    mark_refused_in: int | None = None
    gpus: str | None = None  # its process's CUDA_VISIBLE_DEVICES (a GPU of the finalist round); None: this process's


# Test-only switch (set by tests/conftest.py, never by a user's search): a folder whose Inductor FX graph
# cache every trial starting from empty caches shares. Such a trial's Inductor cache folder is its own as
# without it, but its `fxgraph` entries are that folder's: an Inductor compile of a graph another trial of
# the test session compiled is loaded, while Dynamo, AOTAutograd (its cache stays the trial's own, so the
# warm-up is not reconstructed) and the C++ kernels' builds run as in a cold trial. Tests that measure cold
# compiles or caches take it out of their environment.
TEST_GRAPH_CACHE = "AUTOCOMPILE_TEST_GRAPH_CACHE"


def _test_graph_cache(inductor_dir: str) -> None:
    shared = os.path.join(os.environ[TEST_GRAPH_CACHE], "fxgraph")
    os.makedirs(shared, exist_ok=True)
    os.makedirs(inductor_dir, exist_ok=True)
    link = os.path.join(inductor_dir, "fxgraph")
    if not os.path.lexists(link):
        os.symlink(shared, link)


def _child_env(request: TrialRequest) -> dict:
    env = dict(os.environ)
    cache = request.cache_dir or caches.own(request.trial_dir)  # a full trial's caches start empty
    if os.environ.get(TEST_GRAPH_CACHE) and request.cache_dir is None:
        _test_graph_cache(os.path.join(cache, "inductor"))
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    env["TRITON_CACHE_DIR"] = os.path.join(caches.triton_root(request.trial_dir, cache, request.ledger), "triton")
    env["PYTHONUNBUFFERED"] = "1"
    if request.gpus is not None:  # per trial, not this process's: the round's GPUs run at once (prestart keys on it)
        env["CUDA_VISIBLE_DEVICES"] = request.gpus
    if request.trace:  # torch's structured compile log, read by tlparse (outputs/dashboard.py)
        env["TORCH_TRACE"] = os.path.join(request.trial_dir, "trace")
    # The child must import what the parent imports (the package itself, a plugin on sys.path).
    paths = [p for p in sys.path if p] + env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
    env.update(request.env)
    return env


def _read_new_events(path: str, offset: int) -> tuple[list[dict], int]:
    try:
        with open(path) as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    complete = chunk[: chunk.rfind("\n") + 1]
    events = []
    for line in complete.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass
    return events, offset + len(complete)


PROCESS_FILE = "process.json"  # in a running trial's folder: its pid and its worker's


def _record_process(trial_dir: str, pid: int) -> str:
    path = os.path.join(trial_dir, PROCESS_FILE)
    with open(path, "w") as f:
        json.dump({"pid": pid, "worker": os.getpid(), "host": socket.gethostname()}, f)
    return path


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet waited for by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def _is_trial_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            line = f.read()
            entries = (b"autocompile.trial.worker", b"autocompile.trial.ranks", b"autocompile.trial.prestart")
            return any(entry in line for entry in entries)
    except OSError:
        return sys.platform != "linux" and pid_alive(pid)


def reap_orphans(study_dir: str) -> list[int]:
    """Kill the trial processes recorded in `study_dir` whose worker on this host is dead (with their
    process group: Inductor's compile workers too); returns their pids."""
    reaped = []
    for path in glob.glob(os.path.join(study_dir, "trials", "**", PROCESS_FILE), recursive=True):
        try:
            with open(path) as f:
                entry = json.load(f)
        except (OSError, ValueError):
            continue
        if entry.get("host") != socket.gethostname() or pid_alive(entry["worker"]):
            continue
        if _is_trial_process(entry["pid"]):
            try:
                os.killpg(entry["pid"], signal.SIGKILL)
                reaped.append(entry["pid"])
            except (ProcessLookupError, PermissionError):
                pass
        os.remove(path)
    return reaped


def _ask_for_stacks(process: subprocess.Popen, log_path: str, wait_s: float = STACKS_WAIT_S, group: bool = False) -> None:
    """Ask a trial at its time limit for every thread's stack (written to its log by faulthandler,
    registered by the worker; every rank's, for a `group` of ranks) and wait until the log stops
    growing, `wait_s` at most."""
    try:
        before = size = os.path.getsize(log_path)
        (os.killpg if group else os.kill)(process.pid, STACK_SIGNAL)
    except (OSError, ProcessLookupError):
        return
    end = time.time() + wait_s
    while time.time() < end and process.poll() is None:
        time.sleep(0.2)
        now = os.path.getsize(log_path)
        if before < now == size:  # written, and nothing more since the last look
            return
        size = now


# The compile stack's stages: a frame in one names where a deep compile was (the innermost frames
# of a trace are fake tensors and decompositions, the same in every stage).
_STAGES = (
    "torch/_inductor/",
    "torch/_functorch/_aot_autograd/",
    "torch/_dynamo/compiled_autograd.py",
    "torch/_dynamo/symbolic_convert.py",
    "torch/_dynamo/convert_frame.py",
)
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def stuck_in(log_path: str) -> tuple[str | None, list[str]]:
    """Where a trial stopped at its time limit was, from the stacks it wrote to its log (see
    _ask_for_stacks): the innermost frame of its main thread inside torch (else its innermost
    frame) as `torch/_inductor/x.py:12 in fn`, and the main thread's frames, innermost first.
    (None, []) when the log holds no stack (a trial stopped before the worker could write one)."""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, []
    threads, current, frames = [], [], None
    for line in lines:
        if _THREAD.match(line):
            frames = []
            threads.append(frames)
            if line.startswith("Current thread"):
                current.append(frames)
        elif frames is not None and (m := _FRAME.match(line)):
            path = m.group(1).split("site-packages/")[-1]
            frames.append(f"{path}:{m.group(2)} in {m.group(3).strip()}")
        else:
            frames = None
    main = [
        t
        for t in threads
        if any(
            (f.endswith("in <module>") and "trial/worker.py" in f) or (f.endswith("in _rank") and "trial/ranks.py" in f)
            for f in t
        )
    ]
    # A deep stack (a compile) is cut at 100 frames before the worker's own: the thread that
    # took the signal, the main one, then.
    main = main or current
    if not main:
        return None, []
    stack = main[-1]  # the last dump's main thread
    where = next((f for f in stack if f.startswith(_STAGES)), None)
    where = where or next((f for f in stack if f.startswith("torch/")), stack[0] if stack else None)
    return where, stack[:40]


def _wait_group_gone(pgid: int, wait_s: float = 5.0) -> None:
    """Until every process of the killed group has exited (a trial's ranks, its compile workers):
    SIGKILL is delivered at once, but a process takes a moment to end. A zombie has ended (its
    reaping is its new parent's business), so it is not waited for."""
    end = time.time() + wait_s
    while time.time() < end and _live_members(pgid):
        time.sleep(0.05)


def _live_members(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (from /proc; elsewhere, whether the group exists)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def _measured(result_path: str) -> bool:
    """Whether the worker wrote a finished measurement (it does so before the numerics replay)."""
    try:
        with open(result_path) as f:
            return json.load(f).get("status") == Status.OK
    except (OSError, ValueError):
        return False


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (the kernel's out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
        return f"the trial process died with {name}{hint}"
    return f"the trial process exited with status {code} before writing a result"


def run_trial(
    request: TrialRequest,
    on_event: Callable[[dict], None] | None = None,
    heartbeat: Callable[[], None] | None = None,
    heartbeat_every_s: float = 20.0,
    should_stop: Callable[[list[dict]], str | None] | None = None,
    check_every_s: float = 2.0,
) -> Result:
    """Run one configuration in a fresh process; always returns a record (never raises for the trial's own failures).

    should_stop(events so far) is asked every `check_every_s` and after new events; a reason
    it returns ends the trial there with status "pruned" (the caller's pruning decision).

    A hard `mark_dynamic` that the model refuses (it specialises the dimension, e.g. by
    equating it with a dimension nobody marked: Dynamo raises ConstraintViolationError) is
    run again at once with `maybe_mark_dynamic`, within the same limit; the record's config
    is then the one measured (its snippet uses maybe_mark_dynamic) and `mark_dynamic_fallback`
    says what happened. Where an earlier trial of the study was refused so under the same graphs
    (`request.mark_refused_in`, the engine's call), the hard mark is not tried: "maybe" from the start.
    """
    kwargs = dict(
        on_event=on_event,
        heartbeat=heartbeat,
        heartbeat_every_s=heartbeat_every_s,
        should_stop=should_stop,
        check_every_s=check_every_s,
    )
    maybe = {**request.config, "mark_dynamic": "maybe"}
    if request.mark_refused_in is not None and request.config.get("mark_dynamic") == "mark":
        n = request.mark_refused_in
        record = _run_once(replace(request, config=maybe), **kwargs)
        return _fell_back(
            request,
            record,
            {"why": f"the hard mark failed in trial {n} under the same graph settings", "first_wall_s": 0.0, "learned_from": n},
            f"mark_dynamic: the hard mark failed in trial {n} of the study under the same graph settings "
            f"(engine/learned.py GRAPH_KEYS): measured with maybe_mark_dynamic at once",
        )
    record = _run_once(request, **kwargs)
    if not (
        record["status"] == Status.COMPILE_ERROR
        and "ConstraintViolation" in record.get("reason", "")
        and request.config.get("mark_dynamic") == "mark"
        and request.timeout_s - record["wall_s"] > 10
    ):
        return record
    first = record
    os.replace(first["log"], os.path.join(request.trial_dir, "log-hard-mark.txt"))
    record = _run_once(replace(request, config=maybe, timeout_s=request.timeout_s - first["wall_s"]), **kwargs)
    record["wall_s"] += first["wall_s"]
    return _fell_back(
        request,
        record,
        {"why": first["reason"], "first_wall_s": first["wall_s"]},
        f"mark_dynamic: the hard mark failed ({first['reason'][:160]}): the model specialises the "
        f"dimension; measured with maybe_mark_dynamic instead (the failed attempt took "
        f"{first['wall_s']:.0f} s)",
    )


def _fell_back(request: TrialRequest, record: dict, fallback: dict, note: str) -> dict:
    """A trial that asked for a hard mark and measured "maybe": its record says so, in its result.json too."""
    record["mark_dynamic_fallback"] = {"asked": "mark", "used": "maybe", **fallback}
    record["notes"] = record.get("notes", []) + [note]
    with open(os.path.join(request.trial_dir, "result.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    return record


def _start(request: TrialRequest, spec_path: str, log, log_path: str) -> tuple[subprocess.Popen | prestart.Forked, bool]:
    """The trial's process, and whether it was forked from one that imported torch ahead (`prestart`:
    a compiled trial of one rank; the first such trial of an environment waits for those imports).
    An eager trial is always a fresh process: a process that imported Dynamo and Inductor ahead is not
    the one an eager run has (compiled trials import them anyway), and the baseline users read stays
    as it was (docs/decisions.md: "Evidence moved out of the code")."""
    env = _child_env(request)
    alone = request.parallel == "none" and not request.env and bool(request.config.get("compile"))
    if request.prestart and alone:
        gpu = request.device.startswith("cuda")
        modules, toolchain = (prestart.PRELOAD_GPU, None) if gpu else (prestart.PRELOAD, request.toolchain_dir)
        prestart.start(env, preexec_fn=die_with_parent, modules=modules, toolchain_dir=toolchain)
    server = prestart.take(env) if alone else None
    process = server and prestart.hand_over(server, spec_path, env, log_path)
    if process is None:
        # several ranks: a launcher whose ranks share its process group (autocompile.trial.ranks)
        entry = "autocompile.trial.worker" if request.parallel == "none" else "autocompile.trial.ranks"
        process = subprocess.Popen(
            [sys.executable, "-m", entry, spec_path],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        return process, False
    return process, True


def _how_far(events: list[dict]) -> str:
    """How far a compile cut by the limit got: the compiles it had finished (the worker's events)."""
    done = max((e.get("compiled", 0) for e in events), default=0)
    return f", {done} compile{'s' if done != 1 else ''} finished by then" if done else ", no compile finished by then"


def _run_once(
    request: TrialRequest,
    on_event=None,
    heartbeat=None,
    heartbeat_every_s: float = 20.0,
    should_stop=None,
    check_every_s: float = 2.0,
) -> dict:
    os.makedirs(request.trial_dir, exist_ok=True)
    spec_path = os.path.join(request.trial_dir, "spec.json")
    events_path = os.path.join(request.trial_dir, "events.jsonl")
    result_path = os.path.join(request.trial_dir, "result.json")
    log_path = os.path.join(request.trial_dir, "log.txt")
    for stale in (events_path, result_path):
        if os.path.exists(stale):
            os.remove(stale)
    spec = {
        "model": request.model,
        "config": request.config,
        "device": request.device,
        "trial_dir": os.path.abspath(request.trial_dir),
        "batch_size": request.batch_size,
        "seq_len": request.seq_len,
        "seed": request.seed,
        "toolchain_dir": request.toolchain_dir,
        "header": request.header,
        "events": events_path,
        "result": result_path,
        "blocks": request.blocks,
        "timeout_s": request.timeout_s,  # the time limit it ran under, for the record
        "nproc": request.nproc,
        "parallel": request.parallel,
        "graph_ledger": graphs.ledger_path(request.cache_dir) if request.ledger else None,
        **request.measure,
    }
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)

    started = time.time()
    last_phase, offset, last_check = "starting", 0, started
    last_beat = started - heartbeat_every_s  # a first heartbeat at once: a trial without one is never found stale
    seen: list[dict] = []
    stop_reason = None
    with open(log_path, "w") as log:
        process, prestarted = _start(request, spec_path, log, log_path)
        pid_file = _record_process(request.trial_dir, process.pid)
        timed_out = False
        try:
            while process.poll() is None:
                time.sleep(0.25)
                events, offset = _read_new_events(events_path, offset)
                for event in events:
                    last_phase = event.get("phase", last_phase)
                    if on_event:
                        on_event(event)
                seen += events
                if should_stop and (events or time.time() - last_check >= check_every_s):
                    last_check = time.time()
                    stop_reason = should_stop(seen)
                    if stop_reason:
                        break
                if heartbeat and time.time() - last_beat >= heartbeat_every_s:
                    heartbeat()
                    last_beat = time.time()
                if time.time() - started > request.timeout_s:
                    timed_out = True
                    break
        finally:
            if timed_out and process.poll() is None:
                _ask_for_stacks(process, log_path, group=request.parallel != "none")
            running = process.poll() is None  # timed out, or the search itself is being stopped
            if running or _live_members(process.pid):  # or what outlived its leader: a rank, a compile worker
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if running:
                    process.wait()
                _wait_group_gone(process.pid)
            os.remove(pid_file)
    wall_s = time.time() - started
    events, offset = _read_new_events(events_path, offset)
    for event in events:
        last_phase = event.get("phase", last_phase)

    if stop_reason:
        record = {
            "status": Status.PRUNED,
            "reason": stop_reason,
            "failed_phase": last_phase,
            "notes": [],
            "events": [e for e in seen if e.get("phase") == "measuring" and "window" in e],
        }
    elif timed_out and _measured(result_path):
        with open(result_path) as f:
            record = json.load(f)  # measured; only the numerics replay that followed was cut
        record["replay"] = {"error": f"cut by the {request.timeout_s:.0f} s limit"}
    elif timed_out:
        where, stack = stuck_in(log_path)
        record = {
            "status": Status.TIMEOUT,
            "reason": f"no result within the {request.timeout_s:.0f} s limit (while {last_phase}"
            + (_how_far(seen + events) if last_phase == "compiling" else "")
            + (f", in {where})" if where else ")"),
            "failed_phase": last_phase,
            "notes": [],
        }
        if where:
            record.update(stuck_in=where, stack=stack)
    elif os.path.exists(result_path):
        with open(result_path) as f:
            record = json.load(f)
    else:
        record = {
            "status": Status.CRASHED,
            "reason": f"{_describe_exit(process.returncode)} (while {last_phase})",
            "failed_phase": last_phase,
            "notes": [],
        }
    if record["status"] in STOPPED:
        seen += events
        warm_start = next((e["t"] for e in seen if e.get("phase") in ("compiling", "warming up")), None)
        if warm_start and not any(e.get("phase") == "measuring" for e in seen):
            record["warmup_elapsed_s"] = started + wall_s - warm_start  # still warming up when stopped
    record["config"] = request.config
    record["wall_s"] = wall_s
    if prestarted:
        record["prestarted"] = True  # its imports ran before its clock started, during the trial before it
    record["log"] = log_path
    if request.ledger or not (request.keep_cache and record["status"] == Status.OK):
        caches.drop(request.trial_dir)  # a cache_dir it was given is kept (a shared one's trial keeps none: `caches`)
    with open(result_path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    return record


# The layers of torch.compile, lowest first, and the backend that stops after each
# (002_86f4e0ea9600b3b4.txt's ladder): the first backend that fails names the layer at fault.
TRIAGE_LADDER = (
    ("eager", "Dynamo (graph capture)"),
    ("aot_eager", "AOTAutograd (forward and backward graphs)"),
    ("aot_eager_decomp_partition", "decompositions and the partitioner"),
)
TRIAGE_MEASURE = {"min_windows": 1, "max_windows": 1, "min_window_s": 0.0, "settle_steps": 1, "numerics_replay": False}


def triage(request: TrialRequest, record: Result, time_left: float | None = None, heartbeat=None) -> Result:
    """Rerun a configuration that failed to compile down the backend ladder; name the failing layer.

    Each rung is a trial of its own (same configuration, model and batches) with `backend`
    set, measured briefly. If every rung runs, Inductor itself is at fault. The record gets
    the rungs under "triage" and the verdict in its reason.
    """
    rungs, layer = [], "Inductor (code generation)"
    budget = min(request.timeout_s, time_left) if time_left is not None else request.timeout_s
    started = time.time()
    for backend, name in TRIAGE_LADDER:
        left = budget - (time.time() - started)
        if left < 10:
            record["reason"] += "; triage stopped: no time left"
            record["triage"] = rungs
            return record
        rung = run_trial(
            replace(
                request,
                config={**request.config, "backend": backend},
                timeout_s=left,
                trial_dir=os.path.join(request.trial_dir, f"triage-{backend}"),
                measure={**request.measure, **TRIAGE_MEASURE},
            ),
            heartbeat=heartbeat,
        )
        rungs.append({"backend": backend, "status": rung["status"], "reason": rung.get("reason", ""), "wall_s": rung["wall_s"]})
        if rung["status"] == Status.TIMEOUT:
            layer = f"an undetermined layer (the {backend} rerun timed out)"
            break
        if rung["status"] != Status.OK:
            layer = name
            break
    passed = [r["backend"] for r in rungs if r["status"] == Status.OK]
    record["triage"] = rungs
    record["failing_layer"] = layer
    record["reason"] += f"; triage: fails in {layer}" + (
        f" (backends {', '.join(passed)} run)" if passed else " (backend eager fails too)"
    )
    return record
