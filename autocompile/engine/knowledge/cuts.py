"""Compile cuts: values that ran out of the trial limit while compiling here, refused before launch.

A value that multiplies what a compile does costs a multiple of the same configuration without
it, by a factor that depends on the model; which values do is the engine's to say (`heavy`, given
to the store). Within a study `cost.too_slow` learns it from the first trial cut; the store
carries it to the device's next studies of the same model on the same torch. Each compiled trial
that holds such a value is stored against it: cut while compiling (its wall time), or warmed up
(its warm-up). A configuration holding a value that was cut TIMES times at least at this trial
limit, for this model, and never warmed up within it, is refused before launch (`reason`), with
the trials that showed it.

A value not compile-heavy is stored the same way once a neighbour that moved to it was cut while
compiling where its parent had warmed up in less than half that time (`implicated`): the move
took the time. From then on every trial holding it is stored too, and the study's earlier ones
that warmed up with it. The evidence for both: docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils

from autocompile.engine.knowledge.schema import TIMES, Observer, item, open_file
from autocompile.engine.records import Record, config_columns
from autocompile.trial.result import Status

TABLE = "compile_cuts"


def outcome(record: dict) -> tuple[str, float] | None:
    """("cut", wall seconds) for a trial cut while compiling, ("warmed", warm-up seconds) for one that
    measured, else None (a failure, a pruning, a refusal: nothing said of its compile time)."""
    if record.get("status") == Status.TIMEOUT and "while compiling" in (record.get("reason") or ""):
        return "cut", float(record.get("wall_s") or 0.0)
    if record.get("status") == Status.OK and record.get("warmup_s"):
        return "warmed", float(record["warmup_s"])
    return None


def _all_items(config: dict) -> list[str]:
    """Every value of a configuration, as the store names one (`DIM=VALUE`)."""
    return [item(name, value) for name, value in config_columns(config).items()]


def implicated(attrs: dict, parent: dict | None) -> list[str]:
    """The values a neighbour moved to, where it was cut while compiling and its parent had warmed up in
    less than half the seconds it ran: the move, not the rest of the configuration, took the time."""
    seen, before = outcome(attrs), outcome(parent or {})
    if not seen or seen[0] != "cut" or not before or before[0] != "warmed" or before[1] >= seen[1] / 2:
        return []
    columns = config_columns(attrs["config"])
    return [item(name, columns.get(name)) for name in attrs.get("changed") or ()]


class CompileCuts(Observer):
    """The compile cuts of one model on one torch and device: told each finished trial, it says which
    configurations are expected not to fit a limit. `heavy(config)` names the (dimension, value)
    pairs of a configuration the engine counts as compile-heavy."""

    def __init__(self, path: str, torch: str, device: str, model: str, heavy: Callable[[dict], list[tuple[str, object]]]):
        self.db, self.heavy = open_file(path), heavy
        self.key = {"torch": torch, "device": device, "model": model}

    def remember(self, record: dict, config: dict, study: str, trial: int, implicated=()) -> bool:
        """Store a trial's outcome against each value it holds that is compile-heavy, `implicated` by it,
        or stored already; whether any was."""
        seen = outcome(record)
        if not config.get("compile") or seen is None:
            return False
        heavy = {item(name, value) for name, value in self.heavy(config)}
        items = heavy | set(implicated) | (self._stored() & set(_all_items(config)))
        rows = [
            {**self.key, "item": each, "study": study, "trial": trial, "outcome": seen[0], "seconds": seen[1]}
            for each in sorted(items)
        ]
        if rows:
            self.db[TABLE].insert_all(rows, replace=True)
        return bool(rows)

    def _stored(self) -> set[str]:
        where = "torch = ? and device = ? and model = ?"
        return {r["item"] for r in self.db.query(f"select distinct item from {TABLE} where {where}", list(self.key.values()))}

    def take(self, study, trial) -> bool:
        """Store `trial` of `study` (a first run: a finalist's rerun says nothing new); where it implicates a
        value, the study's earlier trials that warmed up with it too. Whether it stored anything."""
        r, trials = Record.of(trial), study.get_trials(deepcopy=False)
        if r.status is None or not r.config or r.remeasure_of is not None:
            return False
        parent = Record.of(trials[r.parent]).attrs if r.parent is not None else None
        moved = implicated(r.attrs, parent)
        for other in (Record.of(t) for t in trials) if moved else ():
            if (
                other.number != trial.number
                and other.config
                and other.remeasure_of is None
                and (outcome(other.attrs) or ("",))[0] == "warmed"
                and set(moved) & set(_all_items(other.config))
            ):
                self.remember(other.attrs, other.config, study.study_name, other.number)
        return self.remember(r.attrs, r.config, study.study_name, trial.number, moved)

    def reason(self, config: dict, limit_s: float) -> str | None:
        """Why `config` is expected not to warm up within `limit_s` here, or None. Where several of its values
        say so, the one with the fewest trials stored against it: the most particular to this configuration
        (a compile-heavy mode before the whole model, which every whole-model trial holds)."""
        own = _all_items(config) if config.get("compile") else []
        counted = [item(name, value) for name, value in self.heavy(config)] if config.get("compile") else []
        items = list(dict.fromkeys(own + counted))  # with what it counts as (a modular one: the whole model)
        where = f"torch = ? and device = ? and model = ? and item in ({', '.join('?' * len(items))})"
        rows = list(self.db[TABLE].rows_where(where, [*self.key.values(), *items])) if items else []
        found = []
        for each in items:
            held = [r for r in rows if r["item"] == each]
            cut = [r for r in held if r["outcome"] == "cut" and r["seconds"] >= 0.9 * limit_s]
            if len(cut) >= TIMES and not any(r["outcome"] == "warmed" and r["seconds"] < limit_s for r in held):
                found.append((len(held), each, cut))
        if not found:
            return None
        _, each, cut = min(found, key=lambda x: x[0])
        shown = ", ".join(f"study {r['study']} trial {r['trial']}" for r in cut[:4])
        each += "" if each in own else ", which it amounts to,"
        return (
            f"expected not to fit the {limit_s:.0f} s trial limit: {each} ran out of its limit while "
            f"compiling {len(cut)} times here on {self.key['model']} ({shown}), and never warmed up "
            f"within {limit_s:.0f} s"
        )

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """The cuts and warm-ups stored against `value`, or all (None)."""
        where = (None, None) if value is None else ("item = ?", ["{}={}".format(*value)])
        count = db[TABLE].count_where(*where)
        db[TABLE].delete_where(*where)
        return count

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        """The values that ran out of their limit while compiling at least TIMES times, per torch,
        device and model, with the seconds each such run had and the longest warm-up that finished."""
        return {
            "cuts": list(
                db.query(f"""
            select torch, device, model, item, sum(outcome = 'cut') as cuts,
                   group_concat(case when outcome = 'cut' then cast(round(seconds) as int) end, ', ') as cut_after_s,
                   max(case when outcome = 'warmed' then seconds end) as warmed_in_s
            from {TABLE} group by torch, device, model, item having cuts >= {TIMES}
            order by torch, device, model, item""")
            )
        }
