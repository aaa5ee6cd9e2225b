"""Failed and degraded links: a fabric with links removed, links slowed, or ranks taken out (docs/cli.md,
"Failed and degraded links").

Pure functions over :class:`~synth.topology.model.Topology`. :func:`degrade_topology` applies
:class:`FabricEdits` and returns a new, validated topology named ``NAME-degraded`` whose description lists
the edits:

- ``exclude_links``: ``(a, b)`` removes both directions of the link between nodes ``a`` and ``b`` (the one
  direction where the file declared only one);
- ``degrade``: ``(a, b, f)`` multiplies both directions' bandwidth by ``f`` (``0 < f <= 1``; α unchanged:
  a slower link, not a longer one); the same link named twice gets the product of its factors;
- ``exclude_ranks``: removes those ranks and every link they touch, and renumbers the remaining ranks
  densely in their old order (``rank_map`` maps old -> new); a collective then runs over the remaining ranks.

Switches left without any link are dropped; the others keep their in-network features (a reducing switch
left with fewer than two ranks is refused, as in a file). Every failure -- an unknown node, a pair with no link, a
factor out of range, a fabric left disconnected -- is one :class:`SynthError` line.

:func:`degradation_of` recognises a fabric as a degraded copy of another by content alone (same ranks and
switch names, a subset of the links, no bandwidth larger, the same α), so a program made for the healthy
fabric can be timed on the degraded one, and refused where it sends over a removed link
(:func:`removed_links_used`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from synth.errors import SynthError
from synth.topology.model import Link, Topology

__all__ = [
    "FabricEdits",
    "Degraded",
    "Degradation",
    "parse_link_spec",
    "parse_degrade_spec",
    "degrade_topology",
    "degradation_of",
    "removed_links_used",
    "DEGRADED_SUFFIX",
]

#: Suffix of a degraded fabric's name.
DEGRADED_SUFFIX = "-degraded"
#: Relative bandwidth tolerance: a link within this of its healthy bandwidth is not degraded (rounding).
BW_TOLERANCE = 1e-9
#: Longest original description kept in the degraded fabric's description (the file limit is 4096).
_DESCRIPTION_KEEP = 1500

NodeName = int | str


@dataclass(frozen=True)
class FabricEdits:
    """What to take out or slow down, by node names as written in the topology file (ranks as text digits)."""

    exclude_links: tuple[tuple[str, str], ...] = ()
    degrade: tuple[tuple[str, str, float], ...] = ()
    exclude_ranks: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.exclude_links or self.degrade or self.exclude_ranks)


@dataclass(frozen=True)
class Degraded:
    """The result of :func:`degrade_topology`.

    ``removed`` and ``slowed`` are undirected node-name pairs of the original fabric (``slowed`` with the
    factor applied); ``rank_map[old]`` is the new rank of old rank ``old``, ``None`` for an excluded rank.
    """

    topology: Topology
    original: Topology
    removed: tuple[tuple[NodeName, NodeName], ...]
    slowed: tuple[tuple[NodeName, NodeName, float], ...]
    excluded_ranks: tuple[int, ...]
    dropped_switches: tuple[str, ...]
    rank_map: tuple[int | None, ...]
    #: The edits in words, as in the description ("link 0:1 removed", ...).
    changes: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON-ready summary: the edits, the rank mapping (old -> new, as strings for JSON keys) when
        ranks were excluded, and both fabrics' names and hashes."""
        out: dict = {
            "original": {"name": self.original.name, "sha256": self.original.sha256,
                         "ranks": self.original.num_ranks},
            "fabric": {"name": self.topology.name, "sha256": self.topology.sha256, "ranks": self.topology.num_ranks},
            "excluded_links": [f"{a}:{b}" for a, b in self.removed],
            "degraded_links": [{"link": f"{a}:{b}", "factor": f} for a, b, f in self.slowed],
            "excluded_ranks": list(self.excluded_ranks),
            "changes": list(self.changes),
        }
        if self.excluded_ranks:
            out["rank_map"] = {str(old): new for old, new in enumerate(self.rank_map) if new is not None}
        if self.dropped_switches:
            out["dropped_switches"] = list(self.dropped_switches)
        return out


