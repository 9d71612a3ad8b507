"""A trial's record: concise as the trial's user attributes, whole in its result.json; and the
study's records read back (the baselines, the candidates, the winner).

The study (and the dashboard that shows it) keeps each value of a record short: a long list
(window rates, recompile and graph-break reasons, losses, notes, triage rungs) becomes its
length and first item, a long text (the snippet) or mapping (the numerics series) its start.
The whole record is written to the trial's folder, `DIR/STUDY/trials/NNNN/result.json`
(uploaded to the dashboard as an artifact); `full_record` reads it back for whatever needs
more than the attributes hold.
"""

from __future__ import annotations

import json
import os

import optuna

ATTR_CHARS = 300  # the longest a user attribute's value may be, as JSON
# The configuration stays whole: the search reads it back to resume, dedupe and take
# neighbours. It is one flat mapping of settings (up to ~450 characters with Inductor options).
WHOLE = ("config",)


def _json(value) -> str:
    return json.dumps(value, default=str)


def shortened(value, limit: int = ATTR_CHARS):
    """`value` if its JSON is at most `limit` long; else a mapping with its long values shortened
    (where that is enough), or a text saying what it was."""
    text = _json(value)
    if len(text) <= limit:
        return value
    if isinstance(value, dict):  # stays a mapping where it can: a verdict's method, figures stay readable
        for inner_limit in (60, 30):
            inner = {key: shortened(item, inner_limit) for key, item in value.items()}
            if len(_json(inner)) <= limit:
                return inner
        kept = {key: item for key, item in value.items()
                if item is None or isinstance(item, (bool, int, float)) or (isinstance(item, str) and len(item) <= 30)}
        kept["…"] = f"{len(value) - len(kept)} more keys in result.json"
        if len(_json(kept)) <= limit:
            return kept
        head = f"{len(value)} keys (all in result.json): "
    elif isinstance(value, (list, tuple)):
        head = f"{len(value)} items (all in result.json); first: "
        text = _json(value[0])
    else:
        head, text = "", str(value)
    cut = max(limit - len(head) - 4, 0)
    while cut > 0 and len(_json(head + text[:cut] + "…")) > limit:
        cut -= 10  # escapes (newlines, quotes) make the JSON longer than the text
    return head + text[:cut] + "…"


def concise(record: dict) -> dict:
    """The record as user attributes: every value at most ATTR_CHARS of JSON (but WHOLE's)."""
    return {key: value if key in WHOLE else shortened(value) for key, value in record.items()}


def snippet_header(model: str, study: str, number: int) -> str:
    """The first line of a study's trial's snippet (its apply_compilation.py)."""
    return f"Compile settings for {model} (study {study!r}, trial {number}), found by autocompile."


def trial_folder(study_dir: str, number: int) -> str:
    return os.path.join(study_dir, "trials", f"{number:04d}")


