"""``synth sweep -t T[,T2..] -c C[,..] (-s 1K,1M,.. | -b MIN -e MAX [-f F]) -m m1,m2|all -o results.csv|.json``.

Topologies × collectives × sizes × methods through the pipeline, into one tidy table with the bound
and the gap of every row; finished rows are cached so a re-run only computes what is new. Sizes are a
list (``-s``) or nccl-tests' geometric range (``-b/--minbytes``, ``-e/--maxbytes``, ``-f/--stepfactor``);
SIZE suffixes are those of docs/units.md (``K`` = 1000, ``KiB`` = 1024).
"""

from __future__ import annotations

import click

from synth.cli.common import MAX_JOBS, OUTPUT_FILE, ROOT, SECONDS, FiniteFloat, count, emit_json, guarded, json_option
from synth.errors import SynthError
from synth.solvers import SOLVERS
from synth.sweep import MAX_RANGE_SIZES

#: The sizes swept when neither -s nor -b/-e is given (docs/units.md).
DEFAULT_SIZES = "1K,1M,64M,1G"


@click.command("sweep")
@click.option("-t", "--topology", "topologies", required=True,
              help="Comma-separated topology names (built-in) or files.")
@click.option("-c", "--collective", "collectives", default="allgather,allreduce", show_default=True,
              help="Comma-separated collectives: allgather, reducescatter, allreduce, alltoall, broadcast, reduce, "
                   "gather, scatter.")
@click.option("-s", "--size", "sizes", default=None, show_default=f"{DEFAULT_SIZES} without -b/-e",
              help="Comma-separated SIZEs (nccl-tests buffer convention; K/M/G are powers of 1000, KiB/MiB/GiB "
                   "of 1024). Not with -b/-e/-f.")
@click.option("-b", "--minbytes", default=None,
              help="Smallest SIZE of a geometric range, as nccl-tests' -b. nccl-tests reads 1K/1M/1G as "
                   "2^10/2^20/2^30; here they are powers of 1000, so nccl-tests' `-b 1K -e 1G -f 2` is "
                   "`-b 1KiB -e 1GiB -f 2` (21 sizes). Needs -e.")
@click.option("-e", "--maxbytes", default=None,
              help="Largest SIZE of the range (included when the range reaches it exactly). Needs -b.")
@click.option("-f", "--stepfactor", type=FiniteFloat(1, min_open=True), default=None, show_default="2",
              help=f"Each size of the range is the previous one times this factor (> 1; a range may have at most "
                   f"{MAX_RANGE_SIZES} sizes).")
@click.option("-m", "--method", "methods", default="all", show_default=True,
              help="Comma-separated methods (`synth synthesize --list-methods`), `all` (every registered method "
                   "that supports the collective) or `auto`.")
@click.option("-o", "--out", "output", required=True, type=OUTPUT_FILE,
              help="Results table: .csv or .json (written atomically).")
@click.option("--time-limit", type=SECONDS, default=None, show_default="none",
              help="Wall-clock safety stop per row, seconds (none: rows depend only on deterministic work budgets).")
@click.option("--solver", default="highs", show_default=True,
              help=f"Solver for exact methods: {', '.join(SOLVERS)}.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@click.option("--cache-dir", default=".synth-cache", show_default=True, type=click.Path(file_okay=False),
              help="Row cache directory.")
@click.option("--no-cache", is_flag=True, help="Compute every row (and do not store them).")
@click.option("--retry-failed", is_flag=True, help="Recompute rows whose cached status is an error.")
@click.option("-j", "--jobs", type=count(1, MAX_JOBS), default=1, show_default=True,
              help="Rows computed in parallel (processes).")
@json_option
@guarded
def command(topologies: str, collectives: str, sizes: str | None, minbytes: str | None, maxbytes: str | None,
            stepfactor: float | None, methods: str, output: str, time_limit: float | None, solver: str, root: int,
            cache_dir: str, no_cache: bool, retry_failed: bool, jobs: int, as_json: bool) -> None:
    """Sweep topologies × collectives × sizes × methods; write time, algbw, busbw, bound and gap per row."""
    from pathlib import Path

    from synth.pipeline import check_root
    from synth.sweep import parse_list, plan, run_sweep, write_table
    from synth.synthesis.base import SynthOptions
    from synth.topology.io import load_topology

    if Path(output).suffix.lower() not in (".csv", ".json"):
        raise SynthError(f"--out {output}: the results table must end in .csv or .json")
    size_list = _sizes(sizes, minbytes, maxbytes, stepfactor)
    topos = [load_topology(name) for name in parse_list(topologies)]
    colls = parse_list(collectives)
    meths = parse_list(methods)
    for topo in topos:
        check_root(topo, root)
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


def _sizes(sizes: str | None, minbytes: str | None, maxbytes: str | None, stepfactor: float | None) -> list[int]:
    """The SIZE list: ``-s`` as given, or the ``-b/-e/-f`` range (the two forms exclude each other)."""
    from synth.sweep import parse_list, size_range
    from synth.units import parse_size

    ranged = (minbytes, maxbytes, stepfactor) != (None, None, None)
    if ranged and sizes is not None:
        raise SynthError("give sizes either as a list (-s) or as a range (-b/-e/-f), not both")
    if not ranged:
        return [parse_size(s) for s in parse_list(DEFAULT_SIZES if sizes is None else sizes)]
    if minbytes is None or maxbytes is None:
        raise SynthError("a size range needs both -b/--minbytes and -e/--maxbytes (-f/--stepfactor defaults to 2)")
    return size_range(parse_size(minbytes), parse_size(maxbytes), 2.0 if stepfactor is None else stepfactor)


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
                          ("busbw_GBps", "right"), ("bound_us", "right"), ("gap", "right")):
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
                      _fmt(row["time_us"], ".2f"), _fmt(row["algbw_GBps"], ".2f"), _fmt(row["busbw_GBps"], ".2f"),
                      _fmt(row["bound_us"], ".2f"),
                      _fmt(row["gap"], ".1%"))
    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=200)
    con.print(table)
    for i, row in enumerate(failures, 1):
        con.print(f"[{i}] {row['error']}", markup=False, overflow="ignore", crop=False)
    con.print(f"{len(result.rows)} rows ({result.computed} computed, {result.cached} cached, "
              f"{result.failed} failed) in {result.wall_s:.1f} s -> {path}")
