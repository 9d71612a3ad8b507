#!/usr/bin/env bash
# Run studies on the GPU machine in the background and follow them across device calls.
#   bash scripts/gpu_study.sh start 'ARGS...' ['ARGS...' ...]  # one after another: search ARGS, or
#       a job that names its command first ('screen-check --study S ...', 'export --study S ...'), or
#       'trial ... --dir /root/autocompile-runs/trial-NAME' (a trial by hand, its folder brought back);
#       a job's --space studies/NAME.toml is this checkout's space file
#   GPU=1 bash scripts/gpu_study.sh start ...  # on a host of several GPUs: a queue of its own on GPU 1
#       (CUDA_VISIBLE_DEVICES=1, log search-gpu1.log), beside the queues of the other GPUs; GPU=0,1: one
#       queue on two GPUs (a search with --gpus 2 or --nproc 2, log search-gpu0-1.log)
#   bash scripts/gpu_study.sh watch SECONDS   # print progress for up to SECONDS (until every queue
#       is done), then collect into $OUT
# Studies live in $RUNS (default /root/autocompile-runs) so that they outlive each call;
# a search killed with its machine resumes from RUNS/STUDY/study.db.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-/root/autocompile-runs}
source scripts/gpu_env.sh || exit 1
mkdir -p "$RUNS"
# The knowledge store of the GPU studies outlives each machine: studies/gpu-knowledge.db here, brought
# back into $OUT after each call (commit it there again). The queues share it (SQLite locks).
export AUTOCOMPILE_CACHE="$RUNS/memory"
mkdir -p "$AUTOCOMPILE_CACHE"
[ -f "$AUTOCOMPILE_CACHE/knowledge.db" ] || [ ! -f studies/gpu-knowledge.db ] || cp studies/gpu-knowledge.db "$AUTOCOMPILE_CACHE/knowledge.db"
# Collect: each queue's log (and a script's, run beside the queues as $RUNS/search-NAME.log), the knowledge store, and one archive of every study and trial folder
# (their compile caches left out; at most 8 files come back from a call). `watch` collects every
# COLLECT_S seconds and when it is stopped, so that a call cut by the device's limit (its time or
# the session's device time running out) still brings back what had finished.
collect() {
  [ -n "${OUT:-}" ] || return 0
  cp "$RUNS"/search-*.log "$RUNS/device.txt" "$OUT/" 2>/dev/null
  [ -f "$AUTOCOMPILE_CACHE/knowledge.db" ] && cp "$AUTOCOMPILE_CACHE/knowledge.db" "$OUT/gpu-knowledge.db"
  folders=()
  for d in "$RUNS"/*/; do
    s=$(basename "$d")
    [ -f "$d/study.db" ] || [ -f "$d/journal.log" ] || [ -f "$d/spec.json" ] || [ -f "$d/cache-check.json" ] \
      || [[ $s == probe-* ]] && folders+=("$s")  # probe-*: a script's output folder (--out)
  done
  [ ${#folders[@]} -gt 0 ] && tar -czf "$OUT/runs.tar.gz.part" -C "$RUNS" --exclude='cache' "${folders[@]}" \
    && mv "$OUT/runs.tar.gz.part" "$OUT/runs.tar.gz"
  return 0
}
queue=${GPU:+gpu${GPU//,/-}}; queue=${queue:-all}  # GPU=0,1: one queue on two GPUs (gpu0-1)
case "$1" in
  start)
    shift
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$RUNS/device.txt"
    python3 -c 'import torch, transformers, optuna; print("torch", torch.__version__, "transformers", transformers.__version__, "optuna", optuna.__version__)' | tee -a "$RUNS/device.txt"
    # Each queue runs from its own copy of the package, so a later call's fresh checkout cannot
    # change the code under a running study.
    src="$RUNS/src-$queue"
    rm -rf "$src" && mkdir -p "$src/studies" && cp -r autocompile "$src/" && cp studies/*.toml "$src/studies/" && cp -r studies/configs "$src/studies/"
    : > "$RUNS/commands-$queue.txt"
    for job in "$@"; do
      case "$job" in
        trial*) echo "python3 -m autocompile $job" >> "$RUNS/commands-$queue.txt"; continue ;;  # its own --dir $RUNS/trial-NAME
        screen-check*|cache-check*|export*|best*|report*|rejudge*|repro*) cmd=$job ;;
        *) cmd="search $job" ;;
      esac
      echo "python3 -m autocompile $cmd --dir $RUNS" >> "$RUNS/commands-$queue.txt"
    done
    visible=${GPU:+CUDA_VISIBLE_DEVICES=$GPU}
    setsid nohup env $visible PYTHONPATH="$src:$PYTHONPATH" AUTOCOMPILE_CACHE="$AUTOCOMPILE_CACHE" bash -c "cd $src; while read -r cmd; do echo \"\$ \$cmd (\$(date -u +%FT%TZ))\"; \$cmd; echo \"exit \$?\"; done < $RUNS/commands-$queue.txt" \
      > "$RUNS/search-$queue.log" 2>&1 < /dev/null &
    echo "started queue $queue${GPU:+ (GPU $GPU)}: $(wc -l < "$RUNS/commands-$queue.txt") jobs, log $RUNS/search-$queue.log"
    ;;
  watch)
    # A fresh machine has no queue: the last call's machine was given back (idle, or its 30 minutes), and
    # its studies with it. Say so at once instead of watching nothing until the call's end (2026-11-29:
    # a watch spent the session's last 560 s of device time so).
    if ! compgen -G "$RUNS/commands-*.txt" > /dev/null; then
      echo "gpu_study.sh watch: no queue on this machine (a fresh one: the machine that ran the last call was given back, its studies with it); resume with start" >&2
      exit 3
    fi
    end=$((SECONDS + ${2:-500})); next=$((SECONDS + ${COLLECT_S:-120}))
    trap 'collect; exit 143' TERM INT
    while [ $SECONDS -lt $end ]; do
      sleep 20 & wait $!  # (a TERM is trapped at once, not after the sleep)
      [ $SECONDS -ge $next ] && { collect; next=$((SECONDS + ${COLLECT_S:-120})); }
      busy=0
      for c in "$RUNS"/commands-*.txt; do
        log="$RUNS/search-$(basename "$c" .txt | sed 's/^commands-//').log"
        [ "$(grep -c '^exit' "$log" 2>/dev/null)" -ge "$(wc -l < "$c")" ] || busy=1
      done
      [ $busy = 0 ] && break
    done
    ;;
esac
collect
for log in "$RUNS"/search-*.log; do
  echo "== $(basename "$log")"; grep -v "^  \[" "$log" | tail -${TAIL:-25}
done
