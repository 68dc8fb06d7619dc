import os
import tempfile

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Without a GPU: XLA's LLVM backend at -O0 compiles the suite's thousands of small CPU programs ~20% faster (the
# HLO passes, hence the programs' ops and memory, are unchanged); subprocesses inherit it. A GPU machine's kernels
# are timed: nothing is set there.
if not os.path.exists("/dev/nvidiactl") and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
# auto's dispatch table (attnlab.api.dispatch): never the user's cache; a test that wants one writes it here
os.environ["ATTNLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="attnlab-test-cache-")
os.environ.pop("ATTNLAB_DISPATCH", None)


def _has_gpu() -> bool:
    try:
        import jax

        return jax.default_backend() == "gpu"
    except Exception:
        return False


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (JAX's default backend is not gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_backend():
    """``make(name, run)`` registers a backend whose ``run(p)`` is ``run``; all are unregistered afterwards."""
    from attnlab import backends

    added = []

    def make(name, run):
        cls = type("Fake", (backends.Backend,), {"name": name, "run": lambda self, p: run(p)})
        backends.register(cls())
        added.append(name)
        return name

    yield make
    for n in added:
        backends.unregister(n)


#: the label of the session's quick run: HTML the report must escape (test_cli_lab, test_browser read it)
QUICK_RUN_LABEL = "<b>ci & test</b> browser <check>"


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    """``(out_dir, click_result)`` of one ``attnlab run --quick --label QUICK_RUN_LABEL`` for the session (~15 s on
    2 cores, so run once): the tests that take it read its folder and never write there."""
    from click.testing import CliRunner

    from attnlab.cli import main

    out = tmp_path_factory.mktemp("quick-run")
    return out, CliRunner().invoke(main, ["run", "--out", str(out), "--quick", "--label", QUICK_RUN_LABEL])
