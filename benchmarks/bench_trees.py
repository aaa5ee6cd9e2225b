"""Benchmark of method ``trees``: simulated algbw / cut bound on every built-in topology.

Usage: python benchmarks/bench_trees.py [--size 1GiB] [--collectives allgather,reducescatter,allreduce]
       [--topologies dgx1,...] [--ring] [--large]

For each (topology, collective): synthesize with ``trees``, lower, verify, simulate, and print the
simulated time, the bound of :func:`synth.lower_bounds.compute_bounds` and their ratio
(= simulated algbw / bound algbw); ``rs+ag`` divides the reducescatter + allgather bounds
instead (differs only for allreduce, whose own cut bound can be lower); ``sim/plan`` is the
simulated time over the time the synthesizer planned (1 when the program runs as planned). ``--ring`` adds the
ring baseline side by side (NCCL's rings, at the rings' own chunk counts). ``--large`` runs
the 1024-rank cases (32x32 torus, 128 A100 boxes; only those unless ``--topologies`` is given) and
reports wall time and peak memory.
"""

from __future__ import annotations

import argparse
import resource
import time

from synth.synthesis.base import Instance


def run_one(topology, name: str, size: int, method: str = "trees", runtime_chunks: bool = True,
            extra: dict | None = None) -> dict:
    from synth.collectives import Collective, runtime_divides
    from synth.lower_bounds import compute_bounds
    from synth.program.lower import lower
    from synth.simulation import simulate
    from synth.synthesis.base import SynthOptions
    from synth.synthesis.registry import get_method
    from synth.verification import verify

    t0 = time.perf_counter()
    options = SynthOptions(runtime_chunks=runtime_chunks, extra=extra or {})
    schedule = get_method(method).run(Instance(topology, Collective(name, topology.num_ranks), size, options))
    t1 = time.perf_counter()
    program = lower(schedule)
    t2 = time.perf_counter()
    result = verify(program)
    t3 = time.perf_counter()
    sim = simulate(program, topology, size, record_events=False)
    t4 = time.perf_counter()
    bound = compute_bounds(topology, schedule.collective, size)
    # allreduce: the RS-then-AG bound too (the allreduce cut bound can be lower on some fabrics)
    phases_us = bound.time_bound_us
    if name == "allreduce":
        phases_us = sum(compute_bounds(topology, Collective(c, topology.num_ranks), size).time_bound_us
                        for c in ("reducescatter", "allgather"))
    return {
        "topology": topology.name, "collective": name, "method": method, "ok": result.ok,
        "time_us": sim.time_us, "bound_us": bound.time_bound_us, "ratio": bound.time_bound_us / sim.time_us,
        "phases_ratio": phases_us / sim.time_us,
        "runtime_runs": runtime_divides(program.nchunksperloop, size),
        "planned_ratio": sim.time_us / schedule.predicted_time_us if schedule.predicted_time_us else float("nan"),
        "synth_s": t1 - t0, "lower_s": t2 - t1, "verify_s": t3 - t2, "simulate_s": t4 - t3,
        "program": program,
    }


def main() -> None:
    from synth.synthesis.ring import OWN_CHUNKS
    from synth.topology.builtin import builtin_names
    from synth.topology.io import load_topology
    from synth.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--collectives", default="allgather,reducescatter,allreduce")
    parser.add_argument("--topologies", default="")
    parser.add_argument("--ring", action="store_true", help="also run the ring baseline")
    parser.add_argument("--large", action="store_true", help="run the 1024-rank cases")
    args = parser.parse_args()
    size = parse_size(args.size)
    names = args.topologies.split(",") if args.topologies else [] if args.large else list(builtin_names())
    print(f"{'topology':18s} {'collective':14s} {'ok':3s} {'sim us':>10s} {'bound us':>10s} {'ratio':>6s} "
          f"{'rs+ag':>6s} {'sim/plan':>8s} {'runs':>4s}"
          f"{'  ring ratio  trees/ring' if args.ring else ''}   synth/lower/verify/sim s")
    for tname in names:
        topology = load_topology(tname)
        for cname in args.collectives.split(","):
            row = run_one(topology, cname, size)
            extra = ""
            if args.ring:
                try:
                    # NCCL's own rings: it runs them at any chunk count (no nchunksperloop rule)
                    base = run_one(topology, cname, size, "ring", runtime_chunks=False, extra={OWN_CHUNKS: True})
                    extra = f"  {base['ratio']:10.4f}  {base['time_us'] / row['time_us']:10.3f}"
                except Exception as exc:  # a baseline may not support a fabric
                    extra = f"  ring: {exc}"
            print(f"{tname:18s} {cname:14s} {str(row['ok']):3s} {row['time_us']:10.1f} {row['bound_us']:10.1f} "
                  f"{row['ratio']:6.4f} {row['phases_ratio']:6.4f} {row['planned_ratio']:8.4f} "
                  f"{('no', 'yes')[row['runtime_runs']]:>4s}{extra}   "
                  f"{row['synth_s']:.1f}/{row['lower_s']:.1f}/"
                  f"{row['verify_s']:.1f}/{row['simulate_s']:.1f}", flush=True)
    if args.large:
        run_large(size)


def run_large(size: int) -> None:
    import os
    import tempfile

    from synth.topology import generators

    cases = [("torus 32x32", lambda: generators.torus([32, 32])),
             ("128 x A100 boxes", lambda: generators.boxes_behind_nics(128, intra_bw=300, intra_alpha=0.7))]
    for label, make in cases:
        topology = make()
        t0 = time.perf_counter()
        row = run_one(topology, "allgather", size)
        from synth.program.load import save_program

        with tempfile.TemporaryDirectory() as tmp:
            save_program(row["program"], os.path.join(tmp, "ag.xml"))
        wall = time.perf_counter() - t0
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"{label}: ranks={topology.num_ranks} ok={row['ok']} ratio={row['ratio']:.4f} "
              f"runs={('no', 'yes')[row['runtime_runs']]} "
              f"wall={wall:.1f}s (synth {row['synth_s']:.1f}) peak RSS={peak_gib:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
