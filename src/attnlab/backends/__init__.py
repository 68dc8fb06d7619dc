"""The backend registry: implementations plug in by name, auto-selection walks ``AUTO_ORDER``.

Add a backend by subclassing ``Backend`` in its own module and calling ``register``.
"""
from __future__ import annotations

from .base import Backend

_REGISTRY: dict[str, Backend] = {}
#: Preference order for implementation=None / "auto": the first that can run wins. ``naive`` is the
#: portable last resort (e.g. float16 on a CPU, which XLA's path cannot compile).
AUTO_ORDER: list[str] = ["cudnn", "xla", "naive"]


def register(backend: Backend, *, auto_rank: int | None = None) -> Backend:
    """Make ``backend`` callable as ``attention(..., implementation=backend.name)``."""
    if not backend.name or backend.name in ("auto",):
        raise ValueError(f"invalid backend name {backend.name!r}")
    _REGISTRY[backend.name] = backend
    if auto_rank is not None and backend.name not in AUTO_ORDER:
        AUTO_ORDER.insert(auto_rank, backend.name)
    return backend


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"implementation must be None, 'auto' or one of {names()}, got {name!r}") from None


def names() -> list[str]:
    return list(_REGISTRY)


def all_backends() -> list[Backend]:
    return list(_REGISTRY.values())


def _register_builtins() -> None:
    from .cudnn import CudnnBackend
    from .cudnn_fp8 import CudnnFp8Backend, CudnnFp8UnitBackend
    from .naive import NaiveBackend
    from .pallas import PallasMosaicBackend, PallasTritonBackend
    from .te import TeBackend, TeFp8Backend
    from .tokamax_ import TokamaxBackend
    from .torch_sdpa import TorchSdpaBackend
    from .xla import XlaBackend

    for b in (NaiveBackend(), XlaBackend(), CudnnBackend(), CudnnFp8Backend(), CudnnFp8UnitBackend(),
              TeBackend(), TeFp8Backend(), TokamaxBackend("mosaic"), TokamaxBackend("triton"), TokamaxBackend("xla"),
              PallasTritonBackend(), PallasMosaicBackend(), TorchSdpaBackend("flash"), TorchSdpaBackend("cudnn"),
              TorchSdpaBackend("efficient")):
        register(b)
    _register_decode()


def _register_decode() -> None:
    from .attnlab_decode import AttnlabDecodeBackend
    from .pallas_paged import PallasPagedBackend

    register(AttnlabDecodeBackend())
    register(PallasPagedBackend())


_register_builtins()

__all__ = ["Backend", "register", "get", "names", "all_backends", "AUTO_ORDER"]
