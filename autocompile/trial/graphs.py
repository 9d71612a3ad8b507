"""The graphs a trial compiles, one entry per compile (a Dynamo frame with its forward, backward and
runtime parts): the time torch spent on it, its AOTAutograd cache key, and whether the cache had it.

Trials that share a study-wide compile cache (`caches.shared`) load a graph another trial compiled
instead of compiling it again. Such a trial's measured warm-up is shorter than a user's cold one;
its cold warm-up is reconstructed: the measured warm-up, plus, for each graph the cache had, the
time its first (cold) compile took less the time this load took. The first compile's time comes
from the study's ledger (LEDGER, beside the cache: one line per graph compiled cold, written as
soon as it is compiled, so a trial that is pruned or killed later still leaves it); a graph the
ledger lacks is counted with the time torch says its cache saved (the Inductor compile only).

One key may stand for several compiles of a trial: a frame recompiled for new shapes can trace to
the same AOTAutograd key each time (the captioner's decoder block: four compiles of 5.5-11 s under
one key). The ledger keeps each of them, in order, from the trial that
compiled them first, and a trial's n-th hit of a key is given that trial's n-th compile of it.
"""

from __future__ import annotations

import json
import logging
import os
import re

AOT_LOGGER = "torch._functorch._aot_autograd.autograd_cache"  # says "AOTAutograd cache hit|miss for key K"
LEDGER = "graphs.jsonl"
_MESSAGE = re.compile(r"AOTAutograd cache (hit|miss) for key (\S+)")
_METRICS_LIMIT = 100_000  # torch keeps its last 64 compiles' metrics by default


class GraphLedger(logging.Handler):
    """Follows a process's compiles: each one's AOTAutograd key and cache state (from torch's log),
    its time and the cache's saved time (from torch's compilation metrics)."""

    def __init__(self, ledger_path: str | None = None, owner: str = ""):
        super().__init__(level=logging.INFO)
        self.path = ledger_path
        self.owner = owner or str(os.getpid())  # whose compiles a ledger line records
        self.keys: dict[str, tuple[str, str]] = {}  # compile id -> (key, "hit" | "miss")
        self.graphs: dict[str, dict] = {}  # compile id -> entry
        self.written: set[str] = set()
        self.read = 0

    def install(self, torch) -> list[str]:
        """Hook into torch; returns notes on what could not be hooked. With a ledger (a shared cache),
        Triton's kernels are autotuned from nothing, as in a cold run (`cold_autotune`)."""
        self._torch = torch
        if self.path:
            cold_autotune()
        try:
            from torch._dynamo import utils

            utils.set_compilation_metrics_limit(_METRICS_LIMIT)
            self.read = len(utils.get_compilation_metrics())
        except (ImportError, AttributeError):
            return ["torch's compilation metrics are missing: no graph ledger, no reconstructed warm-up"]
        logger = logging.getLogger(AOT_LOGGER)
        logger.setLevel(logging.INFO)
        logger.propagate = False  # its INFO lines would fill the trial's log
        logger.addHandler(self)
        return []

    def emit(self, record: logging.LogRecord) -> None:
        match = _MESSAGE.match(record.getMessage())
        if match:
            trace = self._torch._guards.CompileContext.current_trace_id()
            self.keys[str(trace.compile_id) if trace else f"?{len(self.keys)}"] = (match.group(2), match.group(1))

    def update(self) -> list[dict]:
        """Take in the compiles torch finished since the last call; write those compiled cold to the
        ledger. Returns every compile so far."""
        from torch._dynamo.utils import get_compilation_metrics

        metrics = list(get_compilation_metrics())
        for m in metrics[self.read :]:
            cid = str(m.compile_id)
            entry = self.graphs.setdefault(
                cid, {"compile_id": cid, "frame": m.co_name, "file": _short(m.co_filename), "s": 0.0, "saved_s": 0.0}
            )
            entry["s"] += (getattr(m, "duration_us", None) or 0) / 1e6
            entry["saved_s"] += (getattr(m, "distributed_ephemeral_timeout_us", None) or 0) / 1e6
        self.read = len(metrics)
        name_unnamed(self.graphs.values())
        for cid, entry in self.graphs.items():
            if cid in self.keys:
                entry["key"], entry["state"] = self.keys[cid]
        self._write()
        return list(self.graphs.values())

    def _write(self) -> None:
        fresh = [g for g in self.graphs.values() if g.get("state") == "miss" and g["compile_id"] not in self.written]
        if not self.path or not fresh:
            return
        with open(self.path, "a") as f:
            for g in fresh:
                f.write(json.dumps({"key": g["key"], "s": round(g["s"], 3), "frame": g["frame"], "by": self.owner}) + "\n")
                self.written.add(g["compile_id"])


