"""The inside of one trial: build the workload, apply the snippet, warm up, measure.

Runs as ``python -m autocompile.trial.worker SPEC.json`` in a fresh process whose Inductor and
Triton caches point at empty folders (set by the parent, `autocompile.trial`), so the warm-up
measured is a cold compile. It reports its phase to an events file as it goes and writes
its measurement to a result file at the end, whatever happens; the parent turns a crash, a
hang or a kill into a record of its own.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.metadata
import json
import logging
import math
import os
import resource
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autocompile.apply import ModelInfo, alone, find_repeated_blocks, load_snippet, render_snippet
from autocompile.space import DEFAULTS, uses_cuda_graphs
from autocompile.space.capabilities import DATA_DEPENDENT_CAPTURE, compiled_autograd_api_name
from autocompile.trial import caches
from autocompile.trial.graphs import GraphLedger, read_ledger, reconstruct
from autocompile.trial.packing_check import packed_alike, real_tokens
from autocompile.trial.protocol import REPLAY_SEED, REPLAY_STEPS, REPLAY_VERSION, STACK_SIGNAL, rank_result_path
from autocompile.trial.result import Status
from autocompile.workloads import FRESH_WINDOWS

if TYPE_CHECKING:
    from autocompile.workloads import Workload, WorkloadOptions


MEASURE_MARGIN_S = 20.0  # of the trial's limit, kept for writing the result (and the replay to start)


class Events:
    """Append-only JSON lines the parent follows for progress."""

    def __init__(self, path: str):
        self.path = path

    def emit(self, **event) -> None:
        event["t"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


class CompileWatcher(logging.Handler):
    """Counts compiles, recompiles and graph breaks, and keeps their reasons.

    Reads what torch reports through its own logging (the ``recompiles`` and
    ``graph_breaks`` artifacts and the recompile-limit warning) and its compile callbacks,
    rather than private counters whose names move between releases.
    """

    def __init__(self, events: Events | None = None):
        super().__init__(level=logging.DEBUG)
        self.told = events  # told each compile that finishes: how far a compile cut by the limit got
        self.compiles_started = 0  # every compile start torch reports, CUDA graph recordings included
        self.recordings = 0  # of those, Inductor's CUDA-graph trees recording a graph (a new shape under CUDA graphs)
        self.recording_s = 0.0  # the seconds those recordings took, from their start to their end callback
        self._recording_since: float | None = None
        self.compiles_ended = 0
        self.recompile_reasons: list[str] = []
        self.graph_breaks: dict[str, int] = {}
        self.break_fixes: set[str] = set()  # the Dynamo settings the breaks' hints name
        self.limit_hits: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:
            return
        if "__recompiles" in record.name and "Recompiling function" in message:
            self.recompile_reasons.append(_shorten(message, 400))
        elif "__graph_breaks" in record.name and "Graph break" in message:
            reason = message.split("Graph Break Reason:", 1)[-1].strip()
            key = _shorten(reason, 300)
            self.graph_breaks[key] = self.graph_breaks.get(key, 0) + 1
            self.break_fixes.update(setting for setting in DATA_DEPENDENT_CAPTURE if setting in message)
        elif ("recompile_limit" in message or "cache_size_limit" in message) and "hit config." in message:
            self.limit_hits.append(_shorten(message, 400))

    def install(self, torch) -> list[str]:
        """Hook into torch; returns what could not be hooked (recorded as notes)."""
        notes = []
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
        logging.getLogger("torch._dynamo").addHandler(self)
        try:
            import torch._dynamo.callback as callback

            callback.on_compile_start(lambda *args, **kwargs: self._started(*args))
            callback.on_compile_end(lambda *args, **kwargs: self._ended())
        except (ImportError, AttributeError):
            notes.append("torch._dynamo.callback missing: compile events counted from recompile logs only")
        return notes

    def _started(self, args=None):
        self.compiles_started += 1
        if getattr(getattr(args, "callback_trigger", None), "name", None) == "CUDAGRAPH_RECORDING":
            self.recordings += 1
            self._recording_since = time.perf_counter()

    def _ended(self):
        self.compiles_ended += 1
        if self._recording_since is not None:
            self.recording_s += time.perf_counter() - self._recording_since
            self._recording_since = None
        if self.told is not None:
            self.told.emit(phase="compiling", compiled=self.compiles_ended)

    @property
    def events(self) -> int:
        return self.compiles_started + len(self.recompile_reasons)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _peak_memory_gb(torch, device: str) -> tuple[float, str]:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30, "cuda max allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process max RSS"


def _cache_counters() -> dict:
    """Inductor's and AOTAutograd's cache hits and misses so far, as torch counts them."""
    from torch._dynamo.utils import counters

    return {key: n for section in ("inductor", "aot_autograd") for key, n in counters[section].items() if "cache" in key}


def _save_compile_cache(torch, folder: str, key: dict) -> dict:
    """This process's compile artifacts (torch.compiler.save_cache_artifacts) in `folder`, in a
    file whose name carries its key (torch, triton, device), with the key in a JSON beside it."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return {"path": None, "why": "torch recorded no compile artifacts"}
    data, info = saved
    made_with = f"torch{key['torch']}-triton{key['triton'] or 'none'}-{key['device']}"
    path = os.path.join(folder, "compile-cache-" + "".join(c if c.isalnum() or c in ".+-" else "_" for c in made_with) + ".bin")
    os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    artifacts = {kind: len(ids) for kind, ids in info.artifacts.items()}
    with open(path + ".json", "w") as f:
        json.dump({"key": key, "bytes": len(data), "artifacts": artifacts}, f, indent=1)
    return {"path": path, "bytes": len(data), "artifacts": artifacts}


