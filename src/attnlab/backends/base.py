"""What every attention backend is: a name, an availability check, a capability check, a call."""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax.numpy as jnp

from ..core import segments
from ..core.call import Call
from ..core.errors import UnsupportedError
from . import _optional
from .masked_decode import masked_decode


def query_keep(p: Call):
    """(B, T) bool: the query rows that are not padding (t < query_seq_lengths[b], segment id >= 0),
    or None when every row is kept. An empty call's too (its sizes read off the query)."""
    keep = None
    if p.q_lengths is not None:
        keep = jnp.arange(p.query.shape[1])[None, :] < jnp.asarray(p.q_lengths, jnp.int32)[:, None]
    if p.q_segment_ids is not None:
        seg = jnp.asarray(p.q_segment_ids) >= 0
        keep = seg if keep is None else keep & seg
    return keep


def zero_padded_queries(out, p: Call):
    """jax.nn's rule: output rows t >= query_seq_lengths[b] are 0; so are rows of padding segment ids
    (< 0). ``out`` is (B, T, N, H)."""
    keep = query_keep(p)
    if keep is None:
        return out

    return jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)


def segments_as_mask(p: Call) -> Call:
    """``p`` with its segment ids folded into a dense (B, 1, T, S) bool mask (and the ids dropped from the
    mask's point of view: ``q_segment_ids`` stays, for zeroing padding rows). For the dense paths."""
    if p.q_segment_ids is None:
        return p
    seg = segments.visible(p.q_segment_ids, p.kv_segment_ids)
    mask = seg if p.mask is None else p.mask & seg
    return dataclasses.replace(p, mask=mask, mask_shape=tuple(int(d) for d in mask.shape))


