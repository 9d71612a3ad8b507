"""What a user sees of a study: results.db, the plotted report, the Pareto choice, the Python API, --version, -q/-v."""

import contextlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from conftest import FAST, ROOT, toy

from autocompile.engine.records import full_record

STUDIES = os.path.join(ROOT, "studies")


def cli(*args):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "autocompile", *args], capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One real search from Python (verbose, so its progress shows every event), on the toy model."""
    import autocompile

    directory = str(tmp_path_factory.mktemp("studies"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        result = autocompile.search(toy(), trials=3, device="cpu", study="toy", directory=directory, verbosity=2,
                                    trial_timeout_s=300, measure=FAST, horizon=100_000, finalists=1, prune=False)
    return result, os.path.join(directory, "toy"), err.getvalue()


def test_the_search_from_python_gives_the_winner_its_snippet_and_the_study(searched):
    result, study_dir, progress = searched
    assert result.winner["number"] == result.summary["best"]["number"]
    assert {"config", "steps_per_s", "warmup_s", "score", "horizon"} <= set(result.winner)
    assert "snippet" not in result.winner and "def apply_compilation(model, optimizer):" in result.snippet
    with open(os.path.join(study_dir, "apply_compilation.py")) as f:
        assert f.read() == result.snippet
    finished = [t.number for t in result.study.trials if t.state.is_finished()]
    assert finished == [row["number"] for row in result.summary["rows"]]
    assert "(window 1, steps_per_s" in progress  # -v: every event of each trial


@pytest.mark.parametrize("workload, study", [("llama-8b", "llama-8b-fresh-5"), ("captioner", "captioner-fresh-3")])
def test_best_of_a_committed_result_prints_its_snippet_and_winner(workload, study):
    """studies/WORKLOAD/ holds the study that stands as the workload's result, under its own name:
    `best --study WORKLOAD` reads it, and prints the snippet and the winner line its search wrote."""
    out = cli("best", "--study", workload, "--dir", STUDIES)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(STUDIES, workload, "apply_compilation.py")) as f:
        assert out.stdout.rstrip() == f.read().rstrip() and f"(study '{study}'" in out.stdout
    with open(os.path.join(STUDIES, workload, "trials.txt")) as f:
        assert out.stderr.splitlines()[0] in f.read()
    figures = json.loads(cli("best", "--study", workload, "--dir", STUDIES, "--json").stdout)
    assert figures["status"] == "ok" and figures["vs_eager"] > 1


def test_import_autocompile_stays_light():
    out = subprocess.run([sys.executable, "-c", "import sys, autocompile; print(sorted({'torch', 'optuna'} & set(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_the_results_table_matches_the_study(searched):
    """Written by the search's callback as trials finished: one row per trial, the same figures."""
    result, study_dir, _ = searched
    db = sqlite3.connect(os.path.join(study_dir, "results.db"))
    db.row_factory = sqlite3.Row
    rows = {r["number"]: r for r in db.execute("select * from trials")}
    trials = [t for t in result.study.trials if t.state.is_finished()]  # not the recipes still queued
    assert sorted(rows) == [t.number for t in trials]
    for t in trials:
        row, a = rows[t.number], t.user_attrs
        assert (row["status"], row["role"], row["state"]) == (a["status"], a["role"], t.state.name)
        assert row["compile"] == a["config"]["compile"] and row["scope"] == a["config"]["scope"]
        assert row["steps_per_s"] == pytest.approx(a["steps_per_s"]) and row["warmup_s"] == pytest.approx(a["warmup_s"])
        assert row["score"] == pytest.approx(t.value)
        recompiles = db.execute("select sum(count) from recompile_reasons where trial = ?", [t.number]).fetchone()[0]
        assert (recompiles or 0) == len(full_record(t, study_dir).get("recompile_reasons") or [])
    # Columns a user can select by name, as `autocompile space` names the dimensions.
    columns = {c[1] for c in db.execute("pragma table_info(trials)")}
    assert {"mode", "dynamic", "padding", "cv", "peak_mem_gb", "recompiles_after_warmup", "reason"} <= columns


