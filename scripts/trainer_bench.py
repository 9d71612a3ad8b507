"""Time a Trainer's own `trainer.train()`: as built, with its own torch_compile=True, or with a snippet's apply_to_trainer.

    python3 scripts/trainer_bench.py examples/trainer_llama.py:llama_8b plain --steps 60 --warmup 20
    python3 scripts/trainer_bench.py examples/trainer_llama.py:llama_8b torch-compile --steps 60 --warmup 20
    python3 scripts/trainer_bench.py examples/trainer_llama.py:llama_8b studies/NAME/apply_compilation.py --steps 60 --warmup 20

One run a process. trainer.train() runs warmup + steps optimizer steps; a callback synchronises the device at
the end of step `warmup` and of the last step and takes the time: the steady speed. The Trainer's own
train_steps_per_second (the whole run, compile included) and the peak memory are printed beside it, as one
JSON line (--out FILE keeps it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv=None) -> int:
    import torch
    from transformers import TrainerCallback

    from autocompile.apply import load_snippet
    from autocompile.workloads import load_factory

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("factory", help="FILE.py:FACTORY returning a Trainer")
    p.add_argument("how", help="plain, torch-compile, or a snippet file (apply_compilation.py) whose apply_to_trainer is used")
    p.add_argument("--steps", type=int, default=60, help="steps timed after the warm-up")
    p.add_argument("--warmup", type=int, default=20, help="steps before the clock starts (compiles included)")
    p.add_argument("--out", help="append the JSON line to this file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="ARG=VALUE",
        help="a TrainingArguments value (JSON), e.g. logging_nan_inf_filter=false",
    )
    p.add_argument("--non-blocking", action="store_true", help="accelerate's dataloader copies batches with non_blocking=True")
    p.add_argument(
        "--no-full-mask", action="store_true", help="the collator's attention_mask dropped where it is all ones (on the host)"
    )
    p.add_argument("--no-cudnn-sdp", action="store_true", help="torch's SDPA without its cuDNN backend")
    p.add_argument(
        "--profile", type=int, default=0, metavar="N", help="profile N steps after the warm-up: the host's waits for the device"
    )
    args = p.parse_args(argv)

    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    trainer = load_factory(args.factory)()
    trainer.args.max_steps = args.warmup + args.steps
    for item in args.set:
        key, value = item.split("=", 1)
        setattr(trainer.args, key, json.loads(value))
    if args.non_blocking:
        trainer.accelerator.dataloader_config.non_blocking = True
    if args.no_full_mask:
        collate = trainer.data_collator

        def collate_without_full_mask(features):
            batch = collate(features)
            if "attention_mask" in batch and bool(batch["attention_mask"].all()):
                del batch["attention_mask"]
            return batch

        trainer.data_collator = collate_without_full_mask
    if args.how == "torch-compile":  # the Trainer's own compile: accelerate compiles the whole model
        from accelerate.utils import DynamoBackend

        trainer.args.torch_compile = True
        trainer.args.torch_compile_backend = trainer.args.torch_compile_backend or "inductor"
        plugin = trainer.accelerator.state.dynamo_plugin
        plugin.backend = DynamoBackend(trainer.args.torch_compile_backend.upper())
        plugin.mode = trainer.args.torch_compile_mode or plugin.mode
    elif args.how != "plain":
        with open(args.how) as f:
            load_snippet(f.read(), args.how)["apply_to_trainer"](trainer)

    marks: dict[int, float] = {}
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    profiler = torch.profiler.profile(activities=activities) if args.profile else None

    class Clock(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step <= args.warmup:  # a run cut off by a time limit still says where it got
                print(f"step {state.global_step} at {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
            if state.global_step in (1, args.warmup, args.warmup + args.steps):
                _sync()
                marks[state.global_step] = time.perf_counter()
            if profiler and state.global_step == args.warmup:
                profiler.start()
            if profiler and state.global_step == args.warmup + args.profile:
                profiler.stop()

    trainer.add_callback(Clock())
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    metrics = trainer.train().metrics
    row = {
        "factory": args.factory,
        "how": args.how,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "steady_steps_per_s": round(args.steps / (marks[args.warmup + args.steps] - marks[args.warmup]), 4),
        "first_step_s": round(marks[1] - start, 1),
        "warmup_s": round(marks[args.warmup] - start, 1),
        "train_steps_per_second": metrics.get("train_steps_per_second"),
        "train_runtime": metrics.get("train_runtime"),
        "train_loss": metrics.get("train_loss"),
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if torch.cuda.is_available() else None,
        "steps": args.steps,
        "warmup_steps": args.warmup,
    }
    if profiler:  # where the host waited for the device, and what it spent its time on
        row["profile_steps"] = args.profile
        table = profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        print(table, flush=True)
    row["set"] = args.set + (["non_blocking"] if args.non_blocking else []) + (["no_cudnn_sdp"] if args.no_cudnn_sdp else [])
    row["set"] += ["no_full_mask"] if args.no_full_mask else []
    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
