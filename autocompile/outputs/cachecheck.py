"""Whether a reconstructed warm-up is a cold one: `autocompile cache-check`.

A shared compile cache (`search --shared-cache`) spares a trial the graphs another trial compiled,
and its cold warm-up is reconstructed from the study's ledger (`autocompile.trial.graphs`). This
check measures both on one workload: groups of configurations that share the model's graphs (a
recipe, then the same recipe with the optimizer step, the loss or the fused optimizer changed)
run one after another with one shared cache, as a search runs them; each that had cache hits is
then run cold (its own empty cache), and the table sets its reconstructed warm-up beside the cold
one. Sharing is trusted where every reconstruction is within TOLERANCE of its cold run.

A primer run comes first, cold and not compared, as a search's baselines come before its shared
trials: the first compile on a fresh machine is slower (files not yet in the page cache, CUDA's
JIT cache empty), and graphs first compiled then made every reconstruction from them 17-38% long
(docs/decisions.md).

Cold compiles themselves drift over a machine's first runs: the same six graphs of the captioner
took 49.2 s in the second run and 38.0 s in the eighth (docs/decisions.md), and a reconstruction carries
the first compile's time. So a group's cold runs follow its own shared runs (not all groups'), the
table sets beside each error the same graphs' compile times in the cold run and the error had the
reconstruction used them (`drift`), and the check ends by running its first configuration cold
once more. In that check the errors were +21.8, +20.7 and +23.9%; with the cold runs' own times of
the graphs the cache had, +13.4, +5.7 and -1.6%: the rest of the error is the machine compiling
the same graphs 12-24% faster later, and the step graph compiled in both runs took 122.8 s in one
and 102.9 s in the other.

Runs are kept in OUT/cache-check.json as they finish: the same command continues a check that
was cut (GPU time comes in calls of minutes), measuring only what it lacks.
"""

from __future__ import annotations

import datetime
import json
import os

import optuna

from autocompile.trial import TrialRequest, caches, run_trial
from autocompile.trial.graphs import ledger_path
from autocompile.trial.result import Status

TOLERANCE = 0.15  # the brief's: a reconstructed warm-up agrees with a cold one within 15%
MOVES = ("compile_optimizer", "compile_loss", "fused_optimizer")  # changes that keep the model's graphs
QUICK = {"min_windows": 1, "max_windows": 1, "min_window_s": 0.2, "numerics_replay": False}  # warm-up is the point


