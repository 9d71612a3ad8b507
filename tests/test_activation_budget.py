"""The activation memory budget (AOTAutograd's partitioner recomputes what it does not keep): a
dimension only where memory is the constraint, searched and emitted like any other."""

import os

from autocompile.api import run_search
from autocompile.engine.studyview import baseline_value
from autocompile.engine.study import SearchSettings, build_space, load_study, memory_bound
from conftest import FAST, HISTORY, PLAIN_GRAPHS, toy

# Everything but the budget pinned: the model's graphs as plain torch.compile's, each block apart,
# and the optimizer step as one compiled foreach_map function (the search runs it too, in the recipe
# and the neighbour).
ONLY_THE_BUDGET = {
    **PLAIN_GRAPHS,
    "scope": "regional",
    "compile_optimizer": False,
    "fused_optimizer": False,
    "compile_loss": False,
    "foreach_map_optimizer": True,
}


def test_the_budget_is_offered_only_where_memory_is_the_constraint():
    free = build_space("tiny-llama", "cpu")
    assert "activation_memory_budget" not in {d.name for d in free.dimensions}
    assert any(name == "activation_memory_budget" and "memory is not the constraint" in why for name, why in free.left_out)
    bound = build_space("tiny-llama", "cpu", memory_bound=memory_bound(20.0, "cpu"))
    [dim] = [d for d in bound.dimensions if d.name == "activation_memory_budget"]
    assert dim.choices == (None, 0.8, 0.5, 0.2, 0.05) and "--max-memory-gb 20" in dim.help
    assert memory_bound(None, "cpu") is None  # no limit, no device memory to be near


def test_a_configuration_over_the_memory_limit_is_measured_again_with_a_lower_budget(tmp_path):
    """Every configuration needs more than the limit (llama-8b-60gb's recipes ran at 64-75 GB, H200,
    2026-11-26): with no incumbent to move from, the fastest one over the limit comes back with the
    lowest budget, a neighbour of it; it runs, and its snippet sets the budget before compiling."""
    settings = SearchSettings(
        model=toy("toy_fixed"),
        device="cpu",
        study="over",
        directory=str(tmp_path / "studies"),
        trials=4,
        trial_timeout_s=300,
        measure=FAST,
        horizon=100_000,
        finalists=0,
        prune=False,
        max_memory_gb=0.001,
        fixed=ONLY_THE_BUDGET,
    )
    run_search(settings)
    study = load_study("over", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    over = {t.number for t in study.trials if t.user_attrs.get("over_memory_gb")}
    recipe = next(r for r in study.trials if r.user_attrs.get("role") == "recipe")
    assert recipe.number in over and recipe.user_attrs["config"]["foreach_map_optimizer"], recipe.user_attrs.get("reason")
    [t] = [t for t in study.trials if t.user_attrs.get("role") == "neighbour"]
    assert t.user_attrs["changed"] == ["activation_memory_budget"] and t.user_attrs["parent"] in over
    assert t.user_attrs["config"]["activation_memory_budget"] == 0.8  # one rung down the ladder from the parent's
    assert t.user_attrs["over_memory_gb"] and t.user_attrs["steps_per_s"]  # still over 1 MB on the CPU, but it ran
    assert not t.user_attrs["numerics"]["differs"], t.user_attrs["numerics"]  # and the pinned step within the guard
    with open(os.path.join(settings.study_dir, "trials", f"{t.number:04d}", "apply_compilation.py")) as f:
        snippet = f.read()
    assert "ACTIVATION_MEMORY_BUDGET = 0.8" in snippet
    assert "torch._functorch.config.activation_memory_budget = ACTIVATION_MEMORY_BUDGET" in snippet
    assert "foreach_map_step(optimizer)" in snippet
    from autocompile.engine.strategy import effects
    from autocompile.outputs.table import format_effects

    [effect] = [e for e in effects(study) if e["trial"] == t.number]
    assert effect["over_limit"] and effect["peak_mem_gb"] == (
        study.trials[effect["parent"]].user_attrs["peak_mem_gb"],
        t.user_attrs["peak_mem_gb"],
    )
    # (its parent: the recipe, or plain torch.compile where that ran faster on this machine)
    assert "activation_memory_budget null -> 0.8" in format_effects([effect])
    assert ": still over the memory limit, peak " in format_effects([effect])
    # eager ran over the limit too: its measured speed is still the ratios' reference
    eager = next(e for e in study.trials if e.user_attrs.get("role") == "eager")
    assert eager.number in over and baseline_value(study, "eager", "steps_per_s") == eager.user_attrs["steps_per_s"]


def test_a_search_where_nothing_fits_says_the_least_memory_any_configuration_needed():
    """llama-8b-60gb's first run (H200, 2026-11-26): its 12 trials ran at 64-75 GB against a 60 GB
    limit, and it ended with "no trial ran cleanly yet"; the line now says what would fit."""
    import optuna

    from autocompile.outputs.table import no_winner_line, trial_rows

    committed = load_study("llama-8b-60gb", f"sqlite:///{HISTORY}/llama-8b-60gb/study.db")
    first_run = optuna.create_study(direction="maximize")
    first_run.add_trials([t for t in committed.trials if t.number <= 11])
    line = no_winner_line(trial_rows(first_run), "trials", 60.0)
    assert line.startswith("no configuration fit --max-memory-gb 60: the least any needed was 64.07 GB (trial 3, ")
    assert no_winner_line(trial_rows(first_run), "trials", None).startswith("no trial ran cleanly yet")


def test_the_fitting_move_steps_down_the_ladder_and_skips_rungs_the_measured_peaks_rule_out():
    """One budget measured: the next rung down. Two: the line through them predicts which rung fits (a LoRA
    fine-tune of the 8B Llama, its own checkpointing off: 51.7 GB at 0.5, 36.2 at 0.2, 25.9 at 0.05, against
    eager's 28.4 as built; H200, 2026-11-27)."""
    from autocompile.engine.strategy import _rung

    lower = [0.2, 0.05]
    assert sorted(lower, key=lambda v: _rung(v, lower, {0.5: 51.7}, 28.4)) == [0.2, 0.05]
    assert sorted(lower, key=lambda v: _rung(v, lower, {0.5: 51.7, 1.0: 91.0}, 26.0)) == [0.05, 0.2]
    assert sorted(lower, key=lambda v: _rung(v, lower, {0.5: 51.7, 1.0: 91.0}, 40.0)) == [0.2, 0.05]
