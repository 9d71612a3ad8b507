"""What a search is asked to do (`SearchSettings`), and the device it runs on."""

from __future__ import annotations

import os
from dataclasses import dataclass

from autocompile.engine.scoring import DEFAULT_HORIZON
from autocompile.engine.storage import check_study_name
from autocompile.errors import UserError

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
    horizon: int | None = DEFAULT_HORIZON  # None: the budget's, once the first speed is measured (engine/horizon.py)
    batch_size: int | None = None
    seq_len: int | None = None
    seed: int = 0
    fixed: dict | None = None
    space_file: str | None = None  # a space file (TOML or JSON): [fix], [exclude], [inductor]
    measure: dict | None = None
    # trials above it are infeasible; "eager": above eager's peak as the workload built it (StudyView.memory_limit)
    max_memory_gb: float | str | None = None
    finalists: int = DEFAULT_FINALISTS  # re-measured at the end, alternating with eager (0: none)
    prune: bool = True  # stop trials that can no longer win
    triage: bool = True  # rerun compile failures with simpler backends to name the failing layer
    trace: bool = False  # each trial writes a TORCH_TRACE (for tlparse reports in the dashboard)
    memory_path: str | None = None  # the knowledge store (default: ~/.cache/autocompile/knowledge.db)
    screen: int | None = None  # screen trials at this many blocks first (autocompile.engine.screening)
    shared_cache: bool = False  # trials after the baselines share one compile cache (autocompile.trial.caches)
    nproc: int = 1  # ranks per trial, on one host (autocompile.trial.ranks)
    parallel: str = "none"  # none | ddp | fsdp2: how the ranks share the model (autocompile.parallel)
    prestart: bool | None = None  # compiled trials forked from a process that imported torch once (None: on)

    def __post_init__(self):
        check_study_name(self.study)
        check_parallel(self.parallel, self.nproc, self.device)

    def prestarts(self) -> bool:
        """Whether compiled trials are forked from a process that imported torch once
        (autocompile.trial.prestart); on unless --no-prestart."""
        return self.prestart is not False

    @property
    def baseline_limit_s(self) -> float:
        """The baselines are what every trial is compared to: they may be given longer."""
        return self.baseline_timeout_s or self.trial_timeout_s

    @property
    def study_dir(self) -> str:
        return os.path.join(self.directory, self.study)


def resolve_device(requested: str | None, need_gpu: bool = True) -> str:
    """cuda when there is a GPU, else cpu; a clear error when a GPU is asked for and absent
    (unless need_gpu is False: listing a CUDA search space needs no GPU)."""
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if need_gpu and not torch.cuda.is_available():
            raise UserError(f"--device {requested}: no CUDA GPU is visible to torch {torch.__version__}; use --device cpu")
        return requested
    if requested != "cpu":
        raise UserError(f"--device must be cuda or cpu, not {requested!r}")
    return requested


def check_parallel(parallel: str, nproc: int, device: str = "cpu") -> None:
    """--parallel and --nproc: several ranks need a strategy; a strategy needs what torch offers."""
    if parallel not in ("none", "ddp", "fsdp2"):
        raise UserError(f"--parallel must be none, ddp or fsdp2, not {parallel!r}")
    if not isinstance(nproc, int) or nproc < 1:
        raise UserError(f"--nproc must be a positive integer, not {nproc!r}")
    if nproc > 1 and parallel == "none":
        raise UserError(f"--nproc {nproc}: ranks share the model by a strategy: add --parallel ddp or --parallel fsdp2")
    if device.startswith("cuda") and nproc > 1:
        import torch

        if torch.cuda.device_count() < nproc:
            raise UserError(f"--nproc {nproc} on CUDA needs a GPU per rank; torch sees {torch.cuda.device_count()}")
    if parallel == "fsdp2":
        from autocompile.space.capabilities import has_fully_shard

        if not has_fully_shard():
            import torch

            raise UserError(f"--parallel fsdp2: torch {torch.__version__} has no torch.distributed.fsdp.fully_shard")


def group_gpus(gpus: list[str] | None, nproc: int) -> list[str] | None:
    """--gpus split into groups of --nproc, one worker each ("0,1", "2,3"): a worker's trials run a
    rank on each GPU of its group."""
    if not gpus or nproc == 1:
        return gpus
    if len(gpus) % nproc:
        raise UserError(f"--gpus gives {len(gpus)} GPUs, which do not split into groups of --nproc {nproc}")
    return [",".join(gpus[i : i + nproc]) for i in range(0, len(gpus), nproc)]
