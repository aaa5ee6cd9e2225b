"""``synth tune -t T -c C[,C..] [--sizes 1KiB..4GiB] [-f 2] [--runtime R] [--inplace] -o DIR``.

Sweeps the sizes, cuts the range into bands each served by one program (or by NCCL's own algorithm), and
writes the set a runtime loads: one MSCCL XML per band, ``manifest.json``, ``env.sh`` and ``algbw.png``
(:mod:`synth.tune`).
"""

from __future__ import annotations

import click

from synth.cli.common import MAX_JOBS, SECONDS, FiniteFloat, count, emit_json, guarded, json_option, load_topology_arg
from synth.cli.fabric_edits import apply_fabric_edits, edits_line, fabric_edit_options, healthy_fabric
from synth.solvers import SOLVERS
from synth.tune import DEFAULT_RANGE, STRIDE


@click.command("tune")
@click.option("-t", "--topology", "topology_name", required=True,
              help="Topology name (built-in, `synth topology list`) or file.")
@click.option("-c", "--collective", "collectives", required=True,
              help="Comma-separated collectives the runtime loads (allreduce, allgather, reducescatter, ...).")
@click.option("--sizes", default=DEFAULT_RANGE, show_default=True,
              help="MIN..MAX SIZE range (nccl-tests buffer; K/M/G powers of 1000, KiB/MiB/GiB of 1024); the grid is "
                   "MIN, MIN·f, ... and MAX. The bands tile MIN..MAX exactly.")
@click.option("-f", "--stepfactor", type=FiniteFloat(1, min_open=True), default=2.0, show_default=True,
              help="Each size of the grid is the previous one times this factor.")
@click.option("--runtime", type=click.Choice(["msccl-executor", "msccl"]), default="msccl-executor",
              show_default=True,
              help="The runtime the set is for: its attributes, coll spelling, minBytes/maxBytes semantics, limits "
                   "and file count (microsoft/msccl: at most 4 files; bands are merged to fit).")
@click.option("--inplace", is_flag=True, help="Programs for in-place calls (torch all_reduce is in place).")
@click.option("--stride", type=count(1, 64), default=STRIDE, show_default=True,
              help="auto runs at every STRIDE-th size and at both ends; between two sizes won by the same method "
                   "only that method runs (1: auto at every size).")
@click.option("--solver", default="highs", show_default=True, help=f"Solver for exact methods: {', '.join(SOLVERS)}.")
@click.option("--time-limit", type=SECONDS, default=None, show_default="none",
              help="Wall-clock safety stop per row, seconds (none: rows depend only on deterministic work budgets).")
@click.option("--cache-dir", default=".synth-cache", show_default=True, type=click.Path(file_okay=False),
              help="Row cache directory (shared with `synth sweep`); rows keep their programs.")
@click.option("--no-cache", is_flag=True, help="Compute every row (and do not store them).")
@click.option("-j", "--jobs", type=count(1, MAX_JOBS), default=1, show_default=True,
              help="Rows computed in parallel (processes).")
@click.option("-o", "--out", "output", required=True, type=click.Path(file_okay=False),
              help="Directory of the set (written atomically: built beside it, then renamed; an existing one must "
                   "be empty or an earlier set).")
