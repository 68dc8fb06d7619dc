"""Sharded attention on 8 virtual CPU devices, in a process of its own (the device count is fixed at JAX start)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_sharded_attention_on_8_virtual_cpu_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "_sharded_checks.py")],
                       capture_output=True, text=True, env=env, timeout=900)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
