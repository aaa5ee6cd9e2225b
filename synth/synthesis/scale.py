"""Fast tree forests for very large fabrics (hundreds to thousands of ranks), used by ``trees``.

The exact packing (:mod:`synth.synthesis.packing`) needs a max-flow per tree arc, too slow beyond a
few hundred ranks. Here one spanning tree per root is built directly, in near-linear time:

- **Boxes behind switches** (``topology.machines`` with switch routes between boxes, e.g. DGX
  boxes whose GPUs have one NIC each): the tree of root ``r`` (local index ``k`` in box ``b``)
  runs on rail ``k`` only. Over boxes it is a binomial tree on positions ``p = (x - b) mod B``
  (box ``x`` of ``B``): position ``p`` feeds ``p + 2^t`` for every ``2^t > p`` below ``B``; the
  edge joins the rail-``k`` GPUs of the two boxes. Inside each box the piece then walks a chain
  ``k -> k+1 -> ... -> k-1`` (local indices mod the box size), so every GPU sends intra-box only
  to its successor: one send threadblock, no cross-threadblock ordering of the NVSwitch uplink
  (no ``nop`` steps), which keeps a rank of a 1024-rank allgather under MSCCL's 4096 XML nodes.
  Because the tree is rotated with the root's box, every box holds every position once per
  rail, so every NIC receives and sends exactly ``B - 1`` pieces: the box cut
  ``|R \\ box| / B⁺(box)`` is met when the NICs are the bottleneck (a hierarchical broadcast in
  the manner of Blink and NCCL's trees, balanced over the rails). A rank's inter-box peers are
  only the boxes at offsets ``±2^t``: ``⌈log2 B⌉`` per direction, so lowering stays under MSCCL's
  128 depended-on threadblocks (one per peer and direction) even at 128 boxes and more; the depth
  is ``⌈log2 B⌉`` inter-box hops plus the intra-box chain.
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

    nb = len(boxes)
    # binomial tree over box positions: (parent position, child position), parents first
    box_arcs = [(p, p + (1 << t)) for t in range(max(nb - 1, 1).bit_length())
                for p in range(min(1 << t, nb)) if p + (1 << t) < nb]
    out = []
    for r in roots:
        b = box_of[r]
        k = boxes[b].index(r)

        def rail(pos: int, b: int = b, k: int = k) -> int:
            box = boxes[(b + pos) % nb]
            return box[k % len(box)]

        def ring(pos: int, b: int = b, k: int = k) -> list[tuple[int, int]]:
            box = boxes[(b + pos) % nb]
            walk = [box[(k + j) % len(box)] for j in range(len(box))]
            return list(zip(walk, walk[1:]))

        edges = ring(0)
        edges += [(rail(p), rail(c)) for p, c in box_arcs]
        for pos in range(1, nb):
            edges += ring(pos)
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
