"""The inside of one trial: build the workload, apply the snippet, warm up, measure.

Runs as ``python -m autocompile._worker SPEC.json`` in a fresh process whose Inductor and
Triton caches point at empty folders (set by the parent, `autocompile.trial`), so the warm-up
measured is a cold compile. It reports its phase to an events file as it goes and writes
its measurement to a result file at the end, whatever happens; the parent turns a crash, a
hang or a kill into a record of its own.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import statistics
import sys
import time
import traceback


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

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.compiles_started = 0
        self.compiles_ended = 0
        self.recompile_reasons: list[str] = []
        self.graph_breaks: dict[str, int] = {}
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
        elif ("recompile_limit" in message or "cache_size_limit" in message) and "hit config." in message:
            self.limit_hits.append(_shorten(message, 400))

    def install(self, torch) -> list[str]:
        """Hook into torch; returns what could not be hooked (recorded as notes)."""
        notes = []
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
        logging.getLogger("torch._dynamo").addHandler(self)
        try:
            import torch._dynamo.callback as callback

            callback.on_compile_start(lambda *args, **kwargs: self._started())
            callback.on_compile_end(lambda *args, **kwargs: self._ended())
        except (ImportError, AttributeError):
            notes.append("torch._dynamo.callback missing: compile events counted from recompile logs only")
        return notes

    def _started(self):
        self.compiles_started += 1

    def _ended(self):
        self.compiles_ended += 1

    @property
    def events(self) -> int:
        return self.compiles_started + len(self.recompile_reasons)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _warm_cpu_toolchain(toolchain_dir: str | None, notes: list[str]) -> None:
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


def run(spec: dict, events: Events, result: dict) -> None:
    events.emit(phase="building")
    import torch

    from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet
    from autocompile.workloads import WorkloadOptions, get_workload

    notes: list[str] = result["notes"]
    device = spec["device"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("CUDA was asked for but torch sees no GPU")
    if not device.startswith("cuda") and spec["config"]["compile"]:
        _warm_cpu_toolchain(spec.get("toolchain_dir"), notes)
    watcher = CompileWatcher()
    notes += watcher.install(torch)
    result["torch"] = torch.__version__
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        pass
    result["device_name"] = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"

    config = spec["config"]
    workload = get_workload(spec["model"])
    options = WorkloadOptions(device=device, batch_size=spec.get("batch_size"), seq_len=spec.get("seq_len"),
                              seed=spec.get("seed", 0))
    model, optimizer = workload.build(options)
    import torch._dynamo.config as dynamo_config

    info = ModelInfo(
        regions=find_repeated_blocks(model),
        parts=workload.parts,
        varying=dict(workload.varying),
        max_len=workload.max_len(options),
        device_type="cuda" if device.startswith("cuda") else "cpu",
        recompile_limit_key=next((k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)), None),
    )
    result["regions"] = info.regions
    if config["compile"] and config["scope"] == "regional" and not info.regions:
        raise ValueError("scope 'regional': no repeated blocks found in the model")
    snippet = render_snippet(config, info, header=spec.get("header", ""))
    snippet_path = os.path.join(spec["trial_dir"], "apply_compilation.py")
    with open(snippet_path, "w") as f:
        f.write(snippet)
    result["snippet"] = snippet

    pool = spec.get("batch_pool") or workload.batch_pool
    batches = workload.batches(options, pool)
    counts = [workload.count(b) for b in batches]
    namespace = load_snippet(snippet, snippet_path)
    # Before apply_compilation: torch's LRScheduler wraps optimizer.step, and cannot wrap a compiled one.
    scheduler = workload.schedule(optimizer) if workload.schedule else None
    if spec.get("load_cache"):  # the warm start, through the snippet as a user does it
        result["cache_loaded"] = namespace["load_compile_cache"](spec["load_cache"])
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    prepare_batch = namespace["prepare_batch"]
    if workload.split_loss:  # the criterion apart from the model, compiled where the config says so
        criterion = namespace["compile_loss"](workload.criterion)

        def compute_loss(batch):
            return criterion(workload.forward(model, batch), batch)
    else:
        def compute_loss(batch):
            return workload.loss(model, batch)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()

    losses: list[float] = []

    def step(index: int):
        batch = prepare_batch(dict(batches[index % pool]))
        loss = compute_loss(batch)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    # Warm-up: until a whole pass over the batch pool is done and `settle` steps in a row
    # started no compile. Each step is synchronised so its compile events are its own.
    warming = "compiling" if config["compile"] else "warming up"
    events.emit(phase=warming)
    settle = spec.get("settle_steps", 3)
    max_warmup = spec.get("max_warmup_steps", 20 * pool)
    start = time.perf_counter()
    index = quiet = 0
    quiet_times: list[float] = []
    while True:
        before = watcher.events
        t0 = time.perf_counter()
        loss = step(index)
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
        if (index >= pool and quiet >= settle) or index >= max_warmup:
            break
        if index % max(1, pool // 2) == 0:
            events.emit(phase=warming, step=index)
    warmup_s = time.perf_counter() - start
    if index >= max_warmup and quiet < settle:
        notes.append(f"compiles did not stop within {max_warmup} warm-up steps")
    warm_events = watcher.events
    result.update(warmup_s=warmup_s, warmup_steps=index, losses=losses, compile_caches=_cache_counters())
    if spec.get("save_cache"):  # `autocompile export`: what the warm-up compiled, for a warm start
        result["cache"] = _save_compile_cache(torch, spec["save_cache"], namespace["compile_cache_key"]())

    # Steady state: windows of whole passes over the pool (so every window sees the same
    # lengths), at least `min_window_s` long; more windows while their spread is high.
    events.emit(phase="measuring", warmup_s=warmup_s, warmup_steps=index)  # the parent's pruning reads these
    typical = statistics.median(quiet_times) if quiet_times else warmup_s / index
    passes = max(1, math.ceil(spec.get("min_window_s", 0.5) / max(typical * pool, 1e-6)))
    window_steps = passes * pool
    min_windows, max_windows = spec.get("min_windows", 3), spec.get("max_windows", 6)
    target_cv = spec.get("target_cv", 0.02)
    rates: list[float] = []
    total_steps = total_items = 0
    total_time = 0.0
    while len(rates) < max_windows:
        sync()
        t0 = time.perf_counter()
        for _ in range(window_steps):
            step(index)
            total_items += counts[index % pool]
            index += 1
        sync()
        elapsed = time.perf_counter() - t0
        rates.append(window_steps / elapsed)
        total_steps += window_steps
        total_time += elapsed
        events.emit(phase="measuring", window=len(rates), steps_per_s=round(rates[-1], 3))
        if len(rates) >= min_windows and statistics.pstdev(rates) / statistics.mean(rates) <= target_cv:
            break
    cv = statistics.pstdev(rates) / statistics.mean(rates) if len(rates) > 1 else 0.0
    peak, peak_kind = _peak_memory_gb(torch, device)
    result.update(
        status="ok",
        reason="",
        steps_per_s=total_steps / total_time,
        items_per_s=total_items / total_time,
        unit=workload.unit,
        window_steps=window_steps,
        window_rates=rates,
        cv=cv,
        measured_steps=total_steps,
        compiles=watcher.compiles_started,
        recompiles=len(watcher.recompile_reasons),
        recompiles_after_warmup=watcher.events - warm_events,
        recompile_reasons=watcher.recompile_reasons[:20],
        graph_breaks=sum(watcher.graph_breaks.values()),
        graph_break_reasons=[{"reason": r, "count": n} for r, n in list(watcher.graph_breaks.items())[:20]],
        recompile_limit_hit=bool(watcher.limit_hits),
        peak_mem_gb=peak,
        peak_mem_kind=peak_kind,
    )
    if cv > target_cv:
        notes.append(f"throughput spread {cv:.1%} stayed above {target_cv:.0%} after {len(rates)} windows")
    if watcher.limit_hits:
        result["status"] = "infeasible"
        result["reason"] = "hit the recompile limit, so part of the model fell back to eager: " + watcher.limit_hits[0]


def classify(exc: BaseException) -> str:
    """The status for an exception: oom, compile_error or failed."""
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    text = str(exc).lower()
    if name in ("OutOfMemoryError", "MemoryError") or "out of memory" in text or "can't allocate memory" in text:
        return "oom"
    if module.startswith(("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes")):
        return "compile_error"
    if "BackendCompilerFailed" in name or "InductorError" in name:
        return "compile_error"
    return "failed"


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    events = Events(spec["events"])
    result: dict = {"status": "failed", "reason": "", "notes": []}
    try:
        run(spec, events, result)
    except BaseException as exc:  # every failure becomes a record; the parent decides what next
        traceback.print_exc()
        result["status"] = classify(exc)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result["reason"] = _shorten(f"{type(exc).__name__}: {first}", 600)
        result["failed_phase"] = _last_phase(spec["events"])
    finally:
        tmp = spec["result"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, spec["result"])
        events.emit(phase="done", status=result["status"])
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def _last_phase(path: str) -> str:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
        return json.loads(lines[-1]).get("phase", "") if lines else ""
    except (OSError, ValueError):
        return ""


if __name__ == "__main__":
    # Exit without running interpreter teardown: CUDA and compile worker pools sometimes hang there.
    code = main(sys.argv[1:])
    os._exit(code)
