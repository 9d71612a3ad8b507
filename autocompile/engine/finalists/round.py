"""The finalist round run: the contenders measured again, alternating with eager, a third time where
their runs disagree far, and the verdict (`finalists.verdict`) taken from those runs and stored."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autocompile.engine.cost import ROUND_MEASURE, cold_run_s, cold_scale, rerun_estimate_s
from autocompile.engine.finalists.cold import cold_check, cold_run_check
from autocompile.engine.horizon import budget_horizon
from autocompile.engine.horizon import scoring as horizon_of
from autocompile.engine.finalists.plan import cold_pick, contenders, plan_round, rerun_limit_s, say_left_out
from autocompile.engine.finalists.verdict import WINNER_RULE, rechosen, round_verdict
from autocompile.engine.records import Role, plain
from autocompile.engine.runner import new_trial
from autocompile.engine.studyview import StudyView
from autocompile.trial.protocol import REPLAY_VERSION, STOP_S
from autocompile.trial.result import Status

if TYPE_CHECKING:
    from autocompile.engine.runner import Runner

# A finalist whose measurements disagree by more than FAR_SPREADS times the larger window spread
# among them, and by more than FAR_FLOOR, is measured once more, eager beside it, where the time
# left under --timeout holds both (`_measure_again`): a third measurement of each makes the median
# the middle one, so one disturbed run no longer moves the verdict.
FAR_SPREADS = 3
FAR_FLOOR = 0.2


def run_finalists(runner: Runner, k: int, rounds: int = 1) -> dict | None:
    """Measure the contenders (the top k, within REACH of the leader) again, alternating with
    eager, and choose the winner.

    Each round runs eager then the finalists (in reverse order every other round), so drift
    of the machine reaches all of them alike. The winner has the best score in the round;
    when the top two are within noise (see choose_winner), the one with the shorter warm-up wins.
    """
    study, progress, view = runner.study, runner.progress, StudyView(runner.study)
    eager = view.baseline_trial(Role.EAGER)
    candidates = contenders(study, k, runner.settings.trial_timeout_s, view)
    if not candidates:
        return None
    if eager is None:  # eager did not fit: the finalists are measured again among themselves
        progress.line("finalist round: without eager (its baseline did not run cleanly): the finalists alone")
    say_left_out(runner, k, candidates)
    finalists, overrun = plan_round(runner, eager, candidates, rounds)
    numbers = [t.number for t in finalists]
    done = study.user_attrs.get("finalists")
    if done and done.get("finalists") == numbers and done.get("numerics_guard") == REPLAY_VERSION:
        # this round was run already for these finalists, under the current numerics guard
        return done if done.get("winner_rule") == WINNER_RULE else rechoose(study, horizon_of(runner.settings), progress.line)
    pick = cold_pick(finalists, cold_scale(study))
    cold = f"; trial {pick.number}, its warm-up reconstructed, from empty caches: its warm-up measured cold" \
        if pick is not None else ""
    progress.line(f"finalist round: trials {', '.join(map(str, numbers))} measured again, alternating with eager; "
                  f"each starts from the code its first run compiled, whose cold warm-up and numerics it carries{cold}")
    runs = _run_rounds(runner, eager, finalists, pick, overrun, rounds)
    verdict = _verdict(runner, eager, finalists, runs, rounds)
    if _measure_again(runner, eager, finalists, runs, verdict["candidates"], rounds):
        verdict = _verdict(runner, eager, finalists, runs, rounds)
    if verdict["winner"] is not None:
        progress.line("finalists: " + verdict["why"])
        trials = StudyView(study).trials  # the round's runs among them
        verdict = cold_check(runner, verdict, [cold_run_check(trials[n], x) for n, xs in runs.items()
                                               for x in xs if x.get("cold")])
    study.set_user_attr("finalists", plain(verdict))
    return verdict


def _run_rounds(runner: Runner, eager, finalists: list, pick, overrun: float, rounds: int) -> dict[int, list[dict]]:
    """The round's runs, by the trial each measures again: eager then the finalists, in reverse order
    every other round; the first round's run of `pick` (`cold_pick`) from empty caches."""
    progress = runner.progress
    reference = [eager] if eager is not None else []
    progress.total = progress.done + rounds * (len(finalists) + len(reference))
    runs: dict[int, list[dict]] = {t.number: [] for t in [*reference, *finalists]}
    for r in range(rounds):
        order = [*reference, *(finalists if r % 2 == 0 else finalists[::-1])]
        for original in order:
            remaining = runner.remaining()
            # the round was planned from what its runs took (the reserve): a run is left out only
            # when what it took no longer fits, and the first round's eager and leader always run
            must = r == 0 and original.number in {x.number for x in (*reference, finalists[0], pick) if x is not None}
            if remaining is not None and not must and remaining + overrun < rerun_estimate_s(original):
                progress.line(f"finalist round: search timeout reached, trial {original.number} not measured again")
                break
            runs[original.number].extend(_runs_of(runner, original, r, overrun, cold=r == 0 and original is pick))
    return runs


