"""Exact counts of what a call computes (attnlab.core.pairs, Workload): each case against a brute-force
count of the mask the float64 reference applies (small sizes)."""
import dataclasses

import numpy as np
import pytest

from attnlab import Problem, Workload
from attnlab.core import pairs, segments
from attnlab.core.workload import with_segment_ids
from attnlab.core.pairs import Counts
from attnlab.measure.cell import Cell
from attnlab.reference.float64 import _visible

T, S = 13, 17


def brute(T, S, B, causal=False, window=None, q_lengths=None, kv_lengths=None, decode=False, ids=None, kv_ids=None):
    """Counts of the reference's visibility mask: pairs, query rows that see a key, keys some query sees."""
    vis = brute_mask(T, S, B, causal, window, q_lengths, kv_lengths, decode, ids, kv_ids)
    return Counts(int(vis.sum()), int(vis.any(-1).sum()), int(vis.any(-2).sum()))


def brute_mask(T, S, B, causal=False, window=None, q_lengths=None, kv_lengths=None, decode=False, ids=None,
               kv_ids=None):
    """(B, T, S) bool: the reference's visibility mask."""
    pos = None
    if decode:
        pos = np.asarray(kv_lengths)[:, None] - T + np.arange(T)[None, :]
    vis = _visible(T, S, B, causal, window, None, kv_lengths, 0, pos, ids, kv_ids)[:, 0]
    vis = np.broadcast_to(vis, (B, T, S)).copy()
    if q_lengths is not None:
        vis &= (np.arange(T)[None, :] < np.asarray(q_lengths)[:, None])[:, :, None]
    return vis


_RNG = np.random.default_rng(0)
IDS = _RNG.integers(-1, 3, size=(3, T))          # any layout: ids that return, padding (-1) anywhere
KV_IDS = _RNG.integers(-1, 3, size=(3, S))
DOCS = segments.docs(3, T, 4, seed=1)
CASES = {
    "dense T<S": dict(),
    "causal T<S (top-left)": dict(causal=True),
    "window": dict(window=(3, 2)),
    "causal window": dict(causal=True, window=(4, 0)),
    "empty rows": dict(window=(0, 0), kv_lengths=(5, 0, 9)),
    "ragged q and kv": dict(causal=True, q_lengths=(13, 4, 0), kv_lengths=(17, 6, 3)),
    "decode ragged": dict(causal=True, kv_lengths=(13, 15, 17), decode=True),
    "decode window": dict(causal=True, window=(5, 0), kv_lengths=(13, 16, 17), decode=True),
    "decode window, right, not causal": dict(window=(3, 2), kv_lengths=(13, 16, 17), decode=True),
    "segment ids": dict(causal=True, ids=IDS, kv_ids=KV_IDS),
    "segment ids, decode": dict(causal=True, kv_lengths=(13, 15, 17), decode=True, ids=IDS, kv_ids=KV_IDS),
    "segment ids, window, lengths": dict(window=(2, 3), q_lengths=(9, 13, 2), kv_lengths=(17, 5, 11), ids=IDS,
                                         kv_ids=KV_IDS),
}


