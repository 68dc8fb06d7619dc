"""The docs hold together (issue 24): every relative link resolves, runnable examples run on a CPU.

Convention: a fenced ```python block directly preceded by the line ``<!-- runnable -->`` is run as
a script in a fresh Python process (JAX on the CPU, ``src`` on the path); it must exit 0. Other
code blocks are illustrations and are not run.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = os.path.join(ROOT, "docs")
PAGES = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(DOCS) if f.endswith(".md"))
RUNNABLE_MARK = "<!-- runnable -->"

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def links(text: str) -> list[str]:
    """Targets of the Markdown links in ``text``, outside code blocks and inline code."""
    prose = _INLINE_CODE.sub("", _FENCE.sub("", text))
    return _LINK.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} +(.+?) *$", _FENCE.sub("", text), re.M)}


def runnable_blocks(text: str) -> list[str]:
    """The code of every ``<!-- runnable -->`` block; a mark not followed by a python block raises."""
    blocks = []
    for m in re.finditer(re.escape(RUNNABLE_MARK) + r"\n(.*?)(?=\n)", text):
        body = re.match(re.escape(RUNNABLE_MARK) + r"\n```python\n(.*?)^```", text[m.start():], re.S | re.M)
        if body is None:
            raise ValueError(f"{RUNNABLE_MARK} must be followed directly by a ```python block, got {m.group(1)!r}")
        blocks.append(body.group(1))
    return blocks


def broken_links(rel: str, text: str | None = None) -> list[str]:
    """Relative links of page ``rel`` (its text, or ``text`` in its place) whose file or #anchor does not exist."""
    broken = []
    for target in links(_read(rel) if text is None else text):
        if re.match(r"[a-z]+:", target):                      # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
        if not os.path.exists(os.path.join(ROOT, dest)):
            broken.append(f"{target} (no file {dest})")
        elif anchor and dest.endswith(".md") and anchor not in anchors(_read(dest)):
            broken.append(f"{target} (no heading #{anchor} in {dest})")
    return broken


def test_link_checker_sees_a_broken_file_and_anchor():
    text = "[a](docs/api.md) [b](docs/nope.md) [c](docs/api.md#no-such-heading) `[d](x.md)`\n```\n[e](y.md)\n```\n"
    assert links(text) == ["docs/api.md", "docs/nope.md", "docs/api.md#no-such-heading"]
    assert broken_links("README.md", text) == ["docs/nope.md (no file docs/nope.md)",
                                               "docs/api.md#no-such-heading (no heading #no-such-heading in docs/api.md)"]
    assert broken_links("docs/fp8.md", "[m](measuring.md#tolerance-policy) [r](../results)") == []
    assert slug("auto: the static rule and the measured pick") == "auto-the-static-rule-and-the-measured-pick"
    assert slug("`attnlab bench --model`") == "attnlab-bench---model"


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert not broken_links(page), f"{page}: broken links: {broken_links(page)}"


def test_readme_is_short_and_links_the_docs():
    readme = _read("README.md")
    assert len(readme.splitlines()) <= 200
    for page in ("api", "backends", "measuring", "decode", "fp8", "models", "results", "cli"):
        assert f"(docs/{page}.md)" in readme, page


def test_a_mark_without_a_python_block_is_an_error():
    with pytest.raises(ValueError, match="runnable"):
        runnable_blocks(f"{RUNNABLE_MARK}\n```bash\nls\n```\n")
    assert runnable_blocks(f"{RUNNABLE_MARK}\n```python\nx = 1\n```\n") == ["x = 1\n"]


RUNNABLE = [(page, i, code) for page in PAGES for i, code in enumerate(runnable_blocks(_read(page)))]


def test_the_readme_and_docs_have_runnable_examples():
    pages = {page for page, _, _ in RUNNABLE}
    assert "README.md" in pages and len(pages) >= 3, pages


@pytest.mark.parametrize("page,index,code", RUNNABLE, ids=[f"{p}[{i}]" for p, i, _ in RUNNABLE])
def test_runnable_block_runs_on_cpu(page, index, code, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{page} block {index} failed:\n{proc.stderr[-3000:]}"


def test_every_attnlab_name_the_docs_cite_exists():
    """`attnlab.NAME` in the README and docs is a top-level name or a submodule (check_decode_close is exported)."""
    import importlib

    import attnlab

    cited = {(m.group(1), page) for page in PAGES for m in re.finditer(r"`attnlab\.([A-Za-z_]\w*)", _read(page))}
    assert ("check_decode_close", os.path.join("docs", "decode.md")) in cited
    missing = []
    for name, page in sorted(cited):
        if not hasattr(attnlab, name):
            try:
                importlib.import_module(f"attnlab.{name}")
            except ImportError:
                missing.append((name, page))
    assert missing == []


@pytest.mark.parametrize("page,name", [("docs/api.md", "attention"), ("docs/decode.md", "decode_attention")])
def test_the_signature_block_names_every_argument(page, name):
    """The ```python signature block at the top of the page has the function's arguments, in order."""
    import ast
    import inspect

    import attnlab

    block = re.search(r"```python\n(attnlab\.%s\(.*?\))\n```" % name, _read(page), re.S).group(1)
    call = ast.parse(block.replace(", *,", ","), mode="eval").body   # a call, once the bare * is gone
    documented = [a.id for a in call.args] + [k.arg for k in call.keywords]
    assert documented == [p for p in inspect.signature(getattr(attnlab, name)).parameters]


def test_models_doc_says_a_soft_cap_is_measured():
    """models.md says what `bench --model gemma-2-*` does with the soft cap: measured on every cell, never "not modelled"."""
    from attnlab.core.model_plan import notes, plan
    from attnlab.core.models import PRESETS

    gemma = next(p for p in PRESETS if p.softcap)
    assert all(e.soft_cap == gemma.softcap for e in plan(gemma, ["prefill", "decode"], [4096]))
    assert any("soft-cap 50 measured" in n for n in notes(gemma, [4096]))
    text = " ".join(_read(os.path.join("docs", "models.md")).split())
    assert "not modelled" not in text and "logit soft-cap (50) is measured" in text
