"""What the search proposes after its recipes, and what it refuses before launch (real searches of a toy)."""

import dataclasses
import json
import os

import optuna
import pytest

from autocompile.space import DEFAULTS
from autocompile.api import run_search
from autocompile.engine.study import SearchSettings, build_space
from autocompile.outputs.table import format_summary
from conftest import FAST, HISTORY, toy

# Every dimension pinned but Inductor's fusion options: the recipes collapse into plain
# torch.compile (measured as a baseline), so the search goes from the baselines to the neighbours.
PINS = {
    "scope": "full",
    "mode": "default",
    "dynamic": None,
    "fullgraph": False,
    "compile_optimizer": False,
    "fused_optimizer": False,
    "compile_loss": False,
    "padding": "longest",
    "mark_dynamic": "off",
    "inductor.shape_padding": True,
    "compiled_autograd": False,
    "foreach_map_optimizer": False,
}


def test_a_doomed_configuration_is_refused_with_its_reason():
    space = build_space(toy(), "cpu")
    low, high = space.traits.lengths
    assert 8 <= low <= high == 48
    static = {**DEFAULTS, "dynamic": False}
    reason = space.rejection({**static, "padding": "longest"})
    assert reason.startswith("dynamic=False compiles each distinct length anew") and "recompile limit of 8" in reason
    assert space.rejection({**static, "padding": "max"}) is None  # one shape
    assert space.rejection({**static, "padding": "multiple", "pad_multiple": 64}) is None  # one or two shapes
    assert space.rejection({**static, "padding": "longest", "recompile_limit": 64}) is None  # a higher limit
    assert space.rejection({**DEFAULTS, "padding": "longest"}) is None  # automatic dynamic shapes


def _neighbours_settings(directory: str) -> SearchSettings:
    return SearchSettings(
        model=toy("toy_fixed"),  # one length: each graph compiled once, none recompiled for another length
        device="cpu",
        study="n",
        directory=directory,
        trials=3,
        trial_timeout_s=300,
        measure=FAST,
        horizon=100_000,
        finalists=0,
        prune=False,
        fixed=PINS,
    )


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory):
    """Eager, plain torch.compile (the whole model: PINS has scope "full") and one neighbour."""
    settings = _neighbours_settings(str(tmp_path_factory.mktemp("n")))
    return {**run_search(settings), "directory": settings.directory}


def test_neighbours_change_one_dimension_of_the_incumbent_and_record_their_parent(neighbours):
    rows = neighbours["rows"]
    assert [r["role"] for r in rows[:3]] == ["eager", "compile-defaults", "neighbour"]
    effects = neighbours["effects"]
    assert effects and effects[0]["trial"] == 2 and effects[0]["parent"] == 1  # plain torch.compile was the incumbent
    ((name, (before, after)),) = effects[0]["changed"].items()  # one dimension, nothing it conditions here
    assert before != after and name not in PINS
    assert ("effect" in effects[0]) == (rows[2]["status"] == "ok")
    assert "what each setting did" in format_summary(neighbours) and f"trial 2 (from 1): {name}" in format_summary(neighbours)


def test_an_effect_measured_on_another_machine_than_its_parent_says_so(neighbours):
    # Leased GPU machines share one host name ("vm"). captioner-regional resumed on a new lease (H200,
    # 2026-11-23): its trial 8 read -23.8% against trial 2, measured on a machine whose host ran the
    # captioner's eager at 13.3 steps/s where others ran it at 8.2.
    import copy

    from autocompile.outputs.table import format_effects
    from autocompile.engine.storage import this_boot
    from autocompile.engine.strategy import effects
    from autocompile.engine.study import load_study

    ran = load_study("n", f"sqlite:///{neighbours['directory']}/n/study.db")
    child = effects(ran)[0]["trial"]
    assert ran.trials[child].user_attrs["worker"]["boot"] == this_boot() is not None  # each trial says where it ran
    assert not any(row.get("other_machine") for row in effects(ran))
    trials = [copy.deepcopy(t) for t in ran.trials]
    trials[child].user_attrs["worker"] = {**trials[child].user_attrs["worker"], "boot": "another lease"}
    moved = optuna.create_study(direction="maximize")
    moved.add_trials(trials)
    (row,) = [r for r in effects(moved) if r["trial"] == child]
    assert row["other_machine"] and "different machines" in format_effects([row])


def test_a_configuration_whose_scope_did_not_warm_up_within_the_trial_limit_is_not_launched(neighbours, tmp_path):
    # plain torch.compile (whole model) takes seconds to warm up on the CPU under its generous
    # baseline limit; resumed under a trial limit of a third of that warm-up (whatever this
    # machine's speed), every whole-model configuration is expected not to fit, and is refused at
    # no cost instead of spending the limit to find out. The neighbours' search, whose dimensions
    # pin the whole model, resumed from a copy (so the tests above read it as it ran).
    import shutil

    rows = neighbours["rows"]
    assert [r["role"] for r in rows[:2]] == ["eager", "compile-defaults"] and rows[1]["status"] == "ok"
    assert rows[1]["config"].startswith("full")
    shutil.copytree(neighbours["directory"], tmp_path / "n-copy")
    limit = rows[1]["warmup_s"] / 3
    resumed = dataclasses.replace(
        _neighbours_settings(str(tmp_path / "n-copy")), trials=2, trial_timeout_s=limit, baseline_timeout_s=300
    )  # 2 more
    refused = run_search(resumed)["rows"][len(rows) :]
    assert len(refused) == 2 and all(r["status"] == "infeasible" and r["wall_s"] == 0 for r in refused)
    assert all(r["config"].startswith("full") for r in refused)
    said = f"expected not to fit the {limit:.0f} s trial limit: trial 1 (full, default) took"
    assert all(said in r["reason"] for r in refused), refused


