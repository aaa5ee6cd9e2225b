"""CPU seconds of the baselines (ring, hierarchical, nccl, dbt, rdh) through the whole pipeline (method,
lower, verify, simulate, bound) on 32-64-rank fabrics: the median of 3 runs of process CPU time, and the
simulated time's ratio to the lower bound.

    PYTHONPATH=. python benchmarks/bench_baselines.py [--size 1GiB] [--collective allgather] [--repeat 3]

Fabrics: dgx-a100-4node and mi250-2node (built-in), four 8-rank boxes behind NICs (H100-like, 32 ranks),
an 8x8 and a 4x4x4 torus (64 ranks). Target: every baseline under 2 s of CPU at <= 64 ranks.
"""

from __future__ import annotations

import argparse
import statistics
import time

from synth.errors import SynthError
from synth.pipeline import synthesize
from synth.synthesis.registry import METHODS as REGISTRY
from synth.topology import generators as gen
from synth.topology.io import load_topology
from synth.units import parse_size

METHODS = ("ring", "hierarchical", "nccl", "dbt", "rdh")


def fabrics() -> dict[str, object]:
    return {
        "dgx-a100-4node": load_topology("dgx-a100-4node"),
        "mi250-2node": load_topology("mi250-2node"),
        "h100x4": gen.boxes_behind_nics(4, per_box=8, intra_bw=450.0, intra_alpha=0.7, nic_bw=50.0),
        "torus-8x8": gen.torus((8, 8)),
        "torus-4x4x4": gen.torus((4, 4, 4)),
    }


def cpu_seconds(topology, collective: str, size: float, method: str, repeat: int) -> tuple[float, float | None]:
    """(median CPU seconds, time / bound) of ``repeat`` pipeline runs."""
    times, ratio = [], None
    for _ in range(repeat):
        began = time.process_time()
        result = synthesize(topology, collective, size, method)
        times.append(time.process_time() - began)
        ratio = result.time_us / result.bound_us if result.bound_us else None
    return statistics.median(times), ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--collective", default="allgather")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the baselines")
    args = parser.parse_args()
    size = parse_size(args.size)
    print(f"{'fabric':<16} {'method':<13} {'collective':<10} {'cpu_s':>7} {'ratio':>7}")
    for name, topology in fabrics().items():
        for method in args.methods.split(","):
            # dbt has no allgather: it is measured on allreduce
            coll = args.collective if args.collective in REGISTRY[method].collectives else "allreduce"
            try:
                cpu, ratio = cpu_seconds(topology, coll, size, method, args.repeat)
            except SynthError as exc:
                print(f"{name:<16} {method:<13} {coll:<10} {'-':>7} {'-':>7}  ({exc})")
                continue
            shown = f"{ratio:7.3f}" if ratio is not None else f"{'n/a':>7}"
            print(f"{name:<16} {method:<13} {coll:<10} {cpu:7.2f} {shown}", flush=True)


if __name__ == "__main__":
    main()
