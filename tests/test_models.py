"""Model presets (issue 16, item 1): data with their source, listed by ``attnlab models``."""
import json

import pytest
from click.testing import CliRunner

from attnlab.cli import main
from attnlab.core.models import BY_NAME, PRESETS, ModelPreset, preset

WANTED = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b",
          "qwen2.5-72b", "gemma-2-9b", "gemma-2-27b", "phi-3-mini")


def test_every_preset_the_issue_names_is_there_with_a_source():
    assert set(WANTED) <= set(BY_NAME)
    for p in PRESETS:
        assert p.source.startswith("https://huggingface.co/") and p.source.endswith("config.json")
        assert p.heads % p.kv_heads == 0 and p.layers > 0 and p.head_dim % 8 == 0


def test_known_shapes_and_semantics():
    l70 = preset("Llama-3.1-70B")
    assert (l70.layers, l70.heads, l70.kv_heads, l70.head_dim) == (80, 64, 8, 128)
    # 2 (K and V) x 80 layers x 8 heads x 128 x 2 bytes = 320 KiB per token
    assert l70.kv_cache_bytes(1) == 327680
    g = preset("gemma-2-9b")
    assert g.head_dim == 256 and g.softcap == 50.0 and g.window == 4096 and g.window_layers == "every other layer"
    # a window on every layer becomes the problem's window; alternate-layer windows do not (said in the data)
    assert preset("mistral-7b").problem(1, 8192).window == (4096, 0)
    assert g.problem(1, 8192).window is None
    p = l70.problem(2, 4096)
    assert (p.batch, p.q_len, p.kv_len, p.heads, p.kv_heads, p.head_dim, p.causal) == (2, 4096, 4096, 64, 8, 128, True)


def test_unknown_and_invalid_presets_say_why():
    with pytest.raises(ValueError, match="unknown preset 'gpt-5'; presets: llama-3.1-8b, llama-3.1-70b"):
        preset("gpt-5")
    with pytest.raises(ValueError, match="heads 10 not a multiple of kv_heads 4"):
        ModelPreset("bad", 1, 10, 4, 64, 640, 1024, "x")


def test_models_command_lists_them():
    r = CliRunner().invoke(main, ["models"], terminal_width=250)
    assert r.exit_code == 0, r.output
    for name in WANTED:
        assert name in r.output
    r = CliRunner().invoke(main, ["models", "--json"])
    rows = json.loads(r.output)
    assert [x["name"] for x in rows] == [p.name for p in PRESETS] and rows[0]["source"]
