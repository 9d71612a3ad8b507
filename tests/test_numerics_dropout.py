"""The numerics guard on a model with dropout p = 0.3, through a search as a user runs it (autocompile.search).

Two draws of dropout's masks move this model's loss by more than a 3% error in its output does,
so comparing first losses of runs whose masks differ decides by chance. The guard replays the
first steps with the same random stream on both sides; under three seeds a correct compile passes
and a compile whose output is 3% off is infeasible (the scaled variant: tests/test_numerics_scaled.py).
"""

import json

import pytest

from autocompile.engine.scoring import compare_losses
from conftest import FAST, numerics_of_plain_compile, plain_compile_record, toy

SEEDS = range(3)  # each seed a search of its own (about 30 s on 2 cores); seed 0's has a finalist round


@pytest.fixture(scope="module")
def with_a_round(tmp_path_factory):
    """A search of two trials and a round (`--trials 2 --finalists 1`) from Python, as a user runs it,
    on the dropout toy under seed 0 (eager, plain torch.compile, then the round: eager and plain
    torch.compile again); its folder and its progress. Plain torch.compile's first run is seed 0's
    measurement of the test below. FAST windows, the round's too: its 2-s windows (finalists.
    ROUND_MEASURE) measure speed, which is not under test here."""
    import contextlib
    import io

    import autocompile

    from autocompile.engine.finalists import round as finalists

    folder = tmp_path_factory.mktemp("round")
    progress = io.StringIO()
    # one rerun of plain torch.compile, never a third with eager beside it (FAST's windows disagree
    # far on a loaded host); the third has a test of its own (test_study.py)
    with contextlib.redirect_stderr(progress), pytest.MonkeyPatch.context() as patch:
        patch.setattr(finalists, "FAR_FLOOR", float("inf"))
        autocompile.search(
            toy("toy_dropout"), trials=2, device="cpu", study="s", directory=str(folder), finalists=1, seed=0, measure=FAST
        )
    return folder, progress.getvalue()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_correct_compile_of_a_model_with_dropout_passes_under_every_seed(tmp_path, seed, request):
    if seed == 0:  # the round's search: its trial 1 is plain torch.compile's first run, measured as in any search
        folder, _ = request.getfixturevalue("with_a_round")
        record = plain_compile_record(folder)
    else:
        record = numerics_of_plain_compile(tmp_path, "toy_dropout", seed)
    assert record["rng_dependent"] is True
    assert record["status"] == "ok", record["reason"]
    numerics = record["numerics"]
    assert numerics["method"] == "replay" and not numerics["differs"]
    assert numerics["max_rel_diff"] < 1e-4, json.dumps(numerics)
    # What the guard compared before: the measured run's first losses against eager's, drawn with
    # other masks. Chance alone puts them beyond the tolerance, under every seed.
    assert compare_losses(record["losses"], record["eager_losses"], "cpu")["differs"]


def test_a_finalists_rerun_starts_from_its_first_runs_code_and_carries_its_replay(with_a_round):
    """The finalist round measures speed again, not compile: plain torch.compile's rerun loads the code
    its first run compiled (cache hits where the first run missed), carries that run's cold warm-up
    and its numerics replay (a replay of its own is not run), and is judged by them."""
    import os

    from autocompile.engine.records import full_record
    from autocompile.engine.study import load_study

    folder, progress = with_a_round
    assert "each starts from the code its first run compiled" in progress, progress
    study_dir = str(folder / "s")
    study = load_study("s", "sqlite:///" + os.path.join(study_dir, "study.db"))
    rerun, *third = [t for t in study.trials if t.user_attrs.get("remeasure_of") == 1]
    assert len(third) <= 1  # measured a third time where its two runs disagreed far (finalists.far_apart)
    first, again = full_record(study.trials[1], study_dir), full_record(rerun, study_dir)
    assert first["replay"]["version"] and again["status"] == "ok"
    assert again["warmup_carried_from"] == 1 and again["warmup_s"] == first["warmup_s"] and "warm_warmup_s" in again
    assert again["replay_carried_from"] == 1 and again["numerics"]["method"] == "replay"
    # whether the loss depends on the random stream: found by trial 1's check, carried (no check of its own)
    assert again["rng_dependent"] is True and again["rng_dependent_from"] == 1 and "rng_dependent_from" not in first
    events = [(folder / "s" / "trials" / f"{n:04d}" / "events.jsonl").read_text() for n in (1, rerun.number)]
    assert "checking randomness" in events[0] and "checking randomness" not in events[1]
    with open(os.path.join(study_dir, "trials", f"{rerun.number:04d}", "spec.json")) as f:
        spec = json.load(f)
    assert spec["numerics_replay"] is False
    counted = lambda record, kind: sum(n for k, n in record["compile_caches"].items() if k.endswith(kind))  # noqa: E731
    assert counted(again, "_hit") > 0 and counted(again, "_miss") < counted(first, "_miss")
    # the finalist keeps its caches for a resumed search's round; eager compiled nothing
    assert os.path.isdir(os.path.join(study_dir, "trials", "0001", "cache"))
    assert not os.path.isdir(os.path.join(study_dir, "trials", "0000", "cache"))


def test_the_replay_loads_the_optimizer_step_the_measured_run_compiled(tmp_path):
    """The replay's models are compiled again (dropout off, Inductor's fallback_random on), but its
    compiled optimizer step draws nothing random: compiled with the measured run's settings, it
    loads that run's code (a cache hit, no miss) instead of compiling the step again (on the
    captioner, 100-150 s cold on an H100), and the numerics still agree. Whether the loss depends on
    the random stream is given, as an earlier trial of a study passes it (engine/learned.py): the
    trial does not check it again, and still replays."""
    import copy

    from autocompile.space import DEFAULTS
    from autocompile.trial import TrialRequest, run_trial

    config = copy.deepcopy(DEFAULTS)
    config["compile_optimizer"] = True
    events = []
    record = run_trial(
        TrialRequest(
            model=toy("toy_dropout"),
            config=config,
            device="cpu",
            trial_dir=str(tmp_path / "t"),
            timeout_s=300,
            measure={**FAST, "rng_dependent": {"value": True, "from": 7}},
        ),
        on_event=events.append,
    )
    assert record["status"] == "ok" and record["rng_dependent"] and record["rng_dependent_from"] == 7, record["reason"]
    assert "checking randomness" not in [e.get("phase") for e in events] and "eager_first_loss" not in record
    replay = record["replay"]
    hits = {k: n for k, n in replay["trial_step_caches"].items() if k.endswith("_hit")}
    misses = {k: n for k, n in replay["trial_step_caches"].items() if k.endswith("_miss")}
    assert hits and not misses, replay["trial_step_caches"]
    assert max(abs(a - b) / abs(b) for a, b in zip(replay["trial"], replay["eager"])) < 1e-4
