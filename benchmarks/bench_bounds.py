"""Benchmark: exact lower bounds at 64, 256 and 1024 ranks (median wall time of several runs).

    python benchmarks/bench_bounds.py [--repeats 5] [--collectives allgather,allreduce,...]

Prints one table row per (topology, collective): the bound, the binding cut's size, max-flows
spent, ranks tested after symmetry, and the median seconds, with and without symmetry for allgather.
"""

from __future__ import annotations

import argparse
import statistics
import time

from synth.lower_bounds import allgather_cut, clear_caches, compute_bounds
from synth.topology import generators as gen

GiB = 2**30


def fabrics():
    return [
        gen.torus([8, 8]),
        gen.torus([16, 16]),
        gen.torus([32, 32]),
        gen.leaf_spine(32, 32, 8, uplink_bw=25.0, name="leaf-spine-32x32 (1:2 oversubscribed)"),
        gen.boxes_behind_nics(32, 8, intra_bw=300.0, nic_bw=25.0, name="boxes-32x8"),
    ]


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        clear_caches()  # time cold computations, not the memo
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--collectives", default="allgather,reducescatter,allreduce,broadcast,scatter,alltoall")
    args = parser.parse_args()
    names = args.collectives.split(",")
    print(f"{'topology':40s} {'N':>5s} {'collective':13s} {'bound us':>12s} {'method':28s} "
          f"{'flows':>6s} {'tested':>6s} {'median s':>9s}")
    for t in fabrics():
        for name in names:
            secs, b = median_time(lambda t=t, name=name: compute_bounds(t, name, GiB), args.repeats)
            d = b.details
            print(f"{t.name:40s} {t.num_ranks:5d} {name:13s} {b.bandwidth_bound_us:12.1f} "
                  f"{str(d.get('bandwidth_method', ''))[:28]:28s} {d.get('maxflows', ''):>6} "
                  f"{d.get('ranks_tested', ''):>6} {secs:9.3f}")
        for sym in (True, False):
            secs, res = median_time(lambda t=t, sym=sym: allgather_cut(t, use_symmetry=sym), args.repeats)
            print(f"{t.name:40s} {t.num_ranks:5d} {'AG cut only':13s} {'':12s} "
                  f"{'symmetry ' + ('on' if sym else 'off'):28s} {res.flows:6d} {res.orbits:6d} {secs:9.3f}")


if __name__ == "__main__":
    main()
