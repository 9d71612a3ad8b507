"""What a study shows: its trial table, its winner, and the winner's snippet file."""

from __future__ import annotations

import json
import os

from autocompile.apply import describe_config
from autocompile.engine.contained import summary as contained_summary
from autocompile.engine.records import Role, full_record, speedup, status_of
from autocompile.engine.strategy import effects
from autocompile.engine.studyview import Baselines, StudyView, view_of
from autocompile.trial.result import FAILURES, Status


def default_score_bound(horizon: int, baselines: Baselines) -> float | None:
    """An upper bound on plain torch.compile's score when its baseline never finished warming up:
    horizon / the seconds it spent warming up before it was stopped."""
    elapsed = baselines.default_warmups
    return horizon / max(elapsed) if elapsed else None  # the longest attempt bounds it closest


def trial_rows(study, view: StudyView | None = None) -> list[dict]:
    """One flat row per finished trial: what tables, JSON and reports show."""
    view = view_of(study, view)
    return _rows(view.finished, view.baselines)


def _rows(finished: list, baselines: Baselines) -> list[dict]:
    """One flat row per finished trial (`finished`), its speed and memory against the baselines'."""
    eager_sps, default_sps, eager_peak = baselines.eager_sps, baselines.default_sps, baselines.eager_peak
    rows = []
    for t in finished:
        if t.user_attrs.get("status") == Status.DUPLICATE:  # proposed twice, never run
            continue
        a = t.user_attrs
        config = a.get("config")
        rows.append(
            {
                "number": t.number,
                "role": a.get("role", "")
                + (f" of {a['remeasure_of']}" if "remeasure_of" in a else "")
                + (f" (re-judged {a['rejudged_from']})" if "rejudged_from" in a else ""),
                "config": describe_config(config) if config else "",
                "status": status_of(t),
                "reason": a.get("reason", "the search stopped during this trial" if "status" not in a else ""),
                "warmup_s": a.get("warmup_s"),
                "warmup_kind": a.get("warmup_kind"),
                "predicted_warmup_s": a.get("predicted_warmup_s"),
                "steps_per_s": a.get("steps_per_s"),
                "items_per_s": a.get("items_per_s"),
                "vs_eager": a["steps_per_s"] / eager_sps if a.get("steps_per_s") and eager_sps else None,
                "vs_default": a["steps_per_s"] / default_sps if a.get("steps_per_s") and default_sps else None,
                "cv": a.get("cv"),
                "recompiles": a.get("recompiles"),
                "graph_breaks": a.get("graph_breaks"),
                "peak_mem_gb": a.get("peak_mem_gb"),
                "mem_vs_eager": a["peak_mem_gb"] / eager_peak if a.get("peak_mem_gb") and eager_peak else None,
                "padding_share": a.get("padding_share"),  # of the tokens computed, the share that was padding
                "score": a.get("score", t.value),  # a pruned trial's value is its bound
                "wall_s": a.get("wall_s"),
                "diverges_at": a.get("diverges_at"),  # a numerics failure: where it parts from eager (trial/divergence.py)
            }
        )
    return rows


def no_winner_line(rows: list[dict], trials_dir: str, max_memory_gb: float | None) -> str:
    """Why a search ended without a winner, in one line: every configuration that ran needed more
    memory than allowed (say the least any needed), or see the reasons and logs."""
    compiled = [r for r in rows if r["status"] != Status.OK and r.get("peak_mem_gb") and r["role"] != Role.EAGER]
    over = [r for r in compiled if max_memory_gb is not None and r["peak_mem_gb"] > max_memory_gb]
    if over and len(over) == len(compiled):
        least = min(over, key=lambda r: r["peak_mem_gb"])
        return (
            f"no configuration fit --max-memory-gb {max_memory_gb:g}: the least any needed was "
            f"{least['peak_mem_gb']:.2f} GB (trial {least['number']}, {least['config']}); raise the limit, or "
            f"lower the batch size or the sequence length (--batch-size, --seq-len)"
        )
    return "no trial ran cleanly yet: see the reasons above and the logs in " + trials_dir


