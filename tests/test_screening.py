"""Screening: a model cut to k blocks trains, a screened search promotes or prunes through Optuna's
successive halving, and screen-check ranks a study's configurations against their screens."""

import json
import os

import optuna
import pytest

from autocompile import cli
from autocompile.outputs.screencheck import check_screening, ranks, spearman, write_check
from autocompile.errors import UserError
from autocompile.engine.screening import ScreeningPruner, check_blocks
from autocompile.trial.screened import cut_blocks, screened
from autocompile.api import run_search
from autocompile.engine.study import SearchSettings, load_study
from autocompile.workloads import WorkloadOptions, get_workload
from conftest import FAST, ROOT, toy

DEEP = toy("toy_deep")

# A promoted configuration is measured with cold caches of its own (every Inductor compile a miss),
# which the session's graph cache would turn into hits.
pytestmark = pytest.mark.usefixtures("cold_graphs")
K = 2


def test_spearman_matches_a_worked_example():
    # Ties share the average of their ranks (1 for the highest).
    assert ranks([10, 20, 20, 5]) == [3.0, 1.5, 1.5, 4.0]
    # Without ties, rho = 1 - 6 * sum(d^2) / (n (n^2 - 1)): d = 1, 1, 0, 1, 1 -> 1 - 24 / 120 = 0.8.
    assert spearman([1, 2, 3, 4, 5], [2, 1, 3, 5, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 5, 4]) == pytest.approx(0.8)
    assert spearman([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [7, 7, 7]) is None  # no ranking on one side
    # With ties, Pearson's r of the average ranks (1, 2.5, 2.5, 4, 5) and (1, 4, 2.5, 2.5, 5): 7.25 / 9.5.
    assert spearman([1, 2, 2, 3, 4], [1, 3, 2, 2, 5]) == pytest.approx(7.25 / 9.5)


def test_a_screened_model_has_k_blocks_and_trains():
    options = WorkloadOptions(device="cpu", seed=0)
    full, _ = get_workload(DEEP).build(options)
    workload = screened(get_workload(DEEP), K)
    model, optimizer = workload.build(options)
    assert len(full.blocks) == 6 and len(model.blocks) == K
    # The optimizer holds exactly the parameters the cut model has (the cut blocks' are gone).
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in model.parameters()}
    assert optimizer.param_groups[0]["lr"] == 1e-3
    batch = workload.batches(options, 1)[0]
    losses = []
    for _ in range(5):
        loss = workload.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert cut_blocks(model, K) == {}  # nothing longer than K is left


def test_the_builtin_workloads_are_built_with_k_blocks():
    options = WorkloadOptions(device="meta", blocks=K)
    llama, _ = get_workload("llama-8b").build(options)
    assert len(llama.model.layers) == K
    captioner, _ = get_workload("captioner").build(options)
    assert len(captioner.encoder.layers) == K and len(captioner.decoder.transformer.h) == K


def test_the_pruner_promotes_the_top_half_of_the_screens():
    study = optuna.create_study(direction="maximize", pruner=ScreeningPruner(K))
    verdicts = []
    for value in (1.0, 0.5, 2.0, 0.9):
        trial = study.ask()
        trial.report(value, K)
        verdicts.append(trial.should_prune())
        if verdicts[-1]:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:  # promoted: its full trial ran cleanly with that score
            trial.set_user_attr("status", "ok")
            study.tell(trial, value)
    # The first goes on; 0.5 is below 1.0; 2.0 is the best; 0.9 is not in the top half of four.
    assert verdicts == [False, True, False, True]
    # A full trial's later steps are judged by CannotWinPruner: below the best score (2.0), pruned.
    trial = study.ask()
    trial.report(3.0, K)
    assert not trial.should_prune()
    trial.report(1.5, K + 1)
    assert trial.should_prune()


def test_a_screen_below_the_top_half_is_told_pruned(tmp_path, monkeypatch):
    """The search's side of a pruned screen, its measurements stubbed (the real ones are below):
    told PRUNED with its reason and screen, the callbacks called, no full trial started."""
    import autocompile.engine.screening as screening
    from autocompile.engine.runner import Progress, Runner

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize", pruner=ScreeningPruner(K))
    from autocompile.engine.storage import this_boot

    study.set_user_attr("screened_eager", {str(K): {"steps_per_s": 100.0, "boot": this_boot()}})  # this machine's
    speeds = iter([150.0, 50.0])
    monkeypatch.setattr(
        screening,
        "run_trial",
        lambda request, **kw: {"status": "ok", "steps_per_s": next(speeds), "wall_s": 1.0, "config": request.config},
    )
    settings = SearchSettings(model=DEEP, device="cpu", study="p", directory=str(tmp_path), screen=K)
    told = []
    runner = Runner(study, storage, "memory", settings, Progress(2), None, callbacks=[lambda s, t: told.append(t)])
    config = {"compile": True, "scope": "regional"}
    first, second = study.ask(), study.ask()
    assert screening.screen_trial(runner, first, config, "recipe", K) is True  # the first screen goes on
    assert screening.screen_trial(runner, second, config, "search", K) is False
    pruned = study.trials[second.number]
    assert pruned.state == optuna.trial.TrialState.PRUNED and told == [pruned]
    assert pruned.user_attrs["reason"] == f"screened at {K} blocks: 0.5x eager, below the top half of the screened trials"
    assert pruned.user_attrs["screen"]["score"] == 0.5 and not pruned.user_attrs["screen"]["promoted"]
    assert pruned.intermediate_values == {K: 0.5}


def test_bad_screen_values_end_in_one_line(tmp_path, capsys):
    assert cli.main(["search", "--model", DEEP, "--device", "cpu", "--screen", "1", "--dir", str(tmp_path)]) == 2
    assert cli.main(["search", "--model", DEEP, "--device", "cpu", "--screen", "6", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "at least 2" in err[0] and "blocks: 6" in err[1] and "give fewer" in err[1]
    with pytest.raises(UserError, match="no repeated blocks"):
        check_blocks("m", K, {})


@pytest.fixture(scope="module")
def screened_study(tmp_path_factory):
    """A search with --screen 2 on the six-block toy: eager and plain torch.compile in full, then a
    recipe screened first. Under --no-prune, a full trial is not pruned (compiled, this toy is often
    slower than eager on a CPU), so the study has three configurations for a check."""
    folder = tmp_path_factory.mktemp("screen")
    settings = SearchSettings(
        model=DEEP,
        device="cpu",
        study="s",
        directory=str(folder),
        trials=3,
        finalists=0,
        trial_timeout_s=120,
        baseline_timeout_s=600,
        measure=FAST,
        screen=K,
        prune=False,
    )
    run_search(settings)
    return folder, load_study("s", "sqlite:///" + str(folder / "s" / "study.db"))


def test_a_screened_search_promotes_through_the_pruner(screened_study):
    folder, study = screened_study
    eager_k = study.user_attrs["screened_eager"][str(K)]
    assert eager_k["steps_per_s"] > 0
    eager, plain, recipe = study.trials[:3]
    assert "screen" not in eager.user_attrs and "screen" not in plain.user_attrs  # baselines run in full
    screen = recipe.user_attrs["screen"]
    assert screen["blocks"] == K and screen["status"] == "ok", screen
    # Its screened score went to Optuna at step K, and successive halving kept it (the first screen).
    assert recipe.intermediate_values[K] == pytest.approx(screen["steps_per_s"] / eager_k["steps_per_s"])
    assert recipe.system_attrs["completed_rung_0"] == recipe.intermediate_values[K] and screen["promoted"]
    assert os.path.exists(folder / "s" / "trials" / f"{recipe.number:04d}" / "screen" / "result.json")
    # Promoted: measured in full, with cold caches of its own (every compile missed, none hit the screens').
    assert recipe.state == optuna.trial.TrialState.COMPLETE and recipe.user_attrs["status"] == "ok"
    caches = recipe.user_attrs["compile_caches"]
    assert caches.get("fxgraph_cache_miss", 0) > 0 and not caches.get("fxgraph_cache_hit")
    assert recipe.user_attrs["steps_per_s"] != screen["steps_per_s"]


def test_screen_check_writes_the_table_with_rho(screened_study):
    folder, study = screened_study
    result = check_screening(study, str(folder), K, trial_timeout_s=120, measure=FAST, command="(test)")
    md, _ = write_check(result, str(folder / "s"))
    assert result["ranked"] == 3
    assert -1.0 <= result["rho"] <= 1.0
    by = {row["role"]: row for row in result["rows"]}
    assert by["eager"]["screened"] == 1.0
    assert by["recipe"]["screen_from"] == "search"  # the search's own screen, as its pruner saw it
    assert by["compile-defaults"]["screen_from"] == "check" and by["compile-defaults"]["screened"] > 0
    assert os.path.exists(folder / "s" / "screens" / f"check-{K}-blocks" / "0001" / "result.json")
    table = open(md).read()
    assert f"rho = {result['rho']:.2f}" in table and "(test)" in table
    assert result["rho_without_cuda_graphs"] == result["rho"]  # no CUDA-graph mode on the CPU
    assert table.count("\n| ") == 1 + result["configurations"]  # the header and one row each


def test_rho_without_the_cuda_graph_modes():
    # llama-8b's check at 4 blocks (H200, 2026-11-23): its two reduce-overhead configurations rank 5th
    # and 6th screened and last in full; without them the screens rank the other seven well.
    from autocompile.outputs.screencheck import correlations

    with open(os.path.join(ROOT, "tests", "data", "llama-8b-screening-4-blocks.json")) as f:
        rows = json.load(f)["rows"]
    found = correlations(rows)
    assert len(rows) == 9 and found["ranked_without_cuda_graphs"] == 7
    assert found["rho"] == pytest.approx(0.683, abs=1e-3)
    assert found["rho_without_cuda_graphs"] == pytest.approx(0.893, abs=1e-3)
    assert correlations(rows[:2])["rho"] is None  # too few to rank


def test_screen_check_uses_an_earlier_checks_screens_and_joins_studies_of_the_same_workload(screened_study):
    import shutil

    folder, study = screened_study
    first = check_screening(study, str(folder), K, trial_timeout_s=120, measure=FAST, command="(test)")
    write_check(first, str(folder / "s"))
    shutil.rmtree(folder / "s" / "screens" / f"check-{K}-blocks", ignore_errors=True)
    lines = []
    again = check_screening(study, str(folder), K, trial_timeout_s=120, measure=FAST, command="(test)", say=lines.append)
    plain = {row["role"]: row for row in again["rows"]}["compile-defaults"]
    assert plain["screen_from"] == "check" and plain["screened"] == pytest.approx(
        {row["role"]: row for row in first["rows"]}["compile-defaults"]["screened"]
    )
    assert not os.path.exists(folder / "s" / "screens" / f"check-{K}-blocks")  # nothing measured again
    assert any("used again" in line for line in lines)
    # Another study of the same workload joins; a configuration both hold counts once, from the first.
    url = "sqlite:///" + str(folder / "s" / "study.db")
    optuna.copy_study(from_study_name="s", from_storage=url, to_storage=url, to_study_name="s2")
    other = load_study("s2", url)
    joined = check_screening(study, str(folder), K, trial_timeout_s=120, measure=FAST, others=[other], say=lines.append)
    assert len(joined["rows"]) == len(again["rows"]) and {row["study"] for row in joined["rows"]} == {"s"}
    other.set_user_attr("settings", {**study.user_attrs["settings"], "batch_size": 99})
    with pytest.raises(UserError, match="same workload"):
        check_screening(study, str(folder), K, others=[other], measure=FAST)
    # On another machine (a new lease of the GPU: leased machines share the host name "vm") eager at k
    # is measured again there, and an earlier check's screen keeps its ratio against its own machine's
    # eager (the captioner's eager at 3 blocks moved with the machine, H200, 2026-11-23).
    stored = study.user_attrs["screened_eager"]
    study.set_user_attr("screened_eager", {n: {**e, "boot": "another lease"} for n, e in stored.items()})
    lines.clear()
    moved = check_screening(study, str(folder), K, trial_timeout_s=120, measure=FAST, say=lines.append)
    assert any("measured again" in line for line in lines)
    assert os.path.exists(folder / "s" / "screens" / f"check-{K}-blocks" / "eager" / "result.json")
    plain = {row["role"]: row for row in moved["rows"]}["compile-defaults"]
    assert plain["screened"] == {row["role"]: row for row in first["rows"]}["compile-defaults"]["screened"]
    assert moved["eager"]["boot"] and moved["eager"]["from"] == "check"


def test_screen_check_needs_three_configurations(tmp_path, capsys):
    storage = "sqlite:///" + str(tmp_path / "s" / "study.db")
    os.makedirs(tmp_path / "s")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr("settings", {"model": DEEP, "device": "cpu", "batch_size": None, "seq_len": None, "seed": 0})
    assert cli.main(["screen-check", "--study", "s", "--dir", str(tmp_path), "--blocks", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0 distinct configurations" in err[0] and "at least 3" in err[0]
    # Three compiled configurations but no eager baseline: nothing to compare their full scores with.
    for number, scope in enumerate(("full", "regional", "modular")):
        study.add_trial(
            optuna.trial.create_trial(
                value=10.0 + number,
                user_attrs={"config": {"compile": True, "scope": scope}, "status": "ok", "role": "recipe", "steps_per_s": 11.0},
            )
        )
    assert cli.main(["screen-check", "--study", "s", "--dir", str(tmp_path), "--blocks", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no eager baseline" in err[0]
