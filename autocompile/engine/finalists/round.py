"""The finalist round run: the contenders measured again, alternating with eager, a third time where
their runs disagree far, and the verdict (`finalists.verdict`) taken from those runs and stored; on
several GPUs, each GPU its own eager and its share of the finalists, all at once (`finalists.lanes`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autocompile.engine.cost import ROUND_MEASURE, cold_run_s, cold_scale, rerun_estimate_s
from autocompile.engine.finalists.cold import cold_check, cold_run_check
from autocompile.engine.finalists.lanes import Lane, drive
from autocompile.engine.horizon import budget_horizon
from autocompile.engine.horizon import scoring as horizon_of
from autocompile.engine.finalists.plan import cold_pick, contenders, plan_round, rerun_limit_s, say_left_out
from autocompile.engine.finalists.verdict import WINNER_RULE, reconstructed, rechosen, round_verdict
from autocompile.engine.records import Record, Role, plain
from autocompile.engine.runner import Prepared, new_trial
from autocompile.engine.studyview import view_of
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


def run_finalists(runner: Runner, k: int, rounds: int = 1, gpus: list[str] | None = None) -> dict | None:
    """Measure the contenders (the top k, within REACH of the leader) again, alternating with
    eager, and choose the winner.

    Each round runs eager then the finalists (in reverse order every other round), so drift
    of the machine reaches all of them alike. The winner has the best score in the round;
    when the top two are within noise (see choose_winner), the one with the shorter warm-up wins.
    On several GPUs (`gpus`, CUDA_VISIBLE_DEVICES names: the search's workers'), the finalists are
    split over them (`plan.split`), each GPU measuring its own eager then its finalists, all GPUs
    at once (`lanes`), and the verdict compares them on one footing (`verdict.gpu_footing`).
    """
    study, progress, view = runner.study, runner.progress, runner.look()
    eager = view.baseline_trial(Role.EAGER)
    candidates = contenders(study, k, runner.settings.trial_timeout_s, view)
    if not candidates:
        return None
    if eager is None:  # eager did not fit: the finalists are measured again among themselves
        progress.line("finalist round: without eager (its baseline did not run cleanly): the finalists alone")
    say_left_out(runner, k, candidates, view)
    gpus = list(gpus or [None])
    lanes, overrun = plan_round(runner, eager, candidates, rounds, len(gpus), view)
    finalists = [t for t in candidates if any(t.number == x.number for lane in lanes for x in lane)]
    numbers = [t.number for t in finalists]
    done = study.user_attrs.get("finalists")
    if done and done.get("finalists") == numbers and done.get("numerics_guard") == REPLAY_VERSION:
        # this round was run already for these finalists, under the current numerics guard
        return done if done.get("winner_rule") == WINNER_RULE else rechoose(study, horizon_of(runner.settings), progress.line)
    used = [(gpu, lane) for gpu, lane in zip(gpus, lanes) if lane]
    scale = cold_scale(study)
    pick = cold_pick(finalists, scale)
    colds = cold_runs(used, eager, pick, scale)
    cold = (
        f"; trial {pick.number}, its warm-up reconstructed, from empty caches: its warm-up measured cold"
        if pick is not None
        else ""
    )
    others = sorted(colds - {pick.number}) if pick is not None else []
    if others:
        cold += f" (trial{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} too, on GPUs that would wait for it)"
    progress.line(
        f"finalist round: trials {', '.join(map(str, numbers))} measured again, alternating with eager; "
        f"each starts from the code its first run compiled, whose cold warm-up and numerics it carries{cold}"
        + _where(lanes, gpus)
    )
    on = None if gpus == [None] else {t.number: gpu for gpu, lane in zip(gpus, lanes) for t in lane}
    runs = _run_rounds(runner, eager, used, pick, colds, overrun, rounds)
    verdict = _verdict(runner, eager, finalists, runs, rounds, on)
    if _measure_again(runner, eager, finalists, runs, verdict["candidates"], rounds):
        verdict = _verdict(runner, eager, finalists, runs, rounds, on)
    if verdict["winner"] is not None:
        progress.line("finalists: " + verdict["why"])
        trials = runner.look().trials  # the round's runs among them
        verdict = cold_check(
            runner, verdict, [cold_run_check(trials[n], x) for n, xs in runs.items() for x in xs if x.get("cold")]
        )
    study.set_user_attr("finalists", plain(verdict))
    return verdict


def _where(lanes: list[list], gpus: list) -> str:
    """What the round's line adds where it runs on several GPUs: which finalists each measures."""
    used = [(gpu, lane) for gpu, lane in zip(gpus, lanes) if lane]
    if len(used) < 2:
        return ""
    return f"; on {len(used)} GPUs at once, each finalist beside its own GPU's eager: " + "; ".join(
        f"GPU {gpu} trial{'s' if len(lane) > 1 else ''} {', '.join(str(t.number) for t in lane)}" for gpu, lane in used
    )


