"""Where one configuration's training step spends its time: build the workload, apply the configuration's
snippet as a trial does, warm up, then run torch.profiler over a few steps and print the GPU time by kind
of kernel, the busiest kernels, how much of the step's wall time the GPU was busy, and its idle gaps between
kernels by what the host was doing then (`idle_gaps`), each compiled graph's calls, host time and kernels (which
graph is the optimizer's step, the loss's, a block's: `graph_table`), where the host waited for the GPU
(`host_waits`), and the allocator's calls to the driver a step (`allocator_lines`).

    python3 scripts/profile_step.py MODEL CONFIG.json [--warmup 40] [--steps 8] [--out DIR]

A probe for what to search next (issue 45), not a measurement of speed: the profiler slows the step.
The table and the kernel list go to stdout and DIR/profile-NAME.txt (DIR: $OUT, else .).
"""

import argparse
import os
import re
import sys
import time

# The kind of each kernel, by its name: the first pattern that matches.
KINDS = [
    # before matmul: Flash Attention's kernels are CUTLASS's (the 2026-11-28 varlen profile counted them as matmul)
    ("attention", r"flash|fmha|attention|flex|sdpa|triton_tem_fused_flex"),
    ("matmul", r"gemm|cutlass|sm90_xmma|nvjet|cublas|matmul|_mm_|\bmm\b|addmm|bmm"),
    ("optimizer", r"adam|multi_tensor|foreach|^triton_for_"),  # a compiled step's kernels: triton_for_fused_N
    ("copy / memset", r"memcpy|memset|copy|cat|fill"),
    ("triton fused", r"^triton_"),
    ("reduction / norm", r"reduce|norm|softmax|cross_entropy|nll"),
]


def kind(name: str) -> str:
    for label, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return label
    return "other"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("config")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--gaps", type=int, default=0, help="the host's timeline during the N longest idle gaps")
    args = p.parse_args()
    import torch

    from _probe import training_for

    device = "cuda" if torch.cuda.is_available() else "cpu"
    training = training_for(args.model, args.config, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    start = time.perf_counter()
    for i in range(args.warmup):
        training.step(i)
    sync()
    warm = time.perf_counter() - start
    before = torch.cuda.memory_stats() if device == "cuda" else {}
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        training.step(i)
    sync()
    plain = (time.perf_counter() - start) / args.steps
    allocations = allocator_lines(before, torch.cuda.memory_stats() if device == "cuda" else {}, args.steps)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        start = time.perf_counter()
        for i in range(args.warmup + args.steps, args.warmup + 2 * args.steps):
            training.step(i)
        sync()
        wall = time.perf_counter() - start
    kernels: dict[str, float] = {}
    events = prof.events()
    for event in _kernel_events(torch, events):
        kernels[event.name] = kernels.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3  # ms
    lines = [
        f"{args.model} {os.path.basename(args.config)} on {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'},"
        f" torch {torch.__version__}",
        f"warm-up {args.warmup} steps in {warm:.1f} s; a step {1e3 * plain:.1f} ms without the profiler,"
        f" {1e3 * wall / args.steps:.1f} ms under it",
    ]
    busy = sum(kernels.values()) / args.steps
    lines.append(f"GPU kernels {busy:.1f} ms a step: {100 * busy / (1e3 * plain):.0f}% of the step without the profiler")
    by_kind: dict[str, float] = {}
    for name, ms in kernels.items():
        by_kind[kind(name)] = by_kind.get(kind(name), 0.0) + ms / args.steps
    for label, ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {label:<18}{ms:8.2f} ms  {100 * ms / busy:5.1f}%")
    lines.append("busiest kernels (ms a step, kind, name):")
    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:40]:
        lines.append(f"  {ms / args.steps:8.3f}  {kind(name):<18}{name[:140]}")
    lines += idle_gaps(torch, events, args.steps)
    lines += gap_timelines(torch, events, args.gaps)
    lines += graph_table(torch, events, args.steps)
    lines += host_waits(torch, events, args.steps)
    lines += allocations
    text = "\n".join(lines)
    print(text)
    name = os.path.splitext(os.path.basename(args.config))[0]
    with open(os.path.join(args.out, f"profile-{name}.txt"), "w") as f:
        f.write(text + "\n")
    return 0


def idle_gaps(torch, events, steps: int, least_us: float = 20.0) -> list[str]:
    """The GPU's idle time between kernels (gaps of `least_us` or more), by what the host was doing then: the
    innermost operation running at the gap's middle, with its innermost frame outside torch (with_stack)."""
    kernels = [(e.time_range.start, e.time_range.end) for e in _kernel_events(torch, events)]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    by: dict[str, list[float]] = {}
    end = kernels[0][1] if kernels else 0
    for start, stop in kernels[1:]:
        if start - end >= least_us:
            middle = (start + end) / 2
            running = [e for e in host if e.time_range.start <= middle <= e.time_range.end]
            inner = min(running, key=lambda e: e.time_range.end - e.time_range.start, default=None)
            label = "the host in no operation" if inner is None else f"{inner.name[:60]}  {_own_frame(inner)[-90:]}"
            by.setdefault(label, []).append((start - end) / 1e3)
        end = max(end, stop)
    if not kernels:
        return []
    total = sum(sum(v) for v in by.values()) / steps
    lines = [f"GPU idle between kernels (gaps of {least_us:g} us or more): {total:.1f} ms a step, by what the host did then:"]
    for label, gaps in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:25]:
        lines.append(f"  {sum(gaps) / steps:8.2f} ms  {len(gaps) / steps:6.1f} gaps  {label}")
    return lines


def gap_timelines(torch, events, count: int, least_ms: float = 0.1) -> list[str]:
    """For the `count` longest idle gaps: the host's operations that overlap each (of `least_ms` or more, in
    the order they began, indented by depth), with their start from the gap's start and their length, and the
    kernels on either side: what kept the host from launching while the GPU waited."""
    if not count:
        return []
    gaps, end, last = [], None, None
    for e in _kernel_events(torch, events):
        if end is not None and e.time_range.start - end > 0:
            gaps.append((e.time_range.start - end, end, e.time_range.start, last, e))
        if end is None or e.time_range.end > end:
            end, last = e.time_range.end, e
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    lines = []
    for length, start, stop, before, after in sorted(gaps, key=lambda g: -g[0])[:count]:
        lines.append(f"idle gap of {length / 1e3:.2f} ms, after {before.name[:70]}, before {after.name[:70]}:")
        shown = 0
        for e in sorted(host, key=lambda e: e.time_range.start):
            if shown == 80:
                lines.append("  (more not shown)")
                break
            span = e.time_range.end - e.time_range.start
            if e.time_range.end < start or e.time_range.start > stop or span < least_ms * 1e3:
                continue
            depth, parent = 0, e.cpu_parent
            while parent is not None:
                depth, parent = depth + 1, parent.cpu_parent
            at, shown = (e.time_range.start - start) / 1e3, shown + 1
            lines.append(f"  {at:+9.2f} ms {span / 1e3:8.2f} ms  {'  ' * min(depth, 12)}{e.name[:70]}  {_own_frame(e)[-70:]}")
    return lines


def _kernel_events(torch, events) -> list:
    """The GPU's kernels, copies and fills, by start; a range a user annotated (Optimizer.step#AdamW.step) spans
    the kernels it launched, and is not one of them."""
    return sorted(
        (e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)),
        key=lambda e: e.time_range.start,
    )


def _own_frame(event) -> str:
    """The innermost frame of `event`'s Python stack (with_stack) outside torch, or ''."""
    frames = [f for f in (getattr(event, "stack", None) or []) if "/torch/" not in f and "<built-in" not in f]
    return frames[0] if frames else ""


GRAPH_CALL = "## Call CompiledFxGraph"


def graph_table(torch, events, steps: int) -> list[str]:
    """Each compiled graph's calls a step, its host time (the call's own span) and the GPU time of the kernels
    it launched, itself or through the operations it called, by kind: which graph is the optimizer's step,
    the loss's or a block's, so that a graph named in the idle gaps above has a role."""
    rows = []
    for name, calls in _graph_calls(events).items():
        kernels: dict[str, float] = {}
        for call in calls:
            for launched in _launched(call):
                kernels[kind(launched.name)] = kernels.get(kind(launched.name), 0.0) + launched.duration / 1e3
        host = sum(c.time_range.end - c.time_range.start for c in calls) / 1e3
        kinds = ", ".join(f"{label} {ms / steps:.2f}" for label, ms in sorted(kernels.items(), key=lambda kv: -kv[1]))
        graph = name[len(GRAPH_CALL) :].strip()[:40]
        rows.append((host / steps, f"{len(calls) / steps:5.1f} {host / steps:8.2f}  {graph:<40} {kinds or '-'}"))
    if not rows:
        return []
    head = "compiled graphs a step: calls, host ms (the call's span), graph, GPU ms of its kernels by kind:"
    return [head] + ["  " + row for _, row in sorted(rows, key=lambda r: -r[0])[:20]]


def _graph_calls(events) -> dict:
    calls: dict[str, list] = {}
    for e in events:
        if e.name.startswith(GRAPH_CALL):
            calls.setdefault(e.name, []).append(e)
    return calls


def _launched(event):
    """The kernels `event` and the operations under it launched (the profiler's links by correlation id)."""
    stack = [event]
    while stack:
        e = stack.pop()
        yield from e.kernels
        stack += e.cpu_children


# The CUDA runtime's calls that can keep the host until the GPU is done: the synchronisations, and the copies
# (one to or from pageable host memory waits for the stream; their time says which did).
WAITS = r"Synchronize|cudaMemcpy"


def host_waits(torch, events, steps: int) -> list[str]:
    """Where the host waited for the GPU (the runtime's synchronising calls), by the operation that made
    the call: after each wait the GPU idles until the host launches again."""
    by: dict[str, list[float]] = {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CPU and re.search(WAITS, e.name):
            parent = e.cpu_parent.name[:60] if e.cpu_parent is not None else "no operation"
            by.setdefault(f"{e.name[:28]:<28} in {parent}", []).append((e.time_range.end - e.time_range.start) / 1e3)
    if not by:
        return ["the host's waits for the GPU: none in the profiled steps"]
    lines = ["the host's waits for the GPU a step (count, ms), by the call and the operation that made it:"]
    for label, waits in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:12]:
        lines.append(f"  {len(waits) / steps:6.1f} {sum(waits) / steps:8.2f} ms  {label}")
    return lines


def allocator_lines(before: dict, after: dict, steps: int) -> list[str]:
    """The caching allocator's calls to the driver a step (cudaMalloc, cudaFree, retries after a failed
    allocation): each a host stall, where the step's memory does not settle."""
    if not after:
        return []
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    delta = {k: (after.get(k, 0) - before.get(k, 0)) / steps for k in keys}
    return [
        f"the allocator a step: {delta['num_device_alloc']:.1f} cudaMalloc, {delta['num_device_free']:.1f} cudaFree,"
        f" {delta['num_alloc_retries']:.1f} retries (peak {after.get('allocated_bytes.all.peak', 0) / 2**30:.1f} GiB)"
    ]


if __name__ == "__main__":
    sys.exit(main())
