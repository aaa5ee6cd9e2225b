"""The ring forest (:mod:`synth.synthesis.ringforest`) against ``synth bounds`` and the ForestColl forest.

Usage: python benchmarks/bench_ring_forest.py [--topology mi250-2node] [--size 1GiB]
       [--collectives allgather,reducescatter,allreduce] [--chunks 256] [--compare K]

Per collective: the rings found (pairs, cycles over pairs), the forest's busiest link after rounding to
whole chunks, the busiest switch and ring links with their α, and the schedule lowered, verified and
simulated, as a ratio to ``synth bounds``. With ``--compare K`` the ``trees`` method's ForestColl
schedule alone is simulated too (``--max-trees K`` skips the ring forest; 16 is the count the method
picked on mi250-2node before the ring forest).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict


def busiest(schedule, topology) -> dict[str, tuple[tuple[int, int], float, int]]:
    """Per kind of link ('switch', 'rank'): (link, µs busy including α, messages)."""
    busy: dict[tuple[int, int], float] = defaultdict(float)
    count: dict[tuple[int, int], int] = defaultdict(int)
    n = topology.num_ranks
    for start, end, src, dst, route in {(t.start, t.end, t.src, t.dst, t.route) for t in schedule.transfers}:
        nodes = (src, *route, dst)
        for hop in zip(nodes, nodes[1:]):
            busy[hop] += end - start
            count[hop] += 1
    out = {}
    for kind, pick in (("switch", lambda h: max(h) >= n), ("rank", lambda h: max(h) < n)):
        hop = max((h for h in busy if pick(h)), key=busy.get)
        out[kind] = (hop, busy[hop], count[hop])
    return out


def main() -> None:
    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.pipeline import synthesize
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.synthesis import ringforest
    from synth.synthesis.base import SynthOptions
    from synth.topology.io import load_topology
    from synth.units import parse_size
    from synth.verification import verify

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="mi250-2node")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--collectives", default="allgather,reducescatter,allreduce")
    parser.add_argument("--chunks", type=int, default=256, help="chunks per root")
    parser.add_argument("--compare", type=int, default=0, metavar="K",
                        help="also simulate the ForestColl schedule with --max-trees K (no ring forest; a minute)")
    args = parser.parse_args()

    topology = load_topology(args.topology)
    size = parse_size(args.size)
    n = topology.num_ranks
    for name in args.collectives.split(","):
        began = time.perf_counter()
        forest = ringforest.build(topology)
        if forest is None:
            print(f"{name}: the ring forest does not apply to {topology.name}")
            continue
        coll = Collective(name, n)
        bound = compute_bounds(topology, coll, size).time_bound_us
        schedule = ringforest.schedule(topology, coll, size, args.chunks)
        seconds = time.perf_counter() - began
        program = lower(schedule, name=f"{name}-rings-{topology.name}")
        check = verify(program, schedule.collective)
        simulated = simulate(program, topology, size, record_events=False).time_us
        link = schedule.notes["ring_forest_busiest_link_us"]
        print(f"{topology.name} {name} {args.size}, {args.chunks} chunks per root; bound {bound:.1f} us")
        print(f"  pairs {forest.pairs}; cycles over pairs {forest.orders[0]}, {forest.orders[4]}")
        phases = 2 if name == "allreduce" else 1
        print(f"  forest: busiest link {link:.1f} us per phase ({bound / (phases * link):.4f}); "
              f"late share {schedule.notes['late_share']}")
        for kind, (hop, busy, count) in busiest(schedule, topology).items():
            print(f"  busiest {kind} link {hop[0]}->{hop[1]}: {busy:.1f} us with {count} messages")
        print(f"  planned {schedule.predicted_time_us:.1f} us, simulated {simulated:.1f} us = {bound / simulated:.4f}"
              f" of the bound; verified {check.ok}; {seconds:.1f} s")
        if args.compare:
            plain = synthesize(topology, name, size, "trees", SynthOptions(max_trees=args.compare))
            print(f"  ForestColl forest (--max-trees {args.compare}): {plain.time_us:.1f} us = "
                  f"{bound / plain.time_us:.4f}")


if __name__ == "__main__":
    main()
