"""CPU seconds of the trees' timing engine (``synth.synthesis.timing.list_schedule``) on the jobs a real search
times: one ``-m trees`` synthesis runs with ``list_schedule`` wrapped, the first ``--calls`` calls with at least
``--min-jobs`` jobs are kept (their jobs, fabric and options), then replayed ``--repeat`` times, and the median CPU
seconds of one replay of all of them is printed with a digest of every start and end (the same digest means the
same schedules, so two versions of the engine can be compared: ``PYTHONPATH=OLD`` then ``PYTHONPATH=NEW``).

    PYTHONPATH=. python benchmarks/bench_timing.py [-t dgx-a100-2node] [-c allreduce] [--exclude-link b0.nic3:ib1]
        [--calls 40] [--min-jobs 5000] [--repeat 5]

The default case is the allreduce of two DGX A100 boxes with one NIC link removed (issue 34), whose synthesis spends
about three quarters of its CPU in list_schedule (docs/results.md, session 35).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import statistics
import time

import synth.synthesis.timing as timing
from synth.pipeline import synthesize
from synth.synthesis.base import SynthOptions
from synth.topology.degrade import FabricEdits, degrade_topology
from synth.topology.io import load_topology


def capture(topology, collective: str, calls: int, min_jobs: int) -> list[tuple]:
    """The first ``calls`` list_schedule calls of a ``-m trees`` synthesis with at least ``min_jobs`` jobs."""
    kept: list[tuple] = []
    copies: dict[int, object] = {}   # one copy per set of jobs: the calls that time it share its derived lists
    originals: list = []   # kept alive, so that no later set of jobs reuses the id of one copied here
    original = timing.list_schedule

    def recording(jobs, fabric, chunk_bytes, chained=None, coalesce=False, **options):
        if len(kept) < calls and len(jobs.msg) >= min_jobs:
            if id(jobs) not in copies:
                copies[id(jobs)] = copy.deepcopy(jobs)
                originals.append(jobs)
            recorded = {k: v for k, v in options.items() if k != "costs"}
            kept.append((copies[id(jobs)], fabric, chunk_bytes, chained, coalesce, recorded))
        return original(jobs, fabric, chunk_bytes, chained, coalesce, **options)

    import synth.synthesis.trees.timed as timed_module

    modules = [timing, timed_module]
    saved = [m.list_schedule for m in modules]
    try:
        for m in modules:
            m.list_schedule = recording
        synthesize(topology, collective, 1 << 30, "trees", SynthOptions())
    finally:
        for m, f in zip(modules, saved):
            m.list_schedule = f
    return kept


def replay(kept: list[tuple]) -> tuple[float, str]:
    """(CPU seconds of one replay of every call, digest of their starts, ends and message heads). As in a search,
    the calls that time one set of jobs share it (its derived lists are built once), and its route costs are
    computed before the clock starts, as the engine's callers pass them in."""
    prepared, fresh = [], {}
    for jobs, fabric, chunk_bytes, chained, coalesce, options in kept:
        if id(jobs) not in fresh:   # caches dropped once per set of jobs, as a search builds them anew
            fresh[id(jobs)] = (copy.copy(jobs), timing.route_costs(jobs, fabric, chunk_bytes))
            fresh[id(jobs)][0].derived = fresh[id(jobs)][0].message_keys = None
        prepared.append((*fresh[id(jobs)][:1], fabric, chunk_bytes, chained, coalesce, options, fresh[id(jobs)][1]))
    digest = hashlib.sha256()
    t0 = time.process_time()
    for jobs, fabric, chunk_bytes, chained, coalesce, options, costs in prepared:
        order, start, end = timing.list_schedule(jobs, fabric, chunk_bytes, chained, coalesce, costs=costs, **options)
        digest.update(start.tobytes() + end.tobytes() + repr((order, jobs.head)).encode())
    return time.process_time() - t0, digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--topology", default="dgx-a100-2node")
    parser.add_argument("-c", "--collective", default="allreduce")
    parser.add_argument("--exclude-link", default="b0.nic3:ib1", help="SRC:DST, or '' for the healthy fabric")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--min-jobs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    topology = load_topology(args.topology)
    if args.exclude_link:
        src, dst = args.exclude_link.split(":")
        topology = degrade_topology(topology, FabricEdits(exclude_links=((src, dst),))).topology
    kept = capture(topology, args.collective, args.calls, args.min_jobs)
    runs = [replay(kept) for _ in range(args.repeat)]
    digests = {d for _, d in runs}
    jobs = sum(len(k[0].msg) for k in kept)
    print(f"{args.topology} {args.collective}: {len(kept)} calls, {jobs} jobs; median replay "
          f"{statistics.median(t for t, _ in runs):.2f} s CPU over {args.repeat}; digest {', '.join(sorted(digests))}")


if __name__ == "__main__":
    main()
