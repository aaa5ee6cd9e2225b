"""The default ``synth synthesize`` (``auto``) at latency-bound sizes on every built-in of at most 16 ranks.

Usage::

    python benchmarks/bench_auto_small.py [--topologies dgx1 dgx2] [--cases allgather:1KB alltoall:1MB]

For each topology and case it prints the method kept, the ratio of the lower bound to the simulated time of the
verified program, the CPU seconds of the whole run (``time.process_time``) and how ``milp`` ended (a time, a
skip, or the wall clock's stop). ``auto`` tries ``milp`` only here (at most 16 ranks, latency-bound or alltoall),
so this is where its solver's work shows. The last line gives the CPU seconds in all and the most of one run.
Run it alone: CPU seconds on a loaded machine are not comparable.
"""

from __future__ import annotations

import argparse
import time

from synth.pipeline import synthesize
from synth.topology.builtin import builtin_names
from synth.topology.io import load_topology
from synth.units import parse_size

CASES = ("allgather:1KB", "allreduce:1KB", "allgather:1MB", "allreduce:1MB", "alltoall:1MB")


def milp_row(tried: list[dict]) -> str:
    """How auto's milp candidate ended: its simulated time, or why it did not run."""
    for row in tried:
        if row["method"] == "milp":
            if "time_us" in row:
                return f"{row['time_us']:.2f} us in {row['synthesis_s']:.1f} s"
            return next((f"{key}: {row[key]}" for key in ("skipped", "not_tried", "error") if key in row), "")
    return "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="*", default=None, help="built-ins (default: all of <= 16 ranks)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), help="COLLECTIVE:SIZE")
    args = parser.parse_args()
    names = args.topologies or [n for n in builtin_names() if load_topology(n).num_ranks <= 16]
    total, most = 0.0, (0.0, "")
    for name in names:
        topology = load_topology(name)
        for case in args.cases:
            collective, size = case.split(":")
            started = time.process_time()
            result = synthesize(topology, collective, parse_size(size), "auto")
            cpu = time.process_time() - started
            total += cpu
            most = max(most, (cpu, f"{name} {case}"))
            print(f"{name:20s} {collective:13s} {size:>5s} {result.method:12s} {result.bound_us / result.time_us:7.4f}"
                  f" {cpu:7.1f} s  milp: {milp_row(result.tried)}", flush=True)
    print(f"CPU s in all: {total:.1f}; most: {most[0]:.1f} ({most[1]})")


if __name__ == "__main__":
    main()
