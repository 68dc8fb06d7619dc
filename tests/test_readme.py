"""The README says what the code does (issue 12, item 13): every backend, one install form."""
import os
import re
import tomllib

from attnlab import backends
from attnlab.backends import _optional

ROOT = os.path.join(os.path.dirname(__file__), "..")
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_every_registered_backend_is_in_the_readme():
    missing = [n for n in backends.names() if f"`{n}`" not in README]
    assert not missing, f"README does not name these registered backends: {missing}"
    assert "more to come" not in README


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
    assert "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q" in README
