"""Register-level pieces of the Mosaic GPU decode kernel (``kernels.decode_mgpu``): the WGMMA register layouts
(or plain arrays in JAX's GPU interpreter, which knows none), and the zeroing of a K/V block's rows outside the
valid keys in shared memory."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ROW_PIECE = 64      # rows of one zeroing piece: the WGMMA register layout's row multiple


def gpu_interpreter():
    """JAX's GPU interpret mode: threads, barriers, TMA and shared memory simulated on the CPU (JAX-private)."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # JAX-private: may move between releases

    return InterpretGPUParams()


def register_ops(interpret: bool):
    """(layout_cast, iota, load): ``iota(dim, shape, reduced=False)`` int32 in the WGMMA layout (``reduced``: a
    (rows,) vector in the layout of a tile's row maxima), ``load(ref)`` a shared-memory tile into registers."""
    if interpret:
        def plain_iota(dim, shape, reduced=False):
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return (lambda x, layout: x), plain_iota, (lambda ref: ref[...])

    def iota(dim, shape, reduced=False):
        layout = plgpu.Layout.WGMMA.reduce(1) if reduced else plgpu.Layout.WGMMA
        return plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=layout)
    return plgpu.layout_cast, iota, (lambda ref: plgpu.load(ref, (), layout=plgpu.Layout.WGMMA))


def zero_rows_outside(block_ref, start, lo, length, *, iota, load):
    """Zero the rows of ``block_ref`` (block_kv, H) in shared memory whose keys ``start + row`` lie outside
    [lo, length) (traced int32 scalars), in the 64-row pieces that hold any; then fence them for the wgmma.

    Why: a masked key's P is 0, but 0 * NaN = NaN in P.V, and a cache's unused slots (or the page a -1
    table slot reads) may hold any bits. Two warpgroups may zero one block at once: they write the same
    values (every row its own value or 0), so they need no barrier between them."""
    block_kv, H = block_ref.shape
    for r0 in range(0, block_kv, ROW_PIECE):
        @pl.when((start + r0 < lo) | (start + r0 + ROW_PIECE > length))
        def _(r0=r0):
            rows = block_ref.at[pl.ds(r0, ROW_PIECE)]
            pos = iota(0, (ROW_PIECE,), reduced=True) + (start + r0)
            keep = lax.broadcast_in_dim((pos >= lo) & (pos < length), (ROW_PIECE, H), [0])
            vals = load(rows)
            rows[...] = jnp.where(keep, vals, jnp.zeros_like(vals))
            plgpu.commit_smem()     # the stores (generic proxy) before the wgmma (async proxy) reads the block
