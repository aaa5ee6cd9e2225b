"""Fast tree forests for very large fabrics (hundreds to thousands of ranks), used by ``trees``.

The exact packing (:mod:`synth.synthesis.packing`) needs a max-flow per tree arc, too slow beyond a
few hundred ranks. Here one spanning tree per root is built directly, in near-linear time:

- **Boxes behind switches** (``topology.machines`` with switch routes between boxes, e.g. DGX
  boxes whose GPUs have one NIC each): a three-level tree per root ``r`` in box ``b``:
  ``r`` -> its box-mates; box-mate with local index ``i`` -> the GPU of the same local index in
  the remote boxes ``b'`` whose position ``j`` (rotated by ``r``'s local index) has
  ``j mod |b| == i``; each such GPU -> its own box-mates. Every box then receives every remote
  piece exactly once, spread evenly over its NICs, which meets the box cut
  ``|R \\ box| / B⁺(box)`` when the NICs are the bottleneck (a hierarchical broadcast in the
  manner of Blink and NCCL's trees, balanced over the NICs).
- **Switchless graphs** (tori, meshes, hypercubes): a BFS tree per root whose parent choice is
  load-aware: each newly reached rank takes, among its parents in the previous BFS layer, the link
  with the least load so far (per unit of bandwidth). On vertex-transitive graphs this spreads the
  N(N−1) tree arcs almost evenly over the links, close to the cut bound.

The rate is not certified exact here; the forest reports the achieved ratio from its link loads.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from synth.errors import SynthError
from synth.synthesis.packing import Route, integer_fabric
from synth.topology.model import Topology


def switch_route(topology: Topology, u: int, v: int, _cache: dict | None = None) -> Route | None:
    """Switches on the path a program's ``u -> v`` send takes: () for a direct link, else the
    fewest-hop switch-only path of up to three switches (least Σα, then smallest ids); None if none."""
    if topology.link(u, v) is not None:
        return ()
    out_sw = [lk for lk in topology.out_links[u] if topology.is_switch(lk.dst)]
    in_sw = {lk.src: lk.alpha for lk in topology.in_links[v] if topology.is_switch(lk.src)}
    best: tuple | None = None
    for a in out_sw:                       # one switch
        if a.dst in in_sw:
            cand = (2, a.alpha + in_sw[a.dst], (a.dst,))
            best = cand if best is None or cand < best else best
    if best is not None:
        return best[2]
    for a in out_sw:                       # two switches
        for b in topology.out_links[a.dst]:
            if b.dst in in_sw:
                cand = (3, a.alpha + b.alpha + in_sw[b.dst], (a.dst, b.dst))
                best = cand if best is None or cand < best else best
    if best is not None:
        return best[2]
    for a in out_sw:                       # three switches
        for b in topology.out_links[a.dst]:
            if not topology.is_switch(b.dst):
                continue
            for c in topology.out_links[b.dst]:
                if c.dst in in_sw:
                    cand = (4, a.alpha + b.alpha + c.alpha + in_sw[c.dst], (a.dst, b.dst, c.dst))
                    best = cand if best is None or cand < best else best
    return None if best is None else best[2]


def box_trees(topology: Topology, roots: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int]], list[Route]]]:
    """Three-level trees per root over ``topology.machines`` (module docstring)."""
    boxes = [list(box) for box in topology.machines]
    box_of = {r: b for b, box in enumerate(boxes) for r in box}
    if len(box_of) != topology.num_ranks:
        raise SynthError("machines do not cover every rank")
    routes: dict[tuple[int, int], Route] = {}

    def route(u: int, v: int) -> Route:
        key = (u, v)
        if key not in routes:
            found = switch_route(topology, u, v)
            if found is None:
                raise SynthError(f"no switch route from rank {u} to rank {v}")
            routes[key] = found
        return routes[key]

    out = []
    nb = len(boxes)
    for r in roots:
        b = box_of[r]
        mates = boxes[b]
        me = mates.index(r)
        edges = [(r, m) for m in mates if m != r]
        for j in range(1, nb):
            remote = boxes[(b + j) % nb]
            i = (j - 1 + me) % len(mates)   # rotate with the root, so every NIC gets its share
            sender = mates[i]
            receiver = remote[i % len(remote)]
            edges.append((sender, receiver))
            edges += [(receiver, m) for m in remote if m != receiver]
        # BFS order: the root's own edges first, then the inter-box ones, then the remote fan-outs
        edges.sort(key=lambda e: (0 if e[0] == r else 1 if box_of[e[0]] == b else 2))
        out.append((r, edges, [route(u, v) for u, v in edges]))
    return out


def balanced_bfs_trees(topology: Topology,
                       roots: tuple[int, ...]) -> list[tuple[int, list[tuple[int, int]], list[Route]]]:
    """Load-aware BFS trees on a switchless graph (module docstring)."""
    if topology.switches:
        raise SynthError("balanced BFS trees need a switchless fabric")
    src, dst, bw, _ = topology.arrays
    n = topology.num_ranks
    order = np.lexsort((dst, src))
    src, dst, bw = src[order], dst[order], bw[order]
    load = np.zeros(len(src))
    out = []
    for r in roots:
        seen = np.zeros(n, dtype=bool)
        seen[r] = True
        frontier = np.array([r])
        edges: list[tuple[int, int]] = []
        while frontier.size:
            mask = np.isin(src, frontier) & ~seen[dst]
            cand = np.nonzero(mask)[0]
            if cand.size == 0:
                break
            cost = (load[cand] + 1) / bw[cand]
            pick = cand[np.lexsort((cost, dst[cand]))]
            first = np.ones(pick.size, dtype=bool)
            first[1:] = dst[pick][1:] != dst[pick][:-1]
            chosen = pick[first]
            load[chosen] += 1
            seen[dst[chosen]] = True
            edges += list(zip(src[chosen].tolist(), dst[chosen].tolist()))
            frontier = dst[chosen]
        if len(edges) != n - 1:
            raise SynthError(f"rank {r} cannot reach every rank")
        out.append((r, edges, [()] * len(edges)))
    return out


def achieved_ratio(topology: Topology, trees, reverse: bool) -> tuple[Fraction, Fraction]:
    """(ratio, unit) of a one-tree-per-root forest: max over links of load / bandwidth units."""
    fabric_topology = topology.reversed() if reverse else topology
    fabric = integer_fabric(fabric_topology)
    index = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(fabric.tails, fabric.heads))}
    load = np.zeros(len(fabric.units), dtype=np.int64)
    for _, edges, routes in trees:
        for (u, v), route in zip(edges, routes):
            nodes = (u, *route, v)
            for a, b in zip(nodes, nodes[1:]):
                load[index[(a, b)]] += 1
    ratio = max(Fraction(int(x), int(u)) for x, u in zip(load, fabric.units))
    return ratio, fabric.unit_GBps
