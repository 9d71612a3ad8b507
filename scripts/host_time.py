"""How much host time one training step of a configuration takes, by phase (prepare_batch, forward and loss,
backward, the optimizer's step, the schedule and zero_grad), on the CPU: where a GPU step could wait for the host.

    python3 scripts/host_time.py MODEL CONFIG.json [--warmup 40] [--steps 32]

MODEL may be `scripts/host_time.py:llama_8b_toy_width`: llama-8b's 32 blocks and 291 parameter tensors at toy
width, sequences up to 128 tokens, so that what a step costs is the host's work (Python, dispatch, Dynamo's
guards, launches) rather than arithmetic. The configuration runs with the model's own attention (FlexAttention
has no backward on the CPU). A probe for issue 45, not a measurement of speed.
"""

import argparse
import statistics
import sys
import time

PHASES = ("prepare_batch", "forward and loss", "backward", "optimizer step", "schedule, zero_grad")


def llama_8b_toy_width():
    import torch

    from autocompile.workloads._llama import LLAMA_3_1_8B, _make

    narrow = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    return _make(
        "llama-8b-toy-width",
        "llama-8b's blocks and parameter tensors at toy width: a step's host work",
        {**LLAMA_3_1_8B, **narrow},
        batch_size=2,
        seq_len=128,
        dtype_on_cuda=torch.bfloat16,
        dtype_on_cpu=torch.float32,
        pool=16,
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("config")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=32)
    args = p.parse_args()
    from _probe import training_for

    t = training_for(args.model, args.config, "cpu", pack_attention="model")
    start = time.perf_counter()
    for i in range(args.warmup):
        t.step(i)
    print(f"{args.model} {args.config} (cpu): warm-up {time.perf_counter() - start:.1f} s; host time a step by phase:")
    phases: dict[str, list[float]] = {}
    for i in range(args.warmup, args.warmup + args.steps):
        marks = [time.perf_counter()]
        batch = t.prepare_batch(dict(t.batches[i % len(t.batches)]))
        marks.append(time.perf_counter())
        loss = t.compute_loss(batch)
        marks.append(time.perf_counter())
        t.backward(loss)
        marks.append(time.perf_counter())
        t.optimizer.step()
        marks.append(time.perf_counter())
        if t.scheduler is not None:
            t.scheduler.step()
        t.optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        for name, a, b in zip(PHASES, marks, marks[1:]):
            phases.setdefault(name, []).append(1e3 * (b - a))
    for name, ms in phases.items():
        print(f"  {name:<22}{statistics.median(ms):8.2f} ms")
    print(f"  {'step':<22}{sum(statistics.median(ms) for ms in phases.values()):8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
