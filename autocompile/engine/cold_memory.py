"""How a reconstructed warm-up compares with a cold one, remembered across studies, so that the
finalist round plans its cold run from what such runs took.

A finalist whose warm-up was reconstructed (the shared compile cache had some of its graphs) is run
from empty caches in the round (finalists.cold_pick). The round's time is kept before that run
(finalists.finalist_reserve), from the seconds the reconstruction added for the graphs it loaded.
On the captioner those seconds fell short: its cold runs took 1.14-1.89 times them over the warm-up
measured with the cache (median 1.74; captioner-fresh-5 to -7, H200, torch 2.11, 2026-11-26), so
captioner-fresh-7's cold run took 52 s where about 37 s were kept, and the round left out its third
finalist. On llama-8b they took 0.83-1.06 times them. On the captioner, part of it was a graph's
first compile in the shared cache finding kernels other graphs had compiled in Triton's cache, which
an empty cache does not (captioner-fresh-8's trial 16); Triton's cache is each trial's own since
(`trial.caches.triton_root`), and the next rounds still fell 16-22% short (captioner-fresh-10 and
-11, H100, 2026-11-26: their cold runs took 2.37x the seconds added).

Each cold run of a round is stored, per model, torch and device, in the failure memory's file
(`memory.store_path`): the seconds the reconstruction added, and the seconds the cold run took over
the measured warm-up. The median ratio of the latest five (`ColdMemory.scale`) scales the added
seconds when the device's next study of that model plans its round; the study records it
(`cold_scale`). The reconstructed warm-ups themselves stay as measured and reconstructed.
"""

from __future__ import annotations

import statistics

from autocompile.engine.memory import _open

TABLE = "cold_runs"
# A reconstruction that added less than this says little of a ratio (the CPU toy's add tenths of a second).
MIN_ADDED_S = 1.0
# The scale is the median of the latest cold runs only: what a reconstruction misses changes with
# autocompile (Triton's cache became each trial's own after captioner-fresh-8, `trial.caches`).
LATEST = 5


def _open_table(path: str):
    db = _open(path)
    if not db[TABLE].exists():
        db[TABLE].create({"torch": str, "device": str, "model": str, "study": str, "trial": int, "of": int,
                          "added_s": float, "cold_added_s": float}, pk=("torch", "device", "model", "study", "trial"))
    return db


def observed(cold: dict, first: dict) -> tuple[float, float] | None:
    """(seconds the reconstruction of `first` added, seconds its cold run `cold` took over `first`'s
    measured warm-up), or None where `cold` is not a clean cold run of a reconstructed trial."""
    rebuilt = first.get("reconstruction") or {}
    if cold.get("status") != "ok" or cold.get("warmup_kind") != "cold" or rebuilt.get("added_s", 0) < MIN_ADDED_S:
        return None
    return float(rebuilt["added_s"]), float(cold["warmup_s"]) - float(rebuilt["measured_s"])


class ColdMemory:
    """The store for one model on one torch and device: records the round's cold runs (an Optuna-style
    callback, `memory(study, frozen_trial)`), and says what they showed (`scale`)."""

    def __init__(self, path: str, torch: str, device: str, model: str):
        self.db = _open_table(path)
        self.key = {"torch": torch, "device": device, "model": model}

    def remember(self, study: str, trial: int, of: int, seen: tuple[float, float]) -> None:
        where = "torch = ? and device = ? and model = ? and study = ? and trial = ?"
        self.db[TABLE].delete_where(where, [*self.key.values(), study, trial])  # stored again: now the latest
        self.db[TABLE].insert({**self.key, "study": study, "trial": trial, "of": of, "added_s": seen[0],
                               "cold_added_s": seen[1]})

    def __call__(self, study, frozen_trial) -> None:
        self.take(study, frozen_trial)

    def take(self, study, trial) -> bool:
        """Remember `trial` of `study` where it is a clean cold run of the round (`observed`); whether it was."""
        attrs = trial.user_attrs
        if not attrs.get("cold_check") or "remeasure_of" not in attrs:
            return False
        seen = observed(attrs, study.get_trials(deepcopy=False)[attrs["remeasure_of"]].user_attrs)
        if seen:
            self.remember(study.study_name, trial.number, attrs["remeasure_of"], seen)
        return bool(seen)

    def scale(self) -> dict | None:
        """What the LATEST stored cold runs took over their measured warm-ups, as a multiple of what their
        reconstructions added (the median), with how many and which runs; None where none is stored."""
        rows = list(self.db[TABLE].rows_where("torch = ? and device = ? and model = ?", list(self.key.values()),
                                              order_by="rowid desc", limit=LATEST))[::-1]
        if not rows:
            return None
        ratios = [r["cold_added_s"] / r["added_s"] for r in rows]
        return {"scale": round(statistics.median(ratios), 3), "runs": len(rows),
                "from": [f"{r['study']} trial {r['trial']}" for r in rows]}


def listing(path: str) -> list[dict]:
    """Per torch, device and model: their `scale`, from the latest cold runs stored."""
    db = _open_table(path)
    keys = db.execute(f"select distinct torch, device, model from {TABLE} order by torch, device, model").fetchall()
    return [{"torch": t, "device": d, "model": m, **ColdMemory(path, t, d, m).scale()} for t, d, m in keys]


def learn(path: str, study, key: tuple[str, str, str]) -> int:
    """Feed a finished study's cold runs of the round into the memory, under `key` (torch, device,
    model); how many it remembered."""
    store = ColdMemory(path, *key)
    return sum(store.take(study, t) for t in study.get_trials(deepcopy=False))


def forget(path: str) -> int:
    """Clear every stored cold run; how many there were."""
    db = _open_table(path)
    count = db[TABLE].count
    db[TABLE].delete_where()
    return count
