"""Paces: how fast a configuration has run on a workload here, so that its next trial's warm-up is bounded.

Each trial that measured a steady speed (ok), or was pruned after its measuring windows (the fastest window),
is stored with its whole configuration, per torch, device and workload (the model and what shapes its work:
batch size, longest sequence, seed, ranks). The fastest a configuration has run, seen at least TIMES times,
plus MARGIN (the host's load moves a speed by a few percent), bounds the steady speed of the same
configuration in the next study: the pruning bound of its warm-up (engine/runner.py) uses it, as it uses the
gains of a move for a neighbour. A recipe that lost in every earlier study is then cut at the start of its
warm-up instead of after it.
"""

from __future__ import annotations

import json

import sqlite_utils

from autocompile.engine.knowledge.schema import TIMES, clear, Observer, open_file
from autocompile.engine.records import Record
from autocompile.space import DEFAULTS
from autocompile.trial.result import Status

TABLE = "paces"
MARGIN = 0.10  # a stored pace this much higher still bounds the configuration (reruns here are 0-4% apart)
_SHAPING = ("batch_size", "seq_len", "seed", "parallel", "nproc")  # settings that change what a step computes


def workload(settings: dict) -> str:
    """The workload a pace is kept for: the model, and each setting in _SHAPING that is not its default."""
    defaults = {"batch_size": None, "seq_len": None, "seed": 0, "parallel": "none", "nproc": 1}
    moved = [f"{k}={settings[k]}" for k in _SHAPING if settings.get(k, defaults[k]) != defaults[k]]
    return "|".join([settings["model"], *moved])


def config_key(config: dict) -> str:
    """A configuration as the store keys it: every setting, DEFAULTS' value for one it was written without (a
    row stored before a setting was added holds the same configuration as one with that setting at its default)."""
    return json.dumps({**DEFAULTS, **config}, sort_keys=True)


def runs_of(db: sqlite_utils.Database, table: str, key: dict, config: dict, study: str | None) -> list[dict]:
    """The rows of `table` that hold `config` on `key`'s torch, device and workload, but those of `study`."""
    where = "torch = ? and device = ? and model = ?"
    want = config_key(config)
    return [
        r
        for r in db[table].rows_where(where, [key["torch"], key["device"], key["model"]])
        if r["study"] != study and config_key(json.loads(r["config"])) == want
    ]


def _pace(a: dict) -> float | None:
    """A finished trial's pace: the fastest it ran, its steady speed or, faster, one of its measuring windows (a
    trial whose windows never settled, CUDA graphs still recorded in the first, ran slower in its mean: lora-8b-2gpu-2
    trial 31, 0.85 steps/s from windows of 0.50 and 2.83); or the fastest of the windows it was pruned after."""
    if a.get("status") == Status.OK:
        return max([a.get("steps_per_s") or 0.0, *(a.get("window_rates") or [])]) or None
    if a.get("status") != Status.PRUNED:
        return None
    events = a.get("events")  # a long list may have been kept shortened to a text: no windows then
    windows = [
        e["steps_per_s"]
        for e in (events if isinstance(events, list) else [])
        if isinstance(e, dict) and e.get("phase") == "measuring" and "window" in e and e.get("steps_per_s")
    ]
    return max(windows) if len(windows) >= 2 else None


class Paces(Observer):
    """The configurations measured on one workload, torch and device: told each finished trial, it keeps its
    pace, and says how fast a configuration has run at most (`ceiling`)."""

    def __init__(self, path: str | None, torch: str, device: str, model: str):
        self.db = open_file(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def take(self, study, trial) -> bool:
        r = Record.of(trial)
        pace = _pace(r.attrs)
        if not pace or not r.config or not r.config.get("compile"):
            return False
        self.db[TABLE].upsert(
            {**self.key, "study": study.study_name, "trial": trial.number, "config": config_key(r.config)}
            | {"steps_per_s": pace},
            pk=("torch", "device", "model", "study", "trial"),
        )
        return True

    def ceiling(self, config: dict, study: str | None = None) -> dict | None:
        """The fastest the configuration has run in other studies here (`steps_per_s`), the trial that did
        (`by`) and how many runs were stored (`of`); None where fewer than TIMES were."""
        rows = runs_of(self.db, TABLE, self.key, config, study)
        if len(rows) < TIMES:
            return None
        best = max(rows, key=lambda r: r["steps_per_s"])
        return {"steps_per_s": best["steps_per_s"], "of": len(rows), "by": f"{best['study']} trial {best['trial']}"}

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """--forget-all clears them; a single value's --forget leaves them (a pace is no failure)."""
        return clear(db, TABLE, value)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        rows = list(
            db.query(
                f"select torch, device, model, count(distinct config) as configurations, count(*) as runs "
                f"from {TABLE} group by torch, device, model"
            )
        )
        return {"paces": rows}