class Training:
    """A freshly built model and optimizer with a snippet applied: one training step at a time."""

    def __init__(self, workload, built: tuple, batches: list, snippet: str, path: str, load_cache: str | None = None):
        self.namespace = namespace = load_snippet(snippet, path)
        model, optimizer = built
        # The warm start, through the snippet as a user does it (`autocompile export --check`)
        self.cache_loaded = namespace["load_compile_cache"](load_cache) if load_cache else None
        self.train_step = workload.train_step  # a framework's own step (a Trainer's), prepare_batch inside it
        if workload.attach:  # through the framework's hook, as the user's script calls it (apply_to_trainer)
            self.model, self.optimizer, self.scheduler = workload.attach(namespace, model, optimizer)
        else:
            # Before apply_compilation: torch's LRScheduler wraps optimizer.step, and cannot wrap a compiled one.
            self.scheduler = workload.schedule(optimizer) if workload.schedule else None
            self.model, self.optimizer = namespace["apply_compilation"](model, optimizer)
        self.prepare_batch, self.batches = namespace["prepare_batch"], batches
        # A packing prepare_batch reads each sequence's length on the host, which on a GPU batch waits for the
        # GPU's queue to drain: it packs a host copy of the varying keys (the only ones it reads), as a
        # DataLoader's collate does, and what it packed goes to the GPU pinned, as pin_memory sends it.
        self.gpu = _gpu_of(batches) if "pack" in namespace and not self.train_step else None
        self.host_batches = [_on_host(batch, workload.varying) for batch in batches] if self.gpu else None
        self.workload_varying = workload.varying
        self.varying = next(iter(workload.varying), None)  # its prepared size: the tokens a step computes
        self.computed: dict[int, int] = {}  # batch index -> tokens computed for it (padding included)
        self.backward = namespace.get("backward") or (lambda loss: loss.backward())
        self.step_context = contextlib.nullcontext  # around the optimizer's step (the numerics replay sets it)
        if workload.split_loss:  # the criterion apart from the model, compiled where the config says so
            criterion = namespace["compile_loss"](workload.criterion)
            self.compute_loss = lambda batch: criterion(workload.forward(self.model, batch), batch)
        else:
            self.compute_loss = lambda batch: workload.loss(self.model, batch)

    def step(self, index: int):
        i = index % len(self.batches)
        loss = self._framework_backward(i) if self.train_step else self._backward(i)
        with self.step_context():
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _backward(self, i: int):
        """The batch prepared by the snippet, the loss and its backward."""
        if self.host_batches is None:
            batch = self.prepare_batch(dict(self.batches[i]))
        else:
            batch = _to_gpu(self.prepare_batch(dict(self.host_batches[i])), self.gpu)
        if self.varying and i not in self.computed:
            self.computed[i] = batch[self.varying].numel()
        loss = self.compute_loss(batch)
        self.backward(loss)
        return loss

    def _framework_backward(self, i: int):
        """A framework's own step up to the optimizer's (a Trainer's training_step and clipping, prepare_batch in
        its hook)."""
        if self.varying and i not in self.computed:  # the tokens computed: what prepare_batch makes of the batch
            self.computed[i] = self.prepare_batch(dict(self.batches[i]))[self.varying].numel()
        return self.train_step(self.model, dict(self.batches[i]))


def _gpu_of(batches: list):
    """The GPU the batches are on, if they are."""
    return next((value.device for batch in batches[:1] for value in batch.values() if getattr(value, "is_cuda", False)), None)


def _on_host(batch: dict, keys) -> dict:
    """The batch with `keys` copied to the host; the rest (images, say) stays where it is."""
    return {key: value.cpu() if key in keys else value for key, value in batch.items()}


def _to_gpu(batch: dict, device) -> dict:
    """What prepare_batch made on the host, on the GPU: pinned, copied without waiting for the GPU's queue."""
    return {
        key: value.pin_memory().to(device, non_blocking=True) if hasattr(value, "is_cuda") and not value.is_cuda else value
        for key, value in batch.items()
    }


@dataclass
class Setup:
    """What a trial is built from: the workload, its options and batches, and the snippet."""

    workload: Workload
    options: WorkloadOptions
    pool: int
    batches: list
    counts: list[int]
    info: ModelInfo
    snippet: str = ""
    snippet_path: str = ""


def run(spec: dict, events: Events, result: dict) -> None:
    """One trial, step by step: build, apply, warm up, measure, replay; all it finds goes into `result`."""
    events.emit(phase="building")
    start = time.perf_counter()
    if spec.get("timeout_s"):  # when measuring must end: the limit, less the time the replay and stopping take
        spec["_deadline"] = time.time() + spec["timeout_s"] - MEASURE_MARGIN_S
    import torch

    result["build_s"] = {"import_torch": time.perf_counter() - start}  # where a trial's first seconds go
    if spec.get("parallel", "none") != "none":
        from autocompile.parallel import init_ranks

        _, world, spec["device"] = init_ranks(spec["device"])
        result["ranks_launched"] = world
    mark = time.perf_counter()
    watcher, ledger = _prepare(torch, spec, result)
    result["build_s"]["prepare"] = time.perf_counter() - mark
    setup, built = _build(spec, result)
    _write_snippet(spec, result, setup)
    if spec.get("minifier_rerun"):  # `autocompile repro`'s (its paths absolute): torch's accuracy mode copies a
        os.chdir(spec["trial_dir"])  # failing graph's repro.py into the working folder, the user's otherwise
    if spec.get("replay_only"):  # the numerics replay alone, for a configuration measured before
        del built
        _replay_only(torch, spec, result, setup)
        return
    if spec.get("divergence_tolerance") is not None:  # where a numerics failure parts from eager (trial/divergence.py)
        del built
        _divergence_only(torch, spec, result, setup)
        return
    if spec.get("accuracy_module") is not None:  # that module compiled alone, for `repro --accuracy`
        _accuracy_only(torch, spec, result, setup, built)
        return
    _check_randomness(torch, spec, events, result, setup, built[0])
    if not packed_alike(torch, spec, events, result, setup, built[0]):
        return  # packed, its sequences see each other: nothing worth compiling
    training = _apply(spec, result, setup, built)
    del built  # the model and optimizer live on in `training` only
    sync = _device_sync(torch, spec["device"])
    if spec["config"]["compile"] and spec.get("compile_pool_wait", True):  # not where the warm-up is carried
        _wait_compile_pool(result)
    warm = _warm_up(training, watcher, spec, events, result, sync, setup.workload.fresh_pass or setup.pool, ledger)
    _save_cache(torch, spec, result, training)
    _measure(torch, training, watcher, warm, spec, events, result, sync, setup.counts, setup.workload)
    # Decided by every rank together: the replay's models are wrapped as the trial's (DDP, FSDP2), so a
    # rank that replayed alone would wait in their collectives for peers that had left.
    if _all_ranks(bool(result.get("rng_dependent") and spec.get("numerics_replay", True) and result["status"] == Status.OK)):
        del training  # the replay builds models of its own
        _check_numerics(torch, spec, events, result, setup, sync)


