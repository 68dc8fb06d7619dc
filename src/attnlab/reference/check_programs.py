"""The check's programs on the device: the float32 reference with its emulation, and an output's (or the
gradients') errors against it under the empty-row rule (``attnlab.reference.rules``), in float32.

Each is one ``jax.jit`` program (run by ``compiled_once``, compiled ahead from ``check_compiles``); the emulation
is judged by the same program as the output (its errors are the policy's baselines), so one compile serves both.

- ``references(q, k, v, **rules)`` -> (reference, emulation, empty (B, T) bool: the rows that see no key).
- ``judge_output(out, ref, v, empty)`` -> ((rel L2, worst row, max abs), (row, head) pairs compared as zeros): a
  row that sees no key is compared with the nearer of 0 (the blockwise reference's value there) and jax.nn's
  value, the mean of V over all S keys per key/value head.
- ``grad_references(q, k, v, cotangent, **rules)`` -> ((dq, dk, dv), their emulations, empty).
- ``judge_grads(dq, dk, dv, *refs, cotangent, empty)`` -> (3, 2) (rel L2, worst row) errors of dq, dk, dv (rows:
  (b, t) of dq, (b, s) of dk and dv); dv against the nearer of the 0 convention's and jax.nn's (a row that sees no key weighs every key 1/S; dq and dk are the same under both).
- ``batch_rows(x, idx)``: the sampled batch elements of K or V for the float64 rows.
- ``check_compiles(q, k, v, ...)``: those a check of these shapes runs, for ``compiled.precompile``.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .blockwise import _acc, blockwise_attention, blockwise_grads, empty_rows
from .compiled import STATIC


@jax.jit
def errors(out, ref):
    """(relative L2 error, worst row's relative error, max |out - ref|) on the device, in float32.

    Rows are (b, t) over every head and head dim; a row with a (near) zero reference is judged
    against 1e-3 of the mean row norm. NaN or Inf in ``out`` gives inf for all three."""
    o = out.astype(jnp.float32)
    r = ref.astype(jnp.float32)
    finite = jnp.all(jnp.isfinite(o))
    d = (o - r).reshape(o.shape[0] * o.shape[1], -1) if o.ndim > 2 else (o - r).reshape(o.shape[0], -1)
    rr = r.reshape(d.shape)
    dn = jnp.linalg.norm(d, axis=1)
    rn = jnp.linalg.norm(rr, axis=1)
    total = jnp.sqrt(jnp.sum(dn**2)) / jnp.maximum(jnp.sqrt(jnp.sum(rn**2)), 1e-30)
    row = jnp.max(dn / jnp.maximum(rn, jnp.maximum(1e-3 * jnp.mean(rn), 1e-30)))
    mx = jnp.max(jnp.abs(d))
    inf = jnp.float32(jnp.inf)
    return (jnp.where(finite, total, inf), jnp.where(finite, row, inf), jnp.where(finite, mx, inf))


@functools.partial(jax.jit, static_argnames=STATIC)
def references(q, k, v, **kw):
    """(float32 reference (B, T, N, H), its kernel-like emulation (q's dtype), empty (B, T) bool: the rows that
    see no key); ``kw``: ``blockwise_attention``'s rules."""
    return blockwise_attention(q, k, v, **kw), blockwise_attention(q, k, v, emulate=True, **kw), empty_rows(q, k, **kw)


@functools.partial(jax.jit, static_argnames=STATIC)
def grad_references(q, k, v, cotangent, **kw):
    """((dq, dk, dv) float32 of sum(out * cotangent), the same emulated (in q's dtype), empty (B, T) bool)."""
    return (blockwise_grads(q, k, v, cotangent, **kw), blockwise_grads(q, k, v, cotangent, emulate=True, **kw),
            empty_rows(q, k, **kw))


@jax.jit
def judge_output(out, ref, v, empty):
    """((rel L2, worst row, max abs) of out (B, T, N, H) against ref, each (row, head) of a row that sees no
    key (empty (B, T)) against the nearer of 0 and jax.nn's value there (v (B, S, K, H) averaged over S),
    the number of such pairs compared as zeros)."""
    o, f32 = out.astype(jnp.float32), jnp.float32
    vmean = jnp.repeat(jnp.mean(v.astype(f32), axis=1), o.shape[2] // v.shape[2], axis=1)[:, None]   # (B, 1, N, H)
    as_zero = empty[:, :, None] & (jnp.linalg.norm(o, axis=-1) < jnp.linalg.norm(o - vmean, axis=-1))
    target = jnp.where(empty[:, :, None, None], jnp.where(as_zero[..., None], 0.0, vmean), ref.astype(f32))
    return errors(out, target), jnp.sum(as_zero)


@jax.jit
def judge_grads(dq, dk, dv, ref_dq, ref_dk, ref_dv, cotangent, empty):
    """(3, 2) (rel L2, worst row) errors of dq, dk, dv against the 0 convention's; dv's those against whichever of
    that and jax.nn's dv is nearer in rel L2 (jax.nn: each key gains 1/S of the cotangent (B, T, N, H) of the rows
    that see no key, summed over the query heads of its key/value head)."""
    B, S, K, H = dv.shape
    add = jnp.sum(jnp.where(empty[:, :, None, None], cotangent.astype(jnp.float32), 0.0), axis=1)      # (B, N, H)
    dv_jax_nn = ref_dv + (jnp.sum(add.reshape(B, K, -1, H), axis=2) / S)[:, None].astype(ref_dv.dtype)
    zero, nn = (jnp.stack(errors(dv, r)[:2]) for r in (ref_dv, dv_jax_nn))
    return jnp.stack([jnp.stack(errors(dq, ref_dq)[:2]), jnp.stack(errors(dk, ref_dk)[:2]),
                      jnp.where(zero[0] <= nn[0], zero, nn)])


@jax.jit
def batch_rows(x, idx):
    """``x[idx]`` along the batch axis, widened to float32 on the device (exact for bf16/fp16): the
    float64 rows' K and V leave the device as only their sampled batch elements, and NumPy widens
    float32 to float64 natively (ml_dtypes' bfloat16 -> float64 is several times slower)."""
    y = jnp.take(x, idx, axis=0)
    return y.astype(jnp.promote_types(y.dtype, jnp.float32))


def check_compiles(q, k, v, *, grads: bool = False, n_batch: int | None = None, **kw) -> list:
    """What a check of these shapes runs (``jax.ShapeDtypeStruct`` q, k, v and keyword arguments), as
    (program, argument shapes, keyword arguments) for ``precompile``: ``references``, ``judge_output`` of an output
    against it, ``batch_rows`` of K for ``n_batch`` sampled batch elements; with ``grads`` also
    ``grad_references`` and ``judge_grads`` (cotangent in q's dtype)."""
    acc = jax.ShapeDtypeStruct(q.shape, _acc(q.dtype))
    empty = jax.ShapeDtypeStruct(q.shape[:2], jnp.bool_)
    out = [(references, (q, k, v), kw), (judge_output, (q, acc, v, empty), {})]
    if n_batch:
        out.append((batch_rows, (k, jax.ShapeDtypeStruct((n_batch,), jnp.int32)), {}))
    if grads:
        accs = tuple(jax.ShapeDtypeStruct(x.shape, _acc(x.dtype)) for x in (q, k, v))
        out += [(grad_references, (q, k, v, q), kw), (judge_grads, (q, k, v, *accs, q, empty), {})]
    return out
