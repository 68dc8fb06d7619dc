"""What every attention backend is: a name, an availability check, a capability check, a call."""
from __future__ import annotations

from ..spec import AttentionSpec, Prepared


def zero_padded_queries(out, p: Prepared):
    """jax.nn's rule: output rows t >= query_seq_lengths[b] are 0. ``out`` is (B, T, N, H)."""
    if p.q_lengths is None:
        return out
    import jax.numpy as jnp

    keep = jnp.arange(p.spec.q_len)[None, :] < jnp.asarray(p.q_lengths, jnp.int32)[:, None]
    return jnp.where(keep[:, :, None, None], out, 0).astype(out.dtype)


class Backend:
    """One attention implementation.

    Subclasses set ``name`` and ``description`` and implement ``run``. ``available``
    answers for this machine (library installed, right device); ``supports`` for one
    call. Both return ``None`` when fine, else a human reason (no backend name prefix).
    """

    name: str = ""
    description: str = ""
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

    def available(self) -> str | None:
        return None

    def supports(self, spec: AttentionSpec) -> str | None:
        return None

    def why_not(self, spec: AttentionSpec) -> str | None:
        """``available()``, the residual, then ``supports(spec)``: the first reason this backend cannot run."""
        why = self.available()
        if why is None and spec.return_residual and not self.residual:
            why = "return_residual=True: this backend returns no logsumexp residual"
        return why or self.supports(spec)

    def mode_reason(self, spec: AttentionSpec, mode: str) -> str | None:
        """Why this backend cannot run ``mode`` ("fwd", "fwd+bwd", "bwd") on ``spec``, or None."""
        if self.forward_only and mode != "fwd":
            return "forward only, no backward pass"
        return None

    def run(self, p: Prepared):
        """Compute attention on normalised 4-D inputs; returns (B, T, N, H).

        With ``p.spec.return_residual`` (backends with ``residual = True`` only) returns
        ``(out, lse)``: lse (B, T, N) in the inputs' dtype, the natural-log logsumexp of each row's
        scaled, biased, masked logits, carrying no gradient (as jax.nn's)."""
        raise NotImplementedError

    def version(self) -> str | None:
        """Version of the library behind this backend, if any."""
        return None

    def facts(self, fwd, q, k, v, fwd_as=None) -> dict | None:
        """What a sweep record should say about how this backend ran ``fwd(q, k, v)`` (e.g. whether
        FP8 engaged), measured on the compiled program; None when there is nothing to add.
        ``fwd_as(name)`` gives the same call on another backend, for comparisons."""
        return None

    def __repr__(self) -> str:
        return f"<attnlab backend {self.name!r}>"
