"""The decode kernel's tuning plan and goals (``benchmarks/decode/tune.py`` measures them on a GPU):
the shapes (each a ``Problem``), each shape's grid of variants after the default plan, and how issue 13's goals stand."""
from __future__ import annotations

from ..core.problem import Problem
from ..kernels.decode_resources import smem_bytes

HBM_TBS = 4.8
PEAK_TFLOPS = 989.4
L2_BYTES = 60 * 2**20
SMEM_LIMIT = 227 * 1024


#: The ragged shape's lengths, as fractions of S (each at least T).
RAGGED = (1.0, 0.75, 0.5, 0.25, 0.125, 1 / 16, 1 / 32, 1 / 64)


def shape(B: int, S: int, N: int, K: int, H: int, T: int, ragged: bool = False, dtype: str = "bfloat16") -> Problem:
    """A tuning shape: the causal decode of T new tokens against B caches of S tokens (ragged: the lengths
    ``RAGGED`` of S, at most 8 sequences), as the ``Problem`` it is."""
    lengths = tuple(max(T, int(S * f)) for f in RAGGED)[:B] if ragged else None
    return Problem(B, T, S, N, K, H, dtype, True, kv_lengths=lengths, decode=True)


def sizes(p: Problem) -> tuple[int, ...]:
    """(B, T, S, N, K, H): the first arguments of ``kernels.decode.make_plan`` and ``random_qkv``."""
    return p.batch, p.q_len, p.kv_len, p.heads, p.kv_heads, p.head_dim


def lengths(p: Problem) -> list[int]:
    return list(p.kv_lengths or (p.kv_len,) * p.batch)


def group(p: Problem) -> str:
    """The shape's group in the report: ragged, long (B = 1), wide (B = 32) or goal."""
    return "ragged" if p.kv_lengths else {1: "long", 32: "wide"}.get(p.batch, "goal")


def label(p: Problem) -> str:
    return (f"B{p.batch} S{p.kv_len} N{p.heads}/K{p.kv_heads} H{p.head_dim} T{p.q_len}"
            + (" ragged" if p.kv_lengths else ""))


def shape_record(p: Problem) -> dict:
    """The report's ``shape`` (the fields the tuning reports have always held)."""
    return {"name": group(p), "B": p.batch, "S": p.kv_len, "N": p.heads, "K": p.kv_heads, "H": p.head_dim,
            "T": p.q_len, "ragged": p.kv_lengths is not None, "dtype": p.dtype}


def shapes(quick: bool = False, smoke: bool = False) -> list[Problem]:
    if smoke:   # the script's plumbing on a CPU (interpret mode, wall clock): tiny shapes
        return [shape(2, 256, 4, 2, 64, 1), shape(2, 256, 4, 2, 64, 4), shape(8, 256, 4, 2, 64, 4, ragged=True)]
    goal = [shape(8, 32768, 32, 8, 128, t) for t in (1, 2, 4, 8, 16, 32, 64)]
    if quick:
        return [goal[0], goal[2], goal[6]]
    long = [shape(1, 131072, 32, 8, 128, t) for t in (1, 4, 16)]
    wide = [shape(32, 4096, 32, 8, 128, t) for t in (1, 4, 16)]
    return goal + long + wide + [shape(8, 32768, 32, 8, 128, 4, ragged=True)]


def tune_grid(sh: Problem, default_plan) -> list[dict]:
    """Variants after the default: block_k x num_stages, then num_warps (or block_r), then the split count."""
    out = []
    for bk in (32, 64, 128):
        for st in (2, 3, 4):
            if (bk, st) == (default_plan.block_k, default_plan.num_stages):
                continue
            if smem_bytes(default_plan.block_r, bk, sh.head_dim, st) > SMEM_LIMIT:
                continue
            out.append(dict(block_k=bk, num_stages=st))
    if default_plan.num_warps == 8:
        # 4 warps spill at 128 rows (ptxas, benchmarks/decode/ttir_cpu.py): try smaller row tiles instead
        out.append(dict(block_r=default_plan.block_r // 2) if default_plan.block_r > 16 else dict(num_warps=4))
    else:
        out.append(dict(num_warps=8))
    d = default_plan.num_splits
    for s in sorted({max(1, d // 2), 2 * d} - {d}):
        out.append(dict(num_splits=s))
    return out


def goal_lines(report: dict) -> list[str]:
    """How each of issue 13's goals stands, with the margin."""
    lines = []
    by = {r["label"]: r for r in report["shapes"]}
    for t in (1, 2, 4, 8, 16, 32, 64):
        r = by.get(label(shape(8, 32768, 32, 8, 128, t)))
        if not r or not r.get("best"):
            lines.append(f"T={t}: no result")
            continue
        b = r["best"]
        if t == 1:
            c = r.get("cudnn_kvlen_ms")
            if c:
                ratio = b["ms"] / c
                lines.append(f"T=1: {b['ms']:.4f} ms vs cuDNN {c:.4f} ms = {ratio:.3f}x -> "
                             + ("met (within 5%)" if ratio <= 1.05 else f"missed by {100 * (ratio - 1.05):.1f} points"))
        elif t <= 16:
            tbs = b["gbps"] / 1e3
            c = r.get("cudnn_kvlen_ms")
            vs = f", {c / b['ms']:.2f}x cuDNN" if c else ""
            lines.append(f"T={t}: {tbs:.2f} TB/s ({b['pct_hbm']:.0f}% of 4.8){vs} -> "
                         + ("met (>= 4.0 TB/s)" if tbs >= 4.0 else f"missed by {4.0 - tbs:.2f} TB/s"))
        else:
            p = b["pct_roofline"]
            lines.append(f"T={t}: {p:.0f}% of the roofline bound -> " + ("met (>= 70%)" if p >= 70 else f"missed by {70 - p:.0f} points"))
    return lines
