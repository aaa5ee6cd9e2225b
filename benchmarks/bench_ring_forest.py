"""A ring-shaped forest for two-machine allgather: how close its list schedule gets to ``synth bounds``.

Usage: python benchmarks/bench_ring_forest.py [--topology mi250-2node] [--size 1GiB] [--chunks 162]
       [--late 0.33] [--late-parts 2] [--seconds 30]

An experiment behind the README's "Why mi250-2node stays at 0.952", not a method. The ``trees``
forest (ForestColl packing) is rate-optimal but its trees are deep and irregular, and its list
schedules lose 5 %. This forest is built instead from rings, which pipeline systolically:

1. Ranks pair up along their fattest intra-machine links (networkx max-weight matching); on
   mi250-2node a pair's links in (300 GB/s xGMI + 2 × 16 GB/s IB) are the binding cut.
2. CP-SAT (``AddCircuit``) finds two Hamiltonian cycles over the pairs of a machine, of 2 and 1
   units (``--unit`` GB/s), whose both directions fill every pair's links in: 2 · (2 + 1) units.
   Each cycle direction is split into unit rings over rank links (a second CP-SAT model; rings
   sharing a 2-unit link run the same cycle, so their messages there can be one).
3. A root's data goes round every ring of its own machine (7 pair hops, its pair mate a leaf at
   each pair), and over IB to its mirror rank in the other machine, which sends it round the same
   rings there. Part of the 2-unit rings' data (``trunc``) stops one pair short: IB brings it to that
   pair directly. The split that makes the rings and IB equally busy is the cut bound's.
4. The mirrored data comes in two IB phases: most of it early, the ``--late`` share last; the late
   share goes both ways round its cycle (4 + 3 pair hops, not 7) so it drains sooner.
5. Jobs (one message per root, ring group and phase on each link) are list-scheduled with
   :func:`synth.synthesis.trees.list_schedule` (local data first, then the early and the late
   mirrored data; IB: early, late, then the direct part) and compacted by
   :func:`synth.synthesis.trees.justify`. SPEC cost model, MSCCL's 71-chunk steps.

Printed: the forest's busiest link (rounding to whole chunks), the busiest links with their α, and
the two schedules' makespans as ratios to ``synth bounds``.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

EARLY, LATE = 1, 2
PRIORITY = {"mirror1": 0, "mirror2": 1, "direct": 2, "local": 0, "remote1": 1, "remote2": 2}


def rank_pairs(topology, machine: list[int]) -> list[tuple[int, int]]:
    """The machine's ranks paired along their fattest links (max-weight matching)."""
    import networkx as nx

    inside = set(machine)
    graph = nx.Graph()
    for link in topology.links:
        if link.src in inside and link.dst in inside:
            graph.add_edge(link.src, link.dst, weight=link.bw)
    pairs = sorted(tuple(sorted(p)) for p in nx.max_weight_matching(graph, maxcardinality=True))
    if 2 * len(pairs) != len(machine):
        raise SystemExit("the machine's ranks do not pair up")
    return pairs