def parse_link_spec(text: str) -> tuple[str, str]:
    """``SRC:DST`` -> ``(SRC, DST)`` as text; names are resolved later against a topology (a switch name
    may itself hold ``:``, see :func:`degrade_topology`). Raises :class:`SynthError` for a malformed spec."""
    text = text.strip()
    if ":" not in text:
        raise SynthError(f"link {text!r}: expected SRC:DST (two node names of the topology, e.g. 0:1 or 3:b0.nic3)")
    head, _, tail = text.partition(":")
    if not head or not tail:
        raise SynthError(f"link {text!r}: expected SRC:DST with both names given")
    return head, tail


def parse_degrade_spec(text: str) -> tuple[str, str, float]:
    """``SRC:DST=FACTOR`` -> ``(SRC, DST, FACTOR)`` with ``0 < FACTOR <= 1``."""
    link, sep, value = text.strip().rpartition("=")
    if not sep:
        raise SynthError(f"{text!r}: expected SRC:DST=FACTOR (e.g. 0:1=0.5)")
    try:
        factor = float(value)
    except ValueError:
        raise SynthError(f"{text!r}: FACTOR {value!r} is not a number") from None
    if not (math.isfinite(factor) and 0.0 < factor <= 1.0):
        raise SynthError(f"{text!r}: FACTOR must be in (0, 1], got {value}")
    src, dst = parse_link_spec(link)
    return src, dst, factor


def _node(topology: Topology, name: str) -> int | None:
    """Node id of a file-level name: a switch name first (names are free text), else a rank integer."""
    if name in topology.switches:
        return topology.node_id(name)
    text = name.strip()
    if text.isascii() and text.isdigit() and int(text) < topology.num_ranks:
        return int(text)
    return None


def _resolve_pair(topology: Topology, src: str, dst: str, option: str) -> tuple[int, int]:
    """The (a, b) node ids of a link spec. Where a switch name holds ``:``, every split of ``src:dst`` at a
    colon is tried; exactly one must name two nodes joined by a link."""
    spec = f"{src}:{dst}"
    splits = [(spec[:i], spec[i + 1:]) for i, ch in enumerate(spec) if ch == ":"]
    found = []
    for head, tail in splits:
        a, b = _node(topology, head), _node(topology, tail)
        if a is not None and b is not None:
            found.append((a, b))
    if not found:
        bad = src if _node(topology, src) is None else dst
        switches = ", ".join(topology.switches[:8]) + (", ..." if len(topology.switches) > 8 else "")
        hint = f"; switches: {switches}" if switches else ""
        raise SynthError(f"{option} {spec}: unknown node {bad!r} in {topology.name} "
                         f"(ranks 0..{topology.num_ranks - 1}{hint})")
    joined = [(a, b) for a, b in found if topology.link(a, b) is not None or topology.link(b, a) is not None]
    if not joined:
        a, b = found[0]
        raise SynthError(f"{option} {spec}: {topology.name} has no link between "
                         f"{topology.node_name(a)} and {topology.node_name(b)}")
    if len(joined) > 1:
        raise SynthError(f"{option} {spec}: ambiguous, it splits into several links at ':'")
    a, b = joined[0]
    if a == b:
        raise SynthError(f"{option} {spec}: a link joins two different nodes")
    return a, b


