"""The public extension point as a user meets it: docs/backends.md's example ``Backend`` subclass, registered
from outside the package with ``attnlab.register``, runs in ``attnlab.attention``, in ``attnlab bench`` called
in the same process, and its ``run_decode`` is what ``decode_attention`` calls; every list of peers derives
from the registry (``Backend.peer_parts``)."""
from __future__ import annotations

import ast
import json
import os
import re
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner

import attnlab
from attnlab import backends
from attnlab.backends.base import Backend
from attnlab.cli import main
from attnlab.reference.decode64 import reference_decode_attention

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "backends.md")
SRC = os.path.join(os.path.dirname(__file__), "..", "src", "attnlab")
#: The layers above the backends whose code may not branch on a backend's name (``x == "cudnn"``,
#: ``backends.get("xla")``): what a backend is and can do is declared on it.
NAME_FREE = ("api", "measure", "sweep", "cli")
#: (file, name) still testing a name: not yet declared (the lab goal's TransformerEngine allowance), or no
#: backend ("cudnn" is also the key of the cuDNN library's version).
NAME_TESTS_LEFT = {("sweep/engine_speed.py", "te"), ("api/dot_product.py", "cudnn")}


def doc_example() -> str:
    """The ```python block of docs/backends.md's "Adding a backend" section (the one that subclasses Backend)."""
    with open(DOC, encoding="utf-8") as f:
        section = f.read().split("## Adding a backend", 1)[1]
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", section, re.S | re.M) if "(Backend):" in b]
    assert len(blocks) == 1, "docs/backends.md: one example Backend subclass under 'Adding a backend'"
    return blocks[0]


@pytest.fixture
def doc_backend():
    """The docs' example run as its reader runs it (its own ``attnlab.register`` line); the registry restored after."""
    with backends.registered():
        scope: dict = {"__name__": "users_backend"}
        exec(compile(doc_example(), DOC, "exec"), scope)
        cls = next(v for v in scope.values() if isinstance(v, type) and issubclass(v, Backend) and v is not Backend)
        yield backends.get(cls.name)


def _arrays(shape_q, shape_kv, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in (shape_q, shape_kv, shape_kv))


def test_decode_attention_calls_the_docs_example_backends_run_decode(doc_backend):
    name = doc_backend.name
    assert type(doc_backend).__module__ == "users_backend" and name in backends.names()
    q, k, v = _arrays((2, 1, 4, 16), (2, 16, 2, 16))
    assert attnlab.explain(q, k, v).reasons[name] is None
    lengths = jnp.asarray([5, 16], jnp.int32)
    cls = type(doc_backend)
    with mock.patch.object(cls, "run_decode", autospec=True, side_effect=cls.run_decode) as spy:
        out = attnlab.decode_attention(q, k, v, lengths, implementation=name)
    assert spy.call_count == 1, f"decode_attention did not call {name}'s run_decode"
    ref = reference_decode_attention(q, k, v, lengths, causal=True)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-5, atol=2e-5)


def test_a_backend_registered_from_outside_runs_in_bench_in_the_same_process(doc_backend, tmp_path):
    name = doc_backend.name
    calls = []
    real = type(doc_backend).run_decode
    with mock.patch.object(type(doc_backend), "run_decode", autospec=True,
                           side_effect=lambda self, d: calls.append(d.spec.q_len) or real(self, d)):
        r = CliRunner().invoke(main, ["bench", "--backends", name, "--batch", "1", "--q-len", "1", "--kv-len", "32",
                                      "--heads", "2", "--head-dim", "16", "--dtype", "float32", "--causal", "true",
                                      "--lengths", "none,full", "--repeats", "1", "--min-time", "0",
                                      "--out", str(tmp_path)], terminal_width=200)
    assert r.exit_code == 0, r.output
    with open(tmp_path / "results.jsonl", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    assert [(x["backend"], x["status"]) for x in recs] == [(name, "ok"), (name, "ok")], r.output
    assert calls, "the decode cell did not run through the backend's run_decode"


def test_every_list_of_peers_comes_from_the_declared_parts():
    class Peer(Backend):
        name = "test-peer"
        peer_parts = ("fwd", "decode")

    before = backends.peers("fwd")
    assert "xla" in before and "cudnn" in backends.peers("fp8") and "attnlab-decode" in backends.peers("decode")
    assert "cudnn-fp8-unit" in backends.peers("fp8")            # a declared variant, beside its backend
    with backends.registered(Peer()):
        assert backends.peers("fwd") == before + ["test-peer"] and "test-peer" in backends.peers("decode")
        assert "test-peer" not in backends.peers("train")
    assert backends.peers("fwd") == before


def name_tests(path: str, names: set[str]) -> set[str]:
    """The backend names ``path`` compares with (``==``, ``in``, ...) or looks up as ``backends.get("...")``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        parts = []
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and (getattr(node.func.value, "id", None) == "backends"           # backends.get(...)
                     or getattr(node.func.value, "attr", None) == "backends"):  # jx.backends.get(...)
            parts = node.args
        found |= {c.value for p in parts for c in ast.walk(p) if isinstance(c, ast.Constant) and c.value in names}
    return found


def test_no_layer_above_the_backends_tests_a_backend_name():
    names = set(backends.variant_names())
    assert name_tests(os.path.join(SRC, "lab", "steps", "cudnn.py"), names) == {"cudnn"}     # the scan sees one
    found = set()
    for layer in NAME_FREE:
        for folder, _, files in os.walk(os.path.join(SRC, layer)):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, f), SRC).replace(os.sep, "/")
                    found |= {(rel, n) for n in name_tests(os.path.join(folder, f), names)}
    assert found - NAME_TESTS_LEFT == set()
