"""The serving kernel's plan: a serving call's lengths -> balanced, fixed-size work lists (stream-K).

Units, blocks, pieces
    The rows of request b for one KV head are its q_len[b] tokens x G query heads, row r = t*G + g (GQA
    packing, as ``kernels.decode``). They are cut into query tiles of ``block_r`` rows; a *unit* is (request,
    query tile). A unit needs the KV blocks (``block_k`` keys each) up to the position of its last token
    (causal): ``(kv_len - q_len + t_last) // block_k + 1`` blocks. Laid end to end, the units' blocks form one
    sequence of ``total`` blocks (the same for every KV head). A unit's blocks start at its ``kv_start`` key (its
    pieces' ``first_block`` counts from there): 0 without a window; with a sliding window (``window_left`` =
    left) the first key any of its rows sees, its first row's window start ``max(0, q_pos of its first token -
    left)`` (later rows start later), so only the window's keys are laid end to end and balanced. Where a block
    must lie in one page (a paged cache with pages of >= block_k keys, ``page_size``) at that key's block start
    instead, as ``decode.window_base``: a 128-key window at T=4 in blocks of 128 is 2 blocks from its first key,
    2-3 from the block boundary before it.
    ``programs`` programs per KV head each take an equal run of ``chunk = ceil(total / programs)`` blocks of it
    (LeanAttention's stream-K), so every program does the same work, a long request is spread over many
    programs and a short one sits inside one. Where a program's run crosses a unit boundary it is cut: a *piece*
    is (unit, first block, block count), at most ``units + programs`` of them (those of no block sit after every
    program's run). Each piece writes a partial (O, m, l); the kernel's merge combines a row's partials by
    log-sum-exp. With ``piece_blocks`` (``ServingConfig``) a decode unit also weighs that many blocks: a program
    starting more pieces gets fewer blocks.

Tile classes
    Requests with q_len <= ``decode_max_q`` form the decode class (tiles of ``block_r_decode`` rows, 16..128,
    16..64 at H > 128: bandwidth-bound), the others the prefill class (``block_r_prefill`` = 128 rows at H <= 128:
    compute-bound); each class is its own launch with its own balanced list. A class that cannot occur
    (``max_q_len``, a static bound) is not launched.

Static sizes, traced values
    Every array has a length fixed by the shapes (T_total, B) and the config: one function body (``_pieces(xp,
    ...)``) with ``jax.numpy`` inside ``jit`` from traced lengths (no-op pieces past the end: count 0), with NumPy
    on the host. ``ServingPlan`` is a pytree (arrays leaves, sizes static): make it once per step, pass it to every
    layer. A host plan without ``ServingConfig.max_q_len`` is sized to its longest request (decode tile, units,
    prefill class or not), so a jitted step compiles per size; with it, a traced plan's sizes (``prefill_slots``
    aside: a host plan launches no prefill class its slots leave empty).
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from .decode_plan import default_block_k, kv_products, next_pow2
from .decode_resources import programs_per_sm, sm_count
from .decode_splits import cdiv
from .serving_slots import take_slots

#: A row of ``ClassPlan.pieces`` (``kv_start``: the key its unit's blocks count from; first_block, blocks: its run)
FIELDS = ("request", "q_start", "row_offset", "rows", "q_pos0", "kv_len", "kv_start", "first_block", "blocks")
#: Fields of one unit, in the order of a row of ``ClassPlan.units`` (its pieces: first_piece .. end_piece-1).
UNIT_FIELDS = ("q_start", "row_offset", "rows", "first_piece", "end_piece")
DECODE_MAX_Q = 16
MIN_CHUNK = 2        # blocks: a program's run is never shorter (tiny batches: fewer, longer programs)


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """Tuning parameters; None means the default for the shape (module docstring)."""

    block_k: int | None = None               # both classes, unless block_k_prefill is given
    block_k_prefill: int | None = None
    block_r_decode: int | None = None
    block_r_prefill: int | None = None
    decode_max_q: int = DECODE_MAX_Q
    #: q_len the decode tile is sized for (rows = G x this); None: ``max_q_len`` (capped at ``decode_max_q``), else
    #: the longest decode request when the lengths are concrete, else 1
    decode_q_len: int | None = None
    #: a static upper bound on every q_len (the caller's promise, e.g. the speculative depth; concrete lengths past it
    #: are refused); with max_q_len <= decode_max_q no prefill launch is made. It sizes a host plan as a traced one
    max_q_len: int | None = None
    programs: int | None = None      # per KV head and class; None: SMs x programs per SM / K
    num_warps: int | None = None
    num_stages: int | None = None
    num_warps_prefill: int | None = None     # the prefill class's own (None: as above)
    num_stages_prefill: int | None = None    # the prefill class's own (None: as above)
    #: a quantized cache's products (``decode_plan.kv_products``, as ``DecodeConfig.kv_mma``): "float16", "q"
    #: (q's dtype) or None: float16 for an FP8 cache and a bfloat16 q, q's dtype otherwise
    kv_mma: str | None = None
    #: False: a window's units start at the block boundary before their first key, as for pages of >= block_k
    #: keys (the layout before the first-key start, kept to time against it)
    window_from_key: bool = True
    #: what starting a piece weighs in the decode class's balance, in KV blocks (a unit weighs its blocks plus this). 0
    #: until measured: where one program runs per SM nothing hides a piece's q gather, pipeline fill and partial store
    #: (H200 fit: ~5.8 us a piece, 1.4 us a block at 128 rows, results/cpu-2026-12-05-serving-sass): ~4 may help there
    piece_blocks: int = 0
    #: where a unit's pieces are merged (``kernels.serving_merge``): "fused" (the piece that finishes a unit last merges
    #: it; a one-piece unit stores its rows: one launch per class) or "kernel" (a merge kernel per class after its pieces
    #: kernel). "fused": 1.04-1.17x on one-long batches, else 0.99-1.08x, H100 (results/gpu-2026-12-05d-h100-merge-direct)
    merge: str = "fused"
    #: P > 0: up to P requests with decode_max_q < q_len <= ``prefill_chunk`` run on the Mosaic GPU kernel
    #: (``kernels.serving_prefill_mgpu``) instead of the prefill class; 0: none
    prefill_slots: int = 0
    prefill_chunk: int | None = None
    #: n > 0: the slots run on CUDA stream n (XLA's stream annotation), beside the Triton classes; 0: before them
    prefill_stream: int = 0
    #: True: an FP8 cache with float16 products is read as int16 pairs along H, split in registers, as ``DecodeConfig.
    #: kv_pairs`` (``kernels.kv_dequant``; per call by the cache's dtype): decode 1.10-1.27x, H200 (gpu-2026-12-06c-fp8-pairs)
    kv_pairs: bool = True
    #: the decode class's blocks every row sees whole run unmasked as the prefill's (``DecodeConfig.whole_blocks``)
    whole_blocks: bool = False


@dataclasses.dataclass(frozen=True)
class ClassPlan:
    """One tile class's work list: ``pieces`` (num_pieces, 9) int32 (``FIELDS``), ``starts``
    (programs + 1,) int32: program p runs pieces starts[p] .. starts[p+1]-1, ``units``
    (num_units, 5) int32 (``UNIT_FIELDS``): the merge combines each unit's pieces, and ``piece_units``
    (num_pieces,) int32: each piece's unit (a piece of no block: any)."""

    pieces: object
    starts: object
    units: object
    piece_units: object
    block_r: int = dataclasses.field(metadata=dict(static=True))
    block_k: int = dataclasses.field(metadata=dict(static=True))
    programs: int = dataclasses.field(metadata=dict(static=True))
    num_warps: int = dataclasses.field(metadata=dict(static=True))
    num_stages: int = dataclasses.field(metadata=dict(static=True))
    decode: bool = dataclasses.field(metadata=dict(static=True))
    whole_blocks: bool = dataclasses.field(default=True, metadata=dict(static=True))   # prefill: always
    #: a window's units start at their first key: contiguous caches and pages of < block_k keys only (``page_mismatch``)
    window_from_key: bool = dataclasses.field(default=False, metadata=dict(static=True))