def test_too_slow_takes_evidence_only_from_trials_compiling_no_more_than_the_candidate():
    # the shape of llama-8b's trials 19 and 21 (H200, 2026-11-23): regional max-autotune with a
    # compiled step and loss was still compiling after 300 s; its no-CUDA-graph twin then spent
    # its limit too. Recorded trials (as a search records them), judged without a run.
    from autocompile.engine.cost import too_slow

    study = optuna.create_study(direction="maximize")
    slow = {"compile": True, "scope": "regional", "mode": "max-autotune", "compile_optimizer": True, "compile_loss": True}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            user_attrs={
                "config": slow,
                "status": "timeout",
                "wall_s": 300.0,
                "reason": "no result within the 300 s limit (while compiling)",
            },
        )
    )
    twin = {**slow, "mode": "max-autotune-no-cudagraphs"}
    assert "trial 0 (regional, max-autotune) was still compiling after 300 s" in too_slow(study, twin, 300)
    assert too_slow(study, twin, 600) is None  # a longer limit may hold it
    assert too_slow(study, {**twin, "compile_loss": False}, 300) is None  # the evidence compiled more
    assert too_slow(study, {**slow, "mode": "default"}, 300) is None  # a lighter mode
    assert too_slow(study, {**twin, "scope": "full"}, 300) is None  # another scope
    assert too_slow(study, twin, 300, explained=lambda config: "a rule's reason") is None  # a rule explains it


