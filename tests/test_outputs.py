"""What a user sees of a study: results.db, the plotted report, the Pareto choice, the Python API, --version, -q/-v."""

import json
import logging
import time
import os
import shutil
import subprocess
import sys

import pytest

from conftest import HISTORY, ROOT, command, drawn_image

STUDIES = os.path.join(ROOT, "studies")


def cli(*args):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "autocompile", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("workload, study", [("llama-8b", "llama-8b-fresh-15"), ("captioner", "captioner-fresh-3")])
def test_best_of_a_committed_result_prints_its_snippet_and_winner(workload, study):
    """studies/WORKLOAD/ holds the study that stands as the workload's result, under its own name:
    `best --study WORKLOAD` reads it, and prints the snippet and the winner line its search wrote."""
    out = command("best", "--study", workload, "--dir", STUDIES)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(STUDIES, workload, "apply_compilation.py")) as f:
        assert out.stdout.rstrip() == f.read().rstrip() and f"(study '{study}'" in out.stdout
    with open(os.path.join(STUDIES, workload, "trials.txt")) as f:
        assert out.stderr.splitlines()[0] in f.read()
    figures = json.loads(command("best", "--study", workload, "--dir", STUDIES, "--json").stdout)
    assert figures["status"] == "ok" and figures["vs_eager"] > 1


def test_the_winner_s_speed_is_what_its_finalist_round_took():
    """llama-8b-fresh-15 (H200, 2026-11-29): trial 2 ran 7.04 steps/s in the search (2.08x eager) and 6.86
    in its finalist round, which took 6.95 (2.06x its eager). The winner line, `--json` and the snippet's
    docstring say the round's figures, not the first run's alone; at another horizon the speed stays
    pooled and the score is worked out for that horizon."""
    figures = json.loads(command("best", "--study", "llama-8b", "--dir", STUDIES, "--json").stdout)
    first, rerun = figures["paces"]
    assert rerun < figures["steps_per_s"] < first and figures["number"] == 2
    assert figures["vs_eager"] == pytest.approx(2.06, abs=0.005)
    assert figures["items_per_s"] / figures["steps_per_s"] == pytest.approx(9231.1 / first, rel=1e-4)  # tokens a step
    out = command("best", "--study", "llama-8b", "--dir", STUDIES)
    assert "6.95 steps/s (7.04 then 6.86 pooled in the finalist round), 2.06x eager" in out.stderr.splitlines()[0]
    assert "6.95 steps/s steady (2.06x eager" in out.stdout
    assert "The steady speed pools its runs in the finalist round: 7.04 then 6.86 steps/s." in out.stdout
    short = json.loads(command("best", "--study", "llama-8b", "--dir", STUDIES, "--json", "--horizon", "20000").stdout)
    assert short["steps_per_s"] == figures["steps_per_s"] and short["score"] != figures["score"]


