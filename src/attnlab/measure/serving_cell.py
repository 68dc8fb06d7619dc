"""A serving cell: ``serving_attention`` on ragged requests (and prefill chunks), the lengths traced as a server's are.

A cell whose ``lengths`` is a request-length distribution (``attnlab.core.request_lengths``: uniform, spread,
lognormal, one-long, file:PATH) is B decode requests of T new tokens each against caches of at most S tokens,
their KV lengths drawn from it with a seed fixed by the shape (every backend and run sees the same batch);
``prefill_chunks`` ``"NxSIZE"`` puts N prefill chunks of SIZE tokens before them (a mixed step). Its problem is
``Problem.serving`` of those lengths, so the record's FLOPs, bytes and roofline are the valid work's.

Measured as a JAX server calls it: ``jax.jit`` of ``serving_attention(q, k, v, q_starts, kv_lengths)``, the
lengths *traced* arguments (the record's ``lengths_traced``; the kernel's plan is made inside the call from
them; ``compile_run``, then ``ServingRun.time``): cells of one shape, call and backend share one compiled step
(``program_key``), whatever their lengths. The check runs first (``check.check_serving``, from
``check.check_into`` as every cell's check): the first and last ``EDGE`` tokens of the longest and the shortest
requests (by KV length and by query length, ``reference.serving64.sampled``) against NumPy float64
(``reference.serving64.serving_errors``), each error within the tolerance policy's limit from a kernel-like
emulation of the same rows (``reference.serving64.kernel_like_serving``: scores in float32, P rounded to the
cell's dtype), then every token against the float32 device reference (a quantized cache's dequantized). The record
adds ``request_lengths`` (``Problem.lengths_record``) and ``tokens_per_s`` (the
step's new tokens / its time). With ``page_size`` the caches are pages of that many tokens in a shuffled
order, found through a page table (vLLM's layout, ``kernels.pages.to_pages``, made before the timed call);
the check reads the contiguous caches they were made from. The cell's ``window`` (its left size: the call is
causal), ``sinks`` (``reference.inputs.random_sinks``) and soft cap go to the call, the reference and the
emulation alike; with ``kv_dtype`` the cache is quantized before timing (``quantize_kv_cache``, per page with
``page``), the check reads the sampled requests' *dequantized* cache (that quantized cache's codes and scales,
``reference.dequant64``, made here with the timed cache) and ``kv_rel_err`` is the same rows' error
against float64 of the unquantized K/V.
"""
from __future__ import annotations

import dataclasses
import functools
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np

from .. import backends
from ..api.serving import prepare_serving, serving_attention
from ..core import device, request_lengths as rl
from ..core.kv_quant import quantize_kv_cache
from ..core.problem import Problem
from ..core.records import time_ms
from ..kernels.pages import to_pages
from ..reference.dequant64 import dequantized_sequences64
from ..reference.inputs import cap_reach, inputs_draw, random_qkv, random_sinks, seed_of
from ..reference.serving64 import sampled_requests
from . import memory, peaks
from .budget import compile_within_budget
from .jax_cell import time_program
from .outcome import Skip, classify

#: The request-length distributions a serving cell's ``lengths`` names (or ``file:PATH``).
LENGTHS = rl.DISTRIBUTIONS
#: Compiled serving steps, (compiled, lower_s, compile_s) by ``program_key``: the lengths are traced, so every cell
#: of one shape, call and backend runs one program (a sweep over distributions compiles it once).
_PROGRAMS: OrderedDict = OrderedDict()
PROGRAMS_KEPT = 8


def is_serving(cell) -> bool:
    return rl.is_distribution(cell.lengths)


