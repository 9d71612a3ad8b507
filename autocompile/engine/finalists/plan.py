"""The finalist round's plan: which finalists it measures again, on which GPU, how long each rerun may
take, which one runs from empty caches, and what the round keeps of --timeout (its reserve), each run
counted as engine/cost.py expects it to take. The measurements behind each number are in docs/decisions.md."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from autocompile.engine.cost import added_s, cold_over_warm_s, cold_scale, rerun_estimate_s, round_s
from autocompile.engine.finalists.verdict import expected_cold, reconstructed
from autocompile.engine.gates import Outcome, Refusal, View, why_not
from autocompile.engine.records import Record
from autocompile.engine.studyview import StudyView, view_of

if TYPE_CHECKING:
    from autocompile.engine.runner import Runner

# How far behind the leader's score a configuration may be and still be measured again: no further
# than the largest disagreement seen between two runs of one configuration. Further behind, a rerun
# cannot change the verdict, and its time is the other finalists'.
REACH = 0.3

# A finalist's rerun is stopped at this multiple of what its first run took (and never short of a
# minute more than that, nor past the trial limit): a rerun that takes far longer than its first
# run measures the machine, not the configuration, and must not take the other finalists' time.
RERUN_LIMIT = 1.5


def rerun_limit_s(first_wall_s: float, trial_timeout_s: float) -> float:
    """The time limit of a finalist's rerun (see RERUN_LIMIT)."""
    return min(trial_timeout_s, max(RERUN_LIMIT * first_wall_s, first_wall_s + 60))


def cold_pick(finalists: list, scale: float = 1.0):
    """The finalist whose round run is from empty caches: the one the verdict most likely chooses,
    where its warm-up was reconstructed (None where that one's was measured cold), so that the winner
    needs no second cold run. The verdict compares the top two (`choose_winner`): of the leader and
    the runner-up by their first runs, the leader, or, where they are within noise of each other
    (their window spreads added), the one with the shorter warm-up (a reconstructed one as a cold run
    is expected to measure it, `scale`; WINNER_RULE 4 and 5)."""
    if not finalists:
        return None
    leader = finalists[0]
    pair = [leader, *(t for t in finalists[1:2] if leader.value / t.value - 1 <= _spread(leader) + _spread(t))]
    quickest = min(pair, key=lambda t: _expected_cold_warmup(t, scale))
    return quickest if reconstructed(quickest) else None


def _expected_cold_warmup(trial, scale: float) -> float:
    """A trial's warm-up as a cold run is expected to measure it (`expected_cold`, by `scale`)."""
    return expected_cold(
        {
            "warmup_s": Record.of(trial).warmup_s or math.inf,
            "warmup_reconstructed": reconstructed(trial),
            "reconstruction_added_s": added_s(trial),
        },
        None,
        scale,
    )


def _spread(trial) -> float:
    return Record.of(trial).attrs.get("cv") or 0.0


def cold_check_s(study, k: int, limit_s: float | None = None, view: StudyView | None = None) -> float:
    """What measuring a finalist's warm-up cold adds to the round, where `cold_pick` names one: its
    round's run is a cold one (`round._rerun`), its first run with the compile time its cache hits
    saved, in place of a warm rerun."""
    scale = cold_scale(study)
    pick = cold_pick(contenders(study, k, limit_s, view), scale)
    if pick is None:
        return 0.0
    return cold_over_warm_s(pick, scale)


def contenders(study, k: int, limit_s: float | None = None, view: StudyView | None = None) -> list:
    """The top k distinct configurations that a rerun could still make the winner: best first,
    those within REACH of the leader's score, and whose rerun fits `limit_s` (the trial limit, which
    bounds a rerun: `not_rerun`)."""
    top = view_of(study, view).search_candidates()[:k]
    return [t for t in top if t.value >= (1 - REACH) * top[0].value and not not_rerun(study, t, limit_s)]


def not_rerun(study, trial, limit_s: float | None) -> Refusal | None:
    """Why a finalist is not measured again for its rerun's time (the gates that end NOT_RERUN:
    gates.too_long), or None."""
    return why_not(Record.of(trial).config or {}, View(study, limit_s, first=trial), Outcome.NOT_RERUN)


