"""``synth synthesize -t T -c C [-s SIZE] [-m METHOD] ... [-o OUT] [--json]``: solve, verify, write."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import replace

import click

from synth.cli.common import (
    GAP,
    MAX_CHUNKS,
    MAX_THREADS,
    MAX_TREES,
    OUTPUT_FILE,
    ROOT,
    SECONDS,
    count,
    emit_json,
    guarded,
    json_option,
    load_topology_arg,
)
from synth.cli.fabric_edits import (
    apply_fabric_edits,
    baseline_line,
    baseline_report,
    edits_line,
    fabric_edit_options,
    healthy_fabric,
)
from synth.errors import SynthError
from synth.solvers import SOLVERS


def _default_output(topology: str, collective: str, method: str, json_only: bool = False) -> str:
    """``TOPOLOGY-COLLECTIVE-METHOD.xml``, or ``.json`` for a program MSCCL XML cannot hold (switch steps)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{topology}-{collective}-{method}")
    return f"{stem}.json" if json_only else f"{stem}.xml"


@click.command("synthesize")
@click.option("-t", "--topology", "topology_name", default=None,
              help="Topology name (built-in, `synth topology list`) or file. Required unless --list-methods.")
@click.option("-c", "--collective", default=None, help="allgather, reducescatter, allreduce, alltoall, broadcast, "
              "reduce, gather or scatter. Required unless --list-methods.")
@click.option("-s", "--size", default="1GiB", show_default=True,
              help="SIZE (nccl-tests buffer convention): bytes, K/M/G (powers of 1000) or KiB/MiB/GiB (powers of "
                   "1024); nccl-tests' 1G is 1GiB here.")
@click.option("-m", "--method", default="auto", show_default=True,
              help="Synthesis method: `auto` or one of `synth synthesize --list-methods`. auto's budgets are "
                   "deterministic solver work per candidate, not seconds; only --time-limit stops it by the clock.")
@click.option("--solver", default="highs", show_default=True,
              help=f"Solver for exact methods: {', '.join(SOLVERS)}.")
@click.option("--time-limit", type=SECONDS, default=None,
              help="Wall-clock safety stop in seconds: a method it cuts short fails (auto lists the methods it "
                   "did not try); programs depend only on deterministic work budgets. Default: none (no "
                   "wall-clock stop).")
@click.option("--chunks", type=count(1, MAX_CHUNKS), default=None,
              help="Chunks per rank piece (default: the method chooses).")
@click.option("--max-trees", type=count(1, MAX_TREES), default=None,
              help="trees: at most K spanning trees per root (default: the optimum's count up to 256, and "
                   "16/8/4 are tried too, and 2/1 behind switches); fewer trees mean fewer messages per link, at "
                   "a rate within ~1/K of the optimum.")
@click.option("--any-chunks", is_flag=True,
              help="Allow programs whose nchunksperloop does not divide the SIZE buffer: trees and ring may pick "
                   "such a chunk count and auto may keep such a program when it is the fastest (MSCCL runtimes then "
                   "run their own algorithm at that SIZE; the simulator and `synth execute` do not mind). Default: "
                   "programs the runtime runs at SIZE, where there are any.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@click.option("--gap", type=GAP, default=None, show_default="the solver's own",
              help="Relative MIP gap at which exact methods stop.")
@click.option("--threads", type=count(1, MAX_THREADS), default=None, show_default="the solver's own",
              help="Solver threads.")
@click.option("--inplace", is_flag=True, help="Emit an in-place program (MSCCL aliasing).")
@click.option("--runtime", type=click.Choice(["msccl-executor", "msccl"]), default=None,
              help="The MSCCL runtime the XML is for: msccl-executor (Azure/msccl-executor-nccl, the maintained one; "
                   "default) or msccl (microsoft/msccl). Sets the attributes, the `coll` spelling, minBytes/maxBytes "
                   "so that it selects the program at SIZE, and its limits (docs/programs.md).")
@click.option("--coll-spelling", type=click.Choice(["reduce_scatter", "reducescatter"]), default=None,
              help="Override the runtime's `coll` spelling for reduce-scatter (reducescatter: msccl-executor, "
                   "reduce_scatter: msccl); prefer --runtime.")