def save_record(folder: str, record: dict) -> None:
    """Write the whole record to folder/result.json (the folder the trial ran in)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)


def full_record(trial, study_dir: str | None) -> dict:
    """A trial's whole record: its user attributes, with each value they hold shortened read back
    from its result.json. A study made before attributes were concise holds it all already."""
    attrs = dict(trial.user_attrs)
    if not study_dir:
        return attrs
    try:
        with open(os.path.join(trial_folder(study_dir, trial.number), "result.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return attrs
    for key, value in saved.items():
        if key not in attrs or (attrs[key] != value and shortened(value) == attrs[key]):
            attrs[key] = value
    return attrs


def baseline_trial(study, role: str):
    """The first trial of a baseline role ("eager", "compile-defaults") that ran cleanly."""
    return next((t for t in study.trials if t.user_attrs.get("role") == role and t.user_attrs.get("status") == "ok"),
                None)


def baseline_value(study, role: str, key: str):
    """A baseline's measurement: from its clean run, else from a run that measured it and needed more
    than --max-memory-gb (over_memory_baseline): its speed is still the reference the ratios need."""
    trial = baseline_trial(study, role) or over_memory_baseline(study, role)
    return trial.user_attrs.get(key) if trial else None


EAGER_PEAK = "eager"  # --max-memory-gb eager: no more memory than eager as the workload built it


def memory_limit(max_memory_gb, study) -> float | None:
    """The search's memory limit in GB: --max-memory-gb's number, or with "eager", the eager baseline's peak
    as the workload built it (None until eager has run)."""
    if max_memory_gb == EAGER_PEAK:
        return baseline_value(study, "eager", "peak_mem_gb")
    return max_memory_gb


def over_memory_baseline(study, role: str):
    """The first trial of a baseline role that ran and measured, infeasible only for its memory
    (llama-8b-60gb's eager: 3.44 steps/s at 75.15 GB against --max-memory-gb 60, H200, 2026-11-26)."""
    return next((t for t in study.trials if t.user_attrs.get("role") == role and t.user_attrs.get("over_memory_gb")
                 and t.user_attrs.get("steps_per_s") and not (t.user_attrs.get("numerics") or {}).get("differs")), None)


def eager_record(study, study_dir: str | None = None) -> dict | None:
    """The eager baseline's record: its user attributes, whole from its result.json with `study_dir`."""
    eager = baseline_trial(study, "eager")
    return (full_record(eager, study_dir) if study_dir else eager.user_attrs) if eager else None


def search_candidates(study, compiled_only: bool = True) -> list:
    """Trials of distinct compiled configurations (eager too, unless `compiled_only`) that ran
    cleanly, finalist reruns not, best score first."""
    seen, out = [], []
    ranked = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value
                     and t.user_attrs.get("status") == "ok" and t.user_attrs.get("role") != "finalist"
                     and (t.user_attrs.get("config", {}).get("compile") or not compiled_only)),
                    key=lambda t: t.value, reverse=True)
    for t in ranked:
        if t.user_attrs["config"] not in seen:
            seen.append(t.user_attrs["config"])
            out.append(t)
    return out


def best_trial(study):
    """The winner: the finalist round's choice while its finalists are still the top ones,
    else the highest-scoring trial that ran cleanly (Optuna's best_trial ignores our status)."""
    candidates = search_candidates(study)
    verdict = study.user_attrs.get("finalists") or {}
    if verdict.get("winner") is not None and verdict["finalists"] == [t.number for t in candidates[:len(verdict["finalists"])]]:
        return study.trials[verdict["winner"]]
    eager = baseline_trial(study, "eager")
    return max(candidates + ([eager] if eager else []), key=lambda t: t.value, default=None)


def speedup(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def config_columns(config: dict) -> dict:
    """A configuration flattened: one column per dimension, `inductor.KEY` and `mode.PART` included."""
    from autocompile.space import DEFAULTS

    columns = {}
    for key, value in {**DEFAULTS, **config}.items():
        if key == "inductor":
            columns.update({f"inductor.{k}": v for k, v in value.items()})
        elif key == "part_modes":
            columns.update({f"mode.{part}": mode for part, mode in value.items()})
        else:
            columns[key] = value
    return columns


def carried(record: dict, first: dict, number: int, warm_up: bool = True) -> dict:
    """A finalist's rerun that started from the code its first run (trial `number`, whole record
    `first`) compiled: its warm warm-up kept apart, the first run's cold warm-up carried as its
    own, and the first run's numerics replay with it (not run again), so that its score is the
    score of the configuration as a user meets it, cold. Without `warm_up` (a rerun from empty
    caches, its warm-up cold already), the numerics alone."""
    if record.get("status") != "ok":
        return record
    if warm_up:
        record["warm_warmup_s"] = record.get("warmup_measured_s", record.get("warmup_s"))
        for key in ("warmup_measured_s", "reconstruction"):
            record.pop(key, None)
        record.update(warmup_s=first.get("warmup_s"), warmup_steps=first.get("warmup_steps"),
                      warmup_carried_from=number, warmup_kind=first.get("warmup_kind", "cold"))
    if first.get("replay") and not record.get("replay"):
        record.update(replay=first["replay"], replay_carried_from=number)
    return record
