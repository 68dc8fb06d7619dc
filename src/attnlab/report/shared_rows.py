"""Rows the report (``attnlab run``) and the notebook share, so both print the same numbers."""
from __future__ import annotations

from ..core.prepare import prepare
from ..core.workload import kv_cache_bytes

#: The model of the KV-cache calculator: 32 layers, 32 query heads of dim 128, bf16, 8192 tokens, batch 1.
KV_MODEL = dict(layers=32, head_dim=128, context=8192, batch=1, dtype="bfloat16")
KV_VARIANTS = (("MHA", 32), ("GQA", 8), ("MQA", 1))
KV_TITLE = "KV-cache calculator: a 32-layer model with 32 query heads of dim 128, bf16, context 8192, batch 1"
KV_COLUMNS = ["variant", "K", "bytes / token / layer", "cache at 8192 tokens", "saved vs MHA"]


def kv_cache_rows(model: dict | None = None, variants=KV_VARIANTS) -> list[list]:
    """[variant, K, bytes per token per layer, whole cache, saving vs MHA]: MQA is K = 1."""
    model = dict(model or KV_MODEL)
    mha = kv_cache_bytes(kv_heads=variants[0][1], **model)
    rows = []
    for name, K in variants:
        total = kv_cache_bytes(kv_heads=K, **model)
        per = kv_cache_bytes(kv_heads=K, **{**model, "context": 1, "batch": 1, "layers": 1})
        rows.append([name, K, f"{per:,}", f"{total / 2**30:.2f} GiB", f"{mha / total:.0f}×"])
    return rows


def cudnn_head_dims(head_dims=(32, 64, 128, 256, 512), *, batch: int = 1, seq: int = 1024, heads: int = 8,
                    dtype: str = "bfloat16") -> tuple[list[list], str | None]:
    """(rows [H, verdict], why cuDNN is unavailable here or None).

    Where cuDNN can run, the verdict is "accepts" or "refuses: <reason>". Where it cannot (no
    NVIDIA GPU), nothing is claimed to be accepted: the verdict is cuDNN's shape rule only, "shape
    allowed (cuDNN not available here)" or "shape refused: <reason>"."""
    import jax  # heavy: jax, report imports no JAX

    from .. import backends  # heavy: jax, report imports no JAX

    cud = backends.get("cudnn")
    unavailable = cud.available()
    rows = []
    for H in head_dims:
        s = jax.ShapeDtypeStruct((batch, seq, heads, H), dtype)
        why = cud.supports(prepare(s, s, s).spec)
        if unavailable:
            rows.append([H, f"shape refused: {why}" if why else "shape allowed (cuDNN not available here)"])
        else:
            rows.append([H, f"refuses: {why}" if why else "accepts"])
    return rows, unavailable
