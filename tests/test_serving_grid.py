"""The H200 serving grid's script on the CPU: its cell list and parts, resuming, and its table (no cell runs)."""
import json

import pytest

from benchmarks.serving import grid_cells as gc
from benchmarks.serving import grid_gpu, grid_table


def test_cells_cover_the_grid_once_and_parts_split_them_evenly():
    cells = gc.cells()
    ids = [c.cell_id for c in cells]
    assert len(ids) == len(set(ids)) == 440
    assert {c.G for c in cells} == {1, 4, 7, 8, 12, 16} and {c.T for c in cells} == {1, 2, 4, 8}
    assert {c.H for c in cells} == {64, 128, 256} and {c.layout for c in cells} == {"contig", "paged16", "paged64"}
    assert min(c.B for c in cells) == 8 and max(c.B for c in cells if not c.chunks) == 128
    assert max(c.S for c in cells) == 131072
    assert {c.batch for c in cells} >= {"uniform", "spread", "lognormal", "one-long", "mixed 2x2048+126",
                                        "mixed 8x512+248"}
    parts = [gc.part_of(cells, n, 3) for n in (1, 2, 3)]
    assert [c for p in parts for c in p] == cells
    est = [sum(gc.estimate_s(p)) for p in parts]
    assert max(est) < 1.2 * min(est) and sum(est) < 3 * 480      # three calls of --max-seconds 480
    assert gc.parse_part("2/3") == (2, 3)
    with pytest.raises(ValueError, match="--part"):
        gc.parse_part("4/3")


def test_resume_skips_recorded_cells_and_redoes_errors_on_request(tmp_path):
    cells = gc.part_of(gc.cells(), 1, 3)
    prev = tmp_path / "prev.jsonl"
    prev.write_text(json.dumps(dict(cells[0].fields(), status="ok")) + "\n"
                    + json.dumps(dict(cells[1].fields(), status="error", error="x")) + "\n" + '{"cell_id": "half')
    recs = gc.read_records([prev, tmp_path / "missing.jsonl"])
    assert gc.cells_left(cells, recs) == cells[2:]
    assert gc.cells_left(cells, recs, redo_errors=True) == cells[1:]
    out = tmp_path / "out"     # --max-seconds 0: no cell starts; the earlier records are carried in
    grid_gpu.main(["--out", str(out), "--part", "1/3", "--max-seconds", "0", "--previous", str(prev)])
    assert [r["cell_id"] for r in gc.read_records([out / "results.jsonl"])] == [cells[0].cell_id, cells[1].cell_id]
    assert "2 of 440 cells recorded" in (out / "README.md").read_text()
    assert "part 1/3" in (out / "runs.txt").read_text()


def _rec(batch, H, pct, peer_ms=None, ms=1.0, status="ok", **kw):
    r = dict(cell_id=f"{batch}|{H}|{pct}", sample="t", batch=batch, B=32, S=32768, H=H, G=4, T=1, layout="contig",
             mixed=batch.startswith("mixed"), status=status, **kw)
    if status == "ok":
        r.update(ms=ms, pct_roofline=pct, tokens_per_s=3.2e4)
    if peer_ms:
        r["peers"] = {"cudnn (padded)": dict(ms=peer_ms, pct_roofline=pct * ms / peer_ms)}
    return r


def test_table_states_goals_and_peers_from_a_jsonl(tmp_path):
    recs = [_rec("uniform", 128, 94, plan_ms=0.02, peers={"attnlab-decode (padded)": dict(ms=1.2, pct_roofline=80),
                                                         "cudnn (padded)": dict(ms=1.01, pct_roofline=93)}),
            _rec("lognormal", 128, 80, peer_ms=0.9), _rec("one-long", 256, 76, peer_ms=3.0),
            _rec("mixed 2x2048+126", 128, 60, prefill_tflops=300.0), _rec("spread", 64, 90, status="skipped", reason="needs ~99 GB")]
    late_error = dict(gc.Cell("t", "lognormal", 32, 32768, 128, 4, 1, "contig").fields(), cell_id=recs[1]["cell_id"],
                      sample="t", status="error", error="boom")       # a later failure never hides a measurement
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs + [late_error]))
    md = grid_table.write_table(str(tmp_path))
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| t |")}
    assert "85% met" in rows["uniform"] and "tie" in rows["uniform"] and "today's decode kernel: faster 1.20x" in rows["uniform"]
    assert "85% missed by 5" in rows["lognormal"] and "slower by 11%" in rows["lognormal"]
    assert "75% met" in rows["one-long"] and "faster 3.00x" in rows["one-long"]
    assert "75% missed by 15" in rows["mixed 2x2048+126"] and "no peer" in rows["mixed 2x2048+126"]
    assert "skipped: needs ~99 GB" in rows["spread"]
    assert "| lognormal | 1 | 80% | 0/1 | 89% | 0 / 0 / 1 |" in md
    assert "300–300 TFLOP/s, 30–30% of the 989" in md and "at most 0.06% of a 32-layer step" in md
    assert grid_table.verdicts(recs[1])["best_peer"] == "cudnn (padded)"
    assert len(gc.read_records([tmp_path / "results.jsonl"])) == 5
