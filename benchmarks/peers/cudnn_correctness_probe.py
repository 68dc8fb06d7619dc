"""Probe the cases where cuDNN attention through JAX was reported silently wrong.

For each case: the raw ``jax.nn.dot_product_attention(implementation="cudnn")`` call's
error against attnlab's float64 reference (or the exception it raised), and what attnlab
does with the same input (the backend auto picks, its error, or the UnsupportedError).

    PYTHONPATH=src python3 benchmarks/peers/cudnn_correctness_probe.py OUT.json
"""
import json
import sys

import jax
import jax.numpy as jnp

import attnlab
from attnlab.measure import env as envmod
from attnlab.reference.inputs import random_qkv
from attnlab.reference.float64 import check_close


def case(name, issue, shape, **kw):
    B, T, S, N, K, H = shape
    q, k, v = random_qkv(B, T, S, N, K, H, "bfloat16", seed=T + S)
    rec = {"case": name, "issue": issue, "shape": shape, "kwargs": {k_: str(v_) for k_, v_ in kw.items()}}
    try:
        raw = jax.nn.dot_product_attention(q, k, v, implementation="cudnn", **kw)
        vr = check_close(raw, q, k, v, **kw)
        rec.update(raw_rel_err=vr.rel_err, raw_limit=vr.limit, raw_correct=vr.ok)
    except Exception as e:
        rec.update(raw_error=f"{type(e).__name__}: {e}"[:300])
    expl = attnlab.explain(q, k, v, **kw)
    out = attnlab.attention(q, k, v, **kw)
    va = check_close(out, q, k, v, **kw)
    rec.update(attnlab_backend=expl.chosen, cudnn_reason=expl.reasons["cudnn"], attnlab_rel_err=va.rel_err,
               attnlab_correct=va.ok)
    return rec


def main(path):
    kv = jnp.array([24, 125, 53, 28, 77, 96, 13, 114], jnp.int32)
    recs = [
        case("window (16,0) without causal", "jax-ml/jax#39576", (2, 128, 128, 4, 4, 64), local_window_size=(16, 0)),
        case("window (16,16) without causal", "jax-ml/jax#39576", (2, 128, 128, 4, 4, 64), local_window_size=(16, 16)),
        case("window (16,0) with causal", "control", (2, 128, 128, 4, 4, 64), local_window_size=(16, 0), is_causal=True),
        case("window (8,4) with causal + padding", "jax-ml/jax#39576", (2, 128, 128, 4, 4, 64), local_window_size=(8, 4),
             is_causal=True, query_seq_lengths=jnp.array([100, 128], jnp.int32), key_value_seq_lengths=jnp.array([128, 90], jnp.int32)),
        case("key/value lengths only", "jax-ml/jax#23349", (8, 128, 128, 4, 4, 16), key_value_seq_lengths=kv),
        case("key/value lengths + full query lengths", "jax-ml/jax#23349", (8, 128, 128, 4, 4, 16),
             key_value_seq_lengths=kv, query_seq_lengths=jnp.full((8,), 128, jnp.int32)),
        case("causal with T < S", "alignment", (1, 32, 128, 4, 4, 64), is_causal=True),
    ]
    out = {"env": envmod.short(envmod.collect()), "cases": recs}
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
    for r in recs:
        raw = r.get("raw_error") or f"rel_err {r['raw_rel_err']:.2e} ({'ok' if r['raw_correct'] else 'WRONG'})"
        print(f"{r['case']:<42} raw jax cudnn: {raw[:70]:<72} attnlab: {r['attnlab_backend']} {r['attnlab_rel_err']:.2e}")


if __name__ == "__main__":
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    main((script_args(__doc__, 0) or ["gpu_probe.json"])[0])
