"""Ring forests: a ``trees`` alternative for allgather, reducescatter and allreduce on two machines of
rank pairs behind one switch (boxes read from the fabric: :mod:`synth.topology.structure`).

The ForestColl packing (:func:`synth.synthesis.trees.plan_forest`) reaches the cut bound's rate, but
its trees are deep and irregular, and list schedules of them leave links idle. On mi250-2node the gap
is 5 %. Rings pipeline systolically (each link always has the next block), so this forest is built
from rings and still meets the cut:

1. **Pairs.** A machine's ranks pair along their fattest links (networkx max-weight matching). On
   mi250-2node a GCD pair's links in (300 GB/s xGMI + 2 × 16 GB/s IB) are the binding cut.
2. **Cycles over pairs.** CP-SAT (``AddCircuit``) finds two Hamiltonian cycles over a machine's
   pairs, of 2 and 1 units (``unit`` = the gcd of the machine's link bandwidths), whose two directions
   together fill every pair's links in: 2 · (2 + 1) units each. A decomposition of a regular graph
   into Hamiltonian cycles, as in NCCL's multi-ring allgather, on the pair quotient.
3. **Unit rings over rank links.** A second CP-SAT model maps each cycle direction to unit rings
   over rank links (cycle 1 twice each way, cycle 2 once): a ring enters a pair at one rank and
   leaves from either, the mate receiving a copy; few relays; rings on one 2-unit link run the
   same cycle, so one message there can carry both rings' chunks.
4. **Trees.** A root's data goes round every ring of its machine (the pairs in ring order, each
   mate a leaf), and over the switch to its mirror rank in the other machine, which sends it round
   the same rings there. On cycle 1's rings a share ``t`` stops one pair short; the switch brings it
   to that pair directly. Each pair then gets the cut bound's IB share: per ring link
   ``s·(28 − 2f)`` for ring share ``s`` and stopped share ``f``, against ``1 + Σ s·f`` per IB link.
   Whole chunks per ring and ``t`` are searched (roots in ``ROOT_CLASSES`` classes, each its own
   split) for the least busiest link; on mi250-2node 3040.9 µs against the bound's 3032.0.
5. **Phases.** The mirrored data crosses the switch in two phases, the ``late`` share last; the late
   share goes both ways round its cycle (4 + 3 pair hops, not 7), so it drains sooner. The direct
   part comes last on the switch, the last of it in shrinking messages (``DIRECT_TAIL``), so the
   copy each needs inside its pair is short.
6. **Timing.** One message per root, ring group, phase and tree edge (up to 71 chunks: MSCCL's
   ``cnt``), list-scheduled by :func:`synth.synthesis.timing.list_schedule` (a root's own-machine data
   first, then the early and the late mirrored data; the switch early, late, then direct) and
   compacted by :func:`synth.synthesis.timing.justify`. docs/cost-model.md.

A reducescatter is the allgather's time mirror on the reversed fabric; an allreduce is that
reducescatter followed by the allgather. mi250-2node, 1 GiB, 256 chunks per root: allgather and
reducescatter 3089.7 µs simulated, allreduce 6179.3 µs, each 0.9813 of ``synth bounds`` (the ForestColl
forests' schedules: 0.952); ``python benchmarks/bench_ring_forest.py``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from synth.collectives import Collective
from synth.errors import SynthError
from synth.schedule import Schedule, Transfer, time_mirrored
from synth.synthesis.base import MAX_STEP_CHUNKS
from synth.synthesis.timing import Jobs, justify, list_schedule, phase_transfers, route_costs
from synth.topology.model import Topology
from synth.topology.structure import aligned_boxes

EARLY, LATE = 1, 2
# list-schedule classes: the switch sends early, late, then direct; rings own data, early, late
PRIORITY = {"mirror1": 0, "mirror2": 1, "direct": 2, "local": 0, "remote1": 1, "remote2": 2}
CYCLE_UNITS = (2, 1)          # the two cycles over pairs, in units of the machine's gcd bandwidth
GROUPS = ((0, 1), (2, 3), (4,), (5,))   # rings that run one cycle direction (messages merge on shared links)
OPPOSITE = {0: 2, 1: 3, 2: 0, 3: 1, 4: 5, 5: 4}
LATE_SHARES = (0.33, 0.45)    # share of a ring's mirrored data sent late (the faster is kept)
LATE_PARTS = 2                # messages per late share and link
DIRECT_TAIL = (0.6, 0.3, 0.1)  # the last direct part over the switch, in shrinking messages
ROOT_CLASSES = 8              # roots r ≡ c (mod 8) share a split of their chunks over the rings
CP_SAT_WORK = 20.0   # CP-SAT deterministic time (work, not wall-clock: the same rings on a loaded machine)


@dataclass(frozen=True)
class RingForest:
    """Rings of the module docstring: ``machines`` (rank lists, same order), ``pairs`` of machine 0,
    ``orders[r]`` ring ``r``'s pairs in order and ``links[r][i]`` its rank link from pair ``orders[r][i]``
    to the next (machine 0 ranks)."""

    machines: tuple[tuple[int, ...], ...]
    pairs: tuple[tuple[int, int], ...]
    orders: tuple[tuple[int, ...], ...]
    links: tuple[tuple[tuple[int, int], ...], ...]

    @cached_property
    def _where(self) -> dict[int, tuple[int, int]]:
        """Rank -> (machine, index in it)."""
        return {g: (m, i) for m, ranks in enumerate(self.machines) for i, g in enumerate(ranks)}

    @cached_property
    def _pair_of(self) -> dict[int, int]:
        """Machine-0 rank -> its pair's index."""
        return {g: p for p, pair in enumerate(self.pairs) for g in pair}

    @cached_property
    def _mate(self) -> dict[int, int]:
        return {a: b for a, b in self.pairs} | {b: a for a, b in self.pairs}

    def mirror(self, g: int) -> int:
        m, i = self._where[g]
        return self.machines[1 - m][i]

    def walk(self, ring: int, start: int, hops: int, edges: list[tuple[int, int]]) -> None:
        """Append the edges taking ``start``'s data round ``ring`` for ``hops`` pairs (mates as leaves)."""
        m, i = self._where[start]
        to = self.machines[m]   # machine-0 rank x is rank to[index of x] of machine m
        mate = self._mate
        order, links = self.orders[ring], self.links[ring]
        local = self.machines[0][i]
        q = order.index(self._pair_of[local])
        at = {g: to[j] for g, (_, j) in self._where.items() if g in mate}
        exit_rank = links[q][0]
        edges.append((at[local], at[mate[local]] if exit_rank == local else at[exit_rank]))
        prev = exit_rank
        for s in range(1, hops + 1):
            j = (q + s) % len(order)
            enter = links[(j - 1) % len(order)][1]
            edges.append((at[prev], at[enter]))
            leave = links[j][0]
            last_or_leaf = s == hops or leave == enter
            edges.append((at[enter], at[mate[enter]] if last_or_leaf else at[leave]))
            prev = enter if last_or_leaf else leave

    def tree(self, g: int, ring: int, variant: str) -> tuple[list[tuple[int, int]], int, int | None]:
        """(edges parent first, edges in ``g``'s own machine, the direct target) of root ``g``'s tree on
        ``ring``: ``full``, ``trunc`` (stops a pair short; the direct target's pair gets it over the
        switch, its mate by a copy: the last two edges) or ``late`` (4 + 3 pair hops both ways round).
        Edge ``own`` is the switch hop to the mirror; a direct part alternates between the pair's ranks."""
        hops = len(self.orders[ring]) - 1
        edges: list[tuple[int, int]] = []
        self.walk(ring, g, hops, edges)
        own = len(edges)
        gp = self.mirror(g)
        edges.append((g, gp))
        far: list[tuple[int, int]] = []
        if variant == "late":
            ahead = (hops + 1) // 2
            self.walk(ring, gp, ahead, far)
            self.walk(OPPOSITE[ring], gp, hops - ahead, far)
        else:
            self.walk(ring, gp, hops - (1 if variant == "trunc" else 0), far)
        have = {gp}
        for p, c in far:
            if c not in have:
                edges.append((p, c))
                have.add(c)
        if variant != "trunc":
            return edges, own, None
        m, i = self._where[gp]
        order = self.orders[ring]
        pred = self.pairs[order[(order.index(self._pair_of[self.machines[0][i]]) - 1) % len(order)]]
        side = (g + ring // 2) % 2
        to = {x: self.machines[m][self._where[x][1]] for x in pred}
        direct = to[pred[side]]
        edges += [(g, direct), (direct, to[pred[1 - side]])]
        return edges, own, direct


def _applies(topology: Topology) -> tuple[tuple[tuple[int, ...], ...], float] | None:
    """(machines, unit GB/s) where the construction can apply: two boxes read from the fabric
    (:func:`synth.topology.structure.aligned_boxes`, ranks in matching order) whose links match rank
    for rank, one switch every rank reaches, an even number of ranks each."""
    machines = aligned_boxes(topology) or ()
    if len(machines) != 2 or len(topology.switches) != 1 or len(machines[0]) != len(machines[1]):
        return None
    if len(machines[0]) % 2 or len(machines[0]) < 4:
        return None
    switch = topology.num_ranks
    have = {(link.src, link.dst): link for link in topology.links}
    to_other = dict(zip(machines[0], machines[1]))
    inside = set(machines[0])
    bws = []
    for (a, b), link in have.items():
        if a in inside and b in inside:
            twin = have.get((to_other[a], to_other[b]))
            if twin is None or twin.bw != link.bw or twin.alpha != link.alpha:
                return None
            bws.append(link.bw)
    if not bws or any((g, switch) not in have or (switch, g) not in have for g in range(topology.num_ranks)):
        return None
    unit = float(math.gcd(*(int(round(b)) for b in bws)))
    if unit <= 0 or any(abs(b / unit - round(b / unit)) > 1e-9 for b in bws):
        return None
    return machines, unit


def rank_pairs(topology: Topology, machine: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """The machine's ranks paired along their fattest links (max-weight matching), or None."""
    import networkx as nx

    inside = set(machine)
    graph = nx.Graph()
    for link in topology.links:
        if link.src in inside and link.dst in inside:
            graph.add_edge(link.src, link.dst, weight=link.bw)
    pairs = tuple(sorted(tuple(sorted(p)) for p in nx.max_weight_matching(graph, maxcardinality=True)))
    return pairs if 2 * len(pairs) == len(machine) else None


def pair_cycles(units: dict[tuple[int, int], int], count: int) -> tuple[tuple[int, ...], ...] | None:
    """Two Hamiltonian cycles over ``count`` pairs, of ``CYCLE_UNITS``, both directions within ``units``
    (units from pair to pair); None if CP-SAT finds none."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    arcs = [(u, v) for u in range(count) for v in range(count) if u != v and units.get((u, v), 0)]
    x = [{a: model.NewBoolVar("") for a in arcs} for _ in CYCLE_UNITS]
    for cycle in x:
        model.AddCircuit([(u, v, lit) for (u, v), lit in cycle.items()])
    for u, v in arcs:
        model.Add(sum(w * lit for w, cycle in zip(CYCLE_UNITS, x) for a in ((u, v), (v, u))
                      if (lit := cycle.get(a)) is not None) <= units[(u, v)])
    solver = _solver(cp_model)
    if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    cycles = []
    for cycle in x:
        succ = {u: v for (u, v), lit in cycle.items() if solver.Value(lit)}
        order = [0]
        while len(order) < count:
            order.append(succ[order[-1]])
        cycles.append(tuple(order))
    return tuple(cycles)


def embed_rings(topology: Topology, pairs, cycles, unit: float):
    """Unit rings over rank links (module docstring, step 3): (orders, links) or None."""
    from ortools.sat.python import cp_model

    cap = {(link.src, link.dst): int(round(link.bw / unit)) for link in topology.links}
    orders = (cycles[0], cycles[0], cycles[0][::-1], cycles[0][::-1], cycles[1], cycles[1][::-1])
    group = {r: k for k, members in enumerate(GROUPS) for r in members}
    model = cp_model.CpModel()
    use = {}
    for r, order in enumerate(orders):
        for i, p in enumerate(order):
            q = order[(i + 1) % len(order)]
            options = [(a, b) for a in pairs[p] for b in pairs[q] if cap.get((a, b), 0)]
            if not options:
                return None
            lits = [model.NewBoolVar("") for _ in options]
            model.AddExactlyOne(lits)
            use.update({(r, i, a, b): lit for (a, b), lit in zip(options, lits)})
    relays = []
    for r, order in enumerate(orders):
        size = len(order)
        for i in range(size):
            for rank in pairs[order[(i + 1) % size]]:
                enters = sum(v for (rr, ii, _, b), v in use.items() if rr == r and ii == i and b == rank)
                leaves = sum(v for (rr, ii, a, _), v in use.items() if rr == r and ii == (i + 1) % size and a == rank)
                flag = model.NewBoolVar("")
                model.Add(enters - leaves <= flag)
                model.Add(leaves - enters <= flag)
                relays.append(flag)
    on_link: dict[tuple[int, int], list] = defaultdict(list)
    for (r, _, a, b), v in use.items():
        on_link[(a, b)].append((r, v))
    for link, on in on_link.items():
        model.Add(sum(v for _, v in on) <= cap[link])
        if cap[link] == 2:   # a shared 2-unit link: rings of one group, so their messages merge
            for r1, v1 in on:
                for r2, v2 in on:
                    if r1 < r2 and group[r1] != group[r2]:
                        model.Add(v1 + v2 <= 1)
    for a, b in pairs:   # a ring entering a pair at x also hands its data to the mate
        for x, y in ((a, b), (b, a)):
            model.Add(sum(v for (_, _, _, d), v in use.items() if d == x) <= cap.get((x, y), 0))
    model.Minimize(sum(relays))
    solver = _solver(cp_model)
    if solver.Solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    links = tuple(tuple(next((a, b) for (rr, ii, a, b), v in use.items() if rr == r and ii == i and solver.Value(v))
                        for i in range(len(order))) for r, order in enumerate(orders))
    return orders, links


def _solver(cp_model):
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = CP_SAT_WORK
    solver.parameters.num_workers = 1   # one search: the same rings on every run
    return solver


def build(topology: Topology) -> RingForest | None:
    """The rings of ``topology``, or None where the construction does not apply."""
    found = _applies(topology)
    if found is None:
        return None
    machines, unit = found
    pairs = rank_pairs(topology, machines[0])
    if pairs is None:
        return None
    pair_of = {g: p for p, pair in enumerate(pairs) for g in pair}
    units: dict[tuple[int, int], int] = defaultdict(int)
    ingress: dict[int, int] = defaultdict(int)
    for link in topology.links:
        if link.src in pair_of and link.dst in pair_of and pair_of[link.src] != pair_of[link.dst]:
            units[(pair_of[link.src], pair_of[link.dst])] += int(round(link.bw / unit))
            ingress[pair_of[link.dst]] += int(round(link.bw / unit))
    if set(ingress.values()) != {2 * sum(CYCLE_UNITS)} or len(ingress) != len(pairs):
        return None   # the two cycles would not fill every pair's links in
    cycles = pair_cycles(units, len(pairs))
    if cycles is None:
        return None
    rings = embed_rings(topology, pairs, cycles, unit)
    if rings is None:
        return None
    return RingForest(machines, pairs, *rings)


def layout(split: tuple[int, int, int], late: float) -> list[tuple[int, int, str, int]]:
    """(ring, phase, variant, chunks) in buffer order for one root: ``split`` = (chunks per ring of
    cycle 1, per ring of cycle 2, stopped chunks per ring of cycle 1). A ring group's phases are
    adjacent, so one message carries a group's chunks of a phase, and a phase crosses the switch whole."""
    a, b, t = split
    segs = []
    for group in GROUPS:
        per, cut = (a, t) if group[0] < 4 else (b, 0)
        late_n = min(round(late * per), per - cut)
        early = []
        for k, r in enumerate(group):
            part = [(r, EARLY, "full", per - late_n - cut)] + ([(r, EARLY, "trunc", cut)] if cut else [])
            early += part[::-1] if k else part
        segs += early + [(r, LATE, "late", late_n) for r in group]
    return [s for s in segs if s[3] > 0]


def root_loads(forest: RingForest, topology: Topology, per_root_bytes: float, chunks: int, g: int,
               segs) -> np.ndarray:
    """µs each link (by index) is busy with root ``g``'s data (no α) when it sends ``segs``."""
    index = {(link.src, link.dst): i for i, link in enumerate(topology.links)}
    switch = topology.num_ranks
    load = np.zeros(len(topology.links))
    for ring, _, variant, count in segs:
        edges, own, direct = forest.tree(g, ring, variant)
        for e, (p, c) in enumerate(edges):
            via = e == own or (direct is not None and e == len(edges) - 2)
            for hop in ((p, switch), (switch, c)) if via else ((p, c),):
                i = index[hop]
                load[i] += count * per_root_bytes / chunks / (topology.links[i].bw * 1e3)
    return load


def choose_splits(forest: RingForest, topology: Topology, per_root_bytes: float, chunks: int):
    """A split per root class (``ROOT_CLASSES``) with the least busiest link, and that link's µs: the best
    split for even and odd roots (every pair of options), then coordinate descent class by class."""
    n = topology.num_ranks
    sixth = chunks // 6
    options = [(a, (chunks - 4 * a) // 2, t) for a in range(max(1, sixth - 3), sixth + 4) if (chunks - 4 * a) % 2 == 0
               and chunks - 4 * a > 0 for t in range(int(0.6 * a), int(0.72 * a) + 1)]
    if not options:
        return None
    classes = min(ROOT_CLASSES, n)
    loads = {(c, o): sum(root_loads(forest, topology, per_root_bytes, chunks, g, layout(o, 0.0))
                         for g in range(c, n, classes)) for c in range(classes) for o in options}

    def worst(choice) -> float:
        return float(sum(loads[(c, o)] for c, o in enumerate(choice)).max())

    # start from the best split per parity (all pairs of options), then refine class by class
    halves = [{o: sum(loads[(c, o)] for c in range(parity, classes, 2)) for o in options} for parity in (0, 1)]
    even, odd = min(((e, o) for e in options for o in options),
                    key=lambda eo: float((halves[0][eo[0]] + halves[1][eo[1]]).max()))
    choice = [even if c % 2 == 0 else odd for c in range(classes)]
    best = worst(choice)
    improved = True
    while improved:
        improved = False
        for c in range(classes):
            for o in options:
                trial = choice[:c] + [o] + choice[c + 1:]
                if (w := worst(trial)) < best - 1e-9:
                    best, choice, improved = w, trial, True
    return choice, best


def _runs(ids) -> list[list[int]]:
    out: list[list[int]] = []
    for c in sorted(ids):
        if out and c == out[-1][-1] + 1 and len(out[-1]) < MAX_STEP_CHUNKS:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _shrinking(run: list[int], shares) -> list[list[int]]:
    out, pos = [], 0
    for k, share in enumerate(shares):
        size = round(share * len(run)) if k < len(shares) - 1 else len(run) - pos
        out.append(run[pos:pos + size])
        pos += size
    return [piece for piece in out if piece]


def _heights(edges: list[tuple[int, int]]) -> dict[int, int]:
    height: dict[int, int] = defaultdict(int)
    for p, c in reversed(edges):
        height[p] = max(height[p], height[c] + 1)
    return height


def jobs_of(forest: RingForest, topology: Topology, chunks: int, segs_of):
    """The jobs of the module docstring (step 6) for :func:`synth.synthesis.timing.list_schedule`."""

    switch = (topology.num_ranks,)
    jobs = Jobs.empty()
    for g in range(topology.num_ranks):
        segs = segs_of(g)
        ids, pos = {}, g * chunks
        for s in segs:
            ids[s], pos = list(range(pos, pos + s[3])), pos + s[3]
        gp = forest.mirror(g)
        over_switch = {}
        for phase in (EARLY, LATE):
            for run in _runs(c for s in segs if s[1] == phase for c in ids[s]):
                j = jobs.add(tuple(run), g, gp, switch, False, (), (PRIORITY[f"mirror{phase}"], run[0], 0, g))
                over_switch.update({c: j for c in run})
        trees = {s: forest.tree(g, s[0], s[2]) for s in segs}
        direct: dict[tuple[int, int], list[int]] = defaultdict(list)
        for s, (edges, _, target) in trees.items():
            if target is not None:
                direct[(target, edges[-1][1])] += ids[s]
        for d, ((target, mate), chunk_ids) in enumerate(direct.items()):
            tail = DIRECT_TAIL if d == len(direct) - 1 else (1.0,)
            for run in _runs(chunk_ids):
                for k, piece in enumerate(_shrinking(run, tail)):
                    j = jobs.add(tuple(piece), g, target, switch, False, (), (PRIORITY["direct"], d, k, g))
                    jobs.add(tuple(piece), target, mate, (), False, (j,), (0, 1, k, g))
        for group in GROUPS:
            sides = (("local", (EARLY, LATE), g), ("remote1", (EARLY,), gp), ("remote2", (LATE,), gp))
            for side, phases, origin in sides:
                _add_group(jobs, side, origin, group, phases, segs, ids, trees, over_switch, g)
    return jobs


def _add_group(jobs, side, origin, group, phases, segs, ids, trees, over_switch, g) -> None:
    """One ring group's jobs on one side (own machine, or the mirror's with a phase's data)."""
    carried: dict[tuple[int, int], list[int]] = {}
    below: dict[tuple[int, int], int] = defaultdict(int)
    for s in segs:
        if s[0] not in group or s[1] not in phases:
            continue
        edges, own, target = trees[s]
        height = _heights(edges)
        last = len(edges) - (2 if target is not None else 0)   # the direct part is sent apart
        for e in (range(own) if side == "local" else range(own + 1, last)):
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
            parts = LATE_PARTS if side == "remote2" else 1
            for run in _runs(ready):
                for piece in (run[k * len(run) // parts:(k + 1) * len(run) // parts] for k in range(parts)):
                    if not piece:
                        continue
                    if p != origin:
                        deps = tuple(sorted({arrived[(p, x)] for x in piece}))
                    else:
                        deps = () if side == "local" else tuple(sorted({over_switch[x] for x in piece}))
                    j = jobs.add(tuple(piece), p, c, (), False, deps, (PRIORITY[side], 0, -below[(p, c)], group[0], g))
                    arrived.update({(c, x): j for x in piece})
            sent = set(ready)
            rest = [x for x in chunk_ids if x not in sent]
            if rest:
                pending[(p, c)] = rest
            else:
                del pending[(p, c)]
            progress = True
        if not progress and not whole:
            raise SynthError("internal: a ring-forest edge waits on data that never arrives")
        whole = progress   # two rings of a group crossing a link in opposite orders: send what is there


def _timed_allgather(fabric: Topology, forest: RingForest, size_bytes: float, chunks: int):
    """(makespan, transfers, late share, busiest link µs) of the ring forest's allgather on ``fabric``, the
    fastest over ``LATE_SHARES``; None if no split fits ``chunks``."""
    n = fabric.num_ranks
    found = choose_splits(forest, fabric, size_bytes / n, chunks)
    if found is None:
        return None
    splits, busiest = found
    chunk_bytes = Collective("allgather", n, chunks).chunk_bytes(size_bytes)
    best = None
    for late in LATE_SHARES:
        segs = [layout(split, late) for split in splits]
        jobs = jobs_of(forest, fabric, chunks, lambda g, segs=segs: segs[g % len(segs)])
        costs = route_costs(jobs, fabric, chunk_bytes)
        order, start, end = list_schedule(jobs, fabric, chunk_bytes, costs=costs)
        makespan = float(end.max())
        transfers = phase_transfers(jobs, False, order, start, end, makespan, 0.0, False, 0, None)
        compacted = justify(transfers, fabric, chunk_bytes, makespan)
        if compacted is not None:
            makespan, transfers = compacted
        if best is None or makespan < best[0]:
            best = (makespan, transfers, late, busiest)
    return best


def schedule(topology: Topology, collective: Collective, size_bytes: float, chunks: int,
             forest: RingForest | None = None) -> Schedule | None:
    """The ring forest's schedule at ``chunks`` per root, or None where the construction does not apply:

    - allgather: the fastest over ``LATE_SHARES``;
    - reducescatter: its time mirror, an allgather on the reversed fabric with every transfer run
      backwards in time and direction as a reduction (as :func:`synth.synthesis.timing.phase_transfers`
      mirrors reduction forests);
    - allreduce: that reducescatter, then the allgather on channel 1 (Rabenseifner's split).
    """
    name = collective.name
    if name not in ("allgather", "reducescatter", "allreduce") or collective.num_ranks != topology.num_ranks:
        return None
    n = topology.num_ranks
    transfers: list[Transfer] = []
    notes: dict = {"ring_forest": True, "chunks_per_root": chunks}
    offset = 0.0
    for phase, reduce in enumerate([True] * (name != "allgather") + [False] * (name != "reducescatter")):
        fabric = topology.reversed() if reduce else topology
        rings = forest if forest is not None and not reduce else build(fabric)
        timed = None if rings is None else _timed_allgather(fabric, rings, size_bytes, chunks)
        if timed is None:
            return None
        makespan, part, late, busiest = timed
        if reduce:
            part = time_mirrored(part, makespan, reduce=True)
        transfers += [t._replace(start=t.start + offset, end=t.end + offset, channel=phase) for t in part]
        offset += makespan
        notes.update(ring_forest_busiest_link_us=busiest, late_share=late)
    transfers.sort(key=lambda t: (t.start, t.end))
    coll = Collective(name, n, n * chunks if name == "allreduce" else chunks, collective.root, collective.inplace)
    return Schedule(coll, topology.name, tuple(transfers), method="trees", size_bytes=float(size_bytes),
                    predicted_time_us=offset, notes=notes)
