"""Issue 5 alltoall targets: dgx1 64 MiB against its bound, and ndv2-2node against ``direct``.

Usage::

    python benchmarks/bench_alltoall.py [--dgx1-size 64MiB] [--ndv2-sizes 1KB 1MB 64MiB]
        [--milp-chunks 4] [--milp-time-limit 60] [--skip-milp]
        [--fabrics mi250-2node,dgx-a100-4node,dgx-a100-2node,leaf-spine-4x4,dgx2,torus-3x3x3,mi250,...]
        [--fabric-size 1GiB]

Part 1 (target: ≤ 1.10 × the bound): alltoall of ``--dgx1-size`` on ``dgx1`` with ``auto`` under its
default budget, with ``milp --chunks K --time-limit T`` (the setting the milp author measured), and
the ``direct`` and ``greedy`` baselines; each with ``time_us`` and the ratio to ``time_bound`` of
:func:`synth.lower_bounds.compute_bounds` (the maximum concurrent flow bound for alltoall).

Part 2: alltoall on ``ndv2-2node`` at each of ``--ndv2-sizes``: synth's best (``auto``) against the
``direct`` baseline (every rank sends straight to every other rank), as ``direct / auto`` (> 1 means
synth is faster), plus both ratios to the bound.

Part 3: alltoall of ``--fabric-size`` on each of ``--fabrics``: bound ÷ simulated time of ``direct``,
``greedy``, ``lp`` (the concurrent flow's paths) and ``auto``.

Every program goes through the pipeline: lowered, verified, then simulated under SPEC's α-β model.
"""

from __future__ import annotations

import argparse
import time

from synth.errors import SynthError
from synth.synthesis.base import SynthOptions
from synth.units import parse_size


def run(topology, size: float, method: str, options: SynthOptions) -> dict:
    from synth.pipeline import synthesize

    t0 = time.perf_counter()
    try:
        res = synthesize(topology, "alltoall", size, method, options)
    except SynthError as exc:
        return {"label": method, "error": str(exc)}
    note = f"-> {res.method}" if method == "auto" else res.status
    note += f", {res.collective.chunk_factor} chunk(s)"
    return {"label": method, "time_us": res.time_us, "bound_us": res.bound_us,
            "seconds": time.perf_counter() - t0, "note": note}


def show(row: dict, label: str | None = None) -> None:
    label = label or row["label"]
    if "error" in row:
        print(f"  {label:<24} error: {row['error']}")
        return
    print(f"  {label:<24} {row['time_us']:11.2f} {row['time_us'] / row['bound_us']:8.4f} {row['seconds']:8.1f}  "
          f"{row['note']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dgx1-size", default="64MiB")
    parser.add_argument("--ndv2-sizes", nargs="+", default=["1KB", "1MB", "64MiB"])
    parser.add_argument("--milp-chunks", type=int, default=4)
    parser.add_argument("--milp-time-limit", type=float, default=60.0)
    parser.add_argument("--skip-milp", action="store_true", help="skip the explicit milp run in part 1")
    parser.add_argument("--fabrics", default="mi250-2node,dgx-a100-4node,dgx-a100-2node,leaf-spine-4x4,dgx2,"
                                             "torus-3x3x3,mi250,torus-4x4,mesh-5x5")
    parser.add_argument("--fabric-size", default="1GiB")
    args = parser.parse_args()

    from synth.topology.io import load_topology

    dgx1 = load_topology("dgx1")
    size = parse_size(args.dgx1_size)
    print(f"dgx1 alltoall {args.dgx1_size} ({size:g} B); target <= 1.10 x bound")
    print(f"  {'program':<24} {'time_us':>11} {'x bound':>8} {'seconds':>8}  note")
    rows = [run(dgx1, size, "auto", SynthOptions())]
    if not args.skip_milp:
        milp = run(dgx1, size, "milp", SynthOptions(chunks=args.milp_chunks, time_limit=args.milp_time_limit))
        milp["label"] = f"milp chunks={args.milp_chunks} {args.milp_time_limit:g}s"
        rows.append(milp)
    rows += [run(dgx1, size, m, SynthOptions()) for m in ("direct", "greedy")]
    for row in rows:
        show(row)
    if rows and "bound_us" in rows[0]:
        print(f"  bound {rows[0]['bound_us']:.2f} us; auto {rows[0]['time_us'] / rows[0]['bound_us']:.4f} x bound "
              f"({'meets' if rows[0]['time_us'] <= 1.10 * rows[0]['bound_us'] else 'misses'} the 1.10 target)")

    ndv2 = load_topology("ndv2-2node")
    print("\nndv2-2node alltoall: synth's best (auto) against the direct baseline")
    print(f"  {'size':<8} {'auto_us':>11} {'direct_us':>11} {'direct/auto':>11} {'auto x bnd':>10} "
          f"{'direct x bnd':>12} {'auto_s':>7}  pick")
    for text in args.ndv2_sizes:
        s = parse_size(text)
        best, direct = run(ndv2, s, "auto", SynthOptions()), run(ndv2, s, "direct", SynthOptions())
        if "error" in best or "error" in direct:
            print(f"  {text:<8} error: {best.get('error') or direct.get('error')}")
            continue
        ratio = direct["time_us"] / best["time_us"]
        print(f"  {text:<8} {best['time_us']:11.2f} {direct['time_us']:11.2f} {ratio:11.3f} "
              f"{best['time_us'] / best['bound_us']:10.3f} {direct['time_us'] / direct['bound_us']:12.3f} "
              f"{best['seconds']:7.1f}  {best['note']}")

    size = parse_size(args.fabric_size)
    methods = ("direct", "greedy", "lp", "auto")
    print(f"\nalltoall {args.fabric_size}: bound / simulated time (synthesis seconds)")
    print(f"  {'fabric':<16}" + "".join(f"{m:>18}" for m in methods) + "  auto picks")
    for name in [f for f in args.fabrics.split(",") if f]:
        rows = [run(load_topology(name), size, m, SynthOptions()) for m in methods]
        cells = ["error" if "error" in r else f"{r['bound_us'] / r['time_us']:.3f} ({r['seconds']:.1f} s)"
                 for r in rows]
        print(f"  {name:<16}" + "".join(f"{c:>18}" for c in cells) + f"  {rows[-1].get('note', '')}")


if __name__ == "__main__":
    main()