@dataclasses.dataclass(frozen=True)
class ServingPlan:
    """The plan of one step: its tile classes, the sizes, window and ``lengths`` (q_starts, kv_lengths) int32 it was
    made for (checked on reuse), the products of a quantized cache (``ServingConfig.kv_mma``, ``kv_pairs``: resolved
    per call by the cache's dtype) and where the pieces are merged (``ServingConfig.merge``)."""

    classes: tuple
    lengths: tuple
    sizes: tuple = dataclasses.field(metadata=dict(static=True))    # (T_total, B, N, K, H)
    kv_len_max: int = dataclasses.field(metadata=dict(static=True))    # S_max: every length is clamped to it
    window_left: int | None = dataclasses.field(default=None, metadata=dict(static=True))   # None: no window
    kv_mma: str | None = dataclasses.field(default=None, metadata=dict(static=True))
    merge: str = dataclasses.field(default="fused", metadata=dict(static=True))
    kv_pairs: bool = dataclasses.field(default=False, metadata=dict(static=True))
    #: the requests run on the Mosaic GPU prefill (``serving_prefill_mgpu.PrefillSlots``), or None
    prefill: object = None


for _cls, _data in ((ClassPlan, ["pieces", "starts", "units", "piece_units"]), (ServingPlan, ["classes", "lengths", "prefill"])):
    jax.tree_util.register_dataclass(_cls, data_fields=_data,
                                     meta_fields=[f.name for f in dataclasses.fields(_cls) if f.name not in _data])


