"""User-facing error types. The CLI maps them to exit codes (SPEC: 2 bad input, 1 failed check)."""


class SynthError(Exception):
    """Bad input, impossible request or solver failure: one clear line, exit code 2."""


class CheckFailed(Exception):
    """A check ran and found the program wrong (verify, execute): exit code 1."""
