"""Compile caches. A trial compiles cold, into a folder of its own (Inductor's and Triton's caches
under DIR/STUDY/trials/NNNN/cache), which is removed when it ends unless it ran cleanly and may
become a finalist: then its rerun in the finalist round starts from the code it compiled. Screens
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
