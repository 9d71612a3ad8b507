"""Measure a few named configurations of one workload in turn, each with `autocompile trial` (its own
process, cold caches), alternating as given, and print each run's steady speed, warm-up and score.

    python3 scripts/compare_configs.py MODEL CONFIGS.json ORDER [--horizon 10000] [--budget 400] [--out DIR]

CONFIGS.json maps a name to a configuration (as `autocompile trial --config` takes it); ORDER is the
names, comma-separated, in the order to run them (repeat a name to measure it again). No run starts
after --budget seconds. Each run's record is written to DIR/NN-NAME.json (default $OUT, else .).
A probe for what to search next, not a search: nothing is stored in a study.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from autocompile.engine.scoring import score
from autocompile.outputs.table import mfu


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("configs")
    p.add_argument("order")
    p.add_argument("--horizon", type=int, default=10000)
    p.add_argument("--budget", type=float, default=400.0)
    p.add_argument("--trial-timeout", type=float, default=240.0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    with open(args.configs) as f:
        configs = json.load(f)
    start = time.time()
    head = f"{'run':<14}{'status':<10}{'steps/s':>9}{'cv':>7}{'warm-up s':>11}{'score':>8}{'MFU':>7}"
    print(f"{head}  (horizon {args.horizon})", flush=True)
    for i, name in enumerate(args.order.split(",")):
        if time.time() - start > args.budget:
            print(f"budget of {args.budget:.0f} s spent: the rest not run", flush=True)
            break
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "autocompile",
                "trial",
                "--model",
                args.model,
                "--json",
                "-q",
                "--config",
                json.dumps(configs[name]),
                "--trial-timeout",
                str(args.trial_timeout),
            ],
            capture_output=True,
            text=True,
        )
        try:
            record = json.loads(run.stdout)
        except json.JSONDecodeError:
            record = {"status": "no record", "reason": (run.stderr or run.stdout)[-2000:]}
        with open(os.path.join(args.out, f"{i:02d}-{name}.json"), "w") as f:
            json.dump(record, f, indent=1)
        speed, warm, share = record.get("steps_per_s"), record.get("warmup_s"), mfu(record)
        share = f"{100 * share:.1f}%" if share is not None else "-"
        print(
            f"{name:<14}{record.get('status', '?'):<10}{speed or 0:>9.2f}{record.get('cv') or 0:>7.3f}"
            f"{warm or 0:>11.1f}{score(record, args.horizon):>8.2f}{share:>7}  {record.get('reason', '')[:80]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
