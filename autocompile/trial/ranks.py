"""A trial of several ranks: `python -m autocompile.trial.ranks SPEC.json` starts N workers with torch's launcher.

The ranks are started by `torch.multiprocessing.start_processes` (spawn), not torch.distributed.run:
elastic puts each rank in a session of its own, where the trial's kill of its process group
(autocompile.trial.process) would not reach them. Spawned here, every rank stays in this
launcher's session and process group, so a time limit or a dead search kills the whole group at
once; each rank also dies with this launcher (PR_SET_PDEATHSIG).

Each rank runs the usual worker (`autocompile.trial.worker.main`) with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free port) set. Rank 0 writes the trial's result and
events; the others write `result-rank{R}.json` and report their warm-up, items and peak memory
to rank 0 through an all_gather (worker._gather_ranks). A rank whose result is not "ok" exits
non-zero: torch's launcher then ends the others, and the launcher writes the group's result from
the first rank that failed (its status, "rank R: " before its reason).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from autocompile.trial.protocol import rank_result_path
from autocompile.trial.result import Status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(local_rank: int, spec_path: str, nproc: int, port: int) -> None:
    """One rank (a spawned process): the worker with the launcher's environment; exits 1 unless "ok"."""
    import faulthandler

    from autocompile.trial.protocol import die_with_parent
    from autocompile.trial.protocol import STACK_SIGNAL

    die_with_parent()
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nproc),
        LOCAL_WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    from autocompile.trial import worker

    worker.main([spec_path])
    with open(spec_path) as f:
        spec = json.load(f)
    os._exit(0 if (_read(rank_result_path(spec, local_rank)) or {}).get("status") == Status.OK else 1)


def launch(spec_path: str) -> int:
    """Start the ranks and wait; the group's result is rank 0's, or the first failed rank's."""
    import torch.multiprocessing as mp

    with open(spec_path) as f:
        spec = json.load(f)
    nproc = int(spec["nproc"])
    context = mp.start_processes(_rank, args=(spec_path, nproc, free_port()), nprocs=nproc, join=False, start_method="spawn")
    failed: tuple | None = None
    try:
        while not context.join():
            pass
    except mp.ProcessExitedException as exc:  # a rank exited non-zero or died; join ended the others
        failed = (exc.error_index, exc.exit_code, "")
    except mp.ProcessRaisedException as exc:  # raised outside the worker's own handling (an import, the launch)
        print(str(exc), file=sys.stderr, flush=True)  # the rank's traceback, into the trial's log
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        failed = (exc.error_index, 1, lines[-1] if lines else "")
    if failed is not None:
        first = _first_failure(spec, [process.exitcode for process in context.processes], failed[0])
        if first != failed[0]:
            failed = (first, context.processes[first].exitcode, "")
        _group_failure(spec, nproc, *failed)
    return 0


def _first_failure(spec: dict, codes: list, seen: int) -> int:
    """The rank whose failure ended the group. torch's launcher names the first failed rank it
    finds among those that had exited when it woke: under load that may be a rank that failed only
    after, in a collective whose peer had gone (rank 1 ran out of memory, rank 0's all_reduce then
    lost its peer, and the trial read `failed` from rank 0). Among the ranks that ended on their own
    (not stopped by the launcher's SIGTERM), one that ended without a failure record (killed by a
    signal, or raising outside the worker) comes first: a peer left behind raises in the worker, and
    writes one. Then the record written earliest."""
    import signal

    ended = [r for r, code in enumerate(codes) if code not in (None, 0, -signal.SIGTERM)]
    if seen not in ended:
        ended.append(seen)
    failed = {r: _read(rank_result_path(spec, r)) for r in ended}
    failed = {r: record for r, record in failed.items() if record and record.get("status") not in (None, Status.OK)}
    died = [r for r in ended if r not in failed]
    if died:
        return seen if seen in died else died[0]
    written = {}
    for r in failed:
        try:
            written[r] = os.stat(rank_result_path(spec, r)).st_mtime_ns
        except OSError:
            pass
    return min(written, key=lambda r: (written[r], r)) if written else seen


def _group_failure(spec: dict, nproc: int, first: int, code: int | None, raised: str = "") -> None:
    """The trial's result when a rank failed: the first failing rank's own record where it wrote one
    (its status: oom, compile_error, failed), else a crash with how it ended."""
    import signal

    # The first rank torch's launcher saw fail is the cause; the others may have failed after it, in a
    # collective whose peer was gone.
    record = _read(rank_result_path(spec, first))
    if not record or record.get("status") in (None, Status.OK):
        if code is not None and code < 0:
            how = f"died with {signal.Signals(-code).name}" + (
                " (the kernel's out-of-memory killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            )
        else:
            how = f"exited with status {code} before writing a result"
        record = {"status": Status.CRASHED, "reason": raised or f"the trial process {how}", "notes": []}
    record["reason"] = f"rank {first} of {nproc}: {record.get('reason', '')}"
    record["failed_rank"] = first
    tmp = spec["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, default=str)
    os.replace(tmp, spec["result"])


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    import faulthandler

    from autocompile.trial.protocol import STACK_SIGNAL

    # The parent asks the whole group for stacks at a time limit: the launcher's is written too.
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    os._exit(launch(sys.argv[1]))
