"""``synth compare -t T -c C [-s SIZE] [--root R] [--methods m1,m2] [--work-limit W] [--time-limit SEC] [--json]``.

Runs every registered method that supports the collective (or the ``--methods`` given) through the
pipeline (schedule -> lower -> verify -> simulate), and prints one row per method next to the lower
bound. ``ratio_to_bound = time_us / bound_us`` (>= 1; 1 means provably optimal under the α-β
model). A method that fails on the topology gets its error in its row; the command still succeeds.
Exact methods (MILP, CP-SAT) get ``--work-limit`` units of deterministic solver work each (default 10;
:mod:`synth.solvers`: CP-SAT deterministic time on a fixed worker count, branch-and-bound nodes), so a
comparison stays bounded and gives the same rows on an idle and on a busy machine. ``--time-limit`` is only a
wall-clock safety stop (default none): a method it cuts short is an ``error`` row.
"""

from __future__ import annotations

import click

from synth.cli.common import ROOT, SECONDS, emit_json, guarded, json_option, load_topology_arg
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

DEFAULT_WORK_LIMIT = 10.0   # work seconds per exact method (synth.solvers)


def compare_rows(topology, collective: str, size_bytes: float, methods: list[str], options, root: int = 0,
                 bound_us: float | None = None) -> list[dict]:
    """One dict per method: method, status, time_us, algbw_GBps, busbw_GBps, ratio_to_bound, gap,
    synthesis_s, chunks, error (None when it worked). Never raises for a method's failure."""
    import time

    from synth.pipeline import synthesize

    rows = []
    for m in methods:
        t0 = time.perf_counter()
        try:
            res = synthesize(topology, collective, size_bytes, m, options, root)
        except (SynthError, Exception) as exc:   # noqa: BLE001 - one method's failure is one row
            error = str(exc) if isinstance(exc, SynthError) else f"internal: {type(exc).__name__}: {exc}"
            rows.append({"method": m, "status": "error", "time_us": None, "algbw_GBps": None, "busbw_GBps": None,
                         "ratio_to_bound": None, "gap": None, "synthesis_s": time.perf_counter() - t0,
                         "chunks": None, "error": error})
            continue
        bound = bound_us if bound_us is not None else res.bound_us
        ratio = res.time_us / bound if bound and bound > 0 else None
        rows.append({"method": m, "status": res.status, "time_us": res.time_us, "algbw_GBps": res.algbw_GBps,
                     "busbw_GBps": res.busbw_GBps, "ratio_to_bound": ratio, "gap": res.gap,
                     "synthesis_s": res.synthesis_s, "chunks": res.collective.chunk_factor, "error": None})
    return rows


@click.command("compare")
@click.option("-t", "--topology", "topology_name", required=True, help="Topology name (built-in) or file.")
@click.option("-c", "--collective", required=True, help="allgather, reducescatter, allreduce, alltoall, broadcast, "
              "reduce, gather or scatter.")
@click.option("-s", "--size", default="1GiB", show_default=True,
              help="SIZE (nccl-tests buffer convention): bytes, K/M/G (powers of 1000) or KiB/MiB/GiB (powers of "
                   "1024); nccl-tests' 1G is 1GiB here.")
@click.option("--root", type=ROOT, default=0, show_default=True, help="Root rank of rooted collectives.")
@click.option("--methods", default=None, show_default="every registered method that supports the collective",
              help="Comma-separated methods (`synth synthesize --list-methods`).")
@click.option("--solver", default="highs", show_default=True,
              help=f"Solver for exact methods: {', '.join(SOLVERS)}.")
@click.option("--work-limit", type=SECONDS, default=DEFAULT_WORK_LIMIT, show_default=True,
              help="Deterministic solver work each exact method may spend (CP-SAT deterministic time, "
                   "branch-and-bound nodes; not seconds), so the rows do not depend on the machine's load.")
@click.option("--time-limit", type=SECONDS, default=None,
              help="Wall-clock safety stop per method in seconds; a method it stops is an `error` row. "
                   "Default: none.")
