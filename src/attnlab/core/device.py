"""Facts about the device JAX computes on: platform, kind, compute capability, cuDNN."""
from __future__ import annotations

import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    platform: str                 # "cpu", "gpu", "tpu"
    kind: str                     # e.g. "NVIDIA H200", "cpu"
    count: int
    compute_capability: tuple[int, int] | None = None
    cudnn_version: int | None = None  # e.g. 91900 for 9.19.0

    @property
    def cudnn_version_str(self) -> str | None:
        if self.cudnn_version is None:
            return None
        v = self.cudnn_version
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"


def _cudnn_version() -> int | None:
    try:
        from jax._src.lib import cuda_versions  # JAX-private: may move
    except Exception:
        return None
    if cuda_versions is None:
        return None
    try:
        return int(cuda_versions.cudnn_get_version())
    except Exception:
        return None


@functools.lru_cache(maxsize=None)
def current() -> DeviceInfo:
    """The default JAX device (the one an un-annotated jit runs on)."""
    import jax  # heavy: jax, core imports no JAX

    devices = jax.devices()
    d = devices[0]
    cc = None
    raw = getattr(d, "compute_capability", None)
    if raw:
        try:
            major, minor = str(raw).split(".")[:2]
            cc = (int(major), int(minor))
        except ValueError:
            cc = None
    cudnn = _cudnn_version() if d.platform == "gpu" else None
    return DeviceInfo(platform=d.platform, kind=d.device_kind, count=len(devices), compute_capability=cc, cudnn_version=cudnn)
