"""The knowledge store's failures across studies (engine/knowledge/failures.py), with real searches of a toy whose
compile fails under fullgraph=True."""

import json
import os

import pytest

from autocompile.cli import main
from autocompile.space import DEFAULTS
from autocompile.engine.knowledge import Failures as FailureMemory, device_name, signature
from autocompile.engine.strategy import next_neighbour
from autocompile.api import run_search
from autocompile.engine.study import SearchSettings, build_space, load_study
from conftest import FAST, copy_study, toy

MODEL = toy("toy_graph_break")  # a real Dynamo graph break: fullgraph=True fails to compile
# Every dimension pinned but fullgraph: plain torch.compile is the incumbent, and its one neighbour
# is fullgraph=True.
PINS = {
    "scope": "full",
    "mode": "default",
    "dynamic": None,
    "capture_data_dependent": False,
    "compile_optimizer": False,
    "fused_optimizer": False,
    "compile_loss": False,
    "padding": "longest",
    "mark_dynamic": "off",
    "inductor.shape_padding": True,
    "inductor.epilogue_fusion": True,
    "inductor.aggressive_fusion": False,
    "compiled_autograd": False,
    "foreach_map_optimizer": False,
    "step_in_backward": False,
}


def _search(directory, name: str, memory: str, trials: int) -> None:
    settings = SearchSettings(
        model=MODEL,
        device="cpu",
        study=name,
        directory=str(directory),
        trials=trials,
        trial_timeout_s=300,
        measure=FAST,
        horizon=100_000,
        finalists=0,
        prune=False,
        triage=False,
        fixed=PINS,
        memory_path=memory,
    )
    run_search(settings)


def _fullgraph(trial) -> bool:
    return trial.user_attrs.get("config", {}).get("fullgraph") is True


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    """Studies a, b and c in turn, each one trial past the baselines (eager, plain torch.compile),
    which are measured once, in a, and copied into b and c (what is remembered comes after them)."""
    directory = tmp_path_factory.mktemp("studies")
    memory = str(directory / "failures.db")
    _search(directory, "a", memory, trials=2)
    for name in ("b", "c"):
        copy_study(directory, "a", directory, name)
    for name in ("a", "b", "c"):
        _search(directory, name, memory, trials=1)
    studies = {name: load_study(name, "sqlite:///" + str(directory / name / "study.db")) for name in "abc"}
    return {"dir": directory, "memory": memory, **studies}


def test_a_value_that_failed_twice_the_same_way_is_not_offered_in_the_next_study(searches):
    for name in ("a", "b"):  # offered (the incumbent's neighbour), and fails
        failed = [t for t in searches[name].trials if _fullgraph(t)]
        assert [(t.user_attrs["role"], t.user_attrs["status"]) for t in failed] == [("neighbour", "compile_error")]
    trials = searches["c"].trials
    assert not [t for t in trials if t.user_attrs.get("role") == "neighbour"]  # no neighbour wasted on it
    # TPE proposes it (its first proposal under seed 0): refused before launch, with the trials that showed it
    refused = [t.user_attrs for t in trials if _fullgraph(t)]
    assert [a["status"] for a in refused] == ["infeasible"] and refused[0]["wall_s"] == 0
    assert refused[0]["reason"].startswith(
        "rejected before launch: left out: fullgraph=true failed twice here with compile_error Unsupported at torch/"
    ), refused[0]["reason"]
    assert refused[0]["reason"].endswith("(study a trial 2, study b trial 2)")


def test_the_signature_names_the_status_the_exception_and_the_torch_frame(searches):
    attrs = searches["a"].trials[2].user_attrs
    assert attrs["torch_frame"].startswith("torch/_dynamo/") and ".py:" in attrs["torch_frame"]
    assert signature(attrs) == f"compile_error Unsupported at {attrs['torch_frame']}"
    assert signature({**attrs, "status": "timeout"}) is None and signature({**attrs, "status": "ok"}) is None
    assert signature({"status": "infeasible", "reason": "numerics (first losses): ..."}) is None
    # the engine's fault, not the values': never remembered against them
    forked = "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, ..."
    assert signature({**attrs, "status": "failed", "reason": forked}) is None


