#!/bin/bash
# Issue 40 item 6, reproduced: a process forks 3 sleeping children; `drain --pid` it; count
# the processes of that task still running afterwards (zombies have exited and are not
# counted; they are listed apart: `kill -0` still succeeds on them until PID 1 reaps them).
# Usage: tests/drain/reproduce_drain_survivors.sh [RUNS] [BUSY_LOOPS]
# Runs from the repository root; BUSY_LOOPS `nice -n 19` CPU burners run meanwhile.
set -u
runs=${1:-20}
busy=${2:-2}
mp=${MARKET_PIPELINE:-.venv/bin/market-pipeline}
state=$(mktemp -d)
export MP__ADAPTER__STATE_PATH=$state/state.json
burners=()
for _ in $(seq 1 "$busy"); do
  nice -n 19 python3 -c 'while 1: pass' &
  burners+=($!)
done
trap 'kill "${burners[@]}" 2>/dev/null; rm -rf "$state"' EXIT
total=0
bad=0
for i in $(seq 1 "$runs"); do
  mark="drain-repro-$$-$i"
  python3 -c "import os,time; kids=[os.fork() or (time.sleep(120), os._exit(0)) for _ in range(3)]; time.sleep(120)  # $mark" &
  p=$!
  sleep 1
  kids=$(pgrep -P "$p")
  out=$($mp drain --backend local-process --pid "$p" --warn-seconds 1 --timeout-seconds 2 --audit memory --json 2>&1)
  rc=$?
  wait "$p" 2>/dev/null
  left=0
  zombies=0
  for k in $kids; do
    [ "$(ps -o stat= -p "$k" 2>/dev/null | cut -c1)" = Z ] && zombies=$((zombies + 1))
  done
  for q in $(pgrep -f "$mark"); do
    st=$(ps -o stat= -p "$q" 2>/dev/null | tr -d ' ')
    case "$st" in "" | Z*) ;; *) left=$((left + 1)) ;; esac
  done
  summary=$(printf '%s' "$out" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print(d["outcome"], "->".join(d["states"]))' 2>/dev/null || printf '%s' "$out" | tail -1)
  echo "run $i: rc=$rc left=$left exited-unreaped=$zombies $summary"
  total=$((total + left))
  [ "$left" -gt 0 ] && bad=$((bad + 1))
  for q in $(pgrep -f "$mark"); do kill -9 "$q" 2>/dev/null; done
done
echo "surviving processes: $total in $bad of $runs runs"