def test_a_max_autotune_mode_is_expected_to_take_twice_a_lighter_twins_warm_up():
    # the captioner's trial 17 (H200, 2026-11-23): regional max-autotune, a neighbour of trial 12
    # (reduce-overhead, 130 s of warm-up, 159 s in its finalist rerun), still compiling at 240 s.
    from autocompile.engine.cost import too_slow
    from autocompile.engine.study import load_study

    committed = load_study("captioner-search", f"sqlite:///{HISTORY}/captioner-search/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 16])
    tuned = committed.trials[17].user_attrs["config"]
    assert tuned["mode"] == "max-autotune" and committed.trials[17].user_attrs["status"] == "timeout"
    why = too_slow(study, tuned, 240)
    assert why and "(regional, reduce-overhead) took" in why and "2x a lighter mode's warm-up" in why, why
    assert too_slow(study, tuned, 400) is None  # twice 159 s fits 400 s
    assert too_slow(study, {**tuned, "padding": "max"}, 240) is None  # other shapes: no twin measured
    assert too_slow(study, {**tuned, "mode": "reduce-overhead"}, 240) is None  # no heavier than its twins


def test_a_modular_configuration_compares_with_whole_model_compiles():
    # captioner-fresh-3 (H200, 2026-11-25): TPE's trial 9, the encoder and decoder each compiled whole
    # under max-autotune modes, ran out of its 240 s limit while compiling, after plain torch.compile
    # (trial 1) had been still compiling at its 300 s: 240 s, a sixth of the search, spent on it.
    from autocompile.engine.cost import too_slow
    from autocompile.engine.study import load_study
    from conftest import ROOT

    committed = load_study("captioner-fresh-3", f"sqlite:///{ROOT}/studies/captioner/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 8])
    modular = committed.trials[9].user_attrs["config"]
    assert modular["scope"] == "modular" and committed.trials[9].user_attrs["status"] == "timeout"
    why = too_slow(study, modular, 240)
    assert why and "trial 1 (full, default) was still compiling after 30" in why, why
    assert too_slow(study, modular, 600) is None  # a longer limit may hold it
    # no whole-model evidence: regional trials say nothing of it
    regional_only = optuna.create_study(direction="maximize")
    regional_only.add_trials([t for t in committed.trials if t.number <= 8 and t.number != 1])
    assert too_slow(regional_only, modular, 240) is None


def test_neighbours_borrow_from_the_fastest_trial_first_and_give_up_a_promising_value_last():
    from autocompile.engine.strategy import _rank

    base = {"compile_loss": True, "compile_optimizer": False, "mode": "default", "padding": "multiple"}
    fastest = {"compile_loss": False, "compile_optimizer": True, "mode": "default", "padding": "buckets"}
    assert _rank("compile_optimizer", True, base, fastest) == 0  # the fastest had it, and it promises
    assert _rank("padding", "buckets", base, fastest) == 0  # the fastest had it
    assert _rank("mode", "reduce-overhead", base, fastest) == 1  # promising, not yet seen
    assert _rank("padding", "max", base, fastest) == 2
    assert _rank("compile_loss", False, base, fastest) == 4  # away from a promising value, though the fastest did so


def test_the_finalist_round_runs_under_a_tight_timeout(tmp_path, capsys):
    settings = SearchSettings(
        model=toy("toy_fixed"),  # one length: the first recipe compiles each graph once, none again for another length
        device="cpu",
        study="t",
        directory=str(tmp_path),
        trials=1000,
        # Eager and the first recipe take 15 s on 2 cores, 26 s on 2 busier ones: the recipe must end within the
        # timeout for the round to have a finalist, which it still does on a host 2.5x slower than the busier one.
        # Where trials are quick the search runs them until the timeout, more than the assertions below need.
        timeout_s=70,
        trial_timeout_s=300,
        measure=FAST,
        horizon=100_000,
        finalists=1,
        prune=False,
    )
    summary = run_search(settings)
    err = capsys.readouterr().err
    assert f"search timeout of {settings.timeout_s} s reached" in err  # the time bound stopped it, not the count
    # so short a search that plain torch.compile, run first, could take all of it: it waits for the recipes
    # and a neighbour (claims.plain_compile_waits), then runs or is recorded as not run, before the round
    assert "plain torch.compile runs after the recipes and a neighbour: run first, its " in err
    roles = [r["role"] for r in summary["rows"] if not r["role"].startswith("finalist")]
    recipes = [i for i, role in enumerate(roles) if role == "recipe"]
    assert roles[:2] == ["eager", "recipe"] and roles.index("compile-defaults") > recipes[-1], roles
    verdict = summary["finalists"]
    assert verdict and verdict["candidates"][0]["status"] == "ok", verdict
    round_rows = [r for r in summary["rows"] if r["role"].startswith("finalist of")]
    assert round_rows and summary["rows"][-1] is round_rows[-1]

    # the round kept its time: the search ran past --timeout by no more than the round's reruns were
    # allowed (each its first run's time and a minute more), and a little bookkeeping
    def allowed(row):
        with open(os.path.join(settings.study_dir, "trials", f"{row['number']:04d}", "spec.json")) as f:
            return json.load(f)["timeout_s"]

    assert summary["harness"]["search_wall_s"] < settings.timeout_s + sum(map(allowed, round_rows)) + 30, summary["harness"]
    # The round again with exactly its reserve left, less than a trial is expected to take
    # (MIN_TRIAL_S): its eager and its leader are measured all the same (CI, a slower machine, had
    # 28 s left after the round's eager and measured no finalist).
    import time

    from autocompile.engine.finalists import finalist_reserve, run_finalists
    from autocompile.engine.cost import MIN_TRIAL_S
    from autocompile.engine.study import open_search

    runner = open_search(settings)
    runner.study.set_user_attr("finalists", None)
    # a proposal the search queued and never reached (a slower machine reaches fewer): the round's
    # reruns are trials of their own and leave it queued, with its params, for a resumed search
    queued = {"scope": "regional", "mode": "default"}
    runner.study.enqueue_trial(queued, skip_if_exists=False)
    queue = lambda: [
        (t.number, t.system_attrs["fixed_params"])  # noqa: E731
        for t in runner.study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    ]
    waiting = queue()
    assert waiting[-1][1] == queued
    reserve = finalist_reserve(runner.study, 1)
    runner.deadline = time.time() + reserve
    before = len(runner.study.trials)
    again = run_finalists(runner, 1)
    leader = again["candidates"][0]["trial"]
    rerun = [t for t in runner.study.trials[before:] if t.user_attrs.get("remeasure_of") == leader]
    assert queue() == waiting
    # launched all the same; on a loaded machine (CI's other worker) it may not finish in its reserve
    assert rerun and rerun[0].user_attrs["status"] in ("ok", "timeout"), (reserve, MIN_TRIAL_S, again)
    # its limit: what its first run took and a minute more, not the 300 s trial limit (a rerun that
    # hangs leaves the round's other finalists their time)
    from autocompile.engine.finalists import rerun_limit_s

    first = runner.study.trials[leader].user_attrs["wall_s"]
    with open(os.path.join(settings.study_dir, "trials", f"{rerun[0].number:04d}", "spec.json")) as f:
        assert json.load(f)["timeout_s"] == pytest.approx(rerun_limit_s(first, 300), abs=1)
    assert (rerun_limit_s(20, 300), rerun_limit_s(150, 300), rerun_limit_s(250, 300)) == (80, 225, 300)
    # A resumed search whose round would keep most of its --timeout says so at the start.
    import io

    from autocompile.engine.runner import Progress
    from autocompile.engine.study import plan

    said = io.StringIO()
    runner.progress = Progress(1, said)
    runner.settings = dataclasses.replace(runner.settings, finalists=2)
    reserve = finalist_reserve(runner.study, 2)
    plan(runner, 1, 1.5 * reserve)
    assert f"the finalist round keeps {reserve:.0f} s of the {1.5 * reserve:.0f} s --timeout" in said.getvalue()
    # with two contenders (however fast each ran here), the line says what one finalist fewer keeps
    from autocompile.engine.finalists import contenders

    assert ("--finalists 1 keeps" in said.getvalue()) == (len(contenders(runner.study, 2, 300)) > 1)
    said = runner.progress.stream = io.StringIO()
    plan(runner, 1, 3 * reserve)
    assert "finalist round keeps" not in said.getvalue()


def test_progress_is_one_live_line_on_a_terminal_and_plain_lines_elsewhere():
    import io

    from autocompile.engine.runner import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    events = [
        {"phase": "compiling"},
        {"phase": "compiling", "step": 4},
        {"phase": "measuring", "warmup_s": 9.0},
        {"phase": "measuring", "window": 1, "steps_per_s": 12.0},
    ]
    live = Progress(3, Terminal())
    live.best = "best: trial 0 1.00x eager"
    for event in events:
        live.phase(1, "full default", event)
    live.line("[1/3] trial 1 full default: ok")
    text = live.stream.getvalue()
    assert text.count("\n") == 1  # the status line is rewritten in place; only the result stays
    assert "\r\x1b[2K[1/3] trial 1 full default: compiling step 4  | best: trial 0 1.00x eager" in text
    assert "window 1 at 12 steps/s" in text and text.endswith("\r\x1b[2K[1/3] trial 1 full default: ok\n")
    plain = Progress(3, io.StringIO())
    for event in events:
        plain.phase(1, "full default", event)
    assert plain.stream.getvalue().splitlines() == [
        "  [1/3] trial 1 full default: compiling",
        "  [1/3] trial 1 full default: measuring",
    ]


def test_a_study_name_that_would_leave_dir_is_refused_in_one_line(tmp_path):
    """Exit 2, one line on stderr, nothing written: the first name in a process of the command's own, the
    others through its entry point in this process (conftest.command), each a torch import less."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, command

    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for i, name in enumerate(("../../escape", "a/b", "..")):
        args = ["search", "--model", toy(), "--device", "cpu", "--study", name, "--dir", str(tmp_path / "d")]
        if i == 0:
            done = subprocess.run([sys.executable, "-m", "autocompile", *args], capture_output=True, text=True, env=env)
        else:
            done = command(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "a study name is a plain name" in done.stderr
    assert not os.listdir(tmp_path)  # nothing written anywhere


def test_the_incumbent_is_judged_by_every_measurement_of_it(tmp_path):
    # The captioner's search on the H200 (2026-11-23), its trials 0-16 (later resumes may add more):
    # trial 3 scored best in the search (16.7) but 12.2 and 14.7 in its two finalist rounds; trial 5
    # 16.0, 15.4, 14.9; trial 12 (a neighbour) 16.3, 14.9. Neighbours start from trial 12.
    import shutil

    import optuna

    from autocompile.engine.strategy import incumbent
    from autocompile.engine.study import load_study

    shutil.copy(f"{HISTORY}/captioner-search/study.db", tmp_path / "study.db")
    committed = load_study("captioner-search", f"sqlite:///{tmp_path}/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 16])
    searched = [t for t in study.trials if t.user_attrs.get("role") not in ("finalist", "eager") and t.value]
    assert max(searched, key=lambda t: t.value).number == 3
    best, params = incumbent(build_space("tiny-captioner", "cpu"), study)
    assert best.number == 12 and params == best.params
    # what the loss compiled apart did, on the same means: (16.28 + 14.93) / 2 against
    # (16.05 + 15.45 + 14.92) / 3, +0.8% (+1.4% on the first runs alone)
    from autocompile.engine.strategy import effects

    (change,) = [row for row in effects(study) if row["trial"] == 12]
    assert change["parent"] == 5 and change["effect"] == pytest.approx(0.0084, abs=0.0005)


def test_a_trial_whose_twin_took_longer_than_what_is_left_is_not_started(tmp_path):
    # the captioner's trial 11 (H200, 2026-11-23): a TPE proposal compiling what trial 5 compiled
    # (regional reduce-overhead, bucket padding, compiled step; 218 s), started with 119 s left and cut.
    import time

    from autocompile.engine.runner import Progress, Runner
    from autocompile.engine.cost import twin_time
    from autocompile.engine.study import load_study

    committed = load_study("captioner-fresh", f"sqlite:///{HISTORY}/captioner-fresh/study.db")
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 10])
    tuned = committed.trials[11].user_attrs["config"]
    assert committed.trials[11].user_attrs["status"] == "timeout"
    need, twins = twin_time(study, tuned)
    assert twins == [5] and need == pytest.approx(committed.trials[5].user_attrs["wall_s"])
    assert twin_time(study, {**tuned, "padding": "max"}) == (None, [])  # other shapes: no twin
    assert twin_time(study, {**tuned, "compile_optimizer": False})[0] is None  # trial 5 compiled more

    settings = SearchSettings(model="tiny-llama", device="cpu", study="p", directory=str(tmp_path))
    runner = Runner(study, storage, "memory", settings, Progress(2), deadline=time.time() + 400)
    first = study.ask()
    assert not runner.out_of_time(first, tuned, keep_s=100)  # about 300 s left: it fits
    assert runner.out_of_time(first, tuned, keep_s=281)  # 119 s left, as trial 11 had
    told = study.trials[first.number]
    assert told.state == optuna.trial.TrialState.FAIL and told.user_attrs["status"] == "not started"
    assert told.user_attrs["reason"].startswith("not started: its twin (trial 5) took 218 s, and 1")
    assert not runner.out_of_time(study.ask(), {**tuned, "padding": "max"}, keep_s=281)  # nothing to go by


def _measured_study(space, horizon=10_000):
    """An in-memory study and a function that records a measured trial in it (as a search records one)."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("horizon", horizon)

    def measured(partial, score, steps, warmup, **attrs):
        params = space.params_for({"scope": "regional", **partial})
        study.enqueue_trial(params)
        trial = study.ask()
        config = space.suggest(trial)
        for key, value in {
            "status": "ok",
            "config": config,
            "role": "recipe",
            "steps_per_s": steps,
            "warmup_s": warmup,
            "wall_s": warmup + 20,
            **attrs,
        }.items():
            trial.set_user_attr(key, value)
        study.tell(trial, score)
        return trial.number, params

    return study, measured


def test_the_fastest_trial_takes_turns_as_a_parent_and_first_drops_its_compiled_step():
    # the captioner's fresh search (H200, 2026-11-23): the incumbent recipe (regional, loss compiled
    # apart, fused AdamW, pad to 64; 17.6 steps/s, 27 s of warm-up) and the fastest (regional
    # reduce-overhead, compiled step, buckets; 20.6 steps/s, 116 s: 19% of its run at 10000 steps),
    # whose neighbours come first. The fastest without its compiled step ran 20.8 steps/s after 31-34 s.
    from autocompile.engine.strategy import next_neighbour, warmup_share

    space = build_space("tiny-llama", "cpu")
    study, measured = _measured_study(space)
    recipe, recipe_params = measured(
        {"compile_loss": True, "fused_optimizer": True, "padding": "multiple", "pad_multiple": 64}, 16.8, 17.6, 27
    )
    # (tiny-llama's LR schedule needs a tensor LR in a compiled step; the captioner has none)
    fast, fast_params = measured({"compile_optimizer": True, "lr_tensor": True, "padding": "buckets"}, 16.6, 20.6, 116)
    assert warmup_share(study, study.trials[fast]) == pytest.approx(116 / (116 + 10_000 / 20.6))
    tried = lambda config, params: any(t.params == params for t in study.trials)  # noqa: E731

    first = next_neighbour(space, study, tried)
    assert first["parent"] == fast and first["parent_params"] == fast_params  # heavy with warm-up: it goes first
    assert first["params"]["compile_optimizer"] is False and first["params"]["fused_optimizer"] is True
    # step_in_backward comes with the optimizer's own step, off: a condition met, not a move of its own
    assert first["changed"] == ["compile_optimizer", "fused_optimizer", "lr_tensor", "step_in_backward"]
    assert first["params"]["step_in_backward"] is False
    assert all(first["params"][n] == fast_params[n] for n in ("padding", "compile_loss", "scope"))
    measured(first["params"], 15.0, 17.0, 30, role="neighbour", parent=fast)

    second = next_neighbour(space, study, tried)
    assert second["parent"] == recipe  # then the incumbent's turn
    assert second["changed"] == ["compile_optimizer", "fused_optimizer", "lr_tensor", "step_in_backward"]  # the fastest's step

    # when the incumbent is also the fastest, it is the only parent
    study, measured = _measured_study(space)
    only, _ = measured({"compile_loss": True}, 20.0, 21.0, 20)
    assert next_neighbour(space, study, tried)["parent"] == only


def test_a_fastest_trial_light_on_warm_up_waits_for_the_incumbent():
    # llama-8b-fresh-2 (H200, 2026-11-23): the incumbent recipe (regional, loss compiled apart, fused
    # AdamW, pad to 64; 5.05 steps/s after 26 s) and the fastest (a compiled step; 5.23 after 100 s,
    # 5% of its run at 10000 steps): the incumbent's neighbour first, towards the fastest's step
    # (5.31 steps/s, 1.52x eager).
    from autocompile.engine.strategy import next_neighbour

    space = build_space("tiny-llama", "cpu")
    study, measured = _measured_study(space)
    recipe, _ = measured(
        {"compile_loss": True, "fused_optimizer": True, "padding": "multiple", "pad_multiple": 64}, 4.99, 5.05, 26
    )
    measured({"compile_optimizer": True, "lr_tensor": True, "padding": "multiple", "pad_multiple": 64}, 4.98, 5.23, 100)
    first = next_neighbour(space, study, lambda config, params: any(t.params == params for t in study.trials))
    assert first["parent"] == recipe and first["params"]["compile_optimizer"] is True
    assert first["params"]["compile_loss"] is True and first["params"]["lr_tensor"] is True


def test_an_incumbent_heavy_with_warm_up_first_drops_a_graph_it_compiles_besides_the_model():
    # the captioner's second fresh search (H200, 2026-11-24): its best was the recipe with CUDA graphs
    # and a compiled step, 19.7 steps/s after 150 s of warm-up (23% of its run at 10000 steps), and
    # its first neighbour in PROMISE's order compiled the loss too, more warm-up. A step no longer
    # compiled brings in the fused optimizer, the promising value of what it conditions.
    from autocompile.engine.strategy import next_neighbour

    space = build_space("tiny-llama", "cpu")
    tried = lambda config, params: False  # noqa: E731
    study, measured = _measured_study(space)
    heavy, _ = measured({"compile_optimizer": True, "lr_tensor": True, "padding": "buckets"}, 15.2, 19.7, 150)
    first = next_neighbour(space, study, tried)
    assert first["parent"] == heavy and first["changed"] == [
        "compile_optimizer",
        "fused_optimizer",
        "lr_tensor",
        "step_in_backward",
    ]
    assert first["params"]["compile_optimizer"] is False and first["params"]["fused_optimizer"] is True
    assert first["params"]["step_in_backward"] is True  # the optimizer's own step, each block's in the backward

    # llama-8b on one H100 (docs/decisions.md): the compiled step's 6.64 steps/s after 120 s (7.4% of its run) scored
    # 6.15; torch's fused AdamW stepped in the backward, 6.52 after 23 s, scored 6.43
    study, measured = _measured_study(space)
    measured({"compile_optimizer": True, "lr_tensor": True, "padding": "buckets"}, 6.15, 6.64, 120)
    assert next_neighbour(space, study, tried)["changed"][0] == "compile_optimizer"

    study, measured = _measured_study(space)
    measured({"compile_optimizer": True, "lr_tensor": True, "padding": "buckets"}, 19.4, 19.7, 15)  # 3%: light
    assert next_neighbour(space, study, tried)["changed"] == ["compile_loss"]  # PROMISE's order


def test_a_neighbour_of_a_parent_outside_the_space_is_a_move_of_several_dimensions():
    # the CPU quickstart (2026-11-25): its space file pins the regional scope and more, so its first
    # neighbour of plain torch.compile (trial 1, outside that space) moved one searched dimension,
    # inductor.epilogue_fusion, and four pinned ones with it; it was said as the one.
    from autocompile.engine.strategy import effects
    from autocompile.outputs.table import format_effects

    study = optuna.create_study(direction="maximize")
    parent = {**DEFAULTS, "compile": True}
    child = {**parent, "scope": "regional", "compile_optimizer": True, "inductor": {"epilogue_fusion": False}}
    one_move = {**parent, "inductor": {"epilogue_fusion": False}}
    for number, (config, extra) in enumerate(
        [
            (parent, {}),
            (child, {"parent": 0, "changed": ["inductor.epilogue_fusion"]}),
            (one_move, {"parent": 0, "changed": ["inductor.epilogue_fusion"]}),
        ]
    ):
        study.add_trial(
            optuna.trial.create_trial(
                value=10.0 - number,
                user_attrs={"config": config, "status": "ok", "role": "neighbour" if extra else "compile-defaults", **extra},
            )
        )
    several, single = effects(study)
    assert not several["single"] and set(several["changed"]) == {"scope", "compile_optimizer", "inductor.epilogue_fusion"}
    assert single["single"] and single["changed"] == {"inductor.epilogue_fusion": (None, False)}
    text = format_effects([several, single])
    assert "trial 1 (from 0): a move of 3 dimensions (compile_optimizer false -> true, inductor.epilogue_fusion null" in text
    assert "trial 2 (from 0): inductor.epilogue_fusion null -> false: -20.0% score" in text


def test_a_finalist_is_measured_again_when_its_warm_rerun_fits_the_trial_limit():
    """captioner-fresh-4 (H100, 2026-11-25): its leader, trial 5, took 243 s, 149 s of it warming
    up; a rerun starts from the code it compiled, so it fits the 240 s trial limit and is a
    contender. Plain torch.compile's first run, cut at its 300 s baseline limit, is not one."""
    from autocompile.engine.cost import rerun_estimate_s
    from autocompile.engine.finalists import contenders
    from autocompile.engine.gates import too_long
    from autocompile.engine.study import load_study

    committed = load_study("captioner-fresh-4", f"sqlite:///{HISTORY}/captioner-fresh-4/study.db")
    leader = committed.trials[5]
    assert leader.user_attrs["wall_s"] > 240 and rerun_estimate_s(leader) < 240
    assert not too_long(leader, 240) and 5 in [t.number for t in contenders(committed, 3, 240)]


def test_with_little_time_left_the_next_neighbour_runs_if_it_is_expected_to_fit():
    """captioner-fresh-4 (H100, 2026-11-25) stopped exploring with 183 s left before its finalist
    round: its compiled trials' median had taken 204 s. Its next neighbour, the leader without
    its compiled optimizer step, compiles the model graphs the leader compiled (41 s) and is
    expected to take about 135 s with what the leader's run took besides warming up."""
    from autocompile.engine.cost import Predictor, expected_trial_s
    from autocompile.engine.strategy import neighbour_cost
    from autocompile.engine.study import load_study

    folder = f"{HISTORY}/captioner-fresh-4"
    committed = load_study("captioner-fresh-4", f"sqlite:///{folder}/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 7])  # the search before its round
    cost = neighbour_cost(build_space("captioner", "cuda"), study, Predictor(study, folder), lambda c, p: False)
    assert expected_trial_s(study) > 183 and cost is not None and 100 < cost < 183, cost


def test_tpe_proposals_get_no_more_time_than_the_neighbours():
    """captioner-fresh-5 (H200, 2026-11-26): TPE's one launched proposal (trial 11, compiled
    autograd) was cut at its 240 s limit while compiling, where its two neighbours had taken 30 and
    33 s with the shared cache. Turn by turn, TPE would go again next; by time, the neighbours do."""
    from autocompile.engine.strategy import neighbours_turn, next_neighbour
    from autocompile.engine.study import load_study

    committed = load_study("captioner-fresh-5", f"sqlite:///{HISTORY}/captioner-fresh-5/study.db")
    assert committed.trials[11].user_attrs["role"] == "search" and committed.trials[11].user_attrs["status"] == "timeout"
    before, after = (optuna.create_study(direction="maximize") for _ in range(2))
    before.add_trials([t for t in committed.trials if t.number <= 10])
    after.add_trials([t for t in committed.trials if t.number <= 11])
    assert neighbours_turn(before, 0) and neighbours_turn(after, 0)  # every other proposal, as before
    assert not neighbours_turn(before, 1)  # TPE had taken no time: its turn
    assert neighbours_turn(after, 1)  # 240 s of TPE against 63 s of neighbours: a neighbour again
    neighbour = next_neighbour(build_space("captioner", "cuda"), after, lambda config, params: False)
    assert neighbour and neighbour["parent"] in (8, 10)  # the incumbent, or the fastest taking its turn


def test_the_last_neighbour_before_the_round_is_costed_by_its_twins_without_compiled_autograd():
    """captioner-fresh-5 stopped exploring with 70 s left before its round: the next neighbour
    (trial 10 with another AdamW) was costed at 241 s, the time of trial 11, whose compiled autograd
    compiled the whole backward again; its twins without it, trials 8 and 10, took 30 and 33 s."""
    from autocompile.engine.cost import Predictor, expected_trial_s
    from autocompile.engine.strategy import neighbour_cost
    from autocompile.engine.study import load_study
    from autocompile.engine.cost import twin_time

    folder = f"{HISTORY}/captioner-fresh-5"
    committed = load_study("captioner-fresh-5", f"sqlite:///{folder}/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 13])  # the search before its round
    measured = [{**DEFAULTS, **t.user_attrs.get("config", {})} for t in study.trials]  # as already_tried reads them
    tried = lambda config, params: config in measured
    cost = neighbour_cost(build_space("captioner", "cuda"), study, Predictor(study, folder), tried)
    assert cost is not None and cost < 40 < expected_trial_s(study), cost  # it fits the 70 s left
    autograd = committed.trials[11].user_attrs["config"]
    assert autograd["compiled_autograd"] and 11 not in twin_time(study, {**autograd, "compiled_autograd": False})[1]


def test_moves_that_multiply_the_compile_come_after_the_others():
    """captioner-fresh-6 (H200, 2026-11-26): after trial 10, the neighbours of trial 8 (regional
    reduce-overhead, buckets, 28 s of cold warm-up) were max-autotune (trial 12) and coordinate
    descent (trial 14); each ran out of its 240 s limit while compiling. Moves that tune kernels or
    compile the backward again now come after every other move but those away from a promising value."""
    from autocompile.engine.strategy import COMPILE_HEAVY, _rank, next_neighbour
    from autocompile.engine.study import load_study

    committed = load_study("captioner-fresh-6", f"sqlite:///{HISTORY}/captioner-fresh-6/study.db")
    for n in (12, 14):
        a = committed.trials[n].user_attrs
        assert a["role"] == "neighbour" and a["status"] == "timeout" and a["parent"] == 8, (n, a)
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 11])
    measured = [t.user_attrs.get("config") for t in study.trials]
    neighbour = next_neighbour(build_space("captioner", "cuda"), study, lambda config, params: config in measured)
    assert neighbour and neighbour["parent"] in (8, 10), neighbour
    moved = {name: neighbour["params"].get(name) for name in neighbour["changed"]}
    assert not any(any(v == heavy for heavy in COMPILE_HEAVY.get(name, ())) for name, v in moved.items()), moved
    base = {"mode": "default", "compile_loss": True}
    assert _rank("inductor.epilogue_fusion", False, base, {}) == 2 < _rank("mode", "max-autotune", base, {}) == 3
    assert _rank("compiled_autograd", True, base, {}) == 3 < _rank("compile_loss", False, base, {}) == 4
    assert _rank("mode", "max-autotune", base, {"mode": "max-autotune"}) == 0  # the fastest trial had it


def test_coordinate_descent_cut_at_the_limit_is_evidence_against_a_max_autotune_mode_not_the_reverse():
    """A max-autotune mode turns coordinate descent on too: a trial cut with coordinate descent alone
    compiled less than a max-autotune one of the same graphs would."""
    from autocompile.engine.cost import too_slow

    tuned = {
        "compile": True,
        "scope": "regional",
        "mode": "reduce-overhead",
        "padding": "buckets",
        "inductor": {"coordinate_descent_tuning": True},
    }
    cut = {"status": "timeout", "wall_s": 243.5, "reason": "no result within the 240 s limit (while compiling)"}
    study = optuna.create_study(direction="maximize")
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"config": tuned, **cut}))
    autotune = {**tuned, "mode": "max-autotune", "inductor": {}}
    assert "trial 0 (regional, reduce-overhead) was still compiling after 244 s" in too_slow(study, autotune, 240)
    reverse = optuna.create_study(direction="maximize")
    reverse.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"config": autotune, **cut}))
    assert too_slow(reverse, tuned, 240) is None


