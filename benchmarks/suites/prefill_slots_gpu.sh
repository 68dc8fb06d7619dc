#!/usr/bin/env bash
# The Mosaic GPU prefill slots on the H200 in one device call (< 10 minutes): the GPU tests of the code they touch
# first, then the mixed-batch A/B, then the rest of the GPU tests in what time is left.
#   source .gpu/setup_device.sh; bash benchmarks/suites/prefill_slots_gpu.sh $OUT/r
# Writes OUT/versions.txt, OUT/tests-first/ and OUT/tests-rest/ (gpu_tests_parallel.sh's logs), OUT/prefill-slots/
# (benchmarks/serving/gpu.py --prefill-slots: results.jsonl, README.md) and OUT/slots.log.
set -u
out=${1:?OUT dir}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
bash benchmarks/suites/versions.sh "$out"
first=(tests/gpu/test_serving_prefill_mgpu_gpu.py tests/gpu/test_decode_mgpu_gpu.py tests/gpu/test_serving_gpu.py
       tests/gpu/test_serving_fused_gpu.py tests/gpu/test_decode_direct_gpu.py)
bash benchmarks/suites/gpu_tests_parallel.sh "$out/tests-first" 4 "${FIRST_SECONDS:-190}" "${first[@]}"
XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout "${SLOTS_SECONDS:-150}" python3 benchmarks/serving/gpu.py \
  --out "$out/prefill-slots" --prefill-slots --max-seconds $(( ${SLOTS_SECONDS:-150} - 25 )) > "$out/slots.log" 2>&1
echo "prefill slots rc=$? $(( $(date +%s) - t0 )) s"; grep -v "^|" "$out/slots.log" | tail -18 | cut -c1-220
grep "^|" "$out/slots.log" | cut -d'|' -f1-7
left=$(( ${TOTAL_SECONDS:-540} - ($(date +%s) - t0) ))
if [ "$left" -gt 60 ]; then
  rest=()
  for f in tests/gpu/test_*.py; do [[ " ${first[*]} " == *" $f "* ]] || rest+=("$f"); done
  bash benchmarks/suites/gpu_tests_parallel.sh "$out/tests-rest" 4 $(( left - 15 )) "${rest[@]}"
fi
echo "total $(( $(date +%s) - t0 )) s"
