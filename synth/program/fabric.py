"""Which fabric a program runs on (docs/programs.md, ``fabric``).

A program records its fabric's content hash (:attr:`synth.topology.model.Topology.sha256`), where the
fabric came from, and the fabric itself. :func:`resolve_fabric` picks the topology for ``simulate`` and
``plot``: a ``-t`` argument must hash the same; without one, the embedded fabric; never another file
found by the name alone. Programs from before the hash (and foreign XML with ``-t``) still work, unchecked.
"""

from __future__ import annotations

from synth.errors import SynthError
from synth.program.ir import Fabric, Program
from synth.topology.builtin import builtin_path
from synth.topology.identity import fabric_of  # noqa: F401  (re-exported: the record a program embeds)
from synth.topology.io import load_topology, provenance, read_topology_file
from synth.topology.model import Topology


def check_fabric(program: Program, topology: Topology, given: str, where: str = "the program") -> None:
    """Refuse to run ``program`` on a ``topology`` (named ``given`` in the message) of other content."""
    fabric = program.fabric
    if fabric is None or fabric.sha256 == topology.sha256:
        return
    fix = ("drop -t to use the fabric embedded in the program, or pass -t FILE with the fabric it was made for"
           if fabric.topology is not None else "pass -t FILE with the fabric it was made for")
    raise SynthError(f"{where} was made for fabric {fabric.name!r} sha256 {fabric.sha256[:12]} ({fabric.source}), "
                     f"but {given} is {topology.name!r} sha256 {topology.sha256[:12]} ({provenance(topology)}); "
                     f"{fix}")


def _recorded(fabric: Fabric, where: str) -> Topology:
    """The fabric a program without an embedded copy names by provenance (a built-in, or a file)."""
    kind, _, ref = fabric.source.partition(":")
    path = builtin_path(ref) if kind == "builtin" else ref if kind == "file" else None
    if not path:
        raise SynthError(f"{where} carries no copy of its fabric {fabric.name!r} ({fabric.source}); "
                         "pass -t FILE with the fabric it was made for")
    return read_topology_file(path)


def program_sends(program: Program) -> set[tuple[int, int]]:
    """The (src rank, dst rank) connections over which ``program`` sends at least once."""
    return {(gpu.id, tb.send) for gpu in program.gpus for tb in gpu.threadblocks
            if tb.send >= 0 and any(step.sends for step in tb.steps)}


def _healthy_fabric(program: Program, where: str) -> Topology | None:
    """The fabric ``program`` was made for (embedded, else by its recorded provenance), or None."""
    fabric = program.fabric
    if fabric is None:
        return None
    if fabric.topology is not None:
        return fabric.topology
    try:
        topo = _recorded(fabric, where)
    except SynthError:
        return None
    return topo if topo.sha256 == fabric.sha256 else None


def _on_degraded(program: Program, topology: Topology, given: str, where: str) -> str | None:
    """Where ``topology`` is a degraded copy of the program's fabric (:func:`synth.topology.degrade.degradation_of`:
    links removed or slowed, nothing added): refuse a program that sends over a removed link, naming the link,
    else a warning that it runs on the degraded copy. None where the check does not apply (same fabric, no
    recorded fabric, or not a degraded copy: :func:`check_fabric` decides)."""
    from synth.topology.degrade import degradation_of, removed_links_used

    if program.fabric is None or program.fabric.sha256 == topology.sha256:
        return None
    healthy = _healthy_fabric(program, where)
    change = degradation_of(healthy, topology) if healthy is not None else None
    if change is None:
        return None
    hits = removed_links_used(program_sends(program), healthy, change.removed)
    if hits:
        src, dst, u, v = hits[0]
        more = f" (and {len(hits) - 1} more send(s) over removed links)" if len(hits) > 1 else ""
        raise SynthError(f"{where} uses link {u}->{v}, which {given} ({topology.name!r}, a degraded copy of "
                         f"{healthy.name!r}) removed: rank {src} sends to rank {dst} over it{more}; synthesize "
                         f"a program for the degraded fabric")
    parts = [f"{len(change.removed)} directed link(s) removed, none of which it uses"] if change.removed else []
    parts += [f"{len(change.slowed)} directed link(s) slowed"] if change.slowed else []
    return (f"{where} was made for {healthy.name!r}; timing it on {topology.name!r}, a degraded copy of it "
            f"({'; '.join(parts) or 'same links'})")


def resolve_fabric(program: Program, topology: str | Topology | None,
                   where: str = "the program", given: str | None = None) -> tuple[Topology, list[str]]:
    """The topology to time ``program`` on, from ``-t`` (``topology``) or the program, and warnings.

    Raises :class:`SynthError` where the content differs from the fabric the program was made for, except
    on a degraded copy of it that keeps every link the program sends over (a warning says so). ``given``
    names ``topology`` in messages (default ``-t NAME``).
    """
    if topology is not None:
        given = given or (f"-t {topology}" if isinstance(topology, str) else "the topology given")
        topo = load_topology(topology) if isinstance(topology, str) else topology
        note = _on_degraded(program, topo, given, where)
        if note is not None:
            return topo, [note]
        check_fabric(program, topo, given, where)
        return topo, []
    fabric = program.fabric
    if fabric is None:
        if not program.topology:
            raise SynthError(f"{where}: the program names no topology (foreign MSCCL XML?); pass -t TOPOLOGY")
        topo = load_topology(program.topology)
        return topo, [f"{where} records only the topology name {program.topology!r}, no content hash: the fabric "
                      f"is unchecked, resolved by name to {provenance(topo)} (synthesize it again to record it)"]
    if fabric.topology is not None:
        return fabric.topology, []
    topo = _recorded(fabric, where)
    check_fabric(program, topo, f"its recorded source {fabric.source}", where)
    return topo, []
