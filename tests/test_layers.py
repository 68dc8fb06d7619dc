"""The import layers (pyproject.toml's [tool.importlinter]) hold: ``lint-imports`` exits 0.

Layers point down only (cli > notebook > lab > report > sweep > measure > env > sharded | decode >
api > backends > kernels > reference > spec, records, ...); a module that imports a layer above its
own breaks the contract, and this test with it (shown below on a copy of the package).
"""
from __future__ import annotations

import ast
import json
import os
import re
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


_CIRCLES = """
import json, grimp
g = grimp.build_graph("attnlab", cache_dir=None)
print(json.dumps([(m, *chain) for m in sorted(g.modules) for n in sorted(g.find_modules_directly_imported_by(m))
                  if (chain := g.find_shortest_chain(importer=n, imported=m))]))
"""


def _circles(package_parent: Path) -> list[tuple[str, ...]]:
    """Each import that some chain of imports leads back from: (importer, imported, ..., importer). In a fresh
    Python, so that the package under ``package_parent`` is read, not one this process already imported."""
    env = dict(os.environ, PYTHONPATH=str(package_parent))
    r = subprocess.run([sys.executable, "-c", _CIRCLES], env=env, capture_output=True, text=True, timeout=120,
                       check=True)
    return [tuple(c) for c in json.loads(r.stdout)]


def test_no_circle_between_modules(tmp_path):
    """A module never imports, directly or through others, a module that imports it (function-level
    imports included); shown to fail on a copy with ``kernels/decode_splits.py`` importing its planner again."""
    assert _circles(ROOT / "src") == []
    shutil.copytree(ROOT / "src" / "attnlab", tmp_path / "attnlab", ignore=shutil.ignore_patterns("__pycache__"))
    splits = tmp_path / "attnlab" / "kernels" / "decode_splits.py"
    splits.write_text(splits.read_text() + "\n\ndef _plan():\n    from .decode_plan import make_plan\n    return make_plan\n")
    assert ("attnlab.kernels.decode_splits", "attnlab.kernels.decode_plan", "attnlab.kernels.decode_splits") in \
        _circles(tmp_path)


#: Imports inside functions are for optional or heavy dependencies only, each with its reason. The cap is a
#: ratchet at today's count (lower it as imports move to the top; never raise it): most that remain keep
#: JAX out of the packages that import none (core, the planners in kernels, report), which their own tests
#: check. The lab's steps have none: their probes and plans reach JAX through ``lab.step_types.jax_side()``.
FUNCTION_IMPORT_CAP = 40
#: The reason a function-level import stays there, a trailing comment on its first line.
REASON = re.compile(r"#\s*(optional|heavy|JAX-private):")


def function_level_imports(package: Path) -> list[tuple[str, int, str]]:
    """(file relative to ``package``, line, first line's text) of every import inside a function."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found.append((path.relative_to(package).as_posix(), node.lineno, lines[node.lineno - 1]))
    return sorted(set(found))


def test_function_level_imports_are_few_and_say_why():
    found = function_level_imports(ROOT / "src" / "attnlab")
    assert len(found) <= FUNCTION_IMPORT_CAP, (
        f"{len(found)} imports inside functions (at most {FUNCTION_IMPORT_CAP}): move attnlab's own modules and "
        "light libraries to the module top")
    silent = [f"{f}:{n}: {line.strip()}" for f, n, line in found if not REASON.search(line)]
    assert not silent, "an import inside a function says why (# optional: ..., # heavy: ..., # JAX-private: ...):\n" + \
        "\n".join(silent)


#: What a module may import at its top besides the standard library and attnlab: pyproject's dependencies
#: (by import name) and what they bring (jaxlib with jax). Anything else is optional: inside a function.
TOP_LEVEL_OK = {"jax", "jaxlib", "numpy", "ml_dtypes", "click", "rich", "jinja2", "matplotlib", "pydantic", "absl"}
#: A distribution whose import name differs (absl-py: JAX's Mosaic GPU imports absl without requiring it).
IMPORT_NAME = {"absl_py": "absl"}


def test_module_tops_import_only_the_declared_dependencies():
    """``pip install -e .`` then ``attnlab run`` (the README's first command) must import: a module-level import
    of an optional package (absl, hoisted once, broke it) fails here. The list is pyproject's dependencies."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=\[ ;]", d)[0].lower().replace("-", "_") for d in deps}
    assert {IMPORT_NAME.get(n, n) for n in names} == TOP_LEVEL_OK - {"jaxlib"}
    bad = []
    for path in sorted((ROOT / "src" / "attnlab").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                    if n.split(".")[0] not in TOP_LEVEL_OK | set(sys.stdlib_module_names) | {"attnlab"}]
    assert not bad, "optional packages imported at a module's top:\n" + "\n".join(bad)
