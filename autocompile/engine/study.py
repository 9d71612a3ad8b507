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
eager, and the winner is chosen from that round (`autocompile.engine.finalists`). Each trial is run
and told by `autocompile.engine.runner`; the order of proposals is `autocompile.engine.claims` and
`autocompile.engine.strategy`.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
import warnings

import optuna

from autocompile.errors import UserError
from autocompile.engine.finalists import reserve_note, run_finalists
from autocompile.engine import knowledge
from autocompile.engine.knowledge import ColdRuns, CompileCuts, Failures, store_path
from autocompile.engine.knowledge import device_name as _device_name
from autocompile.engine import horizon
from autocompile.engine.runner import Progress, Runner
from autocompile.engine.screening import make_pruner
from autocompile.engine.settings import DEFAULT_FINALISTS, SearchSettings  # noqa: F401
from autocompile.space import Capabilities, SearchSpace, WorkloadTraits
from autocompile.engine.storage import (
    check_study_name,  # noqa: F401 (re-exported)
    counted,
    create_or_load,
    fail_stale,  # noqa: F401 (re-exported)
    load_study,  # noqa: F401 (re-exported)
    open_storage,
    set_budget,
    storage_url,
)
from autocompile.engine.strategy import compile_cut_values
from autocompile.trial import caches, prestart, reap_orphans
from autocompile.trial.result import Status
from autocompile.engine.records import Record, Role, trial_folder
from autocompile.engine.studyview import EAGER_PEAK, view_of


def _sampler(seed: int):
    """TPE over the conditional space (multivariate, grouped); it reads each trial's constraint."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5)


def workload_traits(workload, options) -> WorkloadTraits:
    """The model's repeated blocks, found on the meta device (no memory, no weights)."""
    from autocompile.apply import find_repeated_blocks
    from autocompile.space.optimizer import clip_refusal, foreach_map_refusal, step_in_backward_refusal
    from autocompile.workloads import checkpointing, kernels, packing
    from autocompile.workloads.layout import resolve

    regions, fusable, refusal, found, blocks = None, False, WorkloadTraits.foreach_map_refusal, None, 0
    clip = "" if workload.framework != "trainer" else "the optimizer is not known"
    overlap = WorkloadTraits.step_in_backward_refusal
    flex = varlen = sdpa = False
    pool = _cpu_pool(workload, options)
    layout, source = resolve(workload, None, {})
    experts, other_experts, experts_refused = "", (), {}
    lm_loss = WorkloadTraits.lm_loss_refusal
    shape = _batch_shape(workload, options, pool)
    try:
        import dataclasses

        model, optimizer = workload.build(dataclasses.replace(options, device="meta"))
        regions = find_repeated_blocks(model)
        blocks = sum(len(model.get_submodule(path)) for path in regions)
        fusable = "fused" in getattr(optimizer, "defaults", {})
        refusal = foreach_map_refusal(optimizer)
        clip = clip_refusal(workload, optimizer)
        overlap = step_in_backward_refusal(workload, optimizer)
        found = checkpointing.find(model, workload.checkpointing)
        layout, source = resolve(workload, model, pool[0] if pool else {})
        causal = bool(layout and layout.causal)
        flex = causal and packing.flex_switchable(model)
        varlen = causal and packing.varlen_switchable(model)
        sdpa = kernels.sdpa_attention(model)
        tokens = shape.get("rows", 1) * (shape["lengths"][1] if shape.get("lengths") else workload.max_len(options))
        experts, other_experts, experts_refused = kernels.experts_implementations(model, tokens)
        lm_loss = kernels.lm_loss_refusal(model, workload.own_loss)
        del model, optimizer
    except UserError:
        raise  # the workload cannot be built here (a missing package): say so
    except Exception:
        regions = None  # found when a trial builds the model
        found = checkpointing.find(None, workload.checkpointing)
    return WorkloadTraits(
        varying=dict(workload.varying),
        parts=tuple(workload.parts),
        regions=regions,
        fusable_optimizer=fusable,
        criterion=workload.split_loss,
        schedule=workload.schedule is not None,
        **shape,
        foreach_map_refusal=refusal,
        clip_refusal=clip,
        step_in_backward_refusal=overlap,
        checkpointing=found.where if found else None,
        selective_checkpointing=bool(found and found.selective),
        checkpoint_in_forward=bool(found and found.in_forward),
        pack_refusal=packing.refusal(workload, layout, source),
        layout_source=source if layout else None,
        flex_attention=flex,
        varlen_attention=varlen,
        sdpa_attention=sdpa,
        pad_multiple=workload.pad_multiple,
        experts=experts,
        other_experts=other_experts,
        experts_refused=experts_refused,
        lm_loss_refusal=lm_loss,
        blocks=blocks,
    )


