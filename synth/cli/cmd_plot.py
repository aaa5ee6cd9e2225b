"""``synth plot [PROG|RESULTS] --kind gantt|links|topology|gaps -o FILE.png [-t T] [-s SIZE] [-c C] [--root R]
[--json]``."""

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
    load_topology_arg,
    name_collective,
    root_option,
)
from synth.errors import SynthError

KINDS = ("gantt", "links", "topology", "gaps")


@click.command("plot")
@click.argument("source", required=False, type=click.Path(dir_okay=False))
@click.option("-k", "--kind", type=click.Choice(KINDS), default=None,
              help="gantt: link timelines; links: per-link utilisation heatmap; topology: the fabric; gaps: "
                   "algbw vs SIZE per method with the bound (SOURCE is a `synth sweep` table). "
                   "Default: gaps for a table, gantt for a program, topology for -t alone.")
@click.option("-o", "--output", required=True, type=OUTPUT_FILE,
              help="Image file (.png, .svg, .pdf), written atomically.")
@click.option("-t", "--topology", "topology_name", default=None,
              help="Topology name or file (default: the program's own; required for foreign XML).")
@click.option("-s", "--size", default=None, help="SIZE for gantt/links (default: the program's size, else 1GiB).")
@collective_option
@root_option
@json_option
@guarded
def command(source: str | None, kind: str | None, output: str, topology_name: str | None, size: str | None,
            collective: str | None, root: int | None, as_json: bool) -> None:
    """Draw a program (gantt, links), a topology, or the optimality gaps of a sweep table."""
    from synth import plots
    from synth.sweep import is_table

    table = source is not None and is_table(source)
    if kind is None:
        kind = "gaps" if table else "gantt" if source else "topology"
    if kind == "gaps":
        if source is None or not table:
            raise SynthError("--kind gaps needs a results table from `synth sweep` (.csv or .json)")
        from synth.sweep import read_table

        rows = read_table(source)
        if not rows:
            raise SynthError(f"{source}: the results table has no rows")
        path = plots.plot_gaps(rows, output)
    elif source is None:
        if kind != "topology":
            raise SynthError(f"--kind {kind} needs a program file (PROG)")
        if not topology_name:
            raise SynthError("--kind topology needs -t TOPOLOGY (or a program that names its topology)")
        path = plots.plot_topology(load_topology_arg(topology_name), output)
    else:
        if table:
            raise SynthError(f"{source} is a sweep table; only --kind gaps draws tables")
        program = name_collective(load_program_arg(source), collective, root, source)
        topology = fabric_arg(program, topology_name, source)
        if kind == "topology":
            path = plots.plot_topology(topology, output)
        else:
            from synth.simulation import simulate
            from synth.units import parse_size

            size_bytes = parse_size(size) if size is not None else None
            sim = simulate(program, topology, size_bytes, record_events=kind == "gantt")
            if kind == "gantt":
                path = plots.plot_gantt(sim, topology, output)
            else:
                path = plots.plot_link_heatmap(sim, topology, output)
    if as_json:
        emit_json({"output": str(path), "kind": kind})
    else:
        click.echo(str(path))
