"""How close to the cut bound can any pipeline of a ``trees`` forest get under MSCCL's step limit?

Usage: python benchmarks/bench_tree_floor.py [--topology mi250-2node] [--size 1GiB]
       [--caps 256,16,8] [--chunks 1024,512,256,128]

For an allgather forest (``k`` trees per root, :func:`synth.synthesis.trees.plan_forest` with
``--max-trees`` = cap) and ``C`` chunks per root, every link ``l`` must carry, for each distinct tree
``t`` whose route crosses it, that tree's ``c_t`` chunks (:func:`split_chunks`) in at least
``⌈c_t / MAX_STEP_CHUNKS⌉`` messages (one MSCCL step moves fewer than 72 chunks, and a message of the
trees method carries chunks of one tree), each paying its route's α. So no schedule of that forest
finishes before

    floor = max_l Σ_{t crosses l} ( c_t · chunk_bytes / bw_t + α_t · ⌈c_t / MAX_STEP_CHUNKS⌉ )

with ``bw_t`` the least bandwidth and ``α_t`` the summed α of the route. Pipelining (several messages
per tree and link), fill and drain only add to it. The table prints ``bound / floor``: the best ratio
to ``synth bounds`` a schedule of that forest at that chunk count could reach.
"""

from __future__ import annotations

import argparse
import math


def floor_us(forest, topology, per_root_bytes: float, chunks: int) -> tuple[float, float, str]:
    """(floor of the module docstring, the busiest link's data time alone, that link as 'a->b')."""
    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.trees import split_chunks

    links = {(link.src, link.dst): link for link in topology.links}
    counts = {}
    for root in sorted({t.root for t in forest.trees}):
        for t, c in enumerate(split_chunks(forest, root, chunks)):
            if forest.trees[t].root == root:
                counts[t] = c
    chunk_bytes = per_root_bytes / chunks
    busy: dict[tuple[int, int], float] = {}
    data: dict[tuple[int, int], float] = {}
    for t, tree in enumerate(forest.trees):
        c = counts[t]
        for (parent, child), routes in zip(tree.edges, tree.routes):
            for route, _units in routes:
                nodes = (parent, *route, child)
                hops = [links[pair] for pair in zip(nodes, nodes[1:])]
                alpha = sum(h.alpha for h in hops)
                seconds = c * chunk_bytes / (min(h.bw for h in hops) * 1e3)
                for pair in zip(nodes, nodes[1:]):
                    data[pair] = data.get(pair, 0.0) + seconds
                    busy[pair] = busy.get(pair, 0.0) + seconds + alpha * math.ceil(c / MAX_STEP_CHUNKS)
                break   # the first route carries the edge's data (one switch: the only one)
    worst = max(busy, key=busy.get)
    names = {i: str(i) for i in range(topology.num_ranks)}
    names.update({topology.num_ranks + i: s for i, s in enumerate(topology.switches)})
    return busy[worst], max(data.values()), f"{names[worst[0]]}->{names[worst[1]]}"


def main() -> None:
    from synth.bounds import compute_bounds
    from synth.collectives import Collective
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
    print(f"{'cap':>4} {'k':>4} {'trees':>5} {'chunks/root':>11} {'data us':>9} {'floor us':>9} "
          f"{'bound/floor':>11}  busiest link")
    for cap in (int(x) for x in args.caps.split(",")):
        forest = plan_forest(topology, tuple(range(n)), max_trees=cap)
        for chunks in (int(x) for x in args.chunks.split(",")):
            floor, data, link = floor_us(forest, topology, size / n, chunks)
            print(f"{cap:>4} {forest.k:>4} {len(forest.trees):>5} {chunks:>11} {data:>9.1f} {floor:>9.1f} "
                  f"{bound / floor:>11.4f}  {link}")


if __name__ == "__main__":
    main()
