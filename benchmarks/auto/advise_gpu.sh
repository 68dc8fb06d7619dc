#!/usr/bin/env bash
# Issue 16, item 3 on the H200: `attnlab advise` for Llama-3.1-70B at 32k, batch 1, every phase
# (prefill, decode T=1 and T=4, train), the main backends side by side; about 3 minutes.
#   source .gpu/setup_device.sh; bash benchmarks/auto/advise_gpu.sh OUT
# Writes OUT/advise/{results.jsonl,results.csv,advise.json,advise.html}, OUT/advise.log and
# OUT/gpu_advise_tests.log (the tests/gpu/test_advise_gpu.py run). Resumable: run it again to finish.
set -u
out=${1:?usage: benchmarks/auto/advise_gpu.sh OUT}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 ATTNLAB_CACHE_DIR=/tmp/attnlab-cache
mkdir -p "$out"
t0=$(date +%s)
want=cudnn,xla,tokamax-mosaic,te,torch-cudnn,torch-flash,attnlab-decode
backends=$(python3 -c "
from attnlab.sweep.model_cells import default_backends
here = default_backends()
print(','.join(b for b in '$want'.split(',') if b in here))")
echo "backends here: $backends"
# The whole device's memory (nvidia-smi, MiB -> GiB), not JAX's allocator share (setup_device.sh sets 0.6).
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{printf "%.1f", $1/1024}')
timeout ${ADVISE_SECONDS:-420} python3 -m attnlab.cli advise --device-memory "$mem" \
  --model llama-3.1-70b --context 32k --batch 1 \
  --phase prefill,decode,train --backends "$backends" --repeats 10 --compile-budget 60 \
  --out "$out/advise" > "$out/advise.log" 2>&1
echo "advise rc=$? $(( $(date +%s) - t0 ))s"
sed -n '/fastest correct path per phase/,$p' "$out/advise.log" | head -60
[ "${ADVISE_TESTS:-1}" = 0 ] && exit 0
timeout $(( 570 - ($(date +%s) - t0) )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_advise_gpu.py \
  > "$out/gpu_advise_tests.log" 2>&1
echo "gpu advise tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/gpu_advise_tests.log")"
