"""Whether screening ranks configurations as full trials do: `autocompile screen-check`.

The distinct configurations of a finished study that ran cleanly (best full score first, at most
`limit`) are each measured at k blocks, as a screened trial of a search is (one shared compile
cache for the screens, eager at k blocks as the reference), and the Spearman rank correlation
between their screened and full scores says whether a screen promotes the right ones. The table
goes to DIR/STUDY/screening.md, the rows and figures to DIR/STUDY/screening.json.

Other studies of the same workload (`--also`) add their configurations, their full scores taken
again at the first study's horizon from their steady speed and warm-up. A check run again at the
same k uses the screens its screening.json holds and measures only the rest (GPU time is scarce).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time

from autocompile.errors import UserError
from autocompile.engine.records import Role
from autocompile.engine.studyview import baseline_value
from autocompile.trial.result import Status
from autocompile.space import CUDA_GRAPH_MODES
from autocompile.engine.storage import same_machine, this_boot

MIN_CONFIGS = 3  # fewer distinct configurations say nothing about a ranking


def ranks(values: list[float]) -> list[float]:
    """Rank of each value, 1 for the highest; tied values share the average of their ranks."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation: Pearson's correlation of the (tie-averaged) ranks. None for
    fewer than 2 pairs or a side whose values are all equal."""
    if len(xs) != len(ys):
        raise ValueError("spearman: the two lists differ in length")
    if len(xs) < 2:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def study_configs(study, limit: int, others=()) -> list:
    """(study, trial, full score) of the distinct configurations that ran cleanly (eager
    included, finalist re-runs not), best first, at most `limit`. The trials of `others` are scored
    at `study`'s horizon; a configuration in several studies counts once, from the first. Across
    studies, "best" is the score over the study's own eager speed: studies run on different machines,
    and a workload bound by the host moves with the machine (the captioner's eager: 8.2 and 13.3 steps/s)."""
    from autocompile.engine.scoring import score
    from autocompile.engine.studyview import search_candidates

    horizon = study.user_attrs.get("horizon")
    found = []
    for source in (study, *others):
        for t in search_candidates(source, compiled_only=False):
            full = t.value if source is study or not horizon else score(t.user_attrs, horizon)
            found.append((source, t, full))
    seen, out = [], []
    for source, t, full in found:
        if t.user_attrs["config"] not in seen:
            seen.append(t.user_attrs["config"])
            out.append((source, t, full))
    eager = {source.study_name: baseline_value(source, Role.EAGER, "steps_per_s") or 1.0 for source in (study, *others)}
    return sorted(out, key=lambda item: item[2] / eager[item[0].study_name], reverse=True)[:limit]


def _same_workload(study, others) -> None:
    """Other studies join the check only if they measured the same workload on the same device."""
    mine = study.user_attrs.get("settings")
    for other in others:
        if other.user_attrs.get("settings") != mine:
            raise UserError(
                f"study {other.study_name!r} was made with {other.user_attrs.get('settings')}, "
                f"not as {study.study_name!r} ({mine}): only studies of the same workload join a check"
            )


def _previous(study_dir: str, k: int, fresh: bool) -> dict:
    """The screens an earlier check at k blocks measured (screening.json), by configuration."""
    path = os.path.join(study_dir, "screening.json")
    if fresh or not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return {}
    if earlier.get("blocks") != k:
        return {}
    rows = {
        _key(row["config"]): row
        for row in earlier.get("rows", [])
        if row.get("screen_from") == "check" and row.get("status") == Status.OK and row.get("screened_steps_per_s")
    }
    return {"rows": rows, "eager": earlier.get("eager"), "date": earlier.get("date")}


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def _settings(study, directory: str, measure: dict | None):
    """The study's own workload settings, as a SearchSettings for `screen_request`."""
    from autocompile.engine.settings import SearchSettings

    stored = study.user_attrs.get("settings")
    if not stored:
        raise UserError(f"study {study.study_name!r} has no stored settings: it was not made by autocompile search")
    return SearchSettings(
        model=stored["model"],
        device=stored["device"],
        study=study.study_name,
        directory=directory,
        batch_size=stored.get("batch_size"),
        seq_len=stored.get("seq_len"),
        seed=stored.get("seed", 0),
        measure=measure,
        nproc=stored.get("nproc", 1),
        parallel=stored.get("parallel", "none"),
    )


def _screen(settings, config: dict, k: int, folder: str, limit_s: float, eager: dict | None) -> dict:
    from autocompile.engine.scoring import judge
    from autocompile.engine.screening import screen_request
    from autocompile.trial import run_trial

    record = run_trial(screen_request(settings, config, k, folder, limit_s))
    return judge(record, eager, settings.device, None) if eager else record


def check_screening(
    study,
    directory: str,
    k: int,
    limit: int = 10,
    timeout_s: float | None = None,
    trial_timeout_s: float = 900.0,
    measure: dict | None = None,
    command: str = "",
    fresh: bool = False,
    others=(),
    say=lambda line: print(line, file=sys.stderr, flush=True),
) -> dict:
    """Screen up to `limit` configurations of `study` (and of `others`, the same workload) at k blocks;
    the rows and Spearman's rho. The screens a search with --screen k made already (and its eager at
    k blocks) are used as they are, and so are those an earlier check at k measured, unless `fresh`:
    they are what its pruner judged by."""
    settings = _settings(study, directory, measure)
    _same_workload(study, others)
    trials = study_configs(study, limit, others)
    if len(trials) < MIN_CONFIGS:
        raise UserError(
            f"study {study.study_name!r} has {len(trials)} distinct configurations that ran cleanly; "
            f"a screening check needs at least {MIN_CONFIGS}"
        )
    for source in (study, *others):  # the full scores compare as multiples of their own study's eager
        if not baseline_value(source, Role.EAGER, "steps_per_s"):
            raise UserError(
                f"study {source.study_name!r} has no eager baseline that ran cleanly: "
                "screen-check compares each full score with its own study's eager speed"
            )
    _check_here(settings, k)
    deadline = None if timeout_s is None else time.time() + timeout_s
    left = lambda: trial_timeout_s if deadline is None else min(trial_timeout_s, deadline - time.time())  # noqa: E731
    from autocompile.engine.screening import SCREENS

    folder = os.path.join(settings.study_dir, SCREENS, f"check-{k}-blocks")
    names = ", ".join(repr(s.study_name) for s in (study, *others))
    say(f"screen-check: {len(trials)} configurations of {names} at {k} blocks")
    previous = _previous(settings.study_dir, k, fresh)
    eager = None if fresh else study.user_attrs.get("screened_eager", {}).get(str(k)) or previous.get("eager")
    if eager is not None and not same_machine(eager, {"boot": this_boot()}):
        say(f"  eager at {k} blocks measured again: the stored one ran on another machine (or does not say which)")
        eager = None
    if eager is None:
        eager = _screen(settings, _eager(), k, os.path.join(folder, "eager"), left(), None)
        if eager["status"] != Status.OK:
            raise UserError(f"eager at {k} blocks ended {eager['status']}: {eager.get('reason', '')}")
        eager.update({"from": "check", "boot": this_boot()})
    if previous.get("rows"):
        say(f"  {len(previous['rows'])} screens of the check of {previous['date']} used again")
    rows = [
        _row(source, t, full, settings, k, folder, left, eager, say, fresh, previous.get("rows", {}))
        for source, t, full in trials
    ]
    return _verdict(study, settings, k, rows, eager, command)


def _check_here(settings, k: int) -> None:
    """One-line errors before anything runs: a device this machine lacks, a k that cuts nothing."""
    from autocompile.engine.settings import resolve_device
    from autocompile.engine.screening import block_counts, check_blocks
    from autocompile.workloads import WorkloadOptions

    resolve_device(settings.device)
    options = WorkloadOptions(
        device=settings.device, batch_size=settings.batch_size, seq_len=settings.seq_len, seed=settings.seed
    )
    check_blocks(settings.model, k, block_counts(settings.model, options))


def _eager() -> dict:
    from autocompile.space import EAGER

    return dict(EAGER)


def _row(source, trial, full: float, settings, k: int, folder: str, left, eager: dict, say, fresh: bool, previous: dict) -> dict:
    """One configuration: its full figures from its study, and its screen (the search's, an earlier
    check's, or measured now)."""
    from autocompile.apply import describe_config

    config = trial.user_attrs["config"]
    row = {
        "study": source.study_name,
        "trial": trial.number,
        "config": config,
        "label": describe_config(config),
        "role": trial.user_attrs.get("role"),
        "full_score": full,
        "full_steps_per_s": trial.user_attrs["steps_per_s"],
        "full_eager_steps_per_s": baseline_value(source, Role.EAGER, "steps_per_s"),
    }
    made = trial.user_attrs.get("screen") or {}
    earlier = previous.get(_key(config))
    if row["role"] == Role.EAGER:  # eager at k blocks is the reference itself
        row.update(status=Status.OK, screened=1.0, screen_from="reference")
    elif not fresh and eager.get("from") != "check" and made.get("blocks") == k and made.get("status") == Status.OK:
        row.update(status=Status.OK, screened=made["score"], screen_from="search")
    elif earlier:  # measured by an earlier check: its speed over the eager of its own check (its own machine)
        row.update(
            status=Status.OK,
            screened_steps_per_s=earlier["screened_steps_per_s"],
            screen_from="check",
            screened=earlier["screened"],
            wall_s=earlier.get("wall_s"),
            boot=earlier.get("boot"),
        )
    elif left() < 1:
        return {**row, "status": Status.NOT_MEASURED, "reason": "the check's --timeout was reached"}
    else:
        name = f"{trial.number:04d}" if source.study_name == settings.study else f"{source.study_name}-{trial.number:04d}"
        record = _screen(settings, config, k, os.path.join(folder, name), left(), eager)
        row.update(
            status=record["status"],
            reason=record.get("reason", ""),
            wall_s=record["wall_s"],
            screen_from="check",
            boot=this_boot(),
        )
        if record["status"] == Status.OK:
            row.update(screened_steps_per_s=record["steps_per_s"], screened=record["steps_per_s"] / eager["steps_per_s"])
    say(
        f"  trial {trial.number} {row['label']}: full score {row['full_score']:.3g}, at {k} blocks "
        + (f"{row['screened']:.3g}x eager ({row['screen_from']})" if "screened" in row else f"{row['status']}: {row['reason']}")
    )
    return row


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for name in ("autocompile", "torch", "triton", "transformers", "optuna"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _over_eager(row: dict, key: str) -> float:
    """A row's full figure over the eager speed of its own study (rows of several studies compare so)."""
    return row[key] / row["full_eager_steps_per_s"]


def correlations(ok: list[dict]) -> dict:
    """Spearman's rho between the screened and the full scores of the rows screened cleanly, against
    their full steady speeds too, and without the CUDA-graph modes; each full figure over its own
    study's eager speed. A cut model is more bound by the host and its CUDA graphs hold less memory,
    so those modes gain more there than in full (llama-8b's reduce-overhead step: 1.32x eager at 4
    blocks, 0.67x in full: docs/decisions.md)."""

    def rho(rows, key):
        return (
            spearman([_over_eager(row, key) for row in rows], [row["screened"] for row in rows])
            if len(rows) >= MIN_CONFIGS
            else None
        )

    plain = [row for row in ok if row["config"].get("mode") not in CUDA_GRAPH_MODES]
    return {
        "rho": rho(ok, "full_score"),
        "rho_steady": rho(ok, "full_steps_per_s"),
        "rho_without_cuda_graphs": rho(plain, "full_score"),
        "ranked_without_cuda_graphs": len(plain),
    }


def _verdict(study, settings, k: int, rows: list[dict], eager: dict, command: str) -> dict:
    """The ranks of the configurations screened cleanly, and Spearman's rho between the two scores."""
    for row in rows:
        row["full_vs_eager"] = _over_eager(row, "full_steps_per_s")
        row["full_score_vs_eager"] = _over_eager(row, "full_score")
    ok = [row for row in rows if "screened" in row]
    for key, rank_key in (("full_score_vs_eager", "rank_full"), ("screened", "rank_screened")):
        for row, rank in zip(ok, ranks([row[key] for row in ok])):
            row[rank_key] = rank
    return {
        "study": study.study_name,
        "model": settings.model,
        "device": settings.device,
        "device_name": eager.get("device_name"),
        "blocks": k,
        "horizon": study.user_attrs.get("horizon"),
        "configurations": len(rows),
        "ranked": len(ok),
        **correlations(ok),
        "eager_steps_per_s": eager["steps_per_s"],
        "eager": eager,
        "rows": rows,
        "command": command,
        "studies": sorted({row["study"] for row in rows}, key=[study.study_name, *[r["study"] for r in rows]].index),
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _figure(value, form: str = ".3g") -> str:
    return "-" if value is None else format(value, form)


def format_check(result: dict) -> str:
    """screening.md: the table, rho, and how it was measured."""
    k, rho = result["blocks"], result["rho"]
    lines = [
        f"# Screening check: {result['study']} ({result['model']}) at {k} blocks",
        "",
        f"Spearman rank correlation between the screened and the full scores: **rho = {_figure(rho, '.2f')}** "
        f"over {result['ranked']} configurations (against the full steady speed: {_figure(result['rho_steady'], '.2f')})"
        + (
            f"; without the CUDA-graph modes ({', '.join(CUDA_GRAPH_MODES)}): {result['rho_without_cuda_graphs']:.2f} "
            f"over {result['ranked_without_cuda_graphs']}"
            if result.get("rho_without_cuda_graphs") is not None
            else ""
        )
        + ".",
        "",
        "| trial | configuration | full score | score x eager | steady x eager | screened (x eager at k) | screened by "
        "| rank full | rank screened |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        trial = row["trial"] if row.get("study", result["study"]) == result["study"] else f"{row['study']} {row['trial']}"
        screened = _figure(row.get("screened")) if "screened" in row else f"{row['status']}: {row.get('reason', '')[:80]}"
        lines.append(
            f"| {trial} | {row['label']} | {row['full_score']:.3g} | {_figure(row.get('full_score_vs_eager'), '.2f')} "
            f"| {_figure(row['full_vs_eager'], '.2f')} "
            f"| {screened} | {row.get('screen_from', '-')} "
            f"| {_figure(row.get('rank_full'), 'g')} | {_figure(row.get('rank_screened'), 'g')} |"
        )
    versions = ", ".join(f"{name} {version}" for name, version in result["versions"].items())
    lines += [
        "",
        f"- command: `{result['command']}`" if result["command"] else "- command: (from Python)",
        f"- device: {result['device_name']} ({result['device']}); {versions}",
        f"- date: {result['date']}",
        f"- how: eager at {k} blocks runs {result['eager_steps_per_s']:.3g} steps/s; each configuration is measured "
        f"once at {k} blocks (its steady speed over eager's there, on the same machine; the screens share one "
        f"compile cache), by the search that screened it or by this check; full scores are the study's own trials "
        f"(horizon {result['horizon']})"
        + (
            ", and those of " + ", ".join(result["studies"][1:]) + " taken at that horizon"
            if len(result.get("studies", [])) > 1
            else ""
        )
        + "; the full rank and rho go by each score over its own study's eager speed (x eager). Ranks: 1 is the best.",
    ]
    return "\n".join(lines) + "\n"


def write_check(result: dict, study_dir: str) -> tuple[str, str]:
    """DIR/STUDY/screening.md and screening.json; returns their paths."""
    os.makedirs(study_dir, exist_ok=True)
    md, js = os.path.join(study_dir, "screening.md"), os.path.join(study_dir, "screening.json")
    with open(md, "w") as f:
        f.write(format_check(result))
    with open(js, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return md, js
