"""Helpers for backends whose library may be absent: find it without importing it, name its version."""
from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import importlib.util
import os

from ..core import device


def install_hint(extra: str) -> str:
    """How to install an extra, as the README's table says it (from the attnlab checkout)."""
    if extra == "te":   # TE-JAX builds against the JAX already installed
        return "pip install --no-build-isolation -e '.[te]'"
    return f"pip install -e '.[{extra}]'"


def missing(module: str, extra: str) -> str | None:
    """None when ``module`` can be imported, else why not and how to install it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{module} is not installed ({install_hint(extra)} in the attnlab checkout)"


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


def preload_pip_cudnn() -> str | None:
    """Load the pip-installed cuDNN libraries (the ones JAX uses) into the process first.

    On the H200 image a second cuDNN lives in /lib; TransformerEngine and PyTorch's cuDNN
    attention dlopen cuDNN's sub-libraries by name and, without this, can pick that one up:
    'libcudnn_cnn.so.9: undefined symbol ... libcudnn_graph.so.9' (seen 2026-12-02). With this
    preload TE reports cuDNN 9.19 and its fused kernels; with LD_LIBRARY_PATH set to the pip folder
    instead, TE imported but loaded the system 9.14 and found no fused kernel
    (CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED; benchmarks/peers/te_probe.py). Returns the folder used, or None.
    """
    try:
        import nvidia.cudnn as cudnn_pkg  # optional: the nvidia-cudnn pip wheel
    except Exception:  # noqa: BLE001
        return None
    for base in list(getattr(cudnn_pkg, "__path__", [])):
        libs = sorted(glob.glob(os.path.join(base, "lib", "libcudnn*.so.*")))
        if not libs:
            continue
        # the graph and ops libraries first: the others resolve symbols against them
        libs.sort(key=lambda p: (0 if "graph" in p else 1 if "ops" in p else 2, p))
        for lib in libs:
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
        return os.path.join(base, "lib")
    return None
