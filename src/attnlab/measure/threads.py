"""A daemon thread that runs one JAX call: the compile watchdog and the Ctrl-C worker both use it."""
from __future__ import annotations

import threading
from typing import Callable

import jax


class JaxThread:
    """``fn()`` started at once in a daemon thread; ``result()`` re-raises its exception in the caller.

    JAX's config contexts are thread-local: the caller's x64 setting (on for float64 cells) is
    carried into the thread, or the thread would trace float64 inputs as float32."""

    def __init__(self, fn: Callable, name: str):
        self._box: dict = {}
        x64 = bool(jax.config.jax_enable_x64)

        def target():
            try:
                with jax.enable_x64(x64):
                    self._box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self._box["error"] = e

        self.thread = threading.Thread(target=target, daemon=True, name=name)
        self.thread.start()

    def result(self):
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
