"""The registry of synthesis methods: name -> :class:`~synth.synthesis.base.MethodSpec`.

Adding a method is one line in ``_ENTRIES``: ``"name": "synth.synthesis.module:ATTR"``, where the
module defines ``ATTR = MethodSpec(name=..., run=synthesize, collectives=..., description=...)``.
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
}


class _Registry(Mapping[str, MethodSpec]):
    """A read-only, lazily imported mapping over ``_ENTRIES``."""

    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = entries
        self._loaded: dict[str, MethodSpec] = {}

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


METHODS: Mapping[str, MethodSpec] = _Registry(_ENTRIES)


def get_method(name: str) -> MethodSpec:
    """The method called ``name``; SynthError listing the known ones otherwise."""
    key = name.strip().lower()
    if key not in METHODS:
        raise SynthError(f"unknown method {name!r}; expected one of auto, {', '.join(METHODS)}")
    return METHODS[key]


def methods_for(collective: str) -> list[str]:
    """Registered methods that support ``collective`` (canonical name), in registry order."""
    return [name for name in METHODS if collective in METHODS[name].collectives]
