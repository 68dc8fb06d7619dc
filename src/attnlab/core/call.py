"""One attention call: its ``Problem``, its options and, once checked, its arrays (``Call``).

Every entry point describes its call with this one type, and every backend hook takes it:

- ``attention``: ``kind="attention"``, built by ``attnlab.core.prepare.prepare`` (query (B, T, N, H), key and
  value (B, S, K, H), bias/mask (., ., ., .), lengths (B,), segment ids (B, T)/(B, S));
- ``decode_attention``: ``kind="decode"``, built by ``attnlab.api.decode.prepare_decode`` (query the new tokens
  (B, T, N, H), key/value the caches (B, S_max, K, H) or pages, ``kv_lengths`` (B,), ``page_table``);
- ``serving_attention``: ``kind="serving"``, built by ``attnlab.api.serving.prepare_serving`` (query the packed
  tokens (T_total, N, H), ``q_starts`` (B+1,), the caches as decode's, ``plan``).

The static facts (problem, scale, soft cap, sinks, ...) say whether a backend can run the call
(``Backend.why_not``, ``why_not_decode``, ``supports_serving``); the arrays are what ``run``, ``run_decode`` and
``run_serving`` compute on. A call without arrays is a static description (``Call(problem, soft_cap=50.0)``,
what the sweeps and tests ask backends about). The problem's fields read as attributes (``call.heads``);
``problem`` is None for an empty call (B, T, S or N = 0: no kernel runs). Paging and a quantized cache are the
problem's (``page_size``, ``kv_dtype``, ``kv_scale``). Equality and hashing see the static facts only.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .problem import Problem

KINDS = ("attention", "decode", "serving")


def _array():
    return dataclasses.field(default=None, compare=False, repr=False)


class ProblemFields:
    """The problem's sizes read as the holder's own (``x.heads`` is ``x.problem.heads``): a ``Call``'s and a sweep's
    ``Cell``'s."""

    batch = property(lambda self: self.problem.batch)
    q_len = property(lambda self: self.problem.q_len)
    kv_len = property(lambda self: self.problem.kv_len)
    heads = property(lambda self: self.problem.heads)
    kv_heads = property(lambda self: self.problem.kv_heads)
    head_dim = property(lambda self: self.problem.head_dim)
    dtype = property(lambda self: self.problem.dtype)
    causal = property(lambda self: self.problem.causal)
    window = property(lambda self: self.problem.window)


@dataclasses.dataclass(frozen=True)
class Call(ProblemFields):
    """One attention call (module docstring). ``scale``: the logits' scale the call runs with (a float, a
    tracer when traced; None in a static description: 1 / sqrt(H))."""

    problem: Problem | None
    scale: Any = dataclasses.field(default=None, compare=False)
    kind: str = "attention"
    scale_is_static: bool = True    # False: the scale is traced (a kernel that needs a Python float refuses)
    return_residual: bool = False   # also return the (B, T, N) logsumexp, as jax.nn's return_residual
    soft_cap: float | None = None   # logits_soft_cap: logits -> cap * tanh(logits / cap) before masking
    has_sinks: bool = False         # sinks given: one extra logit per query head in the softmax denominator
    bias_shape: tuple[int, ...] | None = None
    mask_shape: tuple[int, ...] | None = None
    has_q_lengths: bool = False
    has_kv_lengths: bool = False
    has_segment_ids: bool = False   # query_segment_ids / key_value_segment_ids given (packed rows)
    #: with concrete segment ids: the most segments in a row (query or key side) and whether every row's
    #: segments are contiguous; None when the ids are traced (unknown until run)
    max_segments: int | None = None
    segments_contiguous: bool | None = None
    # --- the arrays (None in a static description) ---------------------------------------------------
    query: Any = _array()
    key: Any = _array()             # decode/serving: the key cache (contiguous, or pages with page_table)
    value: Any = _array()
    bias: Any = _array()
    mask: Any = _array()
    q_lengths: Any = _array()       # (B,) int32 or None
    kv_lengths: Any = _array()      # (B,) int32 or None (decode/serving: always given)
    q_segment_ids: Any = _array()   # (B, T) ints or None
    kv_segment_ids: Any = _array()  # (B, S) ints or None
    sinks: Any = _array()           # (N,) float logits or None
    page_table: Any = _array()      # (B, pages_per_seq) int32 for a paged cache
    k_scale: Any = _array()         # float32 scales of a quantized cache (``core.kv_quant``) or None
    v_scale: Any = _array()
    q_starts: Any = _array()        # serving: (B+1,) int32 starts of each request's packed tokens
    plan: Any = _array()            # serving: a ``ServingPlan`` or None
    out_shape: tuple[int, ...] | None = dataclasses.field(default=None, compare=False)   # attention: query's shape

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.problem is not None and not isinstance(self.problem, Problem):
            raise TypeError(f"problem must be an attnlab Problem or None, got {type(self.problem).__name__}")

    # --- the problem's fields (besides ``ProblemFields``') -----------------------------------------------
    groups = property(lambda self: self.problem.groups)
    page_size = property(lambda self: self.problem.page_size)
    kv_dtype = property(lambda self: self.problem.kv_dtype)
    kv_scale = property(lambda self: self.problem.kv_scale)
    is_causal = ProblemFields.causal    # attention's argument name
    max_len = ProblemFields.kv_len      # decode's name for the cache capacity S_max

    # --- the cache calls' names of the arrays ----------------------------------------------------------
    q = property(lambda self: self.query)
    k_cache = property(lambda self: self.key)
    v_cache = property(lambda self: self.value)

    @property
    def empty(self) -> bool:
        """B, T, S or N is 0: jax.nn's answer needs no kernel (zeros; an lse of -inf where S = 0)."""
        return self.problem is None

    @property
    def spec(self) -> "Call | None":
        """The call itself, None when empty (the name backends read the static facts by before the merge)."""
        return None if self.problem is None else self

    @property
    def needs_mask(self) -> bool:
        """A decode call on the generic path needs a dense mask (the causal tail of T > 1 tokens, or a window)."""
        return self.causal and self.q_len > 1 or self.window is not None

    def as_attention(self) -> "Call":
        """The ``attention()`` call (static) a decode call is expressed as on the generic backends
        (``backends.masked_decode``): decode's bottom-right causal rule and window become the mask."""
        mask = (self.batch, 1, self.q_len, self.max_len) if self.needs_mask else None
        plain = dataclasses.replace(self.problem, causal=False, window=None, kv_dtype=None, kv_scale=None, page_size=None)
        return Call(plain, self.scale,
                    scale_is_static=self.scale_is_static, mask_shape=mask, has_kv_lengths=True,
                    soft_cap=self.soft_cap, has_sinks=self.has_sinks)