def name_unnamed(graphs) -> None:
    """Give a compile whose metrics name no frame (torch 2.11 leaves some of a frame's later
    compiles unnamed: the captioner's decoder block, compiles 1/3 and 1/4) the frame and file of
    another compile of the same frame id (its code object)."""
    graphs = list(graphs)
    named = {g["compile_id"].split("/")[0]: g for g in graphs if g.get("frame")}
    for g in graphs:
        sibling = named.get(g["compile_id"].split("/")[0])
        if not g.get("frame") and sibling:
            g["frame"], g["file"] = sibling["frame"], sibling["file"]


def _short(path: str | None) -> str:
    """A frame's file from its package on (torch/optim/adamw.py), or its base name."""
    if not path:
        return ""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def is_optimizer(graph: dict) -> bool:
    """Whether a compiled frame is the optimizer's step (torch.optim's code, or its step's wrappers)."""
    return (
        (graph.get("file") or "").startswith("torch/optim/")
        or graph.get("frame") in ("step", "wrapper", "inner")
        or (graph.get("frame") or "").startswith("torch_dynamo_resume_in_wrapper")
    )


def cold_autotune() -> None:
    """Turn Inductor's local autotune cache off in this process. It keeps each Triton kernel's best
    config beside the kernel's source, in the Inductor cache folder, keyed by that source: under a
    shared cache a graph's first compile found the best configs other trials' graphs had measured
    for the same kernels and compiled one config of each instead of all of them, so its time in the
    ledger was not a cold one, and a cache hit skipped the benchmarking a cold run does (GPT-2's block:
    6.3 s so, 9.8 s cold; docs/decisions.md). The option is not part of the FX graph cache's key."""
    from torch._inductor import config

    config.autotune_local_cache = False


def read_ledger(path: str | None) -> dict[str, list[float]]:
    """The cold compile times of each graph in a study's ledger, by key: every compile of the key,
    in order, by the first trial that wrote it (lines of ledgers older than the `by` field count as
    one writer's)."""
    cold: dict[str, list[float]] = {}
    first: dict[str, object] = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by a killed writer
                key, by = entry["key"], entry.get("by")
                if first.setdefault(key, by) == by:
                    cold.setdefault(key, []).append(entry["s"])
    except (OSError, TypeError):
        pass
    return cold


def cold_seconds(graphs: list[dict], cold: dict[str, list[float]]) -> list[float | None]:
    """Each graph's cold compile time: its own where it compiled, the ledger's where the cache had it
    (its n-th hit of a key gets the n-th compile of that key, the keys' mean past those), None
    where the ledger lacks the key."""
    seen: dict[str, int] = {}
    out: list[float | None] = []
    for g in graphs:
        if g.get("state") != "hit":
            out.append(g.get("s", 0.0))
            continue
        times = cold.get(g.get("key"))
        n = seen[g["key"]] = seen.get(g["key"], -1) + 1
        out.append(None if not times else times[n] if n < len(times) else sum(times) / len(times))
    return out


def reconstruct(measured_s: float, graphs: list[dict], cold: dict[str, list[float]]) -> dict | None:
    """A cold warm-up from one measured with cache hits (see the module's docstring), or None
    when the cache had none of its graphs (the measured warm-up is cold)."""
    hits = [(g, s) for g, s in zip(graphs, cold_seconds(graphs, cold)) if g.get("state") == "hit"]
    if not hits:
        return None
    added, from_torch = 0.0, 0
    for g, first in hits:
        if first is not None:
            added += max(first - g["s"], 0.0)
        else:
            added += g.get("saved_s", 0.0)
            from_torch += 1
    return {
        "warmup_s": measured_s + added,
        "measured_s": measured_s,
        "added_s": added,
        "hits": len(hits),
        "compiled": sum(g.get("state") == "miss" for g in graphs),
        "hits_from_torch": from_torch,
        # the same from torch's own record of what its cache saved (Inductor's compile only), for comparison
        "torch_saved_s": sum(g.get("saved_s", 0.0) for g, _ in hits),
    }


def ledger_path(cache_dir: str | None) -> str | None:
    return os.path.join(cache_dir, LEDGER) if cache_dir else None