def _cpu_pool(workload, options) -> list[dict]:
    """The workload's batch pool, built on the CPU (cheap, and the same lengths and keys as on any device);
    empty where it has no varying dimension or cannot build them there."""
    import dataclasses

    if not workload.varying:
        return []
    try:
        return workload.batches(dataclasses.replace(options, device="cpu"), workload.batch_pool)
    except Exception:
        return []


def _batch_shape(workload, options, pool: list[dict]) -> dict:
    """The varying dimension's range (`lengths`: the shortest length in the batch pool, the longest the
    workload allows) and a batch's rows. A workload without a pool on the CPU (`_cpu_pool`) gives neither,
    and no rule counts its shapes."""
    if not pool:
        return {"lengths": None}
    key, (dim, _) = next(iter(workload.varying.items()))
    shortest = min(batch[key].shape[dim] for batch in pool)
    return {"lengths": (shortest, max(workload.max_len(options), shortest)), "rows": max(b[key].shape[0] for b in pool)}


def build_space(
    model: str,
    device: str,
    batch_size=None,
    seq_len=None,
    seed=0,
    fixed=None,
    space_file: str | None = None,
    memory_bound: str | None = None,
    parallel: str = "none",
) -> SearchSpace:
    """The space for a workload on a device; `space_file` narrows or extends it (see load_space_file);
    `memory_bound` says why memory is the constraint, where it is (see memory_bound)."""
    from autocompile.space import load_space_file
    from autocompile.workloads import WorkloadOptions, get_workload

    narrowing = load_space_file(space_file) if space_file else None  # a bad file fails before any build
    workload = get_workload(model)
    if workload.gpu_only and not device.startswith("cuda"):
        raise UserError(f"model {model!r} needs a GPU (use tiny-llama or tiny-captioner on the CPU)")
    options = WorkloadOptions(device=device, batch_size=batch_size, seq_len=seq_len, seed=seed)
    traits = dataclasses.replace(workload_traits(workload, options), memory_bound=memory_bound)
    return SearchSpace(Capabilities.detect(device), traits, fixed=fixed, space_file=narrowing, parallel=parallel)


NEAR_CAPACITY = 0.9  # eager's peak at this share of the device's memory or more: memory is the constraint


def memory_bound(max_memory_gb: float | None, device: str, study=None) -> str | None:
    """Why memory is the constraint of a search, or None: --max-memory-gb, or the study's eager
    baseline ran out of memory or peaked within 10% of the device's memory."""
    if max_memory_gb == EAGER_PEAK:
        return "--max-memory-gb eager: no more than eager's peak as the workload built it"
    if max_memory_gb is not None:
        return f"--max-memory-gb {max_memory_gb:g}"
    eager = view_of(study).first_of(Role.EAGER, Status.OK, Status.OOM) if study else None
    if eager is None or not device.startswith("cuda"):
        return None
    eager = Record.of(eager)
    if eager.status == Status.OOM:
        return "eager ran out of the device's memory"
    import torch

    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    if (eager.peak_mem_gb or 0) >= NEAR_CAPACITY * total:
        return f"eager peaked at {eager.peak_mem_gb:.1f} of the device's {total:.1f} GiB"
    return None


