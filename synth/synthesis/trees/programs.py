"""Schedules of method trees: timed transfers as a :class:`synth.schedule.Schedule` with its notes, and
the justified (compacted) schedule.
"""

from __future__ import annotations

from dataclasses import replace

from synth.collectives import Collective
from synth.schedule import Schedule, Transfer, TransferTable
from synth.synthesis.timing import justify
from synth.synthesis.trees import tuning
from synth.synthesis.trees.forest import Forest
from synth.synthesis.trees.messages import owner_units, root_piece_bytes
from synth.topology.model import Topology


def first_with_runner_ups(schedules: list[Schedule]) -> Schedule:
    """``schedules[0]`` with every other schedule, and their own alternatives, as its alternatives
    (:attr:`Schedule.alternatives`, which the pipeline times)."""
    flat = [s for schedule in schedules for s in (schedule, *schedule.alternatives)]
    return replace(flat[0], alternatives=tuple(replace(s, alternatives=()) for s in flat[1:]))


def forest_schedule(topology: Topology, coll: Collective, transfers: list[Transfer] | TransferTable, makespan: float,
                    plans: list[Forest], size_bytes: float, method: str, **notes) -> Schedule:
    """The Schedule of timed forests, with the forests' figures and ``notes`` in its notes."""
    per_root_bytes = root_piece_bytes(coll.name, topology.num_ranks, size_bytes, owner_units(plans))
    if isinstance(transfers, TransferTable):
        transfers = transfers.sorted_by_time()
    else:
        transfers.sort(key=lambda t: (t.start, t.end))   # in place: the caller's timing is kept sorted too
        transfers = tuple(transfers)
    notes = {
        "trees_per_root": [f.k for f in plans],
        "distinct_trees": [len(f.trees) for f in plans],
        "rate_ratio": [float(f.optimal / f.ratio) for f in plans],
        "tree_bandwidth_time_us": sum(f.bandwidth_time_us(per_root_bytes) for f in plans),
        **notes,
    }
    if any(f.reused is not None for f in plans):   # a warm start on an edited fabric (plan_forest's healthy)
        notes["reused_trees"] = {"reused": sum(f.reused[0] for f in plans if f.reused is not None),
                                 "healthy": sum(f.reused[1] for f in plans if f.reused is not None),
                                 "trees": sum(len(f.trees) for f in plans)}
    return Schedule(coll, topology.name, transfers, method=method, size_bytes=float(size_bytes),
                    predicted_time_us=makespan, notes=notes)


def justified_schedule(topology: Topology, schedule: Schedule) -> Schedule:
    """``schedule`` compacted by :func:`justify` where that is shorter (up to ``TUNING.large_ranks`` ranks
    and ``TUNING.justify_transfers`` transfers); its notes say whether it was (``justified``)."""
    found = None
    if (topology.num_ranks <= tuning.TUNING.large_ranks
            and 0 < len(schedule.transfers) <= tuning.TUNING.justify_transfers):
        found = justify(list(schedule.transfers), topology, schedule.collective.chunk_bytes(schedule.size_bytes),
                        schedule.predicted_time_us)
    if found is None:
        return replace(schedule, notes={**schedule.notes, "justified": False})
    makespan, transfers = found
    transfers.sort(key=lambda t: (t.start, t.end))
    return replace(schedule, transfers=tuple(transfers), predicted_time_us=makespan,
                   notes={**schedule.notes, "justified": True})
