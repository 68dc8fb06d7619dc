"""The environment attnlab runs in: versions, devices, optional libraries, backend availability."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import jax
import jaxlib

from .. import __version__, backends
from ..core import device

def optional_libraries() -> dict[str, str | None]:
    """Import name -> installed version, or None when absent (found without importing it): the
    libraries the registered backends declare (``Backend.library``)."""
    return backends.library_versions()


def git_commit(path: str = __file__) -> str | None:
    """The commit of the checkout that holds ``path`` (this module), with "-dirty" when the tree differs from it;
    None where git does not track ``path``: an installed copy inside some other repository (a project's
    virtual environment) must not name that project's commit. ATTNLAB_GIT_COMMIT overrides."""
    if os.environ.get("ATTNLAB_GIT_COMMIT"):
        return os.environ["ATTNLAB_GIT_COMMIT"]
    here, name = os.path.split(os.path.abspath(path))
    try:
        git = lambda *a: subprocess.run(["git", "-C", here, *a], capture_output=True, text=True, timeout=5)  # noqa: E731
        if git("ls-files", "--error-unmatch", "--", name).returncode != 0:
            return None
        r = git("describe", "--always", "--dirty", "--abbrev=7")
        return r.stdout.strip() or None if r.returncode == 0 else None
    except Exception:
        return None


def collect() -> dict:
    """Everything a result record needs to be interpreted later (JSON-serialisable)."""
    info = device.current()
    devices = [{"id": d.id, "platform": d.platform, "kind": d.device_kind,
                "compute_capability": getattr(d, "compute_capability", None)} for d in jax.devices()]
    backend_status = {b.name: {"available": b.available() is None,
                               "reason": b.available(), "version": b.version()} for b in backends.all_backends()}
    env = {
        "attnlab": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "os": platform.platform(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": info.platform,
        "device_kind": info.kind,
        "device_count": info.count,
        "compute_capability": ".".join(map(str, info.compute_capability)) if info.compute_capability else None,
        "cudnn": info.cudnn_version_str,
        "devices": devices,
        "optional": optional_libraries(),
        "backends": backend_status,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }
    if info.platform != "gpu":
        env["gpu_note"] = (f"no GPU: JAX's default device is {info.platform}; GPU paths (cuDNN, "
                           "TransformerEngine, Pallas GPU kernels) are unavailable here")
    return env


def short(env: dict) -> dict:
    """The env fields stored with every result record (no per-device list)."""
    keys = ("attnlab", "git_commit", "jax", "jaxlib", "platform", "device_kind", "compute_capability", "cudnn", "optional", "xla_flags")
    return {k: env.get(k) for k in keys}
