"""The per-request lengths a server's batch has: the distributions the serving benchmarks and the sweeps draw.

A decode batch of B requests, each with T new tokens, against caches of at most S tokens; request b's
KV length counts its new tokens, so every length lies in [T, S]:

- ``uniform``: every request at S (the equal-length batch of the decode grids);
- ``spread``: uniform integers in [T, S];
- ``lognormal``: exp(Normal(log 2048, 1.2)), many short and a few long (a chat server's mix);
- ``one-long``: request 0 at S, the others at S / 32;
- ``file:PATH``: the lengths in a text file (whitespace-separated ints, one KV length per request; the batch
  takes the first B, repeating the file when it has fewer). A sweep pins it to its contents
  (``file:PATH@DIGEST``, ``pin_file``): a cell of other lengths is another cell, and a changed file is refused.

Every draw is clipped to [T, S] (``draw``). A mixed batch (``mixed_batch``) puts ``chunks`` prefill chunks of
``chunk`` tokens (each at a KV length uniform in [chunk, S]) before the decodes. The distributions are
the ones the H200 serving measurements used (``benchmarks/serving/gpu.py`` imports them from here).
"""
from __future__ import annotations

import hashlib
import re

import numpy as np

#: The named distributions (``file:PATH`` is the fifth kind).
DISTRIBUTIONS = ("uniform", "spread", "lognormal", "one-long")
_CHUNKS = re.compile(r"^(\d+)x(\d+)$")
#: ``file:PATH@DIGEST``: the first 12 hex digits of the file's sha256.
_PINNED = re.compile(r"^(.+)@([0-9a-f]{12})$")


def is_distribution(name) -> bool:
    """``name`` is a request-length distribution: one of ``DISTRIBUTIONS`` or ``file:PATH``."""
    return isinstance(name, str) and (name in DISTRIBUTIONS or (name.startswith("file:") and len(name) > 5))


def draw(dist: str, batch: int, q_len: int, s_max: int, rng: np.random.Generator) -> np.ndarray:
    """(B,) int32 KV lengths of ``dist`` (see the module docstring), each in [T, S]; ValueError naming ``dist``."""
    if dist == "uniform":
        n = np.full(batch, s_max)
    elif dist == "spread":
        n = rng.integers(q_len, s_max + 1, batch)
    elif dist == "lognormal":
        n = np.exp(rng.normal(np.log(2048), 1.2, batch)).astype(np.int64)
    elif dist == "one-long":
        n = np.full(batch, s_max // 32)
        n[0] = s_max
    elif is_distribution(dist):
        n = np.resize(read_lengths(*_file_parts(dist)), batch)
    else:
        raise ValueError(f"lengths must be one of {', '.join(DISTRIBUTIONS)} or file:PATH, got {dist!r}")
    return np.clip(n, q_len, s_max).astype(np.int32)


def _file_parts(dist: str) -> tuple[str, str | None]:
    """(path, digest or None) of ``file:PATH`` / ``file:PATH@DIGEST``."""
    m = _PINNED.match(dist[5:])
    return (m.group(1), m.group(2)) if m else (dist[5:], None)


def pin_file(dist: str) -> str:
    """``file:PATH`` as ``file:PATH@DIGEST``, the file read and checked (``read_lengths``); a pinned one checked
    against its file. ValueError naming the file."""
    path, digest = _file_parts(dist)
    with open(path, "rb") as f:
        data = f.read()
    _lengths_of(path, data, digest)
    return f"file:{path}@{_digest(data)}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def read_lengths(path: str, digest: str | None = None) -> np.ndarray:
    """The ints of a lengths file (whitespace-separated, ``#`` starts a comment); ValueError naming the file, and
    where ``digest`` (``pin_file``) is given, a file whose contents no longer have it."""
    with open(path, "rb") as f:
        return _lengths_of(path, f.read(), digest)


def _lengths_of(path: str, data: bytes, digest: str | None) -> np.ndarray:
    """``read_lengths`` of the file's bytes ``data``."""
    if digest is not None and (now := _digest(data)) != digest:
        raise ValueError(f"lengths file {path} changed since its cells were made (sha256 {now}..., the cells' "
                         f"{digest}...): give file:{path} again")
    words = [w for line in data.decode("utf-8").splitlines() for w in line.split("#")[0].split()]
    try:
        ints = [int(w) for w in words]
    except ValueError:
        raise ValueError(f"lengths file {path}: every entry must be an int, got {words[:8]}") from None
    if not ints or min(ints) < 1 or max(ints) >= 2**31:
        raise ValueError(f"lengths file {path}: needs at least one length, all >= 1 and < 2**31")
    return np.array(ints, dtype=np.int64)


def parse_chunks(text) -> tuple[int, int] | None:
    """``"NxSIZE"`` (N prefill chunks of SIZE tokens, e.g. ``2x2048``) as (N, SIZE); None for None/"none"."""
    if text is None or str(text).lower() == "none":
        return None
    m = _CHUNKS.match(str(text).lower().replace("×", "x"))
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"prefill chunks must be NxSIZE with N, SIZE >= 1 (e.g. 2x2048), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def mixed_batch(chunks: int, chunk: int, decodes: int, s_max: int, rng: np.random.Generator, *,
                decode_kv=None, q_len: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(q_lengths, kv_lengths) int32 of ``chunks`` prefill chunks of ``chunk`` tokens, then ``decodes`` requests
    of ``q_len`` tokens. The decodes' KV lengths are ``decode_kv`` (default: uniform in [1, S]); each chunk's is
    uniform in [chunk, S]; every KV length is at least its request's new tokens."""
    q = np.array([chunk] * chunks + [q_len] * decodes)
    kv = rng.integers(1, s_max + 1, chunks + decodes) if decode_kv is None else \
        np.concatenate([np.zeros(chunks, np.int64), np.asarray(decode_kv, np.int64)])
    kv[:chunks] = rng.integers(chunk, s_max + 1, chunks)
    return q.astype(np.int32), np.maximum(kv, q).astype(np.int32)


def starts_of(q_lengths) -> np.ndarray:
    """(B+1,) int32 cumulative query starts of packed requests (``serving_attention``'s ``q_starts``)."""
    return np.concatenate([[0], np.cumsum(q_lengths)]).astype(np.int32)


def length_groups(q_lengths) -> list[np.ndarray]:
    """The requests (indices, ascending) grouped by their query length's power of two (1, 2, 3-4, 5-8, ...): laid
    out as a batch (``padded_rows``), a group's padding is under half its rows (one long prefill chunk among many
    decodes would pad every decode to its length)."""
    q_lengths = np.asarray(q_lengths, np.int64)
    bucket = np.ceil(np.log2(np.maximum(q_lengths, 1))).astype(np.int64)
    return [np.flatnonzero(bucket == b) for b in np.unique(bucket)]


def padded_rows(q_lengths, starts) -> tuple[np.ndarray, np.ndarray]:
    """(index (B, T_max) int32 into the packed rows, keep (B, T_max) bool) that lay packed requests out as a batch:
    row t of the request starting at packed row ``starts[b]`` is starts[b] + t while t < q_lengths[b]; the rows
    past it (keep False) index row 0."""
    q_lengths = np.asarray(q_lengths, np.int64)
    t = np.arange(max(int(q_lengths.max(initial=0)), 1))[None, :]
    keep = t < q_lengths[:, None]
    return np.where(keep, np.asarray(starts, np.int64)[:, None] + t, 0).astype(np.int32), keep
