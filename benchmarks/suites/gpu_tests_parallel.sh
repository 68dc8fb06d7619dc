#!/usr/bin/env bash
# Every GPU test in P pytest processes side by side on the one GPU, all done by one deadline, so that the whole
# suite fits one device call (< 10 minutes).
#   source .gpu/setup_device.sh; bash benchmarks/suites/gpu_tests_parallel.sh $OUT [P=4] [SECONDS=240] [FILES...]
# The test files (tests/gpu/test_*.py, or FILES) are dealt longest first (the seconds each took alone on the H200,
# else its size) to the process with the least work so far. A process runs its files one after another, each
# in its own pytest with the time left to the deadline (SECONDS after the start), and writes
# OUT/NAME.{log,xml,rc} per file. Each process gets 1/(P+1) of the GPU's memory; ATTNLAB_GPU_PROCS=P lets a test
# that bounds its own time (test_measure_gpu.py) allow for the others.
# At the end: per file its exit code and pytest's last line, every FAILED/ERROR/SKIPPED line, the files the
# deadline left unstarted. Exit 1 unless every file ran and passed with no skips (124: past the deadline; 5: no
# test collected, as when JAX sees no GPU and conftest skips them all); 2 for a file that does not exist.
set -u
out=${1:?OUT dir}
procs=${2:-4}
secs=${3:-240}
shift $(( $# < 3 ? $# : 3 ))
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 ATTNLAB_CACHE_DIR=/tmp/attnlab-cache
export XLA_PYTHON_CLIENT_PREALLOCATE=false ATTNLAB_GPU_PROCS=$procs
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(tests/gpu/test_*.py)
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "gpu_tests_parallel: no such test file: $f" >&2; exit 2; }
done
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/nvidia_smi.csv" 2>&1
groups=$(python3 - "$procs" "${files[@]}" <<'PY'
import os, sys
# seconds alone on the H200 (results/gpu-2026-12-05*, rounded up); files not listed count their size at 1 s per kB
SECONDS_ALONE = {"test_kvquant_gpu.py": 150, "test_decode_gpu.py": 130, "test_exit_codes_gpu.py": 90,
                 "test_serving_gpu.py": 90, "test_serving_cells_gpu.py": 70, "test_window_gpu.py": 60}
cost = lambda f: SECONDS_ALONE.get(os.path.basename(f), os.path.getsize(f) / 1000)
procs, files = int(sys.argv[1]), sys.argv[2:]
groups, load = [[] for _ in range(procs)], [0.0] * procs
for f in sorted(files, key=cost, reverse=True):
    i = load.index(min(load))
    groups[i].append(f)
    load[i] += cost(f)
print("\n".join(" ".join(g) for g in groups if g))
PY
) || { echo "gpu_tests_parallel: could not deal the files" >&2; exit 2; }
mapfile -t groups <<< "$groups"
frac=$(python3 -c "print(round(0.92 / (${#groups[@]} + 1), 3))")
t0=$(date +%s)
deadline=$(( t0 + secs ))
for i in "${!groups[@]}"; do
  (
    for f in ${groups[$i]}; do
      name=$(basename "$f" .py)
      left=$(( deadline - $(date +%s) ))
      if [ "$left" -lt 5 ]; then echo "not started: the deadline had passed" > "$out/$name.log"; echo 124 > "$out/$name.rc"; continue; fi
      XLA_PYTHON_CLIENT_MEM_FRACTION=$frac timeout --kill-after=10 "$left" python3 -m pytest -q -ra -m gpu \
        -p no:cacheprovider --junitxml="$out/$name.xml" "$f" > "$out/$name.log" 2>&1
      echo $? > "$out/$name.rc"
    done
  ) &
done
wait
pkill -f tests/exit_driver.py 2>/dev/null   # CLI runs in their own sessions outlive a pytest the deadline killed
status=0
for f in "${files[@]}"; do
  name=$(basename "$f" .py)
  rc=$(cat "$out/$name.rc" 2>/dev/null || echo "?")
  echo "$name: rc $rc: $(tail -1 "$out/$name.log")"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$out/$name.log" | head -20
  { [ "$rc" = 0 ] && ! grep -qE "^SKIPPED" "$out/$name.log"; } || status=1
done
echo "gpu tests: $(( $(date +%s) - t0 )) s, $( [ $status = 0 ] && echo "all passed" || echo "NOT all passed")"
exit $status
