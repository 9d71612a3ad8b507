"""The finalist round's GPUs run at once: a sequence of runs per GPU (a lane), each trial's process in
a thread of its own, the study told from this thread.

A lane is a generator: it yields each trial it asks for, made ready (`Runner.prepare`), and is sent
that trial's record, from which it chooses its next. On one GPU its trials run here one after the
other, as in a search (`Runner.complete`). On several, each process runs in a thread (`Runner.launch`:
it touches the study only for heartbeats, which Optuna's storages take from any thread: the journal
file under a lock, an RDB through a session per thread), and this thread prepares and tells
(`Runner.finish`), so the study's writes and the outputs' callbacks (the knowledge store's and
results.db's SQLite connections belong to the thread that opened them) stay in this one.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Generator

from autocompile.trial import prestart

if TYPE_CHECKING:
    from autocompile.engine.runner import Prepared, Runner

Lane = Generator["Prepared", dict, None]


def drive(runner: Runner, lanes: list[Lane]) -> None:
    """Run every lane to its end: one here, several at once. Ctrl-C stops every running trial (its process
    killed, the trial failed as interrupted) and is raised again."""
    if len(lanes) == 1:
        prepared = _advance(lanes[0])
        while prepared is not None:
            prepared = _advance(lanes[0], runner.complete(prepared))
        return
    _at_once(runner, lanes)


def _advance(lane: Lane, record: dict | None = None) -> Prepared | None:
    """The lane's next trial, the last one's `record` sent to it; None when it is done."""
    try:
        return lane.send(record)
    except StopIteration:
        return None


def _at_once(runner: Runner, lanes: list[Lane]) -> None:
    stop = threading.Event()
    pending: dict = {}  # future -> (lane, its trial)
    with ThreadPoolExecutor(max_workers=len(lanes), thread_name_prefix="finalist-round") as pool:

        def submit(lane: Lane, prepared: Prepared | None) -> None:
            if prepared is not None:
                pending[pool.submit(runner.launch, prepared, stop)] = (lane, prepared)

        told = None
        try:
            for lane in lanes:
                submit(lane, _advance(lane))
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    lane, told = pending.pop(future)
                    submit(lane, _advance(lane, runner.finish(told, future.result())))
                    told = None
        except BaseException:
            stop.set()  # the other lanes' processes are killed within a check (run_trial's should_stop)
            wait(pending)
            for prepared in [told, *(p for _, p in pending.values())]:
                if prepared is not None:
                    runner.abandon(prepared.trial)
            raise
        finally:
            # a process started ahead by a lane's thread gets SIGKILL when that thread ends (PR_SET_PDEATHSIG
            # follows the thread that forked it): none is left for a later trial to take as it dies
            prestart.stop_all()
