"""Which cells each measuring step of the lab times, and why: the lab sized to its questions.

Every timed cell costs a compile, a check and its timing (2-3 s on a GPU), so each step holds only
the cells its answer needs, and shares cells where it can: the sequence sweep runs at the default
shape's B, N and H, so the timing step's cells, the batch sweep's B = default, the head-dim sweep's
default H and TransformerEngine's XLA/cuDNN baselines are the same cells, measured once (the
sweep engine finds them in its folder). ``cells_note(step, cfg)`` says in the step's text which
cells ran and why. Pure: no JAX.
"""
from __future__ import annotations

from .core import LabConfig

#: The FP8 recipes the lab times (``attnlab bench`` times them all): per-tensor amax, the fused
#: Hadamard rotation and smoothed K: the baseline and the two fixes for outlier channels.
LAB_FP8_RECIPES = ("cudnn-fp8", "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk")


def perf_backends(cfg: LabConfig) -> list[str]:
    """The paths the performance steps compare: unfused XLA and the fused cuDNN kernel on a GPU;
    naive and XLA on a CPU (no fused kernel runs there). Naive is the same math as XLA on a GPU."""
    return ["xla", "cudnn"] if cfg.gpu else ["naive", "xla"]


def gqa_shape(cfg: LabConfig) -> dict:
    """The GQA step's shape: T = S, query heads N, the (variant, K) pairs, masked or not. Quick: the
    default shape unmasked, so MHA is the timing step's cell."""
    N = 32 if cfg.gpu and not cfg.quick else cfg.heads
    return {"T": cfg.long_len, "N": N, "causal": not cfg.quick,
            "variants": [("MHA", N), ("GQA", N // 4 if N >= 8 else max(1, N // 2)), ("MQA", 1)]}


def gqa_cells(cfg: LabConfig) -> list[tuple[str, list[int]]]:
    """[(backend, [K, ...])]: on a GPU the fused kernel at every K (its time should not grow with
    N/K) and XLA at MHA and GQA (its broadcast of K/V shows); on a CPU, XLA at every K."""
    ks = [K for _, K in gqa_shape(cfg)["variants"]]
    if not cfg.gpu:
        return [("xla", ks)]
    if cfg.quick:
        return [("cudnn", [ks[0], ks[-1]])]
    return [("cudnn", ks), ("xla", ks[:2])]


def fp8_seqs(cfg: LabConfig) -> list[int]:
    """T = S of the FP8 comparison: one length long enough for FP8's speed to show (H = 128, causal)."""
    return [4096] if cfg.gpu and not cfg.quick else [256]


def te_seqs(cfg: LabConfig) -> list[int]:
    """T = S of TransformerEngine's cells: two of the sequence sweep's lengths, at its shape, so XLA's
    and cuDNN's cells beside it are the sweep's (measured once)."""
    return cfg.seq_lens[-2:] if not cfg.quick else cfg.seq_lens[-1:]


def memory_seqs(cfg: LabConfig) -> list[int]:
    """T = S of the compiled-memory probe (compiled, never run): wide enough that the unfused paths'
    T² scores outgrow the device (predicted oom) while a fused kernel stays flat."""
    if cfg.gpu:
        return [256, 1024] if cfg.quick else [1024, 4096, 16384, 65536]
    return [32, 64] if cfg.quick else [128, 512, 2048]


def memory_backends(cfg: LabConfig) -> list[str]:
    return perf_backends(cfg)


def cells_note(step: str, cfg: LabConfig) -> str:
    """One sentence for the step's text: which cells it times here, and why those."""
    c = cfg
    be = " and ".join(perf_backends(c))
    notes = {
        "timing": f"Cells: {be} at the default shape only — the question is what a blocked call's time holds "
                  "at a small size, and these cells reappear in the sequence sweep.",
        "sweeps": f"Cells: {be} at T = {', '.join(map(str, c.seq_lens))} (enough to see the T² growth and where "
                  f"FLOP/s level off) and at B = {', '.join(map(str, c.batches))} "
                  f"(T = {c.batch_sweep_len}: does a larger batch fill the device?); the default shape's cells are "
                  "the timing step's.",
        "gqa": "Cells: " + "; ".join(f"{b} at K = {', '.join(map(str, ks))}" for b, ks in gqa_cells(c))
               + " — MHA against GQA/MQA at the same FLOPs.",
        "next": f"Cells: XLA at H = {', '.join(map(str, c.timed_head_dims))} (the default and the largest, which "
                "cuDNN refuses)" + (f", cuDNN at H = {c.head_dim}, 128 and 256 where it accepts them (256 is its largest)" if c.gpu and not c.quick else "")
                + f"; the memory table is compiled, never run, at T = {', '.join(map(str, memory_seqs(c)))}.",
        "te_fp8": f"Cells: TransformerEngine at T = {', '.join(map(str, te_seqs(c)))} (beside the sequence sweep's "
                  f"XLA and cuDNN cells), each FP8 path and bf16 cuDNN at T = {fp8_seqs(c)[0]}"
                  + ("" if c.quick else f", and the recipes {', '.join(LAB_FP8_RECIPES)} on outlier-channel inputs "
                                        "(where recipes differ; `attnlab bench` times all of them)") + ".",
    }
    return notes.get(step, "")