def cold_runs(lanes: list[tuple], eager, pick, scale: float) -> set[int]:
    """The finalists whose first run in the round is from empty caches: `pick` (`cold_pick`), and on several
    GPUs each other finalist whose warm-up was reconstructed where its GPU's runs, that one cold, are still
    expected to end before the GPU that runs `pick` ends (`lanes`: each GPU's name and finalists). A GPU would
    otherwise wait for that one, and then for the cold run that the verdict asks where it picks another
    reconstructed finalist (`cold.cold_check`): the round's cold runs are all at once."""
    if pick is None:
        return set()
    colds = {pick.number}
    if len(lanes) < 2:
        return colds
    base = rerun_estimate_s(eager) if eager is not None else 0.0

    def lane_s(lane: list, cold: set) -> float:
        return base + sum(cold_run_s(t, scale) if t.number in cold else rerun_estimate_s(t) for t in lane)

    longest = max(lane_s(lane, colds) for _, lane in lanes)
    for _, lane in lanes:
        for t in lane:
            if t.number not in colds and reconstructed(t) and lane_s(lane, colds | {t.number}) <= longest:
                colds.add(t.number)
    return colds


def _run_rounds(
    runner: Runner, eager, lanes: list[tuple], pick, colds: set[int], overrun: float, rounds: int
) -> dict[int, list[dict]]:
    """The round's runs, by the trial each measures again: each GPU's (`lanes`: its name and its
    finalists, the leader's first) at once, each its eager then its finalists, in reverse order every
    other round; the first round's runs of `colds` (`cold_runs`: `pick`, `cold_pick`'s, and those beside
    it on GPUs that would wait) from empty caches. The round was planned
    from what its runs took (the reserve): a run is left out only when what it took no longer fits, and
    the first round's eager, leader and pick always run."""
    progress = runner.progress
    reference = [eager] if eager is not None else []
    progress.total = progress.done + rounds * sum(len(lane) + len(reference) for _, lane in lanes)
    runs: dict[int, list[dict]] = {t.number: [] for t in [*reference, *(t for _, lane in lanes for t in lane)]}
    drive(
        runner,
        [
            _lane(runner, reference, lane, _must(reference, lane, lanes[0][1][0], pick), colds, overrun, rounds, gpu, runs)
            for gpu, lane in lanes
        ],
    )
    return runs


def _must(reference: list, lane: list, leader, pick) -> set[int]:
    """The runs a GPU's first round makes even where what is left no longer holds them: the leader and the
    finalist `pick` (`cold_pick`) where it measures them, and then its eager before them."""
    held = {t.number for t in (leader, pick) if t is not None and any(t.number == x.number for x in lane)}
    return held | {x.number for x in reference} if held else held


def _lane(
    runner: Runner,
    reference: list,
    finalists: list,
    must: set,
    colds: set[int],
    overrun: float,
    rounds: int,
    gpu: str | None,
    runs: dict[int, list[dict]],
) -> Lane:
    """One GPU's runs of the round (`_run_rounds`), as `lanes.drive` runs them: eager (`reference`) then
    its finalists; a run that no longer fits what is left is not made, unless `must` names it."""
    for r in range(rounds):
        for original in [*reference, *(finalists if r % 2 == 0 else finalists[::-1])]:
            remaining = runner.remaining()
            if (
                remaining is not None
                and not (r == 0 and original.number in must)
                and remaining + overrun < rerun_estimate_s(original)
            ):
                runner.progress.line(f"finalist round: search timeout reached, trial {original.number} not measured again")
                break
            cold = r == 0 and original.number in colds
            runs[original.number].extend((yield from _runs_of(runner, original, r, overrun, cold, gpu)))


def _runs_of(runner: Runner, original, r: int, overrun: float, cold: bool, gpu: str | None) -> Lane:
    """Finalist `original`'s runs in round `r` (a lane's step: its records returned): its rerun; where that
    was a cold one and failed, a warm one after it, its speed measured all the same, as the others'."""
    record = yield from _rerun_in(runner, original, r, overrun, cold, gpu)
    if not cold or record["status"] == Status.OK:
        return [record]
    runner.progress.line(
        f"finalist round: the cold run of trial {original.number} ended {record['status']}: "
        "measured again from its compiled code, its warm-up stays reconstructed"
    )
    return [record, (yield from _rerun_in(runner, original, r, overrun, False, gpu))]


def _verdict(
    runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rounds: int, gpus: dict[int, str] | None = None
) -> dict:
    """The round's verdict from its runs (`verdict.round_verdict`), at the search's horizon; on several
    GPUs (`gpus`, each finalist's), on one footing."""
    return round_verdict(
        eager, finalists, runs, rounds, horizon_of(runner.settings), cold_scale(runner.study), budget_horizon(runner.study), gpus
    )


def far_apart(row: dict) -> bool:
    """Whether a finalist's measurements disagree far beyond their windows' spread (FAR_SPREADS, FAR_FLOOR)."""
    return row["status"] == Status.OK and row["agreement"] > max(FAR_SPREADS * row["spread"], FAR_FLOOR)


