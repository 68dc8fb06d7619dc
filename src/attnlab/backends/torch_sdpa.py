"""PyTorch ``scaled_dot_product_attention`` under ``sdpa_kernel`` as cross-framework peers.

The same inputs are handed over from JAX by DLPack (no copy). These kernels cannot run inside
``jax.jit``: ``attention(..., implementation="torch-flash")`` works on concrete arrays only, and
sweeps check their whole output like every backend's and time them through ``native_fn`` with
CUPTI, as the JAX paths (``attnlab.measure.native.time_kernel``; CUDA events only where CUPTI
cannot be used, and then the record's ``timer`` says ``cuda_events``).
"""
from __future__ import annotations

import jax

from ..core.call import Call
from ..core.errors import UnsupportedError
from . import _optional
from .base import NativeBackend, NativeCall

_KERNELS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def _torch():
    """The ``torch`` module, with ``torch.nn.attention`` (``sdpa_kernel``, ``SDPBackend``) and its ``bias`` loaded."""
    import torch.nn.attention.bias  # optional: torch

    return torch


def _to_torch(x):
    return _torch().from_dlpack(x)


class TorchSdpaBackend(NativeBackend):
    library = ("torch", "torch")
    min_compute_capability = (8, 0)
    decode = True         # decode sweep cells: see ``decode_reason`` / ``decode_fn``
    forward_only = True   # measured forward only: a PyTorch backward pass is not attnlab's to time
    soft_cap_reason = "logits_soft_cap: PyTorch's scaled_dot_product_attention takes no soft cap"

    def __init__(self, kind: str):
        self.kind = kind
        self.name = f"torch-{kind}"
        # the memory-efficient kernel takes no GQA: no contender for auto's held-out (GQA) shapes
        self.peer_parts = ("fwd", "decode") if kind == "efficient" else ("fwd", "decode", "auto")
        self.description = f"PyTorch scaled_dot_product_attention under sdpa_kernel({_KERNELS[kind]})"

    def available(self) -> str | None:
        why = super().available()   # torch installed, an NVIDIA GPU
        if why:
            return why
        torch = _torch()
        if not torch.cuda.is_available():
            return f"torch {torch.__version__} has no CUDA device (a CPU-only build?)"
        return None

    def supports(self, spec: Call) -> str | None:
        if spec.dtype not in ("float16", "bfloat16") and self.kind != "efficient":
            return f"dtype {spec.dtype} not supported by the {self.kind} kernel (float16/bfloat16)"
        if self.kind == "efficient" and spec.kv_heads != spec.heads:
            # measured on the H200 with torch 2.11: "No available kernel" for enable_gqa=True
            return "the memory-efficient kernel takes no grouped key/value heads (enable_gqa)"
        return _optional.simple_masks_only(spec, self.name)

    def _fn(self, spec: Call, scale: float):
        if self.kind == "cudnn":
            _optional.preload_pip_cudnn()
        torch = _torch()
        F, sdpa_kernel = torch.nn.functional, torch.nn.attention.sdpa_kernel
        kernel = getattr(torch.nn.attention.SDPBackend, _KERNELS[self.kind])
        gqa = spec.kv_heads != spec.heads

        def fn(q, k, v):  # BTNH in, BTNH out (views: SDPA takes BNTH)
            with sdpa_kernel(kernel):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=spec.is_causal, scale=scale, enable_gqa=gqa)
            return o.transpose(1, 2)

        return torch, fn

    def decode_reason(self, kv_lengths, T: int, S: int) -> str | None:
        """Why this kernel cannot run a decode cell (T new tokens at the end of each sequence), or None.

        The flash kernel takes no mask: only a full cache (every length S), causal lower-right via
        ``torch.nn.attention.bias.causal_lower_right``. cuDNN and memory-efficient take a boolean
        (B, 1, T, S) mask, so ragged lengths too; they read the whole cache either way."""
        if self.kind == "flash" and any(n != S for n in kv_lengths):
            return "the flash kernel takes no mask: ragged cache lengths need attn_mask"
        return None

    def decode_fn(self, spec: Call, scale: float, kv_lengths, causal: bool):
        """(torch, fn(q, k, v)) for a decode cell: query t of sequence b sits at position
        kv_lengths[b] - T + t; keys past kv_lengths[b] are never seen; causal: keys <= that position."""
        if self.kind == "cudnn":
            _optional.preload_pip_cudnn()
        torch = _torch()
        F, sdpa_kernel = torch.nn.functional, torch.nn.attention.sdpa_kernel
        kernel = getattr(torch.nn.attention.SDPBackend, _KERNELS[self.kind])
        T, S = spec.q_len, spec.kv_len
        gqa = spec.kv_heads != spec.heads
        full = all(n == S for n in kv_lengths)
        if full and (T == 1 or not causal):
            mask = None
        elif self.kind == "flash":
            mask = torch.nn.attention.bias.causal_lower_right(T, S)
        else:
            lens = torch.tensor(list(kv_lengths), device="cuda")[:, None, None, None]
            s = torch.arange(S, device="cuda")[None, None, None, :]
            t = torch.arange(T, device="cuda")[None, None, :, None]
            mask = s < lens
            if causal:
                mask = mask & (s <= lens - T + t)
            if gqa and self.kind == "efficient":
                raise UnsupportedError(self.name, "the memory-efficient kernel takes no grouped key/value heads (enable_gqa)")

        def fn(q, k, v):
            with sdpa_kernel(kernel):
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   attn_mask=mask, scale=scale, enable_gqa=gqa)
            return o.transpose(1, 2)

        return torch, fn

    def run(self, p: Call):
        if any(isinstance(x, jax.core.Tracer) for x in (p.query, p.key, p.value)):
            raise UnsupportedError(self.name, "a PyTorch kernel cannot run inside jax.jit/grad/vmap; call it on concrete arrays")
        torch, fn = self._fn(p, float(p.scale))
        out = fn(*(_to_torch(x) for x in (p.query, p.key, p.value)))
        torch.cuda.synchronize()
        return jax.dlpack.from_dlpack(out.contiguous())

    def native_fn(self, spec: Call, scale: float, arg_sets, decode: tuple | None = None) -> NativeCall:
        """The kernel on the JAX input sets (handed over by DLPack), for ``attnlab.measure.native``: CUPTI
        kernel ms (as for every JAX backend; CUDA events where CUPTI cannot be used), and this cell's
        peak of PyTorch allocations. ``decode``: (kv_lengths, causal) of a decode cell (``decode_fn``)."""
        torch, fn = self._fn(spec, scale) if decode is None else self.decode_fn(spec, scale, *decode)
        sets = [tuple(_to_torch(x) for x in s) for s in arg_sets]
        state = {}

        def event_ms(call) -> float:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            call()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b)

        def reset_peak() -> None:
            torch.cuda.reset_peak_memory_stats()
            state["base"] = torch.cuda.memory_allocated()

        def peak_bytes() -> int:
            return int(torch.cuda.max_memory_allocated() - state["base"])

        # this cell's own peak: PyTorch's allocator is reset first (its inputs live in JAX's allocator)
        return NativeCall(fn, torch.cuda.synchronize, sets,
                          {"event_ms": event_ms, "reset_peak": reset_peak, "peak_bytes": peak_bytes,
                           "peak_scope": "PyTorch allocations of this cell (inputs are JAX's)",
                           "to_jax": lambda out: jax.dlpack.from_dlpack(out.contiguous())})   # as ``run``'s
