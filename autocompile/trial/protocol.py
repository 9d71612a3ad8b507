"""What the parent and the trial process agree on: the signal that asks for stacks, the
numerics replay's steps, seed and version (a record judged by an older replay is judged again),
and where each rank of a group writes its result."""

import ctypes
import os
import signal
import sys

STACK_SIGNAL = signal.SIGUSR1  # the trial process dumps every thread's stack to its log (worker.main)
# What stopping a trial at its time limit takes past it: asking for its stacks (STACKS_WAIT_S at
# most; trial.process) and waiting for its processes to end. A limit set by what is left of
# --timeout leaves it (engine.runner): a last trial given 132 s ended after 135.4 s, and the round's
# third finalist did not fit (docs/decisions.md).
STACKS_WAIT_S = 3.0
STOP_S = STACKS_WAIT_S + 1.0

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# prctl looked up here, not in the forked child: the finalist round starts trials from several threads,
# and a child that called dlopen while another thread held the loader's lock would never exec.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent() -> None:
    """preexec_fn of a trial process (and what a forked one calls): on Linux it gets SIGKILL when the
    process that started it dies."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


REPLAY_STEPS = 3  # optimizer steps compared in the numerics replay
REPLAY_SEED = 1234  # the random stream both sides of each replay step start from
# 1: one seed for all steps (a lazy compile of the backward shifted the stream on CUDA); 2: dropout
# aligned, not switched off (a compiled GPT-2 drew its attention dropout in another fused kernel)
REPLAY_VERSION = 3
# The trial's packing check (trial/packing_check.py). 1 (no version in the record): packed against padded
# within 5% (bf16's rounding over 32 layers came to 4.2-5.5% there); 2: what each token sees, exactly. Its
# question of a found layout's labels refuses only more, never passes what 2 refused: no version of its own.
PACKING_CHECK_VERSION = 2


def rank_result_path(spec: dict, rank: int) -> str:
    """Where rank `rank` of a trial of several ranks writes its result: the trial's own result file
    for rank 0 (it speaks for the group), `result-rank{R}.json` beside it for the others."""
    return spec["result"] if rank == 0 else os.path.join(os.path.dirname(spec["result"]), f"result-rank{rank}.json")
