#!/usr/bin/env bash
# Does the optimizer step in the backward (step_in_backward) overlap the backward's matmuls once cuBLAS leaves it
# some SMs? Where cuBLAS spreads the matmuls over every SM, the step's memory-bound kernels on their own stream wait
# for them instead of running beside them (docs/results.md, the llama-8b section). torch's experimental SM carveout
# (torch._C._set_sm_carveout_experimental) keeps N SMs out of cuBLAS's matmuls.
# An N written N+hi also gives every CUDA stream made after start-up (step_in_backward's side stream) the highest
# priority, so that the step's blocks go first onto each SM a kernel frees.
#   bash scripts/sm_carveout_probe.sh MODEL CONFIGS.json NAME [N|N+hi ...]   # on the GPU machine, in the repository root
# First a bf16 matmul timed under each carveout (does this torch and cuBLAS honour it?), then NAME's configuration
# measured by scripts/compare_configs.py (--clocks) once without (N 0, first) and under each N, each a cold trial in
# a process of its own; records in $OUT/carveout-N/. A probe for what to search next, outside the snippet: the
# carveout and the priority are set as each Python process starts (a sitecustomize on PYTHONPATH), not by the
# configuration.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh || exit 1
model=$1 configs=$2 name=$3
shift 3
carveouts=("${@:-16}")
site=$(mktemp -d)
cat > "$site/sitecustomize.py" <<'PY'
import os

if os.environ.get("AUTOCOMPILE_PROBE_SM_CARVEOUT"):
    import torch

    torch._C._set_sm_carveout_experimental(int(os.environ["AUTOCOMPILE_PROBE_SM_CARVEOUT"]))
if os.environ.get("AUTOCOMPILE_PROBE_HIGH_PRIORITY"):
    import torch

    class Stream(torch.cuda.Stream):
        def __new__(cls, device=None, priority=0, **kwargs):
            if "stream_id" not in kwargs:  # a new stream, not torch's handle on an existing one (current_stream)
                priority = -100  # mapped to the highest
            return super().__new__(cls, device, priority=priority, **kwargs)

    torch.cuda.Stream = Stream
PY
python3 - "${carveouts[@]}" <<'PY' 2>&1 | grep -v Warning | tee "${OUT:-.}/carveout-matmul.txt"
import sys, time, torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for n in sorted({0} | {int(x.split('+')[0]) for x in sys.argv[1:]}):
    torch._C._set_sm_carveout_experimental(n)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(40):
        a @ b
    torch.cuda.synchronize()
    print(f"carveout {n}: a bf16 8192^3 matmul at {2 * 8192**3 * 40 / (time.perf_counter() - start) / 1e12:.0f} TFLOP/s")
PY
for arg in 0 "${carveouts[@]}"; do
  n=${arg%+hi}
  high=$([ "$arg" = "$n" ] || echo 1)
  out="${OUT:-.}/carveout-$arg"
  mkdir -p "$out"
  value=$([ "$n" = 0 ] || echo "$n")
  AUTOCOMPILE_PROBE_SM_CARVEOUT=$value AUTOCOMPILE_PROBE_HIGH_PRIORITY=$high PYTHONPATH="$site:$PYTHONPATH" python3 scripts/compare_configs.py "$model" "$configs" "$name" \
    --budget 1 --clocks --out "$out" 2>&1 | grep -v Warning | tee "$out/compare.log" | tail -1 | sed "s/^/carveout $arg: /"
done
