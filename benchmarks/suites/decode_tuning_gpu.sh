#!/usr/bin/env bash
# The decode plan's tuning on the H200 in one device call (< 10 minutes): the GPU tests of the window and decode
# kernels, the short window's plan against the plan before it, then the FP8 cache in 1, 2 and 4 warps.
#   source .gpu/setup_device.sh; bash benchmarks/suites/decode_tuning_gpu.sh $OUT/r
# Writes OUT/versions.txt, OUT/tests/ (gpu_tests_parallel.sh's logs), OUT/window/ (window_gpu.py: `triton` is the
# plan, `triton:block_k=128:num_warps=4` the plan before the short-window rule), OUT/kv-probe/ and OUT/kv-rows/
# (kv_dtype_gpu.py --probe, --rows), each with its log.
set -u
out=${1:?OUT dir}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
bash benchmarks/suites/versions.sh "$out"
bash benchmarks/suites/gpu_tests_parallel.sh "$out/tests" 3 "${TEST_SECONDS:-120}" tests/gpu/test_window_gpu.py \
  tests/gpu/test_decode_gpu.py tests/gpu/test_decode_direct_gpu.py tests/gpu/test_kvquant_gpu.py
timeout 90 python3 benchmarks/decode/window_gpu.py --out "$out/window" --quick --windows 128,1024,4096 \
  --kernels triton,triton:block_k=128:num_warps=4 --max-seconds 75 > "$out/window.log" 2>&1
echo "window rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" "$out/window/README.md" | cut -d'|' -f2-11
timeout 150 python3 benchmarks/decode/kv_dtype_gpu.py --out "$out/kv-probe" --probe --max-seconds 130 \
  > "$out/kv-probe.log" 2>&1
echo "kv probe rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" "$out/kv-probe/README.md" | cut -c1-160
timeout 100 python3 benchmarks/decode/kv_dtype_gpu.py --out "$out/kv-rows" --rows --max-seconds 80 > "$out/kv-rows.log" 2>&1
echo "kv rows rc=$? $(( $(date +%s) - t0 )) s"; grep "^|" "$out/kv-rows/README.md" | cut -c1-160
