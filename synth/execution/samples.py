"""Hand-written textbook programs for every collective (rings, chains, direct exchanges).

They are the executor's test material and the benchmark's fallback programs: each one is written
directly as MSCCL-style steps (no synthesis), so executing them checks the executor and the
verifier independently of the synthesis pipeline. ``sample_program(name, n)`` returns one per
collective; every step type (s r rcs rrs rrc rrcs cpy re nop), the scratch buffer, cross-threadblock
dependencies and in-place aliasing appear in at least one of them.
"""

from __future__ import annotations

from dataclasses import replace

from synth.program.ir import Gpu, Program, Step, SwitchOp, SwitchProgram, Threadblock


class _Builder:
    """Collects steps per rank and threadblock; ``add`` returns (tb id, step index) for deps."""

    def __init__(self, n: int):
        self.n = n
        self.tbs: list[dict[tuple, list[Step]]] = [{} for _ in range(n)]
        self.ids: list[dict[tuple, int]] = [{} for _ in range(n)]

    def tb(self, rank: int, send: int = -1, recv: int = -1, chan: int = 0, tag: str = "") -> tuple:
        key = (send, recv, chan, tag)
        if key not in self.tbs[rank]:
            self.ids[rank][key] = len(self.tbs[rank])
            self.tbs[rank][key] = []
        return key

    def add(self, rank: int, key: tuple, type: str, src: tuple[str, int] = ("i", 0), dst: tuple[str, int] | None = None,
            cnt: int = 1, dep: tuple[int, int] | None = None) -> tuple[int, int]:
        dst = dst or src
        depid, deps = dep if dep else (-1, -1)
        steps = self.tbs[rank][key]
        steps.append(Step(type, src[0], src[1], dst[0], dst[1], cnt, depid, deps))
        return self.ids[rank][key], len(steps) - 1

    def build(self, name: str, collective: str, chunk_factor: int, i_chunks: int, o_chunks: int,
              s_chunks: int = 0, inplace: bool = False, root: int = 0) -> Program:
        gpus = []
        for r in range(self.n):
            needed = {(s.depid, s.deps) for steps in self.tbs[r].values() for s in steps if s.depid >= 0}
            tbs = []
            for key, steps in self.tbs[r].items():
                tid = self.ids[r][key]
                marked = tuple(s if (tid, k) not in needed else replace(s, hasdep=True)
                               for k, s in enumerate(steps))
                tbs.append(Threadblock(tid, key[0], key[1], key[2], marked))
            gpus.append(Gpu(r, i_chunks, o_chunks, s_chunks, tuple(sorted(tbs, key=lambda t: t.id))))
        return Program(name, collective, self.n, tuple(gpus), inplace=inplace, root=root,
                       nchunksperloop=max(i_chunks, o_chunks), chunk_factor=chunk_factor)


def ring_allgather(n: int, c: int = 1) -> Program:
    """Out-of-place ring allgather: copy own piece, then pass pieces n-1 times around the ring."""
    b = _Builder(n)
    for r in range(n):
        tb = b.tb(r, send=(r + 1) % n, recv=(r - 1) % n)
        b.add(r, tb, "cpy", ("i", 0), ("o", r * c), cnt=c)
        b.add(r, tb, "s", ("i", 0), ("o", r * c), cnt=c)
        for j in range(1, n):
            piece = (r - j) % n
            b.add(r, tb, "rcs" if j < n - 1 else "r", ("o", piece * c), ("o", piece * c), cnt=c)
    return b.build(f"ring_allgather_{n}", "allgather", c, c, n * c)


def ring_allreduce(n: int, m: int = 1) -> Program:
    """In-place ring allreduce on n blocks of m chunks: reduce-scatter (s, rrs, rrcs) then
    allgather (rcs, r) around the ring, as in NCCL's ring algorithm."""
    b = _Builder(n)
    for r in range(n):
        tb = b.tb(r, send=(r + 1) % n, recv=(r - 1) % n)

        def blk(k: int) -> tuple[str, int]:
            return ("i", (k % n) * m)

        b.add(r, tb, "s", blk(r), cnt=m)
        for j in range(1, n - 1):
            b.add(r, tb, "rrs", blk(r - j), cnt=m)
        b.add(r, tb, "rrcs", blk(r + 1), cnt=m)
        for j in range(n - 2):
            b.add(r, tb, "rcs", blk(r - j), cnt=m)
        b.add(r, tb, "r", blk(r + 2), cnt=m)
    return b.build(f"ring_allreduce_{n}", "allreduce", n * m, n * m, 0, inplace=True)


