"""The H200 serving grid's cells: which batches ``grid_gpu.py`` measures, in which order, split into parts.

The issue's full grid (G in {1, 4, 7, 8, 12, 16} x T in {1, 2, 4, 8} x B 8..128 x S up to 128k x four
length distributions x three cache layouts x H in {64, 128, 256}, plus mixed batches) is thousands of cells;
a device call lasts at most 10 minutes. The sample, in priority order (every cell has K = 8 KV heads, so
N = 8 G; bf16; lengths drawn by ``attnlab.core.request_lengths`` with seed 7, mixed with seed 3):

1. ``factorial``: G x T x distribution x {contig, paged16} at B=32, S=32768, H=128 (192 cells);
2. ``paged64``: pages of 64, G in {4, 8, 16}, T in {1, 4}, every distribution (24);
3. ``S``: S in {4096, 131072}, G in {4, 8}, T in {1, 4}, every distribution, contig and paged16 (64);
4. ``B``: B in {8, 128} at S=32768, the same G, T, distributions and layouts (64);
5. ``H``: H in {64, 256} at B=32, S=32768, the same G, T, distributions and layouts (64);
6. ``corner``: B=128 at S=131072 (69 GB of cache: the memory guard decides), G=8, T=1, contig (4);
7. ``mixed``: 2 x 2048 + 126 and 8 x 512 + 248 decodes at S=16384: G in {4, 8, 16} x {contig, paged16,
   paged64}; G=1 contig; T=4 decodes (G=4, contig and paged16); H in {64, 256} (G=8, contig) (28).

Cells repeated by two samples are kept once (the first). Cells that share (B, S, H, layout) share one
cache, and cells that differ only in their lengths (the four distributions) share one compile; the
order keeps both together. ``estimate_s`` is a rough model of a cell's device seconds (compiles,
checks, timing), calibrated on the first serving run (195 records in 146 s): each record stores its
real ``seconds`` to recalibrate it.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from attnlab.core.request_lengths import DISTRIBUTIONS, draw, mixed_batch
from benchmarks.results_folder import roofline_peaks

K = 8
GROUPS = (1, 4, 7, 8, 12, 16)
Q_LENS = (1, 2, 4, 8)
MIXED = ((2, 2048, 126), (8, 512, 248))
S_MIXED = 16384
MIXED_PAD = 64            # token budget past the valid tokens (padding rows), as benchmarks/serving/gpu.py


@dataclasses.dataclass(frozen=True)
class Cell:
    """One measured batch: decode (``chunks`` None: B requests of T new tokens, lengths ``batch``) or mixed
    (``chunks`` = (n, size, decodes): n prefill chunks of size tokens, then ``decodes`` requests of T)."""
    sample: str
    batch: str
    B: int
    S: int
    H: int
    G: int
    T: int
    layout: str
    chunks: tuple | None = None

    @property
    def N(self) -> int:
        return self.G * K

    @property
    def cell_id(self) -> str:
        return f"{self.batch}|B{self.B}|S{self.S}|H{self.H}|G{self.G}|T{self.T}|{self.layout}"

    @property
    def page(self) -> int | None:
        return None if self.layout == "contig" else int(self.layout[5:])

    def fields(self) -> dict:
        return dict(cell_id=self.cell_id, sample=self.sample, batch=self.batch, B=self.B, S=self.S, H=self.H,
                    N=self.N, K=K, G=self.G, T=self.T, layout=self.layout, mixed=self.chunks is not None)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(q_len, kv_len) int32 (B,) of this cell's batch (the same every run: fixed seeds)."""
        if self.chunks is None:
            return np.full(self.B, self.T, np.int32), draw(self.batch, self.B, self.T, self.S, np.random.default_rng(7))
        n, size, decodes = self.chunks
        return mixed_batch(n, size, decodes, self.S, np.random.default_rng(3), q_len=self.T)


