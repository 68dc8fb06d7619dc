"""A sweep is data: axes of values whose product is the cells to measure.

Axes: backend, batch, q_len, kv_len, heads, kv_heads, head_dim, dtype, causal, window, mode,
lengths (none: ``attention``; full/ragged: ``decode_attention`` of the q_len newest tokens against
an S-long cache, every sequence full or of ragged valid lengths; uniform, spread, lognormal, one-long or
file:PATH: a serving cell, ``serving_attention`` on B requests whose KV lengths are drawn from that
distribution, ``attnlab.core.request_lengths``, lengths traced; causal fwd cells only; ``DIST:pagedN``: in a
paged cache of N-token pages), prefill_chunks (none or
``NxSIZE``: N prefill chunks of SIZE tokens beside a serving cell's B decodes), inputs (the distribution q, k, v
are drawn from: a name of ``attnlab.reference.inputs.DISTRIBUTIONS``, default gaussian), soft_cap
(none or the logits' soft cap, e.g. 50), sinks (false, true or both: attention sinks, one standard
normal logit per query head, ``attnlab.reference.inputs.random_sinks``), packing (none or ``docs:N``: N documents
of random lengths packed in each row, as segment ids; self-attention cells only, q_len == kv_len) and kv_dtype
(none, or a quantized KV cache ``DTYPE[:LAYOUT]`` such as ``fp8``, ``int8:head``, ``e5m2:page``: forward
decode and serving cells only, ``attnlab.measure.kv_cells``; ``page`` on paged caches).
``seq`` ties q_len = kv_len (not with q_len/kv_len); ``tokens`` fixes batch * q_len (batch =
tokens // q_len; not with batch). ``window`` entries are ``none``, ``LEFT:RIGHT`` or an int ``W``,
which means ``(W, W)`` exactly as ``jax.nn.dot_product_attention`` reads an int
``local_window_size``: query t sees keys t - W ... t + W (2W + 1 keys); a causal sliding window of
W keys back is ``W:0``. On decode cells (``lengths``) the window is ``decode_attention``'s: around each
new token's absolute position in the cache (``W:0`` reads the last W + T keys); serving cells are causal, so
only LEFT counts.
Sweeps come from CLI flags (``from_flags``) or a TOML file (``load_toml``), their values parsed by
``sweep.parse``: every bad value raises ``SweepError`` naming it.
"""
from __future__ import annotations

import dataclasses
import itertools

from .. import backends
from ..core import strategies
from ..reference.inputs import DISTRIBUTIONS
from ..measure.cell import LENGTHS, MODES, Cell
from ..core.names import DTYPE_ALIASES, FLOAT_DTYPES, canonical_dtype, closest, dtype_choices, unknown
from ..core.segments import parse_packing
from ..core import request_lengths
from ..core import cell_fields
from .parse import AXIS_PARSERS, SweepError, _causal, _ints, _strs, _windows, load_toml, once, with_fp8_recipes  # noqa: F401


#: The widest window side a sweep takes (``attention`` caps a wider one at T + S: ``core.checks.within_reach``).
MAX_WINDOW = 2**30


