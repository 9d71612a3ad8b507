"""A study's trial's spec.json rebuilt from the study's storage, for `autocompile repro` where the trial's folder is gone.

A committed study keeps its study.db but leaves out the trials' folders (studies/README.md), so
`repro --study S --trial N` on a copy of it finds no trials/NNNN/spec.json. The storage holds what
the trial ran: the study's workload and settings (the study's user attribute `settings`: model,
device, batch size, sequence length, seed, and --parallel/--nproc where they are not the
defaults; `search_settings`, where the search wrote it (older studies lack it): the trial limits and the
measurement knobs), and the trial's record as its user attributes (the configuration whole, the
status, the reason, triage's failing layer). `rebuild` writes the spec.json the trial wrote
(autocompile.trial.process), marked `rebuilt_from`, so that the rerun and the minifier run as they
do with the folder. The snippet is not stored whole: the rerun renders it again from the
configuration (the worker's one code path, with the trial's own header), and an unreduced repro
takes it from there. A trial that never ran (waiting, still running or its worker gone before it
told the study anything, or no record) keeps the one-line error.
"""

from __future__ import annotations

import json
import os

import optuna

from autocompile.engine.records import BASELINES, snippet_header
from autocompile.errors import UserError
from autocompile.trial.process import default_toolchain_dir

SPEC = "spec.json"
TRIAL_LIMIT_S = 900.0  # SearchSettings.trial_timeout_s's default, for a study that did not store its own


def has_spec(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, SPEC))


def check_ran(trial, record: dict) -> None:
    """A one-line error unless the study's record says the trial ran (its process started)."""
    state = trial.state
    if state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING) and not record.get("status"):
        why = "it is queued" if state == optuna.trial.TrialState.WAITING else "it is running, or its worker died first"
        raise UserError(f"trial {trial.number} never ran to a record ({why}; state {state.name}): nothing to rerun")
    if not record.get("status") or "config" not in record:
        raise UserError(f"trial {trial.number} has no record in the study (state {state.name}): it never ran to one")


def rebuild(study, trial, folder: str, record: dict) -> str:
    """Write `folder`/spec.json for `trial` from the study's storage (the folder made if absent); its path."""
    settings = study.user_attrs.get("settings") or {}
    if not settings.get("model"):
        raise UserError(
            f"study {study.study_name!r} stores no workload settings, and trial {trial.number}'s "
            f"folder {folder} is gone: nothing to rebuild its rerun from"
        )
    search = study.user_attrs.get("search_settings") or {}
    spec = {
        "model": settings["model"],
        "config": record["config"],
        "device": settings["device"],
        "trial_dir": os.path.abspath(folder),
        "batch_size": settings.get("batch_size"),
        "seq_len": settings.get("seq_len"),
        "seed": settings.get("seed", 0),
        "toolchain_dir": default_toolchain_dir(),
        "header": snippet_header(settings["model"], study.study_name, trial.number),
        "blocks": None,
        "timeout_s": _limit_s(search, record.get("role")),
        "nproc": settings.get("nproc", 1),
        "parallel": settings.get("parallel", "none"),
        **(search.get("measure") or {}),
        "rebuilt_from": (
            f"the storage of study {study.study_name!r} (trial {trial.number}'s record, the study's "
            "settings): the trial's folder was gone"
        ),
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, SPEC)
    with open(path, "w") as f:
        json.dump(spec, f, indent=1)
    return path


def _limit_s(search: dict, role: str | None) -> float:
    """The time limit the trial ran under, as the study stored it (SearchSettings.baseline_limit_s
    for a baseline), else the default trial limit."""
    limit = search.get("trial_timeout_s") or TRIAL_LIMIT_S
    return (search.get("baseline_timeout_s") or limit) if role in BASELINES else limit  # under their own limit