def check_cell(cell) -> None:
    """The rules of a serving cell (ValueError naming the field); nothing to check for any other cell."""
    chunks = rl.parse_chunks(cell.prefill_chunks)
    if not is_serving(cell):
        if chunks:
            raise ValueError(f"prefill_chunks needs a request-length distribution as lengths "
                             f"({', '.join(rl.DISTRIBUTIONS)} or file:PATH), got lengths={cell.lengths!r}")
        return
    if not cell.causal or cell.mode != "fwd" or cell.q_len > cell.kv_len:
        raise ValueError(f"serving cells (lengths {cell.lengths}) are causal, mode fwd and q_len <= kv_len")
    if cell.strategy is not None or cell.packing:
        raise ValueError("serving cells take no strategy or packing")
    if cell.inputs != "gaussian":
        raise ValueError(f"serving cells draw gaussian inputs, got inputs={cell.inputs!r}")
    if chunks and chunks[1] > cell.kv_len:
        raise ValueError(f"prefill_chunks {cell.prefill_chunks}: a chunk of {chunks[1]} tokens does not fit in "
                         f"kv_len={cell.kv_len}")


def request_seed(cell) -> int:
    """The seed of the cell's request lengths, fixed by its shape: every backend and run sees the same step."""
    return seed_of(f"serving {cell.lengths} {cell.prefill_chunks} B{cell.batch} T{cell.q_len} S{cell.kv_len}")


def requests(cell) -> tuple[np.ndarray, np.ndarray, int]:
    """(q_lengths, kv_lengths, seed) of the cell's step: the chunks first, then the B decodes (int32). A cell
    draws them once, for its ``workload``."""
    seed = request_seed(cell)
    rng = np.random.default_rng(seed)
    kv = rl.draw(cell.lengths, cell.batch, cell.q_len, cell.kv_len, rng)
    n, size = rl.parse_chunks(cell.prefill_chunks) or (0, 1)
    q, kv = rl.mixed_batch(n, size, cell.batch, cell.kv_len, rng, decode_kv=kv, q_len=cell.q_len)
    return q, kv, seed


def problem_of(cell) -> Problem:
    q, kv, _ = requests(cell)
    p = Problem.serving(q, kv, cell.heads, cell.kv_heads, cell.head_dim, cell.dtype, kv_len_max=cell.kv_len,
                        window=cell.window)
    return p if cell.kv_dtype is None else dataclasses.replace(p, kv_dtype=cell.kv_dtype, kv_scale=cell.kv_scale,
                                                               page_size=cell.page_size)


def argument_sets(cell, p: Problem, nbytes: float, opts, phases, check_requests=()) -> tuple:
    """(the first contiguous set, the timed sets, the call's semantics ``call_semantics``, the dequantized K/V of
    ``check_requests``) of a serving cell.

    Contiguous sets are (q (T_total, N, H), k, v (B, S, K, H), q_starts, kv_lengths), drawn (the ``inputs``
    phase) to rotate past the L2 cache, ``nbytes`` being the bytes one step moves (``p.bytes()``); the check
    reads the first. Timed sets are (q, k_cache, v_cache, q_starts, kv_lengths, page_table, k_scale, v_scale):
    pages of ``page_size`` tokens (``to_pages``; None: contiguous), the cache quantized (``quantize_kv_cache``)
    with ``kv_dtype`` (None: the scales are None), made before the timed call. With ``kv_dtype`` the first timed
    set's cache, quantized once, also gives the check its values: (k, v) of the requests ``check_requests``
    (``reference.serving64.sampled_requests``), each (len, S, K, H) float64 dequantized (``dequantized_sequences64``);
    else None."""
    sem = call_semantics(cell)
    sheet = peaks.peak_for_kind(device.current().kind)
    n = opts.input_sets(nbytes, sheet and sheet.l2_bytes)
    starts, kv = jnp.asarray(rl.starts_of(p.q_lengths)), jnp.asarray(np.asarray(p.kv_lengths, np.int32))
    sets = []
    with phases("inputs"):
        for i in range(n):
            q = random_qkv(1, p.q_len, 1, p.heads, p.kv_heads, p.head_dim, p.dtype, seed=opts.seed + i)[0][0]
            q = q * jnp.asarray(cap_reach(cell.soft_cap), q.dtype)
            _, k, v = random_qkv(p.batch, 1, p.kv_len, p.heads, p.kv_heads, p.head_dim, p.dtype,
                                 seed=opts.seed + 50 + i)
            sets.append((q, k, v, starts, kv))
    timed, dequantized = [], None
    for q, k, v, starts, kv in sets:
        table = ks = vs = None
        if cell.page_size:
            k, v, table = to_pages(k, v, cell.page_size)
        if cell.kv_dtype:
            (k, ks), (v, vs) = (quantize_kv_cache(x, cell.kv_dtype, cell.kv_scale) for x in (k, v))
            if not timed and len(check_requests):
                dequantized = tuple(dequantized_sequences64(c, s, check_requests, table) for c, s in ((k, ks), (v, vs)))
        timed.append((q, k, v, starts, kv, table, ks, vs))
    return sets[0], timed, sem, dequantized


