"""What one decode program asks of the GPU: SM count, shared memory, resident programs per SM.

The plan (``kernels.decode_plan``) clamps the pipeline depth to what fits one program's shared
memory (``fit_stages``) and sizes the split count from the slots the GPU holds
(``sm_count() x programs_per_sm``).

SM count: ``sm_count()``: the device's ``core_count`` where jaxlib exposes it, else a table by
device kind (132 for H100/H200/GH200 SXM, 108 for A100, ...), else 108; on the CPU (interpret
mode, which runs programs one after another) 8, to keep the grid small.
"""
from __future__ import annotations

import math

#: SMs by device kind (substring match, first hit wins). Used when the device has no core_count.
SM_COUNTS = (("H100 PCIe", 114), ("H100", 132), ("H200", 132), ("H800", 132), ("GH200", 132),
             ("B200", 148), ("B300", 148), ("A100", 108), ("A800", 108), ("A10", 72), ("A30", 56),
             ("L40", 142), ("L4", 58), ("RTX 4090", 128))
DEFAULT_SM_COUNT = 108
CPU_SM_COUNT = 8


def sm_count(device=None) -> int:
    """Streaming multiprocessors of ``device`` (default: JAX's first device); see the docstring."""
    import jax  # heavy: jax, the planner imports no JAX

    d = device if device is not None else jax.devices()[0]
    if d.platform != "gpu":
        return CPU_SM_COUNT
    n = getattr(d, "core_count", None)
    if isinstance(n, int) and n > 0:
        return n
    kind = str(getattr(d, "device_kind", ""))
    for name, count in SM_COUNTS:
        if name in kind:
            return count
    return DEFAULT_SM_COUNT


SMEM_PER_SM = 228 * 1024     # Hopper; Ampere A100 has 164 KB (only lowers the estimate's occupancy)
REGS_PER_SM = 65536
#: Shared memory one program (CTA) may opt into: 227 KB on Hopper (sm_90), 163 KB on A100 (sm_80),
#: 99 KB on other sm_8x parts (CUDA programming guide, "Features and Technical Specifications").
SMEM_PER_BLOCK = {(9, 0): 227 * 1024, (8, 0): 163 * 1024}
SMEM_PER_BLOCK_OTHER_SM8X = 99 * 1024
#: ``smem_bytes`` under-counts what Triton 3.6 allocates by up to ~14% (measured on the H200: block_k=128,
#: H=128, 4 stages estimated 245760 B, allocated 278528 B): plans keep this margin below the limit.
SMEM_SLACK = 1.15


def smem_bytes(block_r: int, block_k: int, head_dim: int, num_stages: int, itemsize: int = 2) -> int:
    """Shared memory of one program: (stages - 1) K and V blocks in flight, q, P (within ~15% of
    what Triton 3.6 allocates for this kernel on sm_90; ``benchmarks/decode/ttir_cpu.py``)."""
    return (max(1, num_stages - 1) * 2 * block_k * head_dim + 2 * block_r * head_dim + block_r * block_k) * itemsize


def smem_limit(compute_capability=None) -> int:
    """Bytes of shared memory one program may use on this compute capability (None: Hopper)."""
    cc = tuple(compute_capability) if compute_capability is not None else (9, 0)
    if cc >= (9, 0):
        return SMEM_PER_BLOCK[(9, 0)]
    return SMEM_PER_BLOCK.get(cc, SMEM_PER_BLOCK_OTHER_SM8X)


def fit_stages(block_r: int, block_k: int, head_dim: int, num_stages: int, itemsize: int = 2,
               compute_capability=None) -> int:
    """The deepest pipeline <= ``num_stages`` whose shared memory (with ``SMEM_SLACK``) fits one program.

    Raises ValueError when even 2 stages do not fit (block_k or block_r too large for this head dim)."""
    limit = smem_limit(compute_capability)
    stages = num_stages
    while stages > 2 and smem_bytes(block_r, block_k, head_dim, stages, itemsize) * SMEM_SLACK > limit:
        stages -= 1
    need = smem_bytes(block_r, block_k, head_dim, stages, itemsize) * SMEM_SLACK
    if need > limit:
        raise ValueError(f"block_r={block_r}, block_k={block_k} at head dim {head_dim} need ~{int(need)} B of shared "
                         f"memory with {stages} stages > {limit} B per program: use a smaller block_k or block_r")
    return stages


def programs_per_sm(block_r: int, block_k: int, head_dim: int, num_warps: int, num_stages: int,
                    itemsize: int = 2) -> int:
    """Estimated resident programs per SM, from shared memory and registers (fitted to ptxas on sm_90:
    ~60 + 1.25 x the float32 acc + scores elements a thread holds)."""
    by_smem = SMEM_PER_SM // (smem_bytes(block_r, block_k, head_dim, num_stages, itemsize) + 1024)
    threads = 32 * num_warps
    regs = 60 + 1.25 * block_r * (head_dim + block_k) / threads
    regs = min(255, 8 * math.ceil(regs / 8))
    by_regs = REGS_PER_SM // (regs * threads)
    return max(1, min(by_smem, by_regs, 64 // num_warps))

