#!/usr/bin/env bash
# Does a host-bound configuration vary less between runs when its process runs on the CPUs local
# to its GPU? (The captioner's configurations without CUDA graphs ran 17.3 then 12.7 steps/s in two
# trials of one study, H200, 2026-11-23, while its CUDA-graph ones agreed within 2%.)
#   bash scripts/affinity_check.sh STUDY TRIAL [RUNS]   # on the GPU machine, in the repository root
# Runs the trial's configuration RUNS times (default 2) as it is, then RUNS times under `taskset`
# with the GPU's local CPUs (/sys/bus/pci/devices/BUS/local_cpulist), each a cold `autocompile trial`,
# alternating; prints steps/s and warm-up of each, and writes them to $OUT/affinity-STUDY-TRIAL.jsonl.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh || exit 1
study=$1 trial=$2 runs=${3:-2}
record=studies/$study/trials/$(printf %04d "$trial")/result.json
[ -f "$record" ] || { echo "affinity_check: no $record"; exit 2; }
model=$(python3 -c "import json; print(json.load(open('studies/$study/trials/$(printf %04d "$trial")/spec.json'))['model'])")
python3 -c "import json; print(json.dumps(json.load(open('$record'))['config']))" > /tmp/affinity-config.json
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
cpus=$(cat "/sys/bus/pci/devices/$bus/local_cpulist" 2>/dev/null || true)
echo "GPU $bus, local CPUs: ${cpus:-unknown}; this process may run on: $(taskset -pc $$ | sed 's/.*: //')"
[ -n "$cpus" ] || { echo "affinity_check: the GPU's local CPUs are not known here"; exit 2; }
out=${OUT:-/tmp}/affinity-$study-$trial.jsonl
: > "$out"
for i in $(seq "$runs"); do
  for pin in none local; do
    prefix=(); [ "$pin" = local ] && prefix=(taskset -c "$cpus")
    "${prefix[@]}" python3 -m autocompile trial --model "$model" --config @/tmp/affinity-config.json \
      --trial-timeout 400 --json 2>/dev/null |
      python3 -c "import json, sys; r = json.load(sys.stdin); print(json.dumps({'pin': '$pin', 'cpus': '$cpus' if '$pin' == 'local' else 'any', 'run': $i, 'status': r['status'], 'steps_per_s': r.get('steps_per_s'), 'cv': r.get('cv'), 'warmup_s': r.get('warmup_s'), 'device': r.get('device_name'), 'torch': r.get('torch')}))" |
      tee -a "$out"
  done
done
