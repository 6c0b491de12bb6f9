#!/usr/bin/env bash
# Ninth session: why `python -m emonet.bench` measured batch 256 ~2 % under the A/B script on the same
# machine (run 20: 7,783 against 7,950 crops/s). Each variant is one fresh process, cold caches, and
# moves the engine one step from the A/B script's towards the bench's. One JSON line per variant.
# Usage (repository root, on the GPU): bash docs/bench/bench_gap.sh [SECONDS_PER_VARIANT]
t=${1:-115}
run() {  # name, then environment settings
  name=$1; shift
  echo "== $name $*" >&2
  env "$@" timeout "$t" python docs/bench/b256_variants.py "$name" 256 2>&1 | grep '^{' || echo "{\"variant\": \"$name\", \"failed\": true}"
}
run ab
run ab-real REAL=1
run sizes SIZES=1,8,32,128,256 STREAMS=8
run precompile PRECOMPILE=1
run bench-like SIZES=1,8,32,128,256 STREAMS=8 PRECOMPILE=1 REAL=1
