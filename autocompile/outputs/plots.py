"""DIR/STUDY/report/: the study in four matplotlib PNGs and a report.md that embeds them.

scores.png (each trial's score in order), pareto.png (steady speed against cold warm-up, with
the front and lines of equal score), effects.png (what each dimension did), timeline.png (each
trial's build, compile/warm-up and measurement); and, for a search on several GPUs (or workers),
gpus.png (each GPU's trials over the search's time: where a GPU idled). Each `plot_*(study, ...,
path)` draws one and returns what it drew, so the figures can be checked against the study.
"""

from __future__ import annotations

import io
import json
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from autocompile.apply import describe_config
from autocompile.outputs.pareto import measured_points, pareto_front, winner_at
from autocompile.engine.records import Role, config_columns, status_of
from autocompile.engine.studyview import StudyView, view_of
from autocompile.trial.result import Status

DPI = 110
ROLE_STYLE = {  # role -> (marker, colour, legend label)
    Role.EAGER: ("s", "#444444", "baseline: eager"),
    Role.COMPILE_DEFAULTS: ("s", "#1f77b4", "baseline: plain torch.compile"),
    Role.RECIPE: ("o", "#2ca02c", "recipe"),
    Role.SEARCH: ("^", "#9467bd", "sampled (TPE)"),
    Role.NEIGHBOUR: ("P", "#17becf", "neighbour (of the incumbent or the fastest trial)"),
    Role.FINALIST: ("D", "#ff7f0e", "finalist round"),
}
OTHER_STYLE = ("v", "#8c564b", "other")
PHASE_COLOURS = {"build": "#bbbbbb", "compile / warm-up": "#ff7f0e", "measurement": "#2ca02c", "stopped or failed": "#d62728"}
MAX_LABEL = 46  # characters of a configuration shown beside a bar
TICK_LABELS = 20  # trial numbers labelled on the score plot's axis at most (more overlap at its width)


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: str) -> None:
    """The figure as a PNG of at most 256 colours: a plot has few, and it is a third of the full-colour file's size
    (the committed reports' figures were 17 MiB of the repository's 58: docs/decisions.md)."""
    from PIL import Image

    drawn = io.BytesIO()
    figure.savefig(drawn, format="png")
    drawn.seek(0)
    Image.open(drawn).convert("RGB").quantize(256).save(path, optimize=True)


def _horizon(study) -> int:
    return study.user_attrs.get("horizon", 1000)


