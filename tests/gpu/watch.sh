#!/usr/bin/env bash
# On the GPU machine: run the acceptance suite in the background, so it goes on between time-limited device calls
# while the machine stays warm, wait up to WAIT seconds, and copy its results and server logs to $OUT.
#   tests/gpu/watch.sh start WAIT [ARGS...]   start python -m ddtree_runtime.acceptance ARGS (via device.sh run)
#   tests/gpu/watch.sh wait WAIT              wait for the running suite
#   tests/gpu/watch.sh stop                   SIGTERM the suite (it stops its server by PID), then collect
# The wait ends early when the suite exits; its exit code is in $OUT/exit_code.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
acc=${PIVOT_ACCEPTANCE_OUT:-/tmp/acc}
out=${OUT:-/tmp/acc-out}
action=${1:?usage: watch.sh start WAIT [ARGS...] | wait WAIT | stop}
case $action in
start)
  wait_s=${2:?WAIT}; shift 2
  mkdir -p "$acc"
  rm -f "$acc/exit_code"
  # shellcheck disable=SC2016  # expanded by the inner bash, from its arguments
  setsid nohup bash -c '"$0" run python3 -m ddtree_runtime.acceptance --out "$1" "${@:2}"; echo $? > "$1/exit_code"' \
    "$repo/tests/gpu/device.sh" "$acc" "$@" > "$acc/suite.log" 2>&1 < /dev/null &
  echo $! > "$acc/suite.pid"
  ;;
wait) wait_s=${2:?WAIT} ;;
stop) wait_s=0; kill -TERM "$(cat "$acc/suite.pid")" 2>/dev/null; sleep 35 ;;
*) echo "watch.sh: unknown action $action" >&2; exit 2 ;;
esac
deadline=$((SECONDS + wait_s))
while [ ! -f "$acc/exit_code" ] && [ $SECONDS -lt $deadline ]; do sleep 3; done
mkdir -p "$out"
cp "$acc"/results.md "$acc"/results.json "$acc"/suite.log "$acc"/exit_code "$out"/ 2>/dev/null
(cd "$acc" && tar -czf "$out/logs.tgz" --exclude=models ./*.log 2>/dev/null)
nvidia-smi --query-gpu=memory.used --format=csv,noheader
tail -n 5 "$acc/suite.log"
grep -E '\| (FAIL|fail)|FAILED' "$acc/results.md" 2>/dev/null | cut -c1-400 | head -20
cat "$acc/exit_code" 2>/dev/null || echo "suite still running"
