"""Train a workload in a plain loop, as a user's script does, with a winner's snippet pasted in (or none:
eager), and print its steady speed, warm-up, peak memory and first losses: what the search measured,
measured outside autocompile's trial harness.

    python3 scripts/pasted_loop.py MODEL [--snippet studies/llama-8b/apply_compilation.py] [--steps 256]

The loop is the one the snippet's docstring asks for: batches held on the host by a DataLoader whose
collate is the snippet's prepare_batch, pinned (pin_memory=True) and moved with non_blocking=True; the
loss function wrapped once with compile_loss; backward(loss); optimizer.step(); zero_grad. Without
--snippet, the same loop runs eager on the padded batches. One process per run: compare two runs made
on one machine. Prints one JSON line (also to --out, default $OUT/pasted-MODEL-NAME.json).
Its batches are drawn after the model is built, so they are not the pool a trial draws first: against a
search's figures compare real items/s, not steps/s.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader

from autocompile.workloads import WorkloadOptions, get_workload


def _snippet(path: str | None):
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("pasted_snippet", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # imported, as a user's script imports it (Dynamo looks its globals up so)
    spec.loader.exec_module(module)
    return module


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(loop, steps: int) -> float:
    """Seconds `steps` steps take, from a drained queue to a drained queue."""
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        next(loop)
    _sync()
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--snippet", help="the snippet file to paste in (default: none, eager)")
    p.add_argument("--steps", type=int, default=256, help="steps measured after the warm-up, in four windows of whole passes")
    p.add_argument("--warmup-steps", type=int, default=12)
    p.add_argument("--batches", type=int, default=8, help="distinct batches, cycled")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    workload, snippet = get_workload(args.model), _snippet(args.snippet)
    options = WorkloadOptions(device=args.device)
    model, optimizer = workload.build(options)
    scheduler = workload.schedule(optimizer) if workload.schedule else None  # before apply_compilation
    host = [{k: v.cpu() if torch.is_tensor(v) else v for k, v in b.items()} for b in workload.batches(options, args.batches)]
    loss_fn = workload.criterion if workload.split_loss else (lambda outputs, batch: outputs)
    forward = workload.forward if workload.split_loss else workload.loss
    backward = lambda loss: loss.backward()  # noqa: E731
    collate = lambda batch: dict(batch)  # noqa: E731
    if snippet:
        model, optimizer = snippet.apply_compilation(model, optimizer)
        loss_fn, backward = snippet.compile_loss(loss_fn), snippet.backward
        collate = lambda batch: snippet.prepare_batch(dict(batch))  # noqa: E731
    data = DataLoader(host, batch_size=None, collate_fn=collate, pin_memory=args.device.startswith("cuda"))
    losses, counts = [], [workload.count(batch) for batch in host]  # real items of each batch, as padded

    def steps():
        while True:
            for batch in data:
                batch = {k: v.to(args.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
                loss = loss_fn(forward(model, batch), batch)
                backward(loss)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                if len(losses) < len(host):
                    losses.append(float(loss.detach()))  # the first pass only: a host read each step would slow it
                yield

    loop = steps()
    warmup_s = _timed(loop, args.warmup_steps)
    window = max(args.steps // 4 // len(host), 1) * len(host)  # whole passes over the batches: the same items each
    skip = -args.warmup_steps % len(host)  # to a pass's start
    _timed(loop, skip)
    windows = [window / _timed(loop, window) for _ in range(4)]
    per_step = sum(counts) / len(counts)
    name = os.path.splitext(os.path.basename(args.snippet))[0] if args.snippet else "eager"
    record = {
        "model": args.model,
        "snippet": args.snippet,
        "steps_per_s": statistics.median(windows),
        "windows": windows,
        "items_per_s": statistics.median(windows) * per_step,
        "unit": workload.unit,
        "warmup_s": warmup_s,
        "warmup_steps": args.warmup_steps,
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "first_losses": losses,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(json.dumps(record))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pasted-{args.model}-{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
