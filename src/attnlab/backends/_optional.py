"""Helpers for backends whose library may be absent: find it without importing it, name its version."""
from __future__ import annotations

import importlib.metadata
import importlib.util

from .. import device


def missing(module: str, extra: str) -> str | None:
    """None when ``module`` can be imported, else why not and how to install it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} is not installed (pip install 'attnlab[{extra}]')"


def dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def needs_nvidia(min_cc: tuple[int, int] = (8, 0)) -> str | None:
    info = device.current()
    if info.platform != "gpu" or info.compute_capability is None:
        return f"needs an NVIDIA GPU; JAX's default device is {info.platform} ({info.kind})"
    if info.compute_capability < min_cc:
        return f"needs compute capability >= {min_cc[0]}.{min_cc[1]}, device has {info.compute_capability[0]}.{info.compute_capability[1]}"
    return None


def simple_masks_only(spec, what: str = "this kernel") -> str | None:
    """Reason when the call uses anything beyond causal / no mask."""
    used = [n for n, on in (("bias", spec.bias_shape), ("mask", spec.mask_shape), ("query_seq_lengths", spec.has_q_lengths),
                            ("key_value_seq_lengths", spec.has_kv_lengths), ("local_window_size", spec.window)) if on]
    return f"{what} takes no {', '.join(used)} (causal or no mask only)" if used else None
