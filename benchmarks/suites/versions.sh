#!/usr/bin/env bash
# What a device call ran on, into OUT/versions.txt: the tree's commit and changes, the date, JAX and its devices,
# nvidia-smi.   bash benchmarks/suites/versions.sh OUT
out=${1:?OUT dir}
mkdir -p "$out"
{ git log -1 --format='commit %H %cd' 2>/dev/null; git status --short 2>/dev/null; date -u
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  nvidia-smi; } > "$out/versions.txt" 2>&1