@dataclasses.dataclass(frozen=True)
class ServingRun:
    """A serving cell compiled (``compile_run``): ``compiled`` the jitted step on each timed set of ``args``; what
    its check reads (``check.check_into`` passes them to ``check.check_serving``): ``contiguous``, the first set's
    contiguous (q, k, v, q_starts, kv_lengths), the step's ``q_lens`` and ``kv_lens``, the call's semantics ``sem``
    (``call_semantics``) and, with ``kv_dtype``, the sampled requests' ``dequantized`` (k, v)."""

    p: Problem
    compiled: object
    args: list
    contiguous: tuple
    q_lens: np.ndarray
    kv_lens: np.ndarray
    sem: dict
    dequantized: tuple | None
    cupti: bool

    def output(self):
        """The step's output on the first timed set (q's packed rows)."""
        return self.compiled(*self.args[0])

    def time(self, opts, rec: dict, info, phases) -> None:
        """Time the step on every set into ``rec`` (``jax_cell.time_program``, as every JAX cell), with
        ``tokens_per_s``; raises ``Skip``."""
        time_program(rec, self.compiled, self.args, opts, info, phases, self.cupti)
        rec["tokens_per_s"] = self.p.new_tokens() / (time_ms(rec) * 1e-3)


def compile_run(backend, cell, opts, rec: dict, phases, cupti: bool, ahead=None) -> ServingRun:
    """A serving cell's inputs made (``argument_sets``; with ``opts.check`` the dequantized K/V its check reads), the
    backend asked about its first call and its ``step`` compiled (or the one compiled ``ahead`` taken, or the one an
    earlier cell compiled reused), into ``rec``; raises ``Skip`` (refused, a compile failure). Checked
    (``check.check_into``) and timed (``ServingRun.time``) as every cell is."""
    p = cell.workload     # the step's requests, drawn once (``requests``)
    q_lens, kv_lens = np.asarray(p.q_lengths, np.int32), np.asarray(p.kv_lengths, np.int32)
    seed = request_seed(cell)
    checked = sampled_requests(q_lens, kv_lens) if opts.check else []
    contiguous, args, kw, dequantized = argument_sets(cell, p, rec["bytes"], opts, phases, checked)
    rec.update(request_lengths=p.lengths_record(seed), inputs_draw=inputs_draw(cell.soft_cap), input_sets=len(args))
    first = prepare_serving(*args[0][:5], page_table=args[0][5], k_scale=args[0][6], v_scale=args[0][7], **kw)
    if why := backend.supports_serving(first):   # the backend in hand (measure_cell found it available)
        raise Skip("unsupported", f"{backend.name}: {why}")
    key = program_key(backend, args[0], kw)
    reused = key in _PROGRAMS      # compiled by an earlier cell: its record says so
    fn = None if reused or ahead is not None else step(cell, kw)
    with phases("compile", key="compile_wait_s"):
        if not reused:
            try:
                _PROGRAMS[key] = tuple(compile_within_budget(fn, args[0], opts.compile_budget_s, ahead)[:3])
            except Skip:
                raise
            except Exception as e:  # noqa: BLE001
                raise Skip(*classify(e, "compile")) from None
            while len(_PROGRAMS) > PROGRAMS_KEPT:
                _PROGRAMS.popitem(last=False)
        _PROGRAMS.move_to_end(key)
    compiled, lower_s, compile_s = _PROGRAMS[key]
    rec.update(lower_s=lower_s, compile_s=lower_s + compile_s, compiled_ahead=ahead is not None and not reused,
               program_reused=reused, lengths_traced=True, **memory.compiled_memory(compiled))   # a jitted step
    # whose lengths are arguments: compiled, so it runs (a refused or failed cell never ran with them)
    if why := memory.over_limit(rec["peak_bytes"], opts.max_bytes):
        raise Skip("oom", why)
    return ServingRun(p, compiled, args, contiguous, q_lens, kv_lens, kw, dequantized, cupti)


