"""What a trial's process reports, typed: how it ended (`Status`, the one vocabulary of a trial's
outcome, from the worker's measurement to the study's table) and the fields of its result.

The statuses are made here in `trial/` (the worker's result, the parent's records of a process
that timed out, crashed or was stopped) and by the engine (a refusal before launch, a verdict), and
read by every layer above. `Status` is a string enum: a record stored, written as JSON or shown
holds the very string of its value ("ok", "not started"), and a status read back from a study (a
plain string) compares equal to its member. The engine's record of a trial (its role, score and
verdict beside the result) is `engine.records.FullRecord` as written, `engine.records.Record` as read back.
"""

from __future__ import annotations

from enum import Enum
from typing import TypedDict


class Status(str, Enum):
    """How a trial ended."""

    OK = "ok"  # ran and measured cleanly
    INFEASIBLE = "infeasible"  # computes something else than eager, needs too much memory, or refused before launch
    PRUNED = "pruned"  # stopped, or refused before launch, because it cannot win
    TIMEOUT = "timeout"  # no result within its time limit
    COMPILE_ERROR = "compile_error"  # raised in Dynamo or Inductor
    OOM = "oom"  # ran out of memory
    CRASHED = "crashed"  # its process ended without a result
    FAILED = "failed"  # raised anything else
    DUPLICATE = "duplicate"  # proposed again, never run
    NOT_STARTED = "not started"  # not expected to fit what is left before the finalist round
    INTERRUPTED = "interrupted"  # Ctrl-C, or the search stopped during it
    # a finalist's row in the round's verdict, besides OK
    NOT_RUN = "not run"  # no time was left in the round to measure it again
    FAILED_AGAIN = "failed again"  # none of its reruns ran cleanly
    # a configuration of `screen-check` whose full run its --timeout left no time for
    NOT_MEASURED = "not measured"

    def __str__(self) -> str:
        return self.value


# Raised or crashed: what the knowledge store remembers of a value and the summary lists as a failure.
FAILURES = (Status.FAILED, Status.COMPILE_ERROR, Status.CRASHED, Status.OOM)
# Stopped before its end by its limit or the pruner: how long it had been warming up is known.
STOPPED = (Status.TIMEOUT, Status.PRUNED)

# A record's fields, in the order tables and `trial --json` show them.
RECORD_FIELDS = (
    "status",
    "reason",
    "warmup_s",
    "steps_per_s",
    "items_per_s",
    "recompiles",
    "graph_breaks",
    "peak_mem_gb",
    "score",
)


class Result(TypedDict, total=False):
    """The fields of a trial's result: what the worker measured, or how its process ended."""

    status: Status
    reason: str  # why it ended so ("" for ok)
    notes: list[str]  # what the measurement noticed on the way
    config: dict  # the configuration measured (a hard mark_dynamic that fell back: as it ran)
    wall_s: float  # the process's whole time
    log: str  # the trial's log file
    failed_phase: str  # the phase it was in when it failed or was stopped
    torch_frame: str  # the innermost torch frame of the exception
    stuck_in: str  # where a timed-out trial's stacks were
    stack: str
    events: list[dict]  # a pruned trial's measuring windows
    warmup_elapsed_s: float  # a stopped trial: how long it had been warming up
    prestarted: bool  # its imports ran before its clock started
    # what it measured
    warmup_s: float
    warmup_steps: int
    warmup_kind: str  # cold, reconstructed (from a shared cache's hits) or eager
    warmup_measured_s: float  # a reconstructed warm-up's measured one
    reconstruction: dict
    steps_per_s: float
    items_per_s: float
    unit: str
    model_flops_per_item: float  # a training step's model FLOPs per item, where the workload declares them
    model_tflops_per_s: float  # ... at the measured items/s: MFU is this over the device's peak
    window_steps: int
    window_rates: list[float]
    settling_windows: int  # the first windows left out of the steady speed, still settling (worker.settled)
    settling_s: float  # what those windows lost against the steady speed
    interval: float | None
    cv: float  # the windows' spread
    measured_steps: int
    losses: list[float]
    compiles: int
    recompiles: int
    recompiles_after_warmup: int  # Dynamo's compiles and lazy backwards after the warm-up
    cudagraph_recordings_after_warmup: int  # CUDA graphs recorded after the warm-up: a new shape under CUDA graphs
    cudagraph_recording_s_after_warmup: float  # the seconds those recordings took (each paid once per shape)
    recompile_reasons: list[str]
    recompile_limit_hit: bool
    graph_breaks: int
    graph_break_reasons: list[dict]
    graph_break_fixes: list[str]  # the Dynamo settings its breaks' hints name (DATA_DEPENDENT_CAPTURE)
    graphs: list[dict]  # the graphs it compiled and what each took
    peak_mem_gb: float
    peak_mem_kind: str
    padding_share: float
    tokens_computed: int
    compile_caches: dict
    compile_pool_s: float
    build_s: float
    blocks: int  # a screened trial's repeated blocks
    snippet: str
    regions: list[str]  # the model's repeated blocks
    model_checkpointing: str  # where the model checkpoints its activations
    torch: str
    transformers: str
    device_name: str
    autotune_local_cache: bool
    cache_loaded: object  # a warm start: what the compile cache it loaded held
    cache: dict  # `export`: the compile cache it saved
    # the numerics
    replay: dict
    rng_dependent: bool
    rng_dependent_from: int
    eager_first_loss: float
    packing_check: dict
    mark_dynamic_fallback: dict
    # several ranks
    ranks: list[dict]
    ranks_launched: int
    failed_rank: int
    # after it: triage of a compile error, where a numerics failure parts from eager
    triage: list[dict]
    failing_layer: str
    divergence: dict
    diverges_at: str
