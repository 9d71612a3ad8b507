#!/usr/bin/env bash
# Install autocompile in .venv and run a real search: llama-8b on a GPU, tiny-llama on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
pip install -q torch==2.13.0 -e .
if python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  # 30 minutes on one H200: baselines, the recipes, TPE, then the finalist round. Plain
  # torch.compile needed 499 s to warm up on llama-8b (studies/README.md), so the baselines
  # get 600 s where every other trial gets 300.
  autocompile search --model llama-8b --trials 12 --timeout 1800 --trial-timeout 300 --baseline-timeout 600 "$@"
else
  # About 3 minutes on 2 CPU cores. The horizon is long because on a toy model compiling
  # only pays off over many steps (see "Scoring" in README.md).
  autocompile search --model tiny-llama --trials 4 --timeout 160 --horizon-steps 20000 "$@"
fi
