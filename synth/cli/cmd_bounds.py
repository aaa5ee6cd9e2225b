"""``synth bounds -t T -c C [-s SIZE] [--root R] [--json]``: exact lower bounds (docs/cli.md)."""

from __future__ import annotations

import click

from synth.cli.common import ROOT, console, emit_json, guarded, json_option, load_topology_arg
from synth.cli.fabric_edits import apply_fabric_edits, baseline_line, baseline_report, edits_line, fabric_edit_options
from synth.collectives import COLLECTIVES
from synth.units import DEFAULT_SIZE, format_size, parse_size


@click.command(name="bounds")
@click.option("-t", "--topology", "topology_name", required=True, help="Topology file or built-in name.")
@click.option("-c", "--collective", required=True, type=click.Choice(COLLECTIVES, case_sensitive=False))
@click.option("-s", "--size", default=str(DEFAULT_SIZE), show_default="1GiB",
              help="SIZE (nccl-tests buffer convention): bytes or K/M/G, KiB/MiB/GiB.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@fabric_edit_options
@json_option
@guarded
def command(topology_name: str, collective: str, size: str, root: int, exclude_link: tuple, degrade: tuple,
            exclude_rank: tuple, baseline: str | None, as_json: bool) -> None:
    """Lower bounds on the completion time: bandwidth (cut / flow), latency, and their max."""
    from synth.cli.fabric_edits import edited_root
    from synth.collectives import Collective
    from synth.lower_bounds import compute_bounds

    size_bytes = parse_size(size)
    topology, degraded = apply_fabric_edits(load_topology_arg(topology_name), exclude_link, degrade, exclude_rank)
    coll = Collective(collective, topology.num_ranks, root=edited_root(degraded, collective, root))
    bounds = compute_bounds(topology, coll, size_bytes)
    edits = {} if degraded is None else {"degraded": degraded.as_dict()}
    if baseline is not None:
        edits["baseline"] = baseline_report(baseline, topology, coll.name, size_bytes, float(bounds.time_bound_us))
    if as_json:
        emit_json({**bounds.as_dict(), **edits})
        return
    from rich.table import Table

    d = bounds.details
    title = f"{bounds.collective} on {bounds.topology} ({bounds.num_ranks} ranks), SIZE {format_size(size_bytes)}"
    if bounds.root is not None:
        title += f", root {bounds.root}"
    table = Table(title=title)
    table.add_column("bound")
    table.add_column("µs", justify="right")
    table.add_column("from")
    table.add_row("bandwidth", f"{bounds.bandwidth_bound_us:.3f}", str(d.get("bandwidth_method", "")))
    if "cut" in d:
        cut = f"S = {d['cut']}: {d['cut_ranks']} ranks, B+(S) = {d['cut_bw_GBps']:g} GB/s"
        if "forestcoll_cut_us" in d:   # a circuit bound binds: the fluid cut is a detail
            table.add_row("  ForestColl cut", f"{d['forestcoll_cut_us']:.3f}", cut)
        else:
            table.add_row("  binding cut", "", cut)
    if "reception_group" in d:
        table.add_row("  receiving group", "", d["reception_group"])
    if "per_rank_bound_us" in d:
        table.add_row("  per-rank (detail)", f"{d['per_rank_bound_us']:.3f}",
                      f"(N-1)/N·SIZE/B_in(rank {d['per_rank_rank']}); not the bound")
    for key, value in d.get("components_us", {}).items():
        mark = "binding" if key == d.get("binding_component") else ""
        table.add_row(f"  {key.removesuffix('_us')}", f"{value:.3f}", mark)
    table.add_row("latency", f"{bounds.latency_bound_us:.3f}", str(d.get("latency_method", "")))
    table.add_row("time = max", f"{bounds.time_bound_us:.3f}", f"{bounds.binding}-bound")
    if bounds.host_only_bound_us is not None:
        switches = ", ".join(d["in_network"]["switches"])
        table.add_row("  in-network", f"{bounds.time_bound_us:.3f}", f"the time bound: switches {switches} may "
                      "reduce/multicast")
        table.add_row("  host-only", f"{bounds.host_only_bound_us:.3f}", "the same fabric, switches only forward")
    table.add_row("algbw", f"{bounds.algbw_bound_GBps:.3f} GB/s", "SIZE / time bound")
    con = console()
    con.print(table)
    if degraded is not None:
        con.print(edits_line(degraded), soft_wrap=True, markup=False)
    if baseline is not None:
        con.print(baseline_line(edits["baseline"]), soft_wrap=True, markup=False)
