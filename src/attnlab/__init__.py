"""attnlab: which attention path should I use, is it correct, how fast is it, what does it cost?

Public API::

    attnlab.attention(q, k, v, ...)          # drop-in superset of jax.nn.dot_product_attention
    attnlab.explain(q, k, v, ...)            # which backend auto runs, and why not the others
    attnlab.reference_attention(q, k, v, ...)  # NumPy float64 truth
    attnlab.UnsupportedError                 # a forced backend that cannot run the input
    attnlab.Problem                          # one problem: B T S N K H dtype causal window
    attnlab.Workload                         # the Problem (its FLOP / byte model), by its old name
    attnlab.hlo_uses_cudnn(fn, *args)        # did cuDNN's fused attention really get lowered?
    attnlab.decode_attention(q, k_cache, v_cache, kv_lengths)  # T new tokens against a KV cache
    attnlab.reference_decode_attention(...)  # its NumPy float64 truth
    attnlab.check_decode_close(out, q, ...)  # its verdict (check_close's decode twin)
    attnlab.serving_attention(q, k_cache, v_cache, q_starts, kv_lengths)  # a serving step: ragged, mixed
    attnlab.serving_plan(q_starts, kv_lengths, ...)  # its kernel's plan, once per step, reused by layers
    attnlab.quantize_kv_cache(cache, "fp8")  # (FP8/int8 cache, float32 scales) for k_scale=/v_scale=
    attnlab.reference_serving_attention(...)  # its NumPy float64 truth
    attnlab.sharded_attention(q, k, v, mesh=..., strategy=...)  # batch / heads / ring over a Mesh

Every public name loads its submodule on first use (``sharded_attention`` and ``make_mesh``:
``attnlab.api.sharded``), so ``import attnlab`` stays cheap and imports no JAX: the lab's renderers
(``attnlab.lab.render``) run without it.
"""
from .core.names import lazy_getattr as _lazy_getattr

__version__ = "0.1.0"

__all__ = [
    "attention", "explain", "select", "Explanation", "Backend", "register", "hlo_uses_cudnn",
    "UnsupportedError", "OutputMismatchError", "reference_attention", "reference_attention_grads", "check_close", "rel_l2",
    "AttentionSpec", "Call", "Problem", "Workload", "__version__",
    "decode_attention", "explain_decode", "reference_decode_attention", "check_decode_close",
    "serving_attention", "explain_serving", "serving_plan", "reference_serving_attention", "sharded_attention", "make_mesh",
    "quantize_kv_cache",
]

#: Public names served lazily from submodules: name -> module (relative to attnlab).
_LAZY = {
    **dict.fromkeys(("Explanation", "attention", "explain", "select"), ".api.dot_product"),
    **dict.fromkeys(("Backend", "register"), ".backends"),
    "hlo_uses_cudnn": ".backends.cudnn",
    **dict.fromkeys(("decode_attention", "explain_decode"), ".api.decode"),
    **dict.fromkeys(("UnsupportedError", "OutputMismatchError"), ".core.errors"),
    **dict.fromkeys(("check_close", "reference_attention", "reference_attention_grads", "rel_l2"), ".reference.float64"),
    **dict.fromkeys(("reference_decode_attention", "check_decode_close"), ".reference.decode64"),
    **dict.fromkeys(("serving_attention", "explain_serving", "serving_plan"), ".api.serving"),
    "reference_serving_attention": ".reference.serving64",
    "quantize_kv_cache": ".core.kv_quant",
    "AttentionSpec": ".core.prepare",
    "Call": ".core.call",
    "Workload": ".core.workload",
    "Problem": ".core.problem",
    "sharded_attention": ".api.sharded", "make_mesh": ".api.sharded",
}


__getattr__ = _lazy_getattr(__name__, _LAZY)


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
