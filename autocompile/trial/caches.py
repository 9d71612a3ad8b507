"""Compile caches. A baseline compiles cold, into a folder of its own (Inductor's and Triton's caches
under DIR/STUDY/trials/NNNN/cache), which is removed when it ends unless it ran cleanly and may
become a finalist: then its rerun in the finalist round starts from the code it compiled. With a
shared cache (`--shared-cache`), the trials after the baselines compile into one folder of the
study's (DIR/STUDY/cache), so a graph is compiled once in the study, and a trial's cold warm-up
is reconstructed from the study's ledger of cold compiles (`autocompile.trial.graphs`). Screens
share one folder (DIR/STUDY/screens/cache).

Triton's kernel binaries are not shared: a trial of the shared cache compiles them into a folder of
its own (`triton_root`), removed when it ends. A graph the shared cache has brings its kernels with it
(Inductor bundles them into its FX graph cache entry), so a hit compiles nothing either way; but a
graph the cache lacks would otherwise find the kernels other graphs compiled, and its compile stand
in the ledger as a cold one (four model graphs in 4.4-5.7 s so, 5.7-8.1 s cold: docs/decisions.md).
Nor are the autotuner's best configs of
Triton's kernels, which Inductor keeps beside the kernels' source in the shared folder: a trial of
the shared cache turns that cache off (`graphs.cold_autotune`)."""

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


def triton_root(trial_dir: str, cache: str, shared_cache: bool) -> str:
    """Where a trial's Triton cache lies: its own folder where `cache` is a study's shared one (see
    the module's docstring), else under `cache`."""
    return own(trial_dir) if shared_cache else cache


def shared(study_dir: str) -> str:
    """The study-wide cache folder (made on first use)."""
    path = os.path.join(study_dir, FOLDER)
    os.makedirs(path, exist_ok=True)
    return path


def has_shared(study_dir: str) -> bool:
    return os.path.isdir(os.path.join(study_dir, FOLDER))


def drop_shared(study_dir: str) -> None:
    shutil.rmtree(os.path.join(study_dir, FOLDER), ignore_errors=True)


def warm_cpu_toolchain(toolchain_dir: str | None, notes: list[str]) -> None:
    """Probe the CPU's vector ISA once per machine, outside the trial's cold cache.

    Inductor compiles a few test programs (about 20 s on 2 cores) to learn which vector
    instructions the CPU has, and caches the answer in its cache folder. That is a fact about
    the machine, not a compile of the model, so it is cached in a shared folder and kept out
    of the warm-up measured.
    """
    if not toolchain_dir:
        return
    trial_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = toolchain_dir
    try:
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.pick_vec_isa()
        notes.append("CPU vector-ISA probe cached in a shared folder, not counted in warm-up")
    except Exception as exc:  # a release without it: the probe then lands in the warm-up
        notes.append(f"CPU vector-ISA probe not pre-run ({type(exc).__name__}); it counts in warm-up")
    finally:
        if trial_cache is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = trial_cache
