"""Cold runs: what the finalist round's cold runs took over reconstructed warm-ups, for the next round's plan.

A finalist whose warm-up was reconstructed (the shared compile cache had some of its graphs) is run
from empty caches in the round (finalists.cold_pick). The round's time is kept before that run
(finalists.finalist_reserve), from the seconds the reconstruction added for the graphs it loaded,
and those seconds fall short of a cold run by a factor that depends on the model (the evidence:
docs/decisions.md).

Each cold run of a round is stored, per model, torch and device: the seconds the reconstruction
added, and the seconds the cold run took over the measured warm-up. The median ratio of the latest
(`ColdRuns.scale`) scales the added seconds when the device's next study of that model plans its
round; the study records it (`cold_scale`). The reconstructed warm-ups themselves stay as measured
and reconstructed.
"""

from __future__ import annotations

import statistics

import sqlite_utils

from autocompile.engine.knowledge.schema import clear, Observer, open_file
from autocompile.engine.records import Record
from autocompile.trial.result import Status

TABLE = "cold_runs"
# A reconstruction that added less than this says little of a ratio (the CPU toy's add tenths of a second).
MIN_ADDED_S = 1.0
# The scale is the median of the latest cold runs only: what a reconstruction misses changes with autocompile.
LATEST = 5


def observed(cold: dict, first: dict) -> tuple[float, float] | None:
    """(seconds the reconstruction of `first` added, seconds its cold run `cold` took over `first`'s
    measured warm-up), or None where `cold` is not a clean cold run of a reconstructed trial."""
    rebuilt = first.get("reconstruction") or {}
    if cold.get("status") != Status.OK or cold.get("warmup_kind") != "cold" or rebuilt.get("added_s", 0) < MIN_ADDED_S:
        return None
    return float(rebuilt["added_s"]), float(cold["warmup_s"]) - float(rebuilt["measured_s"])


def _scale(db: sqlite_utils.Database, key: dict) -> dict | None:
    rows = list(
        db[TABLE].rows_where(
            "torch = ? and device = ? and model = ?",
            [key["torch"], key["device"], key["model"]],
            order_by="rowid desc",
            limit=LATEST,
        )
    )[::-1]
    if not rows:
        return None
    ratios = [r["cold_added_s"] / r["added_s"] for r in rows]
    return {
        "scale": round(statistics.median(ratios), 3),
        "runs": len(rows),
        "from": [f"{r['study']} trial {r['trial']}" for r in rows],
    }


class ColdRuns(Observer):
    """The cold runs of one model's finalist rounds on one torch and device: told each finished
    trial, it keeps the round's cold runs and says what they showed (`scale`)."""

    def __init__(self, path: str, torch: str, device: str, model: str):
        self.db = open_file(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def remember(self, study: str, trial: int, of: int, seen: tuple[float, float]) -> None:
        where = "torch = ? and device = ? and model = ? and study = ? and trial = ?"
        self.db[TABLE].delete_where(where, [*self.key.values(), study, trial])  # stored again: now the latest
        self.db[TABLE].insert({**self.key, "study": study, "trial": trial, "of": of, "added_s": seen[0], "cold_added_s": seen[1]})

    def take(self, study, trial) -> bool:
        """Remember `trial` of `study` where it is a clean cold run of the round (`observed`); whether it was."""
        r = Record.of(trial)
        if not r.attrs.get("cold_check") or r.remeasure_of is None:
            return False
        seen = observed(r.attrs, Record.of(study.get_trials(deepcopy=False)[r.remeasure_of]).attrs)
        if seen:
            self.remember(study.study_name, trial.number, r.remeasure_of, seen)
        return bool(seen)

    def scale(self) -> dict | None:
        """What the LATEST stored cold runs took over their measured warm-ups, as a multiple of what their
        reconstructions added (the median), with how many and which runs; None where none is stored."""
        return _scale(self.db, self.key)

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """Every stored cold run (None); a cold run holds no value, so none for one."""
        return clear(db, TABLE, value)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        """Per torch, device and model: their `scale`, from the latest cold runs stored."""
        keys = db.execute(f"select distinct torch, device, model from {TABLE} order by torch, device, model").fetchall()
        return {
            "cold": [
                {"torch": t, "device": d, "model": m, **_scale(db, {"torch": t, "device": d, "model": m})} for t, d, m in keys
            ]
        }
