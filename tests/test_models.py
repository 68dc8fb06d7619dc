"""Model presets (issue 16, item 1): data with their source, listed by ``attnlab models``."""
import json

import pytest
from click.testing import CliRunner

from attnlab.cli import main
from attnlab.core.models import BY_NAME, PRESETS, ModelPreset, preset

WANTED = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b",
          "qwen2.5-72b", "gemma-2-9b", "gemma-2-27b", "phi-3-mini", "gemma-3-4b", "gemma-3-12b", "gemma-3-27b",
          "gpt-oss-20b", "gpt-oss-120b")


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


def test_gpt_oss_and_gemma3_windowed_layers_and_sinks_reach_the_plan():
    """gpt-oss: 128-token window on every other layer and sinks on all; Gemma 3: 1024 on 5 of every 6 layers;
    their Hugging Face ids resolve; every plan entry of gpt-oss carries the sinks (and only its records match)."""
    from attnlab.core.model_config import from_config, resolve
    from attnlab.core.model_plan import notes, plan
    from attnlab.report.advice import cell_rows

    kinds = lambda p: [(k.kind, k.layers, k.window) for k in p.layer_kinds()]   # noqa: E731
    oss, big, g27 = preset("gpt-oss-20b"), preset("gpt-oss-120b"), preset("gemma-3-27b")
    assert (oss.layers, oss.heads, oss.kv_heads, oss.head_dim, oss.sinks) == (24, 64, 8, 64, True)
    assert kinds(oss) == [("windowed", 12, 128), ("global", 12, None)] and kinds(big)[0] == ("windowed", 18, 128)
    assert (g27.heads, g27.kv_heads, g27.head_dim, g27.sinks) == (32, 16, 128, False)
    assert kinds(g27) == [("windowed", 52, 1024), ("global", 10, None)]
    assert [k.layers for k in preset("gemma-3-4b").layer_kinds()] == [29, 5]
    for text, name in (("openai/gpt-oss-20b", "gpt-oss-20b"), ("GPT-OSS-120B", "gpt-oss-120b"),
                       ("google/gemma-3-27b-it", "gemma-3-27b"), ("google/gemma-3-12b-pt", "gemma-3-12b")):
        assert resolve(text).name == name
    types = ["sliding_attention", "full_attention"] * 12       # gpt-oss-20b's config.json, attention fields
    cfg = from_config({"model_type": "gpt_oss", "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                       "num_hidden_layers": 24, "hidden_size": 2880, "max_position_embeddings": 131072,
                       "sliding_window": 128, "layer_types": types})
    assert cfg.sinks and kinds(cfg) == kinds(oss)
    entries = plan(oss, "prefill,decode", "4k")
    assert {e.kind for e in entries} == {"windowed", "global"} and all(e.sinks for e in entries)
    assert all(e.axes()["sinks"] == [True] for e in entries)
    assert [e.window for e in entries if e.phase == "prefill"] == [(128, 0), None]
    rec = {k: v[0] for k, v in entries[0].axes().items()}
    assert entries[0].matches(rec) and not entries[0].matches({**rec, "sinks": False})
    assert any("attention sinks on every layer" in n for n in notes(oss, "4k"))
    assert all(r["sinks"] for r in cell_rows(entries, []))
    assert not any(e.sinks for e in plan(g27, "decode", "4k"))
