"""Why TransformerEngine-JAX does or does not pick its fused (cuDNN) attention on this machine.

GPU diagnostic for issue 5. Runs one child process per library set-up (how the process finds
cuDNN decides which cuDNN TE loads) and, in each, asks TE's own FusedAttnHelper for a backend
for a few shapes, then runs ``DotProductAttention`` once and looks for TE's fused custom call
in the lowered HLO and for the error against a float64 NumPy reference.

    python3 benchmarks/peers/te_probe.py OUTDIR        # writes OUTDIR/te_probe.json, prints a summary
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

SHAPES = [  # (training, B, T, S, N, K, H, mask)
    (False, 2, 1024, 1024, 8, 8, 128, "causal"),
    (False, 2, 1024, 1024, 8, 8, 128, "no_mask"),
    (True, 2, 1024, 1024, 8, 8, 128, "causal"),
    (False, 4, 4096, 4096, 16, 16, 64, "no_mask"),
    (False, 8, 1, 4096, 32, 8, 128, "no_mask"),
    (False, 2, 1024, 1024, 8, 8, 128, "padding"),
]


def _pip_cudnn_dir() -> str | None:
    try:
        import nvidia.cudnn as c
        return list(c.__path__)[0]
    except Exception:  # noqa: BLE001
        return None


def _loaded_cudnn() -> list[str]:
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libcudnn" in line})


def child() -> dict:
    out: dict = {"env": {k: os.environ.get(k) for k in ("LD_LIBRARY_PATH", "CUDNN_PATH", "CUDNN_HOME", "NVTE_DEBUG")}}
    sys.path.insert(0, "src")
    if os.environ.get("PROBE_PRELOAD") == "1":
        from attnlab.backends._optional import preload_pip_cudnn
        out["preloaded"] = preload_pip_cudnn()
    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
        out["jax"] = jax.__version__
        out["device"] = jax.devices()[0].device_kind
        import transformer_engine.jax  # noqa: F401
        from transformer_engine.jax.attention import AttnBiasType, AttnMaskType, AttnSoftmaxType, QKVLayout
        from transformer_engine.jax.cpp_extensions.attention import FusedAttnHelper
        from transformer_engine.jax.cpp_extensions.misc import get_cudnn_version
        out["te_cudnn"] = list(get_cudnn_version())
    except Exception as e:  # noqa: BLE001
        out["import_error"] = f"{type(e).__name__}: {e}"
        out["loaded_cudnn"] = _loaded_cudnn()
        return out
    masks = {"no_mask": AttnMaskType.NO_MASK, "causal": AttnMaskType.CAUSAL_MASK,
             "padding": AttnMaskType.PADDING_MASK}
    out["helper"] = []
    for training, B, T, S, N, K, H, mask in SHAPES:
        row = {"shape": [training, B, T, S, N, K, H, mask]}
        try:
            backend, message = FusedAttnHelper(
                is_training=training, batch_size=B, q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16,
                qkv_layout=QKVLayout.BSHD_BSHD_BSHD, attn_bias_type=AttnBiasType.NO_BIAS,
                attn_mask_type=masks[mask], softmax_type=AttnSoftmaxType.VANILLA_SOFTMAX,
                dropout_probability=0.0, q_num_heads=N, kv_num_heads=K, q_max_seqlen=T, kv_max_seqlen=S,
                head_dim_qk=H, head_dim_v=H, window_size=(-1, -1),
                bottom_right_diagonal=masks[mask].is_bottom_right()).get_fused_attn_backend()
            row["backend"], row["message"] = str(backend), message
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
        out["helper"].append(row)
    try:
        from transformer_engine.jax.flax import DotProductAttention
        B, T, N, H = 2, 1024, 8, 128
        mod = DotProductAttention(head_dim=H, num_attention_heads=N, num_gqa_groups=N, attn_mask_type="causal",
                                  qkv_layout="bshd_bshd_bshd", transpose_batch_sequence=False, attention_dropout=0.0)
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((B, T, N, H)).astype(np.float32) for _ in range(3))
        fn = jax.jit(lambda q, k, v: mod.apply({}, q, k, v, deterministic=True))
        args = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
        text = fn.lower(*args).as_text()
        out["fused_in_hlo"] = "te_fused_attn_forward" in text
        o = np.asarray(fn(*args), np.float64)
        qf, kf, vf = (np.asarray(a, np.float64) for a in args)
        s = np.einsum("btnh,bsnh->bnts", qf, kf) / np.sqrt(H)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ref = np.einsum("bnts,bsnh->btnh", p, vf)
        out["rel_l2"] = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
    except Exception as e:  # noqa: BLE001
        out["run_error"] = f"{type(e).__name__}: {e}"
        out["run_traceback"] = traceback.format_exc()[-3000:]
    out["loaded_cudnn"] = _loaded_cudnn()
    return out


def main(outdir: str) -> None:
    os.makedirs(outdir, exist_ok=True)
    pip = _pip_cudnn_dir()
    base = dict(os.environ)
    variants = {"plain": {}, "preload": {"PROBE_PRELOAD": "1"}}
    if pip:
        ld = f"{pip}/lib:{base.get('LD_LIBRARY_PATH', '')}"
        variants.update({
            "ld_library_path": {"LD_LIBRARY_PATH": ld},
            "cudnn_path": {"CUDNN_PATH": pip},
            "cudnn_path+preload": {"CUDNN_PATH": pip, "PROBE_PRELOAD": "1"},
            "ld+debug": {"LD_LIBRARY_PATH": ld, "NVTE_DEBUG": "1", "NVTE_DEBUG_LEVEL": "2"},
        })
    results = {"pip_cudnn": pip}
    for name, extra in variants.items():
        p = subprocess.run([sys.executable, __file__, "--child"], env={**base, **extra}, capture_output=True,
                           text=True, timeout=240)
        try:
            res = json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:  # noqa: BLE001
            res = {"child_failed": p.returncode}
        res["stderr_tail"] = p.stderr[-4000:]
        results[name] = res
        print(f"== {name}: import_error={res.get('import_error')} te_cudnn={res.get('te_cudnn')} "
              f"fused_in_hlo={res.get('fused_in_hlo')} rel_l2={res.get('rel_l2')} run_error={res.get('run_error')}")
        for row in res.get("helper", []):
            print("   ", row["shape"], row.get("backend"), (row.get("message") or row.get("error") or "")[:300])
        print("    loaded:", res.get("loaded_cudnn"))
    with open(os.path.join(outdir, "te_probe.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))   # the repository root
    from benchmarks.results_folder import script_args  # noqa: E402 (after sys.path)

    args = script_args(__doc__, 0)
    if args == ["--child"]:
        print(json.dumps(child()))
    else:
        main(args[0] if args else "/tmp/te_probe")
