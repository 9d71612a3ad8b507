"""Compile caches. A baseline compiles cold, into a folder of its own (Inductor's and Triton's caches
under DIR/STUDY/trials/NNNN/cache), which is removed when it ends unless it ran cleanly and may
become a finalist: then its rerun in the finalist round starts from the code it compiled. With a
shared cache (`--shared-cache`), the trials after the baselines compile into one folder of the
study's (DIR/STUDY/cache), so a graph is compiled once in the study, and a trial's cold warm-up
is reconstructed from the study's ledger of cold compiles (`autocompile.trial.graphs`). Screens
share one folder (DIR/STUDY/screens/cache)."""

from __future__ import annotations

import os
import shutil

FOLDER = "cache"


def own(trial_dir: str) -> str:
    """A trial's own cache folder."""
    return os.path.join(trial_dir, FOLDER)


def kept(trial_dir: str) -> str | None:
    """The cache folder a trial kept, or None."""
    path = own(trial_dir)
    return path if os.path.isdir(path) else None


def drop(trial_dir: str) -> None:
    shutil.rmtree(own(trial_dir), ignore_errors=True)


def shared(study_dir: str) -> str:
    """The study-wide cache folder (made on first use)."""
    path = os.path.join(study_dir, FOLDER)
    os.makedirs(path, exist_ok=True)
    return path


def has_shared(study_dir: str) -> bool:
    return os.path.isdir(os.path.join(study_dir, FOLDER))


def drop_shared(study_dir: str) -> None:
    shutil.rmtree(os.path.join(study_dir, FOLDER), ignore_errors=True)