def _short(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _finished(study) -> list:
    return [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]


def plot_scores(study, path: str) -> dict:
    """(a) The score of each trial in order, by role; failures at 0, pruned trials at the bound
    they could still reach; eager and plain torch.compile as horizontal lines."""
    horizon, figure, view = _horizon(study), _figure(9, 4.8), view_of(study)
    ax = figure.add_subplot()
    drawn = {"ran": [], "pruned": [], "failed": []}
    for t in view.finished:
        drawn[_draw_score(ax, t)].append(t.number)
    drawn.update(_draw_baseline_scores(ax, study, view, horizon))
    best = view.best_trial
    if best is not None:
        ax.scatter(best.number, best.value, marker="*", s=320, color="gold", edgecolors="black", zorder=4, label="winner")
        drawn["winner"] = best.number
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(
        xlabel="trial",
        ylabel=f"score (steps/s over {horizon} steps, warm-up included)",
        title=f"{study.study_name}: the score of each trial, in the order they ran",
    )
    numbers = [t.number for t in view.finished]
    every = -(-len(numbers) // TICK_LABELS)  # a label on every trial up to TICK_LABELS of them, then on every k-th
    ax.set_xticks(numbers, labels=[str(n) if i % every == 0 else "" for i, n in enumerate(numbers)])
    ax.set_ylim(bottom=-0.02 * ax.get_ylim()[1])
    drawn["y_top"] = ax.get_ylim()[1]
    ax.grid(alpha=0.3)
    _save(figure, path)
    return drawn


def _draw_score(ax, t) -> str:
    """One trial's score: a filled marker of its role where it ran, a hollow one at its bound where it
    was pruned, a cross at 0 with its status otherwise. Returns which of these it drew."""
    marker, colour, label = ROLE_STYLE.get(t.user_attrs.get("role"), OTHER_STYLE)
    status = status_of(t)
    if status == Status.OK:
        ax.scatter(t.number, t.value, marker=marker, color=colour, s=60, zorder=3, label=label)
        return "ran"
    if status == Status.PRUNED and t.value:
        ax.scatter(
            t.number,
            t.value,
            marker=marker,
            facecolors="none",
            edgecolors=colour,
            s=60,
            zorder=3,
            label="pruned (at its bound)",
        )
        return "pruned"
    ax.scatter(t.number, 0, marker="x", color="#d62728", s=50, zorder=3, label="failed, timed out or stopped")
    ax.annotate(
        status,
        (t.number, 0),
        textcoords="offset points",
        xytext=(0, 6),
        ha="center",
        fontsize=7,
        rotation=90,
        color="#d62728",
    )
    return "failed"


def _draw_baseline_scores(ax, study, view: StudyView, horizon: int) -> dict:
    """Eager's and plain torch.compile's scores as dashed lines; where plain torch.compile never finished
    warming up, the most its score could be, dotted (only in the legend where it is off the scale).
    Returns that bound and whether it is drawn as a line, where there is one."""
    from autocompile.outputs.table import default_score_bound

    eager, default = view.baseline_trial(Role.EAGER), view.baseline_trial(Role.COMPILE_DEFAULTS)
    if eager is not None:
        ax.axhline(eager.value, color=ROLE_STYLE[Role.EAGER][1], linestyle="--", linewidth=1, label="eager's score")
    if default is not None:
        ax.axhline(
            default.value,
            color=ROLE_STYLE[Role.COMPILE_DEFAULTS][1],
            linestyle="--",
            linewidth=1,
            label="plain torch.compile's score",
        )
        return {}
    bound = default_score_bound(horizon, view.baselines)
    if bound is None:
        return {}
    top = max([t.value for t in view.finished if t.value] or [bound])
    if bound <= 3 * top:
        ax.axhline(
            bound,
            color=ROLE_STYLE[Role.COMPILE_DEFAULTS][1],
            linestyle=":",
            linewidth=1.2,
            label="plain torch.compile: at most (never finished warming up)",
        )
    else:  # a bound from a short attempt (a 40 s one: 390) would squash every trial to the floor
        ax.plot(
            [],
            [],
            color=ROLE_STYLE[Role.COMPILE_DEFAULTS][1],
            linestyle=":",
            linewidth=1.2,
            label=f"plain torch.compile: at most {bound:.3g}\n(never finished warming up; off this scale)",
        )
    return {"default_bound": {"value": bound, "line": bound <= 3 * top}}


def _equal_score_curve(point, horizon: int, warmups: list[float]) -> tuple[list, list]:
    """(warm-up s, steps/s) along which the score at `horizon` equals that of `point`."""
    level, steps = point.score(horizon), point.figures["warmup_steps"]
    xs, ys = [], []
    for w in warmups:
        time_left = horizon / level - w
        if time_left > 0 and horizon > steps:
            xs.append(w)
            ys.append((horizon - steps) / time_left)
    return xs, ys


def plot_pareto(study, path: str) -> dict:
    """(b) Steady throughput against cold warm-up for every trial that ran, the front (each
    configuration at the mean of its runs), and the line of equal score through the winner
    at a few horizons: a point above a line would beat that winner at that horizon."""
    horizon, figure = _horizon(study), _figure(9, 7)
    ax = figure.add_subplot()
    ran = [t for t in _finished(study) if status_of(t) == Status.OK and t.user_attrs.get("steps_per_s")]
    for t in ran:
        marker, colour, label = ROLE_STYLE.get(t.user_attrs.get("role"), OTHER_STYLE)
        ax.scatter(
            t.user_attrs["warmup_s"], t.user_attrs["steps_per_s"], marker=marker, color=colour, s=55, zorder=3, label=label
        )
        ax.annotate(
            str(t.number),
            (t.user_attrs["warmup_s"], t.user_attrs["steps_per_s"]),
            fontsize=7,
            textcoords="offset points",
            xytext=(5, 4),
        )
    points = measured_points(study)
    front = pareto_front(points)
    if front:
        ax.plot(
            [p.figures["warmup_s"] for p in front],
            [p.figures["steps_per_s"] for p in front],
            color="black",
            linewidth=1,
            drawstyle="steps-post",
            zorder=2,
            label="Pareto front (mean of each configuration's runs)",
        )
    horizons = sorted({max(10, horizon // 10), horizon, horizon * 10})
    if ran:
        low = min(t.user_attrs["warmup_s"] for t in ran)
        high = max(t.user_attrs["warmup_s"] for t in ran)
        warmups = [low / 2 * (high * 4 / low) ** (i / 200) for i in range(201)]
        top = max(t.user_attrs["steps_per_s"] for t in ran)
        for h, style in zip(horizons, (":", "--", "-.")):
            winner = winner_at(points, h)
            xs, ys = _equal_score_curve(winner, h, warmups)
            ax.plot(
                xs,
                ys,
                linestyle=style,
                color="#777777",
                linewidth=1,
                label=f"equal score at {h} steps (through trial {winner.number}, its winner)",
            )
        bottom = min(t.user_attrs["steps_per_s"] for t in ran)
        ax.set_xscale("log")
        ax.set_xlim(low / 1.6, high * 1.6)
        ax.set_ylim(bottom * 0.8, top * 1.15)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    ax.set(
        xlabel="cold warm-up, s (log scale)",
        ylabel="steady throughput, steps/s",
        title=f"{study.study_name}: steady speed against warm-up (each trial that ran)",
    )
    ax.grid(alpha=0.3, which="both")
    _save(figure, path)
    return {"ran": [t.number for t in ran], "front": [p.number for p in front], "horizons": horizons}


def single_changes(study) -> list[dict]:
    """Pairs of measured configurations one change apart: a neighbour and the parent the search
    recorded for it (its one move, with the dimensions that move conditions: the compiled step
    dropped brings in the fused optimizer), and any two that differ in one dimension alone, from
    the earlier to the later."""
    points = measured_points(study)
    flat = {p.number: config_columns(p.trial.user_attrs["config"]) for p in points}
    horizon, pairs = _horizon(study), []
    for i, a in enumerate(points):
        for b in points[i + 1 :]:
            changed = [
                k for k in sorted(set(flat[a.number]) | set(flat[b.number])) if flat[a.number].get(k) != flat[b.number].get(k)
            ]
            src, dst = (b, a) if a.trial.user_attrs.get("parent") == b.number else (a, b)
            if not changed or (len(changed) > 1 and dst.trial.user_attrs.get("parent") != src.number):
                continue
            pairs.append(
                {
                    "changes": [(key, flat[src.number].get(key), flat[dst.number].get(key)) for key in changed],
                    "trials": (src.number, dst.number),
                    "steady": dst.figures["steps_per_s"] / src.figures["steps_per_s"],
                    "score": dst.score(horizon) / src.score(horizon),
                }
            )
    return pairs


def param_importances(study) -> dict[str, float]:
    """Optuna's parameter importances of the score, {} where there are too few trials for them, or
    where they are all alike: no parameter explained the score (Optuna then gives each of n
    parameters 1/n; docs/decisions.md)."""
    import warnings

    import optuna

    with_params = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.params]
    if len(with_params) < 3 or len({t.value for t in with_params}) < 2:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "some regimes have less than 2 trials": said in the title
            importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError):
        return {}
    values = list(importances.values())
    return importances if values and max(values) - min(values) > 1e-9 else {}


def _value(value) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def change_label(pair: dict, sep: str = ", ") -> str:
    """`dimension: from → to` for each dimension a pair's change moved."""
    return sep.join(f"{key}: {_value(before)} → {_value(after)}" for key, before, after in pair["changes"])


def plot_effects(study, path: str) -> dict:
    """(c) The effect of each dimension: single-change comparisons (steady speed and score ratio)
    where the study has them, and Optuna's parameter importances where there are enough trials."""
    pairs, importances = single_changes(study), param_importances(study)
    panels = [p for p in (pairs, importances) if p]
    rows = max([len(pairs), min(len(importances), 12), 3])
    figure = _figure(12.5 if len(panels) == 2 else 8, max(3.8, 1.4 + 0.45 * rows))
    axes = figure.subplots(1, len(panels)) if panels else [figure.add_subplot()]
    axes = list(axes) if len(panels) == 2 else [axes[0] if isinstance(axes, list) else axes]
    if not panels:
        axes[0].text(
            0.5,
            0.5,
            "too few trials for effects: no two measured configurations are one change\n"
            "apart, and too few sampled trials for parameter importances",
            ha="center",
            va="center",
        )
        axes[0].set_axis_off()
    if pairs:
        ax, ys = axes[0], range(len(pairs))
        ax.barh(
            [y + 0.2 for y in ys], [100 * (p["steady"] - 1) for p in pairs], height=0.4, color="#2ca02c", label="steady steps/s"
        )
        ax.barh(
            [y - 0.2 for y in ys],
            [100 * (p["score"] - 1) for p in pairs],
            height=0.4,
            color="#1f77b4",
            label=f"score at {_horizon(study)} steps",
        )
        ax.set_yticks(
            list(ys), [f"{change_label(p, chr(10))}\n(trial {p['trials'][0]} → {p['trials'][1]})" for p in pairs], fontsize=8
        )
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set(xlabel="change, %", title="one change, all else equal")
        ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3, axis="x")
    if importances:
        ax = axes[-1]
        shown = list(importances.items())[:12]
        ax.barh(range(len(shown)), [v for _, v in shown], color="#9467bd")
        ax.set_yticks(range(len(shown)), [k for k, _ in shown], fontsize=8)
        ax.invert_yaxis()
        n = len([t for t in study.get_trials(deepcopy=False) if t.params and t.state.name == "COMPLETE"])
        ax.set(
            xlabel="importance for the score",
            title=f"Optuna's parameter importances\n({n} trials with parameters: a rough guide)",
        )
        ax.grid(alpha=0.3, axis="x")
    figure.suptitle(f"{study.study_name}: what each dimension did")
    _save(figure, path)
    return {"pairs": pairs, "importances": importances}


def _events(study_dir: str, number: int) -> list[dict]:
    path = os.path.join(study_dir, "trials", f"{number:04d}", "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def trial_phases(trial, study_dir: str) -> list[tuple[str, float, float]]:
    """(phase, start s, length s) of a trial from its events.jsonl, else from wall_s and warmup_s."""
    a, events = trial.user_attrs, _events(study_dir, trial.number)
    if events:
        t0 = events[0]["t"]
        warm = next((e["t"] for e in events if e.get("phase") in ("compiling", "warming up")), None)
        measure = next((e["t"] for e in events if e.get("phase") == "measuring"), None)
        done = next((e["t"] for e in events if e.get("phase") == "done"), None)
        if done is None:  # stopped: the compile ran until the limit, or the last event says how far
            done = max(events[-1]["t"], warm + a["warmup_elapsed_s"] if warm and a.get("warmup_elapsed_s") else 0)
        marks = [("build", t0), ("compile / warm-up", warm), ("measurement", measure), ("end", done)]
        marks = [(name, t - t0) for name, t in marks if t is not None]
        phases = [(name, start, end - start) for (name, start), (_, end) in zip(marks, marks[1:])]
        if status_of(trial) != Status.OK and phases and measure is None:
            phases[-1] = ("stopped or failed", *phases[-1][1:])
        return phases
    spent = a.get("warm_warmup_s", a.get("warmup_s"))  # a finalist's rerun carries a cold warm-up it did not spend
    if spent is not None and a.get("wall_s"):
        return [("compile / warm-up", 0.0, spent), ("measurement", spent, a["wall_s"] - spent)]
    return [("stopped or failed", 0.0, a["wall_s"])] if a.get("wall_s") else []


def plot_timeline(study, study_dir: str, path: str) -> dict:
    """(d) Each trial's build, compile/warm-up and measurement, from the start of its process."""
    trials = [t for t in _finished(study) if trial_phases(t, study_dir)]
    figure = _figure(10, 1.3 + 0.36 * max(len(trials), 3))
    ax = figure.add_subplot()
    drawn = {}
    for row, t in enumerate(trials):
        phases = trial_phases(t, study_dir)
        drawn[t.number] = phases
        for name, start, length in phases:
            ax.barh(row, length, left=start, color=PHASE_COLOURS[name], height=0.7, label=name)
        end = phases[-1][1] + phases[-1][2]
        ax.annotate(
            f"{status_of(t)}  {_short(describe_config(t.user_attrs['config']))}" if t.user_attrs.get("config") else status_of(t),
            (end, row),
            textcoords="offset points",
            xytext=(4, -3),
            fontsize=7,
        )
    ax.set_yticks(range(len(trials)), [f"{t.number} {t.user_attrs.get('role', '')}" for t in trials], fontsize=8)
    ax.invert_yaxis()
    right = max((p[1] + p[2] for phases in drawn.values() for p in phases), default=1.0)
    ax.set_xlim(0, right * 1.45)  # room for the labels
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="lower right")
    ax.set(xlabel="seconds from the trial's start", title=f"{study.study_name}: where each trial's time went")
    ax.grid(alpha=0.3, axis="x")
    _save(figure, path)
    return drawn


def gpu_lanes(study) -> dict[str, list]:
    """The trials that ran, by the GPU (or CPU worker) that ran each, in the order each first ran one:
    a finalist's rerun by its `gpu`, another trial by its worker's (`storage.this_worker`; a study from
    before workers recorded it, by the worker's process). Empty unless the search ran on several (its budget's
    `gpus`: a study resumed by another process ran on one at a time)."""
    if (study.user_attrs.get("budget") or {}).get("gpus", 1) < 2:
        return {}
    lanes: dict[str, list] = {}
    unit = "GPU" if (study.user_attrs.get("settings") or {}).get("device", "cuda").startswith("cuda") else "worker"
    ran = [t for t in _finished(study) if t.user_attrs.get("wall_s") and t.datetime_start and t.datetime_complete]
    for t in sorted(ran, key=lambda t: t.datetime_start):
        worker = t.user_attrs.get("worker") or {}
        gpu = t.user_attrs.get("gpu", worker.get("gpu"))
        lanes.setdefault(f"{unit} {gpu}" if gpu is not None else f"worker (pid {worker.get('pid', '?')})", []).append(t)
    return lanes


def plot_gpus(study, path: str) -> dict:
    """(e) Each GPU's trials over the search's time, each bar from its start to its end, coloured by how it
    ended: the gaps are where a GPU idled. Its title gives the share of the GPUs' time in trials."""
    lanes = gpu_lanes(study)
    if not lanes:
        return {}
    start = min(t.datetime_start for trials in lanes.values() for t in trials)
    end = max(t.datetime_complete for trials in lanes.values() for t in trials)
    span = max((end - start).total_seconds(), 1e-9)
    gpus = study.user_attrs["budget"]["gpus"]
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for trials in lanes.values() for t in trials)
    figure = _figure(10, 2.0 + 0.5 * len(lanes))
    ax = figure.add_subplot()
    colours = {Status.OK: "#2ca02c", Status.PRUNED: "#ff7f0e"}
    for row, trials in enumerate(lanes.values()):
        for t in trials:
            left = (t.datetime_start - start).total_seconds()
            width = (t.datetime_complete - t.datetime_start).total_seconds()
            finalist = t.user_attrs.get("role") == Role.FINALIST
            ended = {Status.OK: "ok", Status.PRUNED: "pruned"}.get(status_of(t), "infeasible, cut or failed")
            label = "finalist round" if finalist else ended
            colour = "#9467bd" if finalist else colours.get(status_of(t), "#d62728")
            ax.barh(row, width, left=left, color=colour, edgecolor="white", height=0.6, label=label)
            ax.annotate(str(t.number), (left + width / 2, row), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(lanes)), list(lanes), fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend(handles.values(), handles.keys(), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4)
    share = busy / (gpus * span)
    ax.set(
        xlabel="seconds from the first trial's start",
        title=f"{study.study_name}: each GPU's trials ({busy:.0f} s of trials in {span:.0f} s on {gpus}: {share:.3f} of it)",
    )
    ax.grid(alpha=0.3, axis="x")
    _save(figure, path)
    return {"lanes": {name: [t.number for t in trials] for name, trials in lanes.items()}, "share": share}


def _header(study) -> str:
    """Model, device, versions, horizon and the trials' outcomes, in two lines."""
    settings = study.user_attrs.get("settings", {})
    finished = _finished(study)
    ran = [t for t in finished if status_of(t) == Status.OK]
    measured = next((t.user_attrs for t in ran), {})
    outcomes = {}
    for t in finished:
        outcomes[status_of(t)] = outcomes.get(status_of(t), 0) + 1
    return (
        f"Model `{settings.get('model', '?')}` on {measured.get('device_name', settings.get('device', '?'))} "
        f"(torch {measured.get('torch', '?')}), study created {study.user_attrs.get('created', '?')}, "
        f"scored at a horizon of {_horizon(study)} steps.\n{len(finished)} trials: "
        + ", ".join(f"{n} {status}" for status, n in sorted(outcomes.items(), key=lambda x: -x[1]))
        + "."
    )


def write_report(study, study_dir: str) -> str:
    """Write study_dir/report/: the four PNGs and report.md embedding them; returns report.md's path."""
    from autocompile.outputs.pareto import format_front
    from autocompile.outputs.table import format_best, format_summary, summarize

    out = os.path.join(study_dir, "report")
    os.makedirs(out, exist_ok=True)
    summary = summarize(study, study_dir)  # writes nothing; the snippet from the trials' records
    plot_scores(study, os.path.join(out, "scores.png"))
    pareto = plot_pareto(study, os.path.join(out, "pareto.png"))
    effects = plot_effects(study, os.path.join(out, "effects.png"))
    plot_timeline(study, study_dir, os.path.join(out, "timeline.png"))
    lanes = plot_gpus(study, os.path.join(out, "gpus.png"))
    changes = "\n".join(
        f"- {change_label(p)} (trial {p['trials'][0]} → {p['trials'][1]}): "
        f"steady speed {p['steady'] - 1:+.1%}, score {p['score'] - 1:+.1%}"
        for p in effects["pairs"]
    )
    sections = [
        f"# Study `{study.study_name}`",
        _header(study),
        "**" + format_best(summary["best"]) + "**" if summary["best"] else "No trial ran cleanly yet.",
        f"Written by `autocompile report --study {study.study_name}`; "
        "the same trials as an SQL table: `results.db` beside the study.",
        "## The score of each trial",
        "![score of each trial](scores.png)",
        "Each trial in the order it ran: baselines, recipes, neighbours (of the incumbent or the fastest trial) "
        "and sampled trials, the finalist round. A failed trial "
        "scores 0; a pruned one is drawn hollow at the best score it could still have reached when it was stopped.",
        "## Steady speed against warm-up",
        "![steady speed against warm-up](pareto.png)",
        "Every trial that ran. A short run favours the left of the front (short warm-up), a long one its top "
        "(steady speed); each grey line joins the points that score the same as the winner at its horizon.",
        "```text\n" + format_front(study, _horizon(study)) + "\n```" if pareto["ran"] else "",
        "## What each dimension did",
        "![effect of each dimension](effects.png)",
        changes or "No two measured configurations are one change apart.",
        "## Where each trial's time went",
        "![timeline of each trial](timeline.png)",
        "From each trial's `events.jsonl`: building the model, compiling and warming up (cold caches), measuring.",
        "## Each GPU's trials" if lanes else "",
        "![each GPU's trials over the search](gpus.png)" if lanes else "",
        (
            f"Each GPU's (or worker's) trials over the search's time, a trial's number on its bar: where a GPU idled. "
            f"{lanes['share']:.3f} of the GPUs' time ran a trial (from the first trial's start to the last one's end)."
        )
        if lanes
        else "",
        "## All trials",
        "```text\n" + format_summary(summary) + "\n```",
    ]
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n\n".join(s for s in sections if s) + "\n")
    return path
