#!/usr/bin/env bash
# Every GPU test in P pytest processes side by side on the one GPU, each time-boxed, so that the whole suite fits
# one device call (< 10 minutes) with room left for a benchmark after it.
#   source .gpu/setup_device.sh; bash benchmarks/suites/gpu_tests_parallel.sh $OUT [P=4] [SECONDS=240] [FILES...]
# The test files (tests/gpu/test_*.py, or FILES) are dealt largest first to the process with the fewest bytes of
# tests so far. Each process gets 1/(P+1) of the GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION) and writes
# OUT/gpu_tests_N.{log,xml}; the last line of each log and every FAILED/ERROR line are printed at the end.
# A test that bounds its own time (test_measure_gpu.py's 16k check) can miss its bound beside other processes:
# rerun such a failure alone (P=1 and its file).
set -u
out=${1:?OUT dir}
procs=${2:-4}
secs=${3:-240}
shift $(( $# < 3 ? $# : 3 ))
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 ATTNLAB_CACHE_DIR=/tmp/attnlab-cache
export XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia_smi.csv" 2>&1
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_*.py)
mapfile -t groups < <(python3 - "$procs" "${files[@]}" <<'PY'
import os, sys
procs, files = int(sys.argv[1]), sys.argv[2:]
groups, load = [[] for _ in range(procs)], [0] * procs
for f in sorted(files, key=os.path.getsize, reverse=True):
    i = load.index(min(load))
    groups[i].append(f)
    load[i] += os.path.getsize(f)
print("\n".join(" ".join(g) for g in groups if g))
PY
)
frac=$(python3 -c "print(round(0.92 / (${#groups[@]} + 1), 3))")
t0=$(date +%s)
for i in "${!groups[@]}"; do
  # shellcheck disable=SC2086  # a group is a space-separated list of paths
  XLA_PYTHON_CLIENT_MEM_FRACTION=$frac timeout "$secs" python3 -m pytest -q -m gpu -p no:cacheprovider \
    --junitxml="$out/gpu_tests_$i.xml" ${groups[$i]} > "$out/gpu_tests_$i.log" 2>&1 &
done
wait
for i in "${!groups[@]}"; do
  echo "process $i (${groups[$i]}): $(tail -1 "$out/gpu_tests_$i.log")"
  grep -E "^(FAILED|ERROR)" "$out/gpu_tests_$i.log" | head -20
done
echo "gpu tests: $(( $(date +%s) - t0 )) s"
