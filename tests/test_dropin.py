"""attnlab.attention as a drop-in for the installed jax.nn.dot_product_attention, and the top-level API."""
import os
import subprocess
import sys

import attnlab


def test_sharded_attention_is_top_level_and_lazy():
    from attnlab import sharded

    assert attnlab.sharded_attention is sharded.sharded_attention
    assert attnlab.make_mesh is sharded.make_mesh
    assert "sharded_attention" in attnlab.__all__ and "sharded_attention" in dir(attnlab)
    # import attnlab stays cheap: the sharded module loads on first use only
    code = "import sys, attnlab; assert 'attnlab.sharded' not in sys.modules; attnlab.sharded_attention; " \
           "assert 'attnlab.sharded' in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        attnlab.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("attnlab.no_such_name should raise AttributeError")
