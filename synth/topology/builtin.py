"""Where the built-in topology files live.

Source checkout / editable install: the top-level ``topologies/`` next to the ``synth`` package.
Wheel install: the same files shipped as package data under ``synth/_topologies/`` (in a checkout,
a symlink to ``../topologies``; pyproject lists ``_topologies/*.yaml`` as package data of ``synth``).
The first directory that exists wins.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import synth

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SUFFIXES = (".yaml", ".yml", ".json")


def builtin_dirs() -> list[Path]:
    package = Path(synth.__file__).resolve().parent
    return [package / "_topologies", package.parent / "topologies"]


@lru_cache(maxsize=1)
def builtin_dir() -> Path | None:
    for directory in builtin_dirs():
        if directory.is_dir() and any(directory.glob("*.yaml")):
            return directory.resolve()  # in a checkout, _topologies links to ../topologies: report the real files
    return None


def builtin_names() -> list[str]:
    directory = builtin_dir()
    if directory is None:
        return []
    return sorted({p.stem for p in directory.iterdir() if p.suffix in _SUFFIXES and _NAME_RE.match(p.stem)})


def builtin_path(name: str) -> Path | None:
    """The file of built-in ``name`` (no path separators allowed), or None."""
    directory = builtin_dir()
    if directory is None or not _NAME_RE.match(name):
        return None
    for suffix in _SUFFIXES:
        candidate = directory / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None
