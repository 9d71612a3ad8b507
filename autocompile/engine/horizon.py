"""The horizon a search scores at: the user's --horizon-steps, else what the search's budget says of the
training run it serves.

A score is the speed over a run of H steps that starts cold (`scoring.score`), so H says how much a warm-up
weighs. A search worth half an hour serves a training run far longer than a thousand steps: without
--horizon-steps, the horizon is the steps eager runs in RUNS_PER_SEARCH times the search's budget, taken
from the first trial that measures a speed (the eager baseline) and kept in the study.
"""

from __future__ import annotations

import warnings

import optuna

from autocompile.engine.scoring import DEFAULT_HORIZON

RUNS_PER_SEARCH = 10  # a search pays for itself against a training run at least this many times longer


def budget_s(settings) -> float:
    """The search's budget in seconds: --timeout, else its trials at their limit."""
    return settings.timeout_s or settings.trials * settings.trial_timeout_s


def derived(steps_per_s: float, settings) -> int:
    """The steps a run at `steps_per_s` makes in RUNS_PER_SEARCH times the search's budget (at least the
    default horizon)."""
    return max(DEFAULT_HORIZON, round(steps_per_s * RUNS_PER_SEARCH * budget_s(settings)))


def settle(runner, record: dict) -> None:
    """Where the horizon is the budget's and not yet known, take it from `record`'s steady speed (the first
    speed the search measures, eager's): set it for the search, keep it in the study, and say so."""
    settings, study = runner.settings, runner.study
    if settings.horizon is not None or not record.get("steps_per_s"):
        return
    settings.horizon = derived(record["steps_per_s"], settings)
    study.set_user_attr("horizon", settings.horizon)
    study.set_user_attr("horizon_from", "budget")
    name_objective(study, settings.horizon)
    runner.progress.line(
        f"horizon: {settings.horizon} steps, what {record['steps_per_s']:.3g} steps/s ({_who(record)}) runs in "
        f"{RUNS_PER_SEARCH} times this search's budget of {budget_s(settings):.0f} s; --horizon-steps to say "
        "how long your training run is"
    )


def _who(record: dict) -> str:
    return "eager's" if not (record.get("config") or {}).get("compile", True) else "the first trial measured"


def resume(settings, study) -> None:
    """A resumed study's (or a joining worker's) horizon: the one it keeps, where none is given."""
    if settings.horizon is None and study.user_attrs.get("horizon"):
        settings.horizon = study.user_attrs["horizon"]


def scoring(settings) -> int:
    """The horizon to score and prune at now: the search's, or the default until the budget's is known."""
    return settings.horizon or DEFAULT_HORIZON


def name_objective(study, horizon: int | None) -> None:
    """The objective's name where Optuna shows it (the dashboard's history plot said "Objective 0")."""
    at = f"{horizon} steps" if horizon else "the horizon the search's budget gives"
    name = f"score at {at} (steps/s, warm-up included)"
    if study.metric_names != [name]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([name])


def budget_horizon(study) -> bool:
    """Whether the study's horizon is the budget's, not the user's: the finalist round then prefers the faster
    steady speed between two finalists within noise (finalists.verdict, WINNER_RULE 6)."""
    return study.user_attrs.get("horizon_from") == "budget"
