"""On a CPU: every Triton kernel of the GPU tests' serving and decode configurations compiles for sm_90.

    PYTHONPATH=src python3 benchmarks/suites/gpu_tests_compile_cpu.py OUT_DIR --triton-python /path/to/venv/bin/python

Lowers each configuration of ``tests/test_cuda_lowering.py`` (the serving kernel's cases of tests/gpu: idle slots,
both merges, whole blocks, quantized caches, sinks, windows, soft cap, prefill slots; the Triton decode kernel's)
through the public API under an abstract H200, keeps each distinct Triton IR with the warps and stages Pallas
gives it, and compiles it with pip's triton 3.6.0 (``benchmarks/decode/ttir_cpu.py``'s ``COMPILE``): shared
memory, registers, spills. XLA compiles the same IR with jaxlib's own Triton: a strong hint, not a proof.
Writes OUT_DIR/README.md (the table); exits 1 where a kernel failed to compile or uses more than 227 KB of
shared memory (spills are listed, not failed: they cost time, not correctness).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path[:0] = [os.path.join(ROOT, "src"), ROOT, os.path.join(ROOT, "tests")]


class _Setattr:
    """``monkeypatch.setattr`` outside pytest (the decode backend's config, set per configuration)."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def dump(out_dir: str) -> dict[str, dict]:
    """Each distinct Triton IR as OUT_DIR/<hash>.ttir and .json (warps, stages, the configuration): {hash: meta}."""
    import jax
    import jax._src.pallas.triton.pallas_call_registration as reg  # JAX-private: the Triton IR Pallas emits

    import test_cuda_lowering as cases
    from attnlab.core import device

    captured, kernels = [], {}
    lower = reg.lowering.lower_jaxpr_to_triton_module

    def keep(*a, **kw):
        res = lower(*a, **kw)
        caller = sys._getframe(1).f_locals    # pallas_call_lowering's: the warps and stages it compiles with
        captured.append((res.module.operation.get_asm(enable_debug_info=False), caller["num_warps"],
                         caller["num_stages"]))
        return res

    def keep_new(label):
        for i, (ttir, warps, stages) in enumerate(captured):
            tag = hashlib.sha1(f"{ttir}{warps}{stages}".encode()).hexdigest()[:10]
            if tag not in kernels:
                kernels[tag] = dict(num_warps=warps, num_stages=stages, config=f"{label} #{i}")
                with open(os.path.join(out_dir, tag + ".ttir"), "w") as fh:
                    fh.write(ttir)
                with open(os.path.join(out_dir, tag + ".json"), "w") as fh:
                    json.dump(kernels[tag], fh)
        captured.clear()

    def params(test):
        return next(m for m in test.pytestmark if m.name == "parametrize").args[1]

    saved = reg.lowering.lower_jaxpr_to_triton_module, device.current, jax.default_backend
    reg.lowering.lower_jaxpr_to_triton_module, device.current = keep, lambda: cases.H200
    jax.default_backend = lambda: "gpu"
    try:
        for case, heads, page, options in params(cases.test_serving_kernel_lowers_to_triton):
            cases.lowered_text(case, heads, page, **options)
            keep_new(f"serving {case} N/K={heads} page={page} {options}")
        for case, page, window, sinks, stream in params(cases.test_prefill_slots_lower_to_mosaic_gpu):
            cfg = dict(prefill_slots=1, prefill_chunk=320 if case == "mixed" else 256, prefill_stream=stream)
            cases.lowered_text(case, cases.G4, page, config=cfg, window=window, sinks=sinks)
            keep_new(f"serving {case} page={page} prefill slots window={window} sinks={sinks}")
        for T, heads, page, config, options in params(cases.test_decode_kernels_lower):
            if config.get("kernel") != "mosaic":
                cases.decode_lowered_text(_Setattr(), T, heads, page, config, options)
                keep_new(f"decode T={T} N/K={heads} page={page} {config} {options}")
    finally:
        reg.lowering.lower_jaxpr_to_triton_module, device.current, jax.default_backend = saved
    return kernels


def main(argv=None) -> int:
    from benchmarks.decode.kv_dtype_sass_cpu import compile_cli
    from benchmarks.decode.ttir_cpu import COMPILE

    a, kernels = compile_cli(__doc__.splitlines()[0], dump, argv, script=COMPILE)
    with open(os.path.join(a.out_dir, "compiled.json")) as fh:
        compiled = json.load(fh)
    bad, rows = 0, ["| configuration (kernel #) | warps | stages | shared KB | registers | spilled bytes |",
                    "| --- | --- | --- | --- | --- | --- |"]
    for tag, meta in sorted(kernels.items(), key=lambda kv: kv[1]["config"]):
        r = compiled.get(tag, {})
        if not r.get("ok") or r["shared"] > 227 * 1024:
            bad += 1
        cells = ([r["shared"] // 1024, r.get("regs"), r.get("stack", 0)] if r.get("ok")
                 else ["FAILED: " + r.get("error", "not compiled")[:120], "", ""])
        rows.append(f"| {meta['config']} | {meta['num_warps']} | {meta['num_stages']} | "
                    + " | ".join(map(str, cells)) + " |")
    spilled = sum(1 for t in kernels if compiled.get(t, {}).get("stack", 0) > 0)
    summary = f"{len(kernels)} distinct kernels, {bad} failed or over 227 KB of shared memory, {spilled} spill"
    with open(os.path.join(a.out_dir, "README.md"), "w") as fh:
        fh.write(f"# The GPU tests' Triton kernels compiled for sm_90 on a CPU\n\n{summary}\n\n" + "\n".join(rows) + "\n")
    print(summary)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