def test_compiled_autograd_is_expected_to_take_five_times_a_configuration_without_it():
    """llama-8b-fresh-7 (H200, 2026-11-26): TPE's trial 19 (compiled autograd) was cut after 152 s while
    compiling, by the search's timeout, where trial 4 without it had warmed up in 73 s; compiled
    autograd took 5.4x and 17x the warm-up without it on llama-8b and the captioner."""
    from autocompile.engine.cost import too_slow
    from autocompile.engine.study import load_study

    committed = load_study("llama-8b-fresh-7", f"sqlite:///{HISTORY}/llama-8b-fresh-7/study.db")
    cut = committed.trials[19].user_attrs
    assert cut["role"] == "search" and cut["status"] == "timeout" and cut["config"]["compiled_autograd"]
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 18])
    why = too_slow(study, cut["config"], 240)
    assert why and "trial 4 (regional, default) took 73 s" in why and "compiled autograd takes over 5x" in why, why
    assert too_slow(study, cut["config"], 400) is None  # five times 73 s fits 400 s
    assert too_slow(study, {**cut["config"], "compiled_autograd": False}, 240) is None


def test_a_move_that_paid_on_this_model_before_goes_first(tmp_path):
    """lora-8b-1gpu-5 (H200, 2026-11-28): after trial 10 (one packed row under the model's attention,
    3.14 steps/s after 36 s), it tried a lower budget below one that fitted, then other moves, and ran
    out of time before FlexAttention's mask, which had gained 1.11x (median) over its parent in
    lora-8b-1gpu-2 and -4. With the knowledge store's gains, that move goes first; and a budget below
    one that fits is no longer a move "to fit"."""
    from autocompile.engine.knowledge import MoveGains
    from autocompile.engine.knowledge.store import learn
    from autocompile.engine.strategy import fitting_move, next_neighbour
    from autocompile.engine.study import load_study

    gains = MoveGains(str(tmp_path / "knowledge.db"), "2.11.0+cu130", "NVIDIA H200", "lora-8b")
    for name in ("lora-8b-1gpu-2", "lora-8b-1gpu-4"):
        learn(load_study(name, f"sqlite:///{HISTORY}/{name}/study.db"), {"gains": gains})
    known = gains.by_dimension()
    assert known["pack_attention"] > 1.1 and all(g < 1.03 for n, g in known.items() if n != "pack_attention")
    committed = load_study("lora-8b-1gpu-5", f"sqlite:///{HISTORY}/lora-8b-1gpu-5/study.db")
    assert committed.trials[12].user_attrs["changed"] == ["activation_memory_budget"]  # 0.05, below 10's 0.2
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number <= 11])
    measured = [t.user_attrs.get("config") for t in study.trials]
    space = build_space("lora-8b", "cuda")
    tried = lambda config, params: config in measured  # noqa: E731
    # trial 1, over the limit at 0.5, fits at 0.2 (trial 10): only trial 2's ladder (padded, 2.07 steps/s) is left
    assert fitting_move(space, study, tried)["parent"] == 2
    for cost in (None, lambda config: 30.0):
        first = next_neighbour(space, study, tried, cost=cost, known=known)
        # FlexAttention leaves the SDPA kernel's choice (attention, offered on CUDA) inactive: a condition it changes
        assert first["parent"] == 10 and first["changed"] == ["attention", "pack_attention"], first
        assert first["params"]["pack_attention"] == "flex"
    # without that knowledge, trial 10 (its warm-up 10% of its run) first drops its compiled loss
    assert next_neighbour(space, study, tried)["changed"] == ["compile_loss"]