def mixed_cell(sample, chunks, H, G, T, layout) -> Cell:
    n, size, decodes = chunks
    return Cell(sample, f"mixed {n}x{size}+{decodes}", n + decodes, S_MIXED, H, G, T, layout, chunks)


def cells() -> list[Cell]:
    """Every cell of the grid, in priority order (module docstring), each once."""
    out = []
    for lay in ("contig", "paged16"):
        out += [Cell("factorial", d, 32, 32768, 128, g, t, lay) for g in GROUPS for t in Q_LENS for d in DISTRIBUTIONS]
    out += [Cell("paged64", d, 32, 32768, 128, g, t, "paged64") for g in (4, 8, 16) for t in (1, 4)
            for d in DISTRIBUTIONS]
    for sample, axis in (("S", ((32, 4096, 128), (32, 131072, 128))), ("B", ((8, 32768, 128), (128, 32768, 128))),
                         ("H", ((32, 32768, 64), (32, 32768, 256)))):
        for b, s, h in axis:
            for lay in ("contig", "paged16"):
                out += [Cell(sample, d, b, s, h, g, t, lay) for g in (4, 8) for t in (1, 4) for d in DISTRIBUTIONS]
    out += [Cell("corner", d, 128, 131072, 128, 8, 1, "contig") for d in DISTRIBUTIONS]
    for ch in MIXED:
        out += [mixed_cell("mixed", ch, 128, g, 1, lay) for g in (4, 8, 16) for lay in ("contig", "paged16", "paged64")]
        out += [mixed_cell("mixed", ch, 128, 1, 1, "contig")]
        out += [mixed_cell("mixed", ch, 128, 4, 4, lay) for lay in ("contig", "paged16")]
        out += [mixed_cell("mixed", ch, h, 8, 1, "contig") for h in (64, 256)]
    seen, unique = set(), []
    for c in out:
        if c.cell_id not in seen:
            seen.add(c.cell_id)
            unique.append(c)
    return unique


def cache_bytes(c: Cell, itemsize: int = 2) -> int:
    """K and V caches of the cell: 2 x B x S x K x H x itemsize (pages hold the same bytes)."""
    return 2 * c.B * c.S * K * c.H * itemsize


def pallas_applies(c: Cell) -> bool:
    """JAX's Pallas paged decode kernel is a peer on paged decode cells at T = 1 (its own page layout: a copy)."""
    return c.chunks is None and c.page is not None and c.T == 1


def xla_bytes(c: Cell) -> int:
    """The masked xla path's gathered float32 K and V per token (+ the contiguous copy of a paged cache)."""
    q_len, _ = c.lengths()
    tokens = int(q_len.sum()) + (MIXED_PAD if c.chunks else 0)
    return tokens * c.S * K * c.H * 4 * 2 + (cache_bytes(c) if c.page else 0)


def needed_bytes(c: Cell) -> int:
    """Device bytes the cell holds at its peak: the caches, one cache array's transient while it is drawn,
    and the Pallas peer's copy of the pages (the xla peer runs only where it fits beside these)."""
    return cache_bytes(c) * (3 if pallas_applies(c) else 2) // 2 + cache_bytes(c) // 2


def roofline_ms(c: Cell) -> float:
    """The roofline of the cell's valid work (``core.serving_cost``) in ms."""
    from attnlab.core.request_lengths import starts_of
    from attnlab.core.serving_cost import serving_roofline_s

    q_len, kv = c.lengths()
    return serving_roofline_s(starts_of(q_len), kv, c.N, K, c.H, 2, **roofline_peaks()) * 1e3


def paths_of(c: Cell) -> list[str]:
    """The paths a cell times: attnlab's serving call, then its peers (``grid_gpu`` says why one is absent)."""
    p = ["attnlab-serving"]
    if c.chunks is None:
        p += ["cudnn paged" if c.page else "cudnn (padded)"]
        if c.batch == "uniform":
            p += ["attnlab-decode (padded)"]     # today's uniform path: "uniform batches no slower than today"
    if pallas_applies(c):
        p += ["pallas-paged"]
    return p


