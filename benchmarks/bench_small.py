"""Issue 35, small messages behind a switch: 1 KB allgather and allreduce, side by side in one run.

Usage::

    python benchmarks/bench_small.py [--fabrics dgx-a100,dgx-h100,dgx2] [--collectives allgather,allreduce]
        [--size 1KB] [--json]

Per fabric × collective it prints the simulated time (µs, synth's simulator, docs/cost-model.md) of

- ``auto`` and ``milp``, out of place (synth's default) and ``--inplace``;
- ``rdh``, synth's recursive doubling / halving baseline, both ways;
- every msccl-tools example program in ``tests/fixtures/msccl_examples`` for that collective and rank
  count (MSCCL XML written by msccl-tools' own ``examples/mscclang`` scripts; that folder's README gives
  the commands). They are all in place;

plus the lower bound of :func:`synth.lower_bounds.compute_bounds` (``bound``), the best program of the
row (``best``) and ``best / bound``. Every synth program goes through the pipeline: lowered, verified,
then simulated; the msccl-tools programs are simulated as they are.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tempfile
import time
from pathlib import Path

from synth.errors import SynthError
from synth.synthesis.base import SynthOptions
from synth.units import parse_size

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "msccl_examples"
NAME = re.compile(r"^(?P<coll>allgather|allreduce)_(?P<prog>.+?)_(?P<n>\d+)_\d+(?:_\d+)?\.xml\.gz$")


def msccl_programs(collective: str, ranks: int) -> list[tuple[str, Path]]:
    """(label, path) of the msccl-tools example programs for ``collective`` on ``ranks`` ranks."""
    out = []
    for path in sorted(FIXTURES.glob("*.xml.gz")):
        m = NAME.match(path.name)
        if m and m["coll"] == collective and int(m["n"]) == ranks:
            out.append((f"msccl:{m['prog']}", path))
    return out


def simulate_fixture(path: Path, topology, size: int) -> float:
    """Simulated µs of a gzipped msccl-tools XML program on ``topology`` at ``size``."""
    from synth.api import simulate

    with tempfile.TemporaryDirectory(prefix="synth-bench-small-") as tmp:
        xml = Path(tmp) / path.name.removesuffix(".gz")
        xml.write_bytes(gzip.decompress(path.read_bytes()))
        return simulate(str(xml), topology, size).time_us


def synth_row(topology, collective: str, size: int, method: str, inplace: bool) -> dict:
    from synth.pipeline import synthesize

    t0 = time.perf_counter()
    try:
        res = synthesize(topology, collective, size, method, SynthOptions(), inplace=inplace)
    except SynthError as exc:
        return {"error": str(exc)}
    return {"time_us": res.time_us, "method": res.method, "seconds": time.perf_counter() - t0}


def measure(fabric: str, collective: str, size: int) -> dict:
    """Every program of one row, its bound and its best."""
    from synth.api import load_topology
    from synth.lower_bounds import compute_bounds

    topology = load_topology(fabric)
    bounds = compute_bounds(topology, collective, size)
    cols: dict[str, dict] = {}
    for method in ("auto", "milp", "rdh"):
        for inplace in (False, True):
            cols[f"{method}{'/ip' if inplace else ''}"] = synth_row(topology, collective, size, method, inplace)
    for label, path in msccl_programs(collective, topology.num_ranks):
        cols[label] = {"time_us": simulate_fixture(path, topology, size)}
    times = {k: v["time_us"] for k, v in cols.items() if "time_us" in v}
    best = min(times.values())
    return {"fabric": fabric, "collective": collective, "size_bytes": size, "bound_us": bounds.time_bound_us,
            "latency_bound_us": bounds.latency_bound_us, "latency_method": bounds.details.get("latency_method"),
            "programs": cols, "best_us": best, "best": min(times, key=times.get),
            "best_over_bound": best / bounds.time_bound_us}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fabrics", default="dgx-a100,dgx-h100,dgx2")
    parser.add_argument("--collectives", default="allgather,allreduce")
    parser.add_argument("--size", default="1KB")
    parser.add_argument("--json", action="store_true", help="one JSON object per row")
    args = parser.parse_args(argv)
    size = parse_size(args.size)
    for fabric in args.fabrics.split(","):
        for collective in args.collectives.split(","):
            row = measure(fabric, collective, size)
            if args.json:
                print(json.dumps(row))
                continue
            print(f"\n{fabric} {collective} {args.size}: bound {row['bound_us']:.3f} us "
                  f"(latency {row['latency_bound_us']:.3f}, {row['latency_method']}); best {row['best']} "
                  f"{row['best_us']:.3f} us = {row['best_over_bound']:.2f}x bound")
            for label, col in row["programs"].items():
                if "time_us" in col:
                    extra = f"  -> {col['method']}" if col.get("method") and label.startswith("auto") else ""
                    print(f"  {label:<34} {col['time_us']:8.3f} us{extra}")
                else:
                    print(f"  {label:<34}   error: {col['error'][:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
