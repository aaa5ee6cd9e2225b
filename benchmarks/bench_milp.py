"""MILP (TE-CCL) solve time and gap, against the greedy warm start and other methods.

Usage::

    python benchmarks/bench_milp.py [--topologies dgx1 dgx2 dgx-a100 ring-8]
        [--collectives allgather alltoall allreduce] [--sizes 1KB 1MB 64MB]
        [--time-limit 60] [--solver highs] [--compare ring trees] [--greedy-scale 64 256 1024]

For every (topology, collective, size) it runs ``milp`` and ``greedy`` through the pipeline (so each
program is lowered, verified and simulated) and prints: the MILP status (``optimal`` only when the
schedule meets the cost-model bound), its status in the epoch model, epoch length τ, the epoch
objective and bound (µs of the epoch model) with the solver gap, model size, build+solve seconds,
the predicted (schedule) time of milp and greedy, their simulated times, the exact lower bound of
``synth bounds`` and, with ``--compare``, the simulated time of other registered methods.
``--greedy-scale`` times the greedy alone on 2-D tori of the given rank counts (allgather, 1 MiB).
"""

from __future__ import annotations

import argparse
import math
import time

from synth.errors import SynthError
from synth.synthesis.base import Instance, SynthOptions
from synth.units import parse_size


def fmt(x, nd=2):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def run_pipeline(topology, collective, size, method, options):
    from synth.pipeline import synthesize

    try:
        t0 = time.perf_counter()
        result = synthesize(topology, collective, size, method, options)
        return result, time.perf_counter() - t0, None
    except SynthError as exc:
        return None, 0.0, str(exc)


def bench_instances(args) -> None:
    from synth.topology.io import load_topology

    cols = ["topology", "coll", "size", "status", "model", "tau_us", "obj_us", "bound_us", "gap", "vars", "solve_s",
            "milp_pred", "greedy_pred", "milp_sim", "greedy_sim", "cut_bound"] + [f"{m}_sim" for m in args.compare]
    print(" | ".join(cols))
    for name in args.topologies:
        topology = load_topology(name)
        for coll in args.collectives:
            for size_text in args.sizes:
                size = parse_size(size_text)
                # the time-expanded MILP itself: allreduce's combining candidate (CP-SAT) left out
                options = SynthOptions(solver=args.solver, time_limit=args.time_limit, threads=args.threads,
                                       extra={"milp_combining": False})
                milp, wall, err = run_pipeline(topology, coll, size, "milp", options)
                greedy, _, gerr = run_pipeline(topology, coll, size, "greedy", options)
                if milp is None:
                    print(f"{name} | {coll} | {size_text} | ERROR {err}")
                    continue
                notes = milp.schedule.notes
                phases = list(notes["phases"].values())
                tau = phases[0]["tau_us"]
                nvars = sum(p.get("model_vars", 0) for p in phases)
                solve_s = sum(p.get("solve_s", 0.0) for p in phases)
                row = [name, coll, size_text, notes["status"],
                       notes["model_status"].split()[0], fmt(tau, 3), fmt(notes["solver_objective_us"]),
                       fmt(notes["solver_bound_us"]), fmt(notes["solver_gap"], 3), str(nvars), fmt(solve_s, 1),
                       fmt(milp.schedule.predicted_time_us), fmt(greedy.schedule.predicted_time_us if greedy else None),
                       fmt(milp.time_us), fmt(greedy.time_us if greedy else None), fmt(milp.bound_us)]
                for other in args.compare:
                    res, _, oerr = run_pipeline(topology, coll, size, other, options)
                    row.append(fmt(res.time_us) if res else "err")
                print(" | ".join(row), f"(wall {wall:.1f}s)", flush=True)


def bench_greedy_scale(ranks: list[int]) -> None:
    from synth.collectives import Collective
    from synth.synthesis import greedy
    from synth.topology.model import Link, Topology

    print("greedy at scale: 2-D torus, allgather 1 MiB, one try")
    for n in ranks:
        a = int(math.isqrt(n))
        b = n // a
        links = {}
        for x in range(a):
            for y in range(b):
                u = x * b + y
                for v in (((x + 1) % a) * b + y, x * b + (y + 1) % b):
                    if u != v:
                        links[(u, v)] = Link(u, v, 50.0, 0.5)
                        links[(v, u)] = Link(v, u, 50.0, 0.5)
        topo = Topology(f"torus{a}x{b}", a * b, tuple(links.values()))
        t0 = time.perf_counter()
        sched = greedy.synthesize(Instance(topo, Collective("allgather", a * b), 2**20,
                                           SynthOptions(extra={"greedy_tries": 1})))
        print(f"  {a}x{b}: {len(sched.transfers)} transfers, makespan {sched.makespan:.1f} us, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topologies", nargs="*", default=["dgx1", "dgx2", "dgx-a100", "ring-8"])
    ap.add_argument("--collectives", nargs="+", default=["allgather", "alltoall", "allreduce"])
    ap.add_argument("--sizes", nargs="+", default=["1KB", "1MB", "64MB"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--compare", nargs="*", default=[])
    ap.add_argument("--greedy-scale", nargs="*", type=int, default=[])
    args = ap.parse_args()
    if args.topologies:
        bench_instances(args)
    if args.greedy_scale:
        bench_greedy_scale(args.greedy_scale)


if __name__ == "__main__":
    main()
