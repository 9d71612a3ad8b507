"""Measure a few named configurations of one workload in turn, each with `autocompile trial` (its own
process, cold caches), alternating as given, and print each run's steady speed, warm-up and score.

    python3 scripts/compare_configs.py MODEL CONFIGS.json ORDER [--horizon 10000] [--budget 400] [--out DIR] [--clocks]

CONFIGS.json maps a name to a configuration (as `autocompile trial --config` takes it); ORDER is the
names, comma-separated, in the order to run them (repeat a name to measure it again). No run starts
after --budget seconds. Each run's record is written to DIR/NN-NAME.json (default $OUT, else .).
With --clocks, nvidia-smi samples the GPU each second of each run (DIR/NN-NAME.clocks.csv) and the line adds
the seconds it measured its steady speed: the median SM clock, the median power draw, and the share of samples
held back by the power cap; a kernel's time at steady load is not its time between a profiler's gaps.
A probe for what to search next, not a search: nothing is stored in a study.
"""

import argparse
import csv
import json
import os
import shutil
import statistics
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
    p.add_argument("--clocks", action="store_true", help="sample the GPU's clock and power with nvidia-smi")
    args = p.parse_args()
    if args.clocks and not shutil.which("nvidia-smi"):
        sys.exit("compare_configs: --clocks samples the GPU with nvidia-smi, which this machine lacks")
    with open(args.configs) as f:
        configs = json.load(f)
    start = time.time()
    head = f"{'run':<14}{'status':<10}{'steps/s':>9}{'cv':>7}{'warm-up s':>11}{'score':>8}{'MFU':>7}"
    print(f"{head}  (horizon {args.horizon})", flush=True)
    for i, name in enumerate(args.order.split(",")):
        if time.time() - start > args.budget:
            print(f"budget of {args.budget:.0f} s spent: the rest not run", flush=True)
            break
        samples = os.path.join(args.out, f"{i:02d}-{name}.clocks.csv")
        sampler = _sample_clocks(samples) if args.clocks else None
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
        if sampler is not None:
            sampler.terminate()
            sampler.wait()
        with open(os.path.join(args.out, f"{i:02d}-{name}.json"), "w") as f:
            json.dump(record, f, indent=1)
        speed, warm, share = record.get("steps_per_s"), record.get("warmup_s"), mfu(record)
        share = f"{100 * share:.1f}%" if share is not None else "-"
        print(
            f"{name:<14}{record.get('status', '?'):<10}{speed or 0:>9.2f}{record.get('cv') or 0:>7.3f}"
            f"{warm or 0:>11.1f}{score(record, args.horizon):>8.2f}{share:>7}  {record.get('reason', '')[:80]}"
            + (_clocks_words(samples, record) if sampler is not None else ""),
            flush=True,
        )
    return 0


CLOCK_FIELDS = "clocks.sm,power.draw,power.limit,clocks_event_reasons.sw_power_cap"


def _sample_clocks(path: str) -> subprocess.Popen:
    """nvidia-smi writing the GPU's SM clock, power and power-cap flag to `path` each second until stopped."""
    with open(path, "w") as f:
        return subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={CLOCK_FIELDS}", "--format=csv,noheader,nounits", "-lms", "1000"],
            stdout=f,
            stderr=subprocess.STDOUT,
        )


def _clocks_words(path: str, record: dict) -> str:
    """The GPU while the trial measured its steady speed: median SM clock (MHz), median power (W) of its limit,
    and the share of those samples held back by the power cap. The window is the record's measured steps at
    its speed (at least one sample), counted back from the last sample before the draw fell under half its
    highest (the process ending); a trial's samples are mostly its compiling, when the GPU idles at full clock."""
    rows = []
    with open(path) as f:
        for row in csv.reader(f):
            try:
                rows.append((float(row[0]), float(row[1]), float(row[2]), row[3].strip() == "Active"))
            except (ValueError, IndexError):
                continue
    speed, steps = record.get("steps_per_s"), record.get("measured_steps")
    if not rows or not speed or not steps:
        return "  [no clock samples of a measured window]"
    top = max(r[1] for r in rows)
    while len(rows) > 1 and rows[-1][1] < top / 2:
        rows.pop()
    rows = rows[-max(1, round(steps / speed)) :]
    clock, power, limit = (statistics.median(r[k] for r in rows) for k in range(3))
    capped = sum(r[3] for r in rows) / len(rows)
    return f"  [measuring, {len(rows)} s: SM {clock:.0f} MHz, {power:.0f} of {limit:.0f} W, power-capped {capped:.0%}]"


if __name__ == "__main__":
    sys.exit(main())
