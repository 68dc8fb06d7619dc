"""The backend registry: implementations plug in by name, auto-selection walks ``AUTO_ORDER``.

Add a backend by subclassing ``Backend`` (``NativeBackend`` for one that is not a JAX op) in its own
module and adding one line to ``BUILTINS`` (or calling ``register`` / ``load`` from outside).
``unregister`` removes one; ``with registered(b1, b2):`` plugs backends in for a block (tests).
"""
from __future__ import annotations

import contextlib
import importlib

from ..core.names import match, unknown
from . import _optional
from .base import Backend, NativeBackend

_REGISTRY: dict[str, Backend] = {}
#: Preference order for implementation=None / "auto": the first that can run wins. ``naive`` is the
#: portable last resort (e.g. float64, which XLA's path computes in float32 only).
AUTO_ORDER: list[str] = ["cudnn", "xla", "naive"]


def register(backend: Backend, *, auto_rank: int | None = None) -> Backend:
    """Make ``backend`` callable as ``attention(..., implementation=backend.name)``."""
    if not backend.name or backend.name in ("auto",):
        raise ValueError(f"invalid backend name {backend.name!r}")
    _REGISTRY[backend.name] = backend
    if auto_rank is not None and backend.name not in AUTO_ORDER:
        AUTO_ORDER.insert(auto_rank, backend.name)
    return backend


def unregister(name: str) -> Backend:
    """Remove the backend called ``name`` from the registry (and from ``AUTO_ORDER``); return it."""
    backend = get(name)
    del _REGISTRY[name]
    if name in AUTO_ORDER:
        AUTO_ORDER.remove(name)
    return backend


@contextlib.contextmanager
def registered(*new: Backend):
    """Register ``new`` for the ``with`` block, then restore the registry and ``AUTO_ORDER`` as they were
    (a backend it replaced by name comes back)."""
    saved, order = dict(_REGISTRY), list(AUTO_ORDER)
    try:
        for b in new:
            register(b)
        yield new[0] if len(new) == 1 else new
    finally:
        _REGISTRY.clear()
        _REGISTRY.update(saved)
        AUTO_ORDER[:] = order


def get(name: str) -> Backend:
    """The backend called ``name``, in any case (``cuDNN`` is ``cudnn``): a registered one, or a configured
    variant of one (``cudnn-fp8-hadamard``: ``cudnn-fp8`` with that FP8 recipe; ``Backend.variant_names``).
    ValueError naming the closest known name ("did you mean 'xla'?") when there is none."""
    found = canonical(name)
    if found is None:
        msg = unknown("backend", name, variant_names())     # the closest name, else every known one
        raise ValueError(f"implementation must be None, 'auto' or one of the registered backends: {msg}")
    if found in _REGISTRY:
        return _REGISTRY[found]
    return next(v for b in _REGISTRY.values() if (v := b.configured(found)) is not None)


def named(implementation) -> Backend | None:
    """The backend an ``implementation=`` argument names (``get``); None for None or "auto" (auto's choice).
    TypeError for anything but None or a str."""
    if implementation is not None and not isinstance(implementation, str):
        raise TypeError(f"implementation must be None or a str, got {type(implementation).__name__}")
    return None if implementation in (None, "auto") else get(implementation)


def canonical(name: str) -> str | None:
    """The backend or variant name ``name`` means, ignoring case (``cuDNN`` -> ``cudnn``), or None."""
    return match(name, variant_names()) if isinstance(name, str) else None


def variant_names() -> list[str]:
    """Every name ``get`` resolves: each registered backend's own and its configured variants'."""
    return [n for b in _REGISTRY.values() for n in b.variant_names()]


def names() -> list[str]:
    return list(_REGISTRY)


def all_backends() -> list[Backend]:
    return list(_REGISTRY.values())


def recipe_backends() -> list[str]:
    """The registered backends that take the option ``fp8_recipe`` (``Backend.takes_fp8_recipe``)."""
    return [b.name for b in _REGISTRY.values() if b.takes_fp8_recipe]


def peers(part: str) -> list[str]:
    """The names a peers sweep's ``part`` times (``Backend.peer_parts``: "fwd", "train", "decode", ...), in
    registration order, each backend followed by its ``peer_variants``."""
    return [n for b in _REGISTRY.values() if part in b.peer_parts for n in (b.name, *b.peer_variants)]


#: The built-in backends, in registration order: (module, class, constructor arguments). Adding a
#: backend is one new module (a ``Backend`` subclass declaring its ``library`` and
#: ``min_compute_capability``) and one line here (or ``load``/``register`` from outside).
BUILTINS: list[tuple[str, str, tuple]] = [
    (".naive", "NaiveBackend", ()),
    (".xla", "XlaBackend", ()),
    (".cudnn", "CudnnBackend", ()),
    (".cudnn_fp8", "CudnnFp8Backend", ()),
    (".te", "TeBackend", ()),
    (".te", "TeFp8Backend", ()),
    (".tokamax_", "TokamaxBackend", ("mosaic",)),
    (".tokamax_", "TokamaxBackend", ("triton",)),
    (".tokamax_", "TokamaxBackend", ("xla",)),
    (".pallas", "PallasTritonBackend", ()),
    (".pallas", "PallasMosaicBackend", ()),
    (".torch_sdpa", "TorchSdpaBackend", ("flash",)),
    (".torch_sdpa", "TorchSdpaBackend", ("cudnn",)),
    (".torch_sdpa", "TorchSdpaBackend", ("efficient",)),
    (".attnlab_decode", "AttnlabDecodeBackend", ()),
    (".pallas_paged", "PallasPagedBackend", ()),
]


def load(module: str, cls: str, args: tuple = (), *, auto_rank: int | None = None) -> Backend:
    """Import ``module`` (relative to this package when it starts with "."), build ``cls(*args)``, register it."""
    return register(getattr(importlib.import_module(module, __name__), cls)(*args), auto_rank=auto_rank)


def optional_libraries() -> dict[str, tuple[str, ...]]:
    """The optional libraries the registered backends declare: import name -> distribution names."""
    out: dict[str, tuple[str, ...]] = {}
    for b in _REGISTRY.values():
        for mod, dists in b.libraries().items():
            out.setdefault(mod, dists)
    return out


def library_versions() -> dict[str, str | None]:
    """Import name -> installed version ("unknown version" when found without one), or None when
    absent, for every library in ``optional_libraries`` (found without importing it)."""
    return {mod: ((_optional.dist_version(*dists) or "unknown version") if _optional.missing(mod, "") is None else None)
            for mod, dists in optional_libraries().items()}


for _entry in BUILTINS:
    load(*_entry)
del _entry

__all__ = ["Backend", "NativeBackend", "register", "unregister", "registered", "load", "get", "canonical", "variant_names", "names", "all_backends", "peers", "recipe_backends", "optional_libraries",
           "library_versions", "AUTO_ORDER", "BUILTINS"]
