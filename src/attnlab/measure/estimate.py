"""How long and how much memory a cell will take here, before it runs (``attnlab bench`` prints it;
``Options.cell_budget_s`` refuses a cell whose estimate is above it: ``over_budget``).

A deliberately rough, conservative model from the cell's FLOPs and bytes (``attnlab.core.workload``):

- one call of the kernel: max(FLOPs / throughput, bytes / bandwidth). On a GPU the throughput is
  ``GPU_EFFICIENCY`` of the datasheet peak of the dtype (``attnlab.measure.peaks``); on a CPU it is
  a quarter of the measured matmul ceiling (``attnlab ceilings``) where one was measured, else
  ``CPU_GFLOPS``, a throughput a small shared CPU reaches.
- timed calls: warm-up (one per input set), ``repeats`` (at least ``min_time_s`` on a wall clock)
  and 3 rounds of pipelined calls (``timers.pipelined_calls``).
- the check: the float32 reference and its emulation over the whole (dense: the reference skips no
  masked tile) problem, gradients too for fwd+bwd / bwd cells, at the fp32 throughput; the float64
  rows at half the rate NumPy float64 reaches here (``calibration.float64_gflops``: now, or as stored
  with ``check_x``), at least ``NUMPY_GFLOPS`` (what a slow shared 2-core CPU reaches; rows of less
  than ``NUMPY_PROBE_FLOPS`` at that, measuring nothing); all of it times ``check_x``, what the
  first checked cell of a sweep measured over this estimate where it was faster
  (``attnlab.measure.calibration``).
- compiles: the kernel's, and what is compiled once per problem (the inputs' and the check's
  reference programs), in seconds measured on this machine and scaled to its load now
  (``attnlab.measure.calibration``: the first compile of a sweep, stored for the next), twice for a
  cell with gradients. A sweep compiles a problem's programs once, for all its backends
  (``estimate_sweep`` counts them once); a cell whose backend is not available here costs nothing
  (it is recorded unsupported at once).

Memory: the input sets, the cotangents, the references' outputs and one tile of their scores.
"""
from __future__ import annotations

import dataclasses
import json

from .. import backends
from ..core.problem import BWD_FLOP_FACTOR
from ..reference.blockwise import TILE_BUDGET
from . import calibration, peaks, timers

GPU_EFFICIENCY = 0.25
CPU_GFLOPS = {"fp32": 10.0, "tf32": 10.0, "bf16": 8.0, "fp8": 1.0}   # a 2-core CPU under load: 9-18 f32
CPU_FLOAT64_GFLOPS = 5.0
CPU_GBPS = 5.0
#: of ``calibration.float64_gflops()``, the rate the float64 rows are estimated at (conservative)
NUMPY_SHARE = 0.5
#: float64 rows of fewer FLOPs are estimated at ``NUMPY_GFLOPS``: under 0.05 s there, not worth a probe
NUMPY_GFLOPS, NUMPY_PROBE_FLOPS = 1.0, 5e7
#: rows of the float64 check: first, last and 2 interior tiles of 64 rows, up to 3 batch elements
F64_ROWS, F64_BATCH = 4 * 64, 3


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds: float        # the whole cell
    call_s: float         # one call of the kernel
    calls: int            # calls the timing makes
    check_s: float        # the check's arithmetic (times the learnt ``check_x``)
    compile_s: float      # the kernel's compile
    bytes: int            # device memory the cell holds at its peak, roughly
    problem_s: float = 0.0   # compiling the inputs' and the check's programs (once per problem in a sweep)
    check_compute_s: float = 0.0   # the check's arithmetic as estimated, before ``check_x``

    def text(self) -> str:
        once = f", inputs and references ~{self.problem_s:.2g} s" if self.problem_s else ""
        return (f"~{self.seconds:.3g} s (compile ~{self.compile_s:.2g} s{once}, check ~{self.check_s:.3g} s, "
                f"{self.calls} timed calls of ~{_ms(self.call_s)}), ~{self.bytes / 2**20:.4g} MiB")


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 10 else f"{s:.3g} s"


def throughput(info, dtype: str) -> tuple[float, float]:
    """(FLOP/s, bytes/s) a kernel of ``dtype`` reaches here, conservatively."""
    cls = peaks.dtype_class(dtype)
    if info.platform == "gpu":
        sheet = peaks.peak_for_kind(info.kind)
        pk = (sheet.tflops.get(cls) or sheet.tflops.get("fp32")) if sheet else (100.0 if cls == "bf16" else 20.0)
        return GPU_EFFICIENCY * pk * 1e12, GPU_EFFICIENCY * (sheet.hbm_tbps if sheet else 1.0) * 1e12
    ceil = peaks.load_ceilings(info.kind) if info.platform == "cpu" else None
    if ceil and ceil.get("matmul_tflops") and cls == "fp32":
        return 0.25 * ceil["matmul_tflops"] * 1e12, CPU_GBPS * 1e9
    gflops = CPU_FLOAT64_GFLOPS if dtype == "float64" else CPU_GFLOPS.get(cls, 1.0)
    return gflops * 1e9, CPU_GBPS * 1e9


def float64_rate(rows_flops: float, cal: calibration.Calibration | None = None) -> float:
    """FLOP/s the check's float64 rows of ``rows_flops`` are estimated at here (see the module doc):
    at the rate stored with ``cal`` where its ``check_x`` was learnt with one, else measured now."""
    if rows_flops < NUMPY_PROBE_FLOPS:
        return NUMPY_GFLOPS * 1e9
    rate = cal.float64_gflops if cal is not None and cal.float64_gflops else calibration.float64_gflops()
    return max(NUMPY_GFLOPS, NUMPY_SHARE * rate) * 1e9


