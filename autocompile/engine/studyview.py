"""The study's trials read once: what the engine and the outputs ask of them (the baselines, the
search's points, incumbent and candidates, the winner, each configuration's measurements), each
answer worked out once from one reading of the study.

A `StudyView` is the study at the moment it was built (one `get_trials`): it does not follow the
study, so a reader is handed one built after the last tell, asks it what it needs, and passes it on.
`view_of(study)` is the one place that builds it; the search's runner reads one through it where a
moment of its turn asks (`Runner.look`). The functions beside it (`best_trial(study)`, ...) are its
answers for a reader that asks one question. Not to be confused with `gates.View`, what a gate sees of a search when it is asked.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cached_property

import optuna

from autocompile.engine.records import Record, Role, full_record
from autocompile.trial.result import STOPPED, Status

COMPLETE = optuna.trial.TrialState.COMPLETE
EAGER_PEAK = "eager"  # --max-memory-gb eager: no more memory than eager as the workload built it


def ran_cleanly(trial) -> bool:
    return Record.of(trial).status == Status.OK


def compiled(trial) -> bool:
    return bool((Record.of(trial).config or {}).get("compile"))


@dataclass(frozen=True)
class Baselines:
    """What a summary reads of the baselines, gathered at once (`StudyView.baselines`): eager's and plain
    torch.compile's steady speeds and eager's peak (`StudyView.baseline_value`), plain torch.compile's
    clean trial, eager's first trial however it ended, each baseline measured over the memory limit
    alone (no clean run: its role and trial), and plain torch.compile's warm-ups stopped unfinished."""

    eager_sps: float | None
    default_sps: float | None
    eager_peak: float | None
    default: optuna.trial.FrozenTrial | None
    eager_first: optuna.trial.FrozenTrial | None
    over_memory: tuple[tuple[Role, optuna.trial.FrozenTrial], ...]
    default_warmups: tuple[float, ...]  # seconds warming up, each attempt stopped before it finished