@pytest.mark.parametrize("name", list(CASES))
def test_count_equals_the_reference_mask(name):
    kw = dict(CASES[name])
    ids, kv_ids = kw.pop("ids", None), kw.pop("kv_ids", None)
    got = pairs.count(T, S, q_segment_ids=ids, kv_segment_ids=kv_ids,
                      **{**kw, "kv_lengths": kw.get("kv_lengths", (S,) * 3)})
    assert got == brute(T, S, 3, ids=ids, kv_ids=kv_ids, **kw)
    if ids is None:   # Workload (what records count) says the same
        w = Workload(3, T, S, 4, 2, 8, causal=kw.get("causal", False), window=kw.get("window"),
                     q_lengths=kw.get("q_lengths"), kv_lengths=kw.get("kv_lengths"), decode=kw.get("decode", False))
        assert w.counts() == got and w.flops() == 4 * 4 * 8 * got.pairs
        assert w.bytes() == (got.q_rows * 4 * 8 + 2 * got.kv_rows * 2 * 8 + 3 * T * 4 * 8) * 2
        keys = brute_mask(T, S, 3, **kw).any(-2)        # (B, S): a quantized cache's scales, one per key or page read
        for layout, ps in (("token", None), ("page", 1), ("page", 4)):
            qw = dataclasses.replace(w, kv_dtype="int8", kv_scale=layout, page_size=ps)
            read = sum(len({s // ps for s in np.flatnonzero(row)}) if ps else int(row.sum()) for row in keys)
            assert qw.scale_bytes() == 2 * 4 * read * 2, (name, layout, ps)


@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (5, 0)), (False, (2, 7)), (False, (0, 0))])
def test_packed_documents_closed_form(causal, window):
    """doc_lengths (closed form per document) == the general count == the mask of the same segment ids."""
    ids = DOCS.copy()
    ids[1, -3:] = -1                                  # a padded tail
    w = with_segment_ids(Problem(3, T, T, 2, 2, 8, causal=causal, window=window), ids)
    want = brute(T, T, 3, causal, window, ids=ids, kv_ids=ids)
    assert w.counts() == want == pairs.count(T, T, causal=causal, window=window, q_segment_ids=ids, kv_segment_ids=ids)
    assert w.flops("fwd+bwd") == 3.5 * 4 * 2 * 8 * want.pairs
    if w.doc_lengths is not None:      # a quantized cache's page scales: the pages of the keys its documents read
        keys = brute_mask(T, T, 3, causal, window, ids=ids, kv_ids=ids).any(-2)
        qw = dataclasses.replace(w, kv_dtype="int8", kv_scale="page", page_size=4)
        assert qw.scale_bytes() == 2 * 4 * 2 * sum(len({s // 4 for s in np.flatnonzero(row)}) for row in keys)


@pytest.mark.parametrize("T,S,causal", [(5, 2, False), (9, 3, True), (2, 9, False)])
def test_counts_far_past_the_other_length(T, S, causal):
    """T > S + 1 (or S > T + 1): every pair within reach, as the mask says."""
    assert pairs.count(T, S, causal=causal) == brute(T, S, 1, causal)
    ids, kv_ids = np.array([[-1] + [0] * (T - 2) + [-1]]), np.array([[0] + [-1] * (S - 1)])
    assert pairs.count(T, S, causal=causal, q_segment_ids=ids, kv_segment_ids=kv_ids, q_lengths=[T - 1],
                       kv_lengths=[1]) == brute(T, S, 1, causal, q_lengths=[T - 1], kv_lengths=[1], ids=ids, kv_ids=kv_ids)


def test_backward_bytes_read_q_o_do_k_v_and_write_dq_dk_dv_whole():
    """Backward: q, o and dO read over the rows used, K and V over the keys read, dq written over the rows, dK and
    dV written whole (B x S x K x H); K and V have K heads, not N."""
    assert Problem(1, 4, 4, 1, 1, 64).bytes("bwd") == (3 * 4 + 2 * 4 + 4 + 2 * 4) * 64 * 2
    dec = Problem(1, 1, 4, 8, 2, 4, "float32", causal=True, q_lengths=(1,), kv_lengths=(2,), decode=True)
    # q rows 1 x 8 heads; keys read 2 x 2 heads; outputs: dq 1 x 8, dK and dV 4 x 2 (whole)
    assert dec.bytes("bwd") == (3 * 8 * 4 + 2 * 2 * 2 * 4 + 8 * 4 + 2 * 4 * 2 * 4) * 4
    srv = Problem.serving((3,), (3,), 4, 2, 4, "float32")
    assert srv.bytes("bwd") == (3 * 3 * 4 * 4 + 2 * 3 * 2 * 4 + 3 * 4 * 4 + 2 * 3 * 2 * 4) * 4


def test_a_packed_cell_counts_only_the_pairs_inside_its_documents():
    """The cell of the report (docs:6, B=2 T=8192 causal) at the size of a test: pairs within documents only."""
    cell = Cell("cudnn", 2, 64, 64, 2, 2, 8, "bfloat16", True, packing="docs:6")
    ids = cell.segment_ids()
    assert cell.workload.counts() == brute(64, 64, 2, True, ids=ids, kv_ids=ids)
    assert cell.workload.flops() < 0.6 * Cell("cudnn", 2, 64, 64, 2, 2, 8, "bfloat16", True).workload.flops()


def test_doc_lengths_are_checked():
    with pytest.raises(ValueError, match="doc_lengths"):
        Workload(1, 8, 8, 1, 1, 8, doc_lengths=((5, 4),))
    with pytest.raises(ValueError, match="contiguous"):
        segments.run_lengths(np.array([[0, 1, 0]]))