def _searchsorted(xp, a, v, side, method="compare_all"):
    if xp is np:
        return np.searchsorted(a, v, side=side).astype(np.int32)
    return xp.searchsorted(a, v, side=side, method=method).astype(xp.int32)


def _pieces(xp, q_starts, kv_lengths, *, in_class, groups: int, block_r: int, block_k: int, kv_len_max: int,
            num_units: int, programs: int, window_left: int | None = None, from_key: bool = True,
            piece_blocks: int = 0):
    """(pieces (num_units + programs, 9), starts (programs + 1,), units (num_units, 5), the pieces' units) of one class;
    ``xp`` numpy or jax.numpy. ``from_key``: a window's units start at their first key, else at its block.

    ``in_class`` (B,) bool: the requests of this class. Lengths are clamped into the shapes' bounds
    (under jit they are unchecked), so no piece ever addresses past the arrays."""
    i32 = xp.int32
    starts = xp.asarray(q_starts).astype(i32)
    q_len = xp.maximum(starts[1:] - starts[:-1], 0)
    kv = xp.clip(xp.asarray(kv_lengths).astype(i32), 0, kv_len_max)
    rows = q_len * groups
    tiles = xp.where(in_class, (rows + block_r - 1) // block_r, 0)
    tile_end = xp.cumsum(tiles).astype(i32)                          # units of requests <= b
    u = xp.arange(num_units, dtype=i32)
    b = xp.minimum(_searchsorted(xp, tile_end, u, "right"), q_len.shape[0] - 1)
    row_off = (u - (tile_end[b] - tiles[b])) * block_r
    unit_ok = u < tile_end[-1]
    q_pos0 = kv[b] - q_len[b]
    t_last = (xp.minimum(row_off + block_r, rows[b]) - 1) // groups
    end = xp.clip(q_pos0 + t_last + 1, 0, kv_len_max)             # past the unit's last visible key
    # the unit's first key: its first row's window start (none: 0), or that key's block
    lo = xp.zeros_like(end) if window_left is None else xp.maximum(q_pos0 + row_off // groups - window_left, 0)
    lo = xp.minimum(lo if from_key else lo // block_k * block_k, end)
    nb = xp.where(unit_ok, (end - lo + block_k - 1) // block_k, 0).astype(i32)
    unit_end = xp.cumsum(nb).astype(i32)
    total = unit_end[-1]
    # balanced in weight: a unit weighs its blocks plus ``piece_blocks`` (what starting a piece costs, in blocks);
    # a program's start is cut in weight, then moved to the blocks (inside a unit's piece weight: its first block)
    w = xp.where(nb > 0, nb + piece_blocks, 0).astype(i32)
    w_end = xp.cumsum(w).astype(i32)
    chunk = xp.maximum((w_end[-1] + programs - 1) // programs, MIN_CHUNK)
    x = xp.minimum(xp.arange(programs, dtype=i32) * chunk, w_end[-1])
    xu = xp.minimum(_searchsorted(xp, w_end, x, "right"), num_units - 1)
    into = xp.clip(x - (w_end[xu] - w[xu]) - piece_blocks, 0, nb[xu])
    prog_start = xp.where(x >= w_end[-1], total, unit_end[xu] - nb[xu] + into).astype(i32)
    bounds = xp.sort(xp.concatenate([unit_end - nb, prog_start]))    # every piece starts at one
    bounds = xp.minimum(bounds, total)
    ends = xp.concatenate([bounds[1:], total[None]])
    pu = xp.minimum(_searchsorted(xp, unit_end, bounds, "right"), num_units - 1)
    pb = b[pu]
    blocks = ends - bounds
    unit_rows = xp.where(unit_ok, xp.minimum(rows[b] - row_off, block_r), 0)
    first_block = bounds - (unit_end[pu] - nb[pu])
    fields = (pb, starts[pb], row_off[pu], unit_rows[pu], q_pos0[pu], kv[pb], lo[pu], first_block, blocks)
    # pieces of no block (a program's start on a unit's start, units past the last) go last, in no run and no
    # unit: each would cost a q gather, a partial's store and a merge trip (``live``: the others' bounds, sorted)
    order = xp.argsort(blocks == 0, stable=True)
    pieces = xp.stack([xp.asarray(f).astype(i32) for f in fields], axis=1)[order]
    live = xp.where(blocks > 0, bounds, total + 2)[order]
    prog_first = _searchsorted(xp, live, xp.concatenate([prog_start, total[None] + 1]), "left")
    # a unit's pieces: those starting in [its first block, its end)
    first_piece = _searchsorted(xp, live, unit_end - nb, "left")
    unit_fields = (starts[b], row_off, unit_rows, first_piece, _searchsorted(xp, live, unit_end, "left"))
    units = xp.stack([xp.asarray(f).astype(i32) for f in unit_fields], axis=1)
    return pieces, prog_first.astype(i32), units, pu[order].astype(i32)


def num_units(total_tokens: int, batch: int, groups: int, block_r: int, max_q: int) -> int:
    """A static bound on a class's units: sum_b ceil(q_len[b] G / block_r) over requests of q_len <= max_q."""
    return max(1, min(cdiv(total_tokens * groups, block_r) + batch, batch * cdiv(max_q * groups, block_r)))


def make_serving_plan(q_starts, kv_lengths, *, total_tokens: int, kv_len_max: int, heads: int, kv_heads: int,
                      head_dim: int, dtype="bfloat16", config: ServingConfig | None = None,
                      sms: int | None = None, window_left: int | None = None,
                      page_size: int | None = None) -> ServingPlan:
    """The plan of a serving call (module docstring): jax.numpy when a length array is traced, else NumPy.

    ``total_tokens`` T_total (q's first dimension), ``kv_len_max`` S_max, ``window_left`` the left size of
    the call's sliding window (None: no window), ``page_size`` the cache's (None: contiguous): with a window,
    pages of >= block_k keys start each unit at its first key's block (``window_from_key``)."""
    cfg = config or ServingConfig()
    kv_products(cfg.kv_mma, None)       # its rule checked here; resolved per call by the cache's dtype
    if not isinstance(cfg.piece_blocks, int) or cfg.piece_blocks < 0:
        raise ValueError(f"ServingConfig.piece_blocks must be an int >= 0, got {cfg.piece_blocks!r}")
    if cfg.merge not in ("kernel", "fused"):
        raise ValueError(f"ServingConfig.merge must be 'kernel' or 'fused', got {cfg.merge!r}")
    traced = any(isinstance(x, jax.core.Tracer) for x in (q_starts, kv_lengths))
    xp = jax.numpy if traced else np
    B = int(np.shape(kv_lengths)[0])
    G = heads // kv_heads
    cap_k = max(16, next_pow2(kv_len_max))
    max_q = max(1, min(cfg.max_q_len or total_tokens, total_tokens))
    q_len = None if traced else np.diff(np.asarray(q_starts).astype(np.int64))
    if q_len is not None and cfg.max_q_len and q_len.max(initial=1) > cfg.max_q_len:
        raise ValueError(f"ServingConfig.max_q_len={cfg.max_q_len} is below request {int(q_len.argmax())}'s "
                         f"{int(q_len.max())} new tokens (a static bound every request keeps)")
    sized = q_len is not None and not cfg.max_q_len     # a host plan with no static bound: sized to its lengths
    max_q = max(1, min(max_q, int(q_len.max(initial=1)))) if sized else max_q
    dec_q = cfg.decode_q_len or (int(q_len[q_len <= cfg.decode_max_q].max(initial=1)) if sized
                                 else min(cfg.max_q_len or 1, cfg.decode_max_q))
    itemsize = np.dtype(dtype).itemsize
    q_len_x = (np.diff(np.asarray(q_starts).astype(np.int32)) if xp is np
               else jax.numpy.diff(jax.numpy.asarray(q_starts).astype(jax.numpy.int32)))
    prefill, taken = take_slots(xp, q_len_x, kv_lengths, q_starts, cfg, max_q)
    classes = []
    for decode in (True, False):
        if decode and max_q < 1 or not decode and max_q <= cfg.decode_max_q:
            continue
        block_k = min(cap_k, (None if decode else cfg.block_k_prefill) or cfg.block_k or default_block_k(head_dim))
        if decode:
            # one tile holds all of a request's rows up to 128 (64 at H > 128, for registers): a second tile would
            # read the request's keys again (G=16 T=8: 1.9x faster at 128 rows, results/gpu-2026-12-05b-serving-wide-rows)
            br = cfg.block_r_decode or min(64 if head_dim > 128 else 128, next_pow2(max(16, G * dec_q)))
        else:
            br = cfg.block_r_prefill or (64 if head_dim > 128 else 128)
        warps = (None if decode else cfg.num_warps_prefill) or cfg.num_warps or (
            8 if br * (head_dim + block_k) > 12288 else 4)
        stages = (None if decode else cfg.num_stages_prefill) or cfg.num_stages or 3
        # at most 2 resident programs per SM: every program must be resident at once (stream-K gives each
        # the same work, so a second wave would double the time); ptxas gave the paged r16 tile 204
        # registers (2 per SM) where the estimate says 3 (benchmarks/serving/ttir_cpu.py)
        occ = min(2, programs_per_sm(br, block_k, head_dim, warps, stages, itemsize))
        programs = cfg.programs or max(1, (sms or sm_count()) * occ // kv_heads)
        top = min(max_q, cfg.decode_max_q) if decode else max_q
        units = num_units(total_tokens, B, G, br, top)
        in_class = (q_len_x <= cfg.decode_max_q) if decode else (q_len_x > cfg.decode_max_q)
        if not decode and taken is not None:      # the Mosaic GPU prefill's requests
            in_class = in_class & ~taken
            if xp is np and not in_class.any():   # every one in a slot: no launch
                continue
        from_key = cfg.window_from_key and (page_size is None or page_size < block_k)
        pieces, starts, unit_list, piece_units = _pieces(xp, q_starts, kv_lengths, in_class=in_class, groups=G, block_r=br,
                                            block_k=block_k, kv_len_max=kv_len_max, num_units=units, programs=programs,
                                            window_left=window_left, from_key=from_key,
                                            piece_blocks=cfg.piece_blocks if decode else 0)
        classes.append(ClassPlan(pieces, starts, unit_list, piece_units, block_r=br, block_k=block_k, programs=programs,
                                 num_warps=warps, num_stages=stages, decode=decode,
                                 whole_blocks=bool(cfg.whole_blocks) or not decode,
                                 window_from_key=window_left is not None and from_key))
    return ServingPlan(tuple(classes), tuple(xp.asarray(x).astype(xp.int32) for x in (q_starts, kv_lengths)),
                       sizes=(total_tokens, B, heads, kv_heads, head_dim), kv_len_max=int(kv_len_max), kv_mma=cfg.kv_mma,
                       merge=cfg.merge, window_left=None if window_left is None else int(window_left), prefill=prefill,
                       kv_pairs=bool(cfg.kv_pairs))


def page_mismatch(plan: ServingPlan, page_size: int | None) -> str | None:
    """Why ``plan`` cannot run on pages of ``page_size`` keys (None: contiguous), or None: a class whose windows start
    at their first key loads blocks that may cross a page boundary, which pages of >= block_k keys load as one."""
    for cp in plan.classes:
        if cp.window_from_key and page_size is not None and page_size >= cp.block_k:
            return (f"plan starts its windows at their first key (made for a contiguous cache or pages of < "
                    f"{cp.block_k} keys), this call's pages hold {page_size}: pass page_size={page_size} to serving_plan")
    return None
