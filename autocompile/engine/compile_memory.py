"""Values that ran out of the trial limit while compiling, remembered across studies.

A move that multiplies what a compile does (`strategy.COMPILE_HEAVY`: the max-autotune modes,
coordinate descent, compiled autograd) costs a multiple of the same configuration without it, by a
factor that depends on the model: compiled autograd took 5.4x on llama-8b and 17x on the captioner
(H200, torch 2.11, 2026-11-26). Within a study `strategy.too_slow` learns it from the first trial
cut; this memory carries it to the device's next studies of the same model on the same torch (the
prior that issue 29 asks for), in the failure memory's file (`memory.store_path`). Each compiled
trial that holds such a value is stored against it: cut while compiling (its wall time), or warmed
up (its warm-up). A configuration holding a value that was cut TIMES times at least at this trial
limit, for this model, and never warmed up within it, is refused before launch (`reason`), with
the trials that showed it. `autocompile failures --forget` clears it as it clears failures.

A value outside COMPILE_HEAVY is stored the same way once a neighbour that moved to it was cut
while compiling where its parent had warmed up in less than half that time (`implicated`): the move
took the time. From then on every trial holding it is stored too, and the study's earlier ones that
warmed up with it. The captioner's neighbour turning on `triton.cudagraph_skip_dynamic_graphs` (its
parent warmed up in 20-30 s) was stuck compiling its backward at 241 s in captioner-fresh-7 and -8
alike, 15% of each search (H200, 2026-11-26).
"""

from __future__ import annotations

import json
import os

from autocompile.engine import memory
from autocompile.engine.memory import TIMES, _open
from autocompile.engine.records import config_columns
from autocompile.engine.strategy import compile_heavy_values
from autocompile.errors import UserError

TABLE = "compile_cuts"


def _open_table(path: str):
    db = _open(path)
    if not db[TABLE].exists():
        db[TABLE].create({"torch": str, "device": str, "model": str, "item": str, "study": str, "trial": int,
                          "outcome": str, "seconds": float}, pk=("torch", "device", "model", "item", "study", "trial"))
    return db


def outcome(record: dict) -> tuple[str, float] | None:
    """("cut", wall seconds) for a trial cut while compiling, ("warmed", warm-up seconds) for one that
    measured, else None (a failure, a pruning, a refusal: nothing said of its compile time)."""
    if record.get("status") == "timeout" and "while compiling" in (record.get("reason") or ""):
        return "cut", float(record.get("wall_s") or 0.0)
    if record.get("status") == "ok" and record.get("warmup_s"):
        return "warmed", float(record["warmup_s"])
    return None


