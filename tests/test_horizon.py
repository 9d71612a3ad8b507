"""The horizon a search scores at: the user's --horizon-steps, else the steps eager runs in ten times the
search's budget, said at the start and kept in the study; under it the finalist round's tie goes to the
faster steady speed."""

import os

import pytest

from autocompile.engine.finalists.verdict import choose_winner
from autocompile.engine.horizon import RUNS_PER_SEARCH, derived
from autocompile.engine.settings import SearchSettings
from conftest import FAST, PLAIN_GRAPHS, toy


def test_without_horizon_steps_the_horizon_is_what_eager_runs_in_ten_budgets(tmp_path):
    from autocompile.api import run_search
    from autocompile.engine.scoring import score
    from autocompile.engine.study import load_study

    settings = SearchSettings(
        model=toy("toy_fixed"),
        device="cpu",
        study="h",
        directory=str(tmp_path),
        trials=2,
        timeout_s=300,
        trial_timeout_s=120,
        measure=FAST,
        horizon=None,
        finalists=0,
        prune=False,
        fixed={**PLAIN_GRAPHS, "scope": "regional"},
    )
    run_search(settings)
    study = load_study("h", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    eager, compiled = study.trials[0].user_attrs, study.trials[1].user_attrs
    expected = round(eager["steps_per_s"] * RUNS_PER_SEARCH * 300)
    assert study.user_attrs["horizon"] == expected == derived(eager["steps_per_s"], settings)
    assert study.user_attrs["horizon_from"] == "budget" and study.metric_names == [
        f"score at {expected} steps (steps/s, warm-up included)"
    ]
    assert study.trials[1].value == pytest.approx(score(compiled, expected))  # scored at it
    given = SearchSettings(model="m", device="cpu", study="g", directory=str(tmp_path), trials=3, trial_timeout_s=100)
    assert derived(2.0, given) == 2 * RUNS_PER_SEARCH * 300  # no --timeout: its trials at their limit
    assert derived(0.001, given) == 1000  # never below the default


def test_the_budget_s_horizon_breaks_a_tie_by_the_faster_steady_speed():
    """Two finalists within noise of each other: the user's horizon keeps the shorter warm-up; the budget's
    (a run longer than it) goes to the faster steady speed where it is ahead by more than the noise."""
    quick = {"trial": 4, "status": "ok", "score": 5.00, "noise": 0.01, "spread": 0.005, "warmup_s": 30.0, "steps_per_s": 5.10}
    fast = {"trial": 8, "status": "ok", "score": 4.98, "noise": 0.01, "spread": 0.005, "warmup_s": 60.0, "steps_per_s": 5.30}
    users = choose_winner([quick, fast], 0, 1.0, 10000)
    assert users["winner"] == 4 and "shorter warm-up" in users["why"]
    budgets = choose_winner([quick, fast], 0, 1.0, 10000, prefer_speed=True)
    assert budgets["winner"] == 8 and "faster steady speed (3.9% ahead)" in budgets["why"]
    alike = choose_winner([quick, {**fast, "steps_per_s": 5.11}], 0, 1.0, 10000, prefer_speed=True)
    assert alike["winner"] == 4 and "shorter warm-up" in alike["why"]
