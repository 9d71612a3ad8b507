"""`autocompile repro`: a failed configuration's failure, minified by torch's minifier to a repro.py that runs alone."""

import json
import os
import subprocess
import sys

from conftest import ROOT, toy


def _run(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_a_crash_in_inductor_is_minified_to_a_repro_that_fails_alone(tmp_path):
    done = _run("-m", "autocompile", "search", "--model", toy("toy_inductor_crash"), "--device", "cpu", "--trials", "2",
                "--finalists", "0", "--study", "s", "--dir", str(tmp_path), "--no-trace")
    assert done.returncode in (0, 1), done.stderr
    record = json.loads((tmp_path / "s" / "trials" / "0001" / "result.json").read_text())
    assert record["status"] == "compile_error" and record["failing_layer"].startswith("Inductor"), record["reason"]

    done = _run("-m", "autocompile", "repro", "--study", "s", "--trial", "1", "--dir", str(tmp_path), "--timeout", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    folder = tmp_path / "s" / "trials" / "0001" / "repro"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["after"] == "aot" and summary["how"] == "minified", summary
    assert done.stdout.startswith(f"repro: {folder / 'repro.py'}: minified")
    # Smaller than the model's graph: the minifier kept what still fails (the ReLU), little else.
    assert summary["graph_lines"] < summary["graph_lines_before"] // 3
    # Alone, with plain python, in a folder of its own: it fails as the trial did.
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "repro.py").write_text((folder / "repro.py").read_text())
    ran = subprocess.run([sys.executable, "repro.py"], capture_output=True, text=True, cwd=alone,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert ran.returncode != 0 and "CppCompileError" in ran.stderr and "CppCompileError" in record["reason"]
    # The dashboard's files of the trial have it.
    names = {json.loads(v)["filename"] for k, v in _study_attrs(tmp_path).items() if k.startswith("dashboard:artifacts:")}
    assert {"repro.py", "minifier-log.txt"} <= names


def _study_attrs(tmp_path) -> dict:
    from autocompile.engine.study import load_study

    study = load_study("s", "sqlite:///" + str(tmp_path / "s" / "study.db"))
    return study._storage.get_study_system_attrs(study._study_id)
