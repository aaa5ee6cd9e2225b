"""``synth pareto -t T -c C [--max-steps S] [--max-chunks C] [--time-limit SEC] [--json]``:
SCCL's (chunks, steps, rounds) Pareto frontier (see :mod:`synth.synthesis.pareto`)."""

from __future__ import annotations

import click

from synth.cli.common import (
    MAX_CHUNKS,
    MAX_THREADS,
    ROOT,
    SECONDS,
    count,
    emit_json,
    guarded,
    json_option,
    load_topology_arg,
)
from synth.errors import SynthError


@click.command("pareto")
@click.option("-t", "--topology", "topology_name", required=True, help="Topology name (built-in) or file.")
@click.option("-c", "--collective", required=True, help="allgather, reducescatter, allreduce, alltoall, broadcast, "
              "reduce, gather or scatter.")
@click.option("--max-steps", type=count(1, MAX_CHUNKS), default=None,
              help="Largest step count S tried (default: max(8, least steps + 4) per phase).")
@click.option("--max-chunks", type=count(1, MAX_CHUNKS), default=8, show_default=True,
              help="Largest chunk count C tried.")
@click.option("--time-limit", type=SECONDS, default=120.0, show_default=True,
              help="Budget in seconds for the whole search.")
@click.option("-s", "--size", default="1GiB", show_default=True,
              help="SIZE at which each point's α-β time is reported.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@click.option("--assume-monotonic", is_flag=True,
              help="SCCL's monotonic-feasibility assumption: skip S at ratios below one it failed at.")
@click.option("--exhaustive", is_flag=True,
              help="After SCCL's search, try every ratio R/C below the best found for each S (exact frontier "
                   "for C <= --max-chunks).")
@click.option("--threads", type=count(1, MAX_THREADS), default=None, help="CP-SAT workers (default 2).")
@json_option
@guarded
def command(topology_name: str, collective: str, max_steps: int | None, max_chunks: int, time_limit: float, size: str,
            root: int, assume_monotonic: bool, exhaustive: bool, threads: int | None, as_json: bool) -> None:
    """The latency (steps) / bandwidth (rounds per chunk) Pareto frontier of k-synchronous algorithms."""
    from synth.collectives import Collective, canonical_name
    from synth.pipeline import check_root
    from synth.units import format_size, parse_size

    name = canonical_name(collective)
    size_bytes = parse_size(size)
    topology = load_topology_arg(topology_name)
    if topology.num_ranks < 2:
        raise SynthError(f"topology {topology.name!r} has {topology.num_ranks} rank; a collective needs at least 2")
    check_root(topology, root)
    from synth.synthesis.pareto import explore, predicted_time_us

    coll = Collective(name, topology.num_ranks, 1, root=root)
    exp = explore(topology, coll, max_steps=max_steps, max_chunks=max_chunks, time_limit=time_limit,
                  size_bytes=size_bytes, assume_monotonic=assume_monotonic, threads=threads,
                  exhaustive=exhaustive)
    rows = [{"chunks": p.chunks, "steps": p.steps, "rounds": p.rounds, "synthesis_s": round(p.synthesis_s, 3),
             "bandwidth_cost": str(p.bandwidth_cost), "bandwidth_cost_value": float(p.bandwidth_cost),
             "time_us": predicted_time_us(p, size_bytes)} for p in exp.points]
    if as_json:
        emit_json({"topology": topology.name, "collective": name, "ranks": topology.num_ranks,
                   "size_bytes": size_bytes, "frontier": rows, "steps_lower_bound": exp.steps_lb,
                   "rounds_per_chunk_lower_bound": str(exp.rounds_per_chunk_lb),
                   "bandwidth_unit_GBps": exp.unit_GBps, "bandwidth_optimal": exp.bandwidth_optimal,
                   "stopped": exp.stopped, "undecided": exp.undecided, "total_s": round(exp.total_s, 3),
                   "tried": exp.tried})
        return
    from rich.table import Table

    from synth.cli.common import console

    con = console()
    con.print(f"[bold]{name}[/bold] on [bold]{topology.name}[/bold] ({topology.num_ranks} ranks): at least "
              f"{exp.steps_lb} steps and {exp.rounds_per_chunk_lb} rounds per chunk "
              f"(1 round = one chunk per {exp.unit_GBps:g} GB/s of link)")
    table = Table(title=f"Pareto frontier (α-β time at {format_size(size_bytes)})")
    for col in ("chunks C", "steps S", "rounds R", "R/C", "time_us", "synthesis_s"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(str(row["chunks"]), str(row["steps"]), str(row["rounds"]), row["bandwidth_cost"],
                      f"{row['time_us']:.3f}", f"{row['synthesis_s']:.2f}")
    con.print(table)
    sat = sum(1 for t in exp.tried if t["status"] == "sat")
    con.print(f"{len(exp.tried)} instances tried ({sat} feasible) in {exp.total_s:.2f} s; stopped: {exp.stopped}")
    if not rows:
        con.print("no algorithm found within the limits")
