"""The error a stage raises when its message alone tells the user what to do."""


class ActionableError(RuntimeError):
    """A stage failure whose one-line message says what happened and what to do.

    The runner reports it as that line (no traceback) and publishes nothing.
    """
