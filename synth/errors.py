"""User-facing error types. The CLI maps them to exit codes (docs/cli.md: 2 bad input, 1 failed check)."""


class SynthError(Exception):
    """Bad input, impossible request or solver failure: one clear line, exit code 2."""


class TimeLimitReached(SynthError):
    """``--time-limit``, the user's wall-clock safety stop, ran out before a method or solver finished.
    Raised instead of returning what a shorter search found, so that a program never depends on the
    machine's speed or load (exit code 2)."""


class CheckFailed(Exception):
    """A check ran and found the program wrong (verify, execute): exit code 1."""
