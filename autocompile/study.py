"""The study: an Optuna search over the space, one isolated trial at a time, resumable.

Every study begins with two baselines measured on the same machine (eager, and plain
`torch.compile` defaults), then a few known-good recipes, then Optuna's sampler (TPE).
Each finished trial is told to the study at once, so a search that dies loses at most the
trial in flight, and running the same command again resumes it.

How outcomes are told to Optuna: a trial that ran is COMPLETE with its score. One that
failed, crashed, timed out, ran out of memory or hit the recompile limit is COMPLETE with
score 0 and a violated constraint, so TPE's constrained mode learns to avoid its region
(TPE ignores FAIL trials entirely). Only a search interrupted mid-trial leaves a FAIL.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import warnings
from dataclasses import dataclass

from autocompile.apply import describe_config
from autocompile.report import baseline_value, best_trial, speedup, summarize, write_outputs
from autocompile.errors import UserError
from autocompile.space import DEFAULTS, EAGER, Capabilities, SearchSpace, WorkloadTraits
from autocompile.trial import TrialRequest, run_trial

DEFAULT_HORIZON = 1000  # training steps the warm-up is amortised over
RECOMPILE_PENALTY = 0.02  # score lost per recompile after warm-up (at most half)
BASELINES = (("eager", EAGER), ("compile-defaults", DEFAULTS))
MIN_TRIAL_S = 30.0  # with less of --timeout left, no trial is started


def score(record: dict, horizon: int = DEFAULT_HORIZON) -> float:
    """Effective steps/s over a run of `horizon` steps that starts cold.

    H / (warmup_s + (H - warmup_steps) / steps_per_s): the warm-up's own steps count as
    training done, and the rest run at steady-state speed. Each recompile after warm-up
    takes RECOMPILE_PENALTY of the result off (at most half). 0 for any trial not "ok".
    """
    if record.get("status") != "ok":
        return 0.0
    remaining = max(horizon - record["warmup_steps"], 0)
    effective = horizon / (record["warmup_s"] + remaining / record["steps_per_s"])
    penalty = min(0.5, RECOMPILE_PENALTY * record.get("recompiles_after_warmup", 0))
    return effective * (1.0 - penalty)


def violation(record: dict) -> float:
    """Optuna constraint value: > 0 means infeasible (by how much, where that is known)."""
    if record.get("status") == "ok":
        return 0.0
    return float(record.get("over_memory_gb") or 1.0)


def numerics_tolerance(device: str) -> float:
    """Relative tolerance on the first losses: float32 on the CPU; bf16 or autocast on GPUs."""
    return 2e-2 if device.startswith("cuda") else 1e-3


def judge(record: dict, eager: dict | None, device: str, max_memory_gb: float | None) -> dict:
    """Make a trial that ran infeasible if it computes something else than eager, or needs
    more memory than allowed. Same seed, weights and batches: the first losses must agree."""
    if record.get("status") != "ok":
        return record
    if eager and eager.get("losses") and record.get("losses") and record["config"]["compile"]:
        n = min(len(eager["losses"]), len(record["losses"]), 3)
        diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(record["losses"][:n], eager["losses"][:n])]
        tolerance = numerics_tolerance(device)
        record["numerics"] = {"eager": eager["losses"][:n], "trial": record["losses"][:n],
                              "max_rel_diff": max(diffs), "tolerance": tolerance}
        if max(diffs) > tolerance:
            record["status"] = "infeasible"
            record["reason"] = (f"numerics: the first losses differ from eager by {max(diffs):.2%} "
                                f"(tolerance {tolerance:.1%}): {record['losses'][:n]} against {eager['losses'][:n]}")
            return record
    if max_memory_gb is not None and record.get("peak_mem_gb", 0) > max_memory_gb:
        record["over_memory_gb"] = record["peak_mem_gb"] - max_memory_gb
        record["status"] = "infeasible"
        record["reason"] = f"peak memory {record['peak_mem_gb']:.2f} GB is above --max-memory-gb {max_memory_gb:g}"
    return record


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
    horizon: int = DEFAULT_HORIZON
    batch_size: int | None = None
    seq_len: int | None = None
    seed: int = 0
    fixed: dict | None = None
    measure: dict | None = None
    max_memory_gb: float | None = None  # trials above it are infeasible

    @property
    def study_dir(self) -> str:
        return os.path.join(self.directory, self.study)


def storage_url(settings_storage: str | None, directory: str, study: str) -> str:
    if settings_storage:
        return settings_storage
    return "sqlite:///" + os.path.abspath(os.path.join(directory, study, "study.db"))


def open_storage(url: str, create_dir: str | None = None):
    """Optuna RDB storage with heartbeats (so trials of a dead search are failed on resume)."""
    import optuna

    if url.startswith("sqlite:///") and create_dir:
        os.makedirs(create_dir, exist_ok=True)
    try:
        if url.startswith(("sqlite", "postgresql", "mysql")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, heartbeat_interval=60, grace_period=180)
        return optuna.storages.get_storage(url)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {url}: {first}") from None


def load_study(name: str, url: str):
    import optuna

    storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UserError(f"no study named {name!r} in {url}" + (f"; studies there: {', '.join(names)}" if names else "")) from None


def _sampler(seed: int):
    """TPE over the conditional space (multivariate, grouped); it reads each trial's constraint."""
    import optuna

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
                          fusable_optimizer=fusable)


