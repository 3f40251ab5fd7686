#!/usr/bin/env bash
# The closed loop per lever on one GPU (issue #19): benchmarks/bench_tune.py --device cuda, then GPU
# samples (scripts/make_gpu_samples.sh $SAMPLES, default launch_bound). Run on the device machine from the
# repository root with the wheels of msgspec and isal for its Python in .whl/ (see the device README);
# everything it makes goes to ${OUT:-gpu_out}/gpu.tar.gz and the table to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
O="${OUT:-gpu_out}"; mkdir -p "$O"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
W=/tmp/gpu_tune; rm -rf "$W"; mkdir -p "$W"
t0=$SECONDS
timeout "${TUNE_LIMIT:-330}" python3 benchmarks/bench_tune.py --device cuda --repeats "${REPEATS:-1}" \
  --out "$W/tune" ${LEVERS:+--only "$LEVERS"} | tee "$W/bench_tune.md"
echo "bench_tune: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
SAMPLES="${SAMPLES-launch_bound}"   # set empty for none; make_gpu_samples.sh deletes its summaries, tune writes none
[ -n "$SAMPLES" ] && LIMIT=150 PYTHON=python3 scripts/make_gpu_samples.sh "$W/samples" $SAMPLES
tar -C "$W" --exclude="./tune/*/after*/*trace.json*" --exclude="./tune/*/before-*/*trace.json*" -czf "$O/gpu.tar.gz" . && ls -la "$O"
