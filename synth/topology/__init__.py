"""Topology stage: the fabric model, file I/O with validation, and parametric generators."""

from synth.topology.model import Link, Topology

__all__ = ["Link", "Topology"]