def test_trials_carry_concise_user_attrs(searched):
    """The study (and the dashboard showing it) holds each trial's figures in short user attributes;
    the whole record (window rates, losses, reasons, the snippet) stays in the trial's result.json."""
    from autocompile.engine.records import ATTR_CHARS, WHOLE, full_record

    result, study_dir, _ = searched
    finished = [t for t in result.study.trials if t.state.is_finished()]
    for t in finished:
        for key, value in t.user_attrs.items():
            if key not in WHOLE:  # the configuration itself stays whole: the search reads it back
                assert len(json.dumps(value, default=str)) <= ATTR_CHARS, (t.number, key, value)
    measured = [t for t in finished if t.user_attrs.get("status") == "ok"]
    assert measured
    for t in measured:
        record = full_record(t, study_dir)
        assert isinstance(record["window_rates"], list) and len(record["window_rates"]) >= 1
        assert all(isinstance(rate, float) for rate in record["window_rates"])
        assert isinstance(record["losses"], list) and isinstance(record["recompile_reasons"], list)
        assert "def apply_compilation(model, optimizer):" in record["snippet"]
        assert t.user_attrs["snippet"].endswith("…") and record["snippet"].startswith(t.user_attrs["snippet"][:40])
        assert record["steps_per_s"] == t.user_attrs["steps_per_s"] and record["score"] == pytest.approx(t.value)


def _image(path):
    from PIL import Image

    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    return image.size, len(colours), max(n for n, _ in colours) / (image.size[0] * image.size[1])


def test_the_report_draws_the_study_s_trials(searched, tmp_path):
    from autocompile.outputs import plots

    result, study_dir, _ = searched
    with open(os.path.join(study_dir, "results.json")) as f:
        before = json.load(f)
    os.remove(os.path.join(study_dir, "trials.txt"))
    out = cli("report", "--study", "toy", "--dir", os.path.dirname(study_dir))
    assert out.returncode == 0, out.stderr
    # trials.txt and results.json written again from the study, the search's harness figures kept
    with open(os.path.join(study_dir, "results.json")) as f:
        after = json.load(f)
    assert after["harness"] == before["harness"] and after["best"]["number"] == before["best"]["number"]
    with open(os.path.join(study_dir, "trials.txt")) as f:
        assert f"winner for {result.study.user_attrs['horizon']} steps: trial {before['best']['number']}" in f.read()
    report = os.path.join(study_dir, "report")
    with open(os.path.join(report, "report.md")) as f:
        text = f.read()
    for name in ("scores", "pareto", "effects", "timeline"):
        assert f"({name}.png)" in text
        size, colours, background = _image(os.path.join(report, f"{name}.png"))
        assert size[0] >= 800 and size[1] >= 300 and colours > 20 and background < 0.95, (name, size, colours)
    # What is drawn is the study's trials: every finished one scored, every one that ran placed.
    study = result.study
    finished = [t.number for t in study.trials if t.state.is_finished()]
    drawn = plots.plot_scores(study, str(tmp_path / "scores.png"))
    assert sorted(drawn["ran"] + drawn["pruned"] + drawn["failed"]) == finished
    assert drawn["winner"] == result.winner["number"]
    ran = [t.number for t in study.trials if t.user_attrs.get("status") == "ok"]
    assert plots.plot_pareto(study, str(tmp_path / "pareto.png"))["ran"] == ran
    timeline = plots.plot_timeline(study, study_dir, str(tmp_path / "timeline.png"))
    assert sorted(timeline) == finished
    for number, phases in timeline.items():  # from events.jsonl: build, warm-up, measurement, in order
        assert [name for name, _, _ in phases] == ["build", "compile / warm-up", "measurement"]
        warmup, attrs = phases[1][2], study.trials[number].user_attrs
        # the time the trial spent: a finalist's rerun loaded its code (warm_warmup_s) and carries its cold warm-up
        assert warmup >= attrs.get("warm_warmup_s", attrs["warmup_s"]) * 0.99