class _SweepMethods:
    """A sweep: axes of values (``backends``, the problem's axes, ``mode``, then one axis per identity field of
    ``core.cell_fields`` that has one), ``tokens`` and ``name``; ``cells()`` is their product."""

    def __post_init__(self):
        self.validate()

    def validate(self):
        known = backends.variant_names()
        for i, b in enumerate(self.backends):
            if backends.canonical(b) is None:
                raise SweepError(unknown("backend", b, known, listed_by="`attnlab backends`"))
            self.backends[i] = backends.canonical(b)          # cuDNN -> cudnn
        if not self.backends:
            raise SweepError("no backend given")
        for axis in ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "devices"):
            vals = getattr(self, axis)
            if vals is None:
                continue
            if not vals:
                raise SweepError(f"{axis}: no values")
            for v in vals:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SweepError(f"{axis}: {v!r} is not a positive integer")
        self.dtype = [canonical_dtype(d) for d in self.dtype]    # bf16 -> bfloat16
        for d in self.dtype:
            if d not in FLOAT_DTYPES:
                guess = closest(str(d), FLOAT_DTYPES + tuple(DTYPE_ALIASES))
                raise SweepError(f"dtype: unknown dtype {d!r}; " + (f"did you mean {canonical_dtype(guess)!r}?" if guess
                                                                     else f"choose from {dtype_choices()}"))
        for m in self.mode:
            if m not in MODES:
                raise SweepError(f"mode: {m!r} is not one of {', '.join(MODES)}" + _did_you_mean(m, MODES))
        for st in self.strategy:
            if st is not None and st not in strategies.names():
                raise SweepError(f"strategy: {st!r} is not none or one of {', '.join(strategies.names())}")
        for i, ln in enumerate(self.lengths):
            if ln is not None and ln not in LENGTHS and not _page_size_of(ln) and not _serving(ln):
                raise SweepError(f"lengths: {ln!r} is not none, one of {', '.join(LENGTHS)}, pagedN (N tokens per "
                                 f"page, e.g. paged64; paged is paged{DEFAULT_PAGE_SIZE}), a request-length "
                                 f"distribution ({', '.join(request_lengths.DISTRIBUTIONS)}) or file:PATH, "
                                 f"either with :pagedN for a paged cache")
            if _serving(ln) and ln.startswith("file:"):   # pinned to the file's contents: other lengths, other cells
                dist, page = _serving_page(ln)
                try:
                    self.lengths[i] = request_lengths.pin_file(dist) + (f":paged{page}" if page else "")
                except (OSError, ValueError) as e:
                    raise SweepError(f"lengths: {ln}: {e}") from None
        for pc in self.prefill_chunks:
            try:
                request_lengths.parse_chunks(pc)
            except ValueError as e:
                raise SweepError(f"prefill_chunks: {e}") from None
        if any(_serving(ln) for ln in self.lengths) and True not in self.causal:
            raise SweepError("lengths: serving cells (uniform, spread, lognormal, one-long, file:PATH) are causal: "
                             "add causal true (--causal true)")
        if not self.inputs:
            raise SweepError("inputs: no values")
        for d in self.inputs:
            if d not in DISTRIBUTIONS:
                raise SweepError(f"inputs: {d!r} is not one of {', '.join(DISTRIBUTIONS)}" + _did_you_mean(d, DISTRIBUTIONS))
        for c in self.soft_cap:
            if c is not None and (isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < float("inf")):
                raise SweepError(f"soft_cap: {c!r} is not none or a positive number")
        for pk in self.packing:
            try:
                parse_packing(pk)
            except ValueError as e:
                raise SweepError(str(e)) from None
        for axis in ("causal", "sinks"):
            for c in getattr(self, axis):
                if not isinstance(c, bool):
                    raise SweepError(f"{axis}: {c!r} is not a bool")
        for w in self.window:
            if w is not None and (len(w) != 2 or any(not isinstance(x, int) or x < 0 for x in w)):
                raise SweepError(f"window: {w!r} is not (left, right) with non-negative ints")
            if w is not None and max(w) > MAX_WINDOW:   # a side near 2**31 overflows the int32 positions it is added to
                raise SweepError(f"window: {w[0]}:{w[1]}: each side must be at most 2**30 = {MAX_WINDOW}; a side of "
                                 f"q_len + kv_len or more already reaches every key (no limit)")
        if self.tokens is not None and (not isinstance(self.tokens, int) or self.tokens < 1):
            raise SweepError(f"tokens: {self.tokens!r} is not a positive integer")
        if self.tokens is not None and (short := [T for T in self.q_len if T > self.tokens]):
            raise SweepError(f"tokens: {self.tokens} is less than q_len {short[0]}: batch = tokens // q_len must be at "
                             f"least 1 (give tokens >= q_len)")
        for axis in ("backends", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window",
                     "mode", *(f.name for f in cell_fields.AXES)):   # as the cells read them: bf16 = bfloat16
            once(axis, getattr(self, axis) or ())
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), list) and not getattr(self, f.name):
                raise SweepError(f"{f.name}: no values (leave it out for its default)")
        left_out: dict[str, str] = {}
        cells = self.cells(left_out)
        if not cells:
            raise SweepError("no valid cell: every combination of the axes breaks a rule: " + "; ".join(
                f"{name}: {rule}" for name, rule in left_out.items()))
        if big := next((c for c in cells if _requests(c) * max(c.q_len, c.kv_len) > MAX_TOKENS), None):
            what = "batch" if _requests(big) == big.batch else "requests (batch + prefill chunks)"
            raise SweepError(f"{what} x sequence: {_requests(big)} x {max(big.q_len, big.kv_len)} tokens is more than "
                             f"2**28 = {MAX_TOKENS} (no device holds such a cell, and estimating it would exhaust this "
                             f"host)")

    def left_out_notes(self) -> list[str]:
        """A note per rule that leaves some of the axes' combinations out (the others run: ``cells``)."""
        left: dict[str, str] = {}
        self.cells(left)
        return [f"combinations left out ({name}): {rule}" for name, rule in left.items()]

    def cells(self, left_out: dict | None = None) -> list[Cell]:
        """The sweep's cells, its axes' product less the combinations a rule leaves out (``left_out``, when given,
        gains each such rule's field name -> the rule in words)."""
        left_out = {} if left_out is None else left_out
        out = []
        kv_lens = self.kv_len or [None]
        kv_heads = self.kv_heads or [None]
        for (T, S, N, K, H, dt, c, w, m, *values) in itertools.product(
                self.q_len, kv_lens, self.heads, kv_heads, self.head_dim, self.dtype, self.causal, self.window, self.mode,
                *(getattr(self, f.name) for f in cell_fields.AXES)):
            S = T if S is None else S
            K = N if K is None else K
            if N % K:
                left_out["heads"] = "heads must be a multiple of kv_heads"
                continue
            a = dict(zip((f.name for f in cell_fields.AXES), values))
            serving, page = _serving_page(a["lengths"])
            page = page if serving else _page_size_of(a["lengths"]) if a["lengths"] is not None else None
            a.update(q_len=T, kv_len=S, causal=c, window=w, mode=m, serving=serving, page_size=page)
            if broken := next((f for f in cell_fields.CELL_FIELDS if f.skip and f.skip(a)), None):   # each field's rules
                left_out[broken.name] = broken.rule
                continue
            kw = {f.name: a[f.name] for f in cell_fields.AXES}
            kw.update(lengths=serving or ("paged" if page else kw["lengths"]), page_size=page,
                      **dict(zip(("kv_dtype", "kv_scale"), kw["kv_dtype"] or (None, None))))
            batches = [self.tokens // T] if self.tokens else self.batch   # >= 1: validate
            for B in batches:
                for b in self.backends:
                    out.append(Cell(b, B, T, S, N, K, H, dt, c, tuple(w) if w else None, m, **kw))
        return out


#: The most tokens (requests x the longer of q_len and kv_len) a sweep's cell may hold.
MAX_TOKENS = 2**28


def _requests(cell) -> int:
    """A cell's sequences: its batch, and a mixed serving cell's prefill chunks beside them."""
    return cell.batch + (request_lengths.parse_chunks(cell.prefill_chunks) or (0, 0))[0]


def _values(values):
    return dataclasses.field(default_factory=lambda: list(values))


#: ``Sweep(backends, batch=[...], ...)``: a dataclass of the problem's axes and one axis per identity field
#: (``core.cell_fields``: devices, strategy, lengths, inputs, soft_cap, packing, sinks, kv_dtype, prefill_chunks).
Sweep = dataclasses.make_dataclass("Sweep", [
    ("backends", list[str]),
    ("batch", list[int], _values([1])),
    ("q_len", list[int], _values([128])),
    ("kv_len", list[int] | None, None),          # None: tied to q_len (the ``seq`` axis)
    ("heads", list[int], _values([8])),
    ("kv_heads", list[int] | None, None),        # None: same as heads (MHA)
    ("head_dim", list[int], _values([64])),
    ("dtype", list[str], _values(["bfloat16"])),
    ("causal", list[bool], _values([False])),
    ("window", list[tuple[int, int] | None], _values([None])),
    ("mode", list[str], _values(["fwd"])),
    *((f.name, list, _values([f.default])) for f in cell_fields.CELL_FIELDS if f.axis),   # kv_dtype: (dtype, layout)
    ("tokens", int | None, None),
    ("name", str, "sweep"),
], bases=(_SweepMethods,), namespace={"__doc__": _SweepMethods.__doc__, "__module__": __name__})


def _did_you_mean(name, choices) -> str:
    guess = closest(str(name), choices)
    return f"; did you mean {guess!r}?" if guess else ""


DEFAULT_PAGE_SIZE = 16


def _serving(lengths) -> bool:
    """A serving cell's lengths: a request-length distribution (``attnlab.core.request_lengths``), or one
    with ``:pagedN`` (a paged cache of N-token pages)."""
    return _serving_page(lengths)[0] is not None


def _serving_page(lengths) -> tuple[str | None, int | None]:
    """(distribution, page size or None) of a serving lengths value ``DIST`` or ``DIST:pagedN``; else (None, None)."""
    if not isinstance(lengths, str):
        return None, None
    base, sep, tail = lengths.rpartition(":paged")
    if sep and tail.isdigit() and int(tail) > 0 and request_lengths.is_distribution(base):
        return base, int(tail)
    return (lengths, None) if request_lengths.is_distribution(lengths) else (None, None)


def _page_size_of(lengths: str) -> int | None:
    """The page size of a ``paged`` / ``pagedN`` lengths value (decode cells on a paged cache), else None."""
    if lengths == "paged":
        return DEFAULT_PAGE_SIZE
    if lengths.startswith("paged") and lengths[5:].isdigit() and int(lengths[5:]) > 0:
        return int(lengths[5:])
    return None


def build(values: dict) -> Sweep:
    """A Sweep from loosely typed values (CLI strings or TOML values); keys as in the TOML file."""
    known = {"backends", "backend", "batch", "seq", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype",
             "causal", "window", "mode", "tokens", "name", "fp8_recipe", *(f.name for f in cell_fields.AXES)}
    unknown = set(values) - known
    if unknown:
        raise SweepError(f"unknown sweep key(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    kw: dict = {}
    be = values.get("backends", values.get("backend"))
    if be is None:
        raise SweepError("backends: none given")
    kw["backends"] = _strs(be)
    if values.get("fp8_recipe") is not None:
        kw["backends"] = with_fp8_recipes(kw["backends"], _strs(values["fp8_recipe"]))
    for axis in ("batch", "heads", "kv_heads", "head_dim", "q_len", "kv_len"):
        if values.get(axis) is not None:
            kw[axis] = _ints(axis, values[axis])
    if values.get("seq") is not None:
        if values.get("q_len") is not None or values.get("kv_len") is not None:
            raise SweepError("seq sets q_len = kv_len: give either seq or q_len/kv_len")
        kw["q_len"] = _ints("seq", values["seq"])
    if values.get("dtype") is not None:
        kw["dtype"] = _strs(values["dtype"])
    if values.get("mode") is not None:
        kw["mode"] = _strs(values["mode"])
    if values.get("causal") is not None:
        kw["causal"] = _causal(values["causal"])
    if values.get("window") is not None:
        kw["window"] = _windows(values["window"])
    for f in cell_fields.AXES:
        if values.get(f.name) is not None:
            kw[f.name] = AXIS_PARSERS[f.axis](f.name, values[f.name])
    if values.get("tokens") is not None:
        if values.get("batch") is not None:
            raise SweepError("tokens sets batch = tokens // q_len: give either tokens or batch")
        tok = _ints("tokens", values["tokens"])
        if len(tok) != 1:
            raise SweepError(f"tokens: one value, got {len(tok)} ({values['tokens']!r})")
        kw["tokens"] = tok[0]
    if values.get("name") is not None:
        kw["name"] = str(values["name"])
    return Sweep(**kw)

