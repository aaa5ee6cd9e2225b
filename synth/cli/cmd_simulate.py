"""``synth simulate PROG [-t T] [-s SIZE] [-c C] [--root R] [--gantt FILE.png] [--links N] [--json]``:
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
@click.option("--links", "links", type=click.IntRange(min=1), default=None,
              help="Also account for the N links that end last: busy time, messages, their α, and idle time "
                   "before, between and after their transfers.")
@collective_option
@root_option
@json_option
@guarded
def command(prog: str, topology_name: str | None, size: str | None, gantt: str | None, links: int | None,
            collective: str | None, root: int | None, as_json: bool) -> None:
    """Event simulation of a program (ours or foreign MSCCL XML): link contention, routing through
    switches, α-β costs. Prints time, algbw, busbw, transfers and link utilization."""
    from synth.simulation import link_accounts, simulate
    from synth.units import parse_size

    program = name_collective(load_program_arg(prog), collective, root, prog)
    topology = fabric_arg(program, topology_name, prog)
    size_bytes = parse_size(size) if size is not None else None
    result = simulate(program, topology, size_bytes, record_events=gantt is not None or links is not None)
    accounts = link_accounts(result, topology)[:links] if links is not None else None
    output = None
    if gantt:
        from synth.plots import plot_gantt

        output = str(plot_gantt(result, topology, gantt))
    if as_json:
        payload = {"program": prog, "topology": topology.name, **result.to_dict()}
        if output:
            payload["gantt"] = output
        if accounts is not None:
            payload["links"] = [account.to_dict() for account in accounts]
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
    if accounts is not None:
        from rich.table import Table

        table = Table(title=f"the {len(accounts)} links that end last (µs)")
        for column in ("link", "messages", "busy", "α", "head", "gaps", "tail"):
            table.add_column(column, justify="left" if column == "link" else "right")
        for a in accounts:
            table.add_row(a.link, str(a.messages), *(f"{v:.1f}" for v in (a.busy, a.alpha, a.head, a.gaps, a.tail)))
        con.print(table)
    if output:
        con.print(f"gantt       {output}", soft_wrap=True)


def _console():
    from synth.cli.common import console

    return console()