def step(cell, kw: dict):
    """The cell's jitted step: ``serving_attention`` with the call's semantics ``kw`` (``call_semantics``), every
    array an argument: (q, k, v, q_starts, kv_lengths, page_table, k_scale, v_scale), a timed set's order."""
    call = functools.partial(serving_attention, implementation=cell.backend, **kw)
    return jax.jit(lambda q, k, v, starts, kv, table, ks, vs: call(q, k, v, starts, kv, page_table=table,
                                                                   k_scale=ks, v_scale=vs))


def why_not_ahead(cell, after=None) -> str | None:
    """Why ``step`` of the cell is not compiled ahead from ``step_shapes`` (``attnlab.measure.ahead``; None: it
    is) while the cell ``after`` which it runs is measured: paged or quantized caches are made from its inputs,
    and a program compiled already, or by ``after``, is reused."""
    if cell.page_size or cell.kv_dtype:
        return "serving on a paged or quantized cache: its arguments are made from its inputs"
    key = _ahead_key(cell)
    if key in _PROGRAMS or (after is not None and is_serving(after) and not (after.page_size or after.kv_dtype)
                            and _ahead_key(after) == key):
        return "serving: its program is compiled by an earlier cell (program_reused)"
    return backends.get(cell.backend).available()


def _ahead_key(cell) -> tuple:
    return program_key(backends.get(cell.backend), step_shapes(cell), call_semantics(cell))


def step_shapes(cell) -> tuple:
    """A contiguous cache's timed set as ``jax.ShapeDtypeStruct`` (``step``'s arguments): q (tokens, N, H), k, v
    (B, S, K, H), q_starts (B + 1,), kv_lengths (B,), no page table or scales."""
    p = cell.workload
    dt, i32 = jnp.dtype(p.dtype), jnp.dtype(jnp.int32)
    kv = jax.ShapeDtypeStruct((p.batch, p.kv_len, p.kv_heads, p.head_dim), dt)
    return (jax.ShapeDtypeStruct((p.q_len, p.heads, p.head_dim), dt), kv, kv, jax.ShapeDtypeStruct((p.batch + 1,), i32),
            jax.ShapeDtypeStruct((p.batch,), i32), None, None, None)


def program_key(backend, args, kw: dict) -> tuple:
    """What a serving step's compiled program depends on: the backend, its arguments' shapes and dtypes and the
    call's semantics (soft cap, window, the sinks' values), the x64 setting. Not the lengths: they are traced."""
    shape = lambda x: None if x is None else (tuple(x.shape), str(x.dtype))  # noqa: E731
    sinks = kw.get("sinks")
    return (backend.name, id(backend), tuple(map(shape, args)), kw.get("logits_soft_cap"), kw.get("local_window_size"),
            None if sinks is None else np.asarray(sinks, np.float32).tobytes(), jax.config.jax_enable_x64)


def call_semantics(cell) -> dict:
    """The serving call's soft cap, window and sinks (one standard normal logit per query head, NumPy)."""
    return dict(logits_soft_cap=cell.soft_cap, local_window_size=cell.window,
                sinks=random_sinks(cell.heads) if cell.sinks else None)
