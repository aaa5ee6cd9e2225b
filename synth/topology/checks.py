"""Topology checks shared by every way a fabric is built (files, generators, importers): merging link
entries into canonical directed links, and the graph-level checks (no isolated switch, every rank reaches
every other rank; docs/topology.md). Kept apart from :mod:`synth.topology.io` so that the importers, which
:mod:`synth.topology.io` calls for msccl-tools files, do not import it back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable

from synth.errors import SynthError
from synth.topology.model import Link, SwitchFeatures, Topology

#: The largest link (and reduction engine) bandwidth, GB/s, and the largest α, µs, a topology may give (the
#: schema's ``maximum``): a thousand times past any real link, and low enough that times stay exact in
#: float64 and the bounds' integer capacities in int64 (1e30 GB/s overflowed them; α 1e12 µs made the
#: schedules' event times collide).
MAX_BW_GBPS = 1e6
MAX_ALPHA_US = 1e6
#: The least bandwidth, GB/s (1 kB/s, the schema's ``minimum``): a million times below any real link, and high
#: enough that a transfer's time stays finite (bw 1e-320, a subnormal, made every time infinite).
MIN_BW_GBPS = 1e-6


def _fail(source: str, where: str, problem: str) -> SynthError:
    where = f"{where}: " if where else ""
    return SynthError(re.sub(r"\s+", " ", f"{source}: {where}{problem}").strip())


# --------------------------------------------------------------------------------------------
# link merging (shared with the generators)


def merge_links(
    entries: Iterable[tuple[int, int, float, float, bool]],
    fail: Callable[[int, str], Exception],
) -> tuple[Link, ...]:
    """Merge link entries ``(src, dst, bw, alpha, directed)`` into canonical directed links.

    An undirected entry is one link in each direction. Entries on the same (src, dst) add their
    bandwidth and must agree on α (docs/topology.md); ``fail(entry_index, problem)`` builds the error.
    """
    acc: dict[tuple[int, int], list] = {}
    for index, (src, dst, bw, alpha, directed) in enumerate(entries):
        pairs = ((src, dst),) if directed else ((src, dst), (dst, src))
        for pair in pairs:
            cur = acc.get(pair)
            if cur is None:
                acc[pair] = [float(bw), float(alpha), index]
            elif cur[1] != float(alpha):
                raise fail(
                    index,
                    f"alpha {alpha:g} on {pair[0]} -> {pair[1]} disagrees with alpha {cur[1]:g} "
                    f"of links[{cur[2]}] (parallel entries add bandwidth and must share alpha)",
                )
            else:
                cur[0] += float(bw)
    return tuple(Link(s, d, v[0], v[1]) for (s, d), v in sorted(acc.items()))


def join_parallel_switches(num_ranks: int, switches: tuple[str, ...], links: tuple[Link, ...],
                           features: dict[str, SwitchFeatures]) -> tuple[tuple[str, ...], tuple[Link, ...]]:
    """Switches that are planes of one switch, joined into the first of them (docs/topology.md, "Parallel
    switches"): two switches are planes of one when they link the same nodes, at least one of them a rank, with
    the same α both ways on every link, and do no in-network work (NVSwitch chips that every GPU of a box
    links to; two NICs of one GPU into the same network switch). Their links to each node add bandwidth, as
    parallel link entries do: a transfer stripes over the planes (NVLink does so across NVSwitch chips, NCCL's
    channels across a GPU's NICs), where one fixed route per rank pair would use one plane of them.
    Repeated until no two switches are planes of one (a joined switch can make its neighbours' planes equal).
    Returns the switches left, in order, and the links renumbered to them."""
    while True:
        neighbours: dict[int, dict[int, list]] = {}
        for link in links:
            for here, there, way in ((link.src, link.dst, 0), (link.dst, link.src, 1)):
                if here >= num_ranks:
                    neighbours.setdefault(here, {}).setdefault(there, [None, None])[way] = link.alpha
        planes: dict[tuple, list[int]] = {}
        for switch, near in neighbours.items():
            work = features.get(switches[switch - num_ranks])
            if any(node < num_ranks for node in near) and (work is None or work.plain):
                planes.setdefault(tuple(sorted((node, *alphas) for node, alphas in near.items())), []).append(switch)
        into = {other: group[0] for group in planes.values() if len(group) > 1 for other in group[1:]}
        if not into:
            return switches, links
        kept = [w for w in range(num_ranks, num_ranks + len(switches)) if w not in into]
        new_id = {w: num_ranks + k for k, w in enumerate(kept)}
        renamed = list(range(num_ranks)) + [new_id[into.get(w, w)] for w in range(num_ranks, num_ranks + len(switches))]
        joined: dict[tuple[int, int], list[float]] = {}
        for link in links:
            pair = (renamed[link.src], renamed[link.dst])
            joined.setdefault(pair, [0.0, link.alpha])[0] += link.bw
        switches = tuple(switches[w - num_ranks] for w in kept)
        links = tuple(Link(a, b, bw, alpha) for (a, b), (bw, alpha) in sorted(joined.items()))


# --------------------------------------------------------------------------------------------
# graph checks


def _adjacency(topology: Topology):
    import numpy as np
    from scipy.sparse import csr_matrix

    src, dst, _, _ = topology.arrays
    n = topology.num_nodes
    return csr_matrix((np.ones(len(src), dtype=np.int8), (src, dst)), shape=(n, n))


def _unreachable_pair(topology: Topology) -> tuple[int, int] | None:
    """A (src, dst) rank pair with no directed path, or None when every rank reaches every rank.

    Every rank reaches rank 0 and rank 0 reaches every rank iff all ranks are mutually reachable.
    """
    if topology.num_ranks <= 1:
        return None
    import numpy as np
    from scipy.sparse.csgraph import breadth_first_order

    graph = _adjacency(topology)
    for matrix, forward in ((graph, True), (graph.T.tocsr(), False)):
        order = breadth_first_order(matrix, 0, directed=True, return_predecessors=False)
        seen = np.zeros(topology.num_nodes, dtype=bool)
        seen[order] = True
        missing = np.flatnonzero(~seen[: topology.num_ranks])
        if len(missing):
            other = int(missing[0])
            return (0, other) if forward else (other, 0)
    return None


def hop_diameter(topology: Topology, block: int = 512) -> int:
    """Max over ordered rank pairs of the hop count of a shortest directed path (switches allowed).

    Unweighted BFS from every rank (scipy.sparse.csgraph, in blocks of sources to bound memory).
    Returns -1 if some rank cannot reach another.
    """
    import numpy as np
    from scipy.sparse.csgraph import shortest_path

    n = topology.num_ranks
    if n <= 1:
        return 0
    graph = _adjacency(topology)
    best = 0.0
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        dist = shortest_path(graph, directed=True, unweighted=True, indices=rows)[:, :n]
        worst = float(dist.max())
        if not math.isfinite(worst):
            return -1
        best = max(best, worst)
    return int(best)


def switch_ranks(topology: Topology, switch: int) -> tuple[int, ...]:
    """The ranks that have a link to ``switch`` and a link from it, directly or through other switches only
    (no other rank on the way): the ranks an in-network operation of ``switch`` can serve."""

    def reached(forward: bool) -> set[int]:
        found: set[int] = set()
        seen = {switch}
        stack = [switch]
        while stack:
            node = stack.pop()
            for link in (topology.out_links[node] if forward else topology.in_links[node]):
                other = link.dst if forward else link.src
                if other in seen:
                    continue
                seen.add(other)
                if topology.is_rank(other):
                    found.add(other)
                else:
                    stack.append(other)
        return found

    return tuple(sorted(reached(True) & reached(False)))


def canonical_features(switches: tuple[str, ...],
                       features: Iterable[tuple[str, SwitchFeatures]]) -> tuple[tuple[str, SwitchFeatures], ...]:
    """``features`` as :attr:`Topology.features` holds them: plain switches left out, in the order of
    ``switches`` (names not in ``switches`` last, for :func:`check_topology` to refuse)."""
    order = {name: k for k, name in enumerate(switches)}
    kept = {name: f for name, f in features if not f.plain}
    return tuple(sorted(kept.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def with_switch_features(topology: Topology, features: Iterable[tuple[str, SwitchFeatures]] | dict,
                         source: str | None = None) -> Topology:
    """``topology`` with in-network ``features`` by switch name (docs/topology.md, "In-network reduction"),
    canonical and checked as a file would be."""
    from dataclasses import replace

    items = features.items() if isinstance(features, dict) else features
    return check_topology(replace(topology, features=canonical_features(topology.switches, items)), source)


def _check_features(topology: Topology, source: str) -> None:
    """In-network features name switches of the fabric, have sane numbers, and serve two ranks at least."""
    index = {name: k for k, name in enumerate(topology.switches)}
    if list(topology.features) != list(canonical_features(topology.switches, topology.features)):
        raise _fail(source, "switches", "in-network features must be listed once per switch, in switch order")
    for name, f in topology.features:
        if name not in index:
            raise _fail(source, "switches", f"in-network features for unknown switch {name!r}")
        where = f"switches[{index[name]}]"
        if not 0 <= f.reduce_alpha <= MAX_ALPHA_US:
            raise _fail(source, f"{where}.reduce_alpha", f"must be a number in [0, {MAX_ALPHA_US:g}] (µs), "
                                                         f"got {f.reduce_alpha!r}")
        if not (MIN_BW_GBPS <= f.reduce_bw <= MAX_BW_GBPS or f.reduce_bw == math.inf):   # inf: no limit of its own
            raise _fail(source, f"{where}.reduce_bw", f"must be in [{MIN_BW_GBPS:g}, {MAX_BW_GBPS:g}] (GB/s), "
                                                      f"got {f.reduce_bw!r}")
        if not f.reduce and (f.reduce_alpha != 0 or math.isfinite(f.reduce_bw)):
            raise _fail(source, where, f"reduce_alpha and reduce_bw need reduce: true on switch {name!r}")
        served = switch_ranks(topology, topology.num_ranks + index[name])
        if len(served) < 2:
            what = "reducing" if f.reduce else "multicast"
            raise _fail(source, where, f"{what} switch {name!r} has links to and from {len(served)} rank(s) "
                                       f"(directly or through switches); it needs at least 2")


def _check_link_range(topology: Topology, link: Link, source: str) -> None:
    """Every way a fabric is built (files, generators, importers, merged parallel entries) keeps each link's
    bandwidth in [MIN_BW_GBPS, MAX_BW_GBPS] and its α in [0, MAX_ALPHA_US], finite."""
    where = f"link {topology.node_name(link.src)!r} -> {topology.node_name(link.dst)!r}"
    if not MIN_BW_GBPS <= link.bw <= MAX_BW_GBPS:
        raise _fail(source, "links", f"{where}: bw {link.bw:g} GB/s is not in [{MIN_BW_GBPS:g}, {MAX_BW_GBPS:g}] "
                                     "(parallel entries add their bandwidths)")
    if not 0 <= link.alpha <= MAX_ALPHA_US:
        raise _fail(source, "links", f"{where}: alpha {link.alpha:g} us is not in [0, {MAX_ALPHA_US:g}]")


def check_topology(topology: Topology, source: str | None = None) -> Topology:
    """Graph-level checks: no isolated switch; every rank reaches every other rank; in-network features
    (docs/topology.md, "In-network reduction") name switches that serve at least two ranks."""
    source = source or topology.source or topology.name
    touched = set()
    for link in topology.links:
        touched.add(link.src)
        touched.add(link.dst)
        _check_link_range(topology, link, source)
    for k, name in enumerate(topology.switches):
        if topology.num_ranks + k not in touched:
            raise _fail(source, f"switches[{k}]", f"switch {name!r} is isolated (no links)")
    pair = _unreachable_pair(topology)
    if pair is not None:
        raise _fail(
            source,
            "links",
            f"rank {pair[0]} cannot reach rank {pair[1]} (every rank must reach every other rank)",
        )
    if topology.features:
        _check_features(topology, source)
    return topology
