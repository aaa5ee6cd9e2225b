"""Tuning constants of method trees.
"""

from __future__ import annotations

from synth.synthesis.timing import ALPHA_SHARE, Coalescing

# collectives whose chunks of one root are contiguous in the buffers (so coalesced messages are one step)
COALESCING = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})
SUPPORTED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce", "gather", "scatter"})
DEFAULT_MAX_TREES = 256     # trees per root; the packing cost grows with distinct trees, not with k
MAX_CHUNKS = 512            # chunks per root piece considered by the cost model
ONE_ROOT = frozenset({"broadcast", "reduce"})   # one root piece, the whole buffer: deeper pipelines pay
ONE_ROOT_CHUNKS = 2048      # ... chunks it may be cut into (ring-8 broadcast of 1 GiB: 512 -> 0.966 of the bound)
DEEP_GRID = (192, 256, 384, 512)   # ... messages per tree tried beyond PIPELINE_GRID there
MAX_TRANSFERS = 3_000_000   # keep schedules within memory/time budgets
TREE_SEARCH_RANKS = 64      # up to this many ranks, fewer trees per root are tried too
TREE_SEARCH_CAPS = (16, 8, 4)
CAP_STOP = 0.005            # ... past a cap this much slower than the best (mi250-2node: 8 trees +0.7 %) only
CAP_ROOM = 0.05             # ... where the next cap's rate leaves this much room below the best time
LARGE_RANKS = 256           # beyond this, one fast tree per root (synth.synthesis.scale)
REFINE_JOBS = 80_000        # time other pipeline depths only below this many transfers (mi250-2node AR: 69.5k)
REPLAY = True
PATH_CHUNKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)   # chunks per rank piece tried for scatter/gather on flow paths
ROUNDS_RUNNERS_UP = 3       # ... chunk counts whose rounds of circuits (best plans first) the pipeline simulates
JUSTIFY_TRANSFERS = 1_500_000   # ... tried on schedules of at most this many transfers
DRAINS = (None, 0.7)        # the kept shape is also coalesced with each link's stream ending in shrinking messages
BATCHES = (False, True)     # ... and with the transfers ready at one instant queued together
HEIGHT_WEIGHTS = (1.0, 4.0)  # priorities tried: hops ahead weighed 1x (default) and 4x (mi250, dgx-a100-2node)
ALT_PRIORITY_JOBS = 10_000  # ... the 4x one only up to this many transfers at the first depth
FORWARD_JOBS = 20_000        # forward-timed reductions only below this many transfers
LEVEL_JOBS = 200_000        # beyond this many transfers, vectorised level timing
ALPHA_SHARES = (ALPHA_SHARE, 0.005, 0.02, 0.0035, 0.0025)  # ... the shape chosen is also built with these
TAIL_SPLITS = (3, 2, 4)     # the last message of each tree halved this many times: P is searched at the first
MAX_TAIL_CHUNKS = 1024      # chunks per root piece a tailed message shape may use
HALVING = -1                # ``tail`` value of the halving shape: every message half of what is left
HALVING_CHUNKS = (64, 32)   # ... timed with this many chunks per tree and root where tails are searched
TAIL_GAIN = 0.01            # ... searched only where fill, drain and α cost more than this share
SPLIT_GAIN = 0.05           # allreduce on split capacities where that LP beats RS then AG by this share
SPLIT_TREES = (1, 2, 4, 8)  # ... with this many trees per root, fewer first (MSCCL step limits favour few)
SPLIT_CHUNKS = (32, 64, 96, 128)  # ... and this many chunks per tree and root, or per root where trees are
                                  # many (one chunk per message; 4 trees of 32 outgrow MSCCL's steps on 10 ranks)
WHOLE_SPLIT_SECONDS = 60.0  # ... rounded to whole trees within this long (8x8 torus: 25 s), else on the LP's
STEP_MARGIN = 1.3           # ... kept where messages x this (nop steps: 1.2-1.25 on mesh-5x5) fit MSCCL's limits
ROUNDS = 30                 # rounds of a round-timed schedule (synth.synthesis.rounds); mi250 AG 20: 0.973, 30: 0.983
ROUND_VARIABLES = 40_000    # ... tried only up to this many (tree edge, round) shares
ROUND_CHUNKS = (256, 512)   # ... chunks per root tried (nearest runtime-usable counts)
ROUND_ALPHA_SHARE = 0.05    # ... only where α on a two-hop route in every round stays below this share of the time
ROUND_TIMED = frozenset({"allgather", "reducescatter", "allreduce", "broadcast", "reduce"})


# the shapes a search keeps are built with every share of α; the shape finally kept with drains and batches too
BUILT = tuple(Coalescing(share) for share in ALPHA_SHARES)
POLISH = tuple(Coalescing(share, drain, batch) for share in ALPHA_SHARES for drain in DRAINS for batch in BATCHES
               if (drain, batch) != (None, False))


RING_FOREST_CHUNKS = 256   # chunks per root of a ring forest (the nearest count the runtime runs is used)


PIPELINE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
