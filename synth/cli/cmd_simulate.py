"""``synth simulate PROG [-t T] [-s SIZE] [-c C] [--root R] [--gantt FILE.png] [--json]``:
time a program (docs/cost-model.md)."""

from __future__ import annotations

import click

from synth.cli.common import (
    OUTPUT_FILE,
    collective_option,
    emit_json,
    fabric_arg,
    guarded,
    json_option,
    load_program_arg,
    name_collective,
    root_option,
)

TOP_LINKS = 8


@click.command("simulate")
@click.argument("prog", type=click.Path(dir_okay=False))
@click.option("-t", "--topology", "topology_name", default=None,
              help="Topology name or file (default: the program's own `topology`; required for foreign XML).")
@click.option("-s", "--size", default=None,
              help="SIZE (nccl-tests buffer convention; default: the program's size, else 1GiB).")
@click.option("--gantt", "gantt", type=OUTPUT_FILE, default=None,
              help="Also draw a link-occupancy timeline to this image file.")
@collective_option
@root_option
@json_option
@guarded
def command(prog: str, topology_name: str | None, size: str | None, gantt: str | None, collective: str | None,
            root: int | None, as_json: bool) -> None:
    """Event simulation of a program (ours or foreign MSCCL XML): link contention, routing through
    switches, α-β costs. Prints time, algbw, busbw, transfers and link utilization."""
    from synth.simulation import simulate
    from synth.units import parse_size

    program = name_collective(load_program_arg(prog), collective, root, prog)
    topology = fabric_arg(program, topology_name, prog)
    size_bytes = parse_size(size) if size is not None else None
    result = simulate(program, topology, size_bytes, record_events=gantt is not None)
    output = None
    if gantt:
        from synth.plots import plot_gantt

        output = str(plot_gantt(result, topology, gantt))
    if as_json:
        payload = {"program": prog, "topology": topology.name, **result.to_dict()}
        if output:
            payload["gantt"] = output
        emit_json(payload)
        return
    from synth.units import format_size

    con = _console()
    con.print(f"[bold]{program.name}[/bold] on [bold]{topology.name}[/bold], "
              f"SIZE {format_size(result.size_bytes)} (chunk {result.chunk_bytes:.6g} B)")
    con.print(f"time_us     {result.time_us:.3f}")
    con.print(f"algbw_GBps  {result.algbw_GBps:.3f}")
    con.print(f"busbw_GBps  {result.busbw_GBps:.3f}")
    con.print(f"transfers   {result.transfers}")
    used = sorted(((u, k) for k, u in result.link_utilization.items() if u > 0), reverse=True)
    con.print(f"link_utilization  {len(used)} of {len(result.link_utilization)} links used; busiest:")
    for util, link in used[:TOP_LINKS]:
        con.print(f"  {link:<24} {util:6.1%}")
    if output:
        con.print(f"gantt       {output}", soft_wrap=True)


def _console():
    from synth.cli.common import console

    return console()
