"""A graph break with a known cause is something to remove: a trial records the Dynamo settings its breaks' hints
name, the search's next neighbour of that incumbent turns them on, and the table shows the break gone."""

import os

from autocompile.engine.settings import SearchSettings
from conftest import FAST, PLAIN_GRAPHS, toy


def test_a_data_dependent_break_is_removed_by_the_neighbour_the_search_proposes(tmp_path):
    from autocompile.api import run_search
    from autocompile.engine.study import load_study

    free = ("capture_data_dependent", "compile_loss", "dynamic")  # the break's fix against other moves
    settings = SearchSettings(
        model=toy("toy_item"),
        device="cpu",
        study="breaks",
        directory=str(tmp_path),
        trials=4,
        timeout_s=500,
        trial_timeout_s=150,
        measure=FAST,
        horizon=1000,
        finalists=0,
        prune=False,
        fixed={
            **{key: value for key, value in PLAIN_GRAPHS.items() if key not in free},
            "compile_optimizer": False,  # no recipe of the step's: the neighbour comes by the fourth trial
            "fused_optimizer": False,
        },
    )
    run_search(settings)
    study = load_study("breaks", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    records = [t.user_attrs for t in study.trials]
    plain = records[1]
    assert plain["role"] == "compile-defaults" and plain["status"] == "ok"
    assert plain["graph_breaks"] >= 1 and "capture_scalar_outputs" in plain["graph_break_fixes"]
    number, moved = next((n, r) for n, r in enumerate(records) if r.get("role") == "neighbour")
    parent = records[moved["parent"]]
    assert parent["graph_break_fixes"] and moved["changed"] == ["capture_data_dependent"]  # the fix first
    assert moved["status"] == "ok", moved.get("reason")
    assert moved["graph_breaks"] < parent["graph_breaks"] and not moved.get("graph_break_fixes")
    assert not moved["numerics"]["differs"]  # the same losses as eager
    with open(os.path.join(settings.study_dir, "trials.txt")) as f:
        lines = f.read().splitlines()
    end = lines[0].index("breaks") + len("breaks")  # the column's values end where its name does
    rows = {line.split()[0]: line for line in lines if line[:1].isdigit()}
    assert int(rows[str(moved["parent"])][:end].split()[-1]) == parent["graph_breaks"]
    assert int(rows[str(number)][:end].split()[-1]) == moved["graph_breaks"] and "capture-dd" in rows[str(number)]
