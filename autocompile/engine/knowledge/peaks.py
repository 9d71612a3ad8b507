"""Peaks: how much memory a configuration has taken on a workload here, so that one known to exceed a
search's --max-memory-gb is not run again to find it out.

Each trial that measured its peak memory is stored with its whole configuration, per torch, device and
workload (`paces.workload`: the model and what shapes its work). The least a configuration has peaked at,
seen at least TIMES times in other studies, is what it will take again (a configuration's peak moves by
well under MARGIN between runs on a GPU): a search whose limit is below it refuses it before launch
(`gates.over_memory_before`), and moves it down the activation-budget ladder instead (`strategy.fitting_move`).
"""

from __future__ import annotations

import sqlite_utils

from autocompile.engine.knowledge.paces import config_key, runs_of
from autocompile.engine.knowledge.schema import TIMES, clear, Observer, open_file
from autocompile.engine.records import Record

TABLE = "peaks"
MARGIN = 0.02  # a stored peak must be this much above a limit to rule a configuration out


class Peaks(Observer):
    """The peaks of the configurations measured on one workload, torch and device: told each finished trial,
    it keeps its measured peak memory, and says the least a configuration has taken (`floor`)."""

    def __init__(self, path: str | None, torch: str, device: str, model: str):
        self.db = open_file(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def take(self, study, trial) -> bool:
        r = Record.of(trial)
        if not r.peak_mem_gb or not r.config or not r.wall_s:
            return False  # a refusal before launch carries a known peak, not a measured one
        self.db[TABLE].upsert(
            {**self.key, "study": study.study_name, "trial": trial.number, "config": config_key(r.config)}
            | {"peak_gb": r.peak_mem_gb},
            pk=("torch", "device", "model", "study", "trial"),
        )
        return True

    def floor(self, config: dict, study: str | None = None) -> dict | None:
        """The least the configuration has peaked at in other studies here (`peak_gb`), the trials that say so
        (`by`) and how many runs were stored (`of`); None where fewer than TIMES were."""
        rows = runs_of(self.db, TABLE, self.key, config, study)
        if len(rows) < TIMES:
            return None
        rows.sort(key=lambda r: r["peak_gb"])
        by = ", ".join(f"{r['study']} trial {r['trial']}" for r in rows[:TIMES])
        return {"peak_gb": rows[0]["peak_gb"], "of": len(rows), "by": by}

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """--forget-all clears them; a single value's --forget leaves them (a peak is no failure)."""
        return clear(db, TABLE, value)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        rows = list(
            db.query(
                f"select torch, device, model, count(distinct config) as configurations, count(*) as runs "
                f"from {TABLE} group by torch, device, model"
            )
        )
        return {"peaks": rows}