def ring_reducescatter(n: int, c: int = 1) -> Program:
    """Out-of-place ring reduce-scatter: block b starts at rank b+1 and ends reduced at rank b."""
    b = _Builder(n)
    for r in range(n):
        tb = b.tb(r, send=(r + 1) % n, recv=(r - 1) % n)
        b.add(r, tb, "s", ("i", ((r - 1) % n) * c), cnt=c)
        for j in range(1, n - 1):
            blk = ((r - 1 - j) % n) * c
            b.add(r, tb, "rrs", ("i", blk), cnt=c)
        b.add(r, tb, "rrc", ("i", r * c), ("o", 0), cnt=c)
    return b.build(f"ring_reducescatter_{n}", "reducescatter", c, n * c, c)


def direct_allreduce(n: int) -> Program:
    """In-place allreduce by direct exchange through the scratch buffer: rank r receives every
    peer's copy of block r into s, adds them with ``re`` (each step waiting on its receive via
    depid/deps), then sends the sum to every peer (each send waiting on the last ``re``)."""
    b = _Builder(n)
    for r in range(n):
        peers = [q for q in range(n) if q != r]
        recv_steps = {}
        for q in peers:
            tb = b.tb(r, send=q, recv=q)
            b.add(r, tb, "s", ("i", q), ("s", r))
            recv_steps[q] = b.add(r, tb, "r", ("s", q), ("s", q))
        local = b.tb(r, tag="reduce")
        last = None
        for q in peers:
            last = b.add(r, local, "re", ("s", q), ("i", r), dep=recv_steps[q])
        last = b.add(r, local, "nop", dep=last)
        for q in peers:
            tb = b.tb(r, send=q, recv=q)
            b.add(r, tb, "s", ("i", r), ("i", r), dep=last)
            b.add(r, tb, "r", ("i", q), ("i", q))
    return b.build(f"direct_allreduce_{n}", "allreduce", n, n, 0, s_chunks=n, inplace=True)


def direct_alltoall(n: int, c: int = 1) -> Program:
    """Out-of-place alltoall: one send and one receive threadblock per peer, plus a local copy."""
    b = _Builder(n)
    for r in range(n):
        for q in range(n):
            if q == r:
                continue
            b.add(r, b.tb(r, send=q), "s", ("i", q * c), ("o", r * c), cnt=c)
            b.add(r, b.tb(r, recv=q), "r", ("o", q * c), ("o", q * c), cnt=c)
        b.add(r, b.tb(r, tag="local"), "cpy", ("i", r * c), ("o", r * c), cnt=c)
    return b.build(f"direct_alltoall_{n}", "alltoall", c, n * c, n * c)


def chain_broadcast(n: int, c: int = 2, root: int = 0) -> Program:
    """Pipelined chain broadcast root -> root+1 -> ... one chunk at a time (s, rcs, r)."""
    b = _Builder(n)
    order = [(root + k) % n for k in range(n)]
    for pos, r in enumerate(order):
        nxt = order[pos + 1] if pos + 1 < n else -1
        prv = order[pos - 1] if pos > 0 else -1
        tb = b.tb(r, send=nxt, recv=prv)
        for k in range(c):
            if pos == 0:
                b.add(r, tb, "cpy", ("i", k), ("o", k))
                b.add(r, tb, "s", ("i", k), ("o", k))
            else:
                b.add(r, tb, "rcs" if nxt >= 0 else "r", ("o", k), ("o", k))
    return b.build(f"chain_broadcast_{n}", "broadcast", c, c, c, root=root)