def finalist_reserve(study, k: int, limit_s: float | None = None, gpus: int = 1) -> float:
    """Seconds to keep for the finalist round under --timeout: what the current contenders (and eager)
    took in their own runs, which the round repeats. Kept from the start (a resumed study knows
    it at once) and updated as trials finish, so the round always runs. A tenth more for runs that
    take longer the second time. Nothing while no compiled trial is a contender: the round measures
    contenders against eager, and without one it does not run. On several GPUs (`gpus`), what the
    longest of their sequences takes (`split`: each its eager and its finalists)."""
    view = view_of(study)
    finalists = contenders(study, k, limit_s, view) if k > 0 else []
    if not finalists:
        return 0.0
    eager, cold_s = view.eager_record() or {}, cold_check_s(study, k, limit_s, view)
    if gpus == 1:
        return round_s(finalists, eager, cold_s)
    where = split(finalists, gpus)
    return max(round_s([t for t, g in zip(finalists, where) if g == gpu], eager, cold_s) for gpu in set(where))


def split(finalists: list, gpus: int) -> list[int]:
    """Each finalist's GPU in the round (an index), best first: the one whose planned reruns end first
    (the first of a tie; the leader on the first), each counted as its rerun is expected to take."""
    loads, where = [0.0] * gpus, []
    for t in finalists:
        gpu = loads.index(min(loads))
        where.append(gpu)
        loads[gpu] += rerun_estimate_s(t)
    return where


def reserve_note(study, k: int, timeout_s: float | None, limit_s: float | None = None, gpus: int = 1) -> str | None:
    """A line for the start of a search whose finalist round (on `gpus` GPUs) keeps more than half of
    --timeout, or None: a resumed search's round repeats its top trials, which may leave little room for new ones."""
    reserve = finalist_reserve(study, k, limit_s, gpus) if timeout_s and k else 0.0
    if not timeout_s or reserve <= timeout_s / 2:
        return None
    n = len(contenders(study, k, limit_s))
    fewer = f"; --finalists {n - 1} keeps {finalist_reserve(study, n - 1, limit_s, gpus):.0f} s" if n > 1 else ""
    return (
        f"the finalist round keeps {reserve:.0f} s of the {timeout_s:.0f} s --timeout "
        f"(its {n} finalists and eager, measured again){fewer}"
    )


def say_left_out(runner: Runner, k: int, candidates: list, view: StudyView) -> None:
    """A line for each of the top k left out of the round (not a contender): its rerun too long for
    the trial limit (`not_rerun`), or its score too far behind the leader's (REACH); `view`: the round's study."""
    trial_limit = runner.settings.trial_timeout_s
    top, chosen = view.search_candidates()[:k], {c.number for c in candidates}
    for t in top:
        refusal = not_rerun(runner.study, t, trial_limit)
        if refusal:
            runner.progress.line(f"finalist round: trial {t.number} not measured again: {refusal.reason}")
        elif t.number not in chosen:
            runner.progress.line(
                f"finalist round: trial {t.number} not measured again: its score {t.value:.3g} is "
                f"{1 - t.value / top[0].value:.0%} behind the leader's, more than a rerun moves "
                f"({REACH:.0%})"
            )


def plan_round(
    runner: Runner, eager, candidates: list, rounds: int, gpus: int = 1, view: StudyView | None = None
) -> tuple[list[list], float]:
    """The finalists whose reruns fit what is left of --timeout, best first, as each GPU's list (`split`:
    every GPU measures its own eager, then its finalists), and by how much the round may run past it
    (when none fits, the best is measured all the same, on the first GPU); `view`: the round's study."""
    remaining, overrun = runner.remaining(), 0.0
    eager_s = rerun_estimate_s(eager) if eager is not None else 0.0
    cold_s = None if remaining is None else cold_check_s(runner.study, len(candidates), view=view)
    budget = None if remaining is None else (remaining - cold_s) / rounds - eager_s
    lanes, left = [[] for _ in range(gpus)], [budget] * gpus
    for t, gpu in zip(candidates, split(candidates, gpus)):
        if budget is not None and rerun_estimate_s(t) > left[gpu]:
            runner.progress.line(
                f"finalist round: no time left to measure trial {t.number} again "
                f"(it took {Record.of(t).wall_s:.0f} s, a rerun is expected to take "
                f"{rerun_estimate_s(t):.0f} s)"
            )
            break
        lanes[gpu].append(t)
        left[gpu] = None if budget is None else left[gpu] - rerun_estimate_s(t)
    if not any(lanes):  # the round always runs: the best of them at least, past --timeout if need be
        lanes[0] = candidates[:1]
        limit = runner.settings.trial_timeout_s
        overrun = (
            rerun_limit_s(Record.of(lanes[0][0]).wall_s, limit)
            + (rerun_limit_s(eager_s, limit) if eager is not None else 0.0)
            - max(remaining, 0.0)
        )
        runner.progress.line(
            f"finalist round: trial {lanes[0][0].number} measured again even though it runs past "
            f"--timeout, by up to {overrun:.0f} s: the winner comes from the round"
        )
    return lanes, overrun
