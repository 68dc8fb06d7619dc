"""A results folder under stress: one writer at a time, a full disk, an unreadable file overwritten, Ctrl-C's count."""
import errno
import fcntl
import json

import pytest
from click.testing import CliRunner

from attnlab.cli import main
from attnlab.core.store import ResultStore
from attnlab.sweep import Sweep, run_sweep
from attnlab.sweep.engine import SweepInterrupted

TINY = ["bench", "--backends", "naive", "--seq", "16", "--heads", "2", "--head-dim", "8", "--dtype", "float32",
        "--repeats", "2", "--min-time", "0"]
LAB = ["run", "--quick", "--sections", "environment"]


@pytest.fixture
def held(tmp_path):
    """A folder another process writes: its lock held through another open file, as flock sees a second process."""
    out = tmp_path / "o"
    out.mkdir()
    with open(out / ".attnlab.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield out


@pytest.mark.parametrize("command", [TINY, LAB], ids=["bench", "run"])
def test_a_folder_another_process_writes_is_refused_untouched(held, command):
    r = CliRunner().invoke(main, command + ["--out", str(held)])
    assert r.exit_code == 2, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {held} is being written by another attnlab process"), r.output
    assert sorted(p.name for p in held.iterdir()) == [".attnlab.lock"]   # no run.log, no results


@pytest.mark.parametrize("command", [TINY, LAB], ids=["bench", "run"])
def test_a_full_disk_is_one_line_and_exit_2(tmp_path, monkeypatch, command):
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")   # a write or flush names no file
    monkeypatch.setattr(ResultStore, "_write", staticmethod(full))
    r = CliRunner().invoke(main, command + ["--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), r.output
    assert r.output.strip().splitlines()[-1] == f"error: --out {tmp_path / 'o'}: cannot write (No space left on device)"


def test_a_failed_rewrite_leaves_the_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    path.write_text("{}\n")
    real = ResultStore._write

    def full_after_some(records, mode, p):
        open(p, mode).write("{")     # a part written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(ResultStore, "_write", staticmethod(full_after_some))
    with pytest.raises(OSError):
        ResultStore(path).rewrite([{"kind": "x"}])
    monkeypatch.setattr(ResultStore, "_write", real)
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"] and path.read_text() == "{}\n"


@pytest.mark.parametrize("command, file", [(TINY, "results.jsonl"), (LAB, "sweeps/results.jsonl")], ids=["bench", "run"])
def test_overwrite_erases_a_results_file_it_cannot_read(tmp_path, command, file):
    out = tmp_path / "o"
    (out / file).parent.mkdir(parents=True)
    (out / file).write_text('{"kind": "cell"}\nnot a record\n{"kind": "cell"}\n')
    r = CliRunner().invoke(main, command + ["--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert all(json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())


def test_ctrl_c_in_a_records_write_counts_the_record_on_disk(tmp_path, monkeypatch):
    real = ResultStore.append

    def append_then_interrupt(self, rec):
        real(self, rec)
        raise KeyboardInterrupt    # as if it landed in the fsync's return
    monkeypatch.setattr(ResultStore, "append", append_then_interrupt)
    sweep = Sweep(["naive"], batch=[1], q_len=[16, 32], heads=[2], head_dim=[8], dtype=["float32"])
    with pytest.raises(SweepInterrupted) as e:
        run_sweep(sweep, str(tmp_path / "o"))
    assert (e.value.finished, e.value.total) == (1, 2)