def check_configs(space, groups: int, per_group: int) -> list[tuple[int, dict]]:
    """(group, config) pairs: each of the first `groups` recipes, then up to per_group - 1 of its
    single moves in MOVES (those the space offers and does not reject)."""
    out, seen = [], []
    for group, params in enumerate(space.starting_points()[:groups]):
        members = [params]
        for name in MOVES:
            if name in space.fixed or len(members) >= per_group:
                continue
            extra = {"lr_tensor": True} if name == "compile_optimizer" else {}  # a compiled step under a schedule needs it
            moved = space.params_for({**params, **extra, name: not params.get(name, False)})
            if moved and moved.get(name) == (not params.get(name, False)) and moved not in members:
                members.append(moved)
        for member in members:
            config = space.suggest(optuna.trial.FixedTrial(member))
            if config not in seen and not space.rejection(config):
                seen.append(config)
                out.append((group, config))
    return out


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _save(path: str, state: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def _run(out: str, name: str, model: str, device: str, config: dict, timeout_s: float, cache_dir: str | None) -> dict:
    record = run_trial(
        TrialRequest(
            model=model,
            config=config,
            device=device,
            trial_dir=os.path.join(out, "runs", name),
            timeout_s=timeout_s,
            measure=QUICK,
            cache_dir=cache_dir,
            ledger=cache_dir is not None,
        )
    )
    keep = (
        "status",
        "reason",
        "warmup_s",
        "warmup_measured_s",
        "warmup_kind",
        "reconstruction",
        "wall_s",
        "steps_per_s",
        "device_name",
        "torch",
        "compile_pool_s",
        "notes",
    )
    return {
        **{k: record.get(k) for k in keep},
        "graphs": [
            {k: g.get(k) for k in ("compile_id", "key", "frame", "state", "s", "saved_s")} for g in record.get("graphs", [])
        ],
    }


def check_cache(
    space,
    model: str,
    device: str,
    out: str,
    groups: int = 2,
    per_group: int = 4,
    trial_timeout_s: float = 600.0,
    command: str = "",
    say=print,
) -> dict:
    """Run (or continue) the check; returns its state (also in OUT/cache-check.json)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "cache-check.json")
    state = _load(path) or {
        "model": model,
        "device": device,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "runs": [],
    }
    pairs = check_configs(space, groups, per_group)
    if "primer" not in state and not state["runs"] and pairs:
        say("cache-check: a primer run (the first configuration, its own cold cache, not compared)")
        state["primer"] = _run(out, "primer", model, device, pairs[0][1], trial_timeout_s, None)
        _save(path, state)
    shared = caches.shared(out)
    for i, (group, config) in enumerate(pairs):
        if i >= len(state["runs"]):
            say(f"cache-check: shared run {i + 1}/{len(pairs)} (group {group}): {json.dumps(config)[:160]}")
            state["runs"].append(
                {
                    "group": group,
                    "config": config,
                    "shared": _run(out, f"shared-{i}", model, device, config, trial_timeout_s, shared),
                }
            )
            _save(path, state)
        if i + 1 == len(pairs) or pairs[i + 1][0] != group:  # a group's cold runs follow its shared runs:
            _cold_runs(state, group, out, model, device, trial_timeout_s, path, say)  # less drift between the two
    if pairs and state["runs"] and "repeat" not in state:
        say("cache-check: the first configuration cold again (how far cold compiles drift on this machine)")
        state["repeat"] = _run(out, "repeat", model, device, pairs[0][1], trial_timeout_s, None)
        _save(path, state)
    try:  # the ledger the reconstructions read, kept with the check
        with open(ledger_path(shared)) as f:
            state["ledger"] = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        pass
    state["rows"] = rows(state)
    state["agree"] = bool(state["rows"]) and all(abs(r["error"]) <= TOLERANCE for r in state["rows"])
    _save(path, state)
    return state


def _cold_runs(state: dict, group: int, out: str, model: str, device: str, timeout_s: float, path: str, say) -> None:
    """The cold run of each configuration of `group` whose shared run was reconstructed."""
    for i, run in enumerate(state["runs"]):
        if run["group"] == group and run["shared"].get("warmup_kind") == "reconstructed" and "cold" not in run:
            say(f"cache-check: cold run of configuration {i + 1}")
            run["cold"] = _run(out, f"cold-{i}", model, device, run["config"], timeout_s, None)
            _save(path, state)


def _by_occurrence(graphs: list[dict]) -> list[tuple[tuple, dict]]:
    """Each compile with a key as ((key, frame, n), graph), n counting that key's compiles: the same
    graph in two runs has the same (key, frame, n)."""
    seen: dict[tuple, int] = {}
    out = []
    for g in graphs:
        if g.get("key"):
            n = seen[(g["key"], g["frame"])] = seen.get((g["key"], g["frame"]), -1) + 1
            out.append(((g["key"], g["frame"], n), g))
    return out


def drift(shared: dict, cold: dict) -> dict | None:
    """What the cold run says about the reconstruction: the hit graphs' compile times in the cold run
    against the ledger's (their first compile, earlier on the machine), the error had the
    reconstruction used the cold run's own times, and the graphs compiled in both runs (a miss in
    each: the machine's own run-to-run variation). None where a hit graph is missing from the cold run."""
    mine, theirs = _by_occurrence(shared["graphs"]), dict(_by_occurrence(cold["graphs"]))
    hits = [(k, g) for k, g in mine if g["state"] == "hit"]
    both = [(k, g) for k, g in mine if g["state"] == "miss" and k in theirs]
    if not hits or any(k not in theirs for k, _ in hits):
        return None
    first = shared["reconstruction"]["added_s"] + sum(g["s"] for _, g in hits)  # the ledger's: what was added, plus the loads
    same = sum(theirs[k]["s"] for k, _ in hits)
    return {
        "hit_first_s": first,
        "hit_cold_s": same,
        "error_same_times": (shared["warmup_s"] - first + same) / cold["warmup_s"] - 1,
        "both_shared_s": sum(g["s"] for _, g in both),
        "both_cold_s": sum(theirs[k]["s"] for k, _ in both),
    }


def rows(state: dict) -> list[dict]:
    """Each configuration whose reconstructed warm-up has a cold run to compare with."""
    out = []
    for i, run in enumerate(state["runs"]):
        shared, cold = run["shared"], run.get("cold") or {}
        if shared.get("warmup_kind") != "reconstructed" or cold.get("status") != Status.OK or shared.get("status") != Status.OK:
            continue
        out.append(
            {
                "config": i + 1,
                "group": run["group"],
                "measured_s": shared["warmup_measured_s"],
                "reconstructed_s": shared["warmup_s"],
                "cold_s": cold["warmup_s"],
                "hits": shared["reconstruction"]["hits"],
                "error": shared["warmup_s"] / cold["warmup_s"] - 1,
                "torch_error": None
                if "torch_saved_s" not in shared["reconstruction"]
                else (shared["warmup_measured_s"] + shared["reconstruction"]["torch_saved_s"]) / cold["warmup_s"] - 1,
                "drift": drift(shared, cold),
            }
        )
    return out


def format_check(state: dict) -> str:
    """The check as Markdown: the command, each run, and the verdict."""
    from autocompile.apply import describe_config

    device = next((r["shared"].get("device_name") for r in state["runs"] if r["shared"].get("device_name")), state["device"])
    torch = next((r["shared"].get("torch") for r in state["runs"] if r["shared"].get("torch")), "?")
    lines = [
        f"# Reconstructed against cold warm-up: {state['model']}",
        "",
        f"{state['date']}, {device}, torch {torch}. Command: `{state['command']}`",
        "",
        f"Primer run (cold, not compared): warm-up {(state.get('primer') or {}).get('warmup_s') or 0:.1f} s."
        if state.get("primer")
        else "No primer run.",
        "",
        "| # | group | configuration | status | cache hits | measured with the shared cache (s) | reconstructed (s) "
        "| cold (s) | error | error with torch's saved time "
        "| hit graphs: first compile / in the cold run (s) | error with the cold run's times of those graphs "
        "| compiled in both runs: shared / cold (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_config = {r["config"]: r for r in state.get("rows", [])}
    for i, run in enumerate(state["runs"], 1):
        shared, row = run["shared"], by_config.get(i)
        hits = (shared.get("reconstruction") or {}).get("hits", 0)
        fmt = lambda x: "-" if x is None else f"{x:.1f}"
        measured = shared.get("warmup_measured_s") or shared.get("warmup_s")
        lines.append(
            f"| {i} | {run['group']} | {describe_config(run['config'])} | {shared.get('status')} | {hits} | "
            f"{fmt(measured)} | {fmt(row['reconstructed_s']) if row else '-'} | "
            f"{fmt(row['cold_s']) if row else ('(cold: no hits)' if not hits else '-')} | "
            + (
                f"{row['error']:+.1%} | "
                + ("-" if row["torch_error"] is None else f"{row['torch_error']:+.1%}")
                + " | "
                + _drift_cells(row.get("drift"))
                + " |"
                if row
                else "- | - | - | - | - |"
            )
        )
    lines += _drift_lines(state)
    worst = max((abs(r["error"]) for r in state.get("rows", [])), default=None)
    lines += [
        "",
        f"{len(state.get('rows', []))} reconstructions compared; worst error "
        + ("-" if worst is None else f"{worst:.1%}")
        + f"; within {TOLERANCE:.0%}: {'yes' if state.get('agree') else 'no'}.",
    ]
    same = [r["drift"]["error_same_times"] for r in state.get("rows", []) if r.get("drift")]
    if same:
        lines += [
            "",
            f"With the cold run's own compile times of the graphs the cache had (what the reconstruction "
            f"would say with no drift between the two runs): worst error {max(map(abs, same)):.1%}.",
        ]
    return "\n".join(lines) + "\n"


def _drift_cells(found: dict | None) -> str:
    if not found:
        return "- | - | -"
    return f"{found['hit_first_s']:.1f} / {found['hit_cold_s']:.1f} | {found['error_same_times']:+.1%} | " + (
        f"{found['both_shared_s']:.1f} / {found['both_cold_s']:.1f}" if found["both_shared_s"] else "-"
    )


def _drift_lines(state: dict) -> list[str]:
    """The first configuration's cold warm-up at the check's start and at its end."""
    first = state["runs"][0]["shared"] if state.get("runs") else {}
    repeat = state.get("repeat") or {}
    if first.get("warmup_kind") != "cold" or repeat.get("status") != Status.OK or first.get("status") != Status.OK:
        return []
    start, end = first["warmup_s"], repeat["warmup_s"]
    return [
        "",
        f"Drift of cold compiles on this machine: configuration 1 warmed up in {start:.1f} s at the start "
        f"and {end:.1f} s cold at the end ({end / start - 1:+.1%}).",
    ]
