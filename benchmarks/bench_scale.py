"""Synthesis at scale (issue 31): CPU seconds, peak RSS, ratio to the bound, verify and simulate seconds.

Usage: python benchmarks/bench_scale.py [--ranks 256,1024,4096] [--filter REGEX] [-c allgather,...] [--size 1GiB]
       [--method M] [--timeout 1200]

Fabrics per rank count (names are stable): 256: torus-16x16, a100x32 (32 DGX A100 boxes), leafspine-16x16; 1024:
torus-32x32, torus-16x16x4, a100x128, leafspine-32x32; 2048 (not run by default): torus-64x32; 4096: torus-64x64,
a100x512. Each fabric x collective runs in its own child process, one at a time (``--child``): the default ``synth
synthesize`` pipeline (``synth.pipeline.synthesize``: method, lowering, verification, simulation, bound), then
``verify`` and ``simulate`` of its program timed again on their own. A row gives the child's CPU seconds for the
pipeline, its peak RSS (``ru_maxrss``), the ratio bound / simulated time, the method, and the verify and simulate
CPU seconds. Failures and timeouts are rows too.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fabrics import run_child  # noqa: E402 - the benchmarks folder is not a package


def fabrics() -> dict[str, tuple[int, object]]:
    """name -> (ranks, builder)."""
    from synth.topology import generators as gen
    from synth.topology.families import dgx_a100_boxes, oversubscribed_leaf_spine

    def torus(*dims: int):
        return functools.partial(gen.torus, list(dims), name="torus-" + "x".join(map(str, dims)))

    def boxes(k: int):
        return functools.partial(dgx_a100_boxes, k, name=f"a100x{k}")

    def leaf_spine(leaves: int, per_leaf: int):
        return functools.partial(oversubscribed_leaf_spine, leaves, per_leaf, 1, name=f"leafspine-{leaves}x{per_leaf}")

    return {
        "torus-16x16": (256, torus(16, 16)), "a100x32": (256, boxes(32)), "leafspine-16x16": (256, leaf_spine(16, 16)),
        "torus-32x32": (1024, torus(32, 32)), "torus-16x16x4": (1024, torus(16, 16, 4)),
        "a100x128": (1024, boxes(128)), "leafspine-32x32": (1024, leaf_spine(32, 32)),
        "torus-64x32": (2048, torus(64, 32)),
        "torus-64x64": (4096, torus(64, 64)), "a100x512": (4096, boxes(512)),
    }


def child(name: str, collective: str, size: str, method: str) -> None:
    """One measurement, printed as one JSON line on stdout."""
    from synth.pipeline import synthesize
    from synth.simulation import simulate
    from synth.units import parse_size
    from synth.verification import verify

    topology = fabrics()[name][1]()
    size_bytes = parse_size(size)
    began = time.process_time()
    result = synthesize(topology, collective, size_bytes, method)
    cpu = time.process_time() - began
    began = time.process_time()
    ok = verify(result.program).ok
    verify_s = time.process_time() - began
    began = time.process_time()
    simulate(result.program, topology, size_bytes, record_events=False)
    simulate_s = time.process_time() - began
    print(json.dumps({"cpu_s": cpu, "rss_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "ratio": result.bound_us / result.time_us if result.bound_us else None,
                      "method": result.method, "verified": ok, "verify_s": verify_s, "simulate_s": simulate_s,
                      "transfers": len(result.schedule.transfers)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="256,1024,4096")
    parser.add_argument("--filter", default="")
    parser.add_argument("-c", "--collectives", default="allgather,reducescatter,allreduce")
    parser.add_argument("-s", "--size", default="1GiB")
    parser.add_argument("-m", "--method", default="auto")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--child", nargs=4, metavar=("FABRIC", "COLLECTIVE", "SIZE", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    wanted = {int(r) for r in args.ranks.split(",")}
    header = (f"{'fabric':<18} {'ranks':>5} {'collective':<13} {'ratio':>6} {'method':<10} {'CPU s':>8} "
              f"{'RSS GB':>6} {'verify s':>8} {'sim s':>6} {'transfers':>10}  status")
    print(header)
    for name, (ranks, _) in fabrics().items():
        if ranks not in wanted or not re.search(args.filter, name):
            continue
        for collective in args.collectives.split(","):
            run = run_child([sys.executable, __file__, "--child", name, collective, args.size, args.method],
                            args.timeout)
            lines = run.stdout.strip().splitlines()
            if run.rc == 0 and lines:
                r = json.loads(lines[-1])
                status = "ok" if r["verified"] else "verify failed"
                print(f"{name:<18} {ranks:>5} {collective:<13} {r['ratio'] or 0:>6.4f} {r['method']:<10} "
                      f"{r['cpu_s']:>8.1f} {r['rss_GB']:>6.2f} {r['verify_s']:>8.1f} {r['simulate_s']:>6.1f} "
                      f"{r['transfers']:>10}  {status}", flush=True)
            else:
                why = "timeout" if run.rc is None else f"error (exit {run.rc}): " + (run.stderr.strip().splitlines()
                                                                                    or [""])[-1][:120]
                print(f"{name:<18} {ranks:>5} {collective:<13} {'-':>6} {'-':<10} {run.cpu_s:>8.1f} {'-':>6} "
                      f"{'-':>8} {'-':>6} {'-':>10}  {why}", flush=True)


if __name__ == "__main__":
    main()
