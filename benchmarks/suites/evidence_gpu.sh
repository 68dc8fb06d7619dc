#!/usr/bin/env bash
# The H200 evidence at a commit (issue 11): GPU tests and the peers sweep, in two calls of < 10 minutes.
#   source .gpu/setup_device.sh; bash benchmarks/suites/evidence_gpu.sh a $OUT   # GPU tests (-v, JUnit) + peers fwd64, fwd16
#   source .gpu/setup_device.sh; bash benchmarks/suites/evidence_gpu.sh b $OUT   # peers fwd128, train, decode, fp8
#   source .gpu/setup_device.sh; bash benchmarks/suites/evidence_gpu.sh c $OUT   # every GPU test + decode goal shape
#   source .gpu/setup_device.sh; bash benchmarks/suites/evidence_gpu.sh d $OUT   # issue 15: FP8 GPU tests + fp8/recipes.py
#   source .gpu/setup_device.sh; bash benchmarks/suites/evidence_gpu.sh e $OUT   # issue 16: auto/goal.py all + auto/advise_gpu.sh
# TransformerEngine's five parts must have been carried first (../shared/gpu/README.md).
# Each call writes OUT/bundle_X.tgz holding part-X/{results.jsonl,results.csv}, peers_X.log and (a) gpu_tests.{log,xml};
# the two results files are one sweep (disjoint cells), merged by `cat` into the results folder.
set -u
part=${1:?part a or b}
out=${2:?OUT dir}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 ATTNLAB_CACHE_DIR=/tmp/attnlab-cache
mkdir -p "$out"
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia_smi_$part.csv" 2>&1
python3 -m attnlab.cli env > "$out/env_$part.txt" 2>&1
python3 -m attnlab.cli backends > "$out/backends_$part.txt" 2>&1
if [ "$part" = a ]; then
  timeout 200 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu --ignore=tests/gpu/test_decode_gpu.py \
    --junitxml="$out/gpu_tests.xml" > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/gpu_tests.log")"
  grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" | head -20
  timeout $(( 570 - ($(date +%s) - t0) )) python3 benchmarks/peers/sweep_gpu.py "$out/part-a" fwd64 fwd16 > "$out/peers_a.log" 2>&1
elif [ "$part" = c ]; then   # issues 13/14: every GPU test at a commit, then the decode goal shape's peers
  timeout 330 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu \
    --junitxml="$out/gpu_tests.xml" > "$out/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/gpu_tests.log")"
  grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" | head -20
  timeout $(( 560 - ($(date +%s) - t0) )) python3 benchmarks/decode/peers.py "$out/decode" goal > "$out/peers_c.log" 2>&1
  echo "decode goal rc=$?"
  python3 benchmarks/decode/peers.py --table "$out/decode/results.jsonl" > "$out/decode_table.md" 2>&1
  tail -12 "$out/decode_table.md"
elif [ "$part" = d ]; then   # issue 15: the FP8 recipes on the GPU, then the error-vs-speed grid
  timeout 150 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_fp8_gpu.py \
    --junitxml="$out/gpu_tests_fp8.xml" > "$out/gpu_tests_fp8.log" 2>&1
  echo "fp8 gpu tests rc=$? $(( $(date +%s) - t0 ))s: $(tail -1 "$out/gpu_tests_fp8.log")"
  grep -E "^(FAILED|ERROR)" "$out/gpu_tests_fp8.log" | head -20
  timeout $(( ${FP8_SECONDS:-420} + 40 - ($(date +%s) - t0) )) python3 benchmarks/fp8/recipes.py "$out/fp8-recipes" \
    --max-seconds $(( ${FP8_SECONDS:-420} - ($(date +%s) - t0) )) > "$out/peers_d.log" 2>&1
  echo "fp8 recipes rc=$? $(( $(date +%s) - t0 ))s"
  python3 benchmarks/fp8/recipes.py --table "$out/fp8-recipes/results.jsonl" > "$out/fp8_table.md" 2>&1
  grep -iE "goal|met|missed" "$out/fp8_table.md" | head -12
elif [ "$part" = e ]; then   # issue 16: advise for Llama-3.1-70B at 32k, then measured auto on held-out shapes
  ADVISE_SECONDS=${ADVISE_SECONDS:-230} ADVISE_TESTS=0 bash benchmarks/auto/advise_gpu.sh "$out/advise_run"
  echo "advise rc=$? $(( $(date +%s) - t0 ))s"
  timeout $(( 590 - ($(date +%s) - t0) )) python3 benchmarks/auto/goal.py all "$out/auto" \
    --max-seconds $(( 545 - ($(date +%s) - t0) )) > "$out/peers_e.log" 2>&1
  echo "auto goal rc=$? $(( $(date +%s) - t0 ))s"; tail -4 "$out/peers_e.log"
  python3 benchmarks/auto/goal.py --table "$out/auto" > /dev/null 2>&1; tail -14 "$out/auto/goal.md"
else
  timeout 470 python3 benchmarks/peers/sweep_gpu.py "$out/part-$part" fwd128 train decode fp8 > "$out/peers_$part.log" 2>&1
fi
echo "peers $part rc=$? $(( $(date +%s) - t0 ))s"
if [ "$part" = b ]; then   # the lab's decode step (issue 13) on the GPU, in what time is left
  timeout $(( 575 - ($(date +%s) - t0) )) python3 -m attnlab.cli run --sections environment,decode --out "$out/lab-decode" \
    > "$out/lab_decode.log" 2>&1
  echo "lab decode rc=$? $(( $(date +%s) - t0 ))s"; tail -8 "$out/lab_decode.log"
fi
grep -E '^\{"part"' "$out/peers_$part.log"
grep -vE "ok  " "$out/peers_$part.log" | grep -E "^\[" | grep -v unsupported | head -20
# A call returns at most 8 files: bundle everything into one archive (2026-12-03: part b's results.jsonl
# was left out when the call wrote 11 files). Unpack here with: tar xzf bundle_X.tgz
( cd "$out" && tar czf "../bundle_$part.tgz" . && rm -rf ./* && mv "../bundle_$part.tgz" . )
ls -la "$out"
