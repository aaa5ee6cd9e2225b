"""Simulator throughput: a ring allgather built directly as Program IR on a ring topology.

Usage: ``python benchmarks/bench_simulate.py [--ranks 64 256 1024] [--chunks 1] [--repeat 3] [--fabric]``.
A ring allgather on N ranks with C chunks per rank moves N(N-1)C chunk transfers, so N=1024, C=1
is ~1.05 M transfers. Prints, per size, the median wall and CPU time of ``simulate`` (program
and topology construction excluded; CPU time is the steadier figure on a shared machine), transfers
per second, and the simulated time checked against the
closed form (N-1)·C·(alpha + SIZE/(N·C)/bw) (one threadblock per rank serialises its sends).

``--fabric`` runs the same kind of ring on a two-tier fabric instead (8 ranks per leaf switch, one
spine) with the ring ordered so that every hop goes rank -> leaf -> spine -> leaf -> rank: the 8
ranks of a leaf contend for its uplink, so nearly every transfer takes the gap-search path of the
link booking rather than the idle-link fast path. There is no closed form; the simulated time is
checked against the busiest uplink's total work instead (a lower bound).
"""

from __future__ import annotations

import argparse
import statistics
import time

from synth.program.ir import Gpu, Program, Step, Threadblock
from synth.simulation import simulate
from synth.topology.model import Link, Topology

BW, ALPHA, SIZE = 50.0, 0.5, 2**30


def ring_topology(n: int) -> Topology:
    links = []
    for r in range(n):
        links += [Link(r, (r + 1) % n, BW, ALPHA), Link((r + 1) % n, r, BW, ALPHA)]
    return Topology(name=f"ring{n}", num_ranks=n, links=tuple(links))


PER_LEAF = 8


def fabric_topology(n: int) -> Topology:
    """Ranks behind leaf switches (PER_LEAF each, 50 GB/s) under one spine (200 GB/s uplinks)."""
    leaves = n // PER_LEAF
    spine = n + leaves
    links = []
    for r in range(n):
        links += [Link(r, n + r // PER_LEAF, BW, ALPHA), Link(n + r // PER_LEAF, r, BW, ALPHA)]
    for leaf in range(n, spine):
        links += [Link(leaf, spine, 4 * BW, ALPHA), Link(spine, leaf, 4 * BW, ALPHA)]
    names = tuple(f"leaf{i}" for i in range(leaves)) + ("spine",)
    return Topology(name=f"fabric{n}", num_ranks=n, links=tuple(links), switches=names)


def leaf_striding_order(n: int) -> list[int]:
    """A ring visiting the leaves round-robin, so consecutive ranks are on different leaves."""
    leaves = n // PER_LEAF
    return [(p % leaves) * PER_LEAF + p // leaves for p in range(n)]


def ring_allgather(n: int, chunks: int = 1, order: list[int] | None = None) -> Program:
    """Rank r sends its C chunks to its ring successor, then forwards what it got from its
    predecessor (rcs), N-1 rounds; the ring is 0, 1, ..., N-1 unless ``order`` is given."""
    order = order or list(range(n))
    pos = {r: p for p, r in enumerate(order)}
    gpus = []
    for r in range(n):
        p = pos[r]
        steps = []
        for j in range(n):
            origin = order[(p - j) % n]
            typ = "s" if j == 0 else ("r" if j == n - 1 else "rcs")
            for k in range(chunks):
                off = origin * chunks + k
                steps.append(Step(typ, "o", off, "o", off))
        tb = Threadblock(0, send=order[(p + 1) % n], recv=order[(p - 1) % n], chan=0, steps=tuple(steps))
        gpus.append(Gpu(r, 0, n * chunks, 0, (tb,)))
    return Program(name=f"ring_allgather_{n}", collective="allgather", num_ranks=n, gpus=tuple(gpus),
                   inplace=True, nchunksperloop=n * chunks, chunk_factor=chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fabric", action="store_true", help="two-tier switch fabric (contended routes)")
    args = parser.parse_args()
    print(f"{'ranks':>6} {'transfers':>10} {'median_s':>9} {'cpu_s':>7} {'transfers/s':>12} {'sim_us':>12} "
          f"{'closed_us':>12}")
    for n in args.ranks:
        if args.fabric:
            if n % PER_LEAF or n < 2 * PER_LEAF:
                parser.error(f"--fabric needs a multiple of {PER_LEAF} ranks, at least {2 * PER_LEAF}")
            topo, prog = fabric_topology(n), ring_allgather(n, args.chunks, leaf_striding_order(n))
        else:
            topo, prog = ring_topology(n), ring_allgather(n, args.chunks)
        walls, cpus = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            res = simulate(prog, topo, SIZE)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        chunk = SIZE / (n * args.chunks)
        # One threadblock per rank runs its (N-1)C transfers one after the other on its out-link.
        closed = (n - 1) * args.chunks * (ALPHA + chunk / (BW * 1e3))
        if args.fabric:  # lower bound: a leaf's uplink carries PER_LEAF sends per round, each held
            # for the whole 4-hop route (4α + chunk/50 GB/s)
            closed = (n - 1) * args.chunks * PER_LEAF * (4 * ALPHA + chunk / (BW * 1e3))
        med = statistics.median(walls)
        print(f"{n:>6} {res.transfers:>10} {med:>9.3f} {statistics.median(cpus):>7.3f} {res.transfers / med:>12.0f} "
              f"{res.time_us:>12.3f} {closed:>12.3f}", flush=True)


if __name__ == "__main__":
    main()
