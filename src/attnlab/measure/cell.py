"""Measure one sweep cell: check it against the reference, then time it, and return one record.

A cell is one (backend, shape, dtype, mask, mode). Its record's ``status`` is one of
``ok``, ``incorrect``, ``unsupported``, ``oom``, ``compile_error``, ``runtime_error``,
``over_budget``, with ``reason`` saying why. Only ``ok`` cells carry speed: an incorrect
cell is never timed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from .. import api, backends, device
from ..errors import UnsupportedError
from ..inputs import random_qkv
from ..reference import (check_close, default_matmul_is_tf32, low_precision_baseline, reference_attention,
                         reference_attention_grads, rel_l2)
from ..spec import prepare
from ..workload import Workload
from . import memory, peaks, timers

STATUSES = ("ok", "incorrect", "unsupported", "oom", "compile_error", "runtime_error", "over_budget")
MODES = ("fwd", "fwd+bwd", "bwd")
IDENTITY = ("backend", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window", "mode",
            "devices", "strategy")
IDENTITY_DEFAULTS = {"devices": 1, "strategy": None}


@dataclasses.dataclass(frozen=True)
class Cell:
    backend: str
    batch: int
    q_len: int
    kv_len: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    causal: bool = False
    window: tuple[int, int] | None = None
    mode: str = "fwd"
    devices: int = 1                 # mesh size, for sharded cells
    strategy: str | None = None      # None (one device, no mesh) or a sharded_attention strategy

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.strategy is not None:
            from ..sharded import STRATEGIES

            if self.strategy not in STRATEGIES:
                raise ValueError(f"strategy must be None or one of {STRATEGIES}, got {self.strategy!r}")
        elif self.devices != 1:
            raise ValueError("devices > 1 needs a strategy (batch, heads or ring)")

    @property
    def workload(self) -> Workload:
        return Workload(self.batch, self.q_len, self.kv_len, self.heads, self.kv_heads, self.head_dim,
                        self.dtype, self.causal, self.window)

    def identity(self) -> dict:
        d = {k: getattr(self, k) for k in IDENTITY}
        d["window"] = list(self.window) if self.window else None
        return d

    def key(self) -> str:
        return json.dumps(self.identity(), sort_keys=True)

    @property
    def config_label(self) -> str:
        mesh = f" {self.strategy}x{self.devices}" if self.strategy else ""
        return f"{self.workload.label} {self.mode}{mesh}"


def record_key(rec: dict) -> str:
    d = {k: rec.get(k, IDENTITY_DEFAULTS.get(k)) for k in IDENTITY}
    d["window"] = list(d["window"]) if d["window"] else None
    return json.dumps(d, sort_keys=True)


@dataclasses.dataclass
class Options:
    repeats: int | None = None          # timed calls (default: 20 on a GPU, 5 on a CPU)
    warmup: int = 2
    compile_budget_s: float | None = 300.0
    check: bool = True
    max_bytes: int | None = None        # a compiled peak above this is recorded as oom, not run
    max_input_sets: int = 8
    rotate_bytes: int | None = None     # inputs rotate until they exceed this (default: 3 x L2)
    pipelined_calls: int = 20
    seed: int = 0


class _Skip(Exception):
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


def classify(exc: BaseException, phase: str) -> tuple[str, str]:
    """Map an exception raised while compiling ('compile') or running ('run') to (status, reason)."""
    msg = f"{type(exc).__name__}: {exc}"
    low = msg.lower()
    if isinstance(exc, MemoryError) or "resource_exhausted" in low or "out of memory" in low or "oom" in low.split():
        return "oom", _short(msg)
    if isinstance(exc, (UnsupportedError, NotImplementedError)):
        return "unsupported", _short(msg)
    return ("compile_error" if phase == "compile" else "runtime_error"), _short(msg)


def _short(msg: str, n: int = 500) -> str:
    """One line; long messages keep their head and their tail (where the cause usually is)."""
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n // 2] + " ... " + msg[-(n // 2):]


def _place_sharded(sets, cell: Cell):
    """Put each input set on the mesh as the strategy splits it, so timing excludes the initial scatter."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ..sharded import make_mesh

    mesh = make_mesh(cell.devices)
    spec = {"batch": P("x"), "heads": P(None, None, "x"), "ring": P(None, "x")}[cell.strategy]
    sh = NamedSharding(mesh, spec)
    return [tuple(jax.device_put(x, sh) for x in s) for s in sets]