def _runs_of(runner: Runner, original, r: int, overrun: float, cold: bool) -> list[dict]:
    """Finalist `original`'s runs in round `r`: its rerun; where that was a cold one and failed, a warm
    one after it, its speed measured all the same, as the others'."""
    record = _rerun(runner, original, r, overrun, cold)
    if not cold or record["status"] == Status.OK:
        return [record]
    runner.progress.line(f"finalist round: the cold run of trial {original.number} ended {record['status']}: "
                         "measured again from its compiled code, its warm-up stays reconstructed")
    return [record, _rerun(runner, original, r, overrun, cold=False)]


def _verdict(runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rounds: int) -> dict:
    """The round's verdict from its runs (`verdict.round_verdict`), at the search's horizon."""
    return round_verdict(eager, finalists, runs, rounds, horizon_of(runner.settings), cold_scale(runner.study),
                         budget_horizon(runner.study))


def far_apart(row: dict) -> bool:
    """Whether a finalist's measurements disagree far beyond their windows' spread (FAR_SPREADS, FAR_FLOOR)."""
    return row["status"] == Status.OK and row["agreement"] > max(FAR_SPREADS * row["spread"], FAR_FLOOR)


def _measure_again(runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rows: list[dict],
                   rounds: int) -> bool:
    """Each finalist whose measurements disagree far beyond their noise (`far_apart`) measured once
    more, eager before it, where what is left of --timeout holds both reruns (no time is taken from
    the search for it); whether any ran. Its line says which, or why not."""
    progress, ran = runner.progress, False
    for t, row in zip(finalists, rows):
        if not far_apart(row):
            continue
        pair = [x for x in (eager, t) if x is not None]
        need, remaining = sum(rerun_estimate_s(x) for x in pair), runner.remaining()
        ran_as = (f"finalist round: trial {t.number} ran {' then '.join(f'{p:.3g}' for p in row['paces'])} steps/s "
                  f"({row['agreement']:.0%} apart, its windows within {row['spread']:.0%})")
        if remaining is not None and remaining < need:
            progress.line(f"{ran_as}, not measured a third time: {max(remaining, 0):.0f} s left, a rerun of "
                          f"it{' and eager' if eager else ''} takes about {need:.0f} s")
            continue
        progress.line(f"{ran_as}: measured a third time{', eager beside it' if eager else ''}")
        progress.total += len(pair)
        for x in pair:
            runs[x.number].append(_rerun(runner, x, rounds, 0.0, cold=False))
        ran = True
    return ran


def _rerun(runner: Runner, original, r: int, overrun: float, cold: bool) -> dict:
    """Finalist `original` measured again in round `r`: from the code its first run compiled, its
    cold warm-up and numerics carried; or, `cold`, from empty caches, its warm-up measured cold
    (the finalist `cold_pick` names, its warm-up reconstructed: the run its cold check would have
    been, in place of a warm rerun). A rerun may take longer than its first run (a loaded host
    compiles slower): it is not cut short of its limit (RERUN_LIMIT), even past --timeout, nor let
    run beyond it."""
    trial = new_trial(runner.study)
    trial.set_user_attr("remeasure_of", original.number)
    trial.set_user_attr("finalist_round", r)
    if cold:
        trial.set_user_attr("cold_check", True)
    first_s = cold_run_s(original, cold_scale(runner.study)) if cold else original.user_attrs["wall_s"]
    limit = rerun_limit_s(first_s, runner.settings.trial_timeout_s)
    remaining = runner.remaining()
    keep = -overrun if remaining is None else min(-overrun, remaining - limit - STOP_S)  # its whole limit
    record = runner.run(trial, dict(original.user_attrs["config"]), Role.FINALIST, prunable=False,
                        limit_s=limit, keep_s=keep, first=original, cold=cold, measure=ROUND_MEASURE)
    return {**record, "trial": trial.number, "cold": cold}


def rechoose(study, horizon: int, say=print) -> dict | None:
    """The study's finalist verdict chosen again under the current rule from the round's own runs,
    without measuring (`verdict.rechosen`). Stored, and said when the winner changes."""
    verdict, view = study.user_attrs.get("finalists"), StudyView(study)
    eager = view.baseline_trial(Role.EAGER)
    if not verdict or verdict.get("winner_rule") == WINNER_RULE or eager is None:
        return verdict
    again = rechosen(verdict, eager, view.trials, horizon, cold_scale(study), budget_horizon(study))
    if again["winner"] != verdict.get("winner"):
        say(f"finalist round of trials {', '.join(map(str, verdict['finalists']))} chosen again under the current "
            f"rule: trial {again['winner']} wins (was trial {verdict.get('winner')}): {again['why']}")
    study.set_user_attr("finalists", plain(again))
    return again
