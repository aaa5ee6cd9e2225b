"""Issue 5 latency target: small allgather against the best latency-oriented programs we know of.

Usage::

    python benchmarks/bench_latency.py [--topologies dgx1 dgx-a100] [--size 1KB] [--time-limit 30]
    python benchmarks/bench_latency.py --topologies FILE.yaml ... --collective allreduce --size 64KiB \
        --methods rdh,dbt,levels,ring

For every topology it simulates, side by side and under the same α-β cost model
(:func:`synth.simulation.simulate`):

- ``auto`` and ``milp``: synth's best, through the pipeline (lowered, verified, simulated);
- ``sccl-steps2``: SCCL's least-steps DGX-1 allgather (2 steps; ``tests/fixtures/
  sccl_dgx1_allgather_steps2.xml``, SCCL PPoPP'21 / msccl-tools), on ``dgx1`` only;
- ``rdh`` (recursive doubling) and ``ring``, the baselines, or the methods ``--methods`` names (``levels``,
  ``dbt``, ...),

and prints ``time_us``, the ratio to ``time_bound`` of :func:`synth.lower_bounds.compute_bounds`, the ratio
to the best of the reference programs (SCCL, rdh; < 1 means synth is faster) and the seconds spent.
Every program is verified before it is timed.
"""

from __future__ import annotations

import argparse
import pathlib
import time

from synth.errors import SynthError
from synth.synthesis.base import SynthOptions
from synth.units import parse_size

SCCL_FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "sccl_dgx1_allgather_steps2.xml"
REFERENCES = ("sccl-steps2", "rdh")


def sccl_row(topology, size: float) -> dict:
    """SCCL's 2-step DGX-1 allgather, verified and simulated on ``topology``."""
    from synth.program.load import load_program
    from synth.simulation import simulate
    from synth.verification import verify

    program = load_program(str(SCCL_FIXTURE))
    check = verify(program)
    if not check.ok:
        return {"program": "sccl-steps2", "error": f"does not verify: {check.errors[0]}"}
    sim = simulate(program, topology, size, record_events=False)
    return {"program": "sccl-steps2", "time_us": sim.time_us, "seconds": 0.0, "note": "fixture"}


def pipeline_row(topology, collective: str, size: float, method: str, options: SynthOptions) -> dict:
    from synth.pipeline import synthesize

    t0 = time.perf_counter()
    try:
        res = synthesize(topology, collective, size, method, options)
    except SynthError as exc:
        return {"program": method, "error": str(exc)}
    note = f"-> {res.method}" if method == "auto" else res.status
    if res.collective.chunk_factor > 1:
        note += f", {res.collective.chunk_factor} chunks"
    return {"program": method, "time_us": res.time_us, "seconds": time.perf_counter() - t0, "note": note}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topologies", nargs="+", default=["dgx1", "dgx-a100"])
    parser.add_argument("--collective", default="allgather")
    parser.add_argument("--size", default="1KB")
    parser.add_argument("--time-limit", type=float, default=30.0, help="milp's time limit (auto: its own budget)")
    parser.add_argument("--methods", default="rdh,ring", help="comma-separated methods timed after auto and milp")
    args = parser.parse_args()

    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds
    from synth.topology.io import load_topology

    size = parse_size(args.size)
    print(f"{args.collective} {args.size} ({size:g} B), simulated under SPEC's α-β model")
    for name in args.topologies:
        topology = load_topology(name)
        bounds = compute_bounds(topology, Collective(args.collective, topology.num_ranks), size)
        rows = [pipeline_row(topology, args.collective, size, "auto", SynthOptions()),
                pipeline_row(topology, args.collective, size, "milp", SynthOptions(time_limit=args.time_limit))]
        if topology.name == "dgx1" and args.collective == "allgather":
            rows.append(sccl_row(topology, size))
        rows += [pipeline_row(topology, args.collective, size, m, SynthOptions()) for m in args.methods.split(",")]
        refs = [r["time_us"] for r in rows if r["program"] in REFERENCES and "time_us" in r]
        best_ref = min(refs) if refs else None
        print(f"\n{topology.name}: {topology.num_ranks} ranks; time_bound {bounds.time_bound_us:.3f} us "
              f"(latency {bounds.latency_bound_us:.3f}, bandwidth {bounds.bandwidth_bound_us:.3f})")
        print(f"  {'program':<12} {'time_us':>9} {'x bound':>8} {'x best ref':>10} {'seconds':>8}  note")
        for r in rows:
            if "error" in r:
                print(f"  {r['program']:<12} error: {r['error']}")
                continue
            vs_ref = f"{r['time_us'] / best_ref:.3f}" if best_ref else "-"
            print(f"  {r['program']:<12} {r['time_us']:9.3f} {r['time_us'] / bounds.time_bound_us:8.3f} "
                  f"{vs_ref:>10} {r['seconds']:8.2f}  {r.get('note', '')}")


if __name__ == "__main__":
    main()
