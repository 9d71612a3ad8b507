"""Failures: values that failed the same way twice here, left out of later studies.

When a compiled trial fails (failed, compile_error, crashed, oom, or infeasible because it hit
the recompile limit), its signature (status, exception type, failing layer, innermost torch
frame) is stored against each searched dimension's value and each pair of values. A value or pair
that failed with one signature in two trials (any studies) here, and never ran cleanly here, is
left out: the search records a configuration holding it infeasible before launch
(`Failures.reason`), and `autocompile space` lists it.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3

import sqlite_utils

from autocompile.engine.knowledge.schema import TIMES, Observer, item, open_file
from autocompile.engine.records import Record
from autocompile.errors import UserError
from autocompile.trial.result import FAILURES, Status


# Failures that are the engine's, not the values': a trial's process forked after CUDA had started in
# its parent (autocompile.trial.prestart checks for it; a failure of this kind must never rule values out).
ENGINE_FAULTS = ("Cannot re-initialize CUDA in forked subprocess",)


def signature(record: dict) -> str | None:
    """How a trial failed, as one line (status, exception type, failing layer, innermost torch
    frame), or None for an outcome that says nothing of the values (ok, timeout, pruned, numerics,
    memory limit, rejected before launch, a fault of the engine's)."""
    status = record.get("status")
    if any(fault in (record.get("reason") or "") for fault in ENGINE_FAULTS):
        return None
    if status == Status.INFEASIBLE and record.get("recompile_limit_hit"):
        return "infeasible: hit the recompile limit"
    if status not in FAILURES:  # remembered: a failure (and a recompile-limit hit)
        return None
    kind = re.match(r"([A-Za-z_][\w.]*): ", record.get("reason") or "")
    parts = [
        status,
        kind and kind.group(1),
        record.get("failing_layer") and f"in {record['failing_layer']}",
        record.get("torch_frame") and f"at {record['torch_frame']}",
    ]
    return " ".join(p for p in parts if p)


def _item(pairs) -> str:
    return ", ".join(item(name, value) for name, value in pairs)


def items(values: dict) -> dict[str, list]:
    """Each value and each pair of values of a configuration: {"a=1, b=true": [["a", 1], ["b", true]]}."""
    singles = sorted(values.items())
    groups = [[s] for s in singles] + [list(p) for p in itertools.combinations(singles, 2)]
    return {_item(g): [list(x) for x in g] for g in groups}


def left_out(db: sqlite_utils.Database, torch: str | None = None, device: str | None = None) -> list[dict]:
    """Values and pairs that failed with one signature in TIMES trials and never ran cleanly, for
    one torch and device (or all): a pair only where neither of its values is left out itself."""
    where = "" if torch is None else "and f.torch = :torch and f.device = :device"
    rows = db.query(
        f"""
        select f.torch, f.device, f.item, f.dims, f.signature, count(*) as count,
               json_group_array(json_array(f.study, f.trial)) as trials
        from failures f left join ran r on r.torch = f.torch and r.device = f.device and r.item = f.item
        where r.item is null {where}
        group by f.torch, f.device, f.item, f.signature having count(*) >= {TIMES}
        order by f.torch, f.device, f.item""",
        {"torch": torch, "device": device},
    )
    out = [{**row, "dims": json.loads(row["dims"]), "trials": sorted(json.loads(row["trials"]))} for row in rows]
    singles = {(r["torch"], r["device"], r["item"]) for r in out if len(r["dims"]) == 1}
    return [r for r in out if len(r["dims"]) == 1 or not any((r["torch"], r["device"], _item([d])) in singles for d in r["dims"])]


def why(entry: dict) -> str:
    times = "twice" if entry["count"] == 2 else f"{entry['count']} times"
    shown = ", ".join(f"study {s} trial {n}" for s, n in entry["trials"][:4])
    return f"failed {times} here with {entry['signature']} ({shown})"


class Failures(Observer):
    """The failures of one search space's torch and device: told each finished trial, it says which
    configurations it leaves out."""

    def __init__(self, path: str, space, device: str, storage: str = ""):
        self.path, self.space, self.storage = path, space, storage
        self.torch, self.device = space.caps.torch_version, device
        try:
            self.db = open_file(path)
        except (OSError, sqlite3.Error) as exc:
            raise UserError(f"cannot open the knowledge store {path}: {exc}") from None
        self._left: list[dict] | None = None

    def left_out(self) -> list[dict]:
        if self._left is None:
            self._left = left_out(self.db, self.torch, self.device)
        return self._left

    def reason(self, config: dict) -> str | None:
        """Why a configuration is left out here (it holds a value or pair that failed twice), or None."""
        values = {name: json.dumps(v) for name, v in self.space.searched_values(config).items()}
        for entry in self.left_out():
            if all(values.get(name) == json.dumps(value) for name, value in entry["dims"]):
                return f"left out: {entry['item']} {why(entry)}"
        return None

    def remember(self, record: dict, config: dict, study: str, trial: int) -> None:
        """Store a compiled trial's outcome: its failure signature against its values, or that
        its values ran cleanly (which clears them)."""
        if not config.get("compile"):
            return
        found = items(self.space.searched_values(config))
        key = {"torch": self.torch, "device": self.device, "study": study, "trial": trial}
        if record.get("status") == Status.OK:
            self.db["ran"].insert_all(({**key, "item": each} for each in found), ignore=True)
        elif (sig := signature(record)) is not None:
            self.db["failures"].insert_all(
                (
                    {
                        **key,
                        "item": each,
                        "dims": json.dumps(dims),
                        "signature": sig,
                        "storage": self.storage,
                        "status": record["status"],
                    }
                    for each, dims in found.items()
                ),
                replace=True,
            )
        self._left = None

    def take(self, study, trial) -> bool:
        """Remember `trial` of `study` where it recorded an outcome and a configuration."""
        r = Record.of(trial)
        if r.status is None or not r.config:
            return False
        self.remember(r.attrs, r.config, study.study_name, trial.number)
        return True

    @staticmethod
    def forget(db: sqlite_utils.Database, value: tuple[str, str] | None) -> int:
        """The failures that hold `value` (and the pairs with it), or all and the clean runs too (None)."""
        if value is None:
            count = db["failures"].count + db["ran"].count
            db["failures"].delete_where()
            db["ran"].delete_where()
            return count
        name, dumped = value
        ids = [
            r["rowid"]
            for r in db.query("select rowid, dims from failures")
            if any(d[0] == name and json.dumps(d[1]) == dumped for d in json.loads(r["dims"]))
        ]
        if ids:
            db.execute(f"delete from failures where rowid in ({','.join('?' * len(ids))})", ids)
            db.conn.commit()
        return len(ids)

    @staticmethod
    def listing(db: sqlite_utils.Database) -> dict:
        """The left-out values and pairs of every torch and device, and how many failed trials are stored."""
        trials = next(db.query("select count(*) as n from (select distinct torch, device, storage, study, trial from failures)"))[
            "n"
        ]
        return {"left_out": left_out(db), "failed_trials": trials}