@fabric_edit_options
@json_option
@guarded
def command(topology_name: str, collective: str, size: str, root: int, methods: str | None, solver: str,
            work_limit: float, time_limit: float | None, exclude_link: tuple, degrade: tuple, exclude_rank: tuple,
            baseline: str | None, as_json: bool) -> None:
    """Baselines vs synthesized methods vs the lower bound, in one table."""
    from synth.cli.fabric_edits import edited_root
    from synth.collectives import Collective, canonical_name
    from synth.pipeline import check_root
    from synth.synthesis.base import SynthOptions
    from synth.synthesis.registry import METHODS, methods_for
    from synth.units import algbw_GBps, format_size, parse_size

    name = canonical_name(collective)
    size_bytes = parse_size(size)
    if size_bytes <= 0:
        raise SynthError(f"size must be positive, got {size}")
    topology, degraded = apply_fabric_edits(load_topology_arg(topology_name), exclude_link, degrade, exclude_rank)
    root = edited_root(degraded, name, root)
    if topology.num_ranks < 2:
        raise SynthError(f"topology {topology.name!r} has {topology.num_ranks} rank; a collective needs at least 2")
    check_root(topology, root)
    if methods:
        chosen = [m.strip().lower() for m in methods.split(",") if m.strip()]
        if not chosen:
            raise SynthError(f"--methods {methods!r} names no method; expected some of {', '.join(METHODS)}")
        unknown = [m for m in chosen if m not in METHODS]
        if unknown:
            raise SynthError(f"unknown method(s) {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
        unsupported = [m for m in chosen if name not in METHODS[m].collectives]
        if unsupported:
            raise SynthError(f"method(s) {', '.join(unsupported)} do not support {name}")
    else:
        chosen = methods_for(name)
    if not chosen:
        raise SynthError(f"no registered method supports {name}")

    bound = None
    try:
        from synth.lower_bounds import compute_bounds

        bound = compute_bounds(topology, Collective(name, topology.num_ranks, root=root), size_bytes)
    except Exception:  # noqa: BLE001 - the table still compares the methods without a bound
        bound = None
    bound_us = float(bound.time_bound_us) if bound is not None else None
    options = SynthOptions(solver=solver, time_limit=time_limit, work_limit=work_limit,
                           healthy=healthy_fabric(degraded))
    rows = compare_rows(topology, name, size_bytes, chosen, options, root, bound_us)
    ok = [r for r in rows if r["error"] is None]
    best = min(ok, key=lambda r: r["time_us"])["method"] if ok else None
    best_time = min((r["time_us"] for r in ok), default=0.0)
    edits = {} if degraded is None else {"degraded": degraded.as_dict()}
    if baseline is not None:
        edits["baseline"] = baseline_report(baseline, topology, name, size_bytes, bound_us)

    if as_json:
        emit_json({
            "topology": topology.name, "collective": name, "ranks": topology.num_ranks, "root": root,
            "size_bytes": size_bytes,
            "bound": None if bound is None else {
                "time_bound_us": bound.time_bound_us, "bandwidth_bound_us": bound.bandwidth_bound_us,
                "latency_bound_us": bound.latency_bound_us, "algbw_bound_GBps": bound.algbw_bound_GBps},
            "best": best,
            "rows": rows,
            **edits,
        })
        return

    from rich.table import Table

    from synth.cli.common import console

    con = console()
    table = Table(title=f"{name} on {topology.name} ({topology.num_ranks} ranks), SIZE {format_size(size_bytes)}")
    for col, just in (("method", "left"), ("status", "left"), ("µs", "right"), ("algbw", "right"),
                      ("busbw", "right"), ("ratio", "right"), ("synth s", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        if r["error"] is not None:
            table.add_row(r["method"], "[red]error[/red]", "-", "-", "-", "-", f"{r['synthesis_s']:.2f}")
            continue
        style = "bold" if r["time_us"] <= best_time * (1 + 1e-9) else None
        ratio = f"{r['ratio_to_bound']:.3f}" if r["ratio_to_bound"] is not None else "n/a"
        table.add_row(r["method"], r["status"], f"{r['time_us']:.2f}", f"{r['algbw_GBps']:.2f}",
                      f"{r['busbw_GBps']:.2f}", ratio, f"{r['synthesis_s']:.2f}", style=style)
    if bound_us is not None:
        algbw = algbw_GBps(size_bytes, bound_us)
        table.add_row("[italic]bound[/italic]", "bound", f"{bound_us:.2f}", f"{algbw:.2f}",
                      f"{algbw * Collective(name, topology.num_ranks).busbw_factor:.2f}", "1.000", "-")
    con.print(table)
    con.print("µs: simulated time; algbw/busbw in GB/s; ratio = time_us / bound_us "
              "(1 = provably optimal under the α-β model)")
    for r in rows:
        if r["error"] is not None:
            con.print(f"[red]{r['method']}[/red]: {r['error']}", markup=True)
    if degraded is not None:
        con.print(edits_line(degraded), soft_wrap=True, markup=False)
    if baseline is not None:
        con.print(baseline_line(edits["baseline"]), soft_wrap=True, markup=False)
