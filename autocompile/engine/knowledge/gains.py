"""Gains: how far a one-move neighbour has gone past its parent's steady speed, across the device's studies.

Each neighbour that ran cleanly, from a parent that did, is stored with both speeds and the dimensions it
moved, per torch, device and model, with its parent's batch layout (`batch_layout`: its padding, and the attention
over packed rows). The largest ratio of the same move on the same model from a parent of the same layout
(`MoveGains.ceiling`), seen at least TIMES times, bounds what a neighbour can reach from its parent's measured
speed: a move that lost over padded batches says nothing of the same move over packed rows. The pruning
bound of a neighbour's warm-up (engine/runner.py) uses it instead of assuming any speed at all. Each
dimension's median gain (`MoveGains.by_dimension`) orders the neighbours' moves: what paid on this model
before is tried first (engine/strategy.py). A move not
seen so has no ceiling: the first neighbour to pack a batch or to record CUDA graphs may gain what no earlier
move did, and a move that slowed one model may speed up another.
"""

from __future__ import annotations

import statistics

import sqlite_utils

from autocompile.engine.knowledge.schema import TIMES, clear, Observer, open_file
from autocompile.engine.records import Record
from autocompile.space import DEFAULTS
from autocompile.trial.result import Status

TABLE = "gains"


def batch_layout(config: dict | None) -> str:
    """How a configuration lays out a batch's sequences, which a move's gain depends on: its padding
    ("longest", "multiple", "buckets"), or "pack/" and the attention over the packed rows."""
    config = {**DEFAULTS, **(config or {})}  # records written before a key existed
    return f"pack/{config['pack_attention']}" if config["padding"] == "pack" else str(config["padding"])


class MoveGains(Observer):
    """The one-move neighbours of one torch and device, each against its parent: told each finished trial,
    it keeps the neighbours' and says how far the best went past its parent (`ceiling`)."""

    def __init__(self, path: str | None, torch: str, device: str, model: str):
        self.db = open_file(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def take(self, study, trial) -> bool:
        """Remember `trial` of `study` where it is a neighbour that ran cleanly from a parent that did."""
        r = Record.of(trial)
        if r.parent is None or r.status != Status.OK or not r.steps_per_s:
            return False
        parent = Record.of(study.get_trials(deepcopy=False)[r.parent])
        if parent.status != Status.OK or not parent.steps_per_s:
            return False
        self.db[TABLE].upsert(
            {
                **self.key,
                "study": study.study_name,
                "trial": trial.number,
                "parent": r.parent,
                "moved": ",".join(r.changed or []),
                "parent_steps_per_s": parent.steps_per_s,
                "steps_per_s": r.steps_per_s,
                "layout": batch_layout(parent.config),
            },
            pk=("torch", "device", "model", "study", "trial"),
        )
        return True

    def ceiling(self, moved: list[str], parent_layout: str) -> dict | None:
        """The largest steady speed a stored neighbour of the same move (the dimensions `moved`) on this model,
        from a parent of the same layout (`batch_layout`), reached over its parent's (`ratio`), with the one that did
        (`by`) and how many were stored (`of`); None where fewer than TIMES are. A row stored before its
        parent's layout was kept has none, and bounds nothing."""
        rows = list(
            self.db[TABLE].rows_where(
                "torch = ? and device = ? and model = ? and moved = ? and layout = ?",
                [*self.key.values(), ",".join(moved), parent_layout],
            )
        )
        if len(rows) < TIMES:
            return None
        best = max(rows, key=lambda r: r["steps_per_s"] / r["parent_steps_per_s"])
        return {
            "ratio": best["steps_per_s"] / best["parent_steps_per_s"],
            "of": len(rows),
            "by": f"{best['study']} trial {best['trial']} ({best['moved']})",
        }

    def by_dimension(self) -> dict[str, float]:
        """Each dimension's median gain on this model, seen at least TIMES times: the median over the stored
        neighbours whose move included it of their steady speed over their parent's. The strategy tries the
        dimensions that paid in earlier studies before the rest (strategy._order)."""
        ratios: dict[str, list[float]] = {}
        for row in self.db[TABLE].rows_where("torch = ? and device = ? and model = ?", list(self.key.values())):
            for name in filter(None, row["moved"].split(",")):
                ratios.setdefault(name, []).append(row["steps_per_s"] / row["parent_steps_per_s"])
        return {name: statistics.median(seen) for name, seen in ratios.items() if len(seen) >= TIMES}

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """--forget-all clears them; a single value's --forget leaves them (a gain is no failure)."""
        return clear(db, TABLE, value)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        rows = list(
            db.query(
                f"select torch, device, model, count(*) as moves, max(steps_per_s / parent_steps_per_s) "
                f"as ratio from {TABLE} group by torch, device, model"
            )
        )
        return {"gains": rows}
