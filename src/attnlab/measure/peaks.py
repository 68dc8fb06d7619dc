"""The device's ceilings: datasheet peaks by device kind (``attnlab.core.datasheet``, re-exported here)
and measured ceilings (``attnlab ceilings``).
"""
from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp

from . import timers
from ..core.datasheet import H100_SXM, PEAKS, Peak, dtype_class, peak_for_kind, peak_tflops  # noqa: F401  (re-exported)


# --- measured ceilings ----------------------------------------------------------------------

def cache_path() -> str:
    base = os.environ.get("ATTNLAB_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "attnlab")
    return os.path.join(base, "ceilings.json")


def load_ceilings(kind: str | None = None) -> dict | None:
    kind = kind or jax.devices()[0].device_kind
    try:
        with open(cache_path()) as f:
            return json.load(f).get(kind)
    except (OSError, ValueError):
        return None


def measure_ceilings(*, matmul_n: int | None = None, copy_bytes: int | None = None, repeats: int = 10) -> dict:
    """bf16 matmul TFLOP/s and device copy GB/s (read + write counted) on the default device."""
    gpu = jax.default_backend() == "gpu"
    n = matmul_n or (8192 if gpu else 1024)
    nbytes = copy_bytes or (2**30 if gpu else 2**26)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    x = jax.random.normal(jax.random.key(2), (nbytes // 2,), jnp.float32).astype(jnp.bfloat16)
    use_kernel = timers.kernel_timer_available() is None

    def ms(fn, args):
        compiled, _, _ = timers.compile_seconds(fn, args)
        timers.warm_up(compiled, [args])
        st = timers.kernel_per_call(compiled, [args], repeats) if use_kernel else timers.wall_per_call(compiled, [args], repeats)
        return st.median

    mm = ms(lambda a, b: a @ b, (a, b))
    cp = ms(lambda x: x * 2, (x,))
    result = {
        "device_kind": jax.devices()[0].device_kind,
        "timer": "cupti" if use_kernel else "wall",
        "matmul_dtype": jnp.dtype(dtype).name, "matmul_n": n, "matmul_ms": mm,
        "matmul_tflops": 2 * n**3 / (mm * 1e-3) / 1e12,
        "copy_bytes": 2 * x.size * x.dtype.itemsize, "copy_ms": cp,
        "copy_gbps": 2 * x.size * x.dtype.itemsize / (cp * 1e-3) / 1e9,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "jax": jax.__version__,
    }
    return result


def save_ceilings(result: dict) -> str:
    path = cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[result["device_kind"]] = result
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
    return path


# --- units and the roofline's ridge ---------------------------------------------------------

from ..core.units import _sig, format_bandwidth, format_flops  # noqa: E402, F401  (re-exported)


def roofs(kind: str, dtype: str = "bfloat16", tf32: bool = False) -> dict:
    """The roofs a roofline of this device draws: ``datasheet`` (TFLOP/s, TB/s) from ``PEAKS`` and
    ``measured`` from ``attnlab ceilings``' cache; each None where unknown."""
    p = peak_for_kind(kind)
    pk = peak_tflops(kind, dtype, tf32)
    ceil = load_ceilings(kind)
    return {"datasheet": (pk, p.hbm_tbps) if p and pk else None,
            "measured": (ceil["matmul_tflops"], ceil["copy_gbps"] / 1000) if ceil else None}


def ridge(kind: str, dtype: str = "bfloat16", tf32: bool = False) -> float | None:
    """Arithmetic intensity (FLOP/byte) where the roofline's slope meets its flat roof: the
    datasheet's, else the measured ceilings', else None."""
    r = roofs(kind, dtype, tf32)
    roof = r["datasheet"] or r["measured"]
    return roof[0] / roof[1] if roof and roof[1] else None


def bandwidth_tbps(kind: str) -> tuple[float | None, str]:
    """(TB/s, where it comes from): the datasheet's memory bandwidth, else the measured copy ceiling."""
    p = peak_for_kind(kind)
    if p:
        return p.hbm_tbps, "datasheet"
    ceil = load_ceilings(kind)
    return (ceil["copy_gbps"] / 1000, "measured copy") if ceil else (None, "")


def memory_bound(rec: dict, ridge_intensity: float | None = None) -> bool:
    """A cell whose time is set by reading the KV cache, not by arithmetic: decode (``lengths``
    set, or T <= 64 queries against a longer S) with an arithmetic intensity below the ridge
    (where the ridge is known)."""
    T, S = rec.get("q_len"), rec.get("kv_len")
    decode_like = rec.get("lengths") is not None or (T is not None and S is not None and T <= 64 and T < S)
    if not decode_like:
        return False
    x = rec.get("intensity")
    return ridge_intensity is None or x is None or x < ridge_intensity
