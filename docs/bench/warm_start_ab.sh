#!/usr/bin/env bash
# Tenth session: cuDNN autotuning for the streamed (small) batches on and off (EngineConfig.autotune_streamed),
# each a fresh process with warm caches and Python's bytecode kept (as a pip-installed torch has it),
# alternated; then a cProfile of one warm start's warm-up. One JSON line per process (docs/bench/warm_start.py).
# Usage (repository root, on the GPU): bash docs/bench/warm_start_ab.sh [CACHE_DIR] [PROFILE_OUT]
# Run with a pool per graph (SHARE_POOL=0), the engine's setting then; it captured smallest first then.
export SHARE_POOL=${SHARE_POOL:-0}
c=${1:-/tmp/emonet-warm-start}
prof=${2:-/tmp/warm-start-profile.txt}
run() {  # label, then environment settings
  label=$1; shift
  echo "== $label $*" >&2
  out=$(env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/emonet-pyc "$@" timeout "${T:-300}" \
        python docs/bench/warm_start.py "$c" ${SIZES:-} 2>/tmp/ws.err | grep '^{')
  [ -n "$out" ] && echo "{\"label\": \"$label\", ${out#\{}" || { echo "{\"label\": \"$label\", \"failed\": true}"; tail -3 /tmp/ws.err >&2; }
}
run cold-and-bytecode
for round in 1 2; do
  run "autotuned-$round" AUTOTUNE_STREAMED=1
  run "streamed-heuristic-$round" AUTOTUNE_STREAMED=0
done
run profiled AUTOTUNE_STREAMED=1 PROFILE="$prof"
