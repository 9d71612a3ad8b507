#!/usr/bin/env bash
# Run studies on the GPU machine in the background and follow them across device calls.
#   bash scripts/gpu_study.sh start 'ARGS...' ['ARGS...' ...]  # one after another: search ARGS, or
#       a job that names its command first ('screen-check --study S ...', 'export --study S ...'), or
#       'trial ... --dir /root/autocompile-runs/trial-NAME' (a trial by hand, its folder brought back);
#       a job's --space studies/NAME.toml is this checkout's space file
#   bash scripts/gpu_study.sh watch SECONDS   # print progress for up to SECONDS, then collect into $OUT
# Studies live in $RUNS (default /root/autocompile-runs) so that they outlive each call;
# a search killed with its machine resumes from RUNS/STUDY/study.db.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-/root/autocompile-runs}
source scripts/gpu_env.sh || exit 1
mkdir -p "$RUNS"
# The failure memory of the GPU studies outlives each machine: studies/gpu-failures.db here, brought
# back into $OUT after each call (commit it there again).
export AUTOCOMPILE_CACHE="$RUNS/memory"
mkdir -p "$AUTOCOMPILE_CACHE"
[ -f "$AUTOCOMPILE_CACHE/failures.db" ] || [ ! -f studies/gpu-failures.db ] || cp studies/gpu-failures.db "$AUTOCOMPILE_CACHE/failures.db"
case "$1" in
  start)
    shift
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RUNS/device.txt"
    python3 -c 'import torch, transformers, optuna; print("torch", torch.__version__, "transformers", transformers.__version__, "optuna", optuna.__version__)' | tee -a "$RUNS/device.txt"
    # The searches run from a copy of the package, so a later call's fresh checkout cannot
    # change the code under a running study.
    rm -rf "$RUNS/src" && mkdir -p "$RUNS/src/studies" && cp -r autocompile "$RUNS/src/" && cp studies/*.toml "$RUNS/src/studies/" && cp -r studies/configs "$RUNS/src/studies/"
    : > "$RUNS/commands.txt"
    for job in "$@"; do
      case "$job" in
        trial*) echo "python3 -m autocompile $job" >> "$RUNS/commands.txt"; continue ;;  # its own --dir $RUNS/trial-NAME
        screen-check*|cache-check*|export*|best*|report*|rejudge*|repro*) cmd=$job ;;
        *) cmd="search $job" ;;
      esac
      echo "python3 -m autocompile $cmd --dir $RUNS" >> "$RUNS/commands.txt"
    done
    setsid nohup env PYTHONPATH="$RUNS/src:$PYTHONPATH" AUTOCOMPILE_CACHE="$AUTOCOMPILE_CACHE" bash -c "cd $RUNS/src; while read -r cmd; do echo \"\$ \$cmd (\$(date -u +%FT%TZ))\"; \$cmd; echo \"exit \$?\"; done < $RUNS/commands.txt" \
      > "$RUNS/search.log" 2>&1 < /dev/null &
    echo "started: $(cat "$RUNS/commands.txt" | wc -l) jobs, log $RUNS/search.log"
    ;;
  watch)
    end=$((SECONDS + ${2:-500}))
    while [ $SECONDS -lt $end ]; do
      sleep 20
      grep -q "^exit" "$RUNS/search.log" 2>/dev/null && [ "$(grep -c '^exit' "$RUNS/search.log")" -ge "$(wc -l < "$RUNS/commands.txt")" ] && break
    done
    ;;
esac
# Collect: the log, the failure memory, each study's folder (8 files at most come back).
if [ -n "${OUT:-}" ]; then
  cp "$RUNS/search.log" "$RUNS/device.txt" "$OUT/" 2>/dev/null
  [ -f "$AUTOCOMPILE_CACHE/failures.db" ] && cp "$AUTOCOMPILE_CACHE/failures.db" "$OUT/gpu-failures.db"
  for d in "$RUNS"/cache-check-*/; do  # `cache-check --dir $RUNS`: its runs and table
    [ -f "$d/cache-check.json" ] && cp "$d/cache-check.json" "$OUT/$(basename "$d").json"
  done
  for d in "$RUNS"/*/; do
    s=$(basename "$d"); [ -f "$d/study.db" ] || [ -f "$d/journal.log" ] || [ -f "$d/spec.json" ] || continue
    tar -czf "$OUT/$s.tar.gz" -C "$RUNS" --exclude='cache' "$s"
  done
fi
grep -v "^  \[" "$RUNS/search.log" | tail -40
