"""`autocompile repro`: a failed configuration's failure, minified by torch's minifier to a repro.py that runs alone."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from conftest import FAST, ROOT, command, numerics_of_plain_compile, toy

DATA = pathlib.Path(__file__).parent / "data"


def _run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd)


def _search(tmp_path, workload: str) -> None:
    """Eager, then plain torch.compile of a toy that fails compiled, as study 's' (`autocompile search
    --trials 2 --finalists 0 --no-trace --no-triage`, from Python: FAST windows, no torch import of
    a command of its own; what is under test is `repro` of its failed trial)."""
    import autocompile

    autocompile.search(
        toy(workload),
        trials=2,
        device="cpu",
        study="s",
        directory=str(tmp_path),
        verbosity=0,
        finalists=0,
        trace=False,
        triage=False,
        measure=FAST,
    )


def test_a_crash_in_inductor_is_minified_to_a_repro_that_fails_alone(tmp_path):
    _search(tmp_path, "toy_inductor_crash")
    # No triage, to save its three reruns (tests/test_trial.py has it name Inductor for this model):
    # a compile error without a layer is taken for Inductor's (test_the_minifier_is_set_for_the_layer_triage_found).
    record = json.loads((tmp_path / "s" / "trials" / "0001" / "result.json").read_text())
    assert record["status"] == "compile_error" and "failing_layer" not in record, record["reason"]

    folder = tmp_path / "s" / "trials" / "0001" / "repro"
    best = command("best", "--study", "s", "--dir", str(tmp_path))  # lists the failure, and how to minify it
    assert "failed configurations:\n  trial 1 " in best.stderr, best.stderr
    assert "; to reproduce it: autocompile repro --study s --trial 1\n" in best.stderr
    for trial, error in (
        ("0", "trial 0 is 'ok', not a failed compile: nothing to reproduce"),
        ("7", "study 's' has no trial 7 (it has 0 to 1)"),
    ):
        done = command("repro", "--study", "s", "--trial", trial, "--dir", str(tmp_path))
        assert (done.returncode, done.stderr) == (2, f"autocompile: error: {error}\n")
    for args, error in (
        (
            ["--trial-dir", str(tmp_path)],
            f"{tmp_path} holds no trial record (result.json): run `autocompile trial --dir {tmp_path}` first",
        ),
        ([], "say which trial: --study NAME --trial N, or --trial-dir DIR"),
    ):
        done = command("repro", *args)
        assert (done.returncode, done.stderr) == (2, f"autocompile: error: {error}\n")
    # A minifier stopped at once: the unreduced graph is kept, and the line says so. The trial named
    # by its folder, as one run by hand with `autocompile trial --dir` is (the same files). The command's
    # function in this process (conftest.command): its rerun and its minifier are processes of their own
    # either way; the call below is the file's `autocompile repro` in a process of its own.
    done = command("repro", "--trial-dir", str(folder.parent), "--timeout", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not reduced within the 0.5 s limit: the unreduced graph" in done.stdout
    unreduced = json.loads((folder / "summary.json").read_text())
    assert unreduced["after"] == "aot" and unreduced["rerun"]["status"] == "compile_error", unreduced
    assert unreduced["graph_lines"] == unreduced["graph_lines_before"] > 10
    _fails_alone(tmp_path / "unreduced", folder, record)
    # With time, from the launcher the first call left (no rerun): minified, far smaller than the model's graph.
    done = _run("-m", "autocompile", "repro", "--study", "s", "--trial", "1", "--dir", str(tmp_path), "--timeout", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["how"] == "minified" and summary["rerun"].startswith("skipped"), summary
    assert done.stdout.startswith(f"repro: {folder / 'repro.py'}: minified")
    assert summary["graph_lines"] < summary["graph_lines_before"] // 3  # what still fails (the ReLU), little else
    _fails_alone(tmp_path / "minified", folder, record)
    # The dashboard's files of the trial have it, and the results table (trials.txt, `report`) names it.
    study = _study(tmp_path)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    names = {json.loads(v)["filename"] for k, v in attrs.items() if k.startswith("dashboard:artifacts:")}
    assert {"repro.py", "minifier-log.txt"} <= names
    from autocompile.outputs.table import format_table, summarize

    table = format_table(summarize(study, str(tmp_path / "s"))["rows"])
    assert f"[repro: {folder / 'repro.py'}]" in table.splitlines()[2]
    best = command("best", "--study", "s", "--dir", str(tmp_path))
    assert f"; repro: {folder / 'repro.py'}: minified" in best.stderr, best.stderr


def _fails_alone(alone, folder, record, error="CppCompileError") -> None:
    """repro.py, alone in a folder of its own and run with plain python, fails as the trial did."""
    alone.mkdir()
    (alone / "repro.py").write_text((folder / "repro.py").read_text())
    ran = subprocess.run(
        [sys.executable, "repro.py"],
        capture_output=True,
        text=True,
        cwd=alone,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert ran.returncode != 0 and error in ran.stderr and error in record["reason"], ran.stderr[-2000:]


def test_an_accuracy_repro_compiles_the_module_where_the_numerics_part_alone(tmp_path, monkeypatch):
    # Block 1's ReLU is computed by Inductor as relu(x) + 1 (its test hook): the numerics part there.
    record = numerics_of_plain_compile(tmp_path, "toy_block_inductor_wrong", 0, triage=True)
    assert record["status"] == "infeasible" and record["reason"].startswith("numerics ("), record["reason"]
    assert (record["diverges_at"]["module"], record["diverges_at"]["pass"]) == ("blocks.1", "forward")
    # A short minifier limit: minifying is test_a_crash_in_inductor_is_minified_to_a_repro_that_fails_alone's;
    # here the graph the rerun left is the point (a 1-s minifier keeps it, or a checkpoint of it).
    # The command's function in this process (conftest.command), run from the user's folder: the rerun
    # and the minifier are processes of their own, started from it, as from the command's own process.
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    done = command("repro", "--study", "s", "--trial", "1", "--dir", str(tmp_path), "--accuracy", "--timeout", "1")
    assert not list(here.iterdir())  # torch's copy of the failing graph went to the trial's folder, not the user's
    folder = tmp_path / "s" / "trials" / "0001" / "repro"
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"repro of blocks.1 alone: {folder / 'repro.py'}: "), done.stdout
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["module"] == "blocks.1" and summary["why"].startswith("accuracy: blocks.1 (where the numerics part)")
    assert summary["rerun"]["reason"] == "AccuracyError: Bad accuracy detected", summary["rerun"]
    # The block's graph (its linear's output, the ReLU): the whole configuration's forward graph,
    # as the rerun without diverges_at leaves it, has 20 lines (by hand, 2026-11-25).
    assert summary["graph_lines_before"] <= 6 and "aten.relu" in (folder / "repro.py").read_text()
    _fails_alone(tmp_path / "alone", folder, summary["rerun"], "AccuracyError: Bad accuracy detected")


def _study(tmp_path):
    from autocompile.engine.study import load_study

    return load_study("s", "sqlite:///" + str(tmp_path / "s" / "study.db"))


def test_the_minifier_is_set_for_the_layer_triage_found():
    from autocompile.outputs.repro import minifier_setting

    layers = {
        "Dynamo (graph capture)": None,
        "AOTAutograd (forward and backward graphs)": "dynamo",
        "decompositions and the partitioner": "dynamo",
        "Inductor (code generation)": "aot",
    }
    for layer, after in layers.items():
        assert minifier_setting({"status": "compile_error", "failing_layer": layer}, False)[:2] == (after, 2)
    assert minifier_setting({"status": "compile_error"}, False)[:2] == ("aot", 2)  # no triage: Inductor's, taken
    assert minifier_setting({"status": "crashed"}, False)[:2] == ("aot", 3)  # a dead process: written before each graph
    assert minifier_setting({"status": "infeasible", "failing_layer": "Dynamo (graph capture)"}, True)[:2] == ("aot", 4)
    numerics = {"status": "infeasible", "diverges_at": {"module": "blocks.1", "pass": "forward"}}
    _, _, why = minifier_setting(numerics, True)
    assert why.startswith("accuracy: blocks.1 (where the numerics part) compiled alone")


def test_a_module_compiled_alone_gets_the_settings_the_snippet_gives_it():
    from autocompile.apply import ModelInfo, alone, render_snippet
    from autocompile.space import DEFAULTS

    info = ModelInfo(regions=["blocks"], parts=("encoder", "decoder"), parallel="ddp")
    modular = {**DEFAULTS, "scope": "modular", "mode": "default", "part_modes": {"encoder": "max-autotune-no-cudagraphs"}}
    config, alone_info = alone(modular, info, "encoder.layers.1")
    assert (config["scope"], config["mode"]) == ("full", "max-autotune-no-cudagraphs")
    assert (alone_info.parallel, alone_info.regions, alone_info.parts) == ("none", [], ())
    assert alone(modular, info, "decoder")[0]["mode"] == "default"  # a part the configuration leaves at the mode
    assert "    model.compile(**COMPILE_KWARGS)" in render_snippet(config, alone_info)
    regional = {**DEFAULTS, "scope": "regional", "mode": "max-autotune-no-cudagraphs"}
    assert alone(regional, info, "encoder")[0]["mode"] == "max-autotune-no-cudagraphs"


def test_a_checkpoint_cut_while_it_was_written_is_passed_over(tmp_path):
    """The minifier stopped at its time limit may leave its newest, smallest checkpoint empty or
    half written (seen: an empty 18.py beside a whole 26.py); the smallest whole one is kept."""
    from autocompile.outputs.repro import _smallest_checkpoint

    folder = tmp_path / "debug" / "run" / "minifier" / "checkpoints"
    folder.mkdir(parents=True)
    graph = "import torch\nclass Repro(torch.nn.Module):\n    def forward(self, x):\n{body}        return (x,)\n"
    (folder / "26.py").write_text(graph.format(body="        x = x + 1\n" * 3))
    (folder / "39.py").write_text(graph.format(body="        x = x + 1\n" * 5))
    (folder / "18.py").write_text("")
    (folder / "12.py").write_text(graph.format(body="        x = x + 1\n")[:60])  # cut mid-line
    assert _smallest_checkpoint(str(tmp_path / "debug")) == str(folder / "26.py")


def test_a_rerun_that_does_not_fail_as_the_trial_did_gets_no_repro_and_a_line_that_says_so(tmp_path):
    from autocompile.outputs.repro import _unminified, recurred

    trial = {
        "status": "failed",
        "reason": "RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
        "overwritten by a subsequent run. Stack trace: File a.py",
    }
    assert (
        recurred(trial, {**trial, "reason": "RuntimeError: Error: accessing ... Stack trace: File b.py"})
        == "the same exception type (RuntimeError)"
    )
    assert recurred(trial, {"status": "compile_error", "reason": trial["reason"]}) is None
    did_not_fail = (
        "no repro: the rerun did not fail (ok): the failure did not recur, so it is flaky or depends on the machine or its load"
    )
    otherwise = (
        "no repro: the rerun failed otherwise (failed: AssertionError: x), not as the trial did, and left no minifier launcher"
    )
    for rerun, line in (
        ({"status": "ok", "reason": ""}, did_not_fail),
        ({"status": "failed", "reason": "AssertionError: x"}, otherwise),
    ):
        summary = _unminified(str(tmp_path), str(tmp_path), {"rerun": {**rerun, "wall_s": 1.0}}, trial)
        assert summary["line"] == line and "repro" not in summary
        assert not (tmp_path / "repro.py").exists()


def test_a_graph_that_fails_only_after_earlier_steps_gets_an_unreduced_repro_from_a_study_that_lost_its_folder(tmp_path):
    """Issue 31, both defects. On an H200 (torch 2.11) Inductor's non-tree CUDA-graph path asserted
    inside a compiled graph at a trial's second step: the minifier wrote a launcher, but its graph
    alone passed ("Input graph did not fail the tester" after 22 s), and repro called that "not
    reduced within the 300 s limit". Here a toy's compiled forward indexes past its embedding at
    step 2 (a buffer step 1 set): Inductor's bounds check raises inside the graph, and the
    launcher's graph, on the zeros it makes up for the ids, passes. And the study keeps only its
    study.db, as a committed one does: the trial's spec is rebuilt from the storage."""
    _search(tmp_path, "toy_runtime_fail_in_graph")
    folder = tmp_path / "s" / "trials" / "0001"
    record = json.loads((folder / "result.json").read_text())
    assert record["status"] == "failed" and "index out of bounds" in record["reason"], record["reason"]
    shutil.rmtree(folder)  # what a committed study leaves out (studies/README.md)
    study = _study(tmp_path)
    study.enqueue_trial({})  # trial 2: queued, never started: the one trial that keeps the error (the CLI's
    from autocompile.errors import UserError  # one line for a UserError: test_a_crash_in_inductor_..., trial 7)
    from autocompile.outputs.repro import repro_trial

    with pytest.raises(UserError) as error:
        repro_trial(_study(tmp_path), str(tmp_path / "s"), 2)
    assert str(error.value) == "trial 2 never ran to a record (it is queued; state WAITING): nothing to rerun"
    assert not (tmp_path / "s" / "trials" / "0002").exists()
    shutil.rmtree(tmp_path / "s" / "trials" / "0000")  # the eager baseline ran cleanly: nothing to rebuild for it
    with pytest.raises(UserError, match="^trial 0 is 'ok', not a failed compile: nothing to reproduce$"):
        repro_trial(_study(tmp_path), str(tmp_path / "s"), 0)
    assert not (tmp_path / "s" / "trials" / "0000").exists()

    # The command's function in this process (conftest.command): what it prints is under test, and its
    # rerun and minifier are processes of their own either way.
    done = command("repro", "--study", "s", "--trial", "1", "--dir", str(tmp_path), "--timeout", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    repro = folder / "repro"
    summary = json.loads((repro / "summary.json").read_text())
    spec = json.loads((folder / "spec.json").read_text())
    assert (spec["model"], spec["config"], spec["device"]) == (toy("toy_runtime_fail_in_graph"), record["config"], "cpu")
    assert spec["rebuilt_from"] == summary["rebuilt_from"] and spec["timeout_s"] == 900.0  # the search's default limit
    assert summary["minifier"] == "did not fail" and summary["minifier_s"] < 300 and "not reduced" not in done.stdout
    assert summary["rerun"]["status"] == "failed" and summary["recurred"], summary
    assert (repro / "minifier_launcher_does_not_fail.py").exists() and not (repro / "minifier_launcher.py").exists()
    assert done.stdout == (
        f"unreduced repro: {repro / 'repro.py'}: the minifier's graph did not fail alone (\"Input graph did not fail the "
        f'tester", after {summary["minifier_s"]:.0f} s; its launcher kept as minifier_launcher_does_not_fail.py; the '
        f"rerun that wrote it took {summary['rerun']['wall_s']:.0f} s): the failure needs the run around the graph "
        f"(what earlier steps left); the rerun failed with {summary['recurred']}; repro.py reruns the configuration "
        f"on the workload: {summary['script_lines']} lines; run it with python to see the failure (the trial's spec "
        "rebuilt from the study: its folder was gone)\n"
    )
    script = (repro / "repro.py").read_text()
    assert "(study 's', trial 1), found by autocompile." in script  # the snippet the rerun rendered, the trial's header
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text(script)
    ran = subprocess.run(
        [sys.executable, "repro.py"], capture_output=True, text=True, cwd=alone, env={**os.environ, "PYTHONPATH": ROOT}
    )
    assert ran.returncode == 1 and "step 1 done\n" in ran.stdout, ran.stdout + ran.stderr[-2000:]
    assert "failed, as the trial did: RuntimeError: " in ran.stderr and "index out of bounds" in ran.stderr
    # A failure raised outside every compiled graph (CUDA graphs' "accessing tensor output of CUDAGraphs
    # that has been overwritten by a subsequent run", in loss.backward(), H100) leaves no launcher at
    # all: the same script, and a line that says so (this rerun's verdict, from the same folder).
    from autocompile.outputs.repro import _unminified

    line = _unminified(str(folder), str(repro), {"rerun": summary["rerun"]}, record)["line"]
    assert line == (
        f"unreduced repro: {repro / 'repro.py'}: the failure happens at run time, outside what the "
        f"minifier watches (it left no launcher; the rerun failed with {summary['recurred']}); repro.py "
        f"reruns the configuration on the workload: {summary['script_lines']} lines; run it with python "
        "to see the failure"
    )
    assert (repro / "repro.py").read_text() == script


def test_the_minifiers_own_words_say_its_graph_did_not_fail_alone(tmp_path):
    """The minifier's log and the summary from the H200 run of issue 31 (autocompile repro
    --trial-dir .../trial-captioner-nontree-cudagraphs --timeout 300, torch 2.11.0+cu130,
    2026-11-26; copied from that run's repro/minifier-log.txt and repro/summary.json): the
    minifier stopped after 22 s, exit status 1, with the 300 s limit far off."""
    from autocompile.outputs.repro import _earlier_launcher, last_error, minifier_outcome

    log = (DATA / "gpu-minifier-log-did-not-fail.txt").read_text()
    assert minifier_outcome(log, 1) == "did not fail"
    assert last_error(log) == "RuntimeError: Input graph did not fail the tester"
    stopped = log.replace("Input graph did not fail the tester", "Uh oh, something went wrong :( Final graph is not failing")
    assert minifier_outcome(stopped, 1) == "stopped"
    assert minifier_outcome("Started off with 83 nodes\n", None) == "timed out"
    assert minifier_outcome("Made 12 queries\n", 0) == "minified"
    # `repro` again on that trial (its summary written before this fix): the launcher is minified
    # again, and the rerun that wrote it is carried, for the line once the graph passes alone.
    earlier = json.loads((DATA / "gpu-repro-summary-did-not-fail.json").read_text())
    launcher = tmp_path / "debug" / "torch_compile_debug" / "run_1" / "minifier" / "minifier_launcher.py"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("")
    (tmp_path / "summary.json").write_text(json.dumps(earlier))
    summary = {key: earlier[key] for key in ("after", "level", "module")}
    assert _earlier_launcher(str(tmp_path), summary) == str(launcher)
    assert summary["rerun_before"] == {"status": "failed", "reason": "AssertionError:", "wall_s": earlier["rerun"]["wall_s"]}
    (tmp_path / "summary.json").write_text(json.dumps({**earlier, "minifier": "did not fail"}))  # this fix's verdict
    assert _earlier_launcher(str(tmp_path), dict(summary)) is None  # nothing more to minify: the trial is rerun