class Backend:
    """One attention implementation.

    Subclasses set ``name`` and ``description`` and implement ``run``. ``available``
    answers for this machine (library installed, right device); ``supports`` for one
    call. Both return ``None`` when fine, else a human reason (no backend name prefix).

    What a backend needs is declared as data: ``library`` (the optional library and the pip extra
    that installs it) and ``min_compute_capability`` (an NVIDIA GPU of at least that compute
    capability); the default ``available`` and ``version`` come from them, and the environment
    report (``attnlab env``) names every registered backend's library.
    """

    name: str = ""
    description: str = ""
    #: (import name, pip extra) of the optional library this backend calls; None: JAX alone suffices.
    library: tuple[str, str] | None = None
    #: Distribution names to ask for the library's version (default: the import name).
    library_dists: tuple[str, ...] = ()
    #: Further libraries the environment report names with this one (import name -> distribution names).
    companion_libraries: dict[str, tuple[str, ...]] = {}
    #: The NVIDIA compute capability this backend needs; None: any device JAX runs on.
    min_compute_capability: tuple[int, int] | None = None
    #: True for a backend that is not a JAX op (``NativeBackend``): sweeps time it through ``native_fn``.
    native: bool = False
    #: True when the backend's output is the same computation on every platform, so
    #: auto-selection may use it as a last resort.
    portable: bool = False
    #: True when only the forward pass exists (no gradient): sweeps record fwd+bwd/bwd as unsupported.
    forward_only: bool = False
    #: A fixed relative-L2 limit replacing the dtype policy (low-precision paths such as FP8), with its rule.
    rel_l2_limit: float | None = None
    rel_l2_rule: str | None = None
    #: The dtype the kernel's matmuls run in when it differs from the inputs' (FP8 paths): a cell's
    #: % of peak is then taken against that dtype's peak (1979 TFLOP/s dense FP8 on the H200).
    compute_dtype: str | None = None
    #: True when ``run`` can also return the logsumexp residual (``return_residual=True``).
    residual: bool = False
    #: True for a path that computes in FP8 (e4m3/e5m2) whatever its inputs: never auto's pick and
    #: left out of the bf16/fp16 defaults of ``bench --model``, ``advise`` and ``tune``.
    fp8: bool = False
    #: True when ``run`` applies ``logits_soft_cap`` (cap * tanh(logits / cap) before masking) exactly.
    takes_soft_cap: bool = False
    soft_cap_reason: str = "logits_soft_cap: this backend has no soft-capped logits"
    #: True when ``run`` applies query/key_value segment ids (packed rows) exactly.
    takes_segment_ids: bool = False
    segment_reason: str = "query_segment_ids/key_value_segment_ids: this backend takes no packed segments"
    #: True when ``run`` applies ``sinks`` (one extra logit per query head in the softmax denominator) exactly.
    takes_sinks: bool = False
    sinks_reason: str = "sinks: no attention sinks (an extra per-head logit in the softmax denominator) in this path"
    #: True when ``run`` has been checked with a zero or negative ``scale`` (jax.nn runs any finite one): the
    #: generic paths (naive, xla) and attnlab's kernels. Any other refuses one rather than run it unchecked.
    takes_any_scale: bool = False
    scale_reason: str = "scale <= 0: this path runs only a positive scale (naive, xla and attnlab-decode run any)"
    #: True when ``run_decode`` applies a decode call's ``local_window_size`` (a sliding window around each
    #: query's absolute position in the cache) exactly: the generic masked path (naive, xla) and attnlab-decode.
    takes_decode_window: bool = False
    decode_window_reason: str = ("local_window_size: no sliding window in this backend's decode path "
                                 "(naive, xla and attnlab-decode take one)")
    #: True when ``run_decode`` / ``run_serving`` take a quantized KV cache with its ``k_scale``/``v_scale``
    #: (``attnlab.core.kv_quant``) exactly: the masked paths dequantize in float32, attnlab's kernels in registers.
    takes_kv_scales: bool = False
    kv_scales_reason: str = ("k_scale/v_scale: no quantized KV cache (FP8/int8 with scales) in this path "
                             "(attnlab-decode, naive and xla take one)")
    #: True for a native backend that also times decode sweep cells (``NativeBackend.decode_reason``,
    #: ``native_fn(..., decode=...)``); JAX backends run decode calls through ``run_decode``.
    decode: bool = False
    #: True when this backend's decode path reads a paged KV cache through its page table: its own
    #: ``run_decode`` (attnlab-decode) or, on the masked path, ``run_paged_decode`` (cudnn); else a paged
    #: decode call runs on the gathered contiguous copy of the cache (and sweeps skip its paged cells).
    paged: bool = False
    #: The parts of the peers sweeps that time this backend beside the others (``backends.peers(part)``
    #: lists them in registration order): "fwd" (forward, bfloat16), "fwd16" (forward, float16), "train"
    #: (fwd+bwd), "decode", "fp8", "quick" (the tiny grid any CPU runs), "auto" (the contenders auto's
    #: measured pick is scored against; its JAX ones are those the dispatch table is tuned on).
    peer_parts: tuple[str, ...] = ()
    #: Configured variants (``variant_names``) timed beside this backend wherever it is a peer.
    peer_variants: tuple[str, ...] = ()
    #: True for the backend whose math ring attention's blockwise kernel computes (naive): a ring cell
    #: runs under its name (``attnlab.api.sharded``), and under no other.
    ring_blocks: bool = False
    #: True when the option ``fp8_recipe`` (``attention(fp8_recipe=)``, ``bench --fp8-recipe``) picks one of
    #: this backend's configured variants (``recipe_variant``); ``backends.recipe_backends()`` lists them.
    takes_fp8_recipe: bool = False

    def available(self) -> str | None:
        """The declared needs, device first: ``min_compute_capability``, then ``library``."""
        why = _optional.needs_nvidia(self.min_compute_capability) if self.min_compute_capability else None
        return why or self.library_missing()

    def library_missing(self) -> str | None:
        """Why ``library`` cannot be imported (and how to install it), or None (also when none is declared)."""
        return _optional.missing(*self.library) if self.library else None

    def libraries(self) -> dict[str, tuple[str, ...]]:
        """Import name -> distribution names of the optional libraries this backend declares
        (libraries shipped inside JAX, ``jax.*``, are not optional libraries of the environment)."""
        out = dict(self.companion_libraries)
        if self.library and self.library[0].split(".")[0] != "jax":
            out[self.library[0]] = self.library_dists or (self.library[0],)
        return out

    def supports(self, spec: Call) -> str | None:
        return None

    def variant_names(self) -> list[str]:
        """The names this one registered backend answers to: its own, and those of its configured
        variants (``cudnn-fp8``: one per FP8 recipe). ``backends.get`` resolves each."""
        return [self.name]

    def configured(self, name: str) -> Backend | None:
        """The configured variant of this backend called ``name`` (one of ``variant_names``), else None."""
        return self if name == self.name else None

    def recipe_variant(self, recipe: str) -> str:
        """The name of the configured variant that runs FP8 recipe ``recipe`` (``takes_fp8_recipe`` backends
        only); ValueError naming the known recipes for an unknown one."""
        raise ValueError(f"fp8_recipe: backend {self.name!r} takes no FP8 recipe")

    def why_not(self, spec: Call) -> str | None:
        """``available()``, the residual, the soft cap, segment ids, sinks, a scale <= 0, then ``supports(spec)``: the first reason
        this backend cannot run."""
        why = self.available()
        if why is None and spec.return_residual and not self.residual:
            why = "return_residual=True: this backend returns no logsumexp residual"
        if why is None and spec.soft_cap is not None and not self.takes_soft_cap:
            why = self.soft_cap_reason
        if why is None and spec.has_segment_ids and not self.takes_segment_ids:
            why = self.segment_reason
        if why is None and spec.has_sinks and not self.takes_sinks:
            why = self.sinks_reason
        if why is None and not self.takes_any_scale and spec.scale_is_static and spec.scale is not None \
                and spec.scale <= 0:
            why = self.scale_reason
        return why or self.supports(spec)

    def mode_reason(self, spec: Call, mode: str) -> str | None:
        """Why this backend cannot run ``mode`` ("fwd", "fwd+bwd", "bwd") on ``spec``, or None."""
        if self.forward_only and mode != "fwd":
            return "forward only, no backward pass"
        return None

    def run(self, p: Call):
        """Compute attention on normalised 4-D inputs; returns (B, T, N, H).

        With ``p.return_residual`` (backends with ``residual = True`` only) returns
        ``(out, lse)``: lse (B, T, N) in the inputs' dtype, the natural-log logsumexp of each row's
        scaled, biased, masked logits, carrying no gradient (as jax.nn's)."""
        raise NotImplementedError

    def supports_decode(self, spec) -> str | None:
        """Why ``decode_attention`` cannot run ``spec`` (a ``Call`` of kind decode) with this
        backend, or None. Default: ``why_not`` of the call as attention (the masked path)."""
        return self.why_not(spec.as_attention())

    def why_not_decode(self, spec) -> str | None:
        """``available()``, a window refused by ``takes_decode_window``, a quantized cache
        (``kv_scales_refusal``), then ``supports_decode(spec)``: the first reason ``decode_attention`` cannot run
        ``spec`` (a decode ``Call``) with this backend (what a named call raises and ``explain_decode`` lists)."""
        if spec.window is not None and not self.takes_decode_window:
            return self.available() or self.decode_window_reason
        return self.available() or self.kv_scales_refusal(spec) or self.supports_decode(spec)

    def kv_scales_refusal(self, spec) -> str | None:
        """``kv_scales_reason`` when ``spec`` (a decode or serving ``Call``) has a quantized cache and this
        backend does not take one (``takes_kv_scales``), else None."""
        return self.kv_scales_reason if spec.kv_scale and not self.takes_kv_scales else None

    def auto_reason(self, spec) -> str | None:
        """``decode_attention``'s auto hook: None when its auto should run this backend's own decode
        kernel for ``spec`` (a decode ``Call``). Default: never (auto runs ``attention``'s auto choice)."""
        return "no decode kernel of its own (decode_attention's auto runs attention()'s auto choice)"

    def auto_claim(self, spec: Call) -> str | None:
        """``attention``'s auto hook for a backend outside ``AUTO_ORDER``: None when auto should run it
        for ``spec`` (checked before ``AUTO_ORDER``). Default: it claims nothing (the reason says so)."""
        return "claims no inputs (auto reaches it through AUTO_ORDER only, if listed)"

    def run_decode(self, d):
        """Run a decode ``Call`` (``attnlab.api.decode.prepare_decode``'s); returns (B, T, N, H) in q's dtype. Default: the
        masked-attention path (``masked_decode``: ``run`` on a causal-tail mask and kv lengths, paged
        caches through ``run_paged_decode`` when ``paged`` else gathered). Decode kernels override it."""
        return masked_decode(self, d, d.scale)

    def run_paged_decode(self, d, mask):
        """A paged decode ``Call`` (``d.page_table`` set) with ``mask`` (B, 1, T, S_max) or None, read
        through the page table; only backends with ``paged = True`` implement it."""
        raise UnsupportedError(self.name, "no paged KV cache path of its own")

    def supports_serving(self, spec) -> str | None:
        """Why ``serving_attention`` cannot run ``spec`` (a ``Call`` of kind serving) here, or None.
        Default: no serving path (ragged packed queries against a cache are not an ``attention`` call)."""
        return "no serving path (ragged packed queries against a KV cache); serving_attention runs on xla or attnlab-decode"

    def auto_serving_reason(self, spec) -> str | None:
        """``serving_attention``'s auto hook: None when its auto should run this backend for ``spec``."""
        return "not serving_attention's auto choice"

    def run_serving(self, call):
        """Run a serving ``Call`` (``attnlab.api.serving.prepare_serving``'s); returns (T_total, N, H) in q's dtype."""
        raise UnsupportedError(self.name, self.supports_serving(call) or "no serving path")

    def version(self) -> str | None:
        """Version of the library behind this backend, if any (the declared ``library``'s distribution)."""
        if self.library is None or self.library[0].split(".")[0] == "jax":
            return None
        return _optional.dist_version(*(self.library_dists or (self.library[0],)))

    def facts(self, fwd, q, k, v, fwd_as=None) -> dict | None:
        """What a sweep record should say about how this backend ran ``fwd(q, k, v)`` (e.g. whether
        FP8 engaged), measured on the compiled program; None when there is nothing to add.
        ``fwd_as(name)`` gives the same call on another backend, for comparisons."""
        return None

    def __repr__(self) -> str:
        return f"<attnlab backend {self.name!r}>"


