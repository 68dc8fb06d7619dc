"""The import layers (pyproject.toml's [tool.importlinter]) hold: ``lint-imports`` exits 0.

Layers point down only (cli > notebook > lab > report > sweep > measure > env > sharded | decode >
api > backends > kernels > reference > spec, records, ...); a module that imports a layer above its
own breaks the contract, and this test with it (shown below on a copy of the package).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))

pytestmark = pytest.mark.skipif(not Path(LINT).exists(), reason="import-linter not installed (pip install -e '.[test]')")


def _lint(src: Path, config: Path = ROOT / "pyproject.toml") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([LINT, "--config", str(config), "--no-cache"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_lint_imports_passes():
    r = _lint(ROOT / "src")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "broken" in r.stdout and "0 broken" in r.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    """The old violation: a backend importing measure (torch_sdpa's timing loop before measure/native.py)."""
    shutil.copytree(ROOT / "src" / "attnlab", tmp_path / "attnlab", ignore=shutil.ignore_patterns("__pycache__"))
    base = tmp_path / "attnlab" / "backends" / "base.py"
    base.write_text(base.read_text() + "\n\ndef _timer():\n    from ..measure.stats import Stats\n    return Stats\n")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "BROKEN" in r.stdout and "attnlab.backends.base -> attnlab.measure.stats" in r.stdout, r.stdout
