#!/usr/bin/env bash
# Regenerate sample_traces/: small CPU (gloo) runs of the instrumented trainer, one directory per
# scenario, each with diag_run.json, rank-<r>.pt.trace.json.gz, comm/metrics logs, steps.jsonl and
# a COMMAND file holding the exact command that made it. Takes ~2 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
OUT="${OUT:-sample_traces}"
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --vocab-size 256
       --seed 1234 --train-iters 4 --profile-wait 1 --profile-warmup 1 --profile-active 2
       --metrics-interval 0.5)

sample() {  # sample NAME TRAINER-ARGS...
  local name="$1"; shift
  local dir="$OUT/$name"
  rm -rf "$dir"; mkdir -p "$dir"
  local cmd=(python -m instrumented_trainer "${MODEL[@]}" "$@" --out "$dir")
  echo "== $name: ${cmd[*]}"
  printf '%q ' "${cmd[@]}" | sed 's/ $/\n/' > "$dir/COMMAND"
  "$PYTHON" -m instrumented_trainer "${MODEL[@]}" "$@" --out "$dir" | tee "$dir/stdout.txt"
}

# PP=2, 2 micro-batches: the 1F1B bubble (p-1)/(m+p-1) = 1/3 of the step is visible.
sample pp2_m2 --nproc 2 --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 4
# All three axes: 8 processes, TP=2 x PP=2 x DP=2, 2 micro-batches per replica.
sample tp2_pp2_dp2 --nproc 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
  --micro-batch-size 2 --global-batch-size 8 --overlap-grad-reduce --ddp-bucket-size 100000 \
  --profile-active 1
# TP=2 with sequence parallelism x FSDP2 ZeRO-3 over DP=2: all-gathers and reduce-scatters on both axes.
sample tp2_sp_zero3 --nproc 4 --tensor-model-parallel-size 2 --sequence-parallel \
  --data-parallel-sharding-strategy optim_grads_params --micro-batch-size 2 --global-batch-size 8 \
  --profile-active 1
# DP=2, gradient all-reduce after backward vs overlapped with it (same buckets).
sample dp2_no_overlap --nproc 2 --micro-batch-size 2 --global-batch-size 8 --ddp-bucket-size 100000
sample dp2_overlap --nproc 2 --micro-batch-size 2 --global-batch-size 8 --ddp-bucket-size 100000 \
  --overlap-grad-reduce
# The trainer's own summaries (*.diagsum) are diag's cache of these traces; a committed one would go
# stale when diag's analysis changes, so the samples keep only the traces.
find "$OUT" -name '*.diagsum' -delete
du -sh "$OUT"/*