class CompileMemory:
    """The store for one model on one torch and device: records outcomes (an Optuna-style callback,
    `memory(study, frozen_trial)`), and says which configurations are expected not to fit a limit."""

    def __init__(self, path: str, torch: str, device: str, model: str):
        self.db = _open_table(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def remember(self, record: dict, config: dict, study: str, trial: int, implicated=()) -> bool:
        """Store a trial's outcome against each value it holds that is compile-heavy, `implicated` by it,
        or stored already; whether any was."""
        seen = outcome(record)
        if not config.get("compile") or seen is None:
            return False
        items = set(_items(config)) | set(implicated) | (self._stored() & set(_all_items(config)))
        rows = [{**self.key, "item": item, "study": study, "trial": trial, "outcome": seen[0], "seconds": seen[1]}
                for item in sorted(items)]
        if rows:
            self.db[TABLE].insert_all(rows, replace=True)
        return bool(rows)

    def _stored(self) -> set[str]:
        where = "torch = ? and device = ? and model = ?"
        return {r["item"] for r in self.db.query(f"select distinct item from {TABLE} where {where}",
                                                 list(self.key.values()))}

    def __call__(self, study, frozen_trial) -> None:
        self.take(study, frozen_trial)

    def take(self, study, trial) -> bool:
        """Store `trial` of `study` (a first run: a finalist's rerun says nothing new); where it implicates a
        value, the study's earlier trials that warmed up with it too. Whether it stored anything."""
        attrs, trials = trial.user_attrs, study.get_trials(deepcopy=False)
        if "status" not in attrs or not attrs.get("config") or "remeasure_of" in attrs:
            return False
        parent = trials[attrs["parent"]].user_attrs if "parent" in attrs else None
        moved = implicated(attrs, parent)
        for t in trials if moved else ():
            a = t.user_attrs
            if t.number != trial.number and a.get("config") and "remeasure_of" not in a and \
                    (outcome(a) or ("",))[0] == "warmed" and set(moved) & set(_all_items(a["config"])):
                self.remember(a, a["config"], study.study_name, t.number)
        return self.remember(attrs, attrs["config"], study.study_name, trial.number, moved)

    def reason(self, config: dict, limit_s: float) -> str | None:
        """Why `config` is expected not to warm up within `limit_s` here, or None."""
        items = _all_items(config) if config.get("compile") else []
        where = f"torch = ? and device = ? and model = ? and item in ({', '.join('?' * len(items))})"
        rows = list(self.db[TABLE].rows_where(where, [*self.key.values(), *items])) if items else []
        for item in items:
            held = [r for r in rows if r["item"] == item]
            cut = [r for r in held if r["outcome"] == "cut" and r["seconds"] >= 0.9 * limit_s]
            if len(cut) >= TIMES and not any(r["outcome"] == "warmed" and r["seconds"] < limit_s for r in held):
                shown = ", ".join(f"study {r['study']} trial {r['trial']}" for r in cut[:4])
                return (f"expected not to fit the {limit_s:.0f} s trial limit: {item} ran out of its limit while "
                        f"compiling {len(cut)} times here on {self.key['model']} ({shown}), and never warmed up "
                        f"within {limit_s:.0f} s")
        return None


def _items(config: dict) -> list[str]:
    return [f"{name}={json.dumps(value)}" for name, value in compile_heavy_values(config)]


def _all_items(config: dict) -> list[str]:
    """Every value of a configuration, as the memory names one (`DIM=VALUE`)."""
    return [f"{name}={json.dumps(value)}" for name, value in config_columns(config).items()]


def implicated(attrs: dict, parent: dict | None) -> list[str]:
    """The values a neighbour moved to, where it was cut while compiling and its parent had warmed up in
    less than half the seconds it ran: the move, not the rest of the configuration, took the time."""
    seen, before = outcome(attrs), outcome(parent or {})
    if not seen or seen[0] != "cut" or not before or before[0] != "warmed" or before[1] >= seen[1] / 2:
        return []
    columns = config_columns(attrs["config"])
    return [f"{name}={json.dumps(columns.get(name))}" for name in attrs.get("changed") or ()]


def forget(path: str, what: str | None) -> int:
    """`autocompile failures --forget DIM=VALUE` (or all, None): the remembered cuts of that value
    and its remembered failures (`memory.forget`, whose clear line says when neither holds it)."""
    cuts = 0
    if os.path.exists(path):
        db = _open_table(path)
        where = (None, None) if what is None else ("item = ?", ["{}={}".format(*memory._parse(what))])
        cuts = db[TABLE].count_where(*where)
        db[TABLE].delete_where(*where)
    try:
        return memory.forget(path, what) + cuts
    except UserError:
        if cuts:  # remembered as cuts only
            return cuts
        raise


def listing(path: str) -> list[dict]:
    """The values that ran out of their limit while compiling at least TIMES times, per torch,
    device and model, with the seconds each such run had and the longest warm-up that finished."""
    db = _open_table(path)
    return list(db.query(f"""
        select torch, device, model, item, sum(outcome = 'cut') as cuts,
               group_concat(case when outcome = 'cut' then cast(round(seconds) as int) end, ', ') as cut_after_s,
               max(case when outcome = 'warmed' then seconds end) as warmed_in_s
        from {TABLE} group by torch, device, model, item having cuts >= {TIMES}
        order by torch, device, model, item"""))


def study_key(study) -> tuple[str, str, str]:
    """(torch, device, model) of a finished study: its model, and the torch and device its trials recorded."""
    model = (study.user_attrs.get("settings") or {}).get("model")
    measured = [t.user_attrs for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("torch") and t.user_attrs.get("device_name")]
    if not model or not measured:
        raise UserError(f"study {study.study_name!r} names no model or has no trial that recorded its torch and device")
    return measured[0]["torch"], measured[0]["device_name"], model


def learn(path: str, study) -> int:
    """Feed a finished study's trials into the memory (a study run before the memory kept cuts, or on
    another machine), in the order they ran: keyed by `study_key`. How many trials it stored (cut while
    compiling, or warmed up, with a compile-heavy or implicated value)."""
    store = CompileMemory(path, *study_key(study))
    return sum(store.take(study, t) for t in study.get_trials(deepcopy=False))
