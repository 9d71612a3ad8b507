"""Compile-heavy values that ran out of the trial limit while compiling, remembered across studies.

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
"""

from __future__ import annotations

import json
import os

from autocompile.engine import memory
from autocompile.engine.memory import TIMES, _open
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

    def remember(self, record: dict, config: dict, study: str, trial: int) -> None:
        seen = outcome(record)
        if not config.get("compile") or seen is None:
            return
        rows = [{**self.key, "item": item, "study": study, "trial": trial, "outcome": seen[0], "seconds": seen[1]}
                for item in _items(config)]
        if rows:
            self.db[TABLE].insert_all(rows, replace=True)

    def __call__(self, study, frozen_trial) -> None:
        attrs = frozen_trial.user_attrs
        if "status" in attrs and attrs.get("config") and "remeasure_of" not in attrs:
            self.remember(attrs, attrs["config"], study.study_name, frozen_trial.number)

    def reason(self, config: dict, limit_s: float) -> str | None:
        """Why `config` is expected not to warm up within `limit_s` here, or None."""
        for item in _items(config) if config.get("compile") else ():
            rows = list(self.db[TABLE].rows_where("torch = ? and device = ? and model = ? and item = ?",
                                                  [self.key["torch"], self.key["device"], self.key["model"], item]))
            cut = [r for r in rows if r["outcome"] == "cut" and r["seconds"] >= 0.9 * limit_s]
            if len(cut) >= TIMES and not any(r["outcome"] == "warmed" and r["seconds"] < limit_s for r in rows):
                shown = ", ".join(f"study {r['study']} trial {r['trial']}" for r in cut[:4])
                return (f"expected not to fit the {limit_s:.0f} s trial limit: {item} ran out of its limit while "
                        f"compiling {len(cut)} times here on {self.key['model']} ({shown}), and never warmed up "
                        f"within {limit_s:.0f} s")
        return None


def _items(config: dict) -> list[str]:
    return [f"{name}={json.dumps(value)}" for name, value in compile_heavy_values(config)]


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
    another machine): keyed by `study_key`. How many trials with a compile-heavy value it remembered
    (cut while compiling, or warmed up)."""
    store = CompileMemory(path, *study_key(study))
    held = 0
    for t in study.trials:
        a = t.user_attrs
        if a.get("config") and "remeasure_of" not in a and _items(a["config"]) and outcome(a):
            store.remember(a, a["config"], study.study_name, t.number)
            held += 1
    return held
