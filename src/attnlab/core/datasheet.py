"""Datasheet peaks by device kind: dense TFLOP/s per dtype class and HBM bandwidth (``attnlab.measure.peaks``
re-exports them beside the measured ceilings; the record validator, ``attnlab.core.rate_check``, reads them).

Datasheet figures are dense (no structured sparsity), SXM parts unless named:
  H100 SXM, H100 PCIe: NVIDIA H100 Tensor Core GPU datasheet.
  H200:               NVIDIA H200 Tensor Core GPU datasheet (same compute as H100 SXM, 4.8 TB/s HBM3e).
  A100 80GB / 40GB:   NVIDIA A100 Tensor Core GPU datasheet (SXM4).
  L4:                 NVIDIA L4 Tensor Core GPU datasheet.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Peak:
    name: str
    tflops: dict          # dtype class -> dense TFLOP/s: "bf16", "fp8", "tf32", "fp32"
    hbm_tbps: float       # memory bandwidth, TB/s
    l2_bytes: int
    source: str


H100_SXM = Peak("H100 SXM", {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}, 3.35, 50 * 2**20,
                "NVIDIA H100 Tensor Core GPU datasheet (SXM5)")
PEAKS = {
    "H200": Peak("H200", {"bf16": 989.4, "fp8": 1978.9, "tf32": 494.7, "fp32": 66.9}, 4.8, 60 * 2**20,
                 "NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    "H100 PCIe": Peak("H100 PCIe", {"bf16": 756.0, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.2}, 2.0, 50 * 2**20,
                      "NVIDIA H100 Tensor Core GPU datasheet (PCIe)"),
    "H100 SXM": H100_SXM,
    "A100 80GB": Peak("A100 80GB", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}, 2.039, 40 * 2**20,
                      "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)"),
    "A100 40GB": Peak("A100 40GB", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5}, 1.555, 40 * 2**20,
                      "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB)"),
    "L4": Peak("L4", {"bf16": 121.0, "fp8": 242.5, "tf32": 60.0, "fp32": 30.3}, 0.3, 48 * 2**20,
               "NVIDIA L4 Tensor Core GPU datasheet"),
}


def peak_for_kind(kind: str) -> Peak | None:
    """The datasheet entry for a JAX ``device_kind`` string such as 'NVIDIA H200', or None."""
    k = kind.upper()
    if "H200" in k:
        return PEAKS["H200"]
    if "H100" in k:
        return PEAKS["H100 PCIe"] if "PCIE" in k else PEAKS["H100 SXM"]
    if "A100" in k:
        return PEAKS["A100 40GB"] if "40GB" in k else PEAKS["A100 80GB"]
    if k.replace("NVIDIA ", "").strip() == "L4":
        return PEAKS["L4"]
    return None


def dtype_class(dtype: str, tf32: bool = False) -> str:
    """The peak a dtype's matmuls run at: bf16 (float16 too), fp8, tf32 (float32 at ``tf32`` precision) or fp32
    (float32 at full precision, and float64, which no TF32 path computes: its tensor peak is about FP32's)."""
    name = str(dtype)
    if name in ("bfloat16", "float16"):
        return "bf16"
    if name.startswith("float8"):
        return "fp8"
    return "tf32" if tf32 and name != "float64" else "fp32"


def peak_tflops(kind: str, dtype: str, tf32: bool = False) -> float | None:
    p = peak_for_kind(kind)
    return None if p is None else p.tflops.get(dtype_class(dtype, tf32))


def rates_of(flops: float, nbytes: float, ms: float, peak: float | None, sheet: Peak | None, devices: int = 1) -> dict:
    """A timed call's rates: ``tflops``, ``gbps``, and where ``peak`` (TFLOP/s, one device's) is known
    ``pct_peak``; where the device's datasheet ``sheet`` is known too ``pct_bandwidth``, ``roofline_ms`` (max(bytes /
    HBM bandwidth, FLOPs / peak)) and ``pct_roofline``. ``devices``: a sharded call's, its percentages and
    roofline of them together."""
    out = {"tflops": flops / (ms * 1e-3) / 1e12, "gbps": nbytes / (ms * 1e-3) / 1e9}
    if peak:
        out["pct_peak"] = 100 * out["tflops"] / (peak * devices)
        if sheet:
            out["pct_bandwidth"] = 100 * out["gbps"] / (sheet.hbm_tbps * 1e3 * devices)
            out["roofline_ms"] = max(nbytes / (sheet.hbm_tbps * 1e12), flops / (peak * 1e12)) * 1e3 / devices
            out["pct_roofline"] = 100 * out["roofline_ms"] / ms
    return out
