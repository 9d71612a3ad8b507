"""The Pareto choice: steady speed against cold warm-up, and the winner for any horizon.

A configuration's score depends on the horizon H (the training steps its warm-up is amortised
over: see `autocompile.engine.scoring.score`). Every configuration that ran is a point (warm-up s,
steady steps/s); the front holds those no other one beats on both. Its winner for another H is
found from those measurements, without running anything again: a configuration measured
more than once (a finalist) counts with the mean of its measurements.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from autocompile.engine.records import Role
from autocompile.engine.studyview import StudyView, view_of
from autocompile.trial.result import Status

FIGURES = ("warmup_s", "warmup_steps", "steps_per_s", "recompiles_after_warmup", "peak_mem_gb")
# Horizons at which `front_ranges` looks for each point's winning range: 10 to 10 million steps.
HORIZON_GRID = [round(10 ** (1 + i / 20)) for i in range(121)]


@dataclass
class Point:
    """One configuration that ran: its first trial, every trial that measured it, the mean figures."""

    trial: object  # the first FrozenTrial that measured it (its number and snippet name the winner)
    trials: list = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    @property
    def number(self) -> int:
        return self.trial.number

    def score(self, horizon: int) -> float:
        from autocompile.engine.scoring import score

        return score({"status": Status.OK, **self.figures}, horizon)


def measured_points(study, max_memory_gb: float | None = None, view: StudyView | None = None) -> list[Point]:
    """Each configuration that ran cleanly (eager included), first trial first. Under a memory limit:
    those whose peak is within it, a trial made infeasible by a search's own limit alone included
    (it trained as eager does, and was measured)."""

    def ran(t) -> bool:
        a = t.user_attrs
        return a.get("status") == Status.OK or (max_memory_gb is not None and _over_the_search_limit_alone(a))

    points = []
    for trials in view_of(study, view).measurements(ran):
        figures = {k: statistics.mean(t.user_attrs.get(k) or 0 for t in trials) for k in FIGURES}
        figures["peak_mem_gb"] = max(t.user_attrs.get("peak_mem_gb") or 0 for t in trials)  # the worst run's
        points.append(Point(trial=trials[0], trials=trials, figures=figures))
    if max_memory_gb is not None:
        points = [p for p in points if p.figures["peak_mem_gb"] <= max_memory_gb]
    return sorted(points, key=lambda p: p.number)


def _over_the_search_limit_alone(attrs: dict) -> bool:
    """A trial the search's --max-memory-gb made infeasible, and nothing else did (its numerics held)."""
    return (
        attrs.get("status") == Status.INFEASIBLE
        and bool(attrs.get("over_memory_gb"))
        and attrs.get("reason", "").startswith("peak memory")
    )


def pareto_front(points: list[Point]) -> list[Point]:
    """The points no other one beats on both warm-up (shorter) and steady speed (higher),
    shortest warm-up first."""

    def at(p):
        return p.figures["warmup_s"], p.figures["steps_per_s"]

    def dominated(p):
        warmup, speed = at(p)
        return any(at(q)[0] <= warmup and at(q)[1] >= speed and at(q) != at(p) for q in points)

    return sorted((p for p in points if not dominated(p)), key=lambda p: p.figures["warmup_s"])


def winner_at(points: list[Point], horizon: int) -> Point | None:
    """The configuration with the best score at `horizon`, from its measurements."""
    return max(points, key=lambda p: p.score(horizon), default=None)


def winning_ranges(points: list[Point]) -> dict[int, tuple[int, int]]:
    """For each point that wins somewhere on HORIZON_GRID: (first, last) horizon where it does."""
    ranges: dict[int, tuple[int, int]] = {}
    for horizon in HORIZON_GRID:
        best = winner_at(points, horizon)
        first, _ = ranges.get(best.number, (horizon, horizon))
        ranges[best.number] = (first, horizon)
    return ranges


def best_trial_for(study, horizon: int, max_memory_gb: float | None = None, view: StudyView | None = None):
    """The first trial of the configuration with the best score at `horizon`, by its measurements;
    under a memory limit, of those whose peak memory is within it."""
    points = measured_points(study, max_memory_gb, view)
    best = winner_at(points, horizon)
    return best.trial if best else None