def _prepare(torch, spec: dict, result: dict) -> tuple[CompileWatcher, GraphLedger]:
    """Check the device, pre-run the CPU probe, hook a compile watcher and a graph ledger, and record the versions."""
    notes: list[str] = result["notes"]
    device, config = spec["device"], spec["config"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("CUDA was asked for but torch sees no GPU")
    if not device.startswith("cuda") and config["compile"]:
        caches.warm_cpu_toolchain(spec.get("toolchain_dir"), notes)
    watcher = CompileWatcher(Events(spec["events"]) if spec["config"]["compile"] else None)
    ledger = GraphLedger(spec.get("graph_ledger"), os.path.basename(spec.get("trial_dir", "")))
    notes += watcher.install(torch)
    if config["compile"]:
        _start_compile_pool()
    notes += ledger.install(torch)
    if config["compile"]:
        from torch._inductor import config as inductor

        result["autotune_local_cache"] = inductor.autotune_local_cache  # off under a shared cache (graphs.cold_autotune)
    _versions(torch, device, result)
    return watcher, ledger


def _start_compile_pool() -> None:
    """Start Inductor's compile workers while the model is built (as its first compile would)."""
    try:
        from torch._inductor.async_compile import maybe_warm_pool

        maybe_warm_pool()
    except (ImportError, AttributeError, RuntimeError):
        pass


def _wait_compile_pool(result: dict) -> None:
    """Wait, before the warm-up's clock starts, until Inductor's compile workers are up. Until
    they are, Inductor compiles in the trial's own process, one kernel at a time, so a trial whose
    first graphs come from a shared cache could reach its first real compile before them, where a
    cold one's workers start during its first graphs. Every compiled trial waits the same way, so
    that warm-ups (cold, shared, reconstructed) compare; the wait is kept as compile_pool_s. A finalist's
    warm rerun, whose warm-up is its first run's, does not wait (`compile_pool_wait`): the wait would be
    a sizeable share of its short warm-up (docs/decisions.md: "Evidence moved out of the code")."""
    start = time.perf_counter()
    try:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.wait_pool_ready(timeout=120)
    except Exception as e:  # noqa: BLE001 - no pool (one compile thread) or an older torch: compile as it comes
        result["notes"].append(f"compile workers not awaited: {type(e).__name__}: {e}")
        return
    result["compile_pool_s"] = round(time.perf_counter() - start, 3)


def _build(spec: dict, result: dict) -> tuple[Setup, tuple]:
    """The workload (screened if asked), its batches, and a fresh model and optimizer."""
    mark = time.perf_counter()
    from autocompile.workloads import WorkloadOptions, get_workload

    workload = get_workload(spec["model"])
    if spec.get("blocks"):  # a screened trial: the same model with its repeated blocks cut
        from autocompile.trial.screened import screened

        workload = screened(workload, spec["blocks"])
        result["blocks"] = spec["blocks"]
    options = WorkloadOptions(
        device=spec["device"], batch_size=spec.get("batch_size"), seq_len=spec.get("seq_len"), seed=spec.get("seed", 0)
    )
    pool = spec.get("batch_pool") or workload.batch_pool
    parts = result.setdefault("build_s", {})
    parts["workload"], mark = time.perf_counter() - mark, time.perf_counter()
    batches = workload.batches(options, pool)
    counts = [workload.count(b) for b in batches]
    parts["batches"], mark = time.perf_counter() - mark, time.perf_counter()
    model, optimizer = workload.build(options)
    parts["model_and_optimizer"] = time.perf_counter() - mark
    if workload.flops_per_item:
        result["model_flops_per_item"] = workload.flops_per_item(model)
    info = _model_info(workload, options, model, batches, result, spec.get("parallel", "none"))
    return Setup(workload, options, pool, batches, counts, info), (model, optimizer)


def _write_snippet(spec: dict, result: dict, setup: Setup) -> None:
    """The configuration's snippet, rendered for this model and written to the trial's folder."""
    config = spec["config"]
    if config["compile"] and config["scope"] == "regional" and not setup.info.regions:
        raise ValueError("scope 'regional': no repeated blocks found in the model")
    setup.snippet = render_snippet(config, setup.info, header=spec.get("header", ""))
    setup.snippet_path = os.path.join(spec["trial_dir"], "apply_compilation.py")
    with open(setup.snippet_path, "w") as f:
        f.write(setup.snippet)
    result["snippet"] = setup.snippet


def _replay_only(torch, spec: dict, result: dict, setup: Setup) -> None:
    """The numerics replay alone, with nothing measured."""
    result.update(
        status=Status.OK,
        reason="replay only: nothing measured",
        replay=_replay(torch, spec, setup.workload, setup.options, setup.batches, setup.info, setup.snippet, lambda: None),
    )


def _divergence_only(torch, spec: dict, result: dict, setup: Setup) -> None:
    """Eager and the configuration compared module by module on the replay's batch, seed and
    dropout handling (see `_replay`), one training step each; nothing measured."""
    import torch._inductor.config as inductor_config

    from autocompile.trial import divergence

    recorded = {}
    for side, code in (("eager", _eager_reference(spec["config"], setup.info)), ("trial", setup.snippet)):
        torch._dynamo.reset()
        model, optimizer = setup.workload.build(setup.options)
        _switch_off_dropout(torch, model)
        recorder = divergence.Recorder(divergence.watched_modules(model, setup.info.regions, setup.info.parts))
        with inductor_config.patch(fallback_random=True):
            training = Training(setup.workload, (model, optimizer), setup.batches[:1], code, f"<divergence {side}>")
            del model, optimizer
            torch.manual_seed(REPLAY_SEED)
            training.step(0)
        recorded[side] = recorder.finish()
        del training, recorder
    (eager, order), (trial, _) = recorded["eager"], recorded["trial"]
    result.update(
        status=Status.OK,
        reason="divergence only: nothing measured",
        divergence=divergence.first_divergence(eager, trial, order, spec["divergence_tolerance"]),
    )


def _accuracy_only(torch, spec: dict, result: dict, setup: Setup, built: tuple) -> None:
    """The module `accuracy_module` (where the numerics part: trial/divergence.py) compiled alone
    with its settings in the configuration, run forward and backward on the inputs it got in an
    eager forward pass (`_module_inputs`). Under the minifier's accuracy mode (the parent's
    TORCHDYNAMO_REPRO_LEVEL=4) a graph of its compile that departs from its eager run raises
    AccuracyError and leaves the minifier's launcher."""
    import torch._inductor.config as inductor_config

    from autocompile.trial.divergence import ROOT, first_tensor

    path = "" if spec["accuracy_module"] == ROOT else spec["accuracy_module"]
    module = built[0].get_submodule(path)
    with inductor_config.patch(fallback_random=True):
        args, kwargs = _module_inputs(torch, spec, setup, built, module)
        config, info = alone(spec["config"], setup.info, path)
        load_snippet(render_snippet(config, info), "<accuracy>")["apply_compilation"](module, built[1])
        torch.manual_seed(REPLAY_SEED)
        output = first_tensor(module(*args, **kwargs))
        if output is not None and output.requires_grad:  # the backward graph is compiled and checked at its first run
            output.backward(torch.ones_like(output))
    result.update(status=Status.OK, reason=f"{spec['accuracy_module']} compiled alone: its graphs agree with their eager run")


def _module_inputs(torch, spec: dict, setup: Setup, built: tuple, module) -> tuple[tuple, dict]:
    """What `module` is called with in an eager forward pass from fresh weights on the replay's
    batch, seed and dropout handling (see `_replay`)."""
    from autocompile.trial.divergence import Inputs

    _switch_off_dropout(torch, built[0])
    reference = _eager_reference(spec["config"], setup.info)
    eager = Training(setup.workload, built, setup.batches[:1], reference, "<eager>")
    inputs = Inputs(module)
    torch.manual_seed(REPLAY_SEED)
    eager.compute_loss(eager.prepare_batch(dict(setup.batches[0])))
    return inputs.caught()


def _check_randomness(torch, spec: dict, events: Events, result: dict, setup: Setup, model) -> None:
    """For a compiled trial, whether the loss depends on the random stream (see `_rng_dependent`), or
    what an earlier compiled trial of the study found of it (the spec's `rng_dependent`: the model's
    property, not the configuration's; 3-4 s of three eager forwards saved on llama-8b)."""
    # Then (dropout) the first losses of a compiled run differ from eager's by the noise of the
    # masks, and the numerics are judged by a replay.
    if spec["config"]["compile"] and spec.get("rng_dependent"):  # found by an earlier trial (engine/learned.py)
        result["rng_dependent"] = spec["rng_dependent"]["value"]
        result["rng_dependent_from"] = spec["rng_dependent"]["from"]
    elif spec["config"]["compile"]:
        events.emit(phase="checking randomness")
        result["rng_dependent"] = _rng_dependent(torch, setup.workload, model, setup.batches[0], result)


def _apply(spec: dict, result: dict, setup: Setup, built: tuple) -> Training:
    """The snippet applied to the fresh model and optimizer, after the compile cache it is given, if any."""
    training = Training(setup.workload, built, setup.batches, setup.snippet, setup.snippet_path, spec.get("load_cache"))
    if training.cache_loaded is not None:
        result["cache_loaded"] = training.cache_loaded
    if training.host_batches is not None:
        result["packed_on_host"] = True  # each step's batch packed on the host and sent pinned (Training)
    return training


def _device_sync(torch, device: str):
    """The device's synchronise (none on the CPU); on CUDA the peak memory is counted from here."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    return sync


def _save_cache(torch, spec: dict, result: dict, training: Training) -> None:
    """For `autocompile export`: what the warm-up compiled, saved for a warm start."""
    if spec.get("save_cache"):
        result["cache"] = _save_compile_cache(torch, spec["save_cache"], training.namespace["compile_cache_key"]())


def _check_numerics(torch, spec: dict, events: Events, result: dict, setup: Setup, sync) -> None:
    """The numerics replay, after the measurement is written: that stands whatever the replay does."""
    _write_result(spec, result)  # the measurement stands even if the replay runs out of time
    events.emit(phase="checking numerics")
    try:
        result["replay"] = _replay(torch, spec, setup.workload, setup.options, setup.batches, setup.info, setup.snippet, sync)
    except Exception as exc:  # the measurement stands; the verdict says it could not be reached
        traceback.print_exc()
        result["replay"] = {"error": _shorten(f"{type(exc).__name__}: {_first_line(exc)}", 400)}


def _versions(torch, device: str, result: dict) -> None:
    result["torch"] = torch.__version__
    try:  # from the package metadata: importing transformers takes seconds a model may not need
        result["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    result["device_name"] = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def _model_info(workload, options, model, batches: list, result: dict, parallel: str = "none") -> ModelInfo:
    """What the snippet needs to know of the model, and of its batches' rows."""
    import torch._dynamo.config as dynamo_config

    from autocompile.workloads import checkpointing
    from autocompile.workloads.layout import resolve

    regions = find_repeated_blocks(model)
    result["regions"] = regions
    found = checkpointing.find(model, workload.checkpointing)
    if found:
        result["model_checkpointing"] = found.where
    return ModelInfo(
        regions=regions,
        parts=workload.parts,
        varying=dict(workload.varying),
        max_len=workload.max_len(options),
        device_type="cuda" if options.device.startswith("cuda") else "cpu",
        recompile_limit_key=next((k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)), None),
        compiled_autograd_api=compiled_autograd_api_name(),
        parallel=parallel,
        checkpointing=found,
        layout=resolve(workload, model, batches[0] if batches else {})[0],
        framework=workload.framework,
        rows=max((batch[next(iter(workload.varying))].shape[0] for batch in batches), default=0) if workload.varying else 0,
    )


