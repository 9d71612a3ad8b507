#!/usr/bin/env bash
# Install autocompile in .venv and run a real search: llama-8b on a GPU, tiny-llama on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e .
if python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  # 30 minutes on one GPU, used whole: baselines, the recipes, neighbours and TPE until --timeout
  # leaves the finalist round its time (--trials only caps it). Plain torch.compile needed 499 s to
  # warm up on llama-8b (studies/README.md), so the baselines get 600 s where every other trial gets
  # 300; the horizon is the steps eager runs in ten times the budget (engine/horizon.py).
  autocompile search --model llama-8b --trials 100 --timeout 1800 --trial-timeout 300 --baseline-timeout 600 "$@"
else
  # About 3 minutes on 2 CPU cores: eager, the recipe, a neighbour of the best, plain torch.compile
  # with what is left (run first, its 90 s limit could take the time the recipe and a neighbour need:
  # engine/claims.py, plain_compile_waits), then the finalist round against eager; where the recipe or
  # a neighbour has no result before the round, the search says so. studies/quickstart-cpu.toml keeps the space to
  # what pays off on 2 cores and fits that time; the horizon is a run of 100000 steps (10 minutes
  # of this toy), over which a warm-up of 15-50 s must pay for itself (docs/scoring.md).
  # Plain torch.compile warmed up in 33-49 s on 2 cores (its trial 66 s with another process
  # compiling beside it, and 60 s cut it once, 2026-11-25), so its baseline gets 90 s; the search
  # still gives it no more than half the time left. A step of this toy is about 7 ms of small ops
  # (dispatch-bound), of which compiling saves a third or more, and eager's two threads stall when
  # another process takes a core: one short measurement decides nothing, so the finalist round
  # measures in windows of 2 s or more and judges each configuration, eager too, by all its runs
  # (docs/measurement.md, Finalists). A run of it: studies/runs/2026-11-26-cpu-quickstart.log.
  # No pruning: on 2 cores one stalled window can stop a neighbour as unable to win, where a few seconds
  # more of measuring show its steady speed (docs/results.md, the CPU quickstart).
  autocompile search --model tiny-llama --trials 5 --finalists 1 --timeout 180 --baseline-timeout 90 \
    --horizon-steps 100000 --no-prune --space studies/quickstart-cpu.toml "$@"
fi
