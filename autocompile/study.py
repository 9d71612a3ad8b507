"""The study: an Optuna search over the space, one isolated trial at a time, resumable.

Every study begins with two baselines measured on the same machine (eager, and plain
`torch.compile` defaults), then a few known-good recipes, then Optuna's sampler (TPE).
Each finished trial is told to the study at once, so a search that dies loses at most the
trial in flight, and running the same command again resumes it.

How outcomes are told to Optuna: a trial that ran is COMPLETE with its score. One that
failed, crashed, timed out, ran out of memory or hit the recompile limit is COMPLETE with
score 0 and a violated constraint, so TPE's constrained mode learns to avoid its region
(TPE ignores FAIL trials entirely). Only a search interrupted mid-trial leaves a FAIL.
A trial stopped because it can no longer win is PRUNED (Optuna's protocol: its optimistic
score is reported as it runs, and `CannotWinPruner` compares it with the best); TPE ranks
pruned trials after the completed ones.

At the end, the finalists (the top K configurations) are measured again, alternating with
eager, and the winner is chosen from that round (`run_finalists`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

import optuna

from autocompile.apply import describe_config
from autocompile.report import baseline_trial, baseline_value, best_trial, speedup, summarize, write_outputs
from autocompile.errors import UserError
from autocompile.memory import FailureMemory, store_path
from autocompile.memory import device_name as _device_name
from autocompile.storage import (check_study_name, counted, create_or_load, fail_stale, heartbeat_s,  # noqa: F401
                                 load_study, open_storage, set_budget, storage_url, this_worker)
from autocompile.screening import make_pruner
from autocompile.strategy import too_slow
from autocompile.space import DEFAULTS, EAGER, Capabilities, SearchSpace, WorkloadTraits
from autocompile._worker import REPLAY_VERSION
from autocompile.scoring import (DEFAULT_HORIZON, _judged_by_an_older_guard, judge,
                                 optimistic_score, score, violation)
from autocompile.trial import TrialRequest, reap_orphans, run_trial, triage
from autocompile.records import concise, save_record

BASELINES = (("eager", EAGER), ("compile-defaults", DEFAULTS))
MIN_TRIAL_S = 30.0  # with less of --timeout left, no trial is started
DEFAULT_FINALISTS = 3


@dataclass
class SearchSettings:
    model: str
    device: str
    study: str
    directory: str = "studies"
    storage: str | None = None
    trials: int = 10
    timeout_s: float | None = None
    trial_timeout_s: float = 900.0
    baseline_timeout_s: float | None = None  # the baselines' own limit (default: trial_timeout_s)
    horizon: int = DEFAULT_HORIZON
    batch_size: int | None = None
    seq_len: int | None = None
    seed: int = 0
    fixed: dict | None = None
    space_file: str | None = None  # a space file (TOML or JSON): [fix], [exclude], [inductor]
    measure: dict | None = None
    max_memory_gb: float | None = None  # trials above it are infeasible
    finalists: int = DEFAULT_FINALISTS  # re-measured at the end, alternating with eager (0: none)
    prune: bool = True  # stop trials that can no longer win
    triage: bool = True  # rerun compile failures with simpler backends to name the failing layer
    trace: bool = False  # each trial writes a TORCH_TRACE (for tlparse reports in the dashboard)
    memory_path: str | None = None  # the failure memory (default: ~/.cache/autocompile/failures.db)
    screen: int | None = None  # screen trials at this many blocks first (autocompile.screening)

    def __post_init__(self):
        check_study_name(self.study)

    @property
    def baseline_limit_s(self) -> float:
        """The baselines are what every trial is compared to: they may be given longer."""
        return self.baseline_timeout_s or self.trial_timeout_s

    @property
    def study_dir(self) -> str:
        return os.path.join(self.directory, self.study)


def _sampler(seed: int):
    """TPE over the conditional space (multivariate, grouped); it reads each trial's constraint."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5)


