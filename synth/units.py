"""Units of docs/units.md: sizes in bytes (K/M/G = 1000^k, KiB/MiB/GiB = 1024^k), bandwidth in GB/s, time in µs."""

from __future__ import annotations

import re

from synth.errors import SynthError

_SUFFIX = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

DEFAULT_SIZE = 2**30


def parse_size(text: str | int, allow_zero: bool = False) -> int:
    """Parse a SIZE such as ``1GiB``, ``64M`` or ``4096`` into bytes. ``allow_zero``: ``0`` is a value too
    (``--min-bytes``/``--max-bytes``, where 0 is the default and, for msccl-executor, "no limit")."""
    if isinstance(text, int):
        if text < 0 or (text == 0 and not allow_zero):
            raise SynthError(f"size must be positive, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if not match or match.group(2).upper() not in _SUFFIX:
        raise SynthError(f"invalid size {text!r}: use bytes or a K/M/G or KiB/MiB/GiB suffix")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value == 0 and allow_zero:
        return 0
    if value < 1:
        raise SynthError(f"size must be at least 1 byte, got {text!r}")
    return int(round(value))


def format_size(nbytes: float) -> str:
    """Human-readable size with binary suffixes (1GiB, 64MiB, 1000B)."""
    for suffix, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{int(nbytes // factor)}{suffix}"
    return f"{int(nbytes)}B"


def transfer_time_us(nbytes: float, bw_GBps: float, alpha_us: float) -> float:
    """α-β cost of one transfer: alpha + bytes / bw (GB/s = 1e3 bytes/µs)."""
    return alpha_us + nbytes / (bw_GBps * 1e3)


def algbw_GBps(size_bytes: float, time_us: float) -> float:
    """algbw = SIZE / time, in GB/s."""
    return size_bytes / (time_us * 1e3) if time_us > 0 else float("inf")