def _check_resume(study, settings: SearchSettings) -> None:
    expected = {
        "model": settings.model,
        "device": settings.device,
        "batch_size": settings.batch_size,
        "seq_len": settings.seq_len,
        "seed": settings.seed,
    }
    if settings.parallel != "none":  # part of the study's identity; absent in a single-process study's
        expected.update(parallel=settings.parallel, nproc=settings.nproc)
    stored = study.user_attrs.get("settings")
    if stored is None:
        study.set_user_attr("settings", expected)
        if settings.horizon is not None:  # else the budget's, once the first speed is measured (engine/horizon.py)
            study.set_user_attr("horizon", settings.horizon)
        study.set_user_attr("created", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        return
    for key in ("parallel", "nproc"):
        if stored.get(key, {"parallel": "none", "nproc": 1}[key]) != getattr(settings, key):
            raise UserError(
                f"study {settings.study!r} was searched with --parallel {stored.get('parallel', 'none')} "
                f"--nproc {stored.get('nproc', 1)}, not --parallel {settings.parallel} --nproc "
                f"{settings.nproc}: pass the same, or choose a new --study"
            )
    for key, value in expected.items():
        if stored.get(key) != value:
            raise UserError(
                f"study {settings.study!r} was made with {key}={stored.get(key)!r}, not {value!r}: "
                f"pass the same, or choose a new --study"
            )


def open_search(
    settings: SearchSettings, progress: Progress | None = None, callbacks=(), workers: int = 1, seed_offset: int = 0
) -> Runner:
    """Open (or create) the study of `settings` and a runner for it: trials of dead workers failed
    (and tried again), their orphaned trial processes killed. Raises UserError on bad input."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.time()
    bound = memory_bound(settings.max_memory_gb, settings.device)
    space = _search_space(settings, bound)
    pruner = make_pruner(settings)  # a --screen that cannot work fails before the storage is made
    url = storage_url(settings.storage, settings.directory, settings.study, workers)
    storage = open_storage(url, create_dir=settings.study_dir)
    study = create_or_load(
        settings.study, storage, direction="maximize", sampler=_sampler(settings.seed + seed_offset), pruner=pruner
    )
    _check_resume(study, settings)
    horizon.resume(settings, study)
    if not bound and (bound := memory_bound(None, settings.device, study)):  # a resumed study's eager says so
        space = _search_space(settings, bound)
    horizon.name_objective(study, settings.horizon)
    progress = progress or Progress(settings.trials)
    _announce(settings, space, url, progress)
    _resume_after_dead_workers(study, settings, progress)
    return _runner(study, storage, url, settings, progress, space, callbacks, started)


def _search_space(settings: SearchSettings, bound: str | None) -> SearchSpace:
    """The space of the search's workload on its device, `bound` saying why memory is the constraint."""
    return build_space(
        settings.model,
        settings.device,
        settings.batch_size,
        settings.seq_len,
        settings.seed,
        settings.fixed,
        settings.space_file,
        bound,
        settings.parallel,
    )


def _announce(settings: SearchSettings, space: SearchSpace, url: str, progress: Progress) -> None:
    """The search's first lines: what it searches, where, and how its horizon will be found."""
    progress.line(
        f"autocompile search: {settings.model} on {_device_name(settings.device)} "
        f"(torch {space.caps.torch_version}), study {settings.study!r} in {url}"
    )
    if settings.horizon is None:
        progress.line(
            f"horizon: the steps eager runs in {horizon.RUNS_PER_SEARCH} times this search's budget, once "
            "it is measured (--horizon-steps to say how long your training run is)"
        )


def _resume_after_dead_workers(study, settings: SearchSettings, progress: Progress) -> None:
    """The orphaned trial processes of dead workers killed and their trials failed (so they are tried
    again); what a resumed study has finished already, said."""
    reap_orphans(settings.study_dir)
    stale = fail_stale(study)
    finished = [t for t in study.trials if t.state.is_finished()]
    if finished:
        progress.line(
            f"resuming study {settings.study!r}: {len(finished)} trials already finished"
            + (f", {stale} interrupted ones marked failed" if stale else "")
        )


def _runner(study, storage, url: str, settings: SearchSettings, progress: Progress, space, callbacks, started: float) -> Runner:
    """The runner of the search, the knowledge store's observers of this model here (failures, compile
    cuts, cold runs, gains, paces, peaks, plain compiles) called first after each trial."""
    path = store_path(settings.memory_path)
    key = (space.caps.torch_version, _device_name(settings.device), settings.model)
    failures, cuts, cold = Failures(path, space, key[1], url), compile_cuts(path, *key), ColdRuns(path, *key)
    gains, plain = knowledge.MoveGains(path, *key), knowledge.PlainCompiles(path, *key)
    paces = knowledge.Paces(path, key[0], key[1], knowledge.workload(vars(settings)))
    peaks = knowledge.Peaks(path, key[0], key[1], knowledge.workload(vars(settings)))
    _plan_cold_runs(study, cold, progress)
    return Runner(
        study,
        storage,
        url,
        settings,
        progress,
        callbacks=(failures, cuts, cold, gains, paces, peaks, plain, *callbacks),
        deadline=None,
        space=space,
        failures=failures,
        cuts=cuts,
        gains=gains,
        paces=paces,
        peaks=peaks,
        plain=plain,
        started=started,
    )  # the knowledge store's observers first


def compile_cuts(path: str, torch: str, device: str, model: str) -> CompileCuts:
    """The store's compile cuts of one model here, told what the search follows there (`strategy.COMPILE_HEAVY`
    and the whole model as one graph: `strategy.compile_cut_values`)."""
    return CompileCuts(path, torch, device, model, heavy=compile_cut_values)


def learn_from(path: str, study) -> dict[str, int]:
    """Feed a finished study into the store's compile cuts, cold runs, gains, paces and peaks, keyed by its model
    (its workload, for paces and peaks) and the torch and device its trials recorded (`knowledge.study_key`): how many trials
    each stored."""
    key = knowledge.study_key(study)
    workload = knowledge.workload(study.user_attrs["settings"])
    return knowledge.learn(
        study,
        {
            "cuts": compile_cuts(path, *key),
            "cold": ColdRuns(path, *key),
            "gains": knowledge.MoveGains(path, *key),
            "paces": knowledge.Paces(path, key[0], key[1], workload),
            "peaks": knowledge.Peaks(path, key[0], key[1], workload),
            "plain": knowledge.PlainCompiles(path, *key),
        },
    )


def _plan_cold_runs(study, cold: ColdRuns, progress: Progress) -> None:
    """The study records what the device's earlier cold runs of the finalist round showed of the
    reconstruction (`knowledge.cold`), which its own round plans with (`cost.cold_scale`), and says so."""
    prior = cold.scale()
    study.set_user_attr("cold_scale", prior)
    if prior:
        progress.line(
            f"the finalist round plans a cold run at {prior['scale']:.2f}x the seconds a reconstructed "
            f"warm-up adds: what {prior['runs']} earlier cold {'run' if prior['runs'] == 1 else 'runs'} "
            f"of this model here took ({', '.join(prior['from'][-3:])})"
        )


def plan(runner: Runner, trials: int, timeout_s: float | None, gpus: int = 1) -> dict:
    """The study's budget from now (`trials` more, within `timeout_s`, the finalist round on `gpus` GPUs),
    stored with the search's settings for workers that join it (autocompile.engine.workers)."""
    runner.deadline = None if timeout_s is None else time.time() + timeout_s
    note = reserve_note(runner.study, runner.settings.finalists, timeout_s, runner.settings.trial_timeout_s, gpus)
    if note:
        runner.progress.line(note)
    runner.study.set_user_attr(
        "search_settings",
        {k: v for k, v in dataclasses.asdict(runner.settings).items() if k not in ("storage", "directory", "memory_path")},
    )
    return set_budget(runner.study, counted(runner.study) + trials, runner.deadline, gpus)


def conclude(runner: Runner, gpus: list[str] | None = None) -> Runner:
    """The end of a search: its finalist round, once (on `gpus` at once, the workers'; the summary is the
    outputs' part: outputs/table.py), then the compile caches the trials kept, but the finalists' (a resumed
    search's round may use them)."""
    verdict = run_finalists(runner, runner.settings.finalists, gpus=gpus) if runner.settings.finalists > 0 else None
    keep = set((verdict or {}).get("finalists", []))
    for t in runner.study.get_trials(deepcopy=False):
        if t.number not in keep:
            caches.drop(trial_folder(runner.settings.study_dir, t.number))
    if not keep:
        caches.drop_shared(runner.settings.study_dir)
    prestart.stop_all()
    return runner


def search_study(settings: SearchSettings, progress: Progress | None = None, callbacks=()) -> Runner:
    """Run (or resume) a search in this process, the finalist round included; the runner, whose study
    holds every trial. Raises UserError on bad input. `callbacks` are called as
    callback(study, frozen_trial) after each trial is told to the study."""
    from autocompile.engine.claims import work

    runner = open_search(settings, progress, callbacks)
    try:
        work(runner, plan(runner, settings.trials, settings.timeout_s))
        return conclude(runner)
    finally:
        prestart.stop_all()  # the process started for a trial that will not come