def workload_traits(workload, options) -> WorkloadTraits:
    """The model's repeated blocks, found on the meta device (no memory, no weights)."""
    from autocompile.apply import find_repeated_blocks

    regions, fusable = None, False
    try:
        import dataclasses

        model, optimizer = workload.build(dataclasses.replace(options, device="meta"))
        regions = find_repeated_blocks(model)
        fusable = "fused" in getattr(optimizer, "defaults", {})
        del model, optimizer
    except Exception:
        regions = None  # found when a trial builds the model
    return WorkloadTraits(varying=dict(workload.varying), parts=tuple(workload.parts), regions=regions,
                          fusable_optimizer=fusable, criterion=workload.split_loss,
                          schedule=workload.schedule is not None, lengths=_length_range(workload, options))


def _length_range(workload, options) -> tuple[int, int] | None:
    """The varying dimension's range: the shortest length in the batch pool, the longest the
    workload allows. Batches are built on the CPU (cheap, and the same lengths as on any device)."""
    import dataclasses

    if not workload.varying:
        return None
    cpu = dataclasses.replace(options, device="cpu")
    key, (dim, _) = next(iter(workload.varying.items()))
    try:
        shortest = min(batch[key].shape[dim] for batch in workload.batches(cpu, workload.batch_pool))
    except Exception:  # a workload that cannot build batches on the CPU: no rule can count its shapes
        return None
    return shortest, max(workload.max_len(options), shortest)


def build_space(model: str, device: str, batch_size=None, seq_len=None, seed=0, fixed=None,
                space_file: str | None = None) -> SearchSpace:
    """The space for a workload on a device; `space_file` narrows or extends it (see load_space_file)."""
    from autocompile.space import load_space_file
    from autocompile.workloads import WorkloadOptions, get_workload

    narrowing = load_space_file(space_file) if space_file else None  # a bad file fails before any build
    workload = get_workload(model)
    if workload.gpu_only and not device.startswith("cuda"):
        raise UserError(f"model {model!r} needs a GPU (use tiny-llama or tiny-captioner on the CPU)")
    options = WorkloadOptions(device=device, batch_size=batch_size, seq_len=seq_len, seed=seed)
    return SearchSpace(Capabilities.detect(device), workload_traits(workload, options), fixed=fixed,
                       space_file=narrowing)


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
            detail = (f" step {event['step']}" if "step" in event else
                      f" window {event['window']} at {event['steps_per_s']:.3g} steps/s" if "window" in event else "")
            status = head + detail + (f"  | {self.best}" if self.best else "")
            columns = shutil.get_terminal_size((120, 20)).columns
            self.stream.write("\r\x1b[2K" + status[: columns - 1])
            self.stream.flush()
        elif phase in ("building", "compiling", "warming up", "measuring") and "step" not in event and "window" not in event:
            self.line("  " + head)


def _header(settings: SearchSettings, number: int) -> str:
    return f"Compile settings for {settings.model} (study {settings.study!r}, trial {number}), found by autocompile."


