"""One trial at a time against the study: launch it in its own process, prune, triage, judge,
tell the study, and the progress a search shows while it does.

The runner keeps the search's deadline (--timeout) and the callbacks (Optuna's signature,
callback(study, frozen_trial)) that outputs such as the results table hang on each finished trial.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import optuna

from autocompile.apply import describe_config
from autocompile.engine import horizon
from autocompile.engine.records import (
    BASELINES,
    FullRecord,
    Record,
    Role,
    carried,
    full_record,
    plain,
    save_record,
    set_attrs,
    snippet_header,
    speedup,
    to_attrs,
    trial_folder,
)
from autocompile.engine.studyview import StudyView, view_of
from autocompile.engine.cost import Predictor
from autocompile.engine.knowledge.gains import batch_layout
from autocompile.engine.knowledge.paces import MARGIN as PACE_MARGIN
from autocompile.engine.gates import Outcome, Refusal, View, too_little_left, why_not
from autocompile.engine.learned import mark_refused_in, rng_dependent
from autocompile.engine.scoring import (
    RECOMPILE_PENALTY,
    compiles_after_warmup,
    penalised_compiles,
    recording_s,
    judge,
    numerics_tolerance,
    optimistic_score,
    score,
    violation,
)
from autocompile.engine.storage import fail_stale, heartbeat_s, this_worker
from autocompile.trial import TrialRequest, caches, divergence, run_trial, triage
from autocompile.trial.protocol import STOP_S
from autocompile.trial.result import Status

if TYPE_CHECKING:
    from autocompile.engine.knowledge import CompileCuts, Failures, MoveGains, Paces, Peaks, PlainCompiles
    from autocompile.engine.settings import SearchSettings
    from autocompile.space import SearchSpace


class Progress:
    """The search's progress on stderr. On a terminal, one live status line (trial n of N, its
    phase, its warm-up step or measured window, the best so far) above which each result is
    printed; elsewhere (a log file, a pipe) one plain line when a trial changes phase."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.done = total, stream or sys.stderr, 0
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.best = ""  # "best: trial N 1.2x eager", kept by the runner

    def line(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K")  # the status line gives way to the result
        print(text, file=self.stream, flush=True)

    def phase(self, number: int, label: str, event: dict) -> None:
        phase = event.get("phase")
        head = f"[{self.done + 1}/{self.total}] trial {number} {label}: {phase}"
        if self.live:
            detail = (
                f" step {event['step']}"
                if "step" in event
                else f" window {event['window']} at {event['steps_per_s']:.3g} steps/s"
                if "window" in event
                else f", {event['compiled']} compiles finished"
                if "compiled" in event
                else ""
            )
            status = head + detail + (f"  | {self.best}" if self.best else "")
            columns = shutil.get_terminal_size((120, 20)).columns
            self.stream.write("\r\x1b[2K" + status[: columns - 1])
            self.stream.flush()
        elif phase in ("building", "compiling", "warming up", "measuring") and not {"step", "window", "compiled"} & set(event):
            self.line("  " + head)


def _header(settings: SearchSettings, number: int) -> str:
    return snippet_header(settings.model, settings.study, number)


@dataclass(frozen=True)
class Known:
    """What the knowledge store knows of this model here (engine/knowledge), each part None without the store."""

    failures: Failures | None = None  # values that failed twice the same way
    cuts: CompileCuts | None = None  # values cut twice while compiling
    gains: MoveGains | None = None  # how far a neighbour has gone past its parent
    paces: Paces | None = None  # how fast a configuration has run on this workload
    peaks: Peaks | None = None  # how much memory a configuration took on this workload
    plain: PlainCompiles | None = None  # what plain torch.compile's whole-model compile took on this model here


@dataclass(frozen=True)
class Prepared:
    """A trial made ready by `Runner.prepare`: its request, and what `Runner.finish` tells the study with."""

    trial: object  # optuna.trial.Trial
    request: TrialRequest
    label: str
    prunable: bool
    remaining: float | None  # what was left of --timeout less what is kept, at its start
    limit_s: float
    first: object = None  # the finalist it measures again (optuna.trial.FrozenTrial)
    carries: bool = False  # a rerun: its record carries `first`'s (`records.carried`)
    cold: bool = False  # from empty caches: its warm-up its own


def _stoppable(stop: threading.Event, pruning=None):
    """should_stop for run_trial that raises KeyboardInterrupt once `stop` is set (the trial's process is
    killed on the way out), else asks `pruning`."""

    def should_stop(events: list[dict]) -> str | None:
        if stop.is_set():
            raise KeyboardInterrupt
        return pruning(events) if pruning else None

    return should_stop


def waiting(study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def ask(study):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "heartbeat is meant for optimize()": we beat ourselves
        return study.ask()


def new_trial(study):
    """A trial of its own, not one of the queued proposals that `ask` would hand out first: a
    finalist's rerun took a recipe the search had queued and not reached (with that recipe's
    params), and the recipe was lost to a resumed search."""
    return optuna.trial.Trial(study, study._storage.create_new_trial(study._study_id))


def _penalised(record: dict) -> str:
    """What the compile events after the warm-up cost a score (scoring.score), said where they cost anything:
    the seconds of CUDA graphs recorded for new shapes, paid once as warm-up, and the penalty on recompiles
    (the table's recompiles, Dynamo's, show neither the recordings nor when they came)."""
    after = compiles_after_warmup(record)
    if not after:
        return ""
    recorded = record.get("cudagraph_recordings_after_warmup")
    if recorded is None:  # a record made before the two were told apart
        return f" ({after} compiles after warm-up: -{min(0.5, RECOMPILE_PENALTY * after):.0%})"
    timed = record.get("cudagraph_recording_s_after_warmup") is not None
    recompiled = after - recorded
    parts = [f"{recompiled} recompiles"] * bool(recompiled)
    parts += [f"{recorded} CUDA graphs recorded"] * (bool(recorded) and not timed)
    said = [f"{' and '.join(parts)} after warm-up: -{min(0.5, RECOMPILE_PENALTY * penalised_compiles(record)):.0%}"] * bool(parts)
    if recorded and timed:
        said.append(f"{recorded} CUDA graphs recorded after warm-up in {recording_s(record):.1f} s, paid once as warm-up")
    return f" ({'; '.join(said)})"


class Runner:
    """Runs trials of one search against its study: launch, prune, triage, judge, tell. `known`: the
    knowledge store's parts, by name (`Known`)."""

    def __init__(
        self,
        study,
        storage,
        url: str,
        settings: SearchSettings,
        progress: Progress,
        deadline: float | None,
        callbacks=(),
        *,
        space: SearchSpace | None = None,
        started: float | None = None,
        **known,
    ):
        self.study, self.storage, self.url, self.settings, self.progress = study, storage, url, settings, progress
        self.deadline = deadline
        self.callbacks = callbacks  # Optuna's signature, callback(study, frozen_trial): after each tell
        self.trials_wall = 0.0  # the trials' own time, to show what the harness adds
        self.started = time.time() if started is None else started  # when the search began
        self.space = space  # what is searched, and what it refuses before launch
        self.known = Known(**known)
        self.cut_baselines: set[Role] = set()  # baselines this search cut by its budget (claims._baseline_limit)
        self._predictor: tuple | None = None  # (the finished trials it was built from, Predictor)

    @property
    def gains(self) -> MoveGains | None:
        return self.known.gains

    @property
    def paces(self) -> Paces | None:
        return self.known.paces

    @property
    def plain(self) -> PlainCompiles | None:
        return self.known.plain

    def look(self) -> StudyView:
        """The study's trials as they stand now (engine/studyview.py), for what one moment of a turn asks."""
        return view_of(self.study)

    def view(self, **asked) -> View:
        """What the gates see of this search (engine/gates.py), with what the asker says of the configuration
        (`params`, `exclude`, `before_round_s`)."""
        settings = self.settings
        return View(
            self.study,
            settings.trial_timeout_s,
            self.space,
            self.known.failures,
            self.known.cuts,
            self.predictor,
            horizon.scoring(settings) if settings.prune else None,
            peaks=self.known.peaks,
            max_memory_gb=settings.max_memory_gb,
            **asked,
        )

    def refusal(self, config: dict) -> str | None:
        """Why `config` is not launched, before any process (the gates whose refusal makes it infeasible):
        it cannot work or is doomed here, it failed the same way twice before, or it is expected not to
        warm up in time (from this study's trials, or from the device's other studies of this model)."""
        refusal = why_not(config, self.view(), Outcome.INFEASIBLE)
        return refusal.reason if refusal else None

    def tried(self, config: dict, params: dict) -> bool:
        """Measured, queued or claimed, or refused before launch (see refusal)."""
        return why_not(config, self.view(params=params), Outcome.DUPLICATE, Outcome.INFEASIBLE) is not None

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()

    def out_of_time(self, trial, config: dict, keep_s: float) -> bool:
        """Whether `config` is not expected to finish in what is left of --timeout less `keep_s` (the
        finalist round's: gates.out_of_time); such a trial is not started (`refuse`)."""
        remaining = self.remaining()
        refusal = why_not(
            config, self.view(before_round_s=None if remaining is None else remaining - keep_s), Outcome.NOT_STARTED
        )
        if refusal is None:
            return False
        self.refuse(trial, config, None, refusal)
        return True

    def refuse(self, trial, config: dict, role: Role | None, refusal: Refusal) -> None:
        """Tell the study a trial a gate refused, at no process cost, as its outcome says: a duplicate failed,
        one that cannot work infeasible, one that cannot win pruned, one that does not fit before the
        finalist round failed as not started."""
        if refusal.outcome is Outcome.DUPLICATE:
            set_attrs(trial, {"status": Status.DUPLICATE, "config": config})
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif refusal.outcome is Outcome.INFEASIBLE:
            self._reject(trial, config, role, refusal.reason, dict(refusal.attrs))
        elif refusal.outcome is Outcome.PRUNED:
            self._prune_before_launch(trial, config, role, refusal.reason)
        elif refusal.outcome is Outcome.NOT_STARTED:
            self._not_started(trial, config, refusal.reason)

    def _not_started(self, trial, config: dict, reason: str) -> None:
        """Told failed, not started (like a trial cut by --timeout, it says nothing of the configuration)."""
        reason = "not started: " + reason
        set_attrs(trial, {"status": Status.NOT_STARTED, "reason": reason, "wall_s": 0.0})
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.progress.line(f"trial {trial.number} {describe_config(config)}: {reason}")

    def run(
        self,
        trial,
        config: dict,
        role: Role,
        prunable: bool,
        limit_s: float | None = None,
        keep_s: float = 0.0,
        first=None,
        cold: bool = False,
        measure: dict | None = None,
        gpus: str | None = None,
    ) -> FullRecord:
        """Measure `config` as `trial` within `limit_s` (default: the trial limit) and what is left
        of --timeout less `keep_s` (kept for the finalist round), then tell the study; returns the record.
        A rerun of trial `first` starts from the code `first` compiled, where it kept it (`records.carried`);
        `cold`, from empty caches, its warm-up its own and `first`'s numerics carried.
        `measure`: how it measures, where the search's own settings.measure leaves it unsaid.
        `gpus`: the trial process's GPUs (CUDA_VISIBLE_DEVICES), where not this process's.
        Ctrl-C at any point of it (its launch, or the bookkeeping before it) fails the trial as
        interrupted: none is left running in the study (a 2-worker test on a loaded machine caught
        one between its claim and its launch)."""
        return self.complete(self.prepare(trial, config, role, prunable, limit_s, keep_s, first, cold, measure or {}, gpus))

    def complete(self, prepared: Prepared) -> FullRecord:
        """Launch a prepared trial in this thread and tell the study (`launch`, `finish`); Ctrl-C fails it
        as interrupted."""
        try:
            return self.finish(prepared, self.launch(prepared))
        except KeyboardInterrupt:
            self.abandon(prepared.trial)
            raise

    def prepare(
        self,
        trial,
        config: dict,
        role: Role,
        prunable: bool,
        limit_s: float | None,
        keep_s: float,
        first,
        cold: bool,
        measure: dict,
        gpus: str | None = None,
    ) -> Prepared:
        """Everything of `run` before the trial's process: its attributes in the study, its request.
        Ctrl-C fails the trial as interrupted."""
        try:
            return self._prepare(trial, config, role, prunable, limit_s, keep_s, first, cold, measure, gpus)
        except KeyboardInterrupt:
            self.abandon(trial)
            raise

    def _prepare(
        self,
        trial,
        config: dict,
        role: Role,
        prunable: bool,
        limit_s: float | None,
        keep_s: float,
        first,
        cold: bool,
        measure: dict,
        gpus: str | None,
    ) -> Prepared:
        settings = self.settings
        limit_s = limit_s or settings.trial_timeout_s
        # the config is known even if the search dies during the trial; a dead worker's trial is failed and tried again
        set_attrs(trial, {"role": role, "config": config, "worker": this_worker()})
        label = describe_config(config)
        predicted = self.predictor().predict(config) if first is None else None
        if predicted is not None:
            trial.set_user_attr("predicted_warmup_s", predicted)  # beside the measured one, for the summary
        self.progress.phase(trial.number, label, {"phase": "starting"})
        remaining = None if self.remaining() is None else self.remaining() - keep_s
        warm = None if cold else self._warm_cache(config, first)
        shared = self._shares(config, role, first)
        if shared:
            trial.set_user_attr("compile_cache", "shared")
        request = TrialRequest(
            model=settings.model,
            config=config,
            device=settings.device,
            trial_dir=trial_folder(settings.study_dir, trial.number),
            batch_size=settings.batch_size,
            seq_len=settings.seq_len,
            seed=settings.seed,
            timeout_s=limit_s if remaining is None else max(1.0, min(limit_s, remaining - STOP_S)),
            header=_header(settings, trial.number),
            trace=settings.trace,
            measure={
                **self._learned(config),
                **measure,
                **(settings.measure or {}),
                **({"numerics_replay": False} if warm or cold else {}),
                **({"compile_pool_wait": False} if warm else {}),
            },
            cache_dir=warm or (caches.shared(settings.study_dir) if shared else None),
            keep_cache=bool(config["compile"]) and first is None and role != Role.FINALIST,
            ledger=bool(shared or (warm and Record.of(first).compile_cache == "shared")),
            nproc=settings.nproc,
            parallel=settings.parallel,
            prestart=settings.prestarts(),
            mark_refused_in=mark_refused_in(self.study, config),
            gpus=gpus if settings.device.startswith("cuda") else None,
        )
        return Prepared(trial, request, label, prunable, remaining, limit_s, first, bool(warm or cold), cold)

    def launch(self, prepared: Prepared, stop: threading.Event | None = None) -> FullRecord:
        """The trial's process (and the triage ladder after a compile error): its record. It calls the
        study only for heartbeats (Optuna's storages take them from any thread) and a prunable trial's
        reports (the round's are not), so the finalist round runs it in a thread per GPU; `stop` set,
        it kills the process and raises KeyboardInterrupt."""
        settings, storage, trial = self.settings, self.storage, prepared.trial
        beat = (lambda: storage.record_heartbeat(trial._trial_id)) if hasattr(storage, "record_heartbeat") else None
        pruning = self._pruning(trial) if prepared.prunable and settings.prune else None
        record = run_trial(
            prepared.request,
            on_event=lambda e: self.progress.phase(trial.number, prepared.label, e),
            heartbeat=beat,
            heartbeat_every_s=heartbeat_s() / 2,
            should_stop=pruning if stop is None else _stoppable(stop, pruning),
        )
        if (
            record["status"] == Status.COMPILE_ERROR
            and settings.triage
            and (prepared.remaining is None or too_little_left(self.remaining()) is None)
        ):
            self.progress.line(f"  trial {trial.number}: compile error; rerunning with simpler backends to find the layer")
            record = triage(prepared.request, record, time_left=self.remaining(), heartbeat=beat)
        return record

    def finish(self, prepared: Prepared, record: FullRecord) -> FullRecord:
        """Everything of `run` after the trial's process: its record carried, judged and told, its line said."""
        trial = prepared.trial
        self.trials_wall += record["wall_s"] + sum(rung.get("wall_s", 0) for rung in record.get("triage", []))
        if prepared.carries:
            first = prepared.first
            record = carried(record, full_record(first, self.settings.study_dir), first.number, warm_up=not prepared.cold)
        self._await_eager(trial, prepared.label)
        running = self.storage.get_trial(trial._trial_id).state == optuna.trial.TrialState.RUNNING
        record = self._tell(trial, prepared.request, record, prepared.limit_s, tell=running)
        if not running:  # another worker failed it as stale while it ran
            cut = prepared.request.timeout_s < prepared.limit_s
            trial = self._kept_apart(self.storage.get_trial(trial._trial_id), record, cut)
        self.progress.done += 1
        self._report(trial.number, prepared.label, record)
        self._told(trial)
        return record

    def _await_eager(self, trial, label: str) -> None:
        """Where another worker still measures eager, wait for its record: every judge compares with it
        (its first losses; its peak under --max-memory-gb eager), and the workers do not wait for it before
        they start. The trial's heartbeat goes on; an eager whose worker died is failed as stale."""
        said = False
        while any(Record.of(t).role == Role.EAGER and t.number != trial.number for t in self.look().running):
            if not said:
                self.progress.line(f"  trial {trial.number} {label}: measured; waiting for eager's record to judge it")
                said = True
            if hasattr(self.storage, "record_heartbeat"):
                self.storage.record_heartbeat(trial._trial_id)
            fail_stale(self.study)
            time.sleep(1.0)

    def _learned(self, config: dict) -> dict:
        """What earlier compiled trials of the study found of the model, for a compiled trial's measure:
        whether its loss depends on the random stream (engine/learned.py), which it then does not check."""
        found = rng_dependent(self.study) if config["compile"] else None
        return {"rng_dependent": found} if found else {}

    def _warm_cache(self, config: dict, first) -> str | None:
        """The compile cache a rerun of trial `first` starts from: the study's shared one where `first`
        compiled into it, else the one `first` kept; None for a first run."""
        if first is None or not config["compile"]:
            return None
        if Record.of(first).compile_cache == "shared" and caches.has_shared(self.settings.study_dir):
            return caches.shared(self.settings.study_dir)
        return caches.kept(trial_folder(self.settings.study_dir, first.number))

    def _shares(self, config: dict, role: Role, first) -> bool:
        """Whether a first run compiles into the study's shared cache: with --shared-cache, every
        compiled trial but the baselines (measured cold, the comparison users read) and a finalist's
        cold check."""
        return (
            self.settings.shared_cache and bool(config["compile"]) and first is None and role not in (*BASELINES, Role.FINALIST)
        )

    def _tell(self, trial, request: TrialRequest, record: FullRecord, limit_s: float, tell: bool = True) -> FullRecord:
        """Judge the record, keep it whole in the trial's folder and concise in the study, tell the
        study (not where `tell` is False: its trial failed meanwhile, and `finish` keeps it apart);
        the judged record."""
        settings = self.settings
        view = self.look()
        record = judge(record, view.eager_record(settings.study_dir), settings.device, view.memory_limit(settings.max_memory_gb))
        if record["status"] == Status.INFEASIBLE and record.get("numerics", {}).get("differs") and settings.triage:
            self.progress.line(f"  trial {trial.number}: numerics off; comparing it with eager module by module")
            # as measured: a hard mark_dynamic that fell back is compared as the maybe it ran
            measured = replace(request, config=record.get("config", request.config))
            record = divergence.locate(measured, record, numerics_tolerance(settings.device), time_left=self.remaining())
            self.trials_wall += record.get("divergence", {}).get("wall_s", 0)
        horizon.settle(self, record)  # without --horizon-steps: from the first speed measured (eager's)
        record["score"] = score(record, horizon.scoring(settings))
        save_record(request.trial_dir, record)  # the whole record; the study keeps it concise
        if not tell:
            return record
        set_attrs(trial, to_attrs(record))
        if record["status"] == Status.PRUNED:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif record["status"] == Status.TIMEOUT and request.timeout_s < limit_s:
            # Cut short by the search's own time bound, not by its trial limit: says nothing
            # of the configuration, so it is not told as infeasible (and may be tried again).
            trial.set_user_attr("reason", record["reason"] + "; cut by the search --timeout")
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            trial.set_constraint("failed", violation(record))
            self.study.tell(trial, record["score"])
        return record

    def _kept_apart(self, stale, record: FullRecord, cut_by_search: bool):
        """The result of a trial another worker failed as stale while this worker ran it (its heartbeats came
        late: a host too loaded to beat in time), kept as a trial of its own: a finished trial is never lost.
        The configuration queued again for the stale one is then a duplicate, refused when it is claimed."""
        if record["status"] == Status.PRUNED:
            state, value = optuna.trial.TrialState.PRUNED, None
        elif record["status"] == Status.TIMEOUT and cut_by_search:
            state, value = optuna.trial.TrialState.FAIL, None
        else:
            state, value = optuna.trial.TrialState.COMPLETE, record["score"]
        claimed = {key: item for key, item in Record.of(stale).attrs.items() if key != "reason"}  # not the staleness
        attrs = {**claimed, **to_attrs(record), "kept_from": stale.number}
        self.study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value,
                params=stale.params,
                distributions=stale.distributions,
                user_attrs={key: plain(item) for key, item in attrs.items()},
                constraints={"failed": violation(record)} if value is not None else None,
            )
        )
        kept = next(
            t for t in reversed(self.study.get_trials(deepcopy=False)) if Record.of(t).attrs.get("kept_from") == stale.number
        )
        self.progress.line(
            f"trial {stale.number}: failed as stale by another worker while it ran (its heartbeats came late); "
            f"its result is kept as trial {kept.number}"
        )
        return kept

    def abandon(self, trial) -> None:
        """Ctrl-C during a trial, or between its end and its tell: failed as interrupted (a trial already
        told keeps its result), so no trial is left running in the study."""
        if self.storage.get_trial(trial._trial_id).state != optuna.trial.TrialState.RUNNING:
            return  # told already (its result stands), or abandoned by an inner handler
        set_attrs(trial, {"status": Status.INTERRUPTED, "reason": "interrupted"})
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.progress.line(
            f"interrupted: trial {trial.number} abandoned; finished trials are saved in "
            f"{self.url}; run the same command to resume"
        )

    def predictor(self) -> Predictor:
        """The study's warm-up predictor (it reads every trial's record), built again only when a
        trial has finished since."""
        finished = tuple((t.number, t.state) for t in self.study.get_trials(deepcopy=False) if t.state.is_finished())
        if self._predictor is None or self._predictor[0] != finished:
            self._predictor = (finished, Predictor(self.study, self.settings.study_dir))
        return self._predictor[1]

    def _prune_before_launch(self, trial, config: dict, role: Role, reason: str) -> None:
        """A configuration predicted not to win: pruned with the prediction as its reason, at no process cost."""
        record = {
            "status": Status.PRUNED,
            "reason": "pruned before launch: " + reason,
            "config": config,
            "wall_s": 0.0,
            "notes": [],
        }
        set_attrs(trial, {"role": role, **to_attrs(record)})
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        self.progress.done += 1
        self._report(trial.number, describe_config(config), record)
        self._told(trial)

    def _reject(self, trial, config: dict, role: Role, reason: str, known: dict | None = None) -> None:
        """A configuration that cannot work here: infeasible before launch, at no GPU cost (`known`: what
        the gate knew of it that the record keeps)."""
        record = {
            "status": Status.INFEASIBLE,
            "reason": "rejected before launch: " + reason,
            "config": config,
            "wall_s": 0.0,
            "score": 0.0,
            "notes": [],
            **(known or {}),
        }
        set_attrs(trial, {"role": role, **to_attrs(record)})
        trial.set_constraint("failed", violation(record))
        self.study.tell(trial, 0.0)
        self.progress.done += 1
        self._report(trial.number, describe_config(config), record)
        self._told(trial)

    def _told(self, trial) -> None:
        frozen = self.storage.get_trial(trial._trial_id) if hasattr(trial, "_trial_id") else trial
        for callback in self.callbacks:
            callback(self.study, frozen)

    def _pruning(self, trial):
        """should_stop for run_trial: report the optimistic score, ask the study's pruner."""
        # After a screen's step (autocompile.engine.screening): a full trial's steps come later
        at, state = horizon.scoring(self.settings), {"step": (self.settings.screen or -1) + 1, "last": None}
        ceiling, because = self._ceiling(trial)

        def should_stop(events: list[dict]) -> str | None:
            bound = optimistic_score(events, at, ceiling)
            if bound is None or bound == state["last"]:
                return None
            state["last"] = bound
            trial.report(bound, state["step"])
            state["step"] += 1
            if trial.should_prune():
                return f"pruned: it can reach a score of at most {bound:.3g} at horizon {at}{because}, below the best so far"
            return None

        return should_stop

    def _ceiling(self, trial) -> tuple[float | None, str]:
        """A trial's steady speed at most, and the words that say so: the lower of its move's ceiling (a
        neighbour's) and its configuration's own (`_pace_ceiling`); (None, "") where neither is known."""
        known = [c for c in (self._move_ceiling(trial), self._pace_ceiling(trial)) if c[0] is not None]
        return min(known, key=lambda c: c[0]) if known else (None, "")

    def known_gains(self) -> dict[str, float]:
        """Each dimension's median gain over its parent on this model and device (the knowledge store's
        gains, `MoveGains.by_dimension`); {} without the store."""
        return self.gains.by_dimension() if self.gains is not None else {}

    def _move_ceiling(self, trial) -> tuple[float | None, str]:
        """A neighbour's steady speed at most: its parent's, times the largest gain a neighbour of the same move
        has made over its parent on this device (the knowledge store's gains), and the words that say so."""
        record = Record.of(trial)
        parent, moved = record.parent, record.changed or []
        if self.gains is None or parent is None:
            return None, ""
        before = Record.of(view_of(self.study).trials[parent])
        known = self.gains.ceiling(moved, batch_layout(before.config))
        pace = before.steps_per_s if known else None
        if not pace:
            return None, ""
        ceiling = pace * known["ratio"]
        return ceiling, (
            f" (its steady speed at most {ceiling:.3g} steps/s: trial {parent}'s {pace:.3g} times "
            f"{known['ratio']:.2f}, the most a move of {', '.join(moved)} has gained over its parent here, "
            f"{known['by']}, of {known['of']})"
        )

    def _pace_ceiling(self, trial) -> tuple[float | None, str]:
        """Any trial's steady speed at most: the fastest its configuration ran on this workload here in other
        studies (the knowledge store's paces), plus knowledge.paces.MARGIN, and the words that say so."""
        config = Record.of(trial).config
        known = self.paces.ceiling(config, self.study.study_name) if self.paces is not None and config else None
        if not known:
            return None, ""
        ceiling = known["steps_per_s"] * (1 + PACE_MARGIN)
        return ceiling, (
            f" (its steady speed at most {ceiling:.3g} steps/s: its configuration ran at most "
            f"{known['steps_per_s']:.3g} here, {known['by']}, of {known['of']}, plus {PACE_MARGIN:.0%})"
        )

    def _report(self, number: int, label: str, record: dict) -> None:
        view = self.look()  # after the tell
        eager, best = view.baseline_value(Role.EAGER, "steps_per_s"), view.best_trial
        if best:
            self.progress.best = f"best: trial {best.number} {speedup(view.records[best.number].steps_per_s, eager)} eager"
        self.progress.line(
            f"[{self.progress.done}/{self.progress.total}] trial {number} {label}: {record['status']}"
            + (
                f"  {record['steps_per_s']:.3g} steps/s ({speedup(record['steps_per_s'], eager)} eager),"
                f" warm-up {record['warmup_s']:.1f} s, score {record['score']:.3g}{_penalised(record)}"
                if record["status"] == Status.OK
                else f" - {record.get('reason', '')}"
            )
            + (f"  | best: trial {best.number} {speedup(view.records[best.number].steps_per_s, eager)} eager" if best else "")
        )
