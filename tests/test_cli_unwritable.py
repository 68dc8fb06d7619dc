"""Issue 23 item 3: an output folder that cannot be written is one line naming it and why, exit 2,
in every command that writes (bench, run, advise, tune, ceilings), before any work starts.

Tests run as root, where chmod does not stop a write: the folders are a path through a file
(ENOTDIR), a path under /proc (ENOENT) and a read-only file system (EROFS, patched in)."""
import errno
import tempfile

import pytest
from click.testing import CliRunner

from attnlab.cli import main

SMALL = ["--backends", "naive", "--seq", "8", "--heads", "2", "--head-dim", "4", "--dtype", "float32",
         "--repeats", "1", "--min-time", "0"]


def _commands(out: str) -> dict[str, list[str]]:
    return {
        "bench": ["bench", *SMALL, "--out", out],
        "run": ["run", "--quick", "--sections", "environment", "--out", out],
        "advise": ["advise", "--model", "llama-3.1-8b", "--context", "256", "--phase", "decode", "--backends", "naive",
                   "--out", out],
        "tune": ["tune", *SMALL, "--out", f"{out}/dispatch.json", "--records", f"{out}/records"],
        "ceilings": ["ceilings", "--force"],
    }


def _folders(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    yield "file on the path", str(afile / "sub"), "Not a directory"
    yield "under /proc", "/proc/attnlab-test/out", "No such file or directory"

    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    yield "read-only file system", str(tmp_path / "ro"), "Read-only file system"


@pytest.mark.parametrize("command", ["bench", "run", "advise", "tune", "ceilings"])
def test_unwritable_output_is_one_line_and_exit_2(tmp_path, monkeypatch, command):
    for case, folder, reason in _folders(tmp_path, monkeypatch):
        monkeypatch.setenv("ATTNLAB_CACHE_DIR", folder)          # ceilings writes its cache there
        r = CliRunner().invoke(main, _commands(folder)[command])
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2, (case, r.output)
        assert len(lines) == 1 and "Traceback" not in r.output, (case, r.output)
        assert folder in lines[0] and reason in lines[0], (case, lines)


def test_a_folder_that_turns_unwritable_mid_run_is_one_line(tmp_path, monkeypatch):
    """An OSError on a file under --out after the up-front check (the disk filled) is one line too."""
    from attnlab.sweep import engine

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "o" / "results.jsonl"))

    monkeypatch.setattr(engine, "run_sweep", full)
    monkeypatch.setattr("attnlab.sweep.run_sweep", full)
    r = CliRunner().invoke(main, ["bench", *SMALL, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "No space left on device" in r.output and "Traceback" not in r.output