def _rng_dependent(torch, workload, model, batch: dict, result: dict | None = None) -> bool:
    """Whether the first batch's loss (eager, forward only, before anything is compiled) changes
    with the seed more than it changes between two runs under one seed. That eager loss goes to
    `result` as `eager_first_loss`: a numerics reference where eager training does not fit."""
    losses = []
    devices = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        for seed in (1, 1, 2):
            torch.manual_seed(seed)
            losses.append(float(workload.loss(model, dict(batch)).float()))
    same, other = abs(losses[0] - losses[1]), abs(losses[0] - losses[2])
    if result is not None:
        result["eager_first_loss"] = losses[0]
    return other > max(10 * same, 1e-9 * abs(losses[0]))


def _warm_up(training: Training, watcher, spec: dict, events: Events, result: dict, sync, pool: int, ledger: GraphLedger) -> dict:
    """Until a whole pass over `pool` batches (the pool, or the workload's fresh pass) is done and `settle`
    steps in a row started no compile (`settle_steps`). Each step is synchronised so its compile events are its own. Returns
    where it ended: steps run, a typical quiet step's time, compile events so far. With a shared
    compile cache the warm-up it measured is not cold: `_cold_warm_up` reconstructs it."""
    warming = "compiling" if spec["config"]["compile"] else "warming up"
    events.emit(phase=warming)
    settle = settle_steps(spec, pool)
    max_warmup = spec.get("max_warmup_steps", 20 * pool)
    losses: list[float] = []
    start = time.perf_counter()
    index = quiet = 0
    quiet_times: list[float] = []
    while True:
        before = watcher.events
        t0 = time.perf_counter()
        loss = training.step(index)
        sync()
        dt = time.perf_counter() - t0
        if len(losses) < 5:
            losses.append(float(loss.detach().float().item()))
        index += 1
        if watcher.events == before:
            quiet += 1
            quiet_times.append(dt)
        else:
            quiet, quiet_times = 0, []
            ledger.update()  # its cold compiles reach the study's ledger now, even if the trial is cut later
        if _all_ranks((index >= pool and quiet >= settle) or index >= max_warmup):
            break
        if index % max(1, pool // 2) == 0:
            events.emit(phase=warming, step=index)
    warmup_s = time.perf_counter() - start
    if index >= max_warmup and quiet < settle:
        result["notes"].append(f"compiles did not stop within {max_warmup} warm-up steps")
    result.update(warmup_s=warmup_s, warmup_steps=index, losses=losses, compile_caches=_cache_counters())
    _cold_warm_up(spec, result, ledger)
    return {
        "steps": index,
        "typical_step_s": statistics.median(quiet_times) if quiet_times else warmup_s / index,
        "events": watcher.events,
        "recordings": watcher.recordings,
        "recording_s": watcher.recording_s,
    }


def settle_steps(spec: dict, pool: int) -> int:
    """How many steps in a row must start no compile event to end the warm-up: the spec's, else 3;
    a whole pass over the pool where CUDA graphs are recorded. Inductor's CUDA-graph trees run a
    graph once to warm it and record it the next time it comes (a compile event, torch's callback
    CUDAGRAPH_RECORDING), so a length that comes once a pass is recorded in the next pass: a
    warm-up ended sooner leaves those recordings to the measuring windows, slow and counted as
    recompiles (docs/decisions.md: "Evidence moved out of the code")."""
    if "settle_steps" in spec:
        return spec["settle_steps"]
    config = {**DEFAULTS, **spec["config"]}
    if config["compile"] and str(spec.get("device", "")).startswith("cuda") and uses_cuda_graphs(config):
        return pool
    return 3


def _cold_warm_up(spec: dict, result: dict, ledger: GraphLedger) -> None:
    """The graphs compiled; where the shared cache had some, the cold warm-up reconstructed (see
    autocompile.trial.graphs) becomes the warm-up, beside the one measured."""
    graphs = ledger.update()
    result["graphs"] = graphs
    rebuilt = reconstruct(result["warmup_s"], graphs, read_ledger(spec.get("graph_ledger")))
    if rebuilt:
        result.update(
            warmup_s=rebuilt["warmup_s"],
            warmup_measured_s=rebuilt["measured_s"],
            warmup_kind="reconstructed",
            reconstruction=rebuilt,
        )
    else:
        result["warmup_kind"] = "cold" if spec["config"]["compile"] else "eager"


# The steady speed's 95% interval (half its width, over the mean) the measurement stops at: two
# measurements of one configuration then agree within about 2%. Windows of whole passes over the pool
# (every window sees the same lengths), at least two, at most MAX_WINDOWS or what the trial's limit leaves.
TARGET_INTERVAL = 0.015
MIN_WINDOWS, MAX_WINDOWS = 2, 8
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # Student's t, 1-10 degrees of freedom


def interval(rates: list[float]) -> float:
    """Half the width of the 95% interval of the mean of the window rates, over that mean (inf for one window)."""
    if len(rates) < 2:
        return math.inf
    t = _T975[len(rates) - 2] if len(rates) - 1 <= len(_T975) else 1.96
    return t * statistics.stdev(rates) / math.sqrt(len(rates)) / statistics.mean(rates)


def settled(rates: list[float], least: int = MIN_WINDOWS) -> int:
    """How many leading windows still belong to the warm-up's tail (MSER, the marginal standard error rule):
    the cut d, at most half the windows and leaving `least`, that minimises the spread of the windows after
    it over their count squared. A speed still rising in the first windows (caches, clocks, a neighbour's
    compile) then does not pull the steady speed down (docs/measurement.md). Faster first windows are cut too:
    a speed that falls and stays down (clocks under sustained load) runs at the lower tail from then on."""
    best, cut = math.inf, 0
    for d in range(0, min(len(rates) // 2, len(rates) - least) + 1):
        rest = rates[d:]
        mean = sum(rest) / len(rest)
        spread = sum((x - mean) ** 2 for x in rest) / len(rest) ** 2
        if spread < best - 1e-15:
            best, cut = spread, d
    return cut


def _measure(
    torch, training: Training, watcher, warm: dict, spec: dict, events: Events, result: dict, sync, counts: list[int], workload
) -> None:
    """Steady state: windows of whole passes over the pool (so every window sees the same lengths), at
    least `min_window_s` long, until the steady speed's interval is tight enough (`interval`), the
    window cap is reached, or the next window would run past the trial's limit. Where the workload
    measures on fresh batches (`Workload.fresh_pass`), FRESH_WINDOWS windows of its passes, each on
    batches no step has seen: their lengths differ, so none is cut as settling and their count is fixed."""
    index, pool, unit = warm["steps"], len(counts), workload.unit
    events.emit(phase="measuring", warmup_s=result["warmup_s"], warmup_steps=index)  # the parent's pruning reads these
    step = workload.fresh_pass or pool
    passes = int(_slowest(max(1, math.ceil(spec.get("min_window_s", 0.5) / max(warm["typical_step_s"] * step, 1e-6)))))
    window_steps = passes * step
    min_windows, max_windows = spec.get("min_windows", MIN_WINDOWS), spec.get("max_windows", MAX_WINDOWS)
    if workload.fresh_pass:
        min_windows = max_windows = FRESH_WINDOWS
    target = spec.get("target_interval", TARGET_INTERVAL)
    rates: list[float] = []
    times: list[float] = []
    items: list[int] = []
    while len(rates) < max_windows:
        if len(rates) >= min_windows and _all_ranks(time.time() + sum(times) / len(rates) > spec.get("_deadline", math.inf)):
            result["notes"].append(f"measurement stopped after {len(rates)} windows: another would pass the trial's limit")
            break
        sync()
        t0 = time.perf_counter()
        items.append(0)
        for _ in range(window_steps):
            training.step(index)
            items[-1] += counts[index % pool]
            index += 1
        sync()
        times.append(time.perf_counter() - t0)
        rates.append(window_steps / times[-1])
        events.emit(phase="measuring", window=len(rates), steps_per_s=round(rates[-1], 3))
        if _all_ranks(len(rates) >= min_windows and interval(rates[settled(rates, min_windows) :]) <= target):
            break
    cut = 0 if workload.fresh_pass else settled(rates, min_windows)
    steady, total_time = rates[cut:], sum(times[cut:])
    cv = statistics.pstdev(steady) / statistics.mean(steady) if len(steady) > 1 else 0.0
    peak, peak_kind = _peak_memory_gb(torch, spec["device"])
    result.update(_padding_share(training))
    result.update(
        status=Status.OK,
        reason="",
        steps_per_s=window_steps * len(steady) / total_time,
        items_per_s=sum(items[cut:]) / total_time,
        unit=unit,
        window_steps=window_steps,
        window_rates=rates,
        settling_windows=cut,
        interval=interval(steady) if len(steady) > 1 else None,
        cv=cv,
        measured_steps=window_steps * len(rates),
        compiles=watcher.compiles_started,
        recompiles=len(watcher.recompile_reasons),
        # compiles after the warm-up, and the CUDA graphs recorded then (each a compile event torch reports)
        recompiles_after_warmup=watcher.events - warm["events"] - (watcher.recordings - warm["recordings"]),
        cudagraph_recordings_after_warmup=watcher.recordings - warm["recordings"],
        cudagraph_recording_s_after_warmup=round(watcher.recording_s - warm["recording_s"], 3),
        recompile_reasons=watcher.recompile_reasons[:20],
        graph_breaks=sum(watcher.graph_breaks.values()),
        graph_break_reasons=[{"reason": r, "count": n} for r, n in list(watcher.graph_breaks.items())[:20]],
        graph_break_fixes=sorted(watcher.break_fixes),
        recompile_limit_hit=bool(watcher.limit_hits),
        peak_mem_gb=peak,
        peak_mem_kind=peak_kind,
    )
    _gather_ranks(result)
    if result.get("model_flops_per_item"):  # the model's FLOPs at this speed: MFU is this over the device's peak
        result["model_tflops_per_s"] = result["model_flops_per_item"] * result["items_per_s"] / 1e12
    if cut:  # what those windows lost against the steady speed: seconds, small beside the warm-up
        result["settling_s"] = max(0.0, sum(times[:cut]) - cut * total_time / len(steady))
        result["notes"].append(
            f"the first {cut} of {len(rates)} measuring windows were still settling "
            f"({', '.join(f'{r:.3g}' for r in rates[:cut])} steps/s, {result['settling_s']:.1f} s "
            "lost against the steady speed): the steady speed is the rest's"
        )
    if len(steady) > 1 and interval(steady) > target and not workload.fresh_pass:
        result["notes"].append(
            f"the steady speed's 95% interval stayed at +-{interval(steady):.1%}, above "
            f"+-{target:.1%}, after {len(rates)} windows"
        )
    if watcher.limit_hits:
        result["status"] = Status.INFEASIBLE
        result["reason"] = "hit the recompile limit, so part of the model fell back to eager: " + watcher.limit_hits[0]


def _padding_share(training: Training) -> dict:
    """Of the tokens the steps computed over the batch pool, the share that was padding: real tokens are
    those where a varying key is not its pad value in the batch as built (padded to its longest)."""
    if not training.computed:
        return {}
    varying = {key: pad for key, (_, pad) in training.workload_varying.items()}
    real = sum(int(real_tokens(training.batches[i], varying).sum()) for i in training.computed)
    return {"padding_share": 1 - real / sum(training.computed.values()), "tokens_computed": sum(training.computed.values())}


def _group():
    """torch.distributed where this trial is one rank of several, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _reduce(value: float, op: str) -> float:
    """`value` reduced over the ranks (MIN or MAX): every rank then takes the same decision, so they
    run the same steps (a rank that stops earlier would leave the others waiting in a collective)."""
    dist = _group()
    if dist is None:
        return value
    import torch

    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([float(value)], device=device)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    return tensor.item()


def _all_ranks(flag: bool) -> bool:
    return bool(_reduce(float(flag), "MIN"))


def _slowest(value: float) -> float:
    return _reduce(value, "MAX")


def _every_rank(value) -> list | None:
    """`value` of every rank, in rank order (an all_gather), where this trial is one rank of several."""
    dist = _group()
    if dist is None:
        return None
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, value)
    return every


def _gather_ranks(result: dict) -> None:
    """The group's figures on rank 0: items summed over ranks, steps per second the slowest rank's,
    warm-up the slowest rank's, peak memory the largest rank's; each rank's own under "ranks" (its
    first losses too: the numerics guard compares each rank's with eager's same rank)."""
    if _group() is None:
        return
    keys = ("warmup_s", "steps_per_s", "items_per_s", "peak_mem_gb", "recompiles", "graph_breaks", "losses")
    result["ranks"] = every = _every_rank({k: result.get(k) for k in keys})
    result.update(
        warmup_s=max(r["warmup_s"] for r in every),
        steps_per_s=min(r["steps_per_s"] for r in every),
        items_per_s=sum(r["items_per_s"] for r in every),
        peak_mem_gb=max(r["peak_mem_gb"] for r in every),
    )
    result["notes"].append(
        f"{len(every)} ranks: items/s summed over the ranks, steps/s and warm-up the slowest "
        "rank's, peak memory the largest rank's"
    )


def _replay(torch, spec: dict, workload, options, batches: list, info: ModelInfo, snippet: str, sync) -> dict:
    """The numerics of a model whose loss depends on the random stream (dropout), judged without
    the noise of the masks. The first steps run twice from fresh weights, on the first batch
    (so a replay compiles one shape): eager, with the configuration's padding, and as
    configured. On both sides the model's dropout modules are set to p = 0, and what randomness
    is left (a functional dropout whose p is a plain number) is drawn alike: each step starts
    from the same seed, and Inductor's `fallback_random` makes compiled code draw from torch's
    stream in eager's order. Dropout modules are switched off rather than aligned because some
    kernels draw their own masks (a fused attention kernel with dropout: a compiled model may
    pick another one than eager for the same call), which no seed can make equal."""
    import gc

    import torch._inductor.config as inductor_config

    started = time.perf_counter()
    reference = _eager_reference(spec["config"], info)
    out: dict = {}
    for side, code in (("eager", reference), ("trial", snippet)):
        torch._dynamo.reset()
        model, optimizer = workload.build(options)
        switched_off = _switch_off_dropout(torch, model)
        if side == "eager":
            out["dropout_modules_off"] = switched_off
            out["rng_dependent_after"] = _rng_dependent(torch, workload, model, batches[0])
        with inductor_config.patch(fallback_random=True):
            training = Training(workload, (model, optimizer), batches[:1], code, f"<replay {side}>")
            # No random draws in an optimizer step: compiled as in the measured run, it loads the code
            # that run compiled (a compiled optimizer step takes minutes cold on a GPU model: docs/decisions.md).
            out[f"{side}_step_caches"] = {}
            training.step_context = _as_measured(inductor_config, out[f"{side}_step_caches"])
            del model, optimizer
            out[side] = []
            for k in range(REPLAY_STEPS):
                # Each step from its own seed: a compile that runs lazily inside a step (the backward
                # graph's, at its first use) may draw random inputs for its benchmarks (Inductor's
                # pad_mm does on CUDA), which would shift the stream of the next step.
                torch.manual_seed(REPLAY_SEED + k)
                out[side].append(float(training.step(0).detach().float().item()))
            sync()
        del training
        gc.collect()
        if spec["device"].startswith("cuda"):
            torch.cuda.empty_cache()
    # Every rank replays (the models are wrapped as in the trial, DDP or FSDP2, whose collectives need
    # them all); each rank's losses go to rank 0's record, and the guard judges the worst of them.
    ranks = _every_rank({"eager": out["eager"], "trial": out["trial"]})
    if ranks:
        out["ranks"] = ranks
    left = "; the loss still depends on the random stream, drawn alike by both sides" if out["rng_dependent_after"] else ""
    group = f"; on each of {len(ranks)} ranks, both sides under {spec['parallel']} as in the trial" if ranks else ""
    return {
        **out,
        "steps": REPLAY_STEPS,
        "seconds": time.perf_counter() - started,
        "version": REPLAY_VERSION,
        "method": f"replay: eager and the configuration from fresh weights, the first batch, "
        f"{switched_off} dropout modules at p = 0, a seed per step, Inductor fallback_random{left}{group}",
    }


def _eager_reference(config: dict, info: ModelInfo) -> str:
    """The snippet a replay compares the configuration with: eager, with the configuration's padding
    and, under --parallel, its wrapping (DDP, or FSDP2 with its reshard_after_forward)."""
    from autocompile.space import EAGER

    padded = config["padding"] != "pack"  # packed: eager on the padded batch, the tokens packing must train alike
    return render_snippet(
        {
            **EAGER,
            "padding": config["padding"] if padded else "longest",
            "pad_multiple": config["pad_multiple"] if padded else None,
            "reshard_after_forward": config.get("reshard_after_forward", True),
        },
        info,
    )


def _as_measured(inductor_config, seen: dict):
    """A context for the replay's optimizer steps: Inductor's settings as in the measured run
    (fallback_random off), so a compiled step has the measured run's cache key and loads its code;
    `seen` gathers the compile caches' hits and misses during the steps."""

    @contextlib.contextmanager
    def context():
        before = _cache_counters()
        with inductor_config.patch(fallback_random=False):
            yield
        for key, n in _cache_counters().items():
            if n - before.get(key, 0):
                seen[key] = seen.get(key, 0) + n - before.get(key, 0)

    return context


def _switch_off_dropout(torch, model) -> int:
    """Set every dropout module's p to 0 (a model reads it at call time, as GPT-2's attention
    does for its fused kernel); returns how many there were."""
    modules = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    for module in modules:
        module.p = 0.0
    return len(modules)


def classify(exc: BaseException) -> Status:
    """The status for an exception: oom, compile_error or failed."""
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    text = str(exc).lower()
    if name in ("OutOfMemoryError", "MemoryError") or "out of memory" in text or "can't allocate memory" in text:
        return Status.OOM
    if module.startswith(("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes")):
        return Status.COMPILE_ERROR
    if "BackendCompilerFailed" in name or "InductorError" in name:
        return Status.COMPILE_ERROR
    return Status.FAILED


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    _as_rank(spec)
    events = Events(spec["events"])
    result: dict = {"status": Status.FAILED, "reason": "", "notes": []}
    try:
        run(spec, events, result)
    except BaseException as exc:  # every failure becomes a record; the parent decides what next
        traceback.print_exc()
        result["status"] = classify(exc)
        result["reason"] = _shorten(f"{type(exc).__name__}: {_first_line(exc)}", 600)
        result["failed_phase"] = _last_phase(spec["events"])
        frame = torch_frame(exc)
        if frame:
            result["torch_frame"] = frame
    finally:
        _write_result(spec, result)
        events.emit(phase="done", status=result["status"])
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def _as_rank(spec: dict) -> None:
    """In a trial of several ranks (autocompile.trial.ranks), a rank other than 0 writes a result of
    its own and no events, compile-cache ledger or saved cache: rank 0 speaks for the group."""
    rank = int(os.environ.get("RANK", "0")) if spec.get("parallel", "none") != "none" else 0
    spec["rank"] = rank
    if rank:
        spec.update(result=rank_result_path(spec, rank), events=os.devnull, graph_ledger=None, save_cache=None)


def torch_frame(exc: BaseException) -> str | None:
    """The innermost traceback frame inside torch's package, as `torch/_dynamo/x.py:12 in fn`:
    where torch raised. Follows the exception's causes to the first one raised (a wrapper such as
    BackendCompilerFailed is raised from the error that caused it)."""
    import torch

    root = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
    package = os.path.join(root, "torch") + os.sep
    chain, seen = [exc], {id(exc)}
    while chain[-1].__cause__ is not None and id(chain[-1].__cause__) not in seen:
        chain.append(chain[-1].__cause__)
        seen.add(id(chain[-1]))
    for error in reversed(chain):
        frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.abspath(f.filename).startswith(package)]
        if frames:
            last = frames[-1]
            return f"{os.path.relpath(os.path.abspath(last.filename), root)}:{last.lineno} in {last.name}"
    return None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def _write_result(spec: dict, result: dict) -> None:
    tmp = spec["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, spec["result"])


def _last_phase(path: str) -> str:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
        return json.loads(lines[-1]).get("phase", "") if lines else ""
    except (OSError, ValueError):
        return ""


if __name__ == "__main__":
    # The parent asks for every thread's stack (SIGUSR1) before it kills a trial at its time limit:
    # the log then says where the trial was when time ran out (autocompile.trial.stuck_in).
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    # A fatal signal (SIGSEGV in a compiler or a kernel launch) writes the Python stacks to the log first.
    faulthandler.enable(all_threads=True)
    # Exit without running interpreter teardown: CUDA and compile worker pools sometimes hang there.
    code = main(sys.argv[1:])
    os._exit(code)
