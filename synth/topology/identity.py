"""A fabric's identity, as schedules and programs record it (docs/programs.md, ``fabric``).

A name does not identify a fabric (a file may be called ``dgx1`` with other bandwidths): its content hash
(:attr:`synth.topology.model.Topology.sha256`) does. The synthesis request (:class:`synth.synthesis.base.Instance`)
takes it from the topology as given, its schedule carries it, and the program written from it records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from synth.topology.io import provenance
from synth.topology.model import Topology


@dataclass(frozen=True)
class Fabric:
    """The fabric a schedule or program was made for: its name, content hash (:attr:`Topology.sha256`), where
    it came from (``builtin:NAME``, ``file:/abs/path``, ``generated``) and, when known, the topology itself,
    which makes a program file self-contained."""

    name: str
    sha256: str
    source: str
    topology: Topology | None = field(default=None, compare=False)


def fabric_of(topology: Topology) -> Fabric:
    """The :class:`Fabric` record of ``topology``, which it embeds."""
    return Fabric(name=topology.name, sha256=topology.sha256, source=provenance(topology), topology=topology)
