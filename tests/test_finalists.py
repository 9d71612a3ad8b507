"""The finalist round on several GPUs, without running a trial: its finalists split over the GPUs, its
verdict on one footing, and the end the workers share before it."""

import time
from types import SimpleNamespace

import optuna
import pytest

from autocompile.engine import claims
from autocompile.engine.finalists import gpu_footing, split
from autocompile.engine.finalists.verdict import round_verdict, scaled
from conftest import HISTORY


def _trial(number: int, steps_per_s: float, wall_s: float = 10.0, warmup_s: float = 2.0, value: float | None = None):
    attrs = {
        "status": "ok",
        "steps_per_s": steps_per_s,
        "wall_s": wall_s,
        "warmup_s": warmup_s,
        "warmup_steps": 5,
        "cv": 0.01,
        "config": {"compile": bool(number), "n": number},
    }
    return SimpleNamespace(number=number, user_attrs=attrs, value=value or steps_per_s)


def _run(trial: int, steps_per_s: float, gpu: str, warmup_s: float = 2.0) -> dict:
    return {
        "status": "ok",
        "trial": trial,
        "steps_per_s": steps_per_s,
        "warmup_s": warmup_s,
        "warmup_steps": 5,
        "cv": 0.01,
        "cold": False,
        "gpu": gpu,
    }


def test_the_finalists_are_split_over_the_gpus_the_leader_on_the_first():
    """Best first, each finalist goes to the GPU whose planned reruns end first: three of like length on
    two GPUs put the leader and the third on the first; a long leader keeps the first to itself."""
    alike = [_trial(n, 10.0, wall_s=20.0) for n in (1, 2, 3)]
    assert split(alike, 2) == [0, 1, 0] and split(alike, 1) == [0, 0, 0] and split(alike, 3) == [0, 1, 2]
    long_leader = [_trial(1, 10.0, wall_s=100.0), _trial(2, 10.0, wall_s=20.0), _trial(3, 10.0, wall_s=20.0)]
    assert split(long_leader, 2) == [0, 1, 1]


def test_the_verdict_compares_finalists_of_several_gpus_on_the_first_gpus_footing():
    """GPU 1 runs eager 20% slower than GPU 0 (its neighbour's load): its finalist's round speed counts as its
    ratio to GPU 1's eager times GPU 0's. Measured as it ran, the slower GPU's finalist would have lost; on one
    footing it is ahead, and the why says how the GPUs were compared."""
    eager, a, b = _trial(0, 10.0), _trial(1, 15.0), _trial(2, 15.0)
    runs = {0: [_run(10, 10.0, "0"), _run(11, 8.0, "1")], 1: [_run(12, 15.0, "0")], 2: [_run(13, 13.0, "1")]}
    footing = gpu_footing(runs[0], {1: "0", 2: "1"})
    assert footing["reference"] == "0" and footing["scales"] == {"0": 1.0, "1": pytest.approx(1.25)}
    verdict = round_verdict(eager, [a, b], runs, 1, 100_000, 1.0, gpus={1: "0", 2: "1"})
    row_a, row_b = verdict["candidates"]
    assert (row_a["gpu"], row_b["gpu"]) == ("0", "1") and row_b["eager_scale"] == pytest.approx(1.25)
    assert row_b["paces"] == [15.0, pytest.approx(13.0 * 1.25)] and row_a["paces"] == [15.0, 15.0]
    assert verdict["eager_paces"] == [10.0, 10.0]  # eager's: its search run and the reference GPU's round run
    assert verdict["winner"] == 2, verdict["why"]
    assert "the round ran on 2 GPUs at once, GPU 0: trial 1; GPU 1: trial 2" in verdict["why"]
    assert "times GPU 0's eager" in verdict["why"] and "GPU 1's 8 steps/s" in verdict["why"]
    # as measured, without the footing, the slower GPU's finalist would have lost
    as_measured = round_verdict(eager, [a, b], {**runs, 2: [{**runs[2][0], "gpu": "0"}]}, 1, 100_000, 1.0, gpus={1: "0", 2: "0"})
    assert as_measured["winner"] == 1 and "footing" not in as_measured and "GPUs" not in as_measured["why"]
    assert scaled(runs[2][0], 1.0) is runs[2][0]


