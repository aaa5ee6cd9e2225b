"""synth's own size limits (the MSCCL runtimes' limits are in :mod:`synth.runtime_limits`), docs/cli.md.

Beyond them a request is refused at once with one clear error rather than running out of memory or time.
"""

from __future__ import annotations

from collections.abc import Callable

from synth.errors import SynthError

# Chunk transfers per schedule: an allgather on 4096 ranks with one chunk each. Every transfer is a Python
# record through lowering, verification and simulation (~3 GB at this count).
MAX_TRANSFERS = 1 << 24
# Ranks for bounds and synthesis: the rank-orbit search and the rank-pair routes hold N x N arrays
# (8192 ranks: 0.5 GB each).
MAX_SOLVED_RANKS = 8192
# Switches on one rank-to-rank route, for synthesis: methods enumerate each route's sub-paths, cubic in its
# length (a route through a chain of 1000 switches took 30 s and 5.5 GB); fat trees and dragonflies use <= 7.
MAX_ROUTE_SWITCHES = 64
# Ranks of a fabric with switches, for synthesis: methods hold the runtime's route for every rank pair
# (routes.rank_routes, N^2 paths: 2048 ranks take 8 s and ~1 GB; a 5000-rank star ran out of time and memory).
MAX_ROUTED_RANKS = 2048
# ... except on boxes joined by NIC rails (synth.synthesis.railblocks), whose method routes only the pairs it uses:
# 512 DGX A100 boxes
MAX_RAIL_BOX_RANKS = 4096


def check_transfer_count(count: int, what: str) -> None:
    """Refuse more than :data:`MAX_TRANSFERS` chunk transfers; ``what`` starts the message."""
    if count > MAX_TRANSFERS:
        raise SynthError(f"{what} {count:,} chunk transfers, more than synth's limit of {MAX_TRANSFERS:,} "
                         "per schedule (docs/cli.md)")


def check_rank_count(num_ranks: int, name: str, task: str) -> None:
    """Refuse bounds or synthesis on more than :data:`MAX_SOLVED_RANKS` ranks."""
    if num_ranks > MAX_SOLVED_RANKS:
        raise SynthError(f"topology {name!r} has {num_ranks:,} ranks; synth computes {task} for at most "
                         f"{MAX_SOLVED_RANKS:,} (docs/cli.md)")


def check_route_switches(longest: int, name: str, num_ranks: int,
                         rail_boxes: Callable[[], bool] = lambda: False) -> None:
    """Refuse synthesis where a rank-to-rank route passes more than :data:`MAX_ROUTE_SWITCHES` switches, or
    switches join more than :data:`MAX_ROUTED_RANKS` ranks (``longest`` > 0), :data:`MAX_RAIL_BOX_RANKS` where
    ``rail_boxes()`` (asked only past the first) says the fabric is boxes joined by NIC rails."""
    if longest and num_ranks > MAX_ROUTED_RANKS and not (num_ranks <= MAX_RAIL_BOX_RANKS and rail_boxes()):
        raise SynthError(f"topology {name!r} has {num_ranks:,} ranks behind switches; synth synthesizes on fabrics "
                         f"with switches of at most {MAX_ROUTED_RANKS:,} ranks, {MAX_RAIL_BOX_RANKS:,} on boxes "
                         "joined by NIC rails (docs/cli.md)")
    if longest > MAX_ROUTE_SWITCHES:
        raise SynthError(f"topology {name!r} routes a send through {longest:,} switches; synth synthesizes for at "
                         f"most {MAX_ROUTE_SWITCHES} switches per route (docs/cli.md)")