def _mesh_record(cell: Cell) -> dict:
    if cell.devices > jax.device_count():
        raise _Skip("unsupported", f"{cell.devices} devices asked, JAX sees {jax.device_count()}")
    devs = jax.devices()[: cell.devices]
    return {"devices": cell.devices, "axis": "x", "strategy": cell.strategy, "kinds": sorted({d.device_kind for d in devs})}


def _with_budget(fn, budget_s):
    """Run fn() in a daemon thread; (result, None) or raise; _Skip('over_budget') past the budget."""
    if not budget_s:
        return fn()
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target, daemon=True, name="attnlab-compile")
    t.start()
    t.join(budget_s)
    if t.is_alive():
        raise _Skip("over_budget", f"compile ran past its {budget_s:g} s budget; abandoned and skipped")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _input_sets(cell: Cell, opts: Options):
    w = cell.workload
    one = w.bytes("fwd") - w.batch * w.q_len * w.heads * w.head_dim * w.itemsize  # q, k, v
    rotate = opts.rotate_bytes
    if rotate is None:
        p = peaks.peak_for_kind(device.current().kind)
        rotate = 3 * (p.l2_bytes if p else 64 * 2**20)
    n = max(1, min(opts.max_input_sets, math.ceil(rotate / max(one, 1)), max(1, (4 * 2**30) // max(one, 1))))
    return [random_qkv(w.batch, w.q_len, w.kv_len, w.heads, w.kv_heads, w.head_dim, w.dtype, seed=opts.seed + i)
            for i in range(n)]


def _functions(cell: Cell):
    """(forward fn(q, k, v), timed fn, a maker of its argument tuple from (q, k, v, ct))."""
    kw = dict(is_causal=cell.causal, local_window_size=cell.window, implementation=cell.backend)

    if cell.strategy is None:
        def fwd(q, k, v):
            return api.attention(q, k, v, **kw)
    else:
        from ..sharded import make_mesh, sharded_attention

        mesh = make_mesh(cell.devices)
        impl = None if cell.strategy == "ring" and cell.backend == "naive" else cell.backend

        def fwd(q, k, v):
            return sharded_attention(q, k, v, mesh=mesh, strategy=cell.strategy, is_causal=cell.causal, implementation=impl)

    if cell.mode == "fwd":
        return fwd, fwd, lambda q, k, v, ct: (q, k, v)

    def loss(q, k, v, ct):
        return jnp.sum(fwd(q, k, v).astype(jnp.float32) * ct)

    if cell.mode == "fwd+bwd":
        return fwd, jax.grad(loss, argnums=(0, 1, 2)), lambda q, k, v, ct: (q, k, v, ct)

    treedef = []

    def make_bwd_args(q, k, v, ct):
        # The backward pass alone: residuals of the forward pass are the timed function's inputs.
        # Every input set reuses the first set's tree structure so one compilation serves all.
        _, vjp_fn = jax.vjp(fwd, q, k, v)
        leaves, tdef = jax.tree_util.tree_flatten(vjp_fn)
        treedef.append(tdef)
        return (jax.tree_util.tree_unflatten(treedef[0], leaves), ct.astype(q.dtype))

    return fwd, lambda vjp_fn, ct: vjp_fn(ct), make_bwd_args


def _check_forward(fwd, q, k, v, cell: Cell, rows: int = 128, backend=None, jit: bool = True) -> dict:
    """Compare a slice of the output (first and last query rows, <= 2 batch elements) with float64."""
    out = jax.jit(fwd)(q, k, v) if jit else fwd(q, k, v)
    b = min(cell.batch, 2)
    T = cell.q_len
    kw = dict(is_causal=cell.causal, local_window_size=cell.window)
    if backend is not None and backend.rel_l2_limit:
        kw.update(limit=backend.rel_l2_limit, rule=backend.rel_l2_rule)
    slices = [(0, min(T, rows))] + ([(T - rows, T)] if T > 2 * rows else [(min(T, rows), T)] if T > rows else [])
    verdicts = []
    for lo, hi in slices:
        o = np.asarray(out[:b, lo:hi])
        if not np.all(np.isfinite(o)):
            return {"ok": False, "rel_err": math.inf, "max_abs_err": math.inf, "rule": "NaN/Inf in output"}
        ref, base = _reference_slice(cell, q, k, v, b, lo, hi, np.dtype(o.dtype).name)
        verdicts.append(check_close(o, q[:b, lo:hi], k[:b], v[:b], query_offset=lo, ref=ref, baseline_err=base, **kw))
    return {"ok": all(v_.ok for v_ in verdicts), "rel_err": max(v_.rel_err for v_ in verdicts),
            "max_abs_err": max(v_.max_abs_err for v_ in verdicts), "rule": verdicts[0].rule,
            "checked_rows": sum(hi - lo for lo, hi in slices), "checked_batch": b}


_REF_CACHE: dict = {}


def _reference_slice(cell: Cell, q, k, v, b, lo, hi, out_dtype):
    """(float64 reference rows lo:hi, low-precision baseline error), shared by every backend measured
    on the same inputs (a sweep draws the same random inputs for each backend of a configuration)."""
    key = (cell.batch, cell.q_len, cell.kv_len, cell.heads, cell.kv_heads, cell.head_dim, cell.dtype, cell.causal,
           cell.window, b, lo, hi, out_dtype, float(jnp.sum(q[:1, :1].astype(jnp.float32))))
    if key not in _REF_CACHE:
        if len(_REF_CACHE) > 16:
            _REF_CACHE.clear()
        kw = dict(is_causal=cell.causal, local_window_size=cell.window, query_offset=lo)
        qs, ks, vs = q[:b, lo:hi], k[:b], v[:b]
        ref = reference_attention(qs, ks, vs, **kw)
        base = low_precision_baseline(qs, ks, vs, ref=ref, emulate=out_dtype, **kw) if out_dtype in ("bfloat16", "float16") else None
        _REF_CACHE[key] = (ref, base)
    return _REF_CACHE[key]


GRAD_CHECK_MAX_ENTRIES = 2**22


def _check_grads(grads, q, k, v, ct, cell: Cell) -> dict:
    if cell.batch * cell.heads * cell.q_len * cell.kv_len > GRAD_CHECK_MAX_ENTRIES:
        return {"grad_check": "skipped: too large for the float64 reference"}
    refs = reference_attention_grads(q, k, v, ct, is_causal=cell.causal, local_window_size=cell.window)
    low = cell.dtype in ("bfloat16", "float16")
    limit = 5e-2 if low else (3e-3 if default_matmul_is_tf32() else 1e-4)
    errs = [rel_l2(g, r) for g, r in zip(grads, refs)]
    return {"grad_check": "ok" if max(errs) <= limit else "incorrect", "grad_rel_err": max(errs), "grad_limit": limit}


def measure_cell(cell: Cell, opts: Options | None = None) -> dict:
    """Check then time one cell; always returns a record (never raises for a failing cell)."""
    opts = opts or Options()
    info = device.current()
    rec: dict = {**cell.identity(), "status": "ok", "reason": None}
    w = cell.workload
    rec.update(flops=w.flops(cell.mode), bytes=w.bytes(cell.mode), intensity=w.intensity(cell.mode))
    for k_ in ("kernel_ms", "wall_ms", "pipelined_ms", "dispatch_ms", "compile_s", "lower_s", "tflops", "gbps",
               "pct_peak", "pct_ceiling", "rel_err", "max_abs_err", "temp_bytes", "peak_bytes", "runtime_peak_bytes"):
        rec[k_] = None
    no_cupti = timers.kernel_timer_available()
    rec["timer"] = "cupti" if no_cupti is None else "wall"
    t_start = time.perf_counter()
    try:
        try:
            backend = backends.get(cell.backend)
        except ValueError as e:
            raise _Skip("unsupported", str(e))
        try:
            sets = _input_sets(cell, opts)
        except Exception as e:  # noqa: BLE001
            raise _Skip(*classify(e, "run"))
        rec["input_sets"] = len(sets)
        q0, k0, v0 = sets[0]
        spec = prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window).spec
        why = backend.why_not(spec)
        if why:
            raise _Skip("unsupported", f"{cell.backend}: {why}")
        why_mode = backend.mode_reason(spec, cell.mode)
        if why_mode:
            raise _Skip("unsupported", f"{cell.backend}: {why_mode}")
        if cell.strategy is not None:
            rec["mesh"] = _mesh_record(cell)
            sets = _place_sharded(sets, cell)
            q0, k0, v0 = sets[0]
            if cell.window is not None:
                raise _Skip("unsupported", "sharded cells take no window")
            if cell.strategy == "ring" and cell.backend != "naive":
                raise _Skip("unsupported", "ring attention computes its blocks with attnlab's blockwise kernel: use backend naive")
        if getattr(backend, "native", False):
            _measure_native(backend, cell, spec, sets, opts, rec, info)
            return _finish(rec, t_start)
        fwd, timed, make_args = _functions(cell)
        cts = [jax.random.normal(jax.random.key(opts.seed + 100 + i), q.shape, jnp.float32) for i, (q, _, _) in enumerate(sets)]
        try:
            arg_sets = [make_args(q, k, v, ct) for (q, k, v), ct in zip(sets, cts)]
        except Exception as e:  # noqa: BLE001
            raise _Skip(*classify(e, "compile"))
        try:
            compiled, lower_s, compile_s = _with_budget(lambda: timers.compile_seconds(timed, arg_sets[0]), opts.compile_budget_s)
        except _Skip:
            raise
        except Exception as e:  # noqa: BLE001
            raise _Skip(*classify(e, "compile"))
        rec.update(lower_s=lower_s, compile_s=lower_s + compile_s)
        rec.update(memory.compiled_memory(compiled))
        limit = opts.max_bytes or memory.device_bytes_limit()
        if limit and rec["peak_bytes"] and rec["peak_bytes"] > limit:
            raise _Skip("oom", f"compiled peak {rec['peak_bytes']} bytes > device limit {limit} bytes; not run")
        if opts.check:
            try:
                chk = _check_forward(fwd, q0, k0, v0, cell, backend=backend)
                if cell.mode != "fwd":
                    grads = compiled(*arg_sets[0])
                    chk.update(_check_grads(grads, q0, k0, v0, cts[0], cell))
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "run"))
            rec.update(rel_err=chk["rel_err"], max_abs_err=chk["max_abs_err"], tolerance=chk["rule"],
                       checked_rows=chk.get("checked_rows"), grad_check=chk.get("grad_check"),
                       grad_rel_err=chk.get("grad_rel_err"))
            if not chk["ok"]:
                raise _Skip("incorrect", f"rel L2 {chk['rel_err']:.3g} over the limit ({chk['rule']})")
            if chk.get("grad_check") == "incorrect":
                raise _Skip("incorrect", f"gradient rel L2 {chk['grad_rel_err']:.3g} > {chk['grad_limit']:g}")
        try:
            facts = backend.facts(fwd, q0, k0, v0, fwd_as=lambda name: _functions(dataclasses.replace(cell, backend=name))[0])
        except Exception as e:  # noqa: BLE001 - a fact that cannot be read is reported, not fatal
            facts = {"error": _short(f"{type(e).__name__}: {e}", 200)}
        if facts:
            rec["facts"] = facts
        repeats = opts.repeats or (20 if info.platform == "gpu" else 5)
        rec["repeats"] = repeats
        try:
            timers.warm_up(compiled, arg_sets, opts.warmup)
            if no_cupti is None:
                rec.update(timers.kernel_per_call(compiled, arg_sets, repeats).as_dict("kernel"))
            rec.update(timers.wall_per_call(compiled, arg_sets, repeats).as_dict("wall"))
            rec["pipelined_ms"] = timers.wall_pipelined(compiled, arg_sets, opts.pipelined_calls).median
        except Exception as e:  # noqa: BLE001
            raise _Skip(*classify(e, "run"))
        rec["runtime_peak_bytes"] = memory.runtime_peak_bytes()
        _metrics(rec, cell, info)
    except _Skip as s:
        rec["status"], rec["reason"] = s.status, s.reason
    except Exception as e:  # noqa: BLE001 - a failing cell must never stop a sweep
        rec["status"], rec["reason"] = "runtime_error", _short(f"{type(e).__name__}: {e} | {traceback.format_exc(limit=2)}")
    return _finish(rec, t_start)