def add_repros(rows: list[dict], study_dir: str) -> None:
    """The repro `autocompile repro` made of a failed trial, as its row's `repro` (the file) and `repro_line`."""
    from autocompile.outputs.repro import summary_of

    for row in rows:
        made = summary_of(study_dir, row["number"]) if row.get("status") not in (Status.OK, None) else None
        if made:
            row.update(repro=made.get("repro"), repro_line=made["line"])


def summarize(
    study, study_dir: str | None, write: bool = False, horizon: int | None = None, max_memory_gb: float | None = None
) -> dict:
    """The winner and the table; with write, the winner's snippet goes to study_dir. With a
    horizon other than the study's, or a memory limit, the winner for it comes from the
    measurements (its score too)."""
    view = view_of(study)
    baselines, finished = view.baselines, view.finished
    rows = _rows(finished, baselines)
    if study_dir:
        add_repros(rows, study_dir)
    horizon = horizon or study.user_attrs.get("horizon", 1000)
    best, score_of = _winner(study, view, horizon, max_memory_gb)
    summary = {
        "study": study.study_name,
        "rows": rows,
        "best": None,
        "horizon": horizon,
        "finalists": study.user_attrs.get("finalists"),
        "effects": effects(study, view),
    }
    if best is None:
        return summary
    summary["best"] = _best_record(best, baselines, horizon, score_of(best))
    if max_memory_gb is not None:
        summary["best"]["max_memory_gb"] = max_memory_gb
    _baseline_notes(summary["best"], baselines)
    verdict = summary["finalists"]
    _cold_warm_up(summary["best"], verdict)
    _round_speed(summary["best"], verdict, baselines, scored=horizon == study.user_attrs.get("horizon", 1000))
    summary["best"]["snippet"] = winner_snippet(best, study_dir, summary["best"], baselines)
    if verdict and verdict.get("finalists") and verdict.get("winner") is None:
        summary["best"]["unconfirmed"] = "the finalist round measured none of its finalists again"
    _score_against_default(summary["best"], baselines, best, horizon, score_of)
    if write and study_dir:
        write_outputs(summary, study_dir)
    return summary


def _winner(study, view: StudyView, horizon: int, max_memory_gb: float | None) -> tuple:
    """The winning trial (None if none ran cleanly) and how a trial's score is read: the study's own
    winner at the study's horizon; at another horizon, or within a memory limit, the best the
    measurements give, each score worked out again for that horizon."""
    if horizon == study.user_attrs.get("horizon", 1000) and max_memory_gb is None:
        return view.best_trial, lambda t: t.value
    from autocompile.outputs.pareto import best_trial_for
    from autocompile.engine.scoring import score

    best = best_trial_for(study, horizon, max_memory_gb, view)
    return best, lambda t: score({**t.user_attrs, "status": Status.OK}, horizon)  # within the limit: it ran


def _best_record(best, baselines: Baselines, horizon: int, score: float) -> dict:
    """The winner's line of the summary: what it is, what it measured and its speed against the baselines'."""
    eager_sps, default_sps = baselines.eager_sps, baselines.default_sps
    a = best.user_attrs
    return {
        "number": best.number,
        "role": a.get("role"),
        "config": a.get("config"),
        "score": score,
        "horizon": horizon,
        **{
            k: a.get(k)
            for k in (
                "status",
                "warmup_s",
                "steps_per_s",
                "items_per_s",
                "unit",
                "recompiles",
                "graph_breaks",
                "peak_mem_gb",
                "cv",
                "device_name",
                "torch",
                "transformers",
            )
        },
        "vs_eager": a["steps_per_s"] / eager_sps if eager_sps else None,
        "vs_default": a["steps_per_s"] / default_sps if default_sps else None,
        "warmup_kind": a.get("warmup_kind"),
    }


BASELINE_NAMES = {Role.EAGER: "eager", Role.COMPILE_DEFAULTS: "plain torch.compile"}