def test_a_configuration_that_peaked_over_the_limit_here_before_is_refused_and_moved_down_the_ladder(tmp_path):
    """lora-8b-1gpu-6 (H200, 2026-11-28) ran its recipes 1 and 2 (budget 0.5 without the model's checkpointing)
    for 146 s to find them over --max-memory-gb eager (33.61 and 52.29 GB against 29.15), as lora-8b-1gpu-5 and
    lora-8b-3gpu-4 had found them. With the knowledge store's peaks of those two studies, both are refused
    before launch, and the refusal's record still moves trial 1 down the budget ladder, to the 0.2 that fitted."""
    from autocompile.engine.gates import Outcome, why_not
    from autocompile.engine.knowledge import Peaks
    from autocompile.engine.knowledge.store import learn
    from autocompile.engine.records import Role
    from autocompile.engine.runner import Progress, Runner
    from autocompile.engine.strategy import fitting_move, next_neighbour
    from autocompile.engine.study import load_study

    history = f"{HISTORY}"
    peaks = Peaks(str(tmp_path / "knowledge.db"), "2.11.0+cu130", "NVIDIA H200", "lora-8b")
    learn(load_study("lora-8b-1gpu-5", f"sqlite:///{history}/lora-8b-1gpu-5/study.db"), {"peaks": peaks})
    journal = optuna.storages.journal.JournalFileBackend(f"{history}/lora-8b-3gpu-4/journal.log")
    learn(optuna.load_study(study_name="lora-8b-3gpu-4", storage=optuna.storages.JournalStorage(journal)), {"peaks": peaks})
    committed = load_study("lora-8b-1gpu-6", f"sqlite:///{history}/lora-8b-1gpu-6/study.db")
    one, two = committed.trials[1], committed.trials[2]
    assert one.user_attrs["peak_mem_gb"] > 33 and two.user_attrs["peak_mem_gb"] > 52  # measured, as before

    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, direction="maximize")
    study.add_trials([committed.trials[0]])  # eager, 29.15 GB: the limit
    settings = SearchSettings(model="lora-8b", device="cuda", study="p", directory=str(tmp_path), max_memory_gb="eager")
    space = build_space("lora-8b", "cuda")
    runner = Runner(study, storage, "memory", settings, Progress(2), deadline=None, space=space, peaks=peaks)
    for recipe in (one, two):
        refusal = why_not(recipe.user_attrs["config"], runner.view(), Outcome.INFEASIBLE)
        assert refusal.gate == "over memory before", refusal
        assert f"{recipe.user_attrs['peak_mem_gb']:.2f} GB or more in 2 runs here" in refusal.reason
        assert "above --max-memory-gb 29.15" in refusal.reason
        study.enqueue_trial(recipe.params)
        trial = study.ask(fixed_distributions=recipe.distributions)
        runner.refuse(trial, recipe.user_attrs["config"], Role.RECIPE, refusal)
        told = study.trials[trial.number].user_attrs
        assert told["status"] == "infeasible" and told["wall_s"] == 0.0
        assert told["known_peak_mem_gb"] == pytest.approx(recipe.user_attrs["peak_mem_gb"], abs=0.01)
        assert "peak_mem_gb" not in told  # nothing measured: the next study's peaks do not learn from it
    assert peaks.take(study, study.trials[-1]) is False
    move = fitting_move(space, study, lambda config, params: False)
    assert move["parent"] == 1 and move["params"]["activation_memory_budget"] == 0.2
    assert move["config"] == {**DEFAULTS, **committed.trials[10].user_attrs["config"]}  # what lora-8b-1gpu-6 ran next, and fitted
    # the move's parent was refused, so it has no speed here: lora-8b-2gpu-1 (2026-11-28) stopped at this point
    # with a KeyError; its speed counts as unknown, not as faster than the incumbent's
    assert "steps_per_s" not in study.trials[move["parent"]].user_attrs
    study.add_trials([committed.trials[4]])  # a recipe that fitted: the incumbent, 2.59 steps/s
    assert next_neighbour(space, study, lambda config, params: False)["parent"] == study.trials[-1].number

    # a search with room for it runs it; and without knowledge (a first study here) it runs too
    roomy = Runner(
        study, storage, "memory", dataclasses.replace(settings, max_memory_gb=40.0), Progress(2), None, space=space, peaks=peaks
    )
    assert why_not(one.user_attrs["config"], roomy.view(), Outcome.INFEASIBLE) is None
    fresh = Peaks(None, "2.11.0+cu130", "NVIDIA H200", "lora-8b")
    first = Runner(study, storage, "memory", settings, Progress(2), None, space=space, peaks=fresh)
    assert why_not(one.user_attrs["config"], first.view(), Outcome.INFEASIBLE) is None