def _measure_again(runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rows: list[dict], rounds: int) -> bool:
    """Each finalist whose measurements disagree far beyond their noise (`far_apart`) measured once
    more, eager before it, where what is left of --timeout holds both reruns (no time is taken from
    the search for it); whether any ran. Its line says which, or why not. On a round of several GPUs,
    each on its own GPU, the GPUs at once."""
    ran: list[int] = []
    on: dict = {}
    for t, row in zip(finalists, rows):
        on.setdefault(row.get("gpu"), []).append((t, row))
    drive(runner, [_again(runner, eager, pairs, runs, rounds, gpu, ran) for gpu, pairs in on.items()])
    return bool(ran)


def _again(
    runner: Runner, eager, finalists: list[tuple], runs: dict[int, list[dict]], rounds: int, gpu: str | None, ran: list[int]
) -> Lane:
    """One GPU's part of `_measure_again` (`finalists`: its (trial, row) pairs), as `lanes.drive` runs it;
    the finalists it measured again are added to `ran`."""
    progress = runner.progress
    for t, row in finalists:
        if not far_apart(row):
            continue
        pair = [x for x in (eager, t) if x is not None]
        need, remaining = sum(rerun_estimate_s(x) for x in pair), runner.remaining()
        ran_as = (
            f"finalist round: trial {t.number} ran {' then '.join(f'{p:.3g}' for p in row['paces'])} steps/s "
            f"({row['agreement']:.0%} apart, its windows within {row['spread']:.0%})"
        )
        if remaining is not None and remaining < need:
            progress.line(
                f"{ran_as}, not measured a third time: {max(remaining, 0):.0f} s left, a rerun of "
                f"it{' and eager' if eager else ''} takes about {need:.0f} s"
            )
            continue
        progress.line(f"{ran_as}: measured a third time{', eager beside it' if eager else ''}")
        progress.total += len(pair)
        for x in pair:
            runs[x.number].append((yield from _rerun_in(runner, x, rounds, 0.0, False, gpu)))
        ran.append(t.number)


def _rerun(runner: Runner, original, r: int, overrun: float, cold: bool, gpu: str | None = None) -> dict:
    """Finalist `original` measured again in round `r`: from the code its first run compiled, its
    cold warm-up and numerics carried; or, `cold`, from empty caches, its warm-up measured cold
    (the finalist `cold_pick` names, its warm-up reconstructed: the run its cold check would have
    been, in place of a warm rerun). A rerun may take longer than its first run (a loaded host
    compiles slower): it is not cut short of its limit (RERUN_LIMIT), even past --timeout, nor let
    run beyond it. On `gpu` (CUDA_VISIBLE_DEVICES), where the round has several."""
    prepared = _prepared(runner, original, r, overrun, cold, gpu)
    return _kept(runner.complete(prepared), prepared, gpu)


def _rerun_in(runner: Runner, original, r: int, overrun: float, cold: bool, gpu: str | None) -> Lane:
    """`_rerun` as a lane's step: it yields the rerun made ready, is sent its record, and returns it as kept."""
    prepared = _prepared(runner, original, r, overrun, cold, gpu)
    record = yield prepared
    return _kept(record, prepared, gpu)


def _prepared(runner: Runner, original, r: int, overrun: float, cold: bool, gpu: str | None) -> Prepared:
    """`_rerun`'s trial, made ready to launch (`Runner.prepare`)."""
    trial = new_trial(runner.study)
    trial.set_user_attr("remeasure_of", original.number)
    trial.set_user_attr("finalist_round", r)
    if cold:
        trial.set_user_attr("cold_check", True)
    if gpu is not None:
        trial.set_user_attr("gpu", gpu)
    first_s = cold_run_s(original, cold_scale(runner.study)) if cold else Record.of(original).wall_s
    limit = rerun_limit_s(first_s, runner.settings.trial_timeout_s)
    remaining = runner.remaining()
    keep = -overrun if remaining is None else min(-overrun, remaining - limit - STOP_S)  # its whole limit
    return runner.prepare(
        trial, dict(Record.of(original).config), Role.FINALIST, False, limit, keep, original, cold, ROUND_MEASURE, gpu
    )


def _kept(record: dict, prepared: Prepared, gpu: str | None) -> dict:
    """A rerun's record as the round keeps it: with its trial's number, whether it ran cold, and its GPU."""
    return {**record, "trial": prepared.trial.number, "cold": prepared.cold, **({} if gpu is None else {"gpu": gpu})}


def rechoose(study, horizon: int, say=print) -> dict | None:
    """The study's finalist verdict chosen again under the current rule from the round's own runs,
    without measuring (`verdict.rechosen`). Stored, and said when the winner changes."""
    verdict, view = study.user_attrs.get("finalists"), view_of(study)
    eager = view.baseline_trial(Role.EAGER)
    if not verdict or verdict.get("winner_rule") == WINNER_RULE or eager is None:
        return verdict
    again = rechosen(verdict, eager, view.trials, horizon, cold_scale(study), budget_horizon(study))
    if again["winner"] != verdict.get("winner"):
        say(
            f"finalist round of trials {', '.join(map(str, verdict['finalists']))} chosen again under the current "
            f"rule: trial {again['winner']} wins (was trial {verdict.get('winner')}): {again['why']}"
        )
    study.set_user_attr("finalists", plain(again))
    return again
