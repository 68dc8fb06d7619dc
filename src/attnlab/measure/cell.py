"""Measure one sweep cell: check it against the references, then time it, and return one record.

A cell is one (backend, shape, dtype, mask, mode). Its record (schema: ``attnlab.records``) has a
``status``: ``ok`` (whole output and gradients checked, then timed), ``unchecked`` (timed with the
check off), or ``incorrect``, ``unsupported``, ``oom``, ``compile_error``, ``runtime_error``,
``over_budget`` with ``reason`` saying why. An incorrect cell is never timed.
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
from ..inputs import _normal, random_qkv
from ..reference import default_matmul_is_tf32
from ..spec import prepare
from ..workload import Workload
from ..records import SCHEMA_VERSION, STATUSES  # noqa: F401  (STATUSES re-exported)
from . import check, memory, peaks, timers
from .native import measure_native

MODES = ("fwd", "fwd+bwd", "bwd")
IDENTITY = ("backend", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "dtype", "causal", "window", "mode",
            "devices", "strategy", "lengths")
IDENTITY_DEFAULTS = {"devices": 1, "strategy": None, "lengths": None}
#: Decode cells (``lengths`` set): the q_len queries are the last tokens of each sequence of the cache.
LENGTHS = ("full", "ragged")


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
    lengths: str | None = None       # None: attention(); "full"/"ragged": decode_attention() on a cache

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.lengths is not None:
            if self.lengths not in LENGTHS:
                raise ValueError(f"lengths must be None or one of {LENGTHS}, got {self.lengths!r}")
            if self.q_len > self.kv_len or self.window is not None or self.strategy is not None:
                raise ValueError("decode cells (lengths) need q_len <= kv_len, no window and no strategy")
        if self.strategy is not None:
            from ..sharded import STRATEGIES

            if self.strategy not in STRATEGIES:
                raise ValueError(f"strategy must be None or one of {STRATEGIES}, got {self.strategy!r}")
        elif self.devices != 1:
            raise ValueError("devices > 1 needs a strategy (batch, heads or ring)")

    def kv_lengths(self) -> tuple[int, ...] | None:
        """Decode cells: each sequence's valid cache length (the q_len new tokens included).

        "full": every sequence fills the cache (S). "ragged": lengths drawn uniformly from [T, S]
        with a seed fixed by the shape, so every backend and every run sees the same batch."""
        if self.lengths is None:
            return None
        if self.lengths == "full":
            return (self.kv_len,) * self.batch
        rng = np.random.default_rng(check.seed_of(f"ragged B{self.batch} T{self.q_len} S{self.kv_len}"))
        return tuple(int(x) for x in rng.integers(self.q_len, self.kv_len + 1, size=self.batch))

    @property
    def workload(self) -> Workload:
        return Workload(self.batch, self.q_len, self.kv_len, self.heads, self.kv_heads, self.head_dim,
                        self.dtype, self.causal, self.window, kv_lengths=self.kv_lengths(),
                        decode=self.lengths is not None)

    def identity(self) -> dict:
        d = {k: getattr(self, k) for k in IDENTITY}
        d["window"] = list(self.window) if self.window else None
        return d

    def key(self) -> str:
        return json.dumps(self.identity(), sort_keys=True)

    @property
    def config_label(self) -> str:
        mesh = f" {self.strategy}x{self.devices}" if self.strategy else ""
        dec = f" decode-{self.lengths}" if self.lengths else ""
        return f"{self.workload.label}{dec} {self.mode}{mesh}"


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
    min_time_s: float = 0.1             # wall-clock timing (no CUPTI): keep sampling at least this long


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
    """Run fn() in a daemon thread; (result, None) or raise; _Skip('over_budget') past the budget.

    JAX's config contexts are thread-local: the caller's x64 setting (on for float64 cells) is
    carried into the thread, or the thread would trace float64 inputs as float32."""
    if not budget_s:
        return fn()
    box: dict = {}
    x64 = bool(jax.config.jax_enable_x64)

    def target():
        try:
            with jax.enable_x64(x64):
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

    if cell.lengths is not None:
        import attnlab

        lens = jnp.asarray(cell.kv_lengths(), jnp.int32)

        def fwd(q, k, v):
            return attnlab.decode_attention(q, k, v, lens, causal=cell.causal, implementation=cell.backend)
    elif cell.strategy is None:
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


def ref_key(cell: Cell, seed: int) -> str:
    """The identity of a cell's problem and inputs: every backend and mode of it shares references."""
    ident = {k: v for k, v in cell.identity().items() if k not in ("backend", "mode")}
    return json.dumps({**ident, "seed": seed}, sort_keys=True)


def semantics(cell: Cell) -> check.Semantics:
    lens = cell.kv_lengths()
    if lens is None:
        return check.Semantics(causal=cell.causal, window=cell.window)
    return check.Semantics(causal=cell.causal, kv_lengths=lens, q_offsets=tuple(n - cell.q_len for n in lens))


