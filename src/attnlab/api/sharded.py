"""Attention across a device mesh on JAX's SPMD machinery: meshes, shardings, ``shard_map``, ``ppermute``.

``sharded_attention(q, k, v, mesh=..., strategy=...)`` with strategies

- ``"batch"``: the batch axis B split over the mesh axis; any backend runs each shard.
- ``"heads"``: query heads with their key/value group split over the mesh axis (K must divide by
  the axis size; query head n keeps reading key/value head n // (N // K)); any backend per shard.
- ``"ring"``: context parallelism. q, k, v are split along the sequence; key/value blocks travel
  round the ring with ``jax.lax.ppermute`` and partial results merge by the online-softmax rule
  (log-sum-exp). With ``is_causal`` the sequence is laid out zig-zag (device i holds chunks i and
  2n-1-i of 2n) and fully masked chunk pairs are skipped, so every device does the same work.
  Ring blocks are computed by attnlab's blockwise jax.numpy kernel (float32 softmax).

Shapes as in ``attnlab.core.prepare``: q (B, T, N, H), k and v (B, S, K, H); the result is (B, T, N, H)
sharded like the input strategy implies.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import backends
from ..core.masking import large_negative_value
from ..core.prepare import prepare
from ..core.strategies import register_strategy
from .dot_product import attention

STRATEGIES = ("batch", "heads", "ring")
#: Ring blocks' masked logits and empty rows' log-sum-exp: jax.nn's finite large negative (float32).
NEG = large_negative_value("float32")


def _axis(mesh: Mesh, axis_name):
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis_name is None:
        if len(mesh.axis_names) != 1:
            raise ValueError(f"axis_name is required for a mesh with axes {mesh.axis_names}")
        axis_name = mesh.axis_names[0]
    if axis_name not in mesh.axis_names:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}")
    return axis_name, mesh.shape[axis_name]


def sharded_attention(query, key, value, *, mesh: Mesh, strategy: str, is_causal: bool = False,
                      implementation=None, axis_name=None):
    """Attention with q, k, v distributed over ``mesh``'s axis ``axis_name`` by ``strategy``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    p = prepare(query, key, value, is_causal=is_causal)
    if len(p.out_shape) != 4:
        raise ValueError("sharded_attention needs 4-D (B, T, N, H) query and (B, S, K, H) key/value")
    name, n = _axis(mesh, axis_name)
    if strategy == "ring" and implementation not in (None, "auto", *_ring_names()):
        raise ValueError(f"ring attention computes its blocks with attnlab's blockwise kernel; implementation "
                         f"must be None or {' or '.join(map(repr, _ring_names()))}, got {implementation!r}")
    if why := split_refusal(strategy, n, name, batch=p.batch, heads=p.heads, kv_heads=p.kv_heads, q_len=p.q_len,
                            kv_len=p.kv_len, is_causal=is_causal):
        raise ValueError(why)
    if strategy != "ring":
        spec = P(name) if strategy == "batch" else P(None, None, name)
        return _per_shard(query, key, value, mesh, spec, spec, is_causal, implementation)
    return _ring(query, key, value, mesh, name, n, is_causal, float(p.scale))


def split_refusal(strategy: str, n: int, name: str, *, batch: int, heads: int, kv_heads: int, q_len: int,
                  kv_len: int, is_causal: bool) -> str | None:
    """Why ``strategy`` cannot split these sizes over the mesh axis ``name`` of ``n`` devices, or None."""
    if strategy == "batch" and batch % n:
        return f"batch B={batch} is not a multiple of the mesh axis {name!r} size {n}"
    if strategy == "heads" and kv_heads % n:
        return (f"key/value heads K={kv_heads} (and so query heads N={heads}) must be a multiple of "
                f"the mesh axis {name!r} size {n} to split heads with their groups")
    if strategy != "ring":
        return None
    if is_causal and q_len != kv_len:
        return f"causal ring attention needs T == S, got T={q_len}, S={kv_len}"
    chunks = 2 * n if is_causal else n
    for letter, length in (("T", q_len), ("S", kv_len)):
        if length % chunks:
            return (f"sequence length {letter}={length} must be a multiple of {chunks} "
                    f"({'2 x ' if is_causal else ''}ring size {n}{' for the zig-zag causal layout' if is_causal else ''})")
    return None


def _per_shard(q, k, v, mesh, q_spec, kv_spec, is_causal, implementation):
    fn = functools.partial(attention, is_causal=is_causal, implementation=implementation)
    return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec, check_vma=False)(q, k, v)


# --- ring ------------------------------------------------------------------------------------

def zigzag_order(length: int, n: int):
    """Sequence permutation putting chunks (i, 2n-1-i) of 2n on device i, and its inverse."""
    c = length // (2 * n)
    chunks = jnp.arange(length).reshape(2 * n, c)
    order = jnp.concatenate([jnp.concatenate([chunks[i], chunks[2 * n - 1 - i]]) for i in range(n)])
    return order, jnp.argsort(order)