def build_space(model: str, device: str, batch_size=None, seq_len=None, seed=0, fixed=None) -> SearchSpace:
    from autocompile.workloads import WorkloadOptions, get_workload

    workload = get_workload(model)
    if workload.gpu_only and not device.startswith("cuda"):
        raise UserError(f"model {model!r} needs a GPU (use tiny-llama or tiny-captioner on the CPU)")
    options = WorkloadOptions(device=device, batch_size=batch_size, seq_len=seq_len, seed=seed)
    return SearchSpace(Capabilities.detect(device), workload_traits(workload, options), fixed=fixed)


class Progress:
    """Progress lines on stderr: one when a trial changes phase, one with its result."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.done = total, stream or sys.stderr, 0

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def phase(self, number: int, label: str, event: dict) -> None:
        phase = event.get("phase")
        if phase in ("building", "compiling", "warming up", "measuring") and "step" not in event and "window" not in event:
            self.line(f"  [{self.done + 1}/{self.total}] trial {number} {label}: {phase}")


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


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


def _tried(study, config: dict, params: dict, trial_timeout_s: float) -> bool:
    """Whether a configuration was measured already, or is queued: a trial cut short by a
    search's time bound (not by the trial limit) does not count."""
    import optuna

    for t in study.trials:
        if t.state == optuna.trial.TrialState.WAITING:
            if t.system_attrs.get("fixed_params") == params:
                return True
            continue
        if t.state != optuna.trial.TrialState.COMPLETE or {**DEFAULTS, **t.user_attrs.get("config", {})} != config:
            continue
        a = t.user_attrs
        if a.get("status") != "timeout" or a.get("wall_s", 0) >= 0.9 * trial_timeout_s:
            return True
    return False