#: Fields every cell record has (None until measured); see ``attnlab.records`` for the schema.
MEASURED_FIELDS = ("kernel_ms", "wall_ms", "pipelined_ms", "dispatch_ms", "compile_s", "lower_s", "tflops", "gbps",
                   "pct_peak", "pct_ceiling", "rel_err", "max_abs_err", "temp_bytes", "peak_bytes", "process_peak_bytes",
                   "checked_fraction", "grad_check")
TIMING_FIELDS = ("kernel_ms", "wall_ms", "pipelined_ms", "dispatch_ms", "tflops", "gbps", "pct_peak", "pct_ceiling",
                 "pct_bandwidth", "roofline_ms", "pct_roofline")


def measure_cell(cell: Cell, opts: Options | None = None) -> dict:
    """Check then time one cell; always returns a record (never raises for a failing cell).

    The whole forward output (and for fwd+bwd / bwd cells every gradient) is checked before any
    timing (``attnlab.measure.check``); an incorrect cell is never timed.

    float64 cells run inside ``jax.enable_x64(True)`` (inputs, compilation, check and timing), so
    their arrays really are float64 whatever the process's x64 setting; the setting is restored
    afterwards. A cell whose inputs or output still come out in another dtype is never timed under
    its label (``unsupported`` / ``incorrect``, saying which dtype JAX produced)."""
    if cell.dtype == "float64" and not jax.config.jax_enable_x64:
        with jax.enable_x64(True):
            return _measure_cell(cell, opts)
    return _measure_cell(cell, opts)


def _measure_cell(cell: Cell, opts: Options | None) -> dict:
    opts = opts or Options()
    info = device.current()
    rec: dict = {"schema": SCHEMA_VERSION, **cell.identity(), "status": "ok", "reason": None}
    w = cell.workload
    rec.update(flops=w.flops(cell.mode), bytes=w.bytes(cell.mode), intensity=w.intensity(cell.mode))
    rec.update({k_: None for k_ in MEASURED_FIELDS})
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
        if np.dtype(q0.dtype).name != cell.dtype:
            raise _Skip("unsupported", f"dtype {cell.dtype}: JAX made {np.dtype(q0.dtype).name} inputs "
                                       f"(jax_enable_x64={jax.config.jax_enable_x64}); not run under a wrong label")
        spec = prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window).spec
        # decode cells: the backend's refusal comes from decode_attention itself when it is traced
        why = backend.why_not(spec) if cell.lengths is None else backend.available()
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
            if cell.lengths is not None and not getattr(backend, "decode", False):
                raise _Skip("unsupported", f"{cell.backend}: no decode (cache) semantics")
            _measure_native(backend, cell, spec, sets, opts, rec, info)
            return _finish(rec, t_start)
        fwd, timed, make_args = _functions(cell)
        cts = [_normal(jax.random.key(opts.seed + 100 + i), q.shape) if cell.mode != "fwd" else None  # fwd: unused
               for i, (q, _, _) in enumerate(sets)]
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
                out = compiled(*arg_sets[0]) if cell.mode == "fwd" else jax.jit(fwd)(q0, k0, v0)
                _check_into(rec, out, sets[0], cell, backend, opts)
                if cell.mode != "fwd":
                    grads = compiled(*arg_sets[0])
                    _check_grads_into(rec, grads, sets[0], cts[0], cell, opts)
            except _Skip:
                raise
            except Exception as e:  # noqa: BLE001
                raise _Skip(*classify(e, "run"))
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
            rec.update(timers.wall_per_call(compiled, arg_sets, repeats,
                                            min_time_s=opts.min_time_s if no_cupti is not None else 0.0).as_dict("wall"))
            rec["pipelined_ms"] = timers.wall_pipelined(compiled, arg_sets, opts.pipelined_calls).median
        except Exception as e:  # noqa: BLE001
            raise _Skip(*classify(e, "run"))
        rec["process_peak_bytes"] = memory.process_peak_bytes()
        _metrics(rec, cell, info, backend)
        if not opts.check:
            rec["status"] = "unchecked"
    except _Skip as s:
        rec["status"], rec["reason"] = s.status, s.reason
    except Exception as e:  # noqa: BLE001 - a failing cell must never stop a sweep
        rec["status"], rec["reason"] = "runtime_error", _short(f"{type(e).__name__}: {e} | {traceback.format_exc(limit=2)}")
    return _finish(rec, t_start)