def _pair_key(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


def _description(original: Topology, parts: list[str]) -> str:
    kept = original.description.strip()
    if len(kept) > _DESCRIPTION_KEEP:
        kept = kept[: _DESCRIPTION_KEEP - 3] + "..."
    head = f"{original.name} (sha256 {original.sha256[:12]}) with " + "; ".join(parts) + "."
    return head + (f" Original: {kept}" if kept else "")


def degrade_topology(topology: Topology, edits: FabricEdits) -> Degraded:
    """Apply ``edits`` to ``topology`` (see the module docstring). The result is canonical and validated as a
    topology file would be; it raises :class:`SynthError` (one line) where an edit names no node or link,
    a factor is out of (0, 1], a rank is excluded twice or too many ranks go, or the fabric is left with a
    rank that cannot reach another (through switches and ranks, as the file check requires).

    Where the file's planes of one switch were joined on load (``Topology.as_written``), the edits name nodes and
    links as the file wrote them (one NVLink to one NVSwitch chip), and the edited fabric is joined again."""
    from synth.topology.io import parse_topology, switch_entries

    given, topology = topology, topology.as_written or topology
    removed: dict[tuple[int, int], None] = {}
    for src, dst in edits.exclude_links:
        a, b = _resolve_pair(topology, src, dst, "--exclude-link")
        removed[_pair_key(a, b)] = None
    factors: dict[tuple[int, int], float] = {}
    for src, dst, factor in edits.degrade:
        if not (math.isfinite(factor) and 0.0 < factor <= 1.0):
            raise SynthError(f"--degrade {src}:{dst}={factor}: FACTOR must be in (0, 1]")
        a, b = _resolve_pair(topology, src, dst, "--degrade")
        key = _pair_key(a, b)
        if key in removed:
            raise SynthError(f"--degrade {src}:{dst}: that link is also excluded (--exclude-link)")
        factors[key] = factors.get(key, 1.0) * factor

    excluded = tuple(sorted(set(edits.exclude_ranks)))
    for rank in excluded:
        if not 0 <= rank < topology.num_ranks:
            raise SynthError(f"--exclude-rank {rank}: not a rank of {topology.name} (0..{topology.num_ranks - 1})")
    if len(edits.exclude_ranks) != len(excluded):
        raise SynthError("--exclude-rank: a rank is named twice")
    if topology.num_ranks - len(excluded) < 2:
        raise SynthError(f"--exclude-rank: {topology.num_ranks - len(excluded)} rank(s) would remain of "
                         f"{topology.num_ranks}; a collective needs at least 2")

    # Keep, slow or drop every directed link; ranks renumber densely, switches keep their names.
    gone = set(excluded)
    rank_map: list[int | None] = []
    for rank in topology.ranks:
        rank_map.append(None if rank in gone else rank - sum(1 for g in excluded if g < rank))
    kept: list[Link] = []
    for link in topology.links:
        key = _pair_key(link.src, link.dst)
        if key in removed or link.src in gone or link.dst in gone:
            continue
        kept.append(replace(link, bw=link.bw * factors[key]) if key in factors else link)
    used = {node for link in kept for node in (link.src, link.dst)}
    switches = [s for k, s in enumerate(topology.switches) if topology.num_ranks + k in used]
    dropped = tuple(s for k, s in enumerate(topology.switches) if topology.num_ranks + k not in used)

    def name_of(node: int) -> int | str | None:
        return rank_map[node] if topology.is_rank(node) else topology.switches[node - topology.num_ranks]

    parts = [f"link {topology.node_name(a)}:{topology.node_name(b)} removed" for a, b in removed]
    parts += [f"link {topology.node_name(a)}:{topology.node_name(b)} bandwidth x{f:g}" for (a, b), f in factors.items()]
    if excluded:
        moves = ", ".join(f"{old}->{new}" for old, new in enumerate(rank_map) if new is not None and new != old)
        parts.append(f"rank(s) {', '.join(map(str, excluded))} excluded" + (f" (renumbered {moves})" if moves else ""))
    if dropped:
        parts.append(f"switch(es) {', '.join(dropped)} left without links and dropped")
    if not parts:
        parts.append("no edits")
    name = topology.name if topology.name.endswith(DEGRADED_SUFFIX) else topology.name + DEGRADED_SUFFIX
    doc = {
        "name": name,
        "description": _description(given, parts),
        "ranks": topology.num_ranks - len(excluded),
        **({"switches": switch_entries(topology, switches)} if switches else {}),
        **({"machines": [[rank_map[r] for r in m if rank_map[r] is not None] for m in topology.machines
                         if any(rank_map[r] is not None for r in m)]} if topology.machines else {}),
        "links": [{"src": name_of(link.src), "dst": name_of(link.dst), "bw": link.bw, "alpha": link.alpha,
                   "directed": True} for link in kept],
    }
    if not kept:
        raise SynthError(f"the edits leave {topology.name} without links")
    try:
        new = parse_topology(doc, source=name)
    except SynthError as exc:
        state = "disconnected" if "cannot reach" in str(exc) else "invalid"
        raise SynthError(f"the edits leave {topology.name} {state}: {exc}") from None
    new = replace(new, source=None)   # made in memory: provenance "generated"
    slowed = tuple((topology.node_name(a), topology.node_name(b), f) for (a, b), f in factors.items())
    return Degraded(topology=new, original=given,
                    removed=tuple((topology.node_name(a), topology.node_name(b)) for a, b in removed),
                    slowed=slowed, excluded_ranks=excluded, dropped_switches=dropped, rank_map=tuple(rank_map),
                    changes=tuple(parts))


@dataclass(frozen=True)
class Degradation:
    """How ``degraded`` differs from ``healthy`` (both the same ranks and switch names): directed links
    removed, and directed links slowed with their bandwidth ratio, as node-name pairs."""

    removed: tuple[tuple[NodeName, NodeName], ...]
    slowed: tuple[tuple[NodeName, NodeName, float], ...]


def _named_links(topology: Topology) -> dict[tuple[NodeName, NodeName], Link]:
    return {(topology.node_name(link.src), topology.node_name(link.dst)): link for link in topology.links}


def degradation_of(healthy: Topology, degraded: Topology) -> Degradation | None:
    """The links ``degraded`` lost or slowed relative to ``healthy``, or ``None`` where it is no degraded
    copy of it: other ranks, a switch ``healthy`` lacks, a link it lacks, a larger bandwidth or another α.
    (Identical fabrics give an empty :class:`Degradation`.) Where ``healthy``'s planes were joined on load, the
    fabrics are also compared as written (``Topology.as_written``): an edit of one plane (one NVLink to one
    NVSwitch chip) leaves that plane apart when the edited fabric is joined again, so only the written forms
    line up, and the links named are the written ones (no program's route names them: it loses bandwidth only)."""
    found = _degradation(healthy, degraded)
    if found is None and healthy.as_written is not None:
        found = _degradation(healthy.as_written, degraded.as_written or degraded)
    return found


def _degradation(healthy: Topology, degraded: Topology) -> Degradation | None:
    """:func:`degradation_of` on the fabrics as given."""
    if degraded.num_ranks != healthy.num_ranks or not set(degraded.switches) <= set(healthy.switches):
        return None
    old, new = _named_links(healthy), _named_links(degraded)
    if not set(new) <= set(old):
        return None
    removed, slowed = [], []
    for pair, link in old.items():
        other = new.get(pair)
        if other is None:
            removed.append(pair)
            continue
        if not math.isclose(other.alpha, link.alpha, rel_tol=BW_TOLERANCE, abs_tol=1e-12):
            return None
        if other.bw > link.bw * (1 + BW_TOLERANCE):
            return None
        if other.bw < link.bw * (1 - BW_TOLERANCE):
            slowed.append((*pair, other.bw / link.bw))
    return Degradation(removed=tuple(removed), slowed=tuple(slowed))


def removed_links_used(program_sends: set[tuple[int, int]], healthy: Topology,
                       removed: tuple[tuple[NodeName, NodeName], ...]) -> list[tuple[int, int, NodeName, NodeName]]:
    """The sends of a program (``(src rank, dst rank)`` pairs) whose route on ``healthy`` -- the route the
    runtime's transport takes, :class:`synth.topology.routes.RuntimePaths` -- crosses a ``removed`` link:
    ``(src, dst, link src name, link dst name)`` per such send and link, sorted."""
    from synth.topology.routes import RuntimePaths

    gone = set(removed)
    paths = RuntimePaths(healthy)
    hits = []
    for src, dst in sorted(program_sends):
        path = paths.path(src, dst)
        if path is None:
            continue
        for u, v in zip(path, path[1:]):
            pair = (healthy.node_name(u), healthy.node_name(v))
            if pair in gone:
                hits.append((src, dst, *pair))
    return hits