def _check_resume(study, settings: SearchSettings) -> None:
    expected = {"model": settings.model, "device": settings.device, "batch_size": settings.batch_size,
                "seq_len": settings.seq_len, "seed": settings.seed}
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", expected)
        study.set_user_attr("horizon", settings.horizon)
        study.set_user_attr("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        return
    for key, value in expected.items():
        if stored.get(key) != value:
            raise UserError(
                f"study {settings.study!r} was made with {key}={stored.get(key)!r}, not {value!r}: "
                f"pass the same, or choose a new --study"
            )


def _ran_its_course(attrs: dict, limit_s: float) -> bool:
    """Whether a finished trial's result stands: anything but a timeout, or a timeout that had
    (nearly) the whole of `limit_s` (one cut short sooner may be measured again)."""
    return attrs.get("status") != "timeout" or attrs.get("wall_s", 0) >= 0.9 * limit_s


def _tried(study, config: dict, params: dict, trial_timeout_s: float, exclude: int | None = None) -> bool:
    """Whether a configuration was measured already (or pruned), or is queued or running (claimed by
    a worker): a trial cut short by a search's time bound (not by the trial limit) does not count."""
    for t in study.trials:
        if t.number == exclude:
            continue
        if t.state == optuna.trial.TrialState.WAITING:
            if t.system_attrs.get("fixed_params") == params:
                return True
            continue
        if {**DEFAULTS, **t.user_attrs.get("config", {})} != config:
            continue
        if t.state == optuna.trial.TrialState.RUNNING:
            return "config" in t.user_attrs  # claimed by a worker
        if _judged_by_an_older_guard(t.user_attrs):
            continue  # made infeasible by a numerics rule since replaced: measured again
        if t.state == optuna.trial.TrialState.PRUNED:
            return True  # it could not win when it ran
        if t.state == optuna.trial.TrialState.COMPLETE and _ran_its_course(t.user_attrs, trial_timeout_s):
            return True
    return False


def baselines_to_run(finished: list, limit_s: float) -> list[tuple[str, dict]]:
    """The baselines (role, config) a search still owes its study: those never measured, and
    one that timed out under a shorter limit than `limit_s` (it is measured again)."""
    done = {t.user_attrs.get("role") for t in finished if t.state == optuna.trial.TrialState.COMPLETE
            and _ran_its_course(t.user_attrs, limit_s) and not _judged_by_an_older_guard(t.user_attrs)}
    return [(role, config) for role, config in BASELINES if role not in done]


def _eager_record(study) -> dict | None:
    eager = baseline_trial(study, "eager")
    return eager.user_attrs if eager else None


class _Runner:
    """Runs trials of one search against its study: launch, prune, triage, judge, tell."""

    def __init__(self, study, storage, url: str, settings: SearchSettings, progress: Progress, deadline: float | None,
                 callbacks=()):
        self.study, self.storage, self.url, self.settings, self.progress = study, storage, url, settings, progress
        self.deadline = deadline
        self.callbacks = callbacks  # Optuna's signature, callback(study, frozen_trial): after each tell
        self.trials_wall = 0.0  # the trials' own time, to show what the harness adds
        self.space = self.memory = None  # set by open_search

    def refusal(self, config: dict) -> str | None:
        """Why `config` is not launched, before any process: it cannot work or is doomed here,
        it failed the same way twice before, or it is expected not to warm up in time."""
        return (self.space.rejection(config) or self.memory.reason(config)
                or too_slow(self.study, config, self.settings.trial_timeout_s, self.space.rejection))

    def tried(self, config: dict, params: dict) -> bool:
        """Measured, queued or claimed, or refused before launch (see refusal)."""
        return _tried(self.study, config, params, self.settings.trial_timeout_s) or self.refusal(config) is not None

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()

    def run(self, trial, config: dict, role: str, prunable: bool, limit_s: float | None = None,
            keep_s: float = 0.0) -> dict:
        """Measure `config` as `trial` within `limit_s` (default: the trial limit) and what is left
        of --timeout less `keep_s` (kept for the finalist round), then tell the study; returns the record."""
        settings = self.settings
        limit_s = limit_s or settings.trial_timeout_s
        trial.set_user_attr("role", role)
        trial.set_user_attr("config", config)  # known even if the search dies during the trial
        trial.set_user_attr("worker", this_worker())  # a trial of a dead worker is failed and tried again
        label = describe_config(config)
        self.progress.phase(trial.number, label, {"phase": "starting"})
        remaining = None if self.remaining() is None else self.remaining() - keep_s
        request = TrialRequest(
            model=settings.model, config=config, device=settings.device,
            trial_dir=os.path.join(settings.study_dir, "trials", f"{trial.number:04d}"),
            batch_size=settings.batch_size, seq_len=settings.seq_len, seed=settings.seed,
            timeout_s=limit_s if remaining is None else max(1.0, min(limit_s, remaining)),
            header=_header(settings, trial.number), measure=settings.measure or {}, trace=settings.trace,
        )
        storage = self.storage
        beat = (lambda: storage.record_heartbeat(trial._trial_id)) if hasattr(storage, "record_heartbeat") else None
        try:
            record = run_trial(request, on_event=lambda e: self.progress.phase(trial.number, label, e), heartbeat=beat,
                               heartbeat_every_s=heartbeat_s() / 2,
                               should_stop=self._pruning(trial) if prunable and settings.prune else None)
            self.trials_wall += record["wall_s"]
            if record["status"] == "compile_error" and settings.triage and (remaining is None or
                                                                            self.remaining() > MIN_TRIAL_S):
                self.progress.line(f"  trial {trial.number}: compile error; rerunning with simpler backends to find the layer")
                record = triage(request, record, time_left=self.remaining(), heartbeat=beat)
                self.trials_wall += sum(rung.get("wall_s", 0) for rung in record.get("triage", []))
        except KeyboardInterrupt:
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("reason", "interrupted")
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            self.progress.line(f"interrupted: trial {trial.number} abandoned; finished trials are saved in "
                               f"{self.url}; run the same command to resume")
            raise
        record = judge(record, _eager_record(self.study), settings.device, settings.max_memory_gb)
        record["score"] = score(record, settings.horizon)
        save_record(request.trial_dir, record)  # the whole record; the study keeps it concise
        for key, value in concise(record).items():
            trial.set_user_attr(key, value)
        if record["status"] == "pruned":
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif record["status"] == "timeout" and request.timeout_s < limit_s:
            # Cut short by the search's own time bound, not by its trial limit: says nothing
            # of the configuration, so it is not told as infeasible (and may be tried again).
            trial.set_user_attr("reason", record["reason"] + "; cut by the search --timeout")
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            trial.set_constraint("failed", violation(record))
            self.study.tell(trial, record["score"])
        self.progress.done += 1
        self._report(trial.number, label, record)
        self._told(trial)
        return record

    def reject(self, trial, config: dict, role: str, reason: str) -> None:
        """A configuration that cannot work here: infeasible before launch, at no GPU cost."""
        record = {"status": "infeasible", "reason": "rejected before launch: " + reason, "config": config,
                  "wall_s": 0.0, "score": 0.0, "notes": []}
        trial.set_user_attr("role", role)
        for key, value in concise(record).items():
            trial.set_user_attr(key, value)
        trial.set_constraint("failed", violation(record))
        self.study.tell(trial, 0.0)
        self.progress.done += 1
        self._report(trial.number, describe_config(config), record)
        self._told(trial)

    def _told(self, trial) -> None:
        frozen = self.storage.get_trial(trial._trial_id)
        for callback in self.callbacks:
            callback(self.study, frozen)

    def _pruning(self, trial):
        """should_stop for run_trial: report the optimistic score, ask the study's pruner."""
        # After a screen's step (autocompile.screening): a full trial's steps come later
        horizon, state = self.settings.horizon, {"step": (self.settings.screen or -1) + 1, "last": None}

        def should_stop(events: list[dict]) -> str | None:
            bound = optimistic_score(events, horizon)
            if bound is None or bound == state["last"]:
                return None
            state["last"] = bound
            trial.report(bound, state["step"])
            state["step"] += 1
            if trial.should_prune():
                return f"pruned: it can reach a score of at most {bound:.3g} at horizon {horizon}, below the best so far"
            return None

        return should_stop

    def _report(self, number: int, label: str, record: dict) -> None:
        eager = baseline_value(self.study, "eager", "steps_per_s")
        best = best_trial(self.study)
        if best:
            self.progress.best = f"best: trial {best.number} {speedup(best.user_attrs.get('steps_per_s'), eager)} eager"
        self.progress.line(
            f"[{self.progress.done}/{self.progress.total}] trial {number} {label}: {record['status']}"
            + (f"  {record['steps_per_s']:.3g} steps/s ({speedup(record['steps_per_s'], eager)} eager),"
               f" warm-up {record['warmup_s']:.1f} s, score {record['score']:.3g}" if record["status"] == "ok"
               else f" - {record.get('reason', '')}")
            + (f"  | best: trial {best.number} {speedup(best.user_attrs.get('steps_per_s'), eager)} eager" if best else "")
        )


def _ask(study):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "heartbeat is meant for optimize()": we beat ourselves
        return study.ask()


def search_candidates(study) -> list:
    """Trials of distinct compiled configurations that ran cleanly, best score first."""
    seen, out = [], []
    ranked = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value
                     and t.user_attrs.get("status") == "ok" and t.user_attrs.get("role") != "finalist"
                     and t.user_attrs.get("config", {}).get("compile")), key=lambda t: t.value, reverse=True)
    for t in ranked:
        if t.user_attrs["config"] not in seen:
            seen.append(t.user_attrs["config"])
            out.append(t)
    return out


