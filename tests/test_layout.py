"""docs/layout.md's generated section is the code's (``tools/layout.py``), and source file names do not repeat
unless they are the same concept in parallel packages."""
from __future__ import annotations

import importlib.util
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("layout_tool", ROOT / "tools" / "layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

#: Names allowed in several packages: one concept at several layers (a backend and its lab step, a library
#: call and its kernel, a command and what it runs). ``spec.py``: core's AttentionSpec and sweep's Sweep, until
#: the call's types are one Problem (issue 33, item 1).
PARALLEL = {"cudnn.py", "decode.py", "env.py", "inputs.py", "models.py", "naive.py", "run.py", "serving.py", "spec.py",
            "tune.py"}


def test_layout_md_generated_section_is_the_codes():
    _, section, _ = layout.split(layout.LAYOUT_MD.read_text(encoding="utf-8"))
    assert section == layout.generate(), "docs/layout.md is out of date: run `python tools/layout.py --write`"


def test_no_two_source_files_share_a_name_unless_parallel():
    names = Counter(p.name for p in (ROOT / "src" / "attnlab").rglob("*.py")
                    if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts)
    repeated = {n for n, c in names.items() if c > 1}
    assert repeated <= PARALLEL, f"file names repeated across packages (rename by what they hold): {sorted(repeated - PARALLEL)}"


def test_every_benchmark_is_listed_and_named_by_what_it_measures():
    """benchmarks/README.md's table names every script (an old name beside it); no name carries an issue number."""
    bench = ROOT / "benchmarks"
    files = sorted(p.relative_to(bench).as_posix() for p in bench.rglob("*") if p.suffix in (".py", ".sh")
                   and p.name != "__init__.py" and "__pycache__" not in p.parts)
    readme = (bench / "README.md").read_text(encoding="utf-8")
    assert [f for f in files if f"`{f}`" not in readme] == [], "add these to benchmarks/README.md's table"
    assert [f for f in files if re.search(r"issue|[a-z]\d\d", f)] == [], "name a benchmark by what it measures"