def _block(q, k, v, q_pos, k_pos, scale, causal):
    """Attention of q (B, t, N, H) on one key/value block (B, s, K, H): (out f32, lse (B, N, t)).

    Masked logits and the lse of a row that sees no key of the block are ``NEG`` (finite, as in
    jax.nn: ``attnlab.core.masking``); such a row's out is 0 and it weighs 0 in ``_merge``."""
    B, t, N, H = q.shape
    K = k.shape[2]
    G = N // K
    qg = q.reshape(B, t, K, G, H)
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    vis = (k_pos[None, :] <= q_pos[:, None])[None, None, None] if causal else jnp.ones(s.shape[-2:], bool)
    s = jnp.where(vis, s, NEG)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    w = jnp.where(vis, jnp.exp(s - m), 0.0)
    l = jnp.sum(w, axis=-1, keepdims=True)
    o = jnp.einsum("bkgts,bskh->btkgh", (w / jnp.where(l == 0, 1.0, l)).astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
    lse = jnp.where(l[..., 0] > 0, jnp.log(jnp.where(l[..., 0] > 0, l[..., 0], 1.0)) + m[..., 0], NEG)
    return o.reshape(B, t, N, H), lse.reshape(B, N, t)


def _merge(o_acc, lse_acc, o_b, lse_b):
    """Online-softmax merge of two partial results over disjoint key sets (an empty one has lse NEG, out 0)."""
    lse = jnp.logaddexp(lse_acc, lse_b)
    wa = jnp.exp(lse_acc - lse)
    wb = jnp.exp(lse_b - lse)
    t = lambda w: jnp.transpose(w, (0, 2, 1))[..., None]  # noqa: E731 - (B, N, t) -> (B, t, N, 1)
    return o_acc * t(wa) + o_b * t(wb), lse


def _ring(q, k, v, mesh, name, n, causal, scale):
    T, S = q.shape[1], k.shape[1]
    if causal:
        order, inverse = zigzag_order(T, n)
        q, k, v = q[:, order], k[:, order], v[:, order]
    tl, sl = T // n, S // n
    half = tl // 2

    def local_positions(dev, length, local):
        if not causal:
            return dev * local + jnp.arange(local)
        c = length // (2 * n)
        return jnp.concatenate([dev * c + jnp.arange(c), (2 * n - 1 - dev) * c + jnp.arange(c)])

    def body(q, k, v):
        me = jax.lax.axis_index(name)
        q_pos = local_positions(me, T, tl)
        B, _, N, H = q.shape
        o = jnp.zeros((B, tl, N, H), jnp.float32)
        lse = jnp.full((B, N, tl), NEG, jnp.float32)
        perm = [(i, (i + 1) % n) for i in range(n)]
        for step in range(n):
            src = (me - step) % n
            k_pos = local_positions(src, S, sl)
            if causal:
                # four chunk pairs; a pair whose keys all lie after its queries is skipped
                parts_o, parts_lse = [], []
                for qa in (0, 1):
                    qs = slice(qa * half, (qa + 1) * half)
                    o_q, lse_q = o[:, qs], lse[:, :, qs]
                    for kb in (0, 1):
                        ks = slice(kb * (sl // 2), (kb + 1) * (sl // 2))
                        qp, kp = q_pos[qs], k_pos[ks]

                        def compute(args, qp=qp, kp=kp, qs=qs, ks=ks):
                            o_q, lse_q = args
                            ob, lb = _block(q[:, qs], k[:, ks], v[:, ks], qp, kp, scale, True)
                            return _merge(o_q, lse_q, ob, lb)

                        o_q, lse_q = jax.lax.cond(kp[0] <= qp[-1], compute, lambda a: a, (o_q, lse_q))
                    parts_o.append(o_q)
                    parts_lse.append(lse_q)
                o = jnp.concatenate(parts_o, axis=1)
                lse = jnp.concatenate(parts_lse, axis=2)
            else:
                ob, lb = _block(q, k, v, q_pos, k_pos, scale, False)
                o, lse = _merge(o, lse, ob, lb)
            if step < n - 1:
                k, v = jax.lax.ppermute((k, v), name, perm)
        return o.astype(q.dtype)

    spec = P(None, name)
    out = jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(q, k, v)
    return out[:, inverse] if causal else out


def make_mesh(devices: int, axis_name: str = "x") -> Mesh:
    """A 1-D mesh over the first ``devices`` devices."""
    avail = jax.devices()
    if devices < 1 or devices > len(avail):
        raise ValueError(f"devices must be in [1, {len(avail)}] (devices JAX sees), got {devices}")

    return Mesh(np.array(avail[:devices]), (axis_name,))


# --- registration: how measure and sweep run these strategies (``attnlab.core.strategies``) ---------

#: Where each strategy puts q, k and v (B, T|S, N|K, H) on the mesh axis "x".
_PLACEMENT = {"batch": P("x"), "heads": P(None, None, "x"), "ring": P(None, "x")}


def _ring_names() -> list[str]:
    """The backends a ring call or cell may name: those whose math the blockwise kernel is (``Backend.ring_blocks``)."""
    return [b.name for b in backends.all_backends() if b.ring_blocks]


def _builder(strategy: str):
    def build(mesh: Mesh, backend: str, causal: bool):
        # ring computes its blocks itself: the naive backend is its blockwise kernel
        impl = None if strategy == "ring" and backend in _ring_names() else backend

        def fwd(q, k, v):
            return sharded_attention(q, k, v, mesh=mesh, strategy=strategy, is_causal=causal, implementation=impl)
        return fwd
    return build


def _why_not(strategy: str):
    def why_not(cell) -> str | None:
        if cell.window is not None:
            return "sharded cells take no window"
        if strategy == "ring" and cell.backend not in _ring_names():
            return f"ring attention computes its blocks with attnlab's blockwise kernel: use backend {' or '.join(_ring_names())}"
        return split_refusal(strategy, cell.devices, "x", batch=cell.batch, heads=cell.heads, kv_heads=cell.kv_heads,
                             q_len=cell.q_len, kv_len=cell.kv_len, is_causal=cell.causal)
    return why_not


def _register() -> None:
    for name in STRATEGIES:
        register_strategy(name, mesh=make_mesh, placement=lambda mesh, name=name: NamedSharding(mesh, _PLACEMENT[name]),
                          build=_builder(name), why_not=_why_not(name))


_register()
