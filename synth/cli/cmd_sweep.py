"""``synth sweep -t T[,T2..] -c C[,..] -s 1K,1M,.. -m m1,m2|all --out results.csv|.json [--json]``.

Topologies × collectives × sizes × methods through the pipeline, into one tidy table with the bound
and the gap of every row; finished rows are cached so a re-run only computes what is new.
"""

from __future__ import annotations

import click

from synth.cli.common import MAX_JOBS, ROOT, SECONDS, count, emit_json, guarded, json_option
from synth.errors import SynthError


@click.command("sweep")
@click.option("-t", "--topology", "topologies", required=True,
              help="Comma-separated topology names (built-in) or files.")
@click.option("-c", "--collective", "collectives", default="allgather,allreduce", show_default=True,
              help="Comma-separated collectives.")
@click.option("-s", "--size", "sizes", default="1K,1M,64M,1G", show_default=True,
              help="Comma-separated SIZEs (nccl-tests buffer convention).")
@click.option("-m", "--method", "methods", default="all", show_default=True,
              help="Comma-separated methods, `all` (every registered method that supports the collective) "
                   "or `auto`.")
@click.option("-o", "--out", "output", required=True, type=click.Path(dir_okay=False),
              help="Results table: .csv or .json (written atomically).")
@click.option("--time-limit", type=SECONDS, default=None, help="Solver time limit per row, seconds.")
@click.option("--solver", default="highs", show_default=True, help="Solver for exact methods.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@click.option("--cache-dir", default=".synth-cache", show_default=True, type=click.Path(file_okay=False),
              help="Row cache directory.")
@click.option("--no-cache", is_flag=True, help="Compute every row (and do not store them).")
@click.option("--retry-failed", is_flag=True, help="Recompute rows whose cached status is an error.")
@click.option("-j", "--jobs", type=count(1, MAX_JOBS), default=1, show_default=True,
              help="Rows computed in parallel (processes).")
@json_option
@guarded
def command(topologies: str, collectives: str, sizes: str, methods: str, output: str, time_limit: float | None,
            solver: str, root: int, cache_dir: str, no_cache: bool, retry_failed: bool, jobs: int,
            as_json: bool) -> None:
    """Sweep topologies × collectives × sizes × methods; write time, algbw, busbw, bound and gap per row."""
    from pathlib import Path

    from synth.sweep import parse_list, plan, run_sweep, write_table
    from synth.synthesis.base import SynthOptions
    from synth.topology.io import load_topology
    from synth.units import parse_size

    if Path(output).suffix.lower() not in (".csv", ".json"):
        raise SynthError(f"--out {output}: the results table must end in .csv or .json")
    topos = [load_topology(name) for name in parse_list(topologies)]
    colls = parse_list(collectives)
    size_list = [parse_size(s) for s in parse_list(sizes)]
    meths = parse_list(methods)
    for topo in topos:
        if not 0 <= root < topo.num_ranks:
            raise SynthError(f"--root {root} is not a rank of {topo.name} (0..{topo.num_ranks - 1})")
    total = len(plan(topos, colls, size_list, meths))  # validates names before any work
    options = SynthOptions(solver=solver, time_limit=time_limit)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True, highlight=False)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True, disable=not err.is_terminal)
    with progress:
        bar = progress.add_task("sweep", total=total)

        def on_start(task) -> None:
            progress.update(bar, description=f"{task.topology.name} {task.collective} "
                                             f"{_size(task.size_bytes)} {task.method}")

        def on_row(task, row, cached) -> None:
            progress.advance(bar)

        result = run_sweep(topos, colls, size_list, meths, options, root=root,
                           cache_dir=None if no_cache else cache_dir, retry_failed=retry_failed, jobs=jobs,
                           on_start=on_start, on_row=on_row)
    path = write_table(result.rows, output)
    if as_json:
        emit_json({"output": str(path), "rows": result.rows, "computed": result.computed, "cached": result.cached,
                   "failed": result.failed, "wall_s": result.wall_s})
        return
    _print_table(result, str(path))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _size(nbytes: float) -> str:
    """Sizes as given on the command line: 1K, 64M, 1G (powers of 1000), else 1MiB-style, else bytes."""
    from synth.units import format_size

    for suffix, factor in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{int(nbytes // factor)}{suffix}"
    return format_size(nbytes)


def _print_table(result, path: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    failures = []
    for name, justify in (("topology", "left"), ("collective", "left"), ("size", "right"), ("method", "left"),
                          ("status", "left"), ("time_us", "right"), ("algbw_GBps", "right"),
                          ("bound_us", "right"), ("gap", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for row in result.rows:
        status = row["status"]
        if row["error"]:
            failures.append(row)
            status = f"{status} [{len(failures)}]"
        method = row["method"]
        if row.get("picked") and row["picked"] != method:
            method = f"{method}→{row['picked']}"
        table.add_row(row["topology"], row["collective"], _size(row["size_bytes"]), method, status,
                      _fmt(row["time_us"], ".2f"), _fmt(row["algbw_GBps"], ".2f"), _fmt(row["bound_us"], ".2f"),
                      _fmt(row["gap"], ".1%"))
    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=200)
    con.print(table)
    for i, row in enumerate(failures, 1):
        con.print(f"[{i}] {row['error']}", markup=False, overflow="ignore", crop=False)
    con.print(f"{len(result.rows)} rows ({result.computed} computed, {result.cached} cached, "
              f"{result.failed} failed) in {result.wall_s:.1f} s -> {path}")
