"""How a trial is scored and judged: its score over a horizon, its numerics against eager, the
optimistic bound of a running trial, and the pruner that compares it with the best.

A trial that ran is scored by its effective speed over a run of H steps that starts cold
(`score`); one that computes something else than eager, or needs more memory than allowed, is
made infeasible (`judge`); while a trial runs, its optimistic score (`optimistic_score`) goes to
Optuna, and `CannotWinPruner` stops it once even that is below the best.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import optuna

from autocompile.engine.records import Record
from autocompile.trial.protocol import PACKING_CHECK_VERSION, REPLAY_VERSION
from autocompile.trial.result import Status

if TYPE_CHECKING:
    from autocompile.engine.records import FullRecord

DEFAULT_HORIZON = 1000  # training steps the warm-up is amortised over
RECOMPILE_PENALTY = 0.02  # score lost per recompile after warm-up (at most half)
PRUNE_SLACK = 0.05  # a trial is pruned once even this much above its measured pace cannot win


def score(record: dict, horizon: int = DEFAULT_HORIZON) -> float:
    """Effective steps/s over a run of `horizon` steps that starts cold.

    H / (warmup_s + recording_s + (H - warmup_steps) / steps_per_s): the warm-up's own steps count as
    training done, and the rest run at steady-state speed. A CUDA graph recorded after the warm-up is
    recorded once per new shape, so the seconds the recordings took (`recording_s`) are paid once, as
    warm-up is. Each recompile after the warm-up takes RECOMPILE_PENALTY of the result off (at most
    half). A record made before recordings were timed counts them as recompiles (compiles_after_warmup).
    0 for any trial not ok.
    """
    if record.get("status") != Status.OK:
        return 0.0
    remaining = max(horizon - record["warmup_steps"], 0)
    effective = horizon / (record["warmup_s"] + recording_s(record) + remaining / record["steps_per_s"])
    penalty = min(0.5, RECOMPILE_PENALTY * penalised_compiles(record))
    return effective * (1.0 - penalty)


def recording_s(record: dict) -> float:
    """The seconds CUDA graphs recorded after the warm-up took, paid once (0 where they were not timed)."""
    return record.get("cudagraph_recording_s_after_warmup") or 0.0


def penalised_compiles(record: dict) -> int:
    """The compile events after the warm-up that RECOMPILE_PENALTY counts: Dynamo's recompiles, and the CUDA
    graphs recorded where their seconds were not timed (a record made before they were)."""
    timed = record.get("cudagraph_recording_s_after_warmup") is not None
    return compiles_after_warmup(record) - (record.get("cudagraph_recordings_after_warmup") or 0) * timed


def compiles_after_warmup(record: dict) -> int:
    """Compile events after the warm-up: Dynamo's compiles and CUDA graphs recorded (a record made before the
    two were told apart counts both in its recompiles)."""
    return (record.get("recompiles_after_warmup") or 0) + (record.get("cudagraph_recordings_after_warmup") or 0)


def violation(record: dict) -> float:
    """Optuna constraint value: > 0 means infeasible (by how much, where that is known)."""
    if record.get("status") == Status.OK:
        return 0.0
    return float(record.get("over_memory_gb") or 1.0)


def numerics_tolerance(device: str) -> float:
    """Relative tolerance on the first loss: float32 on the CPU; bf16 or autocast on GPUs."""
    return 2e-2 if device.startswith("cuda") else 1e-3


NUMERICS_STEPS = 3  # first losses compared


def compare_losses(trial: list[float], reference: list[float], device: str) -> dict:
    """The first losses of a compiled run against eager's, step by step.

    The loss of step k comes after k optimizer updates, and an Adam-like update amplifies
    rounding differences of small gradients (it divides by their root mean square), so the
    tolerance of step k is (k + 1) times that of the first loss (seen on the GPU: a regional
    compile of the bf16 captioner agreed within 0.4% on the first loss, 3.3% on the second).
    """
    n = min(len(reference), len(trial), NUMERICS_STEPS)
    base = numerics_tolerance(device)
    tolerances = [base * (k + 1) for k in range(n)]
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(trial[:n], reference[:n])]
    worst = max(range(n), key=lambda k: diffs[k] / tolerances[k])
    return {
        "eager": reference[:n],
        "trial": trial[:n],
        "rel_diffs": diffs,
        "tolerances": tolerances,
        "max_rel_diff": diffs[worst],
        "tolerance": tolerances[worst],
        "worst_step": worst + 1,
        "differs": diffs[worst] > tolerances[worst],
    }


def _worst_rank(ranks: list[dict], device: str) -> dict:
    """`compare_losses` of each rank's replay (its "trial" losses against its "eager" ones), the rank
    furthest off for its tolerance; under several ranks (--parallel) it says which."""
    verdicts = [compare_losses(r["trial"], r["eager"], device) for r in ranks]
    worst = max(range(len(verdicts)), key=lambda k: verdicts[k]["max_rel_diff"] / verdicts[k]["tolerance"])
    return {**verdicts[worst], "rank": worst, "ranks": len(ranks)} if len(ranks) > 1 else verdicts[0]


def _rank_losses(record: dict, eager: dict) -> list[dict] | None:
    """Each rank's first losses beside eager's same rank (--parallel: each rank trains on its own
    batches), where both runs had the same ranks and kept them; else None."""
    mine, theirs = record.get("ranks"), eager.get("ranks")  # a user attribute's may be shortened to a text
    if not (isinstance(mine, list) and isinstance(theirs, list)) or len(mine) < 2 or len(mine) != len(theirs):
        return None
    if not all(isinstance(r, dict) and r.get("losses") for r in mine + theirs):
        return None
    return [{"trial": m["losses"], "eager": e["losses"]} for m, e in zip(mine, theirs)]


def numerics_verdict(record: dict, eager: dict | None, device: str) -> dict | None:
    """How a compiled trial's numerics compare with eager's, and how that was found out.

    A loss that does not depend on the random stream is compared as measured: the trial's first
    losses against the eager baseline's (same seed, weights and batches). One that does
    (dropout) differs from eager's by the noise of the masks whatever the compile does, so it is
    compared in the trial's replay instead (see autocompile.trial.worker._replay): eager and the
    configuration from fresh weights and one seed, with compiled code drawing its random numbers
    from torch's stream in eager's order. None: nothing to compare.
    """
    replay = record.get("replay")
    if replay and "error" not in replay:
        return {
            "method": "replay",
            "version": replay.get("version", 1),
            "how": replay["method"],
            "replay_s": replay["seconds"],
            **_worst_rank(replay.get("ranks") or [replay], device),
        }
    if record.get("rng_dependent"):
        why = replay["error"] if replay else "no replay was run"
        return {
            "method": "not judged",
            "differs": False,
            "how": f"the loss depends on the random stream (dropout) and the replay did not finish: {why}",
        }
    if eager and eager.get("losses") and record.get("losses"):
        ranks = _rank_losses(record, eager)
        if ranks:
            return {
                "method": "first losses",
                "how": "each rank's first losses against the eager baseline's same rank",
                **_worst_rank(ranks, device),
            }
        return {
            "method": "first losses",
            "how": "the measured run's first losses against the eager baseline's",
            **compare_losses(record["losses"], eager["losses"], device),
        }
    if eager is None and record.get("losses") and record.get("eager_first_loss") is not None:
        # eager training did not fit: the first loss against eager's forward on the same batch and
        # weights, run in the trial before anything compiled (no gradients kept: it fits)
        return {
            "method": "first loss",
            "how": "no eager baseline ran cleanly: the first loss against an eager "
            "forward of the same batch and weights in the trial itself",
            **compare_losses(record["losses"][:1], [record["eager_first_loss"]], device),
        }
    if eager is None and record.get("losses"):
        return {
            "method": "not judged",
            "differs": False,
            "how": "no eager baseline ran cleanly (it ran out of memory?) to compare the first losses with",
        }
    return None


# Why a packed configuration's losses part from the padded batch's, where they do
PACKED_APART = (
    "; packed, the sequences of a row must attend only to themselves, and here they do not: the "
    "workload's forward must pass the position ids to the model (a causal decoder takes its mask from "
    "them), or, for an encoder, the block-diagonal mask (SequenceLayout)"
)


def judge(record: FullRecord, eager: dict | None, device: str, max_memory_gb: float | None) -> FullRecord:
    """Make a trial that ran infeasible if it computes something else than eager
    (`numerics_verdict`), or needs more memory than allowed."""
    if record.get("status") != Status.OK:
        return record
    verdict = numerics_verdict(record, eager, device) if record["config"]["compile"] else None
    if verdict:
        record["numerics"] = verdict
        if verdict["method"] == "not judged":
            record.setdefault("notes", []).append("numerics not judged: " + verdict["how"])
    if verdict and verdict["differs"]:
        step = verdict["worst_step"]
        record["status"] = Status.INFEASIBLE
        record["reason"] = (
            f"numerics ({verdict['method']}): the loss of step {step} differs from eager by "
            f"{verdict['max_rel_diff']:.2%} (tolerance {verdict['tolerance']:.1%}): "
            f"{verdict['trial']} against {verdict['eager']}"
            + (f" (rank {verdict['rank']} of {verdict['ranks']})" if "rank" in verdict else "")
            + (PACKED_APART if record["config"].get("padding") == "pack" else "")
        )
        return record
    if max_memory_gb is not None and record.get("peak_mem_gb", 0) > max_memory_gb:
        record["over_memory_gb"] = record["peak_mem_gb"] - max_memory_gb
        record["status"] = Status.INFEASIBLE
        record["reason"] = f"peak memory {record['peak_mem_gb']:.2f} GB is above --max-memory-gb {max_memory_gb:g}"
    return record


def optimistic_score(events: list[dict], horizon: int, ceiling: float | None = None, now: float | None = None) -> float | None:
    """The highest score a running trial could still reach, from its progress events.

    While it warms up: the score of the steps left at `ceiling` steps/s (a neighbour's: its parent's speed
    times the most a neighbour has gained over its parent, `Runner._ceiling`), after the warm-up so far;
    without a ceiling, horizon / warm-up so far (even infinitely fast steps cannot beat that). Once two
    steady windows are in: the score at their pace, plus the larger of PRUNE_SLACK and three times their
    spread. None before the warm-up starts.
    """
    now = time.time() if now is None else now
    start = next((e["t"] for e in events if e.get("phase") in ("compiling", "warming up")), None)
    if start is None:
        return None
    warmed = next((e for e in events if e.get("phase") == "measuring" and "warmup_s" in e), None)
    if warmed is None:
        steps = max((e.get("step", 0) for e in events if e.get("phase") in ("compiling", "warming up")), default=0)
        return _at_most(horizon, max(now - start, 1e-9), steps, ceiling)
    rates = [e["steps_per_s"] for e in events if e.get("phase") == "measuring" and "window" in e]
    if len(rates) < 2:
        return _at_most(horizon, max(warmed["warmup_s"], 1e-9), warmed["warmup_steps"], ceiling)
    pace = statistics.mean(rates)
    slack = max(PRUNE_SLACK, 3 * statistics.pstdev(rates) / pace)
    at_pace = score(
        {"status": Status.OK, "warmup_s": warmed["warmup_s"], "warmup_steps": warmed["warmup_steps"], "steps_per_s": pace},
        horizon,
    )
    return at_pace * (1 + slack)


def _at_most(horizon: int, elapsed_s: float, steps: int, ceiling: float | None) -> float:
    """The best score after `elapsed_s` of warm-up and `steps`: the rest at `ceiling` (with PRUNE_SLACK), else
    at any speed."""
    if not ceiling:
        return horizon / elapsed_s
    return horizon / (elapsed_s + max(horizon - steps, 0) / (ceiling * (1 + PRUNE_SLACK)))


def best_score(study) -> float | None:
    """The best score of the feasible completed trials, finalist reruns included."""
    return max(
        (
            t.value
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if Record.of(t).status == Status.OK and t.value
        ),
        default=None,
    )


class CannotWinPruner(optuna.pruners.BasePruner):
    """Prunes a trial whose last reported value (its optimistic score) is below the best score
    (`best_score`)."""

    def prune(self, study, trial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        best = best_score(study)
        return best is not None and trial.intermediate_values[step] < best


def _judged_by_an_older_guard(record: Record) -> bool:
    """A trial made infeasible for its numerics by a guard since replaced: before the verdict said
    how it was reached (the first losses of runs whose dropout masks differed, or the packing check's
    first version), or by a replay or packing check of an older version. Its configuration is measured again."""
    if record.status != Status.INFEASIBLE or not (record.reason or "").startswith("numerics"):
        return False
    numerics = {} if record.numerics is None else record.numerics
    current = {"replay": REPLAY_VERSION, "packing check": PACKING_CHECK_VERSION}
    return "method" not in numerics or numerics.get("version", 1) < current.get(numerics["method"], 1)