def test_a_winner_that_is_plain_torch_compile_is_1x_plain_torch_compile(tmp_path):
    """README's CPU search from a clean clone (2 cores, 2026-11-29, tests/data/cpu-quickstart-2026-11-29/):
    plain torch.compile won, 260 then 264 steps/s in its round. Pooled, it is 1.00x itself, not its pooled
    speed over its first run's (1.01x), in the winner line and in the snippet."""
    shutil.copytree(os.path.join(ROOT, "tests", "data", "cpu-quickstart-2026-11-29"), tmp_path, dirs_exist_ok=True)
    out = command("best", "--study", "tiny-llama", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    line = out.stderr.splitlines()[0]
    assert "(compile-defaults)" in line and "(260 then 264 pooled in the finalist round)" in line
    assert "1.00x torch.compile defaults" in line and "1.00x torch.compile defaults" in out.stdout


def test_best_of_a_search_stopped_before_its_finalist_round_says_so(tmp_path):
    """lora-8b-60gb-2 was cut by the device's time after five trials (H200, 2026-11-27), and resumed later to
    its round: `best` of the study as it stood before the round (its verdict taken out of a copy) prints its
    best single measurement and says that no finalist round has judged it yet; the finished study does not."""
    import optuna

    shutil.copytree(os.path.join(HISTORY, "lora-8b-60gb-2"), tmp_path / "lora-8b-60gb-2")
    url = f"sqlite:///{tmp_path / 'lora-8b-60gb-2' / 'study.db'}"
    optuna.load_study(study_name="lora-8b-60gb-2", storage=url).set_user_attr("finalists", None)
    out = command("best", "--study", "lora-8b-60gb-2", "--dir", str(tmp_path))
    assert out.returncode == 0 and out.stdout.startswith('"""Compile settings for lora-8b'), out.stderr
    assert "note: study 'lora-8b-60gb-2' has no finalist round yet" in out.stderr
    for finished, directory in (("lora-8b-60gb-2", HISTORY), ("lora-8b", STUDIES)):  # lora-8b: lora-8b-fresh-2
        out = command("best", "--study", finished, "--dir", directory)
        assert out.returncode == 0 and "no finalist round" not in out.stderr, out.stderr


def test_import_autocompile_stays_light():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, autocompile; print(sorted({'torch', 'optuna'} & set(sys.modules)))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_a_far_bound_on_plain_torch_compile_leaves_the_trials_readable(tmp_path):
    # captioner-regional (H200, 2026-11-23) stopped plain torch.compile after 25.6 s of warm-up, so its
    # score could be at most 10000 / 25.6 = 390 steps/s: drawn as a line, it pressed every trial,
    # scored 13-18, onto the floor of the plot. The bound is named in the legend instead.
    import optuna

    from autocompile.outputs import plots
    from autocompile.engine.study import load_study

    committed = load_study("captioner-regional", f"sqlite:///{HISTORY}/captioner-regional/study.db")
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("horizon", 10000)
    study.add_trials([t for t in committed.trials if t.number <= 9])
    drawn = plots.plot_scores(study, str(tmp_path / "scores.png"))
    assert drawn["default_bound"]["value"] > 300 and not drawn["default_bound"]["line"]
    assert drawn["y_top"] < 25 and drawn_image(str(tmp_path / "scores.png"))[1] > 2


def test_a_neighbour_s_move_is_drawn_with_the_dimensions_it_conditions(tmp_path):
    # captioner-fresh-3 (H200, 2026-11-25): the winner, trial 8, is trial 5 without its compiled
    # optimizer step, which brings in the fused optimizer: two configuration columns, one move of
    # the search. The effects plot and report.md showed no change at all (each pair had to differ
    # in one column), though this move was the study's largest effect (+16% score).
    from autocompile.outputs import plots
    from autocompile.engine.study import load_study

    committed = load_study("captioner-fresh-3", f"sqlite:///{ROOT}/studies/captioner/study.db")
    pairs = plots.single_changes(committed)
    move = next(p for p in pairs if p["trials"] == (5, 8))
    assert move["changes"] == [("compile_optimizer", True, False), ("fused_optimizer", False, True)]
    assert 1.1 < move["score"] < 1.25 and 0.97 < move["steady"] < 1.03
    # configurations two columns apart with no recorded parent between them are no single change
    assert all(
        len(p["changes"]) == 1 or committed.trials[p["trials"][1]].user_attrs.get("parent") == p["trials"][0] for p in pairs
    )
    drawn = plots.plot_effects(committed, str(tmp_path / "effects.png"))
    assert drawn["pairs"] == pairs and drawn_image(str(tmp_path / "effects.png"))[1] > 20


def test_importances_that_explain_nothing_are_not_drawn(tmp_path):
    # llama-8b-fresh-5 (H200, 2026-11-25): its seven trials with parameters gave each of its 20
    # parameters an importance of 0.05, a panel of equal bars that said nothing. The captioner's
    # study, with TPE trials among them, ranks its parameters.
    from autocompile.outputs import plots
    from autocompile.engine.study import load_study

    flat = load_study("llama-8b-fresh-5", f"sqlite:///{HISTORY}/llama-8b-fresh-5/study.db")
    assert plots.param_importances(flat) == {}
    drawn = plots.plot_effects(flat, str(tmp_path / "effects.png"))
    assert drawn["importances"] == {} and drawn["pairs"]
    ranked = plots.param_importances(load_study("captioner-fresh-3", f"sqlite:///{ROOT}/studies/captioner/study.db"))
    assert max(ranked.values()) > 2 * min(ranked.values())


@pytest.fixture(scope="module")
def llama_copy(tmp_path_factory):
    """The committed GPU study of llama-8b (real measurements), copied so nothing writes to it."""
    directory = str(tmp_path_factory.mktemp("gpu"))
    shutil.copytree(
        os.path.join(HISTORY, "llama-8b"),
        os.path.join(directory, "llama-8b"),
        ignore=shutil.ignore_patterns("trials", "report"),
    )
    return directory


def test_best_for_another_horizon_changes_the_winner_where_the_front_says(llama_copy):
    """At 100 steps the 8 s warm-up of eager beats the 5.05 steps/s of the search's winner (32 s
    warm-up); at a million steps the fastest steady speed wins. Both are on the front."""
    from autocompile.outputs.pareto import measured_points, pareto_front, winning_ranges
    from autocompile.engine.study import load_study

    def best(*extra):
        out = command("best", "--study", "llama-8b", "--dir", llama_copy, "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    searched, short, long = best(), best("--horizon", "100"), best("--horizon", "1000000")
    assert searched["horizon"] == 1000 and short["horizon"] == 100
    assert short["number"] != searched["number"] and long["number"] == searched["number"]
    study = load_study("llama-8b", "sqlite:///" + os.path.join(llama_copy, "llama-8b", "study.db"))
    points = measured_points(study)
    front = {p.number: p for p in pareto_front(points)}
    assert short["number"] in front and long["number"] in front
    assert front[short["number"]].figures["warmup_s"] == min(p.figures["warmup_s"] for p in points)
    assert front[long["number"]].figures["steps_per_s"] == max(p.figures["steps_per_s"] for p in points)
    first, last = winning_ranges(points)[short["number"]]
    assert first <= 100 <= last < 1000

    out = command("best", "--study", "llama-8b", "--dir", llama_copy, "--horizon", "100")
    assert out.stderr.startswith(f"winner for 100 steps: trial {short['number']} ")
    assert f"'llama-8b', trial {short['number']})" in out.stdout.splitlines()[0]  # that trial's snippet
    out = command("best", "--study", "llama-8b", "--dir", llama_copy, "--pareto")
    listed = [line.split()[1 if line.startswith("*") else 0] for line in out.stdout.splitlines()[2:-1]]
    assert [int(n) for n in listed] == list(front)
    assert "wins for" in out.stdout


def test_version_and_quiet():
    import optuna
    import torch

    out = cli("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("autocompile ") and f"torch {torch.__version__}" in out.stdout
    assert f"optuna {optuna.__version__}" in out.stdout


def test_quiet_best_prints_only_the_snippet(llama_copy):
    out = command("-q", "best", "--study", "llama-8b", "--dir", llama_copy)
    assert out.returncode == 0 and out.stderr == "" and out.stdout.startswith('"""Compile settings for llama-8b')


def test_a_trials_line_says_what_the_recompile_penalty_took():
    """lora-8b-3gpu-1's trial 21 (reduce-overhead under FlexAttention's packed batch, H200, 2026-11-27) ran
    3.46 steps/s and scored 1.67: 224 compiles after its warm-up, one per new packed length, took half its
    score, where the table's recompiles (Dynamo's) said 3. Its line now says so."""
    from autocompile.engine.runner import _penalised
    from autocompile.engine.scoring import score

    record = {"status": "ok", "warmup_s": 111.8, "warmup_steps": 25, "steps_per_s": 3.456, "recompiles_after_warmup": 224}
    assert _penalised(record) == " (224 compiles after warm-up: -50%)"
    assert score(record, 10_000) == pytest.approx(1.6675, rel=1e-3)
    assert _penalised({**record, "recompiles_after_warmup": 3}) == " (3 compiles after warm-up: -6%)"
    assert _penalised({**record, "recompiles_after_warmup": 0}) == ""
    # a record that tells the two apart (lora-8b-1gpu-2's trial 20: 6 graphs compiled, 744 compile events)
    recorded = {**record, "recompiles_after_warmup": 0, "cudagraph_recordings_after_warmup": 224}
    assert _penalised(recorded) == " (224 CUDA graphs recorded after warm-up: -50%)"
    assert score(recorded, 10_000) == score(record, 10_000)
    both = " (2 recompiles and 224 CUDA graphs recorded after warm-up: -50%)"
    assert _penalised({**recorded, "recompiles_after_warmup": 2}) == both
    # recordings timed: their seconds are paid once, as warm-up, and only recompiles take the penalty
    timed = {**recorded, "cudagraph_recording_s_after_warmup": 11.9}
    assert _penalised(timed) == " (224 CUDA graphs recorded after warm-up in 11.9 s, paid once as warm-up)"
    assert score(timed, 10_000) == pytest.approx(10_000 / (111.8 + 11.9 + (10_000 - 25) / 3.456))
    assert score(timed, 10_000) > 1.9 * score(recorded, 10_000)
    timed_both = {**timed, "recompiles_after_warmup": 2}
    assert (
        _penalised(timed_both)
        == " (2 recompiles after warm-up: -4%; 224 CUDA graphs recorded after warm-up in 11.9 s, paid once as warm-up)"
    )
    assert score(timed_both, 10_000) == pytest.approx(0.96 * score(timed, 10_000))


def test_the_compile_watcher_tells_cuda_graph_recordings_from_compiles():
    """torch reports a CUDA graph recorded by Inductor's CUDA-graph trees through the same compile callbacks as
    a compile (torch._dynamo.callback, trigger CUDAGRAPH_RECORDING); the watcher counts both and tells them apart.
    The recording is announced here as cudagraph_trees announces it, a compile by compiling a function."""
    import torch
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    from autocompile.trial.worker import CompileWatcher

    torch._dynamo.reset()  # (which also drops the compile callbacks)
    watcher = CompileWatcher()
    watcher.install(torch)
    torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
    compiled = watcher.compiles_started
    with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
        time.sleep(0.2)
    assert compiled >= 1 and watcher.recordings == 1 and watcher.compiles_started == compiled + 1
    assert 0.2 <= watcher.recording_s < 1.0  # the recording's seconds, and only its own
    logging.getLogger("torch._dynamo").removeHandler(watcher)
