"""A study's winning configuration rendered again by this checkout's apply.py: the snippet a search would emit for it
now, to time a change of the snippet's text on the study's own job (scripts/trainer_bench.py) without a new search.

    python3 scripts/render_winner.py studies/trainer-llama-8b --out /tmp/winner_now.py

The job's model is built once, for what the snippet reads of it (its repeated blocks, its batches' layout); the
configuration is the study's `best` in results.json; the device is the study's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    from autocompile.apply import render_snippet
    from autocompile.space.dimensions import DEFAULTS
    from autocompile.trial.worker import _model_info
    from autocompile.workloads import WorkloadOptions, get_workload

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("study", help="a study's folder: results.json and study.db")
    p.add_argument("--out", required=True, help="write the snippet here")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="change one setting of the winner (JSON value)"
    )
    args = p.parse_args(argv)

    import sqlite3

    with open(os.path.join(args.study, "results.json")) as f:
        results = json.load(f)
    with sqlite3.connect(os.path.join(args.study, "study.db")) as db:
        (value,) = db.execute("select value_json from study_user_attributes where key = 'settings'").fetchone()
    settings = json.loads(value)
    best = results["best"]
    config = {**DEFAULTS, **best["config"]}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in DEFAULTS:
            p.error(f"--set {item}: the winner has no setting {key!r}")
        config[key] = json.loads(value)
    workload = get_workload(settings["model"])
    batches = workload.batches(WorkloadOptions(device="cpu"), 4)
    model, _ = workload.build(WorkloadOptions(device="meta"))
    info = _model_info(workload, WorkloadOptions(device=settings["device"]), model, batches, {})
    header = (
        f"Compile settings for {settings['model']}: study '{results['study']}', trial {best['number']}, rendered again "
        "by scripts/render_winner.py" + (f", with {', '.join(args.set)}." if args.set else ".")
    )
    with open(args.out, "w") as f:
        f.write(render_snippet(config, info, header=header))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
