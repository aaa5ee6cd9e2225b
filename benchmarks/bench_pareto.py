"""Benchmark of method ``pareto`` (SCCL's (chunks, steps, rounds) synthesis on CP-SAT).

Usage: python benchmarks/bench_pareto.py [--cases dgx1:allgather,dgx2:allgather,dgx1:alltoall]
       [--max-chunks 8] [--max-steps 8] [--time-limit 300] [--threads 2] [--size 1MiB] [--monotonic]
       [--exhaustive]

For each case: the lower bounds, every instance tried (C, S, R, sat/unsat/unknown, seconds), the Pareto
frontier with each point's α-β time at SIZE, and whether each point's schedule lowers and verifies.
For DGX-1 Allgather it also checks the result against SCCL's published run (msccl-tools
examples/dgx1_allgather.ipynb: frontier (2,2,3), (6,3,7); Z3 took 124 s for (6,3,7) alone).
"""

from __future__ import annotations

import argparse
import time

SCCL_DGX1_ALLGATHER = [(2, 2, 3), (6, 3, 7)]


def run_case(topo_name: str, coll: str, args) -> dict:
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.synthesis.pareto import explore, predicted_time_us
    from synth.topology.io import load_topology
    from synth.units import parse_size
    from synth.verification import verify

    topology = load_topology(topo_name)
    size = parse_size(args.size)
    t0 = time.perf_counter()
    exp = explore(topology, coll, max_steps=args.max_steps, max_chunks=args.max_chunks,
                  time_limit=args.time_limit, size_bytes=size, assume_monotonic=args.monotonic,
                  threads=args.threads, exhaustive=args.exhaustive)
    wall = time.perf_counter() - t0
    print(f"\n== {coll} on {topology.name}: S >= {exp.steps_lb}, R/C >= {exp.rounds_per_chunk_lb} "
          f"(unit {exp.unit_GBps:g} GB/s); {len(exp.tried)} instances in {wall:.2f} s; {exp.stopped}")
    for t in exp.tried:
        print(f"   C={t['chunks']:<2} S={t['steps']:<2} R={t['rounds']:<3} {t['status']:<7} {t['solve_s']:8.2f} s"
              f"{'  (exhaustive pass)' if t.get('pass') else ''}")
    print(f"   {'C':>3} {'S':>3} {'R':>4} {'R/C':>6} {'time_us@' + args.size:>14} {'solve_s':>8} verified  sim_us")
    for p in exp.points:
        program = lower(p.schedule)
        ok = verify(program, p.schedule.collective).ok
        sim = simulate(program, topology, size, record_events=False).time_us
        print(f"   {p.chunks:>3} {p.steps:>3} {p.rounds:>4} {str(p.bandwidth_cost):>6} "
              f"{predicted_time_us(p, size):>14.3f} {p.synthesis_s:>8.2f} {str(ok):>8} {sim:8.3f}")
    frontier = [(p.chunks, p.steps, p.rounds) for p in exp.points]
    if (topo_name, coll) == ("dgx1", "allgather"):
        same = frontier == SCCL_DGX1_ALLGATHER
        print(f"   SCCL published frontier {SCCL_DGX1_ALLGATHER}: {'reproduced' if same else 'DIFFERENT'}")
    return {"case": f"{topo_name}:{coll}", "wall_s": wall, "frontier": frontier}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="dgx1:allgather,dgx1:reducescatter,dgx2:allgather,dgx1:alltoall")
    parser.add_argument("--max-chunks", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", default="1MiB")
    parser.add_argument("--monotonic", action="store_true", help="SCCL's monotonic-feasibility assumption")
    parser.add_argument("--exhaustive", action="store_true", help="second pass: exact frontier for C <= max")
    args = parser.parse_args()
    rows = [run_case(*case.split(":"), args) for case in args.cases.split(",")]
    print("\nsummary")
    for row in rows:
        print(f"  {row['case']:<22} {row['wall_s']:8.2f} s  frontier {row['frontier']}")


if __name__ == "__main__":
    main()