class NativeCall(NamedTuple):
    """How to time a native backend's kernel (``NativeBackend.native_fn``; the loop: ``measure.native``)."""
    #: fn(*inputs) launches the kernel on one input set (asynchronously, like a CUDA stream).
    fn: Callable
    #: Waits until the device has finished everything launched.
    sync: Callable[[], None]
    #: The input sets in the library's own arrays (handed over from JAX without a copy).
    sets: list
    #: Optional hooks: ``event_ms(call)`` times one call with device events (CUPTI's fallback), ``reset_peak()``
    #: starts this cell's memory peak, ``peak_bytes()`` reads it; ``peak_scope`` (a str) says what it covers;
    #: ``to_jax(out)`` hands ``fn``'s output to JAX (the output a sweep checks; default: ``jax.dlpack.from_dlpack``).
    extras: dict


class NativeBackend(Backend):
    """A backend that is not a JAX op (PyTorch): it runs on concrete arrays outside ``jax.jit``.

    ``run`` computes on concrete JAX arrays; ``native_fn`` hands sweeps the kernel itself, timed by
    ``attnlab.measure.native.time_kernel`` (CUPTI, as for the JAX paths). The library comes
    first: without it nothing about the device can be asked of it."""

    native = True

    def available(self) -> str | None:
        return self.library_missing() or super().available()

    def native_fn(self, spec: Call, scale: float, arg_sets, decode: tuple | None = None) -> NativeCall:
        """The kernel for ``spec`` (``decode``: (kv_lengths, causal) of a decode cell) on ``arg_sets``
        (JAX arrays (q, k, v) per set) as a ``NativeCall``."""
        raise NotImplementedError

    def decode_reason(self, kv_lengths, T: int, S: int) -> str | None:
        """Why this kernel cannot run a decode cell (T new tokens, cache of S, valid ``kv_lengths``), or
        None; only backends with ``decode = True`` run decode cells."""
        return "no decode (cache) semantics"