def run_search(settings: SearchSettings, progress: Progress | None = None) -> dict:
    """Run (or resume) a search; returns a summary with the winner. Raises UserError on bad input."""
    import optuna

    search_started = time.time()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = build_space(settings.model, settings.device, settings.batch_size, settings.seq_len,
                        settings.seed, settings.fixed)
    url = storage_url(settings.storage, settings.directory, settings.study)
    storage = open_storage(url, create_dir=settings.study_dir)
    study = optuna.create_study(study_name=settings.study, storage=storage, direction="maximize",
                                sampler=_sampler(settings.seed), load_if_exists=True)
    _check_resume(study, settings)
    progress = progress or Progress(settings.trials)
    progress.line(f"autocompile search: {settings.model} on {_device_name(settings.device)} "
                  f"(torch {space.caps.torch_version}), study {settings.study!r} in {url}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API and heartbeat-with-ask warnings
        stale = optuna.storages.fail_stale_trials(study)
    finished = [t for t in study.trials if t.state.is_finished()]
    if finished:
        progress.line(f"resuming study {settings.study!r}: {len(finished)} trials already finished"
                      + (f", {len(stale)} interrupted ones marked failed" if stale else ""))
    roles_done = {t.user_attrs.get("role") for t in finished if t.state == optuna.trial.TrialState.COMPLETE}
    pending_roles = [(role, cfg) for role, cfg in BASELINES if role not in roles_done]

    recipes_queued = False
    trials_wall = 0.0  # the trials' own time, to show what the harness adds
    toolchain = os.path.abspath(os.path.join(settings.directory, ".toolchain-cache"))
    started = time.time()
    for _ in range(settings.trials):
        remaining = None if settings.timeout_s is None else settings.timeout_s - (time.time() - started)
        if remaining is not None and remaining < MIN_TRIAL_S:
            progress.line(f"search timeout of {settings.timeout_s:.0f} s reached"
                          + (f" ({remaining:.0f} s left: too little for a trial)" if remaining > 0 else ""))
            break
        if not pending_roles and not recipes_queued:
            # After the baselines (study.ask would hand a queued recipe to a baseline); a
            # recipe already tried in this study is not queued again.
            for params in space.starting_points():
                config = space.suggest(optuna.trial.FixedTrial(params))
                if not _tried(study, config, params, settings.trial_timeout_s):
                    study.enqueue_trial(params, user_attrs={"role": "recipe", "config": config})
            recipes_queued = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "heartbeat is meant for optimize()": we beat ourselves
            trial = study.ask()
        if pending_roles:
            role, config = pending_roles.pop(0)
            config = json.loads(json.dumps(config))
            trial.set_user_attr("role", role)
        else:
            config = space.suggest(trial)
            role = trial.user_attrs.get("role", "search")
            trial.set_user_attr("role", role)
        if "matmul_precision" in space.fixed or "recompile_limit" in space.fixed:
            config.update({k: v for k, v in space.fixed.items() if k in ("matmul_precision", "recompile_limit")})
        trial.set_user_attr("config", config)  # known even if the search dies during the trial
        label = describe_config(config)
        progress.phase(trial.number, label, {"phase": "starting"})
        request = TrialRequest(
            model=settings.model, config=config, device=settings.device,
            trial_dir=os.path.join(settings.study_dir, "trials", f"{trial.number:04d}"),
            batch_size=settings.batch_size, seq_len=settings.seq_len, seed=settings.seed,
            timeout_s=min(settings.trial_timeout_s, remaining) if remaining else settings.trial_timeout_s,
            toolchain_dir=toolchain, header=_header(settings, trial.number), measure=settings.measure or {},
        )
        beat = (lambda: storage.record_heartbeat(trial._trial_id)) if hasattr(storage, "record_heartbeat") else None
        try:
            record = run_trial(request, on_event=lambda e: progress.phase(trial.number, label, e), heartbeat=beat)
        except KeyboardInterrupt:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            progress.line(f"interrupted: trial {trial.number} abandoned; finished trials are saved in {url}; "
                          f"run the same command to resume")
            raise
        eager = next((t.user_attrs for t in study.trials if t.user_attrs.get("role") == "eager"
                      and t.user_attrs.get("status") == "ok"), None)
        trials_wall += record["wall_s"]
        record = judge(record, eager, settings.device, settings.max_memory_gb)
        record["score"] = score(record, settings.horizon)
        for key, value in record.items():
            trial.set_user_attr(key, value)
        if record["status"] == "timeout" and request.timeout_s < settings.trial_timeout_s:
            # Cut short by the search's own time bound, not by its trial limit: says nothing
            # of the configuration, so it is not told as infeasible (and may be tried again).
            trial.set_user_attr("reason", record["reason"] + "; cut by the search --timeout")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            trial.set_constraint("failed", violation(record))
            study.tell(trial, record["score"])
        progress.done += 1
        eager = baseline_value(study, "eager", "steps_per_s")
        best = best_trial(study)
        progress.line(
            f"[{progress.done}/{progress.total}] trial {trial.number} {label}: {record['status']}"
            + (f"  {record['steps_per_s']:.3g} steps/s ({speedup(record['steps_per_s'], eager)} eager),"
               f" warm-up {record['warmup_s']:.1f} s, score {record['score']:.3g}" if record["status"] == "ok"
               else f" - {record.get('reason', '')}")
            + (f"  | best: trial {best.number} {speedup(best.user_attrs.get('steps_per_s'), eager)} eager" if best else "")
        )
    summary = summarize(study, settings.study_dir)
    if trials_wall:
        wall = time.time() - search_started
        summary["harness"] = {"search_wall_s": wall, "trials_wall_s": trials_wall, "ratio": wall / trials_wall}
        progress.line(f"harness: this search took {wall:.0f} s for {trials_wall:.0f} s of trials ({wall / trials_wall:.2f}x)")
    if summary["best"]:
        write_outputs(summary, settings.study_dir)
    return summary