@fabric_edit_options(baseline=False)
@json_option
@guarded
def command(topology_name: str, collectives: str, sizes: str, stepfactor: float, runtime: str, inplace: bool,
            stride: int, solver: str, time_limit: float | None, cache_dir: str, no_cache: bool, jobs: int, output: str,
            exclude_link: tuple, degrade: tuple, exclude_rank: tuple, as_json: bool) -> None:
    """Tune a program set over a range of sizes: one MSCCL XML per size band, with a manifest, the lines that load
    it and a plot."""
    import time

    from synth.sweep import parse_list
    from synth.synthesis.base import SynthOptions
    from synth.tune import manifest, parse_range, tune, write_set

    grid = parse_range(sizes, stepfactor)
    topology, degraded = apply_fabric_edits(load_topology_arg(topology_name), exclude_link, degrade, exclude_rank)
    options = SynthOptions(solver=solver, time_limit=time_limit, runtime=runtime, healthy=healthy_fabric(degraded))
    t0 = time.perf_counter()
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True, highlight=False)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as progress:
        bar = progress.add_task("tune", total=None)

        def on_start(task) -> None:
            progress.update(bar, description=f"{task.collective} {task.size_bytes} B {task.method}")

        result = tune(topology, parse_list(collectives), grid, options, inplace=inplace, stride=stride,
                      cache_dir=None if no_cache else cache_dir, jobs=jobs, on_start=on_start)
    path = write_set(result, output)
    doc = manifest(result)
    wall = time.perf_counter() - t0
    if as_json:
        emit_json({"output": str(path), **doc, "computed": result.computed, "cached": result.cached,
                   "failed": result.failed, "wall_s": wall,
                   **({"degraded": degraded.as_dict()} if degraded is not None else {})})
        return
    _print(result, doc, str(path), wall, degraded)


def _print(result, doc: dict, path: str, wall: float, degraded) -> None:
    from rich.console import Console
    from rich.table import Table

    from synth.tune import ENV_FILE, env_lines
    from synth.units import format_size

    con = Console(highlight=False)
    if not con.is_terminal:
        con = Console(highlight=False, width=200)
    table = Table(box=None, pad_edge=False)
    for name, justify in (("collective", "left"), ("band", "right"), ("from", "right"), ("to", "right"),
                          ("method", "left"), ("time_us", "right"), ("x bound", "right"), ("x nccl", "right"),
                          ("file", "left")):
        table.add_column(name, justify=justify, no_wrap=True)

    def span(values: list[float], spec: str) -> str:
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        low, high = min(values), max(values)
        return format(low, spec) if format(low, spec) == format(high, spec) else f"{low:{spec}}-{high:{spec}}"

    for band in doc["bands"]:
        points = band["points"]
        speedups = [p["speedup_vs_nccl"] for p in points]
        table.add_row(band["collective"], str(band["band"]), format_size(band["min_bytes"]),
                      format_size(band["max_bytes"]), band["method"], span([p["time_us"] for p in points], ".1f"),
                      span([p["ratio_to_bound"] for p in points], ".2f"), span(speedups, ".2f"),
                      band["file"] or "- (NCCL)")
    con.print(f"[bold]{', '.join(result.collectives)}[/bold] on [bold]{result.topology.name}[/bold] "
              f"({result.topology.num_ranks} ranks), {format_size(result.sizes[0])}..{format_size(result.sizes[-1])} "
              f"in {len(result.sizes)} sizes, for {result.runtime.repo} "
              f"({'in-place' if result.inplace else 'out-of-place'} calls)")
    con.print(table)
    con.print("time_us: simulated at the band's sizes; x bound = time / lower bound; x nccl = NCCL's modelled time / "
              "time", soft_wrap=True)
    for note in result.notes:
        con.print(f"note: {note}", markup=False, soft_wrap=True)
    for line in result.failed:
        con.print(f"failed: {line}", markup=False, soft_wrap=True)
    if degraded is not None:
        con.print(edits_line(degraded), soft_wrap=True, markup=False)
    con.print(f"{ENV_FILE}:", markup=False)
    for line in env_lines(result)[2:]:
        con.print(f"  {line}", markup=False, soft_wrap=True)
    files = len(doc["load"]["files"])
    con.print(f"{result.computed + result.cached} rows ({result.computed} computed, {result.cached} cached) in "
              f"{wall:.1f} s -> {path}/ ({files} program file{'s' if files != 1 else ''}, manifest.json, "
              f"{ENV_FILE}, algbw.png)", soft_wrap=True, markup=False)