def _check_into(rec: dict, out, inputs, cell: Cell, backend, opts: Options) -> None:
    """Check the whole forward output; record it; raise _Skip('incorrect') when it fails."""
    q, k, v = inputs
    rec["out_dtype"] = np.dtype(out.dtype).name
    if rec["out_dtype"] != cell.dtype:
        raise _Skip("incorrect", f"output dtype {rec['out_dtype']} is not the cell's dtype {cell.dtype}")
    chk = check.check_forward(check.device_array(out), q, k, v, semantics(cell), ref_key=ref_key(cell, opts.seed),
                              fixed_limit=backend.rel_l2_limit, fixed_rule=backend.rel_l2_rule)
    ok, why = chk.pop("ok"), chk.pop("reason")
    rec.update(chk)
    if not ok:
        raise _Skip("incorrect", f"output wrong: {why} ({chk['tolerance']})")


def _check_grads_into(rec: dict, grads, inputs, ct, cell: Cell, opts: Options) -> None:
    q, k, v = inputs
    chk = check.check_grads(grads, q, k, v, ct.astype(q.dtype), semantics(cell), ref_key=ref_key(cell, opts.seed))
    why = chk.pop("grad_reason")
    rec.update(chk)
    if chk["grad_check"] != "ok":
        raise _Skip("incorrect", why)


def _metrics(rec: dict, cell: Cell, info, backend=None) -> None:
    """TFLOP/s, GB/s and % of peak from the record's headline time (kernel time where measured).

    The peak is the one of the dtype the backend computes in (``Backend.compute_dtype``, e.g. FP8)."""
    t_ms = rec["kernel_ms"] if rec["kernel_ms"] is not None else rec["wall_ms"]
    if rec["kernel_ms"] is not None and rec["wall_ms"] is not None:
        rec["dispatch_ms"] = rec["wall_ms"] - rec["kernel_ms"]
    rec["tflops"] = rec["flops"] / (t_ms * 1e-3) / 1e12
    rec["gbps"] = rec["bytes"] / (t_ms * 1e-3) / 1e9
    peak_dtype = getattr(backend, "compute_dtype", None) or cell.dtype
    pk = peaks.peak_tflops(info.kind, peak_dtype, tf32=default_matmul_is_tf32())
    rec["peak_dtype"] = peaks.dtype_class(peak_dtype, default_matmul_is_tf32())
    rec["peak_tflops"] = pk
    rec["pct_peak"] = 100 * rec["tflops"] / pk if pk else None
    sheet = peaks.peak_for_kind(info.kind)
    if sheet and pk:
        # the roofline bound of this cell: max(bytes / HBM bandwidth, FLOPs / compute peak)
        rec["pct_bandwidth"] = 100 * rec["gbps"] / (sheet.hbm_tbps * 1e3)
        rec["roofline_ms"] = max(rec["bytes"] / (sheet.hbm_tbps * 1e12), rec["flops"] / (pk * 1e12)) * 1e3
        rec["pct_roofline"] = 100 * rec["roofline_ms"] / t_ms
    ceil = peaks.load_ceilings(info.kind)
    if ceil and cell.dtype in ("bfloat16", "float16"):
        rec["pct_ceiling"] = 100 * rec["tflops"] / ceil["matmul_tflops"]


def _measure_native(backend, cell: Cell, spec, sets, opts: Options, rec: dict, info) -> None:
    """A backend outside JAX (PyTorch): check its whole output on the same inputs, then time it
    with the backend's own hook (CUPTI where it works, said in ``timer``)."""
    q0, k0, v0 = sets[0]
    scale = 1.0 / math.sqrt(cell.head_dim)
    decode = None
    if cell.lengths is not None:
        why = backend.supports(spec) or backend.decode_reason(cell.kv_lengths(), cell.q_len, cell.kv_len)
        if why:
            raise _Skip("unsupported", f"{cell.backend}: {why}")
        decode = (cell.kv_lengths(), cell.causal)
    try:
        if opts.check:
            if decode is None:
                out = backend.run(prepare(q0, k0, v0, is_causal=cell.causal, local_window_size=cell.window))
            else:
                out = backend.run_decode(q0, k0, v0, spec, scale, *decode)
            _check_into(rec, out, sets[0], cell, backend, opts)
        repeats = opts.repeats or 20
        rec["repeats"] = repeats
        rec.update(measure_native(backend, spec, scale, sets, repeats, opts.warmup, decode=decode))
        rec["process_peak_bytes"] = memory.process_peak_bytes()
        if not opts.check:
            rec["status"] = "unchecked"
    except _Skip:
        raise
    except Exception as e:  # noqa: BLE001
        raise _Skip(*classify(e, "run"))
    _metrics(rec, cell, info, backend)


def _finish(rec: dict, t_start: float) -> dict:
    if rec["status"] not in ("ok", "unchecked"):
        for k_ in TIMING_FIELDS:
            rec[k_] = None
        for k_ in [k for k in rec if k.startswith(("kernel_", "wall_"))]:
            rec[k_] = None
    rec["cell_s"] = time.perf_counter() - t_start
    rec["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec
