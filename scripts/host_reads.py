"""Where one training step reads a tensor's value on the host (item, tolist, bool, nonzero, ...), each
one a device synchronisation on a GPU: the step's GPU queue drains there and waits for the host.

    python3 scripts/host_reads.py MODEL CONFIG.json [--device cpu]

The configuration runs with compile off (its padding, packing and attention as given): what the
step's eager code reads, the code that a regional compile leaves around its compiled blocks. Counted
with a TorchFunctionMode over one step after three, prepare_batch included, with the device of the tensor
read (reads of CPU tensors, such as an eager AdamW's step counters, wait for nothing). A probe for issue 45.
"""

import argparse
import collections
import sys
import traceback

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu", "any", "all"}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("config")
    p.add_argument("--device", default=None)
    args = p.parse_args()
    import torch
    from torch.overrides import TorchFunctionMode

    from _probe import training_for

    class Reads(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.where = collections.Counter()

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in READS:
                outside = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
                f = outside[-1]
                on = next((str(a.device) for a in args if isinstance(a, torch.Tensor)), "?")  # a CPU tensor's read: no sync
                self.where[(func.__name__, on, f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}")] += 1
            return func(*args, **(kwargs or {}))

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    training = training_for(args.model, args.config, device, compile=False)
    for i in range(3):
        training.step(i)
    with Reads() as reads:
        training.step(0)
    print(f"{args.model} {args.config} ({device}, compile off): host reads in one step")
    for (name, on, where), n in reads.where.most_common():
        print(f"{n:4d}  {name:<10}{on:<8}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
