"""The knowledge store's file: where it lives, its tables, how a value is named, the observers' interface.

One SQLite file (sqlite-utils) on the machine keeps what finished trials taught across studies,
each row keyed by the torch version and the device's name (a newer torch starts clean). Each
observer (`failures`, `cuts`, `cold`, `gains`, `paces`, `peaks`, `plain`) is told every finished trial,
as an Optuna callback, and keeps its own tables here; `store` forgets, lists and learns over all of them.
The tables and columns are those the first stores wrote, and a column added since is added to an older file
when it opens (its old rows hold none): a file they wrote (studies/gpu-knowledge.db) reads as it did, and a
store still named by its first name (failures.db) is read where no knowledge.db is beside it.
"""

from __future__ import annotations

import json
import os
import sqlite3

import sqlite_utils

from autocompile.errors import UserError

FILE_NAME = "knowledge.db"
OLD_FILE_NAME = "failures.db"  # the store's file before it was named for what it holds
TIMES = 2  # what happened this many times here is known: a value left out, a limit expected not to fit

# table: (columns, primary key)
TABLES = {
    "failures": (
        {
            "torch": str,
            "device": str,
            "item": str,
            "dims": str,
            "signature": str,
            "storage": str,
            "study": str,
            "trial": int,
            "status": str,
        },
        ("torch", "device", "item", "signature", "storage", "study", "trial"),
    ),
    "ran": ({"torch": str, "device": str, "item": str, "study": str, "trial": int}, ("torch", "device", "item")),
    "compile_cuts": (
        {"torch": str, "device": str, "model": str, "item": str, "study": str, "trial": int, "outcome": str, "seconds": float},
        ("torch", "device", "model", "item", "study", "trial"),
    ),
    "cold_runs": (
        {
            "torch": str,
            "device": str,
            "model": str,
            "study": str,
            "trial": int,
            "of": int,
            "added_s": float,
            "cold_added_s": float,
        },
        ("torch", "device", "model", "study", "trial"),
    ),
    "gains": (
        {
            "torch": str,
            "device": str,
            "model": str,
            "study": str,
            "trial": int,
            "parent": int,
            "moved": str,
            "parent_steps_per_s": float,
            "steps_per_s": float,
            "layout": str,
        },
        ("torch", "device", "model", "study", "trial"),
    ),
    "paces": (
        {"torch": str, "device": str, "model": str, "study": str, "trial": int, "config": str, "steps_per_s": float},
        ("torch", "device", "model", "study", "trial"),
    ),
    "peaks": (
        {"torch": str, "device": str, "model": str, "study": str, "trial": int, "config": str, "peak_gb": float},
        ("torch", "device", "model", "study", "trial"),
    ),
    "plain_compiles": (
        {"torch": str, "device": str, "model": str, "study": str, "trial": int, "outcome": str, "seconds": float},
        ("torch", "device", "model", "study", "trial"),
    ),
}


def store_path(override: str | None = None) -> str:
    """--knowledge-store, else $AUTOCOMPILE_CACHE/knowledge.db, else ~/.cache/autocompile/ (XDG_CACHE_HOME);
    in the folder, an old failures.db where no knowledge.db is there yet."""
    if override:
        return override
    folder = os.environ.get("AUTOCOMPILE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autocompile"
    )
    path, old = os.path.join(folder, FILE_NAME), os.path.join(folder, OLD_FILE_NAME)
    return old if not os.path.exists(path) and os.path.exists(old) else path


def device_name(device: str) -> str:
    """The device's name as the store keys it: the GPU's model, or "cpu" (a CUDA space listed on
    a machine without a GPU: "cuda", which no measured trial is keyed by)."""
    import torch

    if not device.startswith("cuda"):
        return "cpu"
    return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cuda"


def open_file(path: str | None) -> sqlite_utils.Database:
    """The store at `path`, made with its tables where it or they are missing, and their columns added since
    where an older file lacks them (None: an empty one in memory)."""
    if path is None:
        db = sqlite_utils.Database(memory=True)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        db = sqlite_utils.Database(path)
    for name, (columns, pk) in TABLES.items():
        if not db[name].exists():
            db[name].create(columns, pk=pk)
            continue
        for column, kind in columns.items():
            if column not in db[name].columns_dict:
                try:
                    db[name].add_column(column, kind)
                except sqlite3.OperationalError:  # another search's process added it first
                    if column not in db[name].columns_dict:
                        raise
    return db


def item(name: str, value) -> str:
    """One value of a configuration as the store names it: `DIM=VALUE`, the value as JSON."""
    return f"{name}={json.dumps(value)}"


def parse(text: str) -> tuple[str, str]:
    """ "dim=value" -> (dim, the value as JSON): the value read as JSON, else as a plain string."""
    if "=" not in text:
        raise UserError(f"--forget takes DIM=VALUE (e.g. fullgraph=true), got {text!r}")
    name, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return name, json.dumps(value)


def clear(db: sqlite_utils.Database, table: str, value: tuple[str, str] | None) -> int:
    """Forget a table whose rows hold no failing value: --forget-all (None) clears it, a single value's --forget
    leaves it. How many rows went."""
    if value is not None:
        return 0
    count = db[table].count
    db[table].delete_where()
    return count


class Observer:
    """One question the store answers from finished trials. It is told each one as an Optuna
    callback, `observer(study, frozen_trial)`, which `take`s it; it answers with its own query
    (`Failures.reason`, `CompileCuts.reason`, `ColdRuns.scale`). Over the whole file, `forget`
    clears its rows (all, or those of one value) and `listing` says what it knows."""

    def __call__(self, study, frozen_trial) -> None:
        self.take(study, frozen_trial)

    def take(self, study, trial) -> bool:
        """Store what `trial` of `study` shows of this question; whether it stored anything."""
        raise NotImplementedError

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """Delete this observer's rows that hold `value` (DIM, VALUE as JSON), or all (None); how many went."""
        raise NotImplementedError

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        """What `autocompile knowledge` shows of this observer's rows, by name."""
        raise NotImplementedError
