"""The knowledge store as a whole: forget, list and learn over every observer's tables at once."""

from __future__ import annotations

import os

from autocompile.engine.knowledge.cold import ColdRuns
from autocompile.engine.knowledge.cuts import CompileCuts
from autocompile.engine.knowledge.failures import Failures
from autocompile.engine.knowledge.gains import MoveGains
from autocompile.engine.knowledge.paces import Paces
from autocompile.engine.knowledge.peaks import Peaks
from autocompile.engine.knowledge.plain import PlainCompiles
from autocompile.engine.knowledge.schema import Observer, open_file, parse
from autocompile.engine.records import Record
from autocompile.errors import UserError

KINDS = (Failures, CompileCuts, ColdRuns, MoveGains, Paces, Peaks, PlainCompiles)


def forget(path: str, what: str | None) -> int:
    """`autocompile knowledge --forget DIM=VALUE`: every row that holds that value (failures and the
    pairs with it, compile cuts); --forget-all (None): everything. How many rows went."""
    if not os.path.exists(path):
        raise UserError(f"no knowledge store at {path}")
    db = open_file(path)
    value = None if what is None else parse(what)
    count = sum(kind.forget(db, value) for kind in KINDS)
    if value is not None and not count:
        raise UserError(f"no remembered failure with {value[0]}={value[1]} in {path} (see `autocompile knowledge`)")
    return count


def listing(path: str) -> dict:
    """What `autocompile knowledge` shows, every observer's listing in one: `left_out` and `failed_trials`
    (failures), `cuts` (compile cuts), `cold` (cold runs), `gains` (neighbours against their parents), `paces`
    (the configurations measured, per workload), `peaks` (their peak memory, per workload), `plain`
    (plain torch.compile's whole-model compiles); empty where there is no file."""
    db = open_file(path if os.path.exists(path) else None)
    return {name: rows for kind in KINDS for name, rows in kind.listing(db).items()}


def study_key(study) -> tuple[str, str, str]:
    """(torch, device, model) of a finished study: its model, and the torch and device its trials recorded."""
    model = (study.user_attrs.get("settings") or {}).get("model")
    records = (Record.of(t).attrs for t in study.get_trials(deepcopy=False))
    measured = [a for a in records if a.get("torch") and a.get("device_name")]
    if not model or not measured:
        raise UserError(f"study {study.study_name!r} names no model or has no trial that recorded its torch and device")
    return measured[0]["torch"], measured[0]["device_name"], model


def learn(study, observers: dict[str, Observer]) -> dict[str, int]:
    """Feed a finished study's trials to each observer in the order they ran (a study run before the
    store kept what they ask, or on another machine): how many trials each stored, by name."""
    trials = study.get_trials(deepcopy=False)
    return {name: sum(observer.take(study, t) for t in trials) for name, observer in observers.items()}
