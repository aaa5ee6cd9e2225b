"""Tuning constants of method trees, in one frozen :class:`TreesTuning`; the code reads them from
:data:`TUNING` at call time (``tuning.TUNING.name``), so a test may swap in ``replace(TUNING, ...)``.

The collective sets and the ``HALVING`` sentinel below are facts of the method, not tuning. The
timing engine's own defaults (``ALPHA_SHARE``, ``MAX_COALESCE``, ``JUSTIFY_PASSES``) live in
:mod:`synth.synthesis.timing`, which does not depend on this package.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from synth.synthesis.timing import ALPHA_SHARE, Coalescing

# collectives whose chunks of one root are contiguous in the buffers (so coalesced messages are one step)
COALESCING = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})
SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter"})
ONE_ROOT = frozenset({"broadcast", "reduce"})   # one root piece, the whole buffer: deeper pipelines pay
HALVING = -1                # ``tail`` value of the halving shape: every message half of what is left
ROUND_TIMED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})


@dataclass(frozen=True)
class TreesTuning:
    """The tuning constants of method trees (values measured as the comments say)."""

    default_max_trees: int = 256     # trees per root; the packing cost grows with distinct trees, not with k
    max_chunks: int = 512            # chunks per root piece considered by the cost model
    one_root_chunks: int = 2048      # ONE_ROOT: chunks it may be cut into (ring-8 broadcast of 1 GiB: 512 -> 0.966)
    deep_grid: tuple[int, ...] = (192, 256, 384, 512)   # ... messages per tree tried beyond pipeline_grid there
    max_transfers: int = 1 << 23     # keep schedules within memory/time budgets (a Python record per transfer)
    # translated trees (tori past large_ranks) are built as columns (schedule.TransferTable): up to synth's own
    # limit (limits.MAX_TRANSFERS, 16.8 M: a 64x64 torus allgather, lowered at a 14.6 GB peak)
    max_table_transfers: int = 1 << 24
    tree_search_ranks: int = 64      # up to this many ranks, fewer trees per root are tried too
    tree_search_caps: tuple[int, ...] = (16, 8, 4, 2, 1)   # down to one tree per root: behind NVSwitch every
    # tree into a rank is a message on its port (three DGX H100 boxes, 1 GiB allgather: 8 trees 0.931, 1 tree 0.959)
    switchless_least_cap: int = 4    # ... but not below this on fabrics without switches, where the kept forests are
    # also timed by rounds and few trees make that LP large (torus-3x3x3 reducescatter at 1 tree per root: 39.8k
    # columns, 63 s of interior point, then minutes of simplex clean-up)
    cap_stop: float = 0.005          # ... past a cap this much slower than the best (mi250-2node: 8 trees +0.7 %) only
    cap_room: float = 0.05           # ... where the next cap's rate leaves this much room below the best time
    weighted_caps: tuple[int, ...] = (1, 2, 4)   # trees per unit of ownership tried before the default, until one
    # is clearly slower (weighted allreduce forests carry k trees per unit, and units outnumber ranks:
    # mixed-mi250-h100 1 GiB, 7 per unit 7268 µs predicted, 1 per unit 6473)
    large_ranks: int = 256           # beyond this, one fast tree per root (synth.synthesis.scale)
    refine_jobs: int = 80_000        # time other pipeline depths only below this many transfers (mi250-2node AR: 69.5k)
    wide_refine_jobs: int = 200_000  # ... past tree_search_ranks (no trees-per-root search), an allgather's or
    # reducescatter's search times shapes up to this many (mi250x8-ib12.5 reducescatter 0.904 -> 0.952, 40 -> 60 s;
    # at 400k mi250x8-ib16 allgather took 134 s). Not below: at 48-64 ranks a wider search keeps shapes that plan
    # faster and simulate slower (mi250x4-ib12.5 allgather 0.967 -> 0.940); nor for allreduce (mi250x8-ib50
    # 0.802 -> 0.754)
    finer_jobs: int = 160_000        # ... beyond them, a one-chunk-per-message shape is also built at twice its chunks
    # up to this many transfers, and polish keeps it where faster (mi250x4-ib16 allgather: 16 -> 32 chunks per root)
    replay: bool = True              # score searches on switch fabrics with the runtime's rule replayed too
    path_chunks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # chunks per rank piece tried for
    # scatter/gather on flow paths
    rounds_runners_up: int = 3       # ... chunk counts whose rounds of circuits (best plans first) the pipeline
    # simulates
    justify_transfers: int = 1_500_000   # justify() tried on schedules of at most this many transfers
    polish_runners: int = 2          # ... and so are the search's next best shapes (search scores rank shapes
    # before drains: dgx-a100-2node without one NIC, allgather: 128 chunks, 4 messages, tail 3 polishes to 3453.8 µs,
    # the best-scored 32 chunks, 3 messages, tail 2 to 3505.2); only schedules of at most forward_jobs transfers
    runner_ups: int = 1              # polish's other shapes the pipeline simulates as alternatives, where their plan
    runner_up_margin: float = 0.02   # ... is within this share of the kept one (close plans can simulate far apart)
    coarser_chunks: tuple[int, ...] = (2, 4)   # ... and so is the kept shape cut from this many times coarser
    # chunks (a message holds at most MAX_COALESCE chunks: dgx-a100-2node without one NIC, allgather 128 -> 32
    # chunks per root, 0.9796 -> 0.9828 of the bound)
    drains: tuple[float | None, ...] = (None, 0.7)   # the kept shape is also coalesced with each link's stream
    # ending in shrinking messages
    batches: tuple[bool, ...] = (False, True)   # ... and with the transfers ready at one instant queued together
    composed_scoring: tuple[Coalescing, ...] = (Coalescing(batch=True),)   # the composed box forests' search
    rescore_gain: float = 0.05       # ... runs again scored by these where polish times its shape this much faster
    # than the search did (mi250x8-ib16 allgather: 12 %, 0.826 -> 0.875; docs/results.md, session 51)
    network_gain: float = 0.02      # the composition whose box forest uses the network too is pipelined where its
    # rate is this much better than the box's own links give (composed.box_with_network)
    heavy_keep: tuple[int, int] = (1, 3)   # an allgather's forests are also searched with each tree's messages on heavy
    # routes merged in pairs but for the first and last of these (jobs.merge_heavy_messages; mixed MI250 + H100
    # allgather: 17 IB messages of 4 µs into a GCD, 0.9747 -> 0.9814)
    heavy_ratio: float = 2.0        # ... heavy routes: the costliest α class, this many times the next below it
    height_weights: tuple[float, ...] = (1.0, 4.0)  # priorities tried: hops ahead weighed 1x (default) and 4x
    # (mi250, dgx-a100-2node)
    alt_priority_jobs: int = 10_000  # ... the 4x one only up to this many transfers at the first depth
    forward_jobs: int = 20_000       # forward-timed reductions only below this many transfers
    level_jobs: int = 200_000        # beyond this many transfers, vectorised level timing
    alpha_shares: tuple[float, ...] = (ALPHA_SHARE, 0.005, 0.02, 0.0035, 0.0025)  # ... the shape chosen is also
    # built with these
    tail_splits: tuple[int, ...] = (3, 2, 4)   # the last message of each tree halved this many times: P is searched
    # at the first
    max_tail_chunks: int = 1024      # chunks per root piece a tailed message shape may use
    halving_chunks: tuple[int, ...] = (64, 32)   # HALVING shapes timed with this many chunks per tree and root
    # where tails are searched
    tail_gain: float = 0.01          # ... searched only where fill, drain and α cost more than this share
    split_gain: float = 0.05         # allreduce on split capacities where that LP beats RS then AG by this share
    split_trees: tuple[int, ...] = (1, 2, 4, 8)   # ... with this many trees per root, fewer first (MSCCL step
    # limits favour few)
    split_chunks: tuple[int, ...] = (32, 64, 96, 128)  # ... and this many chunks per tree and root, or per root
    # where trees are many (one chunk per message; 4 trees of 32 outgrow MSCCL's steps on 10 ranks)
    whole_split_work: float = 30.0   # ... rounded to whole trees within this much solver work (synth.solvers:
    # branch-and-bound nodes, deterministic), else on the LP's
    step_margin: float = 1.3         # ... kept where messages x this (nop steps: 1.2-1.25 on mesh-5x5) fit MSCCL's
    # limits
    rounds: int = 30                 # rounds of a round-timed schedule (synth.synthesis.rounds); mi250 AG 20: 0.973,
    # 30: 0.983
    round_variables: int = 20_000    # ... tried only up to this many (tree edge, round) shares, over every distinct
    # LP the phases pose: its four interior-point solves took 35 s of CPU at 17.1k (mi250 allgather, 0.983 against
    # 0.965 pipelined), 69 s for the first alone at 32.1k (an 18-rank 3x3x2 torus, no gain) and 205 s at 24 ranks of
    # a 4x6 torus of 100 / 25 GB/s (0.983 by rounds, 0.974 pipelined); an allreduce whose phases' forests differ
    # poses two (a 16-rank hypercube of two link classes: 2 x 14.4k, 78 s for 0.25 %; mi250's allreduce 116 -> 57 s
    # and rr4-16-s2's 57 -> 17 s, the same programs)
    round_chunks: tuple[int, ...] = (256, 512)   # ... chunks per root tried (nearest runtime-usable counts)
    round_alpha_share: float = 0.05  # ... only where α on a two-hop route in every round stays below this share
    # of the time
    ring_forest_chunks: int = 256    # chunks per root of a ring forest (the nearest count the runtime runs is used)
    pipeline_grid: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

    # the shapes a search keeps are built with every share of α; the shape finally kept with drains and batches too
    @property
    def built(self) -> tuple[Coalescing, ...]:
        """Coalescings the searched shapes are built with: every share of α."""
        return self.built_as((Coalescing(),))

    def built_as(self, scoring: tuple[Coalescing, ...]) -> tuple[Coalescing, ...]:
        """Coalescings a shape a search found by ``scoring`` is built with: each of them at every share of α."""
        return tuple(replace(how, alpha_share=share) for share in self.alpha_shares for how in scoring)

    @property
    def runner_coalescings(self) -> tuple[Coalescing, ...]:
        """Coalescings polish times the runners of large schedules with: the default share of α, batched (on
        mi250x4-ib25's composed allgather the polish's best timing of such runners was batched and undrained; one
        list schedule each keeps the extra CPU to a fifth)."""
        return (Coalescing(ALPHA_SHARE, None, True),)

    @property
    def polish(self) -> tuple[Coalescing, ...]:
        """Coalescings the shape finally kept is also timed with: every share with drains and batches."""
        return tuple(Coalescing(share, drain, batch) for share in self.alpha_shares for drain in self.drains
                     for batch in self.batches if (drain, batch) != (None, False))


TUNING = TreesTuning()   # the default instance the code reads
