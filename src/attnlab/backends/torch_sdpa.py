"""PyTorch ``scaled_dot_product_attention`` under ``sdpa_kernel`` as cross-framework peers.

The same inputs are handed over from JAX by DLPack (no copy). These kernels cannot run inside
``jax.jit``: ``attention(..., implementation="torch-flash")`` works on concrete arrays only, and
sweeps measure them through ``measure_native`` with the same CUPTI timer as the JAX paths
(CUDA events where CUPTI cannot be used, said so in the record's ``timer``).
"""
from __future__ import annotations

import time

import jax
import ml_dtypes  # noqa: F401  (NumPy learns bfloat16)
import numpy as np

from ..errors import UnsupportedError
from ..spec import AttentionSpec, Prepared
from . import _optional
from .base import Backend

_KERNELS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _to_torch(x):
    import torch

    return torch.from_dlpack(x)


class TorchSdpaBackend(Backend):
    native = True
    forward_only = True   # measured forward only: a PyTorch backward pass is not attnlab's to time

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"torch-{kind}"
        self.description = f"PyTorch scaled_dot_product_attention under sdpa_kernel({_KERNELS[kind]})"

    def available(self) -> str | None:
        why = _optional.missing("torch", "torch") or _optional.needs_nvidia()
        if why:
            return why
        import torch

        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA device (a CPU-only build?)"
        return None

    def version(self) -> str | None:
        return _optional.dist_version("torch")

    def supports(self, spec: AttentionSpec) -> str | None:
        if spec.dtype not in ("float16", "bfloat16") and self.kind != "efficient":
            return f"dtype {spec.dtype} not supported by the {self.kind} kernel (float16/bfloat16)"
        if self.kind == "efficient" and spec.kv_heads != spec.heads:
            # measured on the H200 with torch 2.11: "No available kernel" for enable_gqa=True
            return "the memory-efficient kernel takes no grouped key/value heads (enable_gqa)"
        return _optional.simple_masks_only(spec, self.name)

    def _fn(self, spec: AttentionSpec, scale: float):
        if self.kind == "cudnn":
            _optional.preload_pip_cudnn()
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        kernel = getattr(SDPBackend, _KERNELS[self.kind])
        gqa = spec.kv_heads != spec.heads

        def fn(q, k, v):  # BTNH in, BTNH out (views: SDPA takes BNTH)
            with sdpa_kernel(kernel):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=spec.is_causal, scale=scale, enable_gqa=gqa)
            return o.transpose(1, 2)

        return torch, fn

    def run(self, p: Prepared):
        if any(isinstance(x, jax.core.Tracer) for x in (p.query, p.key, p.value)):
            raise UnsupportedError(self.name, "a PyTorch kernel cannot run inside jax.jit/grad/vmap; call it on concrete arrays")
        torch, fn = self._fn(p.spec, float(p.scale))
        out = fn(*(_to_torch(x) for x in (p.query, p.key, p.value)))
        torch.cuda.synchronize()
        return jax.dlpack.from_dlpack(out.contiguous())

    def measure_native(self, spec: AttentionSpec, scale: float, arg_sets, repeats: int, warmup: int) -> dict:
        """Time the kernel on the JAX input sets (handed over by DLPack): kernel and wall ms, first-call s."""
        from ..measure.stats import Stats

        torch, fn = self._fn(spec, scale)
        sets = [tuple(_to_torch(x) for x in s) for s in arg_sets]
        t0 = time.perf_counter()
        fn(*sets[0])
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        for i in range(max(warmup, len(sets))):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        out: dict = {"compile_s": first_s, "lower_s": 0.0}
        per_set = max(1, -(-repeats // len(sets)))
        try:
            from jax.experimental.mosaic.gpu import profiler

            samples = []
            for s in sets:
                def call(*_a, s=s):
                    r = None
                    for _ in range(1):
                        r = fn(*s)
                    torch.cuda.synchronize()
                    return r
                for _ in range(per_set):
                    _, t = profiler.measure(call)()
                    if t is None:
                        raise RuntimeError("CUPTI saw no kernel")
                    samples.append(t)
            out.update(Stats.of(samples).as_dict("kernel"), timer="cupti")
        except Exception as e:  # noqa: BLE001 - fall back to CUDA events, and say so
            samples = []
            for i in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(*sets[i % len(sets)])
                b.record()
                torch.cuda.synchronize()
                samples.append(a.elapsed_time(b))
            out.update(Stats.of(samples).as_dict("kernel"), timer="cuda_events",
                       timer_note=f"CUPTI unusable for torch ({type(e).__name__}): CUDA events")
        wall = []
        for i in range(repeats):
            t0 = time.perf_counter()
            fn(*sets[i % len(sets)])
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
        out.update(Stats.of(wall).as_dict("wall"))
        t0 = time.perf_counter()
        for i in range(20):
            fn(*sets[i % len(sets)])
        torch.cuda.synchronize()
        out["pipelined_ms"] = (time.perf_counter() - t0) * 1e3 / 20
        out["torch_peak_bytes"] = int(torch.cuda.max_memory_allocated())
        return out

    def output_numpy(self, q, k, v, spec: AttentionSpec, scale: float) -> np.ndarray:
        torch, fn = self._fn(spec, scale)
        o = fn(_to_torch(q), _to_torch(k), _to_torch(v))
        # float32 holds bf16/fp16 values exactly; hand them back in the input dtype so the
        # tolerance policy judges them as such.
        return o.float().cpu().numpy().astype(np.dtype(spec.dtype))
