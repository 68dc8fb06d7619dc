"""The README and docs say what the code does (issues 12 and 24): every backend, one install form,
headline numbers copied from the results they cite, the tolerance policy written once."""
import ast
import os
import re
import tomllib

from attnlab import backends
from attnlab.backends import _optional

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


README = _read("README.md")
BACKENDS_PAGE = _read("docs", "backends.md")


def test_every_registered_backend_is_in_the_backends_page():
    missing = [n for n in backends.names() if f"`{n}`" not in BACKENDS_PAGE]
    assert not missing, f"docs/backends.md does not name these registered backends: {missing}"
    assert "more to come" not in BACKENDS_PAGE + README


def test_install_hints_have_one_form():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"]) - {"test"}
    for extra in extras:
        assert _optional.install_hint(extra) in README, extra
    assert "pip install 'attnlab[" not in README
    for cmd in re.findall(r"pip install [^`|]*\[[a-z0-9]+\][^`|]*", README):
        assert re.search(r"-e '\.\[[a-z0-9]+\]'", cmd), cmd          # always from the checkout
    msg = _optional.missing("surely_not_a_module_xyz", "torch")
    assert _optional.install_hint("torch") in msg and "attnlab[" not in msg


def test_fresh_machine_commands_unchanged():
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && attnlab run" in README
    assert ("python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && "
            "python -m pytest -q -n 2 --dist loadfile") in README


def headline_rows(readme: str) -> list[tuple[str, str, str]]:
    """(question, answer, cited results folder) of each row of the README's headline table."""
    section = readme.split("## Headline numbers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        folder = re.search(r"\(results/([^/)]+)/README\.md\)", line)
        if len(cells) == 3 and folder:
            rows.append((cells[0], cells[1], folder.group(1)))
    return rows


def numbers_not_in_source(answer: str, source: str) -> list[str]:
    """Numbers of ``answer`` (12, 0.2485, 5.9) that the cited README does not hold as written."""
    return [n for n in re.findall(r"\d+(?:\.\d+)?", answer)
            if not re.search(r"(?<![\d.])" + re.escape(n) + r"(?!\.?\d)", source)]


def test_headline_numbers_are_copied_from_the_results_they_cite():
    rows = headline_rows(README)
    assert len(rows) >= 5
    for question, answer, folder in rows:
        source = _read("results", folder, "README.md")
        assert not numbers_not_in_source(answer, source), (question, folder, numbers_not_in_source(answer, source))


def test_a_number_not_in_the_cited_readme_is_caught():
    source = "cuDNN 3.225 ms (682 TFLOP/s, 68.9%); 0.2485 ms"
    assert numbers_not_in_source("cuDNN 3.225 ms (682 TFLOP/s, 68.9%)", source) == []
    assert numbers_not_in_source("cuDNN 3.23 ms (682 TFLOP/s, 69%)", source) == ["3.23", "69"]
    assert numbers_not_in_source("0.248 ms", source) == ["0.248"]


def test_tolerance_policy_is_written_once():
    policy = _read("docs", "measuring.md")
    assert "## Tolerance policy" in policy and "1e-10 for float64" in policy
    others = {"README.md": README,
              **{f"docs/{f}": _read("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                 if f.endswith(".md") and f != "measuring.md"},
              **{p: ast.get_docstring(ast.parse(_read("src", "attnlab", *p.split("/"))))
                 for p in ("reference/float64.py", "measure/check.py", "reference/decode64.py")}}
    for name, text in others.items():
        # the floors and the emulation's recipe are the policy's own words: stated in one place only
        assert "1e-10" not in text and "probabilities rounded to the dtype" not in text, name
    for p in ("reference/float64.py", "measure/check.py", "reference/decode64.py"):
        assert "docs/measuring.md" in others[p], p