def test_a_round_on_one_gpu_is_the_round_it_was():
    """Without GPUs (a search on one), the verdict holds no GPU and its rows are as measured."""
    eager, a = _trial(0, 10.0), _trial(1, 15.0)
    runs = {0: [{**_run(10, 9.0, "x"), "gpu": None}], 1: [{**_run(12, 14.0, "x"), "gpu": None}]}
    for x in (*runs[0], *runs[1]):
        del x["gpu"]
    verdict = round_verdict(eager, [a], runs, 1, 100_000, 1.0)
    assert "footing" not in verdict and "gpu" not in verdict["candidates"][0]
    assert verdict["candidates"][0]["paces"] == [15.0, 14.0] and verdict["eager_paces"] == [10.0, 9.0]


def _worker(study, reserve_s: float, remaining_s: float):
    settings = SimpleNamespace(finalists=2, trial_timeout_s=60.0)
    deadline = time.time() + remaining_s
    return SimpleNamespace(study=study, settings=settings, remaining=lambda: deadline - time.time())


def test_a_worker_keeps_working_while_the_round_waits_for_another_workers_trial(monkeypatch):
    """The round starts 100 s before the deadline (its reserve). Another worker's trial, started when the
    reserve was smaller, is expected to end 30 s later than that: this worker keeps only 70 s, and its
    last trial may run until then, not idle; with no such trial, or in a search of one worker, the reserve."""
    monkeypatch.setattr(claims, "finalist_reserve", lambda study, k, limit, gpus=1: 100.0 * (1 if gpus == 1 else 0.5))
    study = optuna.create_study()
    runner = _worker(study, 100.0, 300.0)
    assert claims.kept_for_round(runner, {"gpus": 2}, True) == pytest.approx(50.0)  # the round on 2 GPUs
    other = study.ask()
    other.set_user_attr("expected_end", time.time() + 300.0 - 70.0)
    assert claims.kept_for_round(runner, {}, True) == pytest.approx(70.0, abs=1)
    assert claims.kept_for_round(runner, {}, False) == 100.0  # one worker: no other's trial
    other.set_user_attr("expected_end", time.time() + 60.0)  # ends before the round: the reserve stands
    assert claims.kept_for_round(runner, {}, True) == 100.0
    # what a trial says of its own end: its twins' or a typical trial's time, no later than its limit
    # and what is left before the round
    mine = study.ask()
    claims.expect_end(runner, mine, {"compile": True}, keep=100.0)
    assert mine.user_attrs["expected_end"] == pytest.approx(time.time() + 30.0, abs=1)  # MIN_TRIAL_S: none measured
    claims.expect_end(runner, mine, {"compile": True}, keep=280.0)
    assert mine.user_attrs["expected_end"] == pytest.approx(time.time() + 20.0, abs=1)


def test_on_several_gpus_the_reconstructed_finalists_run_cold_at_once_where_their_gpu_would_wait():
    """lora-8b-3gpu-5 (three H200, 2026-11-28): the round ran trial 14 cold on GPU 0 while GPUs 1 and 2 reran
    trials 41 and 33 warm, then the verdict picked 41 (its warm-up reconstructed) and ran it cold, 104 s more,
    while GPUs 0 and 2 waited. With each GPU's runs estimated, 41's and 33's cold runs end before GPU 0's: all
    three run cold at once. On one GPU, or where a lane would end later, only the pick runs cold."""
    from autocompile.engine.cost import cold_scale
    from autocompile.engine.finalists.plan import cold_pick
    from autocompile.engine.finalists.round import cold_runs

    journal = optuna.storages.journal.JournalFileBackend(f"{HISTORY}/lora-8b-3gpu-5/journal.log")
    study = optuna.load_study(study_name="lora-8b-3gpu-5", storage=optuna.storages.JournalStorage(journal))
    eager, one, two, three = (study.trials[n] for n in (0, 14, 41, 33))
    scale = cold_scale(study)
    assert cold_pick([one, two, three], scale).number == 14
    lanes = [("0", [one]), ("1", [two]), ("2", [three])]
    assert cold_runs(lanes, eager, one, scale) == {14, 41, 33}
    assert cold_runs([("0", [one, two, three])], eager, one, scale) == {14}  # one GPU: the pick alone
    assert cold_runs([("0", [two]), ("1", [one, three])], eager, two, scale) == {41}  # 14 and 33 cold would end later
    assert cold_runs(lanes, eager, None, scale) == set()
    # what the round ran: one cold run in its first pass, and the verdict's second after it
    assert [t.user_attrs.get("remeasure_of") for t in study.trials[76:80] if t.user_attrs.get("cold_check")] == [14, 41]
