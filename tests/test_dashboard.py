"""What is made of a study besides its table: the dashboard (each trial's files uploaded once, the
winner's note, the page in a real headless browser) and the warm start (a trial's compile cache
exported, then loaded by the snippet in a fresh process). One study of the toy's baselines for both
(the warm start's tests were test_export.py's, with a search of their own)."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from autocompile.apply import load_snippet
from autocompile.outputs.dashboard import (
    ArtifactUploader,
    artifact_store,
    trial_dir,
    tlparse_command,
    upload_study_files,
    uploaded,
)
from autocompile.engine.records import full_record
from autocompile.outputs.export import check_warm_start, export
from autocompile.api import run_search
from autocompile.engine.study import SearchSettings, load_study, storage_url
from conftest import FAST, HISTORY, ROOT, command, toy

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# The exported cache is checked against what the trial compiled cold (every Inductor compile a miss),
# and the traces hold each trial's own compiles: none loaded from the session's graph cache.
pytestmark = pytest.mark.usefixtures("cold_graphs")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Eager and plain torch.compile on the toy (whose lengths vary: the compiled one recompiles),
    each trial writing a trace as a search does when tlparse is installed."""
    directory = str(tmp_path_factory.mktemp("studies"))
    settings = SearchSettings(
        model=toy(),
        device="cpu",
        study="toy",
        directory=directory,
        trials=2,
        trial_timeout_s=300,
        measure=FAST,
        finalists=0,
        prune=False,
        trace=True,
    )
    run_search(settings)
    return load_study("toy", storage_url(None, directory, "toy")), settings.study_dir


def test_each_trials_files_are_uploaded_once(study):
    study, study_dir = study
    eager, compiled = study.trials
    ArtifactUploader(study_dir)(study, eager)  # as the search's callback does when a trial ends
    files = {"apply_compilation.py", "events.jsonl", "result.json"}
    assert set(uploaded(study, eager)) == files | ({"log.txt"} if os.path.getsize(eager.user_attrs["log"]) else set())
    assert upload_study_files(study, study_dir) > 0  # the other trial
    assert upload_study_files(study, study_dir) == 0  # nothing twice
    store = artifact_store(study_dir)
    for trial in (eager, compiled):
        ids = uploaded(study, trial)
        with store.open_reader(ids["apply_compilation.py"]) as f:
            assert f.read().decode() == full_record(trial, study_dir)["snippet"]
    assert compiled.user_attrs["recompiles"] > 0  # a trial worth a tlparse report
    assert files | {"log.txt"} <= set(uploaded(study, compiled))  # its log has the recompile messages
    assert not os.path.exists(os.path.join(trial_dir(study_dir, eager.number), "trace"))  # nothing to read: removed
    if tlparse_command():
        assert {"tlparse.html", "tlparse.zip"} <= set(uploaded(study, compiled))
        with store.open_reader(uploaded(study, compiled)["tlparse.html"]) as f:
            assert b"<html" in f.read(2000).lower()


def test_the_study_note_shows_the_winner_and_its_snippet(study):
    from optuna_dashboard import get_note

    study, study_dir = study
    upload_study_files(study, study_dir)
    note = get_note(study)
    winner = study.trials[int(re.search(r"winner for \d+ steps: trial (\d+)", note).group(1))]
    code = full_record(winner, study_dir)["snippet"].split('"""', 2)[2]  # what follows the module's docstring
    assert all(line in note for line in code.splitlines()) and "def apply_compilation" in code


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dom(url: str) -> str:
    """The page after its scripts ran: optuna-dashboard is a single-page app that fetches the study."""
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


