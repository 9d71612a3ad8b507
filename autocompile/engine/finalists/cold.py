"""The winner's warm-up measured cold: where its runs had it reconstructed from a shared compile
cache's hits, a run of it from empty caches, and the verdict chosen again with that warm-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autocompile.engine.horizon import budget_horizon
from autocompile.engine.horizon import scoring as horizon_of
from autocompile.engine.cost import ROUND_MEASURE, cold_run_s, cold_scale
from autocompile.engine.finalists.plan import rerun_limit_s
from autocompile.engine.finalists.verdict import choose_winner, measurements, pool_row
from autocompile.engine.records import Record, Role
from autocompile.engine.runner import new_trial
from autocompile.engine.studyview import view_of
from autocompile.trial.result import Status

if TYPE_CHECKING:
    from autocompile.engine.runner import Runner


def cold_run_check(first, run: dict) -> dict:
    """A cold run of finalist `first` in the round, as `cold_check` lists it."""
    check = {
        "trial": run["trial"],
        "of": first.number,
        "status": run["status"],
        "reconstructed_warmup_s": Record.of(first).warmup_s,
    }
    if run["status"] == Status.OK:
        check.update(cold_warmup_s=run["warmup_s"], agreement=Record.of(first).warmup_s / run["warmup_s"] - 1)
    return check


def cold_check(runner: Runner, verdict: dict, checks: list | None = None) -> dict:
    """The winner's warm-up measured cold, where its runs had it reconstructed (a shared compile cache
    had some of its graphs): the round's cold run of it (`checks`, the leader's), else a run of its
    own from empty caches (`_measure_cold`). Its cold warm-up can put another finalist ahead; where
    that one's warm-up was reconstructed too, it is measured cold in turn, so that the winner's
    warm-up is always one measured cold (or says it is not: a cold run that failed). `cold_checks`
    lists every check, `cold_check` is the winner's."""
    checks = list(checks or [])
    for check in checks:
        if check["status"] == Status.OK:
            runner.progress.line(
                f"finalist round: trial {check['of']} warmed up in {check['cold_warmup_s']:.1f} s "
                f"cold in the round, reconstructed {check['reconstructed_warmup_s']:.1f} s "
                f"({check['agreement']:+.0%})"
            )
    while (first := _reconstructed_winner(runner.study, verdict, checks)) is not None:
        verdict, check = _measure_cold(runner, verdict, first)
        checks.append(check)
        if check["status"] != Status.OK:
            break
    if not checks:
        return verdict
    winners = [c for c in checks if c["of"] == verdict["winner"]]
    return {**verdict, "cold_checks": checks, "cold_check": (winners or checks)[-1]}


def _reconstructed_winner(study, verdict: dict, checks: list):
    """The verdict's winner where its warm-up was reconstructed and not yet measured cold, else None."""
    row = next((r for r in verdict["candidates"] if r["trial"] == verdict["winner"]), None)
    if row is None or any(c["of"] == row["trial"] for c in checks):
        return None
    first = view_of(study).trials[row["trial"]]
    return first if Record.of(first).warmup_kind == "reconstructed" else None


def _measure_cold(runner: Runner, verdict: dict, first) -> tuple[dict, dict]:
    """One cold run of finalist `first`: its warm-up and score replace its row's (the reconstructed
    warm-up kept beside) and the winner is chosen again; the new verdict and the check."""
    study, progress = runner.study, runner.progress
    row = next(r for r in verdict["candidates"] if r["trial"] == first.number)
    progress.line(f"finalist round: trial {first.number}'s warm-up was reconstructed from cache hits: measured cold")
    trial = new_trial(study)
    trial.set_user_attr("remeasure_of", first.number)
    trial.set_user_attr("cold_check", True)
    if row.get("gpu") is not None:  # on its GPU in a round of several: its speed on that GPU's footing
        trial.set_user_attr("gpu", row["gpu"])
    limit = rerun_limit_s(cold_run_s(first, cold_scale(study)), runner.settings.trial_timeout_s)
    record = runner.run(
        trial,
        dict(Record.of(first).config),
        Role.FINALIST,
        prunable=False,
        limit_s=limit,
        keep_s=-limit,
        first=first,
        cold=True,
        measure=ROUND_MEASURE,
        gpus=row.get("gpu"),
    )
    check = cold_run_check(first, {**record, "trial": trial.number})
    if record["status"] != Status.OK:
        progress.line(
            f"finalist round: the cold run of trial {first.number} ended {record['status']}: its warm-up stays reconstructed"
        )
        return verdict, check
    return _chosen_again(runner, verdict, row, record, check), check


def _chosen_again(runner: Runner, verdict: dict, row: dict, record: dict, check: dict) -> dict:
    """The verdict with finalist `row`'s warm-up the one its cold run measured (`record`, listed as
    `check`), the reconstructed one kept beside, and the winner chosen again; its line says so."""
    study, horizon = runner.study, horizon_of(runner.settings)
    cold_row = {
        **row,
        "warmup_s": record["warmup_s"],
        "reconstructed_warmup_s": row["warmup_s"],
        "warmup_reconstructed": False,
        "reruns": [*row["reruns"], check["trial"]],
    }
    view = runner.look()
    cold_row = pool_row(cold_row, measurements(view.trials, cold_row), verdict["eager_steps_per_s"], horizon)
    rows = [r if r is not row else cold_row for r in verdict["candidates"]]
    eager = view.baseline_trial(Role.EAGER)
    again = {
        **verdict,
        "candidates": rows,
        **choose_winner(
            rows,
            eager.number if eager else None,
            verdict["eager_score"],
            horizon,
            cold_scale(study),
            budget_horizon(study),
            verdict.get("footing"),
        ),
    }
    runner.progress.line(
        f"finalist round: trial {check['of']} warmed up in {record['warmup_s']:.1f} s cold, "
        f"reconstructed {row['warmup_s']:.1f} s ({check['agreement']:+.0%}); " + again["why"]
    )
    return again
