#!/usr/bin/env bash
# Eighth session: Inductor settings that may let the 1x1 convolutions take their neighbours' elementwise
# work (prologue/epilogue fusion into Triton matrix products), against the engine as it is, in one call.
# Usage (repository root, on the GPU): bash docs/bench/inductor_knobs.sh [BATCH] [SECONDS_PER_VARIANT] [OUTDIR]
# Prints one JSON line per variant: crops/s (median of 5 rounds of 10 graph replays), warm-up seconds;
# the full output of each (with the kernel table) goes to OUTDIR/knob-NAME.txt.
b=${1:-256}; t=${2:-200}; out=${3:-/tmp}
run() {  # name, IC settings, extra arguments
  echo "== $1  IC=$2" >&2
  IC="$2" timeout "$t" python docs/bench/b256_variants.py "$1" "$b" $3 >"$out/knob-$1.txt" 2>&1
  grep -h '^{' "$out/knob-$1.txt" || echo "{\"variant\": \"$1\", \"failed\": \"$(tail -c 300 "$out/knob-$1.txt" | tr '\n"' ' ')\"}"
}
run base "" --profile
run mm "conv_1x1_as_mm=True"
run mm-tune "conv_1x1_as_mm=True,max_autotune_gemm=True" --profile
run cdt "coordinate_descent_tuning=True"
run base-again ""