def pair_cycles(units: dict[tuple[int, int], int], count: int, seconds: float) -> list[list[int]]:
    """Two Hamiltonian cycles over ``count`` pairs, of 2 and 1 units, both directions within ``units``."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    arcs = [(u, v) for u in range(count) for v in range(count) if u != v and units.get((u, v), 0)]
    x = [{a: model.NewBoolVar("") for a in arcs} for _ in range(2)]
    for cycle in x:
        model.AddCircuit([(u, v, lit) for (u, v), lit in cycle.items()])
    for u, v in arcs:
        both = [x[c].get(a) for c in range(2) for a in ((u, v), (v, u))]
        weight = [2, 2, 1, 1]
        model.Add(sum(w * lit for w, lit in zip(weight, both) if lit is not None) <= units[(u, v)])
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1   # one search: the same rings on every run
    if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SystemExit("no pair of cycles of 2 and 1 units fits this machine")
    cycles = []
    for cycle in x:
        succ = {u: v for (u, v), lit in cycle.items() if solver.Value(lit)}
        order = [0]
        while len(order) < count:
            order.append(succ[order[-1]])
        cycles.append(order)
    return cycles


def embed_rings(topology, pairs, cycles, unit: float, seconds: float) -> list[list[tuple[int, int]]]:
    """Six unit rings over rank links: cycle 1 forward twice and backward twice, cycle 2 each way
    once. ``rings[r][i]`` is the link from the ``i``-th pair of the ring's order to the next. Few
    relays (a ring entering a pair at one rank and leaving from the other); a 2-unit link carries
    rings of one group only."""
    from ortools.sat.python import cp_model

    cap = {(link.src, link.dst): int(round(link.bw / unit)) for link in topology.links}
    orders = [cycles[0], cycles[0], cycles[0][::-1], cycles[0][::-1], cycles[1], cycles[1][::-1]]
    group = [0, 0, 1, 1, 2, 3]
    model = cp_model.CpModel()
    use: dict[tuple[int, int, int, int], cp_model.IntVar] = {}
    for r, order in enumerate(orders):
        for i, p in enumerate(order):
            q = order[(i + 1) % len(order)]
            options = [(a, b) for a in pairs[p] for b in pairs[q] if cap.get((a, b), 0)]
            lits = [model.NewBoolVar("") for _ in options]
            model.AddExactlyOne(lits)
            use.update({(r, i, a, b): lit for (a, b), lit in zip(options, lits)})
    relays = []
    for r, order in enumerate(orders):
        for i in range(len(order)):
            for rank in pairs[order[(i + 1) % len(order)]]:
                enters = sum(v for (rr, ii, _, b), v in use.items() if rr == r and ii == i and b == rank)
                leaves = sum(v for (rr, ii, a, _), v in use.items()
                             if rr == r and ii == (i + 1) % len(order) and a == rank)
                flag = model.NewBoolVar("")
                model.Add(enters - leaves <= flag)
                model.Add(leaves - enters <= flag)
                relays.append(flag)
    for link, c in cap.items():
        on = [(r, v) for (r, _, a, b), v in use.items() if (a, b) == link]
        if not on:
            continue
        model.Add(sum(v for _, v in on) <= c)
        for (r1, v1) in on:
            for (r2, v2) in on:
                if r1 < r2 and group[r1] != group[r2] and c == 2:
                    model.Add(v1 + v2 <= 1)
    # a ring entering a pair at a rank also hands its data to the mate over the pair's link
    for a, b in pairs:
        for x, y in ((a, b), (b, a)):
            model.Add(sum(v for (_, _, _, d), v in use.items() if d == x) <= cap[(x, y)])
    model.Minimize(sum(relays))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1   # one search: the same rings on every run
    if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise SystemExit("the rings do not fit the machine's links")
    return [[next((a, b) for (rr, ii, a, b), v in use.items() if rr == r and ii == i and solver.Value(v))
             for i in range(len(order))] for r, order in enumerate(orders)]


class RingForest:
    """The trees of the module docstring on machine 0 (rings) and their copies on machine 1."""

    OPPOSITE = {0: 2, 1: 3, 2: 0, 3: 1, 4: 5, 5: 4}

    def __init__(self, machines, pairs, cycles, rings):
        self.machines = machines
        self.index = {g: (m, i) for m, ranks in enumerate(machines) for i, g in enumerate(ranks)}
        self.pair_of = {g: p for p, pair in enumerate(pairs) for g in pair}
        self.orders = [cycles[0], cycles[0], cycles[0][::-1], cycles[0][::-1], cycles[1], cycles[1][::-1]]
        self.rings = rings
        self.pairs = pairs

    def on(self, machine: int, local_rank: int) -> int:
        return self.machines[machine][local_rank]

    def mirror(self, g: int) -> int:
        m, i = self.index[g]
        return self.on(1 - m, i)

    def walk(self, ring: int, start: int, hops: int, edges: list) -> None:
        """Edges taking ``start``'s data round ``ring`` for ``hops`` pairs (mates as leaves)."""
        m, i = self.index[start]
        local = self.machines[0][i]
        order, links = self.orders[ring], self.rings[ring]
        q = order.index(self.pair_of[local])
        mate = {a: b for a, b in self.pairs} | {b: a for a, b in self.pairs}
        to = lambda g: self.on(m, self.index[g][1])   # noqa: E731 - machine-0 rank -> machine m
        exit_rank = links[q][0]
        edges.append((to(local), to(mate[local]) if exit_rank == local else to(exit_rank)))
        prev = exit_rank
        for s in range(1, hops + 1):
            j = (q + s) % len(order)
            enter = links[(j - 1) % len(order)][1]
            edges.append((to(prev), to(enter)))
            leave = links[j][0]
            edges.append((to(enter), to(mate[enter]) if s == hops or leave == enter else to(leave)))
            prev = leave if s < hops and leave != enter else enter

    def tree(self, g: int, ring: int, variant: str) -> tuple[list, list, int, int | None]:
        """(edges, IB flags, own-machine edge count, direct IB target) of one tree of root ``g``; the
        direct part goes to either rank of the pair, alternating by root and ring group (IB in level)."""
        direct_side = (g + ring // 2) % 2
        edges: list[tuple[int, int]] = []
        self.walk(ring, g, len(self.orders[ring]) - 1, edges)
        own = len(edges)
        gp = self.mirror(g)
        edges.append((g, gp))
        direct = None
        far: list[tuple[int, int]] = []
        if variant == "late":
            self.walk(ring, gp, 4, far)
            self.walk(self.OPPOSITE[ring], gp, len(self.orders[ring]) - 5, far)
        else:
            self.walk(ring, gp, len(self.orders[ring]) - (2 if variant == "trunc" else 1), far)
        have = {gp}
        for p, c in far:
            if c not in have:
                edges.append((p, c))
                have.add(c)
        if variant == "trunc":
            m, _ = self.index[gp]
            order = self.orders[ring]
            pred = order[(order.index(self.pair_of[self.machines[0][self.index[gp][1]]]) - 1) % len(order)]
            direct = self.on(m, self.index[self.pairs[pred][direct_side]][1])
            edges += [(g, direct), (direct, self.on(m, self.index[self.pairs[pred][1 - direct_side]][1]))]
        ib = [e == (g, gp) or e == (g, direct) for e in edges]
        return edges, ib, own, direct


def layout(sizes: tuple[int, int, int], late: float) -> list[tuple[int, int, str, int]]:
    """(ring, phase, variant, chunks) in buffer order for one root: ``sizes`` = (chunks per ring of
    cycle 1, per ring of cycle 2, truncated chunks per ring of cycle 1). A ring group's phases are
    adjacent, so a message can carry a group's chunks of one phase, and IB sends a phase at a time."""
    a, b, t = sizes
    segs = []
    for group in ((0, 1), (2, 3), (4,), (5,)):
        per = a if group[0] < 4 else b
        late_n = min(round(late * per), per - (t if group[0] < 4 else 0))
        early = []
        for k, r in enumerate(group):
            cut = t if r < 4 else 0
            part = [(r, EARLY, "full", per - late_n - cut)] + ([(r, EARLY, "trunc", t)] if cut else [])
            early += part[::-1] if k else part
        segs += early + [(r, LATE, "late", late_n) for r in group]
    return [s for s in segs if s[3] > 0]


def root_loads(forest: RingForest, topology, per_root_bytes: float, chunks: int, g: int, segs) -> np.ndarray:
    """µs each link (by index) is busy with root ``g``'s data (no α) when it sends ``segs``."""
    index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    switch = topology.num_ranks
    load = np.zeros(len(topology.links))
    for ring, _, variant, count in segs:
        edges, ib, _, _ = forest.tree(g, ring, variant)
        for (p, c), via in zip(edges, ib):
            for hop in ((p, switch), (switch, c)) if via else ((p, c),):
                i = index[hop]
                load[i] += count * per_root_bytes / chunks / (topology.links[i].bw * 1e3)
    return load


def _heights(edges: list[tuple[int, int]]) -> dict[int, int]:
    """Hops below each node of a tree given as parent-first edges."""
    height: dict[int, int] = defaultdict(int)
    for p, c in reversed(edges):
        height[p] = max(height[p], height[c] + 1)
    return height


def jobs_of(forest: RingForest, topology, chunks: int, segs_of, late_parts: int = 2):
    """One job per root, ring group, phase and tree edge (the chunks the group's trees move there);
    the late phase's in ``late_parts`` messages, so its last hops are short."""
    from synth.synthesis.base import MAX_STEP_CHUNKS
    from synth.synthesis.trees import _Jobs

    switch = (topology.num_ranks,)
    jobs = _Jobs.empty()

    def runs(ids):
        out = []
        for c in sorted(ids):
            if out and c == out[-1][-1] + 1 and len(out[-1]) < MAX_STEP_CHUNKS:
                out[-1].append(c)
            else:
                out.append([c])
        return out

    for g in range(topology.num_ranks):
        segs = segs_of(g)
        ids, pos = {}, g * chunks
        for s in segs:
            ids[s], pos = list(range(pos, pos + s[3])), pos + s[3]
        gp = forest.mirror(g)
        over_ib = {}
        for phase in (EARLY, LATE):
            for run in runs(c for s in segs if s[1] == phase for c in ids[s]):
                j = jobs.add(tuple(run), g, gp, switch, False, (), (PRIORITY[f"mirror{phase}"], run[0], 0, g))
                over_ib.update({c: j for c in run})
        direct = defaultdict(list)
        trees = {s: forest.tree(g, s[0], s[2]) for s in segs}
        for s, (edges, _, _, target) in trees.items():
            if target is not None:
                direct[(target, edges[-1][1])] += ids[s]
        for (target, mate), chunk_ids in direct.items():
            for run in runs(chunk_ids):
                j = jobs.add(tuple(run), g, target, switch, False, (), (PRIORITY["direct"], 0, 0, g))
                jobs.add(tuple(run), target, mate, (), False, (j,), (PRIORITY["direct"], 1, 0, g))
        for group in ((0, 1), (2, 3), (4,), (5,)):
            sides = (("local", (EARLY, LATE), g), ("remote1", (EARLY,), gp), ("remote2", (LATE,), gp))
            for side, phases, origin in sides:
                carried: dict[tuple[int, int], list[int]] = {}
                below: dict[tuple[int, int], int] = defaultdict(int)
                for s in segs:
                    if s[0] not in group or s[1] not in phases:
                        continue
                    edges, ib, own, target = trees[s]
                    last = len(edges) - (2 if target is not None else 0)   # the direct part is sent above
                    span = range(own) if side == "local" else range(own + 1, last)
                    height = _heights(edges)
                    for e in span:
                        carried.setdefault(edges[e], []).extend(ids[s])
                        below[edges[e]] = max(below[edges[e]], height[edges[e][1]])
                arrived: dict[tuple[int, int], int] = {}
                pending = dict(carried)
                whole = True   # a group's edge moves all its chunks at once while that can be done
                while pending:
                    progress = False
                    for (p, c), chunk_ids in list(pending.items()):
                        ready = [x for x in chunk_ids if p == origin or (p, x) in arrived]
                        if not ready or (whole and len(ready) < len(chunk_ids)):
                            continue
                        parts = late_parts if side == "remote2" else 1
                        pieces = [run[k * len(run) // parts:(k + 1) * len(run) // parts]
                                  for run in runs(ready) for k in range(parts)]
                        for run in (piece for piece in pieces if piece):
                            if p == origin:
                                deps = () if side == "local" else tuple(sorted({over_ib[x] for x in run}))
                            else:
                                deps = tuple(sorted({arrived[(p, x)] for x in run}))
                            key = (PRIORITY[side], 0, -below[(p, c)], group[0], g)
                            j = jobs.add(tuple(run), p, c, (), False, deps, key)
                            arrived.update({(c, x): j for x in run})
                        rest = [x for x in chunk_ids if x not in set(ready)]
                        if rest:
                            pending[(p, c)] = rest
                        else:
                            del pending[(p, c)]
                        progress = True
                    if not progress and not whole:
                        raise SystemExit("internal: a tree edge waits on data that never arrives")
                    # two rings of a group that cross one link in opposite orders: send what is there
                    whole = progress
    return jobs


def main() -> None:
    from synth.bounds import compute_bounds
    from synth.collectives import Collective
    from synth.synthesis import trees as T
    from synth.topology.io import load_topology
    from synth.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="mi250-2node")
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--chunks", type=int, default=162, help="chunks per root")
    parser.add_argument("--late", type=float, default=0.33, help="share of a ring's data mirrored late")
    parser.add_argument("--late-parts", type=int, default=2, help="messages per late share and link")
    parser.add_argument("--unit", type=float, default=50.0, help="GB/s of one ring")
    parser.add_argument("--seconds", type=float, default=30.0, help="CP-SAT time per model")
    args = parser.parse_args()

    topology = load_topology(args.topology)
    if len(topology.machines or ()) != 2 or len(topology.switches) != 1:
        raise SystemExit("this experiment needs two machines and one switch")
    size = parse_size(args.size)
    n, chunks = topology.num_ranks, args.chunks
    machines = [list(m) for m in topology.machines]
    pairs = rank_pairs(topology, machines[0])
    pair_of = {g: p for p, pair in enumerate(pairs) for g in pair}
    units: dict[tuple[int, int], int] = defaultdict(int)
    for link in topology.links:
        if link.src in pair_of and link.dst in pair_of and pair_of[link.src] != pair_of[link.dst]:
            units[(pair_of[link.src], pair_of[link.dst])] += int(round(link.bw / args.unit))
    cycles = pair_cycles(units, len(pairs), args.seconds)
    rings = embed_rings(topology, pairs, cycles, args.unit, args.seconds)
    forest = RingForest(machines, pairs, cycles, rings)
    print(f"pairs {pairs}\ncycles over pairs {cycles}")
    bound = compute_bounds(topology, Collective("allgather", n), size).time_bound_us
    per_root = size / n

    # whole chunks per ring: roots alternate two splits so the links average out (a search)
    sixth = chunks // 6
    options = [(a, (chunks - 4 * a) // 2, t) for a in range(sixth - 3, sixth + 4) if (chunks - 4 * a) % 2 == 0
               for t in range(int(0.6 * a), int(0.72 * a) + 1)]
    loads = {(parity, o): sum(root_loads(forest, topology, per_root, chunks, g, layout(o, 0.0))
                              for g in range(parity, n, 2)) for parity in (0, 1) for o in options}
    worst, even, odd = min((float((loads[(0, e)] + loads[(1, o)]).max()), e, o) for e in options for o in options)
    print(f"forest at {chunks} chunks per root: busiest link {worst:.1f} us (bound {bound:.1f} us, "
          f"{bound / worst:.4f}); splits (cycle-1 ring, cycle-2 ring, truncated) {even} / {odd}")
    segs = {0: layout(even, args.late), 1: layout(odd, args.late)}
    jobs = jobs_of(forest, topology, chunks, lambda g: segs[g % 2], args.late_parts)
    coll = Collective("allgather", n, chunks)
    chunk_bytes = coll.chunk_bytes(size)
    costs = T._route_costs(jobs, topology, chunk_bytes)
    order, start, end = T.list_schedule(jobs, topology, chunk_bytes, costs=costs)
    makespan = float(end.max())
    busy: dict[int, float] = defaultdict(float)
    messages: dict[int, int] = defaultdict(int)
    for i, hops in enumerate(costs[0]):
        for h in hops:
            busy[h] += end[i] - start[i]
            messages[h] += 1
    for kind, pick in (("IB", lambda lk: lk.src >= n or lk.dst >= n), ("ring", lambda lk: lk.src < n and lk.dst < n)):
        h = max((h for h in busy if pick(topology.links[h])), key=busy.get)
        link = topology.links[h]
        print(f"busiest {kind} link {link.src}->{link.dst}: {busy[h]:.1f} us with {messages[h]} messages")
    plain = T.Forest((), 1, None, None, None, False, n)
    transfers = T._phase_transfers(jobs, plain, order, start, end, makespan, 0.0, False, 0, None)
    justified = T.justify(transfers, topology, chunk_bytes, makespan)
    final = justified[0] if justified is not None else makespan
    print(f"list schedule {makespan:.1f} us ({bound / makespan:.4f}); justified {final:.1f} us ({bound / final:.4f}); "
          f"{len(jobs.msg)} messages")


if __name__ == "__main__":
    main()
