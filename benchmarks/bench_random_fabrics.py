"""Benchmark of method ``trees`` beyond the built-ins: seeded random switchless fabrics.

Usage: python benchmarks/bench_random_fabrics.py [--seeds 30] [--first 0] [--size 1GiB]
       [--collectives allreduce] [--boxes]

Fabric ``s`` (``random.Random(s)``): 4-12 ranks on a ring of 1-2 links per neighbour pair, plus up to
2N chords of 1, 2 or 4 links, every link 10, 25 or 50 GB/s and α 0.3, 0.7 or 2 µs
(:func:`synth.topology.generators.from_matrix`). With ``--boxes``: 2-4 boxes of 2, 4 or 8 ranks, each box a
ring of 100 GB/s links plus random 50 or 100 GB/s chords, every rank behind one IB switch at 12.5 or 25 GB/s
(:func:`synth.topology.generators.boxes_behind_nics`). Each row is :func:`bench_trees.run_one` (synthesize,
lower, verify, simulate, bound); the last line gives the median and least ratio, which the built-ins
alone would not show (irregular link counts are where whole trees lose a split's rate).
"""

from __future__ import annotations

import argparse
import random
import statistics

from bench_trees import run_one


def random_fabric(seed: int):
    from synth.topology.generators import from_matrix

    rng = random.Random(seed)
    n = rng.randint(4, 12)
    counts = [[0] * n for _ in range(n)]
    for i in range(n):
        j = (i + 1) % n
        counts[i][j] = counts[j][i] = rng.choice([1, 2])
    for _ in range(rng.randint(0, 2 * n)):
        i, j = rng.sample(range(n), 2)
        counts[i][j] = counts[j][i] = rng.choice([1, 1, 2, 4])
    return from_matrix(counts, rng.choice([10, 25, 50]), rng.choice([0.3, 0.7, 2.0]), name=f"random-{seed}")


def random_boxes(seed: int):
    from synth.topology.generators import boxes_behind_nics

    rng = random.Random(seed)
    per_box = rng.choice([2, 4, 8])
    intra = [[0.0] * per_box for _ in range(per_box)]
    for i in range(per_box):
        j = (i + 1) % per_box
        if i != j:
            intra[i][j] = intra[j][i] = 100.0
    for _ in range(rng.randint(0, per_box)):
        i, j = rng.sample(range(per_box), 2)
        intra[i][j] = intra[j][i] = rng.choice([50.0, 100.0])
    return boxes_behind_nics(rng.randint(2, 4), per_box, intra=intra, intra_alpha=0.7, nics_per_box=0,
                             nic_bw=rng.choice([12.5, 25.0]), name=f"boxes-{seed}")


def main() -> None:
    from synth.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--collectives", default="allreduce")
    parser.add_argument("--boxes", action="store_true", help="boxes behind an IB switch instead")
    args = parser.parse_args()
    size = parse_size(args.size)
    print(f"{'fabric':12s} {'ranks':>5s} {'collective':14s} {'ok':3s} {'sim us':>10s} {'bound us':>10s} "
          f"{'ratio':>6s} {'synth s':>7s}")
    ratios: dict[str, list[float]] = {}
    for seed in range(args.first, args.first + args.seeds):
        topology = random_boxes(seed) if args.boxes else random_fabric(seed)
        for name in args.collectives.split(","):
            row = run_one(topology, name, size)
            ratios.setdefault(name, []).append(row["ratio"])
            print(f"{topology.name:12s} {topology.num_ranks:5d} {name:14s} {str(row['ok']):3s} "
                  f"{row['time_us']:10.1f} {row['bound_us']:10.1f} {row['ratio']:6.4f} {row['synth_s']:7.1f}",
                  flush=True)
    for name, values in ratios.items():
        print(f"{name}: median ratio {statistics.median(values):.4f}, least {min(values):.4f} "
              f"over {len(values)} fabrics")


if __name__ == "__main__":
    main()