def _baseline_notes(best: dict, baselines: Baselines) -> None:
    """What the winner's ratios are against where a baseline did not run cleanly: a baseline measured
    over the memory limit (still the reference), or eager not measured at all (how it ended)."""
    over = [(BASELINE_NAMES[role], t.user_attrs["peak_mem_gb"]) for role, t in baselines.over_memory]
    if over:  # measured, over the limit: still the references of the ratios
        best["references_over_memory"] = " and ".join(f"{n} peaked at {gb:.2f} GB" for n, gb in over)
    if baselines.eager_sps is None:  # eager did not run cleanly (a model eager cannot fit)
        first = baselines.eager_first
        eager = first.user_attrs if first else {}
        best["no_eager"] = f"eager ended {eager.get('status', 'unmeasured')}" + (
            f" ({eager['reason'][:100]})" if eager.get("reason") else ""
        )


def _score_against_default(best: dict, baselines: Baselines, winner, horizon: int, score_of) -> None:
    """The winner's score against plain torch.compile's, warm-up weighed in over the horizon; where plain
    torch.compile never finished warming up, against the most its score could be."""
    default = baselines.default
    if default is not None:  # measured: scores weigh warm-up in, over the horizon
        if default.number != winner.number and score_of(default):
            best["score_vs_default"] = best["score"] / score_of(default)
    elif (bound := default_score_bound(horizon, baselines)) and best["score"] > bound:
        # Plain torch.compile never finished warming up: its score is at most `bound`.
        best["score_vs_default_at_least"] = best["score"] / bound


def _cold_warm_up(best: dict, verdict: dict | None) -> None:
    """The winner's warm-up as measured cold by the finalist round's check, where its own was
    reconstructed (autocompile.engine.finalists.cold_check)."""
    verdict = verdict or {}
    checks = verdict.get("cold_checks") or [verdict.get("cold_check") or {}]
    check = next((c for c in checks if c.get("of", verdict.get("winner")) == best["number"]), {})
    if (
        best.get("warmup_kind") == "reconstructed"
        and verdict.get("winner") == best["number"]
        and check.get("status") == Status.OK
    ):
        best.update(
            warmup_s=check["cold_warmup_s"],
            warmup_kind=f"cold, measured in trial {check['trial']}",
            reconstructed_warmup_s=check["reconstructed_warmup_s"],
        )


def _round_speed(best: dict, verdict: dict | None, baselines: Baselines, scored: bool) -> None:
    """The winner's speed and score as the finalist round took them (its runs pooled, against the round's
    eager), where the round measured it again: its first run alone would say more or less than the round found.
    The round's score is for the study's horizon: `scored` says the summary is for it too."""
    verdict = verdict or {}
    row = next((r for r in verdict.get("candidates", []) if r["trial"] == best["number"] and "paces" in r), None)
    if verdict.get("winner") != best["number"] or row is None or row["status"] != Status.OK:
        return
    default = baselines.default
    # plain torch.compile's speed, pooled too where it is the winner itself
    default_sps = row["steps_per_s"] if default and default.number == best["number"] else baselines.default_sps
    if best.get("items_per_s") and best.get("steps_per_s"):  # the same batches: the same items a step
        best["items_per_s"] *= row["steps_per_s"] / best["steps_per_s"]
    if scored:
        best["score"] = row["score"]
    best.update(
        steps_per_s=row["steps_per_s"],
        paces=row["paces"],
        vs_eager=row.get("vs_eager") or best["vs_eager"],
        vs_default=row["steps_per_s"] / default_sps if default_sps else None,
    )


# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity), by a word of the device's name: MFU's denominator
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0))


def peak_tflops(record: dict) -> float | None:
    """The record's device's dense bf16 peak (TFLOP/s), where it is known: MFU's denominator."""
    device = record.get("device_name") or ""
    return next((value for word, value in PEAK_BF16_TFLOPS if word in device), None)


def mfu(record: dict) -> float | None:
    """The model's FLOPs at the measured speed over the device's dense bf16 peak, where the workload declares
    its FLOPs (6 x the parameters an item passes through) and the device's peak is known."""
    tflops, peak = record.get("model_tflops_per_s"), peak_tflops(record)
    return tflops / peak if tflops and peak else None


