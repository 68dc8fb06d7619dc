"""Exceptions raised by attnlab."""


class UnsupportedError(ValueError):
    """A backend was asked to run input it cannot handle correctly.

    ``backend`` names the backend and ``reason`` says why, e.g.
    ``cudnn: head dim 512 > 256``.
    """

    def __init__(self, backend: str, reason: str):
        self.backend = backend
        self.reason = reason
        super().__init__(f"{backend}: {reason}")
