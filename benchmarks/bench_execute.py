"""Executor benchmark: ring allreduce / allgather programs run by ``synth execute`` vs
torch.distributed's own ``all_reduce`` / ``all_gather_into_tensor`` on the same gloo processes.

Programs: 4 ranks use the msccl-tools ring fixtures; other rank counts use ``synth synthesize
-m ring`` on a ring topology (falling back to the hand-written rings of synth.execution.samples).
Both sides are timed the same way (barrier, then the slowest rank; median of --iters).

    python benchmarks/bench_execute.py            # 64 MiB on 4 and 8 ranks
    python benchmarks/bench_execute.py -s 8MiB -n 4 --iters 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from synth.execution import samples
from synth.execution.runner import execute_many
from synth.program.ir import Program
from synth.units import format_size, parse_size

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "msccl"


def ring_program(collective: str, n: int, size_bytes: int) -> tuple[Program, str]:
    fixture = FIXTURES / f"{collective}_ring_{n}.xml"
    if fixture.exists():
        from synth.program.load import load_program

        return load_program(fixture), f"fixture {fixture.name}"
    try:
        from synth.pipeline import synthesize
        from synth.topology.generators import ring

        res = synthesize(ring(n), collective, size_bytes, method="ring")
        return res.program, "synth synthesize -m ring"
    except Exception as exc:  # pipeline missing or failing: use the hand-written ring
        print(f"# synthesize failed ({exc}); using the hand-written ring", file=sys.stderr)
        build = samples.ring_allreduce if collective == "allreduce" else samples.ring_allgather
        return build(n), "hand-written ring"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-s", "--size", default="64MiB")
    ap.add_argument("-n", "--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    rows = []
    for n in args.ranks:
        progs, sources = [], []
        for coll in ("allreduce", "allgather"):
            prog, src = ring_program(coll, n, size)
            progs.append(prog)
            sources.append(src)
        t0 = time.perf_counter()
        results = execute_many(progs, size_bytes=size, dtype=args.dtype, iters=args.iters, warmup=args.warmup,
                               timeout=1800, baselines=["allreduce", "allgather"])
        wall = time.perf_counter() - t0
        for res, src in zip(results, sources):
            rows.append({
                "ranks": n, "collective": res.collective, "program": res.program, "source": src,
                "size_bytes": res.size_bytes, "ok": res.ok, "exec_ms": res.time_us / 1e3,
                "torch_ms": res.baseline_time_us / 1e3, "ratio": res.time_us / res.baseline_time_us,
                "exec_algbw_GBps": res.algbw_GBps, "waves": res.waves, "messages": res.messages,
                "launch_wall_s": wall,
            })
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'ranks':>5} {'collective':<10} {'program':<34} {'size':>7} {'ok':>3} {'exec ms':>9} "
              f"{'torch ms':>9} {'ratio':>6} {'algbw GB/s':>10}")
        for r in rows:
            print(f"{r['ranks']:>5} {r['collective']:<10} {r['program'][:34]:<34} {format_size(r['size_bytes']):>7} "
                  f"{'yes' if r['ok'] else 'NO':>3} {r['exec_ms']:9.1f} {r['torch_ms']:9.1f} {r['ratio']:6.2f} "
                  f"{r['exec_algbw_GBps']:10.3f}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