def _mfu_words(record: dict) -> str:
    share = mfu(record)
    if share is None:
        return ""
    tflops, peak = record["model_tflops_per_s"], peak_tflops(record)
    return f" MFU {100 * share:.1f}%: {tflops:.0f} TFLOP/s of the model's FLOPs, of a dense bf16 peak of {peak:g}."


def _warm_up_words(record: dict) -> str:
    """ "warm-up 12.3 s", and how it was found where it was not one cold run."""
    kind = record.get("warmup_kind") or ""
    how = (
        " (reconstructed from the shared cache's hits)"
        if kind == "reconstructed"
        else f" ({kind})"
        if kind.startswith("cold, measured in")
        else ""
    )
    return f"warm-up {record.get('warmup_s') or 0:.1f} s{how}"


def search_summary(runner) -> dict:
    """The summary of a search that has ended (autocompile.engine.study.search_study): its table, its winner
    and what the harness added around the trials; the winner's files written beside the study."""
    import time

    settings = runner.settings
    summary = summarize(runner.study, settings.study_dir)
    if runner.trials_wall:
        wall = time.time() - runner.started
        trials = runner.trials_wall
        summary["harness"] = harness = {"search_wall_s": wall, "trials_wall_s": trials, "ratio": wall / trials}
        gpus = (runner.study.user_attrs.get("budget") or {}).get("gpus", 1)
        if gpus == 1:
            runner.progress.line(f"harness: this search took {wall:.0f} s for {trials:.0f} s of trials ({wall / trials:.2f}x)")
        else:  # the trials ran side by side: what share of the GPUs' time they took
            harness.update(gpus=gpus, gpu_share=trials / (gpus * wall))
            runner.progress.line(
                f"harness: this search took {wall:.0f} s on {gpus} GPUs for {trials:.0f} s of trials: "
                f"{harness['gpu_share']:.3f} of the GPUs' time in trials"
            )
    said = contained_summary(runner.study)
    if said:
        runner.progress.line(said)
    if summary["best"]:
        write_outputs(summary, settings.study_dir)
    return summary


def write_outputs(summary: dict, study_dir: str) -> None:
    """The winner's snippet, the trial table and the rows as JSON, beside the study. Written again
    without a search (`autocompile report`, `rejudge`), they keep what the last search's harness took."""
    os.makedirs(study_dir, exist_ok=True)
    if "harness" not in summary:
        try:
            with open(os.path.join(study_dir, "results.json")) as f:
                earlier = json.load(f).get("harness")
        except (OSError, ValueError, AttributeError):
            earlier = None
        if earlier:
            summary = {**summary, "harness": earlier}
    with open(os.path.join(study_dir, "apply_compilation.py"), "w") as f:
        f.write(summary["best"]["snippet"])
    with open(os.path.join(study_dir, "trials.txt"), "w") as f:
        f.write(format_summary(summary) + "\n")
    with open(os.path.join(study_dir, "results.json"), "w") as f:
        json.dump({k: v for k, v in summary.items()}, f, indent=1, default=str)


def winner_snippet(best, study_dir: str | None, summary_best: dict, baselines: Baselines) -> str:
    """The code the winning trial ran, under a docstring that says what it measured (the
    snippet from the trial's whole record: the study holds only its start; the warm-up the
    summary's winner has, cold-checked where it was reconstructed)."""
    kept = (
        "warmup_s",
        "warmup_kind",
        "steps_per_s",
        "paces",
        "vs_eager",
        "vs_default",
    )  # as the summary has them (cold-checked, pooled)
    a = {**full_record(best, study_dir), **{k: v for k, v in summary_best.items() if k in kept}}
    measured = _measured_words(a, baselines)
    config = a.get("config") or {}
    if a.get("peak_mem_gb") and (
        config.get("activation_checkpointing", "as_built") != "as_built" or config.get("activation_memory_budget") is not None
    ):
        eager_peak = baselines.eager_peak
        measured += f" Peak memory {a['peak_mem_gb']:.1f} GB ({a.get('peak_mem_kind', 'measured')})" + (
            f", eager as built {eager_peak:.1f} GB." if eager_peak else "."
        )
    snippet = a.get("snippet", "")
    first_line_end = snippet.find("\n")
    # The snippet's docstring opens on its first line: add the measurement below it.
    return snippet[:first_line_end] + "\n\n" + measured + snippet[first_line_end:]