def test_a_far_bound_on_plain_torch_compile_leaves_the_trials_readable(tmp_path):
    # captioner-regional (H200, 2026-11-23) stopped plain torch.compile after 25.6 s of warm-up, so its
    # score could be at most 10000 / 25.6 = 390 steps/s: drawn as a line, it pressed every trial,
    # scored 13-18, onto the floor of the plot. The bound is named in the legend instead.
    import optuna

    from autocompile.outputs import plots
    from autocompile.engine.study import load_study

    committed = load_study("captioner-regional", f"sqlite:///{ROOT}/studies/history/captioner-regional/study.db")
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("horizon", 10000)
    study.add_trials([t for t in committed.trials if t.number <= 9])
    drawn = plots.plot_scores(study, str(tmp_path / "scores.png"))
    assert drawn["default_bound"]["value"] > 300 and not drawn["default_bound"]["line"]
    assert drawn["y_top"] < 25 and _image(str(tmp_path / "scores.png"))[1] > 2


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
    assert all(len(p["changes"]) == 1 or committed.trials[p["trials"][1]].user_attrs.get("parent") == p["trials"][0]
               for p in pairs)
    drawn = plots.plot_effects(committed, str(tmp_path / "effects.png"))
    assert drawn["pairs"] == pairs and _image(str(tmp_path / "effects.png"))[1] > 20


def test_importances_that_explain_nothing_are_not_drawn(tmp_path):
    # llama-8b-fresh-5 (H200, 2026-11-25): its seven trials with parameters gave each of its 20
    # parameters an importance of 0.05, a panel of equal bars that said nothing. The captioner's
    # study, with TPE trials among them, ranks its parameters.
    from autocompile.outputs import plots
    from autocompile.engine.study import load_study

    flat = load_study("llama-8b-fresh-5", f"sqlite:///{ROOT}/studies/llama-8b/study.db")
    assert plots.param_importances(flat) == {}
    drawn = plots.plot_effects(flat, str(tmp_path / "effects.png"))
    assert drawn["importances"] == {} and drawn["pairs"]
    ranked = plots.param_importances(load_study("captioner-fresh-3", f"sqlite:///{ROOT}/studies/captioner/study.db"))
    assert max(ranked.values()) > 2 * min(ranked.values())


def test_a_report_of_too_few_trials_says_so(searched, tmp_path):
    """One trial (the fixture's eager, copied into a new study): no comparisons, no importances."""
    import optuna

    from autocompile.outputs.plots import write_report

    result, _, _ = searched
    study = optuna.create_study(study_name="one", direction="maximize")
    study.add_trial(result.study.trials[0])
    path = write_report(study, str(tmp_path))
    with open(path) as f:
        assert "No two measured configurations are one change apart." in f.read()
    assert _image(str(tmp_path / "report" / "effects.png"))[1] > 2


@pytest.fixture(scope="module")
def llama_copy(tmp_path_factory):
    """The committed GPU study of llama-8b (real measurements), copied so nothing writes to it."""
    directory = str(tmp_path_factory.mktemp("gpu"))
    shutil.copytree(os.path.join(STUDIES, "history", "llama-8b"), os.path.join(directory, "llama-8b"),
                    ignore=shutil.ignore_patterns("trials", "report"))
    return directory


def test_best_for_another_horizon_changes_the_winner_where_the_front_says(llama_copy):
    """At 100 steps the 8 s warm-up of eager beats the 5.05 steps/s of the search's winner (32 s
    warm-up); at a million steps the fastest steady speed wins. Both are on the front."""
    from autocompile.outputs.pareto import measured_points, pareto_front, winning_ranges
    from autocompile.engine.study import load_study

    def best(*extra):
        out = cli("best", "--study", "llama-8b", "--dir", llama_copy, "--json", *extra)
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

    out = cli("best", "--study", "llama-8b", "--dir", llama_copy, "--horizon", "100")
    assert out.stderr.startswith(f"winner for 100 steps: trial {short['number']} ")
    assert f"'llama-8b', trial {short['number']})" in out.stdout.splitlines()[0]  # that trial's snippet
    out = cli("best", "--study", "llama-8b", "--dir", llama_copy, "--pareto")
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
    out = cli("-q", "best", "--study", "llama-8b", "--dir", llama_copy)
    assert out.returncode == 0 and out.stderr == "" and out.stdout.startswith('"""Compile settings for llama-8b')
