#!/usr/bin/env bash
# Remakes diag's output kept beside the sample traces (analyze.txt, recommend.txt in each
# sample_traces/ directory that has them) with this checkout's diag, so that the output shown is
# what the code prints today (tests/test_sample_outputs.py checks it is). The traces themselves
# are not touched: the GPU ones come from scripts/make_gpu_samples.sh on a GPU machine.
# Usage: scripts/sample_outputs.sh   (PYTHON=... to choose the interpreter; default .venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
for f in sample_traces/*/analyze.txt sample_traces/*/recommend.txt; do
  [ -e "$f" ] || continue
  dir="$(dirname "$f")"; what="$(basename "$f" .txt)"
  "$PYTHON" -m diag "$what" "$dir" > "$f.new" 2>&1 || { echo "$f: diag $what exited $?" >&2; rm -f "$f.new"; exit 1; }
  mv "$f.new" "$f"; echo "$f"
done