def _measured_words(a: dict, baselines: Baselines) -> str:
    """The snippet docstring's line on what the winner measured: its steady speed against eager's and plain
    torch.compile's, its warm-up, and the runs pooled where the finalist round measured it again."""
    vs_default = f"{a['vs_default']:.2f}x" if a.get("vs_default") else speedup(a.get("steps_per_s"), baselines.default_sps)
    vs_eager = f"{a['vs_eager']:.2f}x" if a.get("vs_eager") else speedup(a.get("steps_per_s"), baselines.eager_sps)
    pooled = len(a.get("paces", [])) > 1
    return (
        f"Measured on {a.get('device_name')} with torch {a.get('torch')}: {a.get('steps_per_s', 0):.3g} steps/s "
        f"steady ({vs_eager} eager, {_against_defaults(vs_default)}), {_warm_up_words(a)}."
        + _mfu_words(a)
        + (f" The steady speed pools its runs in the finalist round: {_then(a['paces'])} steps/s." if pooled else "")
    )


TABLE_COLUMNS = (
    ("#", "number", "{}"),
    ("role", "role", "{}"),
    ("status", "status", "{}"),
    ("warm-up s", "warmup_s", "{:.1f}"),
    ("steps/s", "steps_per_s", "{:.3g}"),
    ("vs eager", "vs_eager", "{:.2f}x"),
    ("vs default", "vs_default", "{:.2f}x"),
    ("cv", "cv", "{:.1%}"),
    ("recomp", "recompiles", "{}"),
    ("breaks", "graph_breaks", "{}"),
    ("peak GB", "peak_mem_gb", "{:.2f}"),
    ("mem vs eager", "mem_vs_eager", "{:.2f}x"),
    ("padding", "padding_share", "{:.0%}"),
    ("score", "score", "{:.3g}"),
    ("config", "config", "{}"),
)


