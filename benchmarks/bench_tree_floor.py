"""How close to the cut bound can a program on the links of a ``trees`` forest get under MSCCL's step limit?

Usage: python benchmarks/bench_tree_floor.py [--topology mi250-2node] [--size 1GiB]
       [--caps 256,16,8] [--chunks 1024,512,256,128]

For an allgather forest (``k`` trees per root, :func:`synth.synthesis.trees.plan_forest` with
``--max-trees`` = cap) at ``C`` chunks per root, tree ``t`` carries ``c_t`` chunks
(:func:`split_chunks`) over every edge. One MSCCL step moves fewer than 72 chunks (``MAX_STEP_CHUNKS``
= 71) and pays its route's α, so a link ``l`` carrying ``c_l = Σ_t c_t`` chunks is busy for at least

    any  = data_l + min α · ⌈c_l / 71⌉                      (any program that loads the links so)
    tree = Σ_t ( c_t · chunk_bytes / bw_t + α_t · ⌈c_t / 71⌉ )  (every message of one tree)

with ``bw_t`` the least bandwidth and ``α_t`` the summed α of the route. The busiest link bounds the
makespan; pipelining (several messages per tree and link), fill and drain only add to it. The
``trees`` method's messages hold one tree's chunks unless two trees' contiguous shares happen to be
coalesced, so ``tree`` is what its schedules meet in practice and ``any`` is a strict limit. The table
prints ``bound / floor``: the best ratio to ``synth bounds`` either allows.

The ``cut`` column holds for every program at ``C`` chunks per root, whatever its trees or paths. A
message on link ``l`` holds it for at least ``α'_l`` (its own α, plus the least α of a hop on the far
side of a switch, since a route through a switch pays both) and carries at most ``m = 71`` chunks, so
``l`` moves at most ``b'_l = b_l / (1 + α'_l · b_l / m)`` bytes per µs. Each cut ``S`` then needs
``T ≥ need(S) / Σ_{l into S} b'_l``: the cut bound of ``synth bounds`` on the fabric with ``b'`` for ``b``.
"""

from __future__ import annotations

import argparse
import math


def floor_us(forest, topology, per_root_bytes: float, chunks: int) -> tuple[float, float, float, str]:
    """(the ``any`` and ``tree`` floors of the module docstring, the busiest link's data time alone,
    the link of the ``tree`` floor as 'a->b')."""
    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.trees import split_chunks

    links = {(link.src, link.dst): link for link in topology.links}
    counts = {}
    for root in sorted({t.root for t in forest.trees}):
        for t, c in enumerate(split_chunks(forest, root, chunks)):
            if forest.trees[t].root == root:
                counts[t] = c
    chunk_bytes = per_root_bytes / chunks
    data: dict[tuple[int, int], float] = {}
    carried: dict[tuple[int, int], int] = {}
    least_alpha: dict[tuple[int, int], float] = {}
    per_tree: dict[tuple[int, int], float] = {}
    for t, tree in enumerate(forest.trees):
        c = counts[t]
        for (parent, child), routes in zip(tree.edges, tree.routes):
            route = routes[0][0]   # the units of an edge may take several routes; the first stands for all
            nodes = (parent, *route, child)
            hops = [links[pair] for pair in zip(nodes, nodes[1:])]
            alpha = sum(h.alpha for h in hops)
            seconds = c * chunk_bytes / (min(h.bw for h in hops) * 1e3)
            for pair in zip(nodes, nodes[1:]):
                data[pair] = data.get(pair, 0.0) + seconds
                carried[pair] = carried.get(pair, 0) + c
                least_alpha[pair] = min(least_alpha.get(pair, alpha), alpha)
                per_tree[pair] = per_tree.get(pair, 0.0) + seconds + alpha * math.ceil(c / MAX_STEP_CHUNKS)
    any_floor = max(data[p] + least_alpha[p] * math.ceil(carried[p] / MAX_STEP_CHUNKS) for p in data)
    worst = max(per_tree, key=per_tree.get)
    link = f"{topology.node_name(worst[0])}->{topology.node_name(worst[1])}"
    return any_floor, per_tree[worst], max(data.values()), link


def cut_floor_us(topology, size_bytes: float, chunks: int) -> float:
    """The ``cut`` floor of the module docstring: the allgather cut bound on ``b'`` bandwidths."""
    from dataclasses import replace

    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.synthesis.base import MAX_STEP_CHUNKS

    n = topology.num_ranks
    step_bytes = MAX_STEP_CHUNKS * size_bytes / n / chunks
    into = {node: [] for node in range(n + len(topology.switches))}
    out_of = {node: [] for node in into}
    for link in topology.links:
        out_of[link.src].append(link.alpha)
        into[link.dst].append(link.alpha)

    def held_us(link) -> float:   # least α a message on this link pays while holding it
        alpha = link.alpha
        if link.src >= n:
            alpha += min(into[link.src])
        if link.dst >= n:
            alpha += min(out_of[link.dst])
        return alpha

    links = tuple(replace(link, bw=link.bw / (1 + held_us(link) * link.bw * 1e3 / step_bytes))
                  for link in topology.links)
    return compute_bounds(replace(topology, links=links), Collective("allgather", n), size_bytes).time_bound_us


def main() -> None:
    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.synthesis.trees import plan_forest
    from synth.topology.io import load_topology
    from synth.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="mi250-2node")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--caps", default="256,16,8")
    parser.add_argument("--chunks", default="1024,512,256,128")
    args = parser.parse_args()
    topology = load_topology(args.topology)
    n = topology.num_ranks
    size = parse_size(args.size)
    bound = compute_bounds(topology, Collective("allgather", n), size).time_bound_us
    print(f"{topology.name} allgather {args.size}: bound {bound:.1f} us")
    chunk_counts = [int(x) for x in args.chunks.split(",")]
    print("any program, by cut: " + ", ".join(f"{c} chunks/root {bound / cut_floor_us(topology, size, c):.4f}"
                                             for c in chunk_counts))
    print(f"{'cap':>4} {'k':>4} {'trees':>5} {'chunks/root':>11} {'data us':>9} {'any':>7} {'tree':>7}"
          "  busiest link (tree)")
    for cap in (int(x) for x in args.caps.split(",")):
        forest = plan_forest(topology, tuple(range(n)), max_trees=cap)
        for chunks in chunk_counts:
            any_floor, tree_floor, data, link = floor_us(forest, topology, size / n, chunks)
            print(f"{cap:>4} {forest.k:>4} {len(forest.trees):>5} {chunks:>11} {data:>9.1f} "
                  f"{bound / any_floor:>7.4f} {bound / tree_floor:>7.4f}  {link}")


if __name__ == "__main__":
    main()
