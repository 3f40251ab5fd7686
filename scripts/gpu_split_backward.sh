#!/usr/bin/env bash
# torch's split backward against the fused one on a GPU (issue #19): benchmarks/split_backward.py on CUDA,
# bf16 autocast as the trainer, at three stage sizes: the zero-bubble lever's CPU job (launch-bound on a GPU),
# the GPU samples' model (h 1024, s 1024, V 32,000, mb 2) and a compute-bound one (h 4096, s 2048). Run on the
# device machine from the repository root; each size's figures go to ${OUT:-gpu_out}/split_*.json, the tables
# to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-gpu_out}"; mkdir -p "$O"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
run() {  # run NAME ARGS...
  local name="$1"; shift
  echo "== split backward, $name"
  timeout "${LIMIT:-90}" python3 benchmarks/split_backward.py --device cuda --dtype bf16 --layers 2 "$@" \
    --json "$O/split_$name.json" || echo "   exit $?"
}
run cpu_job   --hidden-size 512  --num-attention-heads 8  --seq-length 256  --vocab-size 256   --micro-batch-size 1
run samples   --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 32000 --micro-batch-size 2
run big       --hidden-size 4096 --num-attention-heads 32 --seq-length 2048 --vocab-size 32000 --micro-batch-size 1 --iters 20