def _finalist_reserve(study, k: int) -> float:
    """Seconds to keep for the finalist round under --timeout: what the current top k (and eager)
    took in their own runs, which the round repeats. Kept from the start (a resumed study knows
    it at once) and updated as trials finish, so the round always runs. A tenth more for runs that
    take longer the second time (llama-8b's round kept 331 s, had 330 s and left out its third
    finalist, 45 s long, H200, 2026-11-23)."""
    if k <= 0:
        return 0.0
    eager = _eager_record(study) or {}
    return 1.1 * (sum(t.user_attrs.get("wall_s", 0) for t in search_candidates(study)[:k]) + eager.get("wall_s", 0))


def expected_trial_s(study) -> float:
    """What the next compiled trial is expected to take: the median time of the compiled trials
    measured so far (recipes, neighbours, TPE; pruned ones at the time they took), at least
    MIN_TRIAL_S. A trial that is not expected to fit what is left of --timeout is not started."""
    walls = sorted(t.user_attrs["wall_s"] for t in study.get_trials(deepcopy=False)
                   if t.state.is_finished() and t.user_attrs.get("wall_s") and t.user_attrs.get("config", {}).get("compile")
                   and t.user_attrs.get("role") not in ("compile-defaults", "finalist"))
    return max(MIN_TRIAL_S, walls[len(walls) // 2]) if walls else MIN_TRIAL_S


def _waiting(study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def choose_winner(rows: list[dict], eager_number: int, eager_score: float, horizon: int) -> dict:
    """The finalist round's verdict from its rows (trial, status, score, noise, spread, warmup_s):
    the best score, unless the top two are within noise (then the shorter warm-up), or eager
    scores above the chosen one. Returns winner, why, and the margin.

    The noise is the leader's (its window spread or the gap between its two measurements, the
    larger) plus the runner-up's window spread: a runner-up whose own measurements disagree is
    less to be trusted, not a closer rival (the captioner's trial 3 ran at 17.3 then 12.7 steps/s
    and took the win from a CUDA-graph configuration steady at 19.9 and 19.6, H200, 2026-11-23)."""
    ranked = sorted((row for row in rows if row["status"] == "ok"), key=lambda row: row["score"], reverse=True)
    if not ranked:
        return {"winner": None}
    verdict = {}
    winner, why = ranked[0], f"trial {ranked[0]['trial']} has the best score in the finalist round"
    if len(ranked) > 1:
        second = ranked[1]
        margin = winner["score"] / second["score"] - 1
        noise = winner["noise"] + second.get("spread", second["noise"])
        verdict.update(margin=margin, noise=noise, within_noise=margin <= noise)
        if margin <= noise:
            quicker = min(winner, second, key=lambda row: row["warmup_s"])
            why = (f"trials {winner['trial']} and {second['trial']} are within noise ({margin:.1%} apart, "
                   f"noise {noise:.1%}): trial {quicker['trial']} wins with the shorter warm-up")
            winner = quicker
        else:
            why += f", {margin:.1%} ahead of trial {second['trial']} (noise {noise:.1%})"
    if eager_score > winner["score"]:
        why = (f"eager scores {eager_score:.3g} in the finalist round, above trial {winner['trial']}'s "
               f"{winner['score']:.3g}: at horizon {horizon} no compiled setting pays for its warm-up")
        winner = {"trial": eager_number}
    return {**verdict, "winner": winner["trial"], "why": why}


def run_finalists(runner: _Runner, k: int, rounds: int = 1) -> dict | None:
    """Measure the top k configurations again, alternating with eager, and choose the winner.

    Each round runs eager then the finalists (in reverse order every other round), so drift
    of the machine reaches all of them alike. The winner has the best score in the round;
    when the top two are within noise (see choose_winner), the one with the shorter warm-up wins.
    """
    study, progress = runner.study, runner.progress
    eager = baseline_trial(study, "eager")
    if eager is None:
        return None
    finalists, remaining, overrun = [], runner.remaining(), 0.0
    budget = None if remaining is None else remaining / rounds - eager.user_attrs["wall_s"]
    candidates = search_candidates(study)[:k]
    for t in candidates:  # under --timeout, those whose rerun fits, best first
        if budget is not None and t.user_attrs["wall_s"] > budget:
            progress.line(f"finalist round: no time left to measure trial {t.number} again "
                          f"(it took {t.user_attrs['wall_s']:.0f} s)")
            break
        finalists.append(t)
        budget = None if budget is None else budget - t.user_attrs["wall_s"]
    if not candidates:
        return None
    if not finalists:  # the round always runs: the best of them at least, past --timeout if need be
        finalists = candidates[:1]
        overrun = 1.5 * (finalists[0].user_attrs["wall_s"] + eager.user_attrs["wall_s"]) - max(remaining, 0.0)
        progress.line(f"finalist round: trial {finalists[0].number} measured again even though it runs past "
                      f"--timeout, by up to {overrun:.0f} s: the winner comes from the round")
    numbers = [t.number for t in finalists]
    done = study.user_attrs.get("finalists")
    if done and done.get("finalists") == numbers and done.get("numerics_guard") == REPLAY_VERSION:
        return done  # this round was run already for these finalists, under the current numerics guard
    progress.line(f"finalist round: trials {', '.join(map(str, numbers))} measured again, alternating with eager")
    progress.total = progress.done + rounds * (len(finalists) + 1)
    runs: dict[int, list[dict]] = {t.number: [] for t in [eager, *finalists]}
    for r in range(rounds):
        order = [eager, *(finalists if r % 2 == 0 else finalists[::-1])]
        for original in order:
            remaining = runner.remaining()
            # the round was planned from what its runs took (the reserve): a run is left out only
            # when what it took no longer fits, and the first round's eager and leader always run
            must = r == 0 and original.number in (eager.number, finalists[0].number)
            if remaining is not None and not must and remaining + overrun < original.user_attrs["wall_s"]:
                progress.line(f"finalist round: search timeout reached, trial {original.number} not measured again")
                break
            trial = _ask(study)
            trial.set_user_attr("remeasure_of", original.number)
            trial.set_user_attr("finalist_round", r)
            # a rerun may take longer than its first run (a loaded host compiles slower): it is
            # not cut short of 1.5x what that took, even past --timeout
            keep = -overrun if remaining is None else min(-overrun, remaining - 1.5 * original.user_attrs["wall_s"])
            record = runner.run(trial, dict(original.user_attrs["config"]), "finalist", prunable=False, keep_s=keep)
            runs[original.number].append({**record, "trial": trial.number})
    eager_runs = [x for x in runs[eager.number] if x["status"] == "ok"]
    eager_pace = statistics.mean([x["steps_per_s"] for x in eager_runs]) if eager_runs else None
    rows = []
    for t in finalists:
        ok = [x for x in runs[t.number] if x["status"] == "ok"]
        if not ok:
            rows.append({"trial": t.number, "config": t.user_attrs["config"], "status": "failed again",
                         "reason": "; ".join(x.get("reason", "") for x in runs[t.number]) or "not run"})
            continue
        paces = [t.user_attrs["steps_per_s"]] + [x["steps_per_s"] for x in ok]
        agreement = (max(paces) - min(paces)) / statistics.mean(paces)
        spread = max([x.get("cv", 0) for x in ok] + [t.user_attrs.get("cv", 0)])
        rows.append({
            "trial": t.number, "config": t.user_attrs["config"], "status": "ok", "reruns": [x["trial"] for x in ok],
            "search_steps_per_s": t.user_attrs["steps_per_s"], "search_score": t.value,
            "steps_per_s": statistics.mean(x["steps_per_s"] for x in ok),
            "warmup_s": statistics.mean(x["warmup_s"] for x in ok),
            "score": statistics.mean(x["score"] for x in ok),
            "vs_eager": (statistics.mean(x["steps_per_s"] for x in ok) / eager_pace) if eager_pace else None,
            "agreement": agreement, "spread": spread, "noise": max(agreement, spread),
        })
    verdict = {"finalists": numbers, "rounds": rounds, "eager_steps_per_s": eager_pace, "candidates": rows,
               "numerics_guard": REPLAY_VERSION,
               **choose_winner(rows, eager.number, statistics.mean(x["score"] for x in eager_runs) if eager_runs else 0.0,
                               runner.settings.horizon)}
    if verdict["winner"] is not None:
        progress.line("finalists: " + verdict["why"])
    study.set_user_attr("finalists", verdict)
    return verdict


def open_search(settings: SearchSettings, progress: Progress | None = None, callbacks=(), workers: int = 1,
                seed_offset: int = 0) -> _Runner:
    """Open (or create) the study of `settings` and a runner for it: trials of dead workers failed
    (and tried again), their orphaned trial processes killed. Raises UserError on bad input."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = build_space(settings.model, settings.device, settings.batch_size, settings.seq_len,
                        settings.seed, settings.fixed, settings.space_file)
    pruner = make_pruner(settings)  # a --screen that cannot work fails before the storage is made
    url = storage_url(settings.storage, settings.directory, settings.study, workers)
    storage = open_storage(url, create_dir=settings.study_dir)
    study = create_or_load(settings.study, storage, direction="maximize", sampler=_sampler(settings.seed + seed_offset),
                           pruner=pruner)
    _check_resume(study, settings)
    progress = progress or Progress(settings.trials)
    progress.line(f"autocompile search: {settings.model} on {_device_name(settings.device)} "
                  f"(torch {space.caps.torch_version}), study {settings.study!r} in {url}")
    reap_orphans(settings.study_dir)
    stale = fail_stale(study)
    finished = [t for t in study.trials if t.state.is_finished()]
    if finished:
        progress.line(f"resuming study {settings.study!r}: {len(finished)} trials already finished"
                      + (f", {stale} interrupted ones marked failed" if stale else ""))
    memory = FailureMemory(store_path(settings.memory_path), space, _device_name(settings.device), url)
    runner = _Runner(study, storage, url, settings, progress, callbacks=(memory, *callbacks), deadline=None)
    runner.space, runner.memory = space, memory
    return runner


def plan(runner: _Runner, trials: int, timeout_s: float | None) -> dict:
    """The study's budget from now (`trials` more, within `timeout_s`), stored with the search's
    settings for workers that join it (autocompile.workers)."""
    runner.deadline = None if timeout_s is None else time.time() + timeout_s
    runner.study.set_user_attr("search_settings", {k: v for k, v in dataclasses.asdict(runner.settings).items()
                                                   if k not in ("storage", "directory", "memory_path")})
    return set_budget(runner.study, counted(runner.study) + trials, runner.deadline)


def finish(runner: _Runner, search_started: float) -> dict:
    """The finalist round (once), then the summary with the winner; its snippet written."""
    settings, progress = runner.settings, runner.progress
    if settings.finalists > 0:
        run_finalists(runner, settings.finalists)
    summary = summarize(runner.study, settings.study_dir)
    if runner.trials_wall:
        wall = time.time() - search_started
        summary["harness"] = {"search_wall_s": wall, "trials_wall_s": runner.trials_wall,
                              "ratio": wall / runner.trials_wall}
        progress.line(f"harness: this search took {wall:.0f} s for {runner.trials_wall:.0f} s of trials "
                      f"({wall / runner.trials_wall:.2f}x)")
    if summary["best"]:
        write_outputs(summary, settings.study_dir)
    return summary


def run_search(settings: SearchSettings, progress: Progress | None = None, callbacks=()) -> dict:
    """Run (or resume) a search in this process; returns a summary with the winner. Raises UserError on bad input.
    `callbacks` are called as callback(study, frozen_trial) after each trial is told to the study."""
    from autocompile.claims import work

    search_started = time.time()
    runner = open_search(settings, progress, callbacks)
    work(runner, plan(runner, settings.trials, settings.timeout_s))
    return finish(runner, search_started)
