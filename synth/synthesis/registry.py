"""The registry of synthesis methods: name -> :class:`~synth.synthesis.base.MethodSpec`.

A method is one module that defines ``METHOD = MethodSpec(name=..., run=synthesize, collectives=...,
description=..., auto=AutoRule(when=...))`` and calls :func:`register` on it (or, for the built-ins,
one line in ``_ENTRIES``: ``"name": "synth.synthesis.module:ATTR"``, imported on first use). A
registered method appears in ``--list-methods``, ``-m``, ``compare``, ``sweep`` and, through its
``auto`` rule, in ``auto``, with no other edit.
Modules are imported only when their entry is first used, so ``synth --help`` stays instant and a
method's heavy imports (OR-Tools, HiGHS) are paid only by the runs that use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from synth.errors import SynthError
from synth.synthesis.base import MethodSpec

_ENTRIES: dict[str, str] = {
    "ring": "synth.synthesis.ring:METHOD",
    "multiring": "synth.synthesis.multiring:METHOD",
    "leafring": "synth.synthesis.leafring:METHOD",
    "spantree": "synth.synthesis.spantree:METHOD",
    "trees": "synth.synthesis.trees:METHOD",
    "lp": "synth.synthesis.lp:METHOD",
    "greedy": "synth.synthesis.greedy:METHOD",
    "milp": "synth.synthesis.milp:METHOD",
    "pareto": "synth.synthesis.pareto:METHOD",
    "dbt": "synth.synthesis.baselines:DBT",
    "rdh": "synth.synthesis.baselines:RDH",
    "direct": "synth.synthesis.baselines:DIRECT",
    "hierarchical": "synth.synthesis.baselines:HIERARCHICAL",
    "nccl": "synth.synthesis.baselines:NCCL",
    "nvls": "synth.synthesis.nvls:METHOD",
    "railblocks": "synth.synthesis.railblocks:METHOD",
    "rsag": "synth.synthesis.rsag:METHOD",
    "mirror": "synth.synthesis.mirror:METHOD",
    "levels": "synth.synthesis.levels:METHOD",
}


class _Registry(Mapping[str, MethodSpec]):
    """A read-only, lazily imported mapping over ``_ENTRIES``."""

    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = entries
        self._loaded: dict[str, MethodSpec] = {}

    def add(self, spec: MethodSpec, target: str) -> None:
        self._entries[spec.name] = target
        self._loaded[spec.name] = spec

    def remove(self, name: str) -> None:
        del self._entries[name]
        self._loaded.pop(name, None)

    def __getitem__(self, name: str) -> MethodSpec:
        if name not in self._loaded:
            target = self._entries[name]
            module, _, attr = target.partition(":")
            spec = getattr(importlib.import_module(module), attr or "METHOD")
            if not isinstance(spec, MethodSpec) or spec.name != name:
                raise TypeError(f"registry entry {name!r} -> {target} is not a MethodSpec named {name!r}")
            self._loaded[name] = spec
        return self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


METHODS = _Registry(_ENTRIES)
_REGISTERED: list[str] = []   # names added by register(), in order
REGISTERED = "<registered>"   # the _ENTRIES target of a method added by register()


def register(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add ``spec`` to the registry (plug-ins, toy methods): it is then a method like the built-ins.

    Raises SynthError when the name is taken, unless ``replace``; a built-in cannot be replaced."""
    if not isinstance(spec, MethodSpec):
        raise SynthError(f"register() takes a MethodSpec, got {type(spec).__name__}")
    taken = spec.name in _ENTRIES
    if taken and (not replace or _ENTRIES[spec.name] != REGISTERED):
        raise SynthError(f"a method named {spec.name!r} is already registered")
    METHODS.add(spec, REGISTERED)
    if spec.name not in _REGISTERED:
        _REGISTERED.append(spec.name)
    return spec


def unregister(name: str) -> None:
    """Remove a method added by :func:`register` (built-ins stay)."""
    if _ENTRIES.get(name) != REGISTERED:
        raise SynthError(f"no method {name!r} was added by register()")
    METHODS.remove(name)
    _REGISTERED.remove(name)


def registered() -> list[MethodSpec]:
    """The methods added by :func:`register`, in registration order."""
    return [METHODS[name] for name in _REGISTERED]


def get_method(name: str) -> MethodSpec:
    """The method called ``name``; SynthError listing the known ones otherwise."""
    key = name.strip().lower()
    if key not in METHODS:
        raise SynthError(f"unknown method {name!r}; expected one of auto, {', '.join(METHODS)}")
    return METHODS[key]


def methods_for(collective: str) -> list[str]:
    """Registered methods that support ``collective`` (canonical name), in registry order."""
    return [name for name in METHODS if collective in METHODS[name].collectives]