def estimate_s(todo: list[Cell]) -> list[float]:
    """Rough device seconds of each cell run in this order: a new cache costs its drawing, a new compile
    group (everything but the lengths) ~1.5 s a path (+3 s for the prefill class), each cell's float64
    check ~S K H x 12 ns and its timing ~0.35 s a path plus 40 calls of the path (peers taken as 3x the
    roofline). Calibrated on run 2 of ``gpu.py`` (195 records, 12 compile groups, in 146 s)."""
    out, cache, group = [], None, None
    for c in todo:
        s = 0.0
        if (c.B, c.S, c.H, c.layout) != cache:
            cache = (c.B, c.S, c.H, c.layout)
            s += 1.0 + cache_bytes(c) / 50e9
        paths = paths_of(c)
        if (cache, c.G, c.T, c.chunks) != group:
            group = (cache, c.G, c.T, c.chunks)
            s += 1.5 * len(paths) + (3.0 if c.chunks else 0.0) + 0.5
        roof = roofline_ms(c)
        s += 0.35 * len(paths) + 40 * roof * (1 + 3 * (len(paths) - 1)) / 1e3 + c.S * K * c.H * 12e-9
        out.append(s)
    return out


def parse_part(text: str | None) -> tuple[int, int]:
    """``"N/M"`` -> (N, M) with 1 <= N <= M; None -> (1, 1); ValueError naming --part."""
    if text is None:
        return 1, 1
    try:
        n, m = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--part must be N/M (e.g. 2/3), got {text!r}") from None
    if not 1 <= n <= m:
        raise ValueError(f"--part N/M needs 1 <= N <= M, got {text!r}")
    return n, m


def part_of(todo: list[Cell], n: int, m: int) -> list[Cell]:
    """Part n of m: the cells in order, cut into m runs of about equal estimated seconds (whole cells)."""
    est = np.cumsum(estimate_s(todo))
    if not todo:
        return []
    edges = [0] + [int(np.searchsorted(est, est[-1] * i / m)) for i in range(1, m)] + [len(todo)]
    return todo[edges[n - 1]:edges[n]]


def read_records(paths) -> list[dict]:
    """The records of the JSONL files (missing files: none), in order; a line that is not JSON is skipped
    (a call killed mid-write leaves half a line)."""
    recs = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return recs


def done_ids(records, redo_errors: bool = False) -> set[str]:
    """Cell ids already measured (a skipped cell counts; an errored one only when not ``redo_errors``)."""
    return {r["cell_id"] for r in records if "cell_id" in r and not (redo_errors and r.get("status") == "error")}


def cells_left(todo: list[Cell], records, redo_errors: bool = False) -> list[Cell]:
    """The cells of ``todo`` that ``records`` do not hold yet (``done_ids``), in order: what a resumed call runs."""
    done = done_ids(records, redo_errors)
    return [c for c in todo if c.cell_id not in done]


def list_cells(path, n_parts):
    """OUT/cells.txt: every cell with its part, cache bytes, peak bytes, roofline and estimated seconds."""
    todo = cells()
    lines, totals = [], []
    for n in range(1, n_parts + 1):
        part = part_of(todo, n, n_parts)
        est = estimate_s(part)
        totals.append((n, len(part), sum(est), max(needed_bytes(c) for c in part)))
        lines += [f"{n}/{n_parts} {c.cell_id:<52} cache {cache_bytes(c) / 1e9:6.2f} GB  peak {needed_bytes(c) / 1e9:6.1f}"
                  f" GB  roofline {roofline_ms(c):8.4f} ms  ~{e:5.1f} s" for c, e in zip(part, est)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return [f"part {n}/{n_parts}: {k} cells, ~{s:.0f} s, peak {b / 1e9:.0f} GB" for n, k, s, b in totals]