@click.option("--min-bytes", default=None,
              help="The smallest buffer SIZE the runtime should use the program for (default 0); it must not "
                   "exclude -s.")
@click.option("--max-bytes", default=None,
              help="The largest buffer SIZE the runtime should use the program for, inclusive (default: no limit "
                   "for msccl-executor, -s for msccl, which has no unbounded value); written in the runtime's own "
                   "maxBytes semantics (msccl: this + 1).")
@click.option("--max-scratch", default=None,
              help="Scratch budget per rank: a SIZE (512MiB), a multiple of the buffer (2x) or `none` (default: "
                   "the buffer's size, 1x). auto prefers programs within it; a program over it gets a note.")
@click.option("-o", "--output", default=None, type=OUTPUT_FILE,
              help="Program file: .xml (MSCCL XML) or .json (default: ./TOPOLOGY-COLLECTIVE-METHOD.xml).")
@click.option("--list-methods", is_flag=True, help="List the registered methods and exit.")
@fabric_edit_options
@json_option
@guarded
def command(topology_name: str | None, collective: str | None, size: str, method: str, solver: str,
            time_limit: float | None, chunks: int | None, max_trees: int | None, any_chunks: bool, root: int,
            gap: float | None, threads: int | None, inplace: bool, runtime: str | None, coll_spelling: str | None,
            min_bytes: str | None, max_bytes: str | None, max_scratch: str | None, output: str | None,
            list_methods: bool, exclude_link: tuple, degrade: tuple, exclude_rank: tuple, baseline: str | None,
            as_json: bool) -> None:
    """Synthesize a schedule, verify it, and write the program (MSCCL XML or JSON)."""
    from synth.cli.fabric_edits import edited_root
    from synth.collectives import canonical_name
    from synth.pipeline import check_root, synthesize
    from synth.program.load import save_program
    from synth.runtime_limits import DEFAULT_RUNTIME, runtime_profile
    from synth.runtimes import byte_range, export_notes, parse_scratch_budget
    from synth.synthesis.base import SynthOptions
    from synth.units import format_size, parse_size

    if list_methods:
        _list_methods(as_json)
        return
    if not topology_name or not collective:
        raise SynthError("synthesize needs -t/--topology and -c/--collective")
    name = canonical_name(collective)
    size_bytes = parse_size(size)
    topology, degraded = apply_fabric_edits(load_topology_arg(topology_name), exclude_link, degrade, exclude_rank)
    root = edited_root(degraded, name, root)
    check_root(topology, root)
    profile = runtime_profile(runtime or DEFAULT_RUNTIME)
    spelling = profile.coll("reducescatter")
    if coll_spelling is not None and coll_spelling != spelling and runtime is not None:
        raise SynthError(f"--coll-spelling {coll_spelling} is not {profile.repo}'s ({spelling}); drop it, or use "
                         f"--runtime {'msccl' if coll_spelling == 'reduce_scatter' else 'msccl-executor'}")
    if profile.coll(name) is None:
        raise SynthError(f"{profile.repo} (--runtime {profile.name}) does not load {name} programs")
    low, high = (parse_size(b, allow_zero=True) if b is not None else None for b in (min_bytes, max_bytes))
    size_range = byte_range(profile, size_bytes, low, high)
    if output is not None and not output.lower().endswith((".xml", ".json")):
        raise SynthError(f"{output}: program files end in .xml (MSCCL XML) or .json (JSON program)")
    options = SynthOptions(solver=solver, time_limit=time_limit, gap=gap, threads=threads, chunks=chunks,
                           max_trees=max_trees, runtime_chunks=not any_chunks, runtime=profile.name,
                           max_scratch=parse_scratch_budget(max_scratch, size_bytes), healthy=healthy_fabric(degraded),
                           loads_only=output is None or output.lower().endswith(".xml"))
    with _progress(enabled=not as_json) as progress:
        result = synthesize(topology, name, size_bytes, method, options, root, inplace=inplace, progress=progress)
    path = output or _default_output(topology.name, name, result.method, json_only=bool(result.program.switches))
    program = replace(result.program, min_bytes=size_range[0], max_bytes=size_range[1])
    over_limits = result.schedule.notes.get("over_limits")
    if over_limits is not None and path.lower().endswith(".xml"):
        raise SynthError(f"{path}: no MSCCL runtime loads the {result.method} program ({over_limits}); write a "
                         f".json program (synth simulate and synth execute run it) or ask for fewer --chunks")
    written = str(save_program(program, path, coll_spelling=coll_spelling, runtime=profile.name))
    if path.lower().endswith(".xml"):   # what the file cannot tell the runtime
        extra = export_notes(profile, program, size_bytes)
        if coll_spelling is not None and coll_spelling != spelling and name == "reducescatter":
            extra.append(f"coll={coll_spelling} is not {profile.repo}'s spelling ({spelling}), so it will not load "
                         f"this file; --runtime {'msccl' if coll_spelling == 'reduce_scatter' else 'msccl-executor'} "
                         "writes a file the other runtime loads")
        result = replace(result, notes=[*result.notes, *extra])
    edits = {} if degraded is None else {"degraded": degraded.as_dict()}
    if baseline is not None:
        edits["baseline"] = baseline_report(baseline, topology, name, size_bytes, result.bound_us)
    if as_json:  # notes travel inside the JSON object
        emit_json({**result.to_dict(output=written), "runtime": profile.name, **edits})
        return
    from synth.cli.common import console

    con = console()
    chosen = f"auto -> {result.method}" if method.strip().lower() == "auto" else result.method
    con.print(f"[bold]{name}[/bold] on [bold]{topology.name}[/bold] ({topology.num_ranks} ranks), "
              f"SIZE {format_size(size_bytes)}, {result.collective.chunk_factor} chunks per piece")
    con.print(f"method       {chosen}" + (f" (solver {result.solver})" if result.solver else ""))
    con.print(f"status       {result.status}")
    con.print(f"time_us      {result.time_us:.3f}")
    con.print(f"algbw_GBps   {result.algbw_GBps:.3f}")
    con.print(f"busbw_GBps   {result.busbw_GBps:.3f}")
    con.print(f"bound_us     {result.bound_us:.3f}" if result.bound_us is not None else "bound_us     n/a")
    con.print(f"gap          {result.gap:.2%}" if result.gap is not None else "gap          n/a")
    con.print(f"synthesis_s  {result.synthesis_s:.3f}")
    for row in result.tried:
        if "error" in row:
            con.print(f"  (auto skipped {row['method']}: {row['error']})")
    for row in result.not_tried:
        con.print(f"  (auto did not try {row['method']}: {row['reason']})")
    for note in result.notes:
        con.print(f"note: {note}")
    if degraded is not None:
        con.print(edits_line(degraded), soft_wrap=True, markup=False)
    reused = result.schedule.notes.get("reused_trees")
    if reused is not None:
        con.print(f"reused       {reused['reused']} of the healthy fabric's {reused['healthy']} trees "
                  f"({reused['trees']} trees in all)")
    if baseline is not None:
        con.print(baseline_line(edits["baseline"]), soft_wrap=True, markup=False)
    con.print(f"verified, wrote {written}", soft_wrap=True)   # a path must stay whole to be copied


@contextlib.contextmanager
def _progress(enabled: bool):
    """On a terminal (stderr), a live line while methods run: the method, the elapsed time and the best
    verified gap so far. Nothing with --json or when stderr is not a terminal (pipes, CI, tests)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("synthesizing", total=None)

        def show(method: str, best_gap: float | None) -> None:
            best = "" if best_gap is None else f", best verified gap so far {best_gap:.2%}"
            bar.update(task, description=f"running {method}{best}")

        yield show


def _list_methods(as_json: bool) -> None:
    from synth.synthesis.registry import METHODS

    rows = [{"name": n, "collectives": sorted(METHODS[n].collectives), "kind": METHODS[n].kind,
             "description": METHODS[n].description} for n in METHODS]
    if as_json:
        emit_json({"methods": rows})
        return
    for row in rows:
        click.echo(f"{row['name']:<14} {row['kind']:<10} {row['description']}")
