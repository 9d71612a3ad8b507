"""The finalist round's cold runs, remembered across studies (engine/knowledge/cold.py), on the records of
the committed GPU studies: the captioner's cold runs took 1.14-1.89 times the seconds their
reconstructed warm-ups added, llama-8b's 0.83-1.06 times (H200, torch 2.11, 2026-11-26)."""

import statistics

import optuna
import pytest

from autocompile.cli import main
from autocompile.engine.knowledge import ColdRuns as ColdMemory
from autocompile.engine.study import SearchSettings, load_study, open_search
from conftest import HISTORY, toy

H200 = ("2.11.0+cu130", "NVIDIA H200")


def _committed(name: str):
    return load_study(name, f"sqlite:///{HISTORY}/{name}/study.db")


def _ratios(name: str) -> list[float]:
    """Each cold run of the study's round over its finalist's measured warm-up, per second the reconstruction added."""
    study = _committed(name)
    out = []
    for t in study.trials:
        if t.user_attrs.get("cold_check") and t.user_attrs["status"] == "ok":
            rebuilt = study.trials[t.user_attrs["remeasure_of"]].user_attrs["reconstruction"]
            out.append((t.user_attrs["warmup_s"] - rebuilt["measured_s"]) / rebuilt["added_s"])
    return out


def test_the_round_plans_its_cold_run_from_what_earlier_cold_runs_of_the_model_took(tmp_path, capsys):
    """captioner-fresh-7 kept 37 s for its leader's cold run (its first run and the seconds its
    reconstruction added), which took 52 s, and left out its third finalist. With what fresh-5's and
    fresh-6's cold runs showed, the estimate of trial 8's cold run is its measured one within 5%."""
    from autocompile.engine.cost import cold_run_s as _cold_run_s, cold_scale
    from autocompile.engine.finalists import cold_check_s, cold_pick, contenders

    path = str(tmp_path / "failures.db")
    for name in ("captioner-fresh-5", "captioner-fresh-6", "llama-8b-fresh-8"):
        assert main(["failures", "--failure-memory", path, "--learn", name, "--dir", HISTORY]) == 0
    assert "and 2 cold runs of the finalist round" in capsys.readouterr().out
    prior = ColdMemory(path, *H200, "captioner").scale()
    expected = statistics.median(_ratios("captioner-fresh-5") + _ratios("captioner-fresh-6"))
    assert prior["runs"] == 3 and prior["scale"] == pytest.approx(expected, abs=1e-3) and 1.5 < expected < 1.7
    assert ColdMemory(path, *H200, "llama-8b").scale()["scale"] == pytest.approx(_ratios("llama-8b-fresh-8")[0], abs=1e-3)
    assert ColdMemory(path, "2.12.0", H200[1], "captioner").scale() is None  # another torch: nothing known
    assert main(["failures", "--failure-memory", path]) == 0
    assert f"[torch 2.11.0+cu130, NVIDIA H200, captioner]: the latest 3 took {expected:.2f}x" in capsys.readouterr().out

    committed = _committed("captioner-fresh-7")
    start = min(t.number for t in committed.trials if t.user_attrs.get("role") == "finalist")
    study = optuna.create_study(directions=committed.directions)
    study.add_trials([t for t in committed.trials if t.number < start])  # as the round found it
    without = cold_check_s(study, 3, 240)
    study.set_user_attr("cold_scale", prior)
    scale = cold_scale(study)
    finalists = contenders(study, 3, 240)
    pick = cold_pick(finalists, scale)
    assert pick.number == 8 == committed.user_attrs["finalists"]["winner"]
    cold_run = next(t for t in committed.trials if t.user_attrs.get("cold_check") and t.user_attrs["remeasure_of"] == 8)
    measured = cold_run.user_attrs["wall_s"]
    assert abs(_cold_run_s(pick, scale) / measured - 1) < 0.05 < abs(_cold_run_s(pick) / measured - 1)
    assert cold_check_s(study, 3, 240) == pytest.approx(without + (scale - 1) * pick.user_attrs["reconstruction"]["added_s"])


def test_a_search_records_the_prior_and_its_round_s_cold_runs_feed_the_memory(tmp_path, capsys):
    """open_search records what the device's earlier cold runs of the model showed (`cold_scale`) and
    says it; the memory, a callback of the search, stores a cold run of the round as it ends."""
    import torch

    model, path = toy("toy"), str(tmp_path / "failures.db")
    settings = SearchSettings(
        model=model, device="cpu", study="s", directory=str(tmp_path), trials=1, trial_timeout_s=60, memory_path=path
    )
    memory = ColdMemory(path, torch.__version__, "cpu", model)
    memory.remember("a", 9, 4, (10.0, 14.0))
    memory.remember("b", 7, 3, (20.0, 36.0))
    runner = open_search(settings)
    assert runner.study.user_attrs["cold_scale"] == {"scale": 1.6, "runs": 2, "from": ["a trial 9", "b trial 7"]}
    assert (
        "plans a cold run at 1.60x the seconds a reconstructed warm-up adds: what 2 earlier cold runs" in capsys.readouterr().err
    )
    stored = [c for c in runner.callbacks if isinstance(c, ColdMemory)]
    assert len(stored) == 1

    study = runner.study  # a reconstructed trial, then its cold run in the round, as the search tells them
    first = optuna.trial.create_trial(
        value=1.0,
        params={},
        distributions={},
        user_attrs={
            "status": "ok",
            "warmup_kind": "reconstructed",
            "warmup_s": 8.0,
            "reconstruction": {"measured_s": 3.0, "added_s": 5.0},
        },
    )
    study.add_trial(first)
    cold = optuna.trial.create_trial(
        value=1.0,
        params={},
        distributions={},
        user_attrs={"status": "ok", "warmup_kind": "cold", "warmup_s": 12.0, "cold_check": True, "remeasure_of": 0},
    )
    study.add_trial(cold)
    stored[0](study, study.trials[1])
    assert ColdMemory(path, torch.__version__, "cpu", model).scale() == {
        "scale": 1.8,
        "runs": 3,
        "from": ["a trial 9", "b trial 7", "s trial 1"],
    }  # 1.4, 1.8 and (12 - 3) / 5
    stored[0](study, study.trials[0])  # not a cold run of the round: nothing stored
    assert ColdMemory(path, torch.__version__, "cpu", model).scale()["runs"] == 3
