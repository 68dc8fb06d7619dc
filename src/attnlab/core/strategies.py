"""The registry of mesh strategies: how a cell runs across devices, declared by the layer that knows.

A strategy is data — a name, a mesh maker, how its inputs are placed, how it builds the attention
function, and which cells it refuses — that the layer implementing it registers here. The layers
that *run* strategies (``attnlab.measure`` places inputs and builds the timed function,
``attnlab.sweep`` validates the ``strategy`` axis) look them up by name and never import that
layer: this module imports nothing of attnlab, so it sits below all of them.

``attnlab.api.sharded`` registers ``batch``, ``heads`` and ``ring`` when it is imported. The layer that
runs sweeps of sharded cells performs that import: ``attnlab.sweep.engine`` imports
``attnlab.api.sharded`` (so do user code calling ``attnlab.sharded_attention`` and the tests), while
``import attnlab`` stays cheap (sharded loads on first use) and ``attnlab.measure`` never imports
it. A ``Cell`` naming a strategy nobody registered is refused with a message saying so. Another
implementation (a 2-D mesh, another ring) is one ``register_strategy`` call, with no edit below it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Strategy:
    """One way to split an attention call over a 1-D mesh of ``devices`` devices.

    ``mesh(devices)``: the mesh. ``placement(mesh)``: the ``jax.sharding.Sharding`` of q, k and v
    (inputs are put there before timing, so the initial scatter is not timed).
    ``build(mesh, backend, causal)``: a function ``fwd(q, k, v)`` running the cell's backend across
    the mesh. ``why_not(cell)``: why a cell (its backend, window, sizes, devices) cannot run this way (None: it
    can), asked before its inputs are placed."""

    name: str
    mesh: Callable[[int], Any]
    placement: Callable[[Any], Any]
    build: Callable[..., Callable]
    why_not: Callable[[Any], str | None] = lambda cell: None


_REGISTRY: dict[str, Strategy] = {}


def register_strategy(name: str, *, mesh, placement, build, why_not=None) -> Strategy:
    """Make ``strategy=name`` runnable by cells and sweeps (see ``Strategy``)."""
    if not name or name in ("none",):
        raise ValueError(f"invalid strategy name {name!r}")
    s = Strategy(name, mesh, placement, build, *([why_not] if why_not else []))
    _REGISTRY[name] = s
    return s


def get(name: str) -> Strategy:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(unknown(name)) from None


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def unknown(name) -> str:
    """The refusal of a strategy name nobody registered."""
    return (f"strategy must be None or one of {names()}, got {name!r} (strategies are registered by the module "
            f"implementing them: import attnlab.api.sharded or attnlab.sweep for batch, heads and ring)")