def memory_front(points: list[Point]) -> list[Point]:
    """The points no other one beats on both peak memory (lower) and steady speed (higher), least memory first."""

    def at(p):
        return p.figures["peak_mem_gb"], p.figures["steps_per_s"]

    return sorted(
        (p for p in points if not any(at(q)[0] <= at(p)[0] and at(q)[1] >= at(p)[1] and at(q) != at(p) for q in points)),
        key=lambda p: p.figures["peak_mem_gb"],
    )


def searched_memory(study) -> bool:
    """Whether the study's configurations moved memory: the model's checkpointing or the budget."""
    return any(
        (t.user_attrs.get("config") or {}).get("activation_checkpointing", "as_built") != "as_built"
        or (t.user_attrs.get("config") or {}).get("activation_memory_budget") is not None
        for t in study.trials
    )


def _steps(horizon: int) -> str:
    return f"{horizon:,}".replace(",", " ")


def format_front(study, horizon: int) -> str:
    """The front as a table: each point's figures, its score at `horizon`, the horizons where it
    wins (on HORIZON_GRID), and a * on the winner at `horizon`."""
    from autocompile.apply import describe_config

    points = measured_points(study)
    front, ranges, best = pareto_front(points), winning_ranges(points), winner_at(points, horizon)
    lines = [
        f"Pareto front of steady throughput against cold warm-up ({len(front)} of {len(points)} measured "
        f"configurations); scores at {_steps(horizon)} steps:",
        f"  {'trial':>6}  {'role':<16}  {'warm-up s':>9}  {'steps/s':>8}  {'runs':>4}  {'score':>7}  {'wins for':<26}  config",
    ]
    for p in front:
        first, last = ranges.get(p.number, (None, None))
        wins = "-" if first is None else f"{_steps(first)} to {_steps(last)} steps"
        lines.append(
            f"{'*' if p is best else ' '} {p.number:>6}  {p.trial.user_attrs.get('role', ''):<16}  "
            f"{p.figures['warmup_s']:>9.1f}  {p.figures['steps_per_s']:>8.3g}  {len(p.trials):>4}  "
            f"{p.score(horizon):>7.3g}  {wins:<26}  {describe_config(p.trial.user_attrs['config'])}"
        )
    lines.append(f"* the winner at {_steps(horizon)} steps by these measurements (`best --horizon H` for another)")
    return "\n".join(lines)


def format_memory_front(study, horizon: int, max_memory_gb: float | None = None) -> str:
    """The front of steady throughput against peak memory, each point's peak beside eager's, and a *
    on the winner at `horizon` (within `max_memory_gb`, where given)."""
    from autocompile.apply import describe_config

    # over a search's own limit alone, a configuration is still a point of this front
    points = measured_points(study, float("inf") if max_memory_gb is None else max_memory_gb)
    front, best = memory_front(points), winner_at(points, horizon)
    eager = next(
        (
            p.figures["peak_mem_gb"]
            for p in measured_points(study)
            if not p.trial.user_attrs["config"]["compile"] and p.trial.user_attrs.get("role") == Role.EAGER
        ),
        None,
    )
    within = f" within {max_memory_gb:g} GB" if max_memory_gb is not None else ""
    lines = [
        f"Pareto front of steady throughput against peak memory ({len(front)} of {len(points)} measured "
        f"configurations{within}; eager as built peaked at " + (f"{eager:.2f} GB" if eager else "-") + "):",
        f"  {'trial':>6}  {'role':<16}  {'peak GB':>8}  {'vs eager':>8}  {'steps/s':>8}  {'score':>7}  config",
    ]
    for p in front:
        ratio = f"{p.figures['peak_mem_gb'] / eager:.2f}x" if eager else "-"
        lines.append(
            f"{'*' if p is best else ' '} {p.number:>6}  {p.trial.user_attrs.get('role', ''):<16}  "
            f"{p.figures['peak_mem_gb']:>8.2f}  {ratio:>8}  {p.figures['steps_per_s']:>8.3g}  "
            f"{p.score(horizon):>7.3g}  {describe_config(p.trial.user_attrs['config'])}"
        )
    lines.append(f"* the winner at {_steps(horizon)} steps{within} (`best --max-memory-gb X` for its snippet)")
    return "\n".join(lines)
