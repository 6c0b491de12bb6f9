#!/usr/bin/env bash
# Tenth session: where a warm start of the bench's engine (graphs for batch sizes 1-512) spends its
# seconds, and what the knobs change. One JSON line per fresh process (docs/bench/warm_start.py).
# Usage (repository root, on the GPU): bash docs/bench/warm_start.sh [CACHE_DIR]
# PYC: the lent machine sets PYTHONDONTWRITEBYTECODE=1 and its torch ships no bytecode, so every process
# there compiles torch's source again; a pip-installed torch has its bytecode. PYTHONPYCACHEPREFIX
# reproduces that (the first process writes it).
# Measured with the engine of the session's start: cuDNN autotuning for every batch, a memory pool and
# a capture stream per graph, captured smallest first (the stream per graph and
# that order are gone from the engine).
export AUTOTUNE_STREAMED=${AUTOTUNE_STREAMED:-1} SHARE_POOL=${SHARE_POOL:-0}
c=${1:-/tmp/emonet-warm-start}
t=${T:-300}
run() {  # label, then environment settings
  label=$1; shift
  echo "== $label $*" >&2
  out=$(env "$@" timeout "$t" python docs/bench/warm_start.py "$c" ${SIZES:-} 2>/tmp/ws.err | grep '^{')
  [ -n "$out" ] && echo "{\"label\": \"$label\", ${out#\{}" || { echo "{\"label\": \"$label\", \"failed\": true}"; tail -3 /tmp/ws.err >&2; }
}
floor() {  # label, then environment settings: a process that imports torch and touches the GPU
  label=$1; shift
  s=$EPOCHREALTIME
  env "$@" python -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
  echo "{\"label\": \"$label\", \"bare_process_s\": $(awk "BEGIN{print $EPOCHREALTIME - $s}")}"
}
pyc="-u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/emonet-pyc"
run cold
run warm
floor floor
floor floor-pyc-prime $pyc
floor floor-pyc $pyc
run warm-pyc-prime $pyc
run warm-pyc $pyc
run warm-pyc-heuristics $pyc BENCHMARK=0
run warm-pyc-heuristics-b $pyc BENCHMARK=0 TORCH_CUDNN_USE_HEURISTIC_MODE_B=1
run warm-pyc-empty-cache $pyc EMPTY_CACHE=1
