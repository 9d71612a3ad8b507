"""Why a configuration is not run: every check the search makes before it runs one, as gates asked
in one order (GATES), each refusal ending one way (its Outcome).

A gate answers one question, `why_not(config, view)`: a Refusal (its reason, and what it makes of the
trial that asked) or None. A caller asks the gates whose outcomes its moment allows (`why_not` below):
at a claim, whether the configuration was tried, cannot work or cannot win; before a claimed trial
starts, whether it fits what is left before the finalist round, and whether any trial still does
(`too_little_left`); where plain torch.compile was left to run last, whether it still fits
(`plain_not_started`); in the round's plan, whether a finalist's rerun fits a rerun's limit; choosing
a neighbour, whether the space's rules refuse it (`rules_refusal`). What a check knows stays where it is kept: the space's rules
(`space.rules`), the knowledge store's failures and compile cuts (`engine.knowledge`), the cost
model (`engine.cost`); the gate asks it. The runner tells the study each outcome (`Runner.refuse`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import optuna

from autocompile.engine.contained import contained
from autocompile.engine.cost import MIN_TRIAL_S, Predictor, rerun_estimate_s, too_slow, twin_time
from autocompile.engine.knowledge.peaks import MARGIN as PEAK_MARGIN
from autocompile.engine.learned import measured_as
from autocompile.engine.records import Record
from autocompile.engine.scoring import _judged_by_an_older_guard, best_score
from autocompile.engine.studyview import view_of
from autocompile.space import DEFAULTS
from autocompile.trial.result import Status

if TYPE_CHECKING:
    from autocompile.engine.knowledge import CompileCuts, Failures, Peaks
    from autocompile.space import SearchSpace


class Outcome(enum.Enum):
    """What a refusal makes of the trial that asked, as the runner tells it (`Runner.refuse`)."""

    DUPLICATE = enum.auto()  # failed as a duplicate, not run: TPE and the budget ignore it
    INFEASIBLE = enum.auto()  # infeasible, rejected before launch: it cannot work here, or not within the limit
    PRUNED = enum.auto()  # pruned before launch: it cannot win
    NOT_STARTED = enum.auto()  # failed, not started: it says nothing of the configuration (tried again on resume)
    NOT_RERUN = enum.auto()  # a finalist not measured again in the round: no trial is told


@dataclass(frozen=True)
class Refusal:
    """Why a configuration is not run (`reason`, the text its record and the search's line show),
    what that makes of its trial (`outcome`), which gate said so, and what the gate knew that the
    trial's record keeps (`attrs`)."""

    reason: str
    outcome: Outcome
    gate: str
    attrs: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class View:
    """What the gates see of a search when they are asked: its study, what the search brings to it,
    and what the asker says of the configuration. A gate whose input is missing (None) refuses nothing."""

    study: optuna.Study
    trial_limit_s: float | None = None  # --trial-timeout
    space: SearchSpace | None = None
    failures: Failures | None = None
    cuts: CompileCuts | None = None
    predictor: Callable[[], Predictor] | None = None  # the study's warm-up predictor, built when asked
    horizon: int | None = None  # the score's horizon where --prune is on (else nothing is pruned before launch)
    params: dict | None = None  # the configuration's Optuna parameters (a queued trial's are compared)
    exclude: int | None = None  # the asking trial's number: it does not count as trying its own configuration
    before_round_s: float | None = None  # what is left of --timeout before the finalist round; None: no bound
    first: optuna.trial.FrozenTrial | None = None  # the finalist a rerun would measure again
    peaks: Peaks | None = None
    max_memory_gb: float | str | None = None  # --max-memory-gb as given (a number, or "eager")


@dataclass(frozen=True)
class Gate:
    """One reason not to run a configuration: `check(config, view)` says why, or None; a refusal of it
    ends as `outcome`."""

    name: str
    outcome: Outcome
    check: Callable[[dict, View], str | tuple[str, dict] | None]  # a reason, or a reason and what the record keeps

    def why_not(self, config: dict, view: View) -> Refusal | None:
        said = contained(f"the gate '{self.name}'", view.study, None, self.check, config, view)
        if not said:
            return None
        reason, attrs = said if isinstance(said, tuple) else (said, {})
        return Refusal(reason, self.outcome, self.name, tuple(attrs.items()))


def ran_its_course(record: Record, limit_s: float) -> bool:
    """Whether a finished trial's result stands: anything but a timeout, or a timeout that had
    (nearly) the whole of `limit_s` (one cut short sooner may be measured again)."""
    return record.status != Status.TIMEOUT or (record.wall_s or 0) >= 0.9 * limit_s


def already_tried(study, config: dict, params: dict, trial_timeout_s: float, exclude: int | None = None) -> bool:
    """Whether a configuration was measured already (or pruned), or is queued or running (claimed by
    a worker): a trial cut short by a search's time bound (not by the trial limit) does not count.
    A configuration asking for a hard mark_dynamic the study saw refused counts as what it would
    measure ("maybe": learned.measured_as), where a trial measured that already."""
    measured = (config, measured_as(study, config))
    for t in study.trials:
        if t.number == exclude:
            continue
        if t.state == optuna.trial.TrialState.WAITING:
            if t.system_attrs.get("fixed_params") == params:
                return True
            continue
        record = Record.of(t)
        if {**DEFAULTS, **(record.config or {})} not in measured:
            continue
        if t.state == optuna.trial.TrialState.RUNNING:
            return record.config is not None  # claimed by a worker
        if _judged_by_an_older_guard(record):
            continue  # made infeasible by a numerics rule since replaced: measured again
        if t.state == optuna.trial.TrialState.PRUNED:
            return True  # it could not win when it ran
        if t.state == optuna.trial.TrialState.COMPLETE and ran_its_course(record, trial_timeout_s):
            return True
    return False


def _tried(config: dict, view: View) -> str | None:
    """It was measured, or is queued or claimed: `already_tried`."""
    tried = already_tried(view.study, config, view.params, view.trial_limit_s, exclude=view.exclude)
    return "measured, queued or claimed already" if tried else None


def _rejected(config: dict, view: View) -> str | None:
    """It cannot work here or means nothing, or it is doomed here: `rules_refusal`."""
    return rules_refusal(config, view.space) if view.space is not None else None


def rules_refusal(config: dict, space: SearchSpace) -> str | None:
    """The rules gate's answer from the space alone (`rules.rejection`, `rules.doomed` within): what a caller
    that holds the space but no search asks (the strategy, choosing a neighbour), or None."""
    return space.rejection(config)


def _failed_before(config: dict, view: View) -> str | None:
    """It holds a value or pair that failed twice the same way here: the knowledge store's `Failures.reason`."""
    return view.failures.reason(config) if view.failures is not None else None


def _too_slow(config: dict, view: View) -> str | None:
    """This study's trials say it will not warm up within the trial limit: `cost.too_slow` (a trial whose
    time a rule explains is no evidence)."""
    if view.space is None:
        return None
    return too_slow(view.study, config, view.trial_limit_s, view.space.rejection)


def _cut_before(config: dict, view: View) -> str | None:
    """The device's other studies of this model say it will not: the knowledge store's `CompileCuts.reason`."""
    return view.cuts.reason(config, view.trial_limit_s) if view.cuts is not None else None


def over_memory_before(config: dict, view: View) -> tuple[str, dict] | None:
    """It peaked above this search's memory limit in the device's other studies of this workload, at least
    TIMES times (the knowledge store's `Peaks.floor`, with its MARGIN): why, and the known peak and how far
    it is over, which the record keeps so that the configuration is moved down the activation-budget ladder
    as one measured over the limit would be (`strategy.fitting_move`)."""
    if view.peaks is None or view.max_memory_gb is None:
        return None
    known = view.peaks.floor(config, view.study.study_name)
    limit = view_of(view.study).memory_limit(view.max_memory_gb) if known else None  # "eager": its measured peak
    if not limit or known["peak_gb"] <= limit * (1 + PEAK_MARGIN):
        return None
    reason = (
        f"over the memory limit before it runs: it peaked at {known['peak_gb']:.2f} GB or more in {known['of']} "
        f"runs here ({known['by']}), above --max-memory-gb {limit:g}"
    )
    return reason, {"known_peak_mem_gb": known["peak_gb"], "over_memory_gb": known["peak_gb"] - limit}


# A lower bound rules a configuration out only at this share of itself: graph compile times of one
# configuration vary between runs.
SAFETY = 0.8


def ruled_out(config: dict, view: View) -> str | None:
    """Why `config` cannot win before it runs (its model graphs' cold compile, `cost.Predictor`, caps its
    score at the horizon below the best so far), or None."""
    if view.horizon is None:
        return None
    floor, best, horizon = view.predictor().model_floor(config), best_score(view.study), view.horizon
    if not config.get("compile") or floor is None or not best:
        return None
    bound = horizon / (SAFETY * floor)
    if bound >= best:
        return None
    return (
        f"predicted: its model graphs took {floor:.0f} s to compile cold in this study, so its score at "
        f"horizon {horizon} is at most {bound:.3g} (with {1 - SAFETY:.0%} margin), below the best so far "
        f"({best:.3g})"
    )


def out_of_time(config: dict, view: View) -> str | None:
    """Why `config` is not expected to finish in what is left before the finalist round (its twins
    measured so far took longer: `cost.twin_time`), or None. Like a trial cut by --timeout, it says
    nothing of the configuration, and a resumed search may propose it again."""
    left = view.before_round_s
    need, twins = twin_time(view.study, config)
    if left is None or need is None or left >= need:
        return None
    which = f"trial{'s' if len(twins) > 1 else ''} {', '.join(map(str, twins))}"
    return (
        f"its twin{'s' if len(twins) > 1 else ''} ({which}) took {need:.0f} s, and "
        f"{max(left, 0):.0f} s are left before the finalist round"
    )


def too_little_left(left_s: float, need_s: float = MIN_TRIAL_S) -> str | None:
    """Why no trial is started with `left_s` left of --timeout (before the finalist round, or at all): less
    than the next is expected to take (`need_s`: a typical trial's, `cost.expected_trial_s`; at the least
    MIN_TRIAL_S), or None: one is."""
    if left_s >= need_s:
        return None
    return f"a trial is expected to take {need_s:.0f} s"


def plain_not_started(left_s: float, seen: dict | None, blocks_trial_s: float | None = None) -> Refusal | None:
    """Why plain torch.compile, left to run last, is not started with `left_s` before the finalist round:
    less than MIN_TRIAL_S left, or less than its whole-model compile took on this model here before it was
    cut (`seen`: the knowledge store's `plain`), or, where it runs last for the model's many blocks and was
    not seen here, less than a typical trial of this study took (`blocks_trial_s`): a whole-model compile
    takes longer than one that compiles a block once; None: it runs."""
    need = MIN_TRIAL_S if seen else max(MIN_TRIAL_S, blocks_trial_s or 0.0)
    if left_s >= need and not (seen and seen["cut"] and seen["seconds"] >= left_s):
        return None
    before = ""
    if seen:
        before = f"; it was cut while compiling after {seen['seconds']:.0f} s before ({seen['from']})"
    elif need > MIN_TRIAL_S:
        before = f"; a trial of this study takes {need:.0f} s, and its whole-model compile is longer"
    return Refusal(f"plain torch.compile: {left_s:.0f} s left before the finalist round{before}", Outcome.NOT_STARTED, "plain")


# A rerun's warm estimate rests on one measured share (cost.WARM_SHARE): a finalist is measured again
# only where that estimate leaves this much of the trial limit to spare.
RERUN_HEADROOM = 0.8


def too_long(trial, limit_s: float | None) -> str | None:
    """Why a trial's rerun, warm (cost.rerun_estimate_s), is expected to take longer than a rerun may
    (RERUN_HEADROOM of the trial limit), or None: plain torch.compile, measured under the longer baseline
    limit, would take the search's time for a rerun cut at the trial limit. The first run's own time is
    not the bound: a leader that warmed up long cold reruns warm well within the limit."""
    if limit_s is None or rerun_estimate_s(trial) <= RERUN_HEADROOM * limit_s:
        return None
    return (
        f"its run took {Record.of(trial).wall_s or 0:.0f} s, a warm rerun about "
        f"{rerun_estimate_s(trial):.0f} s, more than {RERUN_HEADROOM:.0%} of the {limit_s:.0f} s trial limit a "
        f"rerun has"
    )


def _not_rerun(config: dict, view: View) -> str | None:
    """The finalist `view.first`, measured again, would not fit a rerun's limit: `too_long`."""
    return too_long(view.first, view.trial_limit_s) if view.first is not None else None


# Every gate, in the order they are asked: the first refusal among those a caller asks for stands.
GATES: tuple[Gate, ...] = (
    Gate("already tried", Outcome.DUPLICATE, _tried),
    Gate("rules", Outcome.INFEASIBLE, _rejected),  # rules.rejection, rules.doomed its last rule
    Gate("failed before", Outcome.INFEASIBLE, _failed_before),
    Gate("too slow", Outcome.INFEASIBLE, _too_slow),
    Gate("cut before", Outcome.INFEASIBLE, _cut_before),
    Gate("over memory before", Outcome.INFEASIBLE, over_memory_before),
    Gate("ruled out", Outcome.PRUNED, ruled_out),
    Gate("out of time", Outcome.NOT_STARTED, out_of_time),
    Gate("too long", Outcome.NOT_RERUN, _not_rerun),
)


def why_not(config: dict, view: View, *outcomes: Outcome) -> Refusal | None:
    """The first refusal, in GATES' order, of the gates that end in one of `outcomes`; None: run it."""
    for gate in GATES:
        if gate.outcome in outcomes:
            refusal = gate.why_not(config, view)
            if refusal is not None:
                return refusal
    return None