def format_table(rows: list[dict]) -> str:
    """A plain-text table of trials (fixed-width, for terminals and committed logs)."""
    cells = [[title for title, _, _ in TABLE_COLUMNS]]
    for row in rows:
        line = []
        for _, key, fmt in TABLE_COLUMNS:
            value = row.get(key)
            line.append("-" if value is None or value == "" else fmt.format(value))
            if key == "warmup_s" and value is not None and row.get("warmup_kind") == "reconstructed":
                line[-1] += "r"
        if row.get("status") not in (Status.OK, None) and row.get("reason"):
            line[-1] += f"  [{row['reason'][:80]}]"
        if row.get("diverges_at"):
            found = row["diverges_at"]
            line[-1] += f"  [diverges first at {found['module']} ({found['pass']}, {found['rel_error']:.2%})]"
        if row.get("repro"):
            line[-1] += f"  [repro: {row['repro']}]"
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(TABLE_COLUMNS) - 1)]
    out = []
    for r in cells:
        out.append("  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + "  " + r[-1])
    return "\n".join(out)


def _against_defaults(ratio: str) -> str:
    """ "1.36x torch.compile defaults", or what is known when plain torch.compile has no steady speed."""
    return f"{ratio} torch.compile defaults" if ratio != "-" else "torch.compile defaults not measured to a steady speed"


def format_best(best: dict) -> str:
    """The winner in one line."""
    vs = lambda x: f"{x:.2f}x" if x else "-"
    horizon = f" for {best['horizon']} steps" if best.get("horizon") else ""
    return (
        f"winner{horizon}: trial {best['number']} ({best['role']}) {describe_config(best['config'])}: "
        f"{best['steps_per_s']:.3g} steps/s{_pooled_words(best)}, {vs(best['vs_eager'])} eager, "
        f"{_against_defaults(vs(best['vs_default']))}, "
        f"{_warm_up_words(best)}"
        + (
            f"; score {best['score_vs_default']:.2f}x plain torch.compile's (warm-up included)"
            if best.get("score_vs_default")
            else ""
        )
        + (
            f"; score at least {best['score_vs_default_at_least']:.2f}x plain torch.compile's, which was "
            f"still warming up when stopped"
            if best.get("score_vs_default_at_least")
            else ""
        )
        + (f"; not confirmed: {best['unconfirmed']}" if best.get("unconfirmed") else "")
        + (
            f"; no eager reference: {best['no_eager']}, so the ratios are against plain torch.compile"
            if best.get("no_eager")
            else ""
        )
        + (
            f"; {best['references_over_memory']}, above the memory limit: the ratios are still against their speeds"
            if best.get("references_over_memory")
            else ""
        )
        + (
            f"; peak {best['peak_mem_gb']:.2f} GB, within --max-memory-gb {best['max_memory_gb']:g}"
            if best.get("max_memory_gb") is not None
            else ""
        )
    )


def _pooled_words(best: dict) -> str:
    """ " (7.04 then 6.86 pooled in the finalist round)" where the winner's speed pools its runs, else ""."""
    return f" ({_then(best['paces'])} pooled in the finalist round)" if len(best.get("paces", [])) > 1 else ""


def format_failures(rows: list[dict], study: str) -> str:
    """The configurations that failed (numerics failures included), one line each, with what
    `autocompile repro` made of it or the command that makes it, and where numerics part; "" if none."""
    lines = []
    for row in rows:
        numerics = row.get("status") == Status.INFEASIBLE and row.get("reason", "").startswith("numerics")
        if row.get("status") not in FAILURES and not numerics:
            continue
        line = f"  trial {row['number']} {row['config']}: {row['status']}: {row.get('reason', '')[:100]}"
        if row.get("diverges_at"):
            found = row["diverges_at"]
            line += f"; diverges first at {found['module']} ({found['pass']}, {found['rel_error']:.2%})"
        if row.get("repro_line"):
            line += f"; {row['repro_line']}"
        elif row.get("status") != Status.OOM:
            accuracy = " --accuracy" if numerics else ""
            line += f"; to reproduce it: autocompile repro --study {study} --trial {row['number']}{accuracy}"
        lines.append(line)
    return "failed configurations:\n" + "\n".join(lines) if lines else ""


def format_predictions(rows: list[dict]) -> str:
    """How well warm-ups predicted before launch (autocompile.engine.cost.Predictor) matched the measured
    ones, and how many trials a prediction pruned before launch; "" where there was none."""
    pairs = [
        (r["predicted_warmup_s"], r["warmup_s"])
        for r in rows
        if r.get("predicted_warmup_s") and r.get("warmup_s") and r.get("status") == Status.OK
    ]
    pruned = sum(r.get("status") == Status.PRUNED and r.get("reason", "").startswith("pruned before launch") for r in rows)
    if not pairs and not pruned:
        return ""
    line = "warm-up predicted before launch:"
    if pairs:
        errors = sorted(abs(p / m - 1) for p, m in pairs)
        line += (
            f" {len(pairs)} trial{'s' if len(pairs) > 1 else ''} measured, median error {errors[len(errors) // 2]:.0%},"
            f" worst {errors[-1]:.0%}"
        )
    if pruned:
        line += f"{';' if pairs else ''} {pruned} pruned before launch by the prediction"
    return line


def format_finalists(verdict: dict | None) -> str:
    """The finalist round: each finalist's two measurements, how well they agree, the choice."""
    if not verdict:
        return ""
    eager = verdict.get("eager_steps_per_s")
    if eager and len(verdict.get("eager_paces", [])) > 1:  # WINNER_RULE 3: its run in the search and in the round
        lines = [
            f"finalist round (eager {_then(verdict['eager_paces'])} steps/s in the search and the round, taken as {eager:.3g}):"
        ]
    else:
        lines = [f"finalist round (eager {eager:.3g} steps/s in the round):" if eager else "finalist round:"]
    for row in verdict["candidates"]:
        if row["status"] != Status.OK:
            lines.append(f"  trial {row['trial']}: {row['status']} - {row['reason'][:100]}")
            continue
        vs = f"{row['vs_eager']:.2f}x eager, " if row.get("vs_eager") else ""
        paces = (
            f"{_then(row['paces'])} steps/s, taken as {row['steps_per_s']:.3g}"
            if "paces" in row
            else f"{row['search_steps_per_s']:.3g} then {row['steps_per_s']:.3g} steps/s"
        )
        lines.append(
            f"  trial {row['trial']}{_on_gpu(verdict, row)} (rerun as {', '.join(map(str, row['reruns']))}): "
            f"{paces} (agree within {row['agreement']:.1%}), {vs}warm-up {row['warmup_s']:.1f} s"
            + (f" cold (reconstructed {row['reconstructed_warmup_s']:.1f} s)" if "reconstructed_warmup_s" in row else "")
            + ", "
            f"score {row['score']:.3g}  {describe_config(row['config'])}"
        )
    if verdict.get("why"):
        lines.append("  " + verdict["why"])
    return "\n".join(lines)


def _on_gpu(verdict: dict, row: dict) -> str:
    """Where a finalist ran in a round on several GPUs, and how its round speeds were put on the reference
    GPU's footing (`finalists.gpu_footing`); nothing for a round on one."""
    footing = verdict.get("footing")
    if not footing or "gpu" not in row:
        return ""
    if row["gpu"] == footing["reference"] or footing["reference"] is None:
        return f" on GPU {row['gpu']}"
    return f" on GPU {row['gpu']} (its round speeds x{row['eager_scale']:.3f}, onto GPU {footing['reference']}'s eager)"


def _then(paces: list[float]) -> str:
    return " then ".join(f"{p:.3g}" for p in paces)


def format_effects(rows: list[dict]) -> str:
    """What each setting did: each neighbour against the trial it changed, a move of one dimension
    (with those it conditions) said as such, a move of several as several."""
    lines = [
        "what each setting did (a trial against its parent: one dimension changed, with those it conditions, "
        "unless it says several; each one's score averaged over its runs, finalist reruns included):"
    ]
    for row in rows:
        change = ", ".join(f"{name} {json.dumps(old)} -> {json.dumps(new)}" for name, (old, new) in row["changed"].items())
        if not row.get("single", True):
            change = f"a move of {len(row['changed'])} dimensions ({change})"
        reason = row.get("reason", "")
        if "effect" in row:
            outcome = f"{row['effect']:+.1%} score"
        elif row.get("peak_mem_gb"):  # a move made for memory: whether it fits now
            outcome = (
                "still over the memory limit" if row["over_limit"] else "fits" if row["status"] == Status.OK else row["status"]
            )
        else:
            outcome = reason[:90] if reason.startswith(row["status"]) else f"{row['status']}: {reason[:90]}"
        if row.get("peak_mem_gb"):
            outcome += ", peak {:.2f} -> {:.2f} GB".format(*row["peak_mem_gb"])
        if row.get("other_machine"):
            outcome += " (the two ran on different machines: not a like-for-like comparison)"
        lines.append(f"  trial {row['trial']} (from {row['parent']}): {change}: {outcome}")
    return "\n".join(lines)


def format_summary(summary: dict) -> str:
    """Table, finalist round and winner: what `search` prints and trials.txt holds."""
    parts = [format_table(summary["rows"])]
    if any(row.get("warmup_kind") == "reconstructed" for row in summary["rows"]):
        parts[0] += (
            "\nr: a cold warm-up reconstructed: the warm-up measured with the shared compile cache, plus the "
            "cold compile time of each graph the cache had (docs/search.md)"
        )
    if predictions := format_predictions(summary["rows"]):
        parts.append(predictions)
    if summary.get("effects"):
        parts.append(format_effects(summary["effects"]))
    if summary.get("finalists"):
        parts.append(format_finalists(summary["finalists"]))
    if summary.get("best"):
        parts.append(format_best(summary["best"]))
    return "\n\n".join(parts)
