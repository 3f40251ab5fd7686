#!/usr/bin/env bash
# GPU sample traces: the instrumented trainer on CUDA with NCCL, bf16, the profiler's CPU and
# CUDA activities on. Usage: scripts/make_gpu_samples.sh OUTDIR [JOB...]  (jobs: single, dp2,
# tp2_pp2_dp2, tp2_sp_zero3, launch_bound, pp2_memory; default all). Each job's directory gets COMMAND, stdout.txt and
# diag's analysis (analyze.txt, recommend.txt) made on the same machine.
#
# With fewer GPUs than ranks, the trainer puts ranks on GPU (local rank mod GPUs) and gives each
# its own NCCL host identity (instrumented_trainer.launch.gpu_for): NCCL then runs over loopback
# sockets. The traces are real CUDA + NCCL; the timings of the multi-rank jobs are not a node's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${1:?usage: $0 OUTDIR [JOB...]}"; shift
JOBS=("$@"); [ ${#JOBS[@]} -eq 0 ] && JOBS=(single dp2 tp2_pp2_dp2 tp2_sp_zero3 launch_bound pp2_memory)
PYTHON="${PYTHON:-python3}"
LIMIT="${LIMIT:-240}"    # seconds per job
mkdir -p "$OUTDIR"
ACTIVE=1                 # profiled steps (launch_bound: 2)
MID=(--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --vocab-size 32000
     --seed 1234 --device cuda --dtype bf16)

job() {  # job NAME TRAINER-ARGS...
  local name="$1"; shift
  local dir="$OUTDIR/$name"
  local PROFILE=(--train-iters $((4 + ACTIVE)) --profile-wait 2 --profile-warmup 1 --profile-active "$ACTIVE"
                 --metrics-interval 0.5)
  rm -rf "$dir"; mkdir -p "$dir"
  local cmd=(python -m instrumented_trainer "$@" "${PROFILE[@]}" --out "$dir")
  echo "== $name: ${cmd[*]}"
  printf '%q ' "${cmd[@]}" | sed 's/ $/\n/' > "$dir/COMMAND"
  local t0=$SECONDS
  timeout "$LIMIT" "$PYTHON" -m instrumented_trainer "$@" "${PROFILE[@]}" --out "$dir" \
    > "$dir/stdout.txt" 2>&1
  echo "   exit $? after $((SECONDS - t0)) s"; tail -n 12 "$dir/stdout.txt"
  timeout 120 "$PYTHON" -m diag analyze "$dir" > "$dir/analyze.txt" 2>&1; echo "   analyze exit $?"
  timeout 120 "$PYTHON" -m diag recommend "$dir" > "$dir/recommend.txt" 2>&1; echo "   recommend exit $?"
  find "$dir" -name '*.diagsum' -delete
}

for j in "${JOBS[@]}"; do
  case "$j" in
    # One rank, one GPU: honest H100 timings (MFU), NCCL with a single rank.
    single) job single --nproc 1 --num-layers 12 --hidden-size 2048 --num-attention-heads 16 \
              --seq-length 2048 --vocab-size 32000 --seed 1234 --device cuda --dtype bf16 \
              --micro-batch-size 4 --global-batch-size 16 ;;
    # DP=2, gradient all-reduce overlapped with backward on NCCL's own stream.
    dp2) job dp2 --nproc 2 "${MID[@]}" --micro-batch-size 4 --global-batch-size 16 \
           --overlap-grad-reduce ;;
    # All three axes, 8 ranks.
    tp2_pp2_dp2) job tp2_pp2_dp2 --nproc 8 "${MID[@]}" --tensor-model-parallel-size 2 \
                   --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16 \
                   --overlap-grad-reduce ;;
    # TP=2 with sequence parallelism x FSDP2 ZeRO-3 over DP=2.
    tp2_sp_zero3) job tp2_sp_zero3 --nproc 4 "${MID[@]}" --tensor-model-parallel-size 2 \
                    --sequence-parallel --data-parallel-sharding-strategy optim_grads_params \
                    --micro-batch-size 2 --global-batch-size 8 ;;
    # One rank, a small model at micro-batch 2: launch-bound (the GPU idle between short kernels, the
    # micro-batch lever's case), two profiled steps: the window is the first (HTA convention).
    launch_bound) ACTIVE=2 job launch_bound --nproc 1 --num-layers 4 --hidden-size 512 --num-attention-heads 8 \
                    --seq-length 512 --vocab-size 32000 --seed 1234 --device cuda --dtype bf16 \
                    --micro-batch-size 2 --global-batch-size 16 ;;
    # PP=2, 1F1B over 4 micro-batches, with the profiler's memory events (profile_memory): the CUDA
    # allocator's total over time per stage, stage 0 holding two micro-batches' activations, stage 1 one.
    # variants/: the same job under the other schedules and with full recompute, for the memory
    # model's predictions against the allocator's peaks (tests/test_gpu_memory.py).
    pp2_memory) PP2M=(--nproc 2 "${MID[@]}" --pipeline-model-parallel-size 2 --micro-batch-size 2
                      --global-batch-size 8 --profile-memory)
                job pp2_memory "${PP2M[@]}"
                job pp2_memory/variants/gpipe "${PP2M[@]}" --pipeline-schedule gpipe
                job pp2_memory/variants/interleaved "${PP2M[@]}" --pipeline-schedule interleaved-1f1b \
                  --num-layers-per-virtual-pipeline-stage 1
                job pp2_memory/variants/zb1p "${PP2M[@]}" --pipeline-schedule zb1p
                job pp2_memory/variants/recompute "${PP2M[@]}" --recompute-granularity full ;;
    *) echo "unknown job $j" >&2; exit 2 ;;
  esac
done
