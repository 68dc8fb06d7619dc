"""The FP8 recipe is an option of one cudnn-fp8 backend (issue 24): one registered backend, each recipe a
configured variant reached by its old name, by ``fp8_recipe=`` and by the sweep axis ``fp8_recipe``;
committed records keep loading with the recipe recovered from their names."""
import os

import jax.numpy as jnp
import pytest
from click.testing import CliRunner

import attnlab
from attnlab import backends
from attnlab.backends.fp8_recipe import RECIPES, name_of_recipe, recipe_names, suffix_of
from attnlab.cli import main
from attnlab.core.store import read_records
from attnlab.sweep import SweepError, build

ROOT = os.path.join(os.path.dirname(__file__), "..")
OLD_NAMES = ["cudnn-fp8", "cudnn-fp8-unit", "cudnn-fp8-pow2", "cudnn-fp8-s256", "cudnn-fp8-s1", "cudnn-fp8-hadamard",
             "cudnn-fp8-hadamard-f32", "cudnn-fp8-hadamard-fused", "cudnn-fp8-smoothk", "cudnn-fp8-hadamard-smoothk"]


def test_one_fp8_backend_is_registered_and_every_old_name_resolves():
    fp8 = [n for n in backends.names() if n.startswith("cudnn-fp8")]
    assert fp8 == ["cudnn-fp8"] and len(backends.names()) <= 16
    assert backends.get("cudnn-fp8").variant_names() == OLD_NAMES
    for name in OLD_NAMES:
        b = backends.get(name)
        assert b.name == name and b.recipe == RECIPES[suffix_of(name)] and backends.get(name) is b
    with pytest.raises(ValueError, match="did you mean 'cudnn-fp8"):   # the closest variant is named
        backends.get("cudnn-fp8-nope")


def test_recipe_names_and_their_backends():
    assert recipe_names()[:2] == ["amax", "unit"] and len(recipe_names()) == len(OLD_NAMES)
    assert [name_of_recipe(r) for r in recipe_names()] == OLD_NAMES
    for bad in ("", "nope", "cudnn-fp8-unit"):
        with pytest.raises(ValueError, match="fp8_recipe must be one of amax, unit"):
            name_of_recipe(bad)
    assert suffix_of("cudnn") is None and suffix_of("cudnn-fp8-nope") is None and suffix_of("te-fp8") is None


def test_attention_takes_the_recipe_as_an_argument():
    q = jnp.zeros((1, 16, 2, 16), jnp.bfloat16)
    with pytest.raises(attnlab.UnsupportedError, match="^cudnn-fp8-hadamard: "):   # no GPU here: its own reason
        attnlab.attention(q, q, q, implementation="cudnn-fp8", fp8_recipe="hadamard")
    with pytest.raises(attnlab.UnsupportedError, match="^cudnn-fp8-hadamard: "):   # a name in any case, as elsewhere
        attnlab.attention(q, q, q, implementation="cuDNN-FP8", fp8_recipe="hadamard")
    with pytest.raises(ValueError, match="fp8_recipe needs implementation='cudnn-fp8'"):
        attnlab.attention(q, q, q, fp8_recipe="hadamard")
    with pytest.raises(ValueError, match="fp8_recipe must be one of"):
        attnlab.attention(q, q, q, implementation="cudnn-fp8", fp8_recipe="hadamrd")


def test_the_sweep_axis_runs_each_recipe_under_its_record_name():
    s = build({"backends": "cudnn,cudnn-fp8", "fp8_recipe": "amax,hadamard-fused", "seq": "128"})
    assert [c.backend for c in s.cells()] == ["cudnn", "cudnn-fp8", "cudnn-fp8-hadamard-fused"]
    assert build({"backends": "cudnn-fp8-smoothk", "seq": "128"}).backends == ["cudnn-fp8-smoothk"]  # old names too
    with pytest.raises(SweepError, match="needs the cudnn-fp8 backend"):
        build({"backends": "cudnn", "fp8_recipe": "unit"})
    with pytest.raises(SweepError, match="fp8_recipe must be one of"):
        build({"backends": "cudnn-fp8", "fp8_recipe": "nope"})


def test_bench_has_the_fp8_recipe_flag(tmp_path):
    r = CliRunner().invoke(main, ["bench", "--backends", "xla", "--fp8-recipe", "unit", "--out", str(tmp_path)])
    assert r.exit_code != 0 and "needs the cudnn-fp8 backend" in r.output


@pytest.mark.parametrize("folder", ["gpu-2026-12-03d-fp8-rotation/run-8c77e71/fp8-recipes",
                                    "gpu-2026-12-03c-fp8-recipes/fp8-recipes"])
def test_committed_records_load_with_the_recipe_recovered_from_their_name(folder):
    recs = [r for r in read_records(os.path.join(ROOT, "results", folder, "results.jsonl"))
            if r.get("backend", "").startswith("cudnn-fp8")]
    assert recs
    for r in recs:
        recipe = RECIPES[suffix_of(r["backend"])]
        ran = (r.get("facts") or {}).get("fp8_recipe")
        if ran:   # records before the rotation field existed rotated in float32: compare the rest
            assert {k: v for k, v in recipe.as_dict().items() if k in ran and k != "rotation"} == \
                   {k: v for k, v in ran.items() if k != "rotation"}, r["backend"]
        assert backends.get(r["backend"]).name == r["backend"]