class StudyView:
    """A study's trials at one moment, and what is asked of them, each answered once."""

    def __init__(self, study):
        self.study = study
        self.trials = study.get_trials(deepcopy=False)  # by number
        self._answers: dict = {}  # an answer that takes an argument, by its question

    def _once(self, question: tuple, answer):
        if question not in self._answers:
            self._answers[question] = answer()
        return self._answers[question]

    @cached_property
    def records(self) -> list[Record]:
        """Each trial's record, by number."""
        return [Record.of(t) for t in self.trials]

    @cached_property
    def finished(self) -> list:
        return [t for t in self.trials if t.state.is_finished()]

    @cached_property
    def complete(self) -> list:
        return [t for t in self.trials if t.state == COMPLETE]

    @cached_property
    def running(self) -> list:
        return [t for t in self.trials if t.state == optuna.trial.TrialState.RUNNING]

    # -- the baselines -------------------------------------------------------------------------

    def first_of(self, role: Role, *statuses: Status):
        """The first trial of `role` that ended in one of `statuses` (however it ended, without any)."""
        return self._once(
            ("first", role, statuses),
            lambda: next(
                (t for t, r in zip(self.trials, self.records) if r.role == role and (not statuses or r.status in statuses)),
                None,
            ),
        )

    def baseline_trial(self, role: Role):
        """The first trial of a baseline role (eager, plain torch.compile) that ran cleanly."""
        return self.first_of(role, Status.OK)

    def over_memory_baseline(self, role: Role):
        """The first trial of a baseline role that ran and measured, infeasible only for its memory: its
        speed is still the reference the ratios need."""
        return self._once(
            ("over", role),
            lambda: next(
                (
                    t
                    for t, r in zip(self.trials, self.records)
                    if r.role == role and r.over_memory_gb and r.steps_per_s and not (r.numerics or {}).get("differs")
                ),
                None,
            ),
        )

    def measured_baseline(self, role: Role):
        """A baseline's trial that measured it: its clean run, else its run over --max-memory-gb only."""
        return self.baseline_trial(role) or self.over_memory_baseline(role)

    def baseline_value(self, role: Role, key: str):
        """A baseline's measurement `key` (a field of its `Record`), from `measured_baseline`."""
        trial = self.measured_baseline(role)
        return getattr(self.records[trial.number], key) if trial else None

    @cached_property
    def baselines(self) -> Baselines:
        """The baselines as a summary reads them, in one answer."""
        return Baselines(
            eager_sps=self.baseline_value(Role.EAGER, "steps_per_s"),
            default_sps=self.baseline_value(Role.COMPILE_DEFAULTS, "steps_per_s"),
            eager_peak=self.baseline_value(Role.EAGER, "peak_mem_gb"),  # eager as the workload built it
            default=self.baseline_trial(Role.COMPILE_DEFAULTS),
            eager_first=self.first_of(Role.EAGER),
            over_memory=tuple(
                (role, t)
                for role in (Role.EAGER, Role.COMPILE_DEFAULTS)
                if not self.baseline_trial(role) and (t := self.over_memory_baseline(role))
            ),
            default_warmups=tuple(
                t.user_attrs["warmup_elapsed_s"]
                for t in self.trials
                if t.user_attrs.get("role") == Role.COMPILE_DEFAULTS
                and t.user_attrs.get("status") in STOPPED
                and t.user_attrs.get("warmup_elapsed_s")
            ),
        )

    def eager_record(self, study_dir: str | None = None) -> dict | None:
        """The eager baseline's record: its user attributes, whole from its result.json with `study_dir`."""
        eager = self.baseline_trial(Role.EAGER)
        return full_record(eager, study_dir) if eager else None

    def memory_limit(self, max_memory_gb) -> float | None:
        """The search's memory limit in GB: --max-memory-gb's number, or with "eager", the eager baseline's
        peak as the workload built it (None until eager has run)."""
        if max_memory_gb == EAGER_PEAK:
            return self.baseline_value(Role.EAGER, "peak_mem_gb")
        return max_memory_gb

    # -- the search's points -------------------------------------------------------------------

    @cached_property
    def points(self) -> list:
        """The completed trials at a point of the search space: compiled, with the sampler's parameters
        or plain torch.compile (every dimension at its default)."""
        return [t for t in self.complete if compiled(t) and (t.params or self.records[t.number].role == Role.COMPILE_DEFAULTS)]

    @cached_property
    def searched(self) -> list:
        """`points` less the finalist reruns (one of an older study may hold a queued recipe's parameters)."""
        return [t for t in self.points if self.records[t.number].role != Role.FINALIST]

    def search_candidates(self, compiled_only: bool = True) -> list:
        """Trials of distinct compiled configurations (eager too, unless `compiled_only`) that ran
        cleanly, finalist reruns not, best score first."""
        return self._once(
            ("candidates", compiled_only),
            lambda: _distinct(
                sorted(
                    (
                        t
                        for t in self.complete
                        if t.value
                        and ran_cleanly(t)
                        and self.records[t.number].role != Role.FINALIST
                        and (compiled(t) or not compiled_only)
                    ),
                    key=lambda t: t.value,
                    reverse=True,
                ),
                self.records,
            ),
        )

    def measurements(self, counts=ran_cleanly) -> list[list]:
        """Each configuration's measurements: its completed trials with a steady speed that `counts`
        (default: those that ran cleanly), first first, configurations in the order first measured."""
        groups: dict[str, list] = {}
        for t in self.complete:
            record = self.records[t.number]
            if counts(t) and record.steps_per_s and record.config is not None:
                groups.setdefault(json.dumps(record.config, sort_keys=True), []).append(t)
        return list(groups.values())

    @cached_property
    def mean_scores(self) -> dict[int, float]:
        """Each trial that ran cleanly: the mean of its score and those of its finalist reruns."""
        scores = {t.number: [t.value] for t in self.complete if t.value and ran_cleanly(t)}
        for t in self.complete:
            first = self.records[t.number].remeasure_of
            if first in scores and t.number in scores:
                scores[first].append(t.value)
        return {number: statistics.mean(values) for number, values in scores.items()}

    @cached_property
    def incumbent(self):
        """The best trial at a point of the search (`points`) that ran cleanly, by its mean score with its
        finalist reruns (`mean_scores`): a recipe, neighbour or TPE trial, or plain torch.compile; None."""
        ranked = [t for t in self.points if t.value and ran_cleanly(t)]
        return max(ranked, key=lambda t: self.mean_scores[t.number], default=None)

    # -- the finalists and the winner ----------------------------------------------------------

    @cached_property
    def verdict(self) -> dict:
        """The finalist round's stored verdict ({} before the round)."""
        return self.study.user_attrs.get("finalists") or {}

    @cached_property
    def best_trial(self):
        """The winner: the finalist round's choice while its finalists are still the top ones,
        else the highest-scoring trial that ran cleanly (Optuna's best_trial ignores our status)."""
        candidates, verdict = self.search_candidates(), self.verdict
        if verdict.get("winner") is not None and verdict["finalists"] == [
            t.number for t in candidates[: len(verdict["finalists"])]
        ]:
            return self.trials[verdict["winner"]]
        eager = self.baseline_trial(Role.EAGER)
        return max(candidates + ([eager] if eager else []), key=lambda t: t.value, default=None)


def _distinct(ranked: list, records: list[Record]) -> list:
    """The first trial of each configuration in `ranked`, in its order (`records`: the study's, by number)."""
    seen, out = [], []
    for t in ranked:
        if records[t.number].config not in seen:
            seen.append(records[t.number].config)
            out.append(t)
    return out


def view_of(study, view: StudyView | None = None) -> StudyView:
    """`view`, where the caller was handed one; else `study` as it stands now."""
    return view if view is not None else StudyView(study)


# -- one question of a study -------------------------------------------------------------------


def baseline_value(study, role: Role, key: str):
    return view_of(study).baseline_value(role, key)


def eager_record(study, study_dir: str | None = None) -> dict | None:
    return view_of(study).eager_record(study_dir)


def search_candidates(study, compiled_only: bool = True) -> list:
    return view_of(study).search_candidates(compiled_only)


def best_trial(study):
    return view_of(study).best_trial
