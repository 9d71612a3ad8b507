"""DIR/STUDY/results.db: the study's trials as an SQL table (sqlite-utils), for queries and Datasette.

`trials` has one row per finished trial (primary key `number`): its state, role, status and reason,
every dimension of its configuration in a column of its own (named as `autocompile space`
names them: `scope`, `mode`, `mode.encoder`, `inductor.epilogue_fusion`, ...), and every
measurement. `recompile_reasons` and `graph_break_reasons` hold (trial, reason, count).

`write_results(study, path)` (re)writes the whole file from a study; `ResultsTable(path)` is a
callback with Optuna's signature that keeps it up to date as trials finish, also when several
workers of one host (`search --gpus N`) write it: each write holds the file's lock.
"""

from __future__ import annotations

import collections
import json
import os

import sqlite_utils

from autocompile.apply import describe_config
from autocompile.engine.records import config_columns, full_record, status_of
from autocompile.engine.storage import file_lock

FILE_NAME = "results.db"
# User attributes that are not columns: the code is on disk, the config is flattened, the
# reasons have their own tables.
NOT_COLUMNS = ("snippet", "log", "config", "recompile_reasons", "graph_break_reasons")
FIRST_COLUMNS = (
    "number",
    "state",
    "role",
    "remeasure_of",
    "status",
    "reason",
    "config",
    "value",
    "score",
    "steps_per_s",
    "warmup_s",
    "warmup_steps",
)


def _status(trial) -> str:
    """The record's status; for a trial without one, what its state says (`status_of`; another state's name)."""
    if trial.user_attrs.get("status") or trial.state.name in ("PRUNED", "FAIL"):
        return status_of(trial)
    return trial.state.name.lower()


def _cell(value):
    return json.dumps(value, default=str) if isinstance(value, (list, dict, tuple)) else value


def trial_row(trial, study_dir: str | None = None) -> dict:
    """One trial as a flat row: its state, each dimension (None where automatic, e.g. `dynamic`),
    then every field of its whole record (`full_record`: the lists the study holds as counts
    whole again); other keys whose value is None are left out (NULL)."""
    attrs = full_record(trial, study_dir)
    config = attrs.get("config")
    row = {
        "number": trial.number,
        "state": trial.state.name,
        "status": _status(trial),
        "config": describe_config(config) if config else None,
        "value": trial.value,
    }
    if "status" not in attrs and trial.state.name == "FAIL":
        row["reason"] = "the search stopped during this trial"
    dimensions = {k: _cell(v) for k, v in config_columns(config).items()} if config else {}
    measured = {k: _cell(v) for k, v in attrs.items() if k not in NOT_COLUMNS and k not in row}
    measured["datetime_start"] = trial.datetime_start and trial.datetime_start.isoformat(timespec="seconds")
    measured["datetime_complete"] = trial.datetime_complete and trial.datetime_complete.isoformat(timespec="seconds")
    return {
        **{k: v for k, v in row.items() if v is not None},
        **dimensions,
        **{k: v for k, v in measured.items() if v is not None},
    }


def reason_rows(trial, study_dir: str | None = None) -> tuple[list[dict], list[dict]]:
    """(recompile reasons, graph-break reasons) of a trial as (trial, reason, count) rows; none where
    the study holds them shortened and the trial's result.json is not kept (a committed study)."""
    attrs = full_record(trial, study_dir)
    listed = lambda key: attrs.get(key) if isinstance(attrs.get(key), list) else []  # noqa: E731
    recompiles = collections.Counter(listed("recompile_reasons"))
    breaks = collections.Counter()
    for item in listed("graph_break_reasons"):
        breaks[item["reason"]] += item.get("count", 1)
    as_rows = lambda counts: [{"trial": trial.number, "reason": r, "count": n} for r, n in counts.items()]
    return as_rows(recompiles), as_rows(breaks)


def _column_types(rows: list[dict]) -> dict:
    """Each column's type from its first value that is not None (text if none is), the
    FIRST_COLUMNS first, then the order the rows give."""
    types = {}
    for row in rows:
        for key, value in row.items():
            if types.get(key) in (None, type(None)):
                types[key] = type(value)
    ordered = [k for k in FIRST_COLUMNS if k in types] + [k for k in types if k not in FIRST_COLUMNS]
    return {k: str if types[k] is type(None) else types[k] for k in ordered}


def _reason_table(db, name: str):
    return db[name].create(
        {"trial": int, "reason": str, "count": int},
        pk=("trial", "reason"),
        foreign_keys=[("trial", "trials", "number")],
        if_not_exists=True,
    )


def write_results(study, path: str) -> str:
    """(Re)write results.db at `path` from the study's finished trials; the file is replaced at once."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    study_dir = os.path.dirname(os.path.abspath(path))  # results.db lies in the study's folder
    rows = [trial_row(t, study_dir) for t in trials]
    temporary = path + ".tmp"
    if os.path.exists(temporary):
        os.remove(temporary)
    db = sqlite_utils.Database(temporary)
    db["trials"].create(_column_types(rows) or {"number": int}, pk="number")
    db["trials"].insert_all(rows, alter=True)
    recompiles, breaks = _reason_table(db, "recompile_reasons"), _reason_table(db, "graph_break_reasons")
    for t in trials:
        recompile_rows, break_rows = reason_rows(t, study_dir)
        recompiles.insert_all(recompile_rows)
        breaks.insert_all(break_rows)
    db.close()
    os.replace(temporary, path)
    return path


def upsert_trial(path: str, trial) -> None:
    """Insert or update one trial's row and its reasons in an existing results.db."""
    db = sqlite_utils.Database(path)
    study_dir = os.path.dirname(os.path.abspath(path))
    db["trials"].upsert(trial_row(trial, study_dir), pk="number", alter=True)
    for table, rows in zip(("recompile_reasons", "graph_break_reasons"), reason_rows(trial, study_dir)):
        _reason_table(db, table).delete_where("trial = ?", [trial.number])
        db[table].insert_all(rows)
    db.close()


class ResultsTable:
    """Optuna-style callback: keeps results.db up to date as trials finish.

    Its first call writes the whole study (so a resumed study's table is complete); each
    later call upserts the trial it is given.
    """

    def __init__(self, path: str):
        self.path, self._written = path, False

    def __call__(self, study, frozen_trial) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with file_lock(self.path + ".lock"):  # a whole rewrite by one worker never drops another's row
            if not self._written or not os.path.exists(self.path):
                write_results(study, self.path)
                self._written = True
            else:
                upsert_trial(self.path, frozen_trial)