def chain_reduce(n: int, c: int = 2, root: int = 0) -> Program:
    """Pipelined chain reduce root+1 -> ... -> root (s, rrs, rrc) into the root's output."""
    b = _Builder(n)
    order = [(root + 1 + k) % n for k in range(n)]  # ends at root
    for pos, r in enumerate(order):
        nxt = order[pos + 1] if pos + 1 < n else -1
        prv = order[pos - 1] if pos > 0 else -1
        tb = b.tb(r, send=nxt, recv=prv)
        for k in range(c):
            if pos == 0:
                b.add(r, tb, "s", ("i", k))
            elif nxt >= 0:
                b.add(r, tb, "rrs", ("i", k))
            else:
                b.add(r, tb, "rrc", ("i", k), ("o", k))
    return b.build(f"chain_reduce_{n}", "reduce", c, c, c, root=root)


def direct_gather(n: int, c: int = 1, root: int = 0) -> Program:
    """Direct gather; the root stages every piece in the scratch buffer and copies it out with a
    separate threadblock whose steps depend on the receives (cross-threadblock depid/deps)."""
    b = _Builder(n)
    staged = {}
    for q in range(n):
        if q == root:
            continue
        b.add(q, b.tb(q, send=root), "s", ("i", 0), ("o", q * c), cnt=c)
        staged[q] = b.add(root, b.tb(root, recv=q), "r", ("s", q * c), ("s", q * c), cnt=c)
    local = b.tb(root, tag="local")
    b.add(root, local, "cpy", ("i", 0), ("o", root * c), cnt=c)
    for q, dep in staged.items():
        b.add(root, local, "cpy", ("s", q * c), ("o", q * c), cnt=c, dep=dep)
    return b.build(f"direct_gather_{n}", "gather", c, c, n * c, s_chunks=n * c, root=root)


def direct_scatter(n: int, c: int = 1, root: int = 0) -> Program:
    """Direct scatter: the root sends piece q to rank q and copies its own."""
    b = _Builder(n)
    for q in range(n):
        if q == root:
            b.add(root, b.tb(root, tag="local"), "cpy", ("i", root * c), ("o", 0), cnt=c)
            continue
        b.add(root, b.tb(root, send=q), "s", ("i", q * c), ("o", 0), cnt=c)
        b.add(q, b.tb(q, recv=root), "r", ("o", 0), ("o", 0), cnt=c)
    return b.build(f"direct_scatter_{n}", "scatter", c, n * c, c, root=root)


SAMPLES = {
    "allgather": ring_allgather,
    "reducescatter": ring_reducescatter,
    "allreduce": ring_allreduce,
    "alltoall": direct_alltoall,
    "broadcast": chain_broadcast,
    "reduce": chain_reduce,
    "gather": direct_gather,
    "scatter": direct_scatter,
}


def nvls_allreduce(n: int, chunks: int = 2) -> Program:
    """In-network allreduce through one switch (NVLS: reduce in the switch, then multicast), ``chunks``
    chunks per rank (>= 2). Every rank sends each input chunk to the switch (peer ``n``) and receives each
    result chunk from it. Chunks ``0..chunks-2``: one ``reduce`` op each, result to every rank. The last
    chunk: a ``reduce`` op whose result goes to rank 0 only; rank 0 sends it back to the switch, whose
    ``multicast`` op sends it to every other rank. So both op types, several ops per connection (FIFO) and
    a rank that feeds the switch twice appear in it."""
    if chunks < 2 or n < 2:
        raise ValueError("nvls_allreduce needs n >= 2 and chunks >= 2")
    ranks = tuple(range(n))
    ops = [SwitchOp("reduce", ranks, ranks) for _ in range(chunks - 1)]
    ops += [SwitchOp("reduce", ranks, (0,)), SwitchOp("multicast", (0,), ranks[1:])]
    gpus = []
    for g in ranks:
        steps = [Step("s", "i", k, "i", k) for k in range(chunks)]
        steps += [Step("r", "o", k, "o", k) for k in range(chunks)]
        if g == 0:
            steps.append(Step("s", "o", chunks - 1, "o", chunks - 1))
        gpus.append(Gpu(g, chunks, chunks, 0, (Threadblock(0, send=n, recv=n, steps=tuple(steps)),)))
    return Program(f"nvls_allreduce_{n}", "allreduce", n, tuple(gpus), chunk_factor=chunks,
                   switches=(SwitchProgram("nvswitch", tuple(ops)),))


def sample_program(collective: str, n: int) -> Program:
    """The hand-written program for ``collective`` on ``n`` ranks."""
    return SAMPLES[collective](n)
