"""Cheaper screening: trials of the model with its repeated blocks cut to k, promoted to full trials
successive-halving style.

A screened trial builds the workload with each list of repeated blocks (the regional scope's
blocks, as `find_repeated_blocks` finds them) cut to its first k, and measures it the way a full
trial is measured. Its score is its steady speed against eager's at the same k (measured once per
study and k, kept in the study attr `screened_eager`), reported to Optuna as the trial's
intermediate value at step k. `ScreeningPruner` hands that step to Optuna's
SuccessiveHalvingPruner (reduction factor 2): the top half of the screened trials so far go on to
a full trial, the others are pruned. A full trial's own steps (its optimistic scores, from step
k + 1) go to `CannotWinPruner` as before. Screens share one compile cache (DIR/STUDY/screens/cache):
only their steady speed counts, which a cache hit does not change. A full trial never shares it.
"""

from __future__ import annotations

import dataclasses
import os

import optuna

from autocompile.errors import UserError
from autocompile.engine.records import Role, set_attrs, shortened, to_attrs
from autocompile.engine.scoring import CannotWinPruner, judge
from autocompile.engine.storage import same_machine, this_boot
from autocompile.trial import TrialRequest, run_trial
from autocompile.trial.result import Status

SCREENS = "screens"  # DIR/STUDY/screens/: the screened eager runs and the screens' shared compile cache
REDUCTION_FACTOR = 2  # the top 1/2 of the screened trials are promoted


def block_counts(model: str, options) -> dict[str, int] | None:
    """{path: blocks} of the workload's lists of repeated blocks, found on the meta device
    (None: the workload cannot be built there, so they are found only when a trial builds it)."""
    from autocompile.apply import find_repeated_blocks
    from autocompile.workloads import get_workload

    workload = get_workload(model)
    try:
        built, _ = workload.build(dataclasses.replace(options, device="meta"))
    except Exception:
        return None
    return {path: len(built.get_submodule(path)) for path in find_repeated_blocks(built)}


def check_blocks(model: str, k: int, counts: dict[str, int] | None) -> None:
    """A one-line UserError for a k that would not screen anything."""
    if k < 2:
        raise UserError(f"screening at {k} blocks: give at least 2 (one block is no longer a repeated block)")
    if counts is None:
        return
    if not counts:
        raise UserError(
            f"model {model!r} has no repeated blocks (a ModuleList of blocks of one class) to cut: it cannot be screened"
        )
    if k >= max(counts.values()):
        found = ", ".join(f"{path}: {n}" for path, n in counts.items())
        raise UserError(
            f"screening at {k} blocks: the model's repeated blocks ({found}) are not longer, "
            "so a screen would be a full trial; give fewer"
        )


class ScreeningPruner(optuna.pruners.BasePruner):
    """The screen's verdict (the value reported at step `blocks`) from Optuna's
    SuccessiveHalvingPruner, reduction factor 2: a screened trial goes on if it is in the top half
    of the screened trials so far (the first always does). Any other step (a full trial's
    optimistic score) is judged by CannotWinPruner."""

    def __init__(self, blocks: int):
        self.blocks = blocks
        self.halving = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=blocks, reduction_factor=REDUCTION_FACTOR, min_early_stopping_rate=0
        )
        self.cannot_win = CannotWinPruner()

    def prune(self, study, trial) -> bool:
        if trial.last_step == self.blocks:
            return self.halving.prune(study, trial)
        return self.cannot_win.prune(study, trial)


def make_pruner(settings):
    """The search's pruner: ScreeningPruner under `settings.screen` (checked against the
    model's blocks first), CannotWinPruner otherwise."""
    if not settings.screen:
        return CannotWinPruner()
    from autocompile.workloads import WorkloadOptions

    options = WorkloadOptions(
        device=settings.device, batch_size=settings.batch_size, seq_len=settings.seq_len, seed=settings.seed
    )
    check_blocks(settings.model, settings.screen, block_counts(settings.model, options))
    return ScreeningPruner(settings.screen)


def screen_request(settings, config: dict, k: int, trial_dir: str, timeout_s: float) -> TrialRequest:
    """A trial of `config` at k blocks, with the study's shared screen cache."""
    return TrialRequest(
        model=settings.model,
        config=config,
        device=settings.device,
        trial_dir=trial_dir,
        batch_size=settings.batch_size,
        seq_len=settings.seq_len,
        seed=settings.seed,
        timeout_s=timeout_s,
        measure=settings.measure or {},
        blocks=k,
        cache_dir=os.path.join(settings.study_dir, SCREENS, "cache"),
        nproc=settings.nproc,
        parallel=settings.parallel,
    )


