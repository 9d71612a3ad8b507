"""Plain torch.compile: what its whole-model compile took on a model here, so the next study of that model
places it by what it is expected to cost.

Each plain torch.compile baseline that warmed up (its warm-up) or ran out of its limit while compiling
(the seconds it had) is stored, per torch, device and model. Where one was cut, or warmed up in more than
the next study's limit for it, that study explores first and runs plain torch.compile last with what is
left, or records it as not run with the prediction (engine/claims.py).
"""

from __future__ import annotations

import sqlite_utils

from autocompile.engine.knowledge.schema import clear, Observer, open_file
from autocompile.engine.records import Record, Role
from autocompile.trial.result import Status

TABLE = "plain_compiles"


class PlainCompiles(Observer):
    """Plain torch.compile's whole-model compiles of one model on one torch and device: told each finished
    trial, it keeps the baseline's, and says what the next is expected to take (`expected`)."""

    def __init__(self, path: str | None, torch: str, device: str, model: str):
        self.db = open_file(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def take(self, study, trial) -> bool:
        r = Record.of(trial)
        if r.role != Role.COMPILE_DEFAULTS or r.status is None:
            return False
        cut = r.status == Status.TIMEOUT and "while compiling" in (r.reason or "")
        if not cut and not (r.status == Status.OK and r.warmup_s):
            return False
        seconds = (r.wall_s or 0.0) if cut else r.warmup_s
        self.db[TABLE].upsert(
            {
                **self.key,
                "study": study.study_name,
                "trial": trial.number,
                "outcome": "cut" if cut else "warmed",
                "seconds": seconds,
            },
            pk=("torch", "device", "model", "study", "trial"),
        )
        return True

    def expected(self) -> dict | None:
        """What the next whole-model compile is expected to take at least: the longest a stored one ran
        before it was cut (`cut`: True), else the shortest warm-up; with where it was seen; None: none stored."""
        rows = list(self.db[TABLE].rows_where("torch = ? and device = ? and model = ?", list(self.key.values())))
        cuts = [r for r in rows if r["outcome"] == "cut"]
        if cuts:
            row = max(cuts, key=lambda r: r["seconds"])
        elif rows:
            row = min(rows, key=lambda r: r["seconds"])
        else:
            return None
        return {"seconds": row["seconds"], "cut": bool(cuts), "from": f"{row['study']} trial {row['trial']}"}

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """--forget-all clears them; a single value's --forget leaves them (plain torch.compile has no value)."""
        return clear(db, TABLE, value)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        return {"plain": list(db[TABLE].rows_where(order_by="torch, device, model, study, trial"))}
