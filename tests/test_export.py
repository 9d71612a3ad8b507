"""The warm start: a trial's compile cache exported, then loaded by the snippet in a fresh process."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from autocompile.apply import load_snippet
from autocompile.outputs.export import check_warm_start, export
from autocompile.api import run_search
from autocompile.engine.study import SearchSettings, load_study, storage_url
from conftest import FAST, ROOT, toy


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A study of the toy (eager, then plain torch.compile as trial 1); trial 1 exported, then
    run again loading what was exported."""
    directory = str(tmp_path_factory.mktemp("studies"))
    run_search(SearchSettings(model=toy(), device="cpu", study="toy", directory=directory, trials=2,
                              trial_timeout_s=300, measure=FAST, finalists=0, prune=False))
    study = load_study("toy", storage_url(None, directory, "toy"))
    out = os.path.join(directory, "toy", "export")
    cold = export(study, out, number=1)
    return directory, cold, check_warm_start(study, cold, number=1)


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
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for args, expected in ((["--trial", "0"], "is eager: nothing is compiled"), (["--trial", "9"], "has no trial 9")):
        out = subprocess.run([sys.executable, "-m", "autocompile", "export", "--study", "toy", "--dir", directory, *args],
                             capture_output=True, text=True, env=env)
        assert out.returncode == 2 and expected in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