def screen_summary(record: dict, eager: dict, k: int) -> dict:
    """What a screen keeps on its trial: its status, speed and score (its steady speed as a
    multiple of eager's at k blocks)."""
    ok = record["status"] == Status.OK
    return {
        "blocks": k,
        "status": record["status"],
        "reason": record.get("reason", ""),
        "steps_per_s": record.get("steps_per_s") if ok else None,
        "score": record["steps_per_s"] / eager["steps_per_s"] if ok else None,
        "warmup_s": record.get("warmup_s"),
        "wall_s": record["wall_s"],
        "compile_caches": record.get("compile_caches"),
    }


def _limit(runner, limit_s: float, keep_s: float) -> float:
    remaining = runner.remaining()
    return limit_s if remaining is None else max(1.0, min(limit_s, remaining - keep_s))


def screened_eager(runner, k: int, keep_s: float = 0.0) -> dict | None:
    """Eager at k blocks, measured once per study, k and machine (study attr `screened_eager`): the
    reference of the screened scores. A study resumed on another machine measures it again there.
    None (said on the progress) when it did not run cleanly."""
    study, settings = runner.study, runner.settings
    done = study.user_attrs.get("screened_eager", {})
    if str(k) in done and same_machine(done[str(k)], {"boot": this_boot()}):
        return done[str(k)]
    from autocompile.space import EAGER

    folder = os.path.join(settings.study_dir, SCREENS, f"eager-{k}-blocks")
    record = run_trial(screen_request(settings, dict(EAGER), k, folder, _limit(runner, settings.baseline_limit_s, keep_s)))
    runner.trials_wall += record["wall_s"]
    if record["status"] != Status.OK:
        runner.progress.line(
            f"screening: eager at {k} blocks ended {record['status']} ({record.get('reason', '')}): "
            "this trial is measured in full"
        )
        return None
    kept = {key: record.get(key) for key in ("steps_per_s", "warmup_s", "losses", "cv", "wall_s", "torch", "device_name")}
    kept["boot"] = this_boot()
    study.set_user_attr("screened_eager", {**done, str(k): kept})
    runner.progress.line(f"screening: eager at {k} blocks runs {kept['steps_per_s']:.3g} steps/s")
    return kept


def screen_trial(runner, trial, config: dict, role: Role, k: int, keep_s: float = 0.0) -> bool:
    """Measure `config` at k blocks as `trial`'s first rung; True when it goes on to a full trial.
    A pruned one is told to the study here. A screen that did not run cleanly goes on too: its
    full trial is triaged and remembered as any failure is. Under --no-prune every screen goes on,
    with the pruner's verdict kept (`screen.promoted`): both scores of every trial, for screen-check."""
    from autocompile.apply import describe_config

    settings, progress = runner.settings, runner.progress
    eager = screened_eager(runner, k, keep_s)
    if eager is None:
        return True
    set_attrs(trial, {"role": role, "config": config})  # known even if the search dies during the screen
    label = describe_config(config)
    folder = os.path.join(settings.study_dir, "trials", f"{trial.number:04d}", "screen")
    beat = getattr(runner.storage, "record_heartbeat", None)
    record = run_trial(
        screen_request(settings, config, k, folder, _limit(runner, settings.trial_timeout_s, keep_s)),
        on_event=lambda e: progress.phase(trial.number, f"{label} at {k} blocks", e),
        heartbeat=beat and (lambda: beat(trial._trial_id)),
    )
    runner.trials_wall += record["wall_s"]
    screen = screen_summary(judge(record, eager, settings.device, None), eager, k)
    set_attrs(trial, {"screen": shortened(screen)})  # a long reason cut; the screen's folder has it all
    if screen["status"] != Status.OK:
        progress.line(f"  trial {trial.number}: at {k} blocks it ended {screen['status']}: measured in full")
        return True
    trial.report(screen["score"], k)
    screen["promoted"] = not trial.should_prune()
    set_attrs(trial, {"screen": shortened(screen)})  # a long reason cut; the screen's folder has it all
    if screen["promoted"] or not settings.prune:  # --no-prune: every screen goes on (both measured)
        progress.line(
            f"  trial {trial.number} {label}: at {k} blocks {screen['score']:.3g}x eager: "
            + ("promoted to a full trial" if screen["promoted"] else "measured in full anyway (--no-prune)")
        )
        return True
    _tell_pruned(runner, trial, config, role, screen)
    return False


def _tell_pruned(runner, trial, config: dict, role: Role, screen: dict) -> None:
    from autocompile.apply import describe_config

    record = {
        "status": Status.PRUNED,
        "config": config,
        "role": role,
        "wall_s": screen["wall_s"],
        "score": 0.0,
        "notes": [],
        "reason": f"screened at {screen['blocks']} blocks: {screen['score']:.3g}x eager, "
        "below the top half of the screened trials",
    }
    set_attrs(trial, to_attrs(record))
    runner.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    runner.progress.done += 1
    runner._report(trial.number, describe_config(config), record)  # the runner's own line and callbacks
    runner._told(trial)
