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


class OutputMismatchError(ValueError):
    """An output handed to a check is not what the call returns: not an array, an array where the
    pair ``(out, lse)`` is expected or the reverse, or the wrong shape or dtype.

    ``argument`` names what was wrong (``out``, ``out[1] (lse)``) and ``rule`` the rule it breaks,
    e.g. ``out: must have shape (2, 64, 4, 32) (query's, with value's head dim), got (1, 64, 4, 32)``.
    """

    def __init__(self, argument: str, rule: str):
        self.argument = argument
        self.rule = rule
        super().__init__(f"{argument}: {rule}")


class RecordError(ValueError):
    """A results record that breaks the schema (``attnlab.core.record_model``): ``field`` names the
    field and ``rule`` the rule it breaks; ``where`` (a file and line) leads the message when given."""

    def __init__(self, field: str, rule: str, where: str = ""):
        self.field, self.rule = field, rule
        super().__init__(f"{where}record field {field!r}: {rule}")
