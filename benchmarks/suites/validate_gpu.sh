#!/usr/bin/env bash
# Mid-session validation on the H200 (issues 11 and 13): the changed GPU paths, each part time-boxed.
#   source .gpu/setup_device.sh; bash benchmarks/suites/validate_gpu.sh $OUT
# Writes to OUT: tests11.log, smoke.log + smoke/results.jsonl, decode_tests.log, tune.log + tune/decode_tune.json
set -u
out=${1:?OUT dir}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 ATTNLAB_CACHE_DIR=/tmp/attnlab-cache
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia_smi.csv" 2>&1
t0=$(date +%s)
timeout 100 python3 -m pytest -v -m gpu -p no:cacheprovider tests/gpu/test_measure_gpu.py tests/gpu/test_peers_gpu.py \
  -k "torch or 16k or cupti or backward" > "$out/tests11.log" 2>&1
echo "tests11 rc=$? $(( $(date +%s) - t0 ))s"; tail -3 "$out/tests11.log"
timeout 130 python3 -m attnlab.cli bench --backends xla,cudnn,pallas-mosaic,pallas-triton,tokamax-mosaic,tokamax-triton,torch-flash,torch-cudnn,torch-efficient,cudnn-fp8 \
  --batch 1 --seq 4096 --heads 16 --head-dim 128 --dtype bfloat16,float16 --causal both --repeats 5 --out "$out/smoke" > "$out/smoke.log" 2>&1
echo "smoke fwd rc=$? $(( $(date +%s) - t0 ))s"
timeout 60 python3 -m attnlab.cli bench --backends xla,cudnn,tokamax-mosaic,pallas-triton --batch 1 --seq 4096 --heads 16 \
  --head-dim 128 --dtype bfloat16 --causal both --mode fwd+bwd --repeats 5 --out "$out/smoke" --resume >> "$out/smoke.log" 2>&1
echo "smoke train rc=$? $(( $(date +%s) - t0 ))s"
python3 - "$out/smoke/results.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["status"] == "unsupported": continue
    print(f"{r['backend']:<15} {r['dtype']:<9} {'c' if r['causal'] else ' '} {r['mode']:<8} {r['status']:<10} t={r.get('timer')} "
          f"ms={r.get('kernel_ms') or 0:.3f} err={r.get('rel_err') or 0:.2e} margin={r.get('margin') or 0:.2f} "
          f"grad={r.get('grad_check')} gm={r.get('grad_margin') or 0:.2f} {(r.get('reason') or '')[:150]}")
PY
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_decode_gpu.py --maxfail=25 > "$out/decode_tests.log" 2>&1
echo "decode tests rc=$? $(( $(date +%s) - t0 ))s"; tail -25 "$out/decode_tests.log"
timeout 115 python3 benchmarks/decode/tune.py "$out/tune" --budget-s 60 > "$out/tune.log" 2>&1
echo "tune rc=$? $(( $(date +%s) - t0 ))s"; tail -40 "$out/tune.log"