def test_space_and_failures_list_it_and_forgetting_brings_it_back(searches, capsys):
    memory = searches["memory"]
    assert main(["space", "--model", MODEL, "--device", "cpu", "--json", "--failure-memory", memory]) == 0
    left = {item["name"]: item for item in json.loads(capsys.readouterr().out)["left_out"]}
    assert left["fullgraph=true"]["trials"] == [["a", 2], ["b", 2]]
    assert [name for name, item in left.items() if "trials" in item] == ["fullgraph=true"]  # the others ran cleanly

    assert main(["failures", "--failure-memory", memory]) == 0
    out = capsys.readouterr().out
    assert "2 failed trials remembered, 1 value left out" in out
    assert "fullgraph=true  [torch " in out and "cpu]  failed twice here with compile_error Unsupported" in out

    assert main(["failures", "--failure-memory", memory, "--forget", "fullgraph"]) == 2  # one line, no traceback
    assert main(["failures", "--failure-memory", memory, "--forget", "mode=reduce-overhead"]) == 2
    assert "no remembered failure with mode=" in capsys.readouterr().err

    space = build_space(MODEL, "cpu", fixed=PINS)
    study = searches["c"]
    left_out = FailureMemory(memory, space, device_name("cpu"))
    assert next_neighbour(space, study, lambda config, params: left_out.reason(config) is not None) is None
    assert main(["failures", "--failure-memory", memory, "--forget", "fullgraph=true"]) == 0
    assert "forgot 2 remembered outcomes" in capsys.readouterr().out
    back = FailureMemory(memory, space, device_name("cpu"))
    neighbour = next_neighbour(space, study, lambda config, params: back.reason(config) is not None)
    assert neighbour and neighbour["config"]["fullgraph"] is True and neighbour["changed"] == ["fullgraph"]
    assert main(["failures", "--failure-memory", memory]) == 0
    assert "0 values left out" in capsys.readouterr().out


def test_a_newer_torch_starts_clean(searches, tmp_path):
    space = build_space(MODEL, "cpu", fixed=PINS)
    path = str(tmp_path / "f.db")
    record = {"status": "compile_error", "reason": "Unsupported: x", "torch_frame": "torch/a.py:1 in f"}
    config = {**DEFAULTS, "fullgraph": True}
    old = FailureMemory(path, space, "cpu")
    for trial in (1, 2):
        old.remember(record, config, "s", trial)
    assert old.reason(config).startswith("left out: fullgraph=true failed twice here")
    space.caps.torch_version = "99.0"
    assert FailureMemory(path, space, "cpu").reason(config) is None
    assert main(["failures", "--failure-memory", path, "--forget-all"]) == 0
    assert not os.path.exists(str(tmp_path / "missing.db"))
    assert main(["failures", "--failure-memory", str(tmp_path / "missing.db"), "--forget-all"]) == 2


def test_the_store_is_knowledge_db_and_an_old_failures_db_is_read_where_none_is(tmp_path, monkeypatch, capsys):
    """The knowledge store's file is knowledge.db, listed by `autocompile knowledge` (`failures`, its old name, too).
    A machine's store kept under the old name, failures.db, is read until a knowledge.db is beside it."""
    from autocompile.engine.knowledge import store_path
    from autocompile.engine.knowledge.schema import open_file
    from conftest import HISTORY

    monkeypatch.setenv("AUTOCOMPILE_CACHE", str(tmp_path))
    assert store_path(None) == str(tmp_path / "knowledge.db")
    old = tmp_path / "failures.db"
    assert main(["failures", "--failure-memory", str(old), "--learn", "captioner-fresh-6", "--dir", HISTORY]) == 0
    assert store_path(None) == str(old) and store_path(str(tmp_path / "other.db")) == str(tmp_path / "other.db")
    capsys.readouterr()
    assert main(["knowledge"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"knowledge store {old}: ") and "the latest 2 took 1.75x" in listed
    assert main(["failures"]) == 0 and capsys.readouterr().out == listed
    assert main(["knowledge", "--knowledge-store", str(old)]) == 0 and capsys.readouterr().out == listed

    open_file(str(tmp_path / "knowledge.db")).close()  # a store under the new name, empty
    assert store_path(None) == str(tmp_path / "knowledge.db")
    capsys.readouterr()
    assert main(["knowledge"]) == 0 and "the latest 2 took" not in capsys.readouterr().out