@contextlib.contextmanager
def _dashboard(study_name: str, directory: str):
    """`autocompile dashboard` on a free port, as a user starts it; its base URL once it answers."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    server = subprocess.Popen(
        [sys.executable, "-m", "autocompile", "dashboard", "--study", study_name, "--dir", directory, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(base + "/api/meta", timeout=2)
                break
            except OSError:
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.5)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_dashboard_shows_the_trials_and_opens_a_snippet(study):
    study, study_dir = study
    with _dashboard("toy", os.path.dirname(study_dir)) as base:
        trial = study.trials[1]
        dom = _dom(f"{base}/dashboard/studies/{study._study_id}/trials?numbers={trial.number}")
        assert {f"Trial {t.number}" for t in study.trials} <= set(re.findall(r"Trial \d+", dom))
        link = re.search(r'download="apply_compilation.py" href="([^"]+)"', dom)
        assert link, "no link to the trial's snippet on its page"
        with urllib.request.urlopen(base + link.group(1), timeout=10) as response:
            assert response.read().decode() == full_record(trial, study_dir)["snippet"]
        # the study's page names its objective as the table does, not "Objective 0"
        (name,) = study.metric_names
        assert name.startswith("score at ") and name in _dom(f"{base}/dashboard/studies/{study._study_id}")


@pytest.mark.parametrize(
    "folder, bars", [(os.path.join(HISTORY, "llama-8b-fresh-5"), False), (os.path.join(ROOT, "studies", "captioner"), True)]
)
def test_the_dashboard_draws_no_importances_where_optuna_tells_none_apart(tmp_path, folder, bars):
    """llama-8b-fresh-5's importances are all alike (its 20 parameters 0.05 each in optuna-dashboard's
    own panel): the dashboard draws none, as the report does; the captioner's it draws as they come."""
    import json

    name = os.path.basename(folder)
    shutil.copytree(folder, tmp_path / name)  # serving writes the note
    with _dashboard(name, str(tmp_path)) as base:
        with urllib.request.urlopen(f"{base}/api/studies/1/param_importances", timeout=120) as response:
            (drawn,) = json.load(response)["param_importances"]
    assert bool(drawn) == bars
    if bars:
        assert len({round(bar["importance"], 6) for bar in drawn}) > 1


@pytest.fixture(scope="module")
def exported(study, tmp_path_factory):
    """The study's trial 1 (plain torch.compile) exported, then run again loading what was exported."""
    study, study_dir = study
    out = str(tmp_path_factory.mktemp("export"))  # not in the study's folder, whose files the tests above count
    cold = export(study, out, number=1)
    return os.path.dirname(study_dir), cold, check_warm_start(study, cold, number=1)


def test_the_exported_cache_is_loaded_by_a_fresh_trial(exported):
    _, cold, warm = exported
    path = cold["cache"]["path"]
    namespace = load_snippet(open(cold["snippet_path"]).read())
    key = namespace["compile_cache_key"]()
    assert key["torch"] in os.path.basename(path) and key["device"] in os.path.basename(path)
    assert json.load(open(path + ".json"))["key"] == key
    assert os.path.getsize(path) == cold["cache"]["bytes"] > 0
    # Cold, Inductor compiled every graph (misses); loaded, it found every one of them (hits).
    compiled = cold["compile_caches"]["fxgraph_cache_miss"]
    assert compiled > 0 and not cold["compile_caches"].get("fxgraph_cache_hit")
    assert warm["status"] == "ok" and warm["cache_loaded"] is True
    assert warm["compile_caches"].get("fxgraph_cache_hit") == compiled
    assert not warm["compile_caches"].get("fxgraph_cache_miss")
    assert warm["losses"][0] == pytest.approx(cold["losses"][0], rel=1e-4)  # the same computation


def test_a_cache_made_elsewhere_is_refused(exported, tmp_path, capsys):
    _, cold, _ = exported
    path = str(tmp_path / "cache.bin")
    shutil.copyfile(cold["cache"]["path"], path)
    meta = json.load(open(cold["cache"]["path"] + ".json"))
    meta["key"]["torch"] = "2.0.0"  # as if made by another release
    json.dump(meta, open(path + ".json", "w"))
    namespace = load_snippet(open(cold["snippet_path"]).read())
    assert namespace["load_compile_cache"](path) is False
    said = capsys.readouterr().out
    assert "not loaded" in said and "'torch': '2.0.0'" in said


def test_export_refuses_what_it_cannot_export_in_one_line(exported):
    directory = exported[0]
    for args, expected in ((["--trial", "0"], "is eager: nothing is compiled"), (["--trial", "9"], "has no trial 9")):
        out = command("export", "--study", "toy", "--dir", directory, *args)
        assert out.returncode == 2 and expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
