"""Where a program's time goes, link by link: busy time, messages, their α, and the idle time before, inside
and after each link's stream.

Usage: ``python benchmarks/link_report.py PROGRAM TOPOLOGY [-s SIZE] [--top 20] [--links A,B]``, e.g. on the
program of ``synth synthesize -t mi250-2node -c allgather -o ag.xml``: ``python benchmarks/link_report.py ag.xml
mi250-2node --links 0,1``.

The program is simulated (:func:`synth.simulation.simulate`, the α-β model of docs/cost-model.md) and every
transfer's route is charged to each link it holds: a transfer holds all links of its route for ``Σα +
bytes / min bw``, so ``alpha_us`` is the messages' ``Σα`` of the route, and ``busy_us − alpha_us`` their bytes'
time. ``head_us`` is the idle time before a link's first transfer, ``tail_us`` after its last (to the program's
makespan), ``gaps_us`` the idle time between. For a link on a binding cut, the bound asks ``busy − alpha`` to
equal the bound and the three idle times to be zero: what is left is α (fewer, larger messages), fill and drain
(``head``, ``tail``) or stalls (``gaps``). Rows are sorted by the time a link ends, latest first; the summary
line gives the medians of the idle times over all links used.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from synth import api
from synth.simulation import SimResult
from synth.topology.model import Topology
from synth.units import parse_size


@dataclass(frozen=True)
class LinkRow:
    """One link's account over a simulated run (µs)."""

    link: str
    messages: int
    busy_us: float
    alpha_us: float
    head_us: float
    gaps_us: float
    tail_us: float
    end_us: float


def link_rows(result: SimResult, topology: Topology) -> list[LinkRow]:
    """Per link used by ``result``'s events: the :class:`LinkRow` account, latest-ending link first."""
    alpha = {f"{topology.node_name(link.src)}->{topology.node_name(link.dst)}": link.alpha
             for link in topology.links}
    spans: dict[str, list[tuple[float, float]]] = {}
    route_alpha: dict[str, float] = {}
    for _rank, _tb, _step, start, end, route in result.events:
        held = sum(alpha[hop] for hop in route)
        for hop in route:
            spans.setdefault(hop, []).append((start, end))
            route_alpha[hop] = route_alpha.get(hop, 0.0) + held
    rows = []
    for hop, intervals in spans.items():
        intervals.sort()
        gaps, reach = 0.0, intervals[0][1]
        for start, end in intervals[1:]:
            gaps += max(0.0, start - reach)
            reach = max(reach, end)
        rows.append(LinkRow(hop, len(intervals), sum(end - start for start, end in intervals), route_alpha[hop],
                            intervals[0][0], gaps, result.time_us - reach, reach))
    return sorted(rows, key=lambda row: (-row.end_us, row.link))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("program", help="a program file (MSCCL XML or synth JSON)")
    parser.add_argument("topology", help="the built-in topology or file the program was made for")
    parser.add_argument("-s", "--size", default=None,
                        help="SIZE (default: the program's size, else 1GiB, as `synth simulate`)")
    parser.add_argument("--top", type=int, default=20, help="rows printed (latest-ending links first)")
    parser.add_argument("--links", default=None,
                        help="only links into or out of these nodes (comma-separated names, e.g. 0,1,ib0)")
    args = parser.parse_args(argv)
    program, topology = api.load_program(args.program), api.load_topology(args.topology)
    size = None if args.size is None else parse_size(args.size)
    result = api.simulate(program, topology, size)   # checks the program was made for this fabric
    rows = link_rows(result, topology)
    if args.links:
        nodes = set(args.links.split(","))
        rows = [row for row in rows if set(row.link.split("->")) & nodes]
    print(f"makespan {result.time_us:.1f} us, {len(rows)} links")
    print(f"{'link':24s} {'msgs':>6s} {'busy':>9s} {'alpha':>8s} {'head':>8s} {'gaps':>8s} {'tail':>8s}")
    for row in rows[:args.top]:
        print(f"{row.link:24s} {row.messages:6d} {row.busy_us:9.1f} {row.alpha_us:8.1f} {row.head_us:8.1f} "
              f"{row.gaps_us:8.1f} {row.tail_us:8.1f}")
    if rows:
        print("median idle over these links: head {:.1f}, gaps {:.1f}, tail {:.1f} us".format(
            *(statistics.median(getattr(row, name) for row in rows) for name in ("head_us", "gaps_us", "tail_us"))))


if __name__ == "__main__":
    main()