def estimate_cell(cell, opts, info) -> Estimate:
    """The estimate of ``measure_cell(cell, opts)`` on the device ``info`` (``attnlab.core.device.current()``)."""
    flops, nbytes = throughput(info, cell.dtype)         # the rates first, then the problem's counts
    ref_flops, _ = throughput(info, "float64" if cell.dtype == "float64" else "float32")
    w = cell.workload
    work_flops, work_bytes, fwd_bytes = w.flops(cell.mode), w.bytes(cell.mode), w.bytes("fwd")
    tokens = w.new_tokens() if w.decode else w.batch * w.q_len    # query rows (a serving step's are packed)
    qkv = fwd_bytes - tokens * w.heads * w.head_dim * w.itemsize
    grads = cell.mode != "fwd"
    call_s = max(work_flops / flops, work_bytes / nbytes) + 1e-4
    sheet = peaks.peak_for_kind(info.kind)     # the input sets rotated past the L2 cache, as ``measure.inputs`` draws
    n_sets = opts.input_sets(qkv, sheet and sheet.l2_bytes)
    repeats = opts.repeats or (20 if info.platform == "gpu" else 5)
    timed_s = repeats * call_s if info.platform == "gpu" else max(repeats * call_s, opts.min_time_s)
    pipe = timers.pipelined_calls(call_s * 1e3, opts.pipelined_calls, opts.pipelined_s)
    calls = max(opts.warmup, n_sets) + repeats + 3 * pipe
    timing_s = (max(opts.warmup, n_sets) + 3 * pipe) * call_s + timed_s
    dense = 4.0 * tokens * w.kv_len * w.heads * w.head_dim        # the reference masks, skips nothing
    cal = calibration.current(info)
    compile_x = calibration.GRAD_FACTOR if grads else 1.0
    check_s = 0.0
    problem_s = cal.problem_s * compile_x * (1.0 if opts.check else 0.3)   # without the check: the inputs alone
    if opts.check:
        ref = 2 * dense * (1 + (1 + BWD_FLOP_FACTOR if grads else 0)) / ref_flops
        rows = 4.0 * min(F64_ROWS, w.q_len) * min(F64_BATCH, w.batch) * w.kv_len * w.heads * w.head_dim
        check_s = ref + rows / float64_rate(rows, cal) + (3 if grads else 1) * call_s
    compile_s = cal.compile_s * compile_x
    out32 = 4 * tokens * w.heads * w.head_dim
    mem = n_sets * (qkv + (out32 if grads else 0)) + (2 + (6 if grads else 0)) * out32
    if opts.check:
        mem += min(TILE_BUDGET.get(info.platform, TILE_BUDGET["cpu"]), 4 * w.batch * w.heads * w.q_len * w.kv_len)
    return Estimate(seconds=compile_s + problem_s + check_s * cal.check_x + timing_s, call_s=call_s, calls=calls,
                    check_s=check_s * cal.check_x, compile_s=compile_s, bytes=int(mem), problem_s=problem_s,
                    check_compute_s=check_s)


def over_budget(cell, opts, info) -> tuple[float | None, str | None]:
    """(the cell's estimated seconds, why it is over ``opts.cell_budget_s`` or None): ``measure_cell`` records
    both (``estimate_s``, an ``over_budget`` cell's reason); the compile ahead and a sweep's summary ask it too.
    (None, None) without a budget."""
    if opts is None or not opts.cell_budget_s:
        return None, None
    est = estimate_cell(cell, opts, info)
    if est.seconds <= opts.cell_budget_s:
        return est.seconds, None
    return est.seconds, (f"estimated {est.text()} on {info.kind or info.platform}: more than the cell budget of "
                         f"{opts.cell_budget_s:g} s (--cell-budget); not run")


def check_compute_s(cell, opts, info) -> float:
    """A cell's estimated check arithmetic (what is not compiling) before the learnt ``check_x``:
    ``calibration.learn`` compares a measured ``check_s`` with it."""
    return estimate_cell(cell, opts, info).check_compute_s


def _problem_key(cell) -> str:
    """What the inputs' and the check's programs are compiled for: the cell without its backend and inputs."""
    return json.dumps({k: v for k, v in cell.identity().items() if k not in ("backend", "inputs")}, sort_keys=True)


def estimate_sweep(cells, opts, info) -> list[Estimate]:
    """Each cell's estimate inside a sweep of ``cells`` (in order), in wall seconds: the programs
    compiled once per problem counted at its first cell only; with ``opts.compile_ahead`` a kernel's
    compile only where it outlasts the previous cell's inputs and check, beside which it runs
    (``attnlab.measure.ahead``; the timing waits for it); a cell whose backend is not available here ~0 s."""
    seen, out, beside = set(), [], 0.0
    for c in cells:
        e = estimate_cell(c, opts, info)
        try:
            unavailable = backends.get(c.backend).available()
        except ValueError as err:
            unavailable = str(err)
        if unavailable:
            out.append(dataclasses.replace(e, seconds=0.0, call_s=0.0, calls=0, check_s=0.0, compile_s=0.0, problem_s=0.0))
            beside = 0.0   # recorded at once: nothing for the next cell's compile to run beside
            continue
        if _problem_key(c) in seen:
            e = dataclasses.replace(e, seconds=e.seconds - e.problem_s, problem_s=0.0)
        seen.add(_problem_key(c))
        if opts.compile_ahead:
            e = dataclasses.replace(e, seconds=e.seconds - min(e.compile_s, beside))
        beside = e.problem_s + e.check_s
        out.append(e)
    return out
