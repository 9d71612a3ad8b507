"""The warm start: the winner's compile cache, exported beside its snippet, for the snippet to load.

`export` runs the winning configuration (or a trial chosen) once more, in a trial of its own (same model, device
and settings as the study, cold caches), which saves what its warm-up compiled with
`torch.compiler.save_cache_artifacts()`: `compile-cache-torch<V>-triton<V>-<device>.bin`, its
key (torch, triton, device) in the `.json` beside it, and a copy of the snippet. The
snippet's `load_compile_cache(path)` (every snippet has it: `apply.WARM_START`) loads it only
where the key matches. `check_warm_start` measures what it saves: a trial that loads it
against the cold one.
"""

from __future__ import annotations

import os
import shutil

from autocompile.errors import UserError
from autocompile.trial import TrialRequest, run_trial
from autocompile.trial.result import Status

EXPORT_MEASURE = {"min_windows": 1, "max_windows": 1}  # the warm-up is what counts here


def chosen(study, number: int | None) -> tuple[int, dict]:
    """(trial number, configuration) of the winner, or of trial `number`: one that ran cleanly,
    compiled, on a device this machine has."""
    from autocompile.engine.studyview import best_trial

    settings = study.user_attrs.get("settings") or {}
    if "model" not in settings:
        raise UserError(f"study {study.study_name!r} does not say which model it ran (no 'settings' attribute)")
    if settings.get("device", "cpu").startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"study {study.study_name!r} ran on {settings['device']}: export it on a machine with that GPU")
    if number is None:
        trial = best_trial(study)
        if trial is None:
            raise UserError(f"study {study.study_name!r} has no trial that ran cleanly yet: nothing to export")
    elif not 0 <= number < len(study.trials):
        raise UserError(f"study {study.study_name!r} has no trial {number} (it has {len(study.trials)})")
    else:
        trial = study.trials[number]
        if trial.user_attrs.get("status") != Status.OK:
            raise UserError(f"trial {number} did not run cleanly ({trial.user_attrs.get('status', trial.state.name)})")
    config = trial.user_attrs["config"]
    if not config["compile"]:
        raise UserError(f"trial {trial.number} of study {study.study_name!r} is eager: nothing is compiled, no cache to export")
    return trial.number, config


def winner_request(study, out: str, number: int | None = None, timeout_s: float = 900.0, **measure) -> TrialRequest:
    """A trial of the study's winner (or of trial `number`), as the study ran it, with its files in `out`/trial."""
    (number, config), settings = chosen(study, number), study.user_attrs["settings"]
    return TrialRequest(
        model=settings["model"],
        config=config,
        device=settings["device"],
        trial_dir=os.path.join(out, "trial"),
        batch_size=settings.get("batch_size"),
        seq_len=settings.get("seq_len"),
        seed=settings.get("seed", 0),
        timeout_s=timeout_s,
        header=f"Compile settings for {settings['model']} (study {study.study_name!r}, trial {number}), found by autocompile.",
        measure={**EXPORT_MEASURE, **measure},
        nproc=settings.get("nproc", 1),
        parallel=settings.get("parallel", "none"),
    )


def export(study, out: str, number: int | None = None, timeout_s: float = 900.0) -> dict:
    """Run the winner (or trial `number`) once more, save its compile cache and its snippet in
    `out`; returns the trial's record, with `cache` (path, bytes, artifacts) and `snippet_path`."""
    request = winner_request(study, out, number, timeout_s, save_cache=os.path.abspath(out))
    record = run_trial(request)
    if record["status"] != Status.OK:
        raise UserError(
            f"the export run of the winner ended {record['status']}: {record.get('reason', '')} (log: {record['log']})"
        )
    if not (record.get("cache") or {}).get("path"):
        raise UserError(f"torch saved no compile cache: {(record.get('cache') or {}).get('why', 'unknown')}")
    record["snippet_path"] = os.path.join(out, "apply_compilation.py")
    shutil.copyfile(os.path.join(request.trial_dir, "apply_compilation.py"), record["snippet_path"])
    return record


def check_warm_start(study, exported: dict, number: int | None = None, timeout_s: float = 900.0) -> dict:
    """A trial of the same configuration that loads the exported cache through its snippet; returns its record."""
    out = os.path.dirname(exported["cache"]["path"])
    request = winner_request(study, out, number, timeout_s, load_cache=exported["cache"]["path"])
    request.trial_dir = os.path.join(out, "trial-warm")
    return run_trial(request)
