"""Lower bounds on tree pipelines whose messages are the same on every edge of a tree (OR-Tools CP-SAT).

Usage: python benchmarks/bench_tree_shapes.py [--topology mi250-2node] [--size 1GiB] [--cap 256]
       [--chunks 256] [--message-chunks 32,40,48,64] [--seconds 60]

The ``trees`` method cuts tree ``t``'s ``c_t`` chunks (:func:`split_chunks`) into equal messages and sends
the same messages over every edge of the tree. For a message size ``s`` (``⌈c_t / s⌉`` messages per
tree) this is a job shop (Graham et al., "Optimization and approximation in deterministic sequencing
and scheduling", Ann. Discrete Math. 1979): message ``j`` of an edge is one task holding every link of
the edge's route for ``α_route · ⌈size / 71⌉ + size · chunk_bytes / min bw`` (SPEC cost model); it starts
after message ``j`` of the edge into its sender has arrived and after message ``j - 1`` of its own edge.
CP-SAT minimises the makespan (interval variables, one no-overlap constraint per link) and reports a
lower bound. Printed per message size: the busiest link's load with its α (a bound by itself), CP-SAT's
best schedule and its bound, as ratios to ``synth bounds``.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

UNITS_PER_US = 100


def shape_bounds(forest, topology, per_root_bytes: float, chunks: int, message_chunks: int,
                 seconds: float) -> tuple[float, float, float]:
    """(busiest link's load with α, CP-SAT's best makespan, CP-SAT's lower bound), µs."""
    from ortools.sat.python import cp_model

    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.trees.messages import balanced_split

    counts = balanced_split(forest, chunks)
    chunk_bytes = per_root_bytes / chunks
    links = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    model = cp_model.CpModel()
    horizon = 0
    tasks = []   # (tree, child, links, duration µs) per message, grouped per edge below
    for t, tree in enumerate(forest.trees):
        c = counts[t]
        if not c:
            continue
        sizes = [len(part) for part in _equal_parts(c, max(1, math.ceil(c / message_chunks)))]
        for (parent, child), routes in zip(tree.edges, tree.routes):
            nodes = (parent, *routes[0][0], child)   # an edge's units may take several routes: the first stands for all
            hops = [links[pair] for pair in zip(nodes, nodes[1:])]
            alpha = sum(topology.links[h].alpha for h in hops)
            bw = min(topology.links[h].bw for h in hops) * 1e3
            durations = [alpha * math.ceil(s / MAX_STEP_CHUNKS) + s * chunk_bytes / bw for s in sizes]
            tasks.append((t, parent, child, hops, durations))
            horizon += sum(durations)
    load: dict[int, float] = defaultdict(float)
    for *_, hops, durations in tasks:
        for h in hops:
            load[h] += sum(durations)
    busiest = max(load.values())
    top = int(min(horizon, 2 * busiest) * UNITS_PER_US) + 1
    ends: dict[tuple[int, int], list] = {}
    per_link: dict[int, list] = defaultdict(list)
    starts: dict[tuple[int, int], list] = {}
    for t, _parent, child, hops, durations in tasks:
        mine_start, mine_end = [], []
        for d in durations:
            start, end = model.new_int_var(0, top, ""), model.new_int_var(0, top, "")
            interval = model.new_interval_var(start, math.ceil(d * UNITS_PER_US), end, "")
            for h in hops:
                per_link[h].append(interval)
            if mine_end:
                model.add(start >= mine_end[-1])
            mine_start.append(start)
            mine_end.append(end)
        starts[(t, child)], ends[(t, child)] = mine_start, mine_end
    for t, parent, child, _, _ in tasks:
        for start, arrived in zip(starts[(t, child)], ends.get((t, parent), ())):
            model.add(start >= arrived)
    for intervals in per_link.values():
        model.add_no_overlap(intervals)
    makespan = model.new_int_var(0, top, "makespan")
    model.add_max_equality(makespan, [e for es in ends.values() for e in es])
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 2
    status = solver.solve(model)
    best = solver.objective_value / UNITS_PER_US if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else math.inf
    return busiest, best, solver.best_objective_bound / UNITS_PER_US


def _equal_parts(count: int, parts: int) -> list[range]:
    size, extra = divmod(count, parts)
    out, pos = [], 0
    for i in range(parts):
        step = size + (1 if i < extra else 0)
        out.append(range(pos, pos + step))
        pos += step
    return out


def main() -> None:
    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.synthesis.trees import plan_forest
    from synth.topology.io import load_topology
    from synth.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="mi250-2node")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--cap", type=int, default=256)
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--message-chunks", default="32,40,48,64")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    topology = load_topology(args.topology)
    n = topology.num_ranks
    size = parse_size(args.size)
    bound = compute_bounds(topology, Collective("allgather", n), size).time_bound_us
    forest = plan_forest(topology, tuple(range(n)), max_trees=args.cap)
    print(f"{topology.name} allgather {args.size}: bound {bound:.1f} us; forest k={forest.k}, "
          f"{len(forest.trees)} trees, {args.chunks} chunks per root")
    print(f"{'chunks/msg':>10} {'link+alpha':>10} {'CP-SAT best':>11} {'CP-SAT bound':>12}")
    for s in (int(x) for x in args.message_chunks.split(",")):
        busiest, best, lower = shape_bounds(forest, topology, size / n, args.chunks, s, args.seconds)
        print(f"{s:>10} {bound / busiest:>10.4f} {bound / best:>11.4f} {bound / lower:>12.4f}", flush=True)


if __name__ == "__main__":
    main()