def _metrics(rec: dict, cell: Cell, info) -> None:
    """TFLOP/s, GB/s and % of peak from the record's headline time (kernel time where measured)."""
    t_ms = rec["kernel_ms"] if rec["kernel_ms"] is not None else rec["wall_ms"]
    if rec["kernel_ms"] is not None and rec["wall_ms"] is not None:
        rec["dispatch_ms"] = rec["wall_ms"] - rec["kernel_ms"]
    rec["tflops"] = rec["flops"] / (t_ms * 1e-3) / 1e12
    rec["gbps"] = rec["bytes"] / (t_ms * 1e-3) / 1e9
    pk = peaks.peak_tflops(info.kind, cell.dtype, tf32=default_matmul_is_tf32())
    rec["peak_tflops"] = pk
    rec["pct_peak"] = 100 * rec["tflops"] / pk if pk else None
    ceil = peaks.load_ceilings(info.kind)
    if ceil and cell.dtype in ("bfloat16", "float16"):
        rec["pct_ceiling"] = 100 * rec["tflops"] / ceil["matmul_tflops"]


def _measure_native(backend, cell: Cell, spec, sets, opts: Options, rec: dict, info) -> None:
    """A backend outside JAX (PyTorch): check its output on the same inputs, then its own timer."""
    q0, k0, v0 = sets[0]
    scale = 1.0 / math.sqrt(cell.head_dim)
    try:
        if opts.check:
            out_fn = lambda q, k, v: backend.output_numpy(q, k, v, spec, scale)  # noqa: E731
            chk = _check_forward(out_fn, q0, k0, v0, cell, backend=backend, jit=False)
            rec.update(rel_err=chk["rel_err"], max_abs_err=chk["max_abs_err"], tolerance=chk["rule"],
                       checked_rows=chk.get("checked_rows"))
            if not chk["ok"]:
                raise _Skip("incorrect", f"rel L2 {chk['rel_err']:.3g} over the limit ({chk['rule']})")
        repeats = opts.repeats or 20
        rec["repeats"] = repeats
        rec.update(backend.measure_native(spec, scale, sets, repeats, opts.warmup))
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001
        raise _Skip(*classify(e, "run"))
    _metrics(rec, cell, info)


def _finish(rec: dict, t_start: float) -> dict:
    if rec["status"] != "ok":
        for k_ in ("kernel_ms", "wall_ms", "pipelined_ms", "dispatch_ms", "tflops", "gbps", "pct_peak", "pct_ceiling"):
            rec[k_] = None
    rec["cell_s"] = time.perf_counter() - t_start
    rec["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec
