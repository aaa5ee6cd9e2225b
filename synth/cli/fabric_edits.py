"""Options for failed and degraded links, shared by ``synthesize``, ``bounds`` and ``compare`` (docs/cli.md,
"Failed and degraded links"): ``--exclude-link``, ``--degrade``, ``--exclude-rank`` and ``--baseline``.

A command takes them with :func:`fabric_edit_options`, applies them to its loaded topology with
:func:`apply_fabric_edits`, and reports a healthy program's fate on the edited fabric with
:func:`baseline_report`. The edits themselves are :mod:`synth.topology.degrade`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from synth.cli.common import MAX_RANKS, OptionError, count
from synth.errors import SynthError

if TYPE_CHECKING:
    from synth.topology.degrade import Degraded
    from synth.topology.model import Topology


def _parsed(parse: Callable[[str], Any]) -> Callable:
    """A click callback that parses every value of a repeatable option, one ``error:`` line on failure."""

    def callback(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple:
        out = []
        for value in values:
            try:
                out.append(parse(value))
            except SynthError as exc:
                raise OptionError(str(exc), ctx=ctx, param=param) from None
        return tuple(out)

    return callback


def _link(text: str) -> tuple[str, str]:
    from synth.topology.degrade import parse_link_spec

    return parse_link_spec(text)


def _degrade(text: str) -> tuple[str, str, float]:
    from synth.topology.degrade import parse_degrade_spec

    return parse_degrade_spec(text)


def _existing_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--baseline: fail before any synthesis runs where the file is missing."""
    from pathlib import Path

    if value is not None and not Path(value).is_file():
        raise OptionError(f"{value}: no such program file", ctx=ctx, param=param)
    return value


def fabric_edit_options(func: Callable | None = None, *, baseline: bool = True) -> Callable:
    """Add ``--exclude-link``, ``--degrade``, ``--exclude-rank`` (all repeatable) and, with ``baseline``,
    ``--baseline`` to a command; it receives ``exclude_link``, ``degrade``, ``exclude_rank`` (and ``baseline``).
    Use as ``@fabric_edit_options`` or ``@fabric_edit_options(baseline=False)``."""
    if func is None:
        return lambda f: fabric_edit_options(f, baseline=baseline)
    options = [
        click.option("--exclude-link", "exclude_link", multiple=True, metavar="SRC:DST", callback=_parsed(_link),
                     help="Remove the link between two nodes of the topology (both directions; names as in the "
                          "file: ranks as integers, switches by name, e.g. 0:1 or 3:b0.nic3). Repeatable."),
        click.option("--degrade", "degrade", multiple=True, metavar="SRC:DST=FACTOR", callback=_parsed(_degrade),
                     help="Multiply that link's bandwidth (both directions) by FACTOR, 0 < FACTOR <= 1. Repeatable."),
        click.option("--exclude-rank", "exclude_rank", multiple=True, type=count(0, MAX_RANKS - 1), metavar="R",
                     help="Run over the other ranks, renumbered densely in order (the output maps old -> new). "
                          "Repeatable."),
        click.option("--baseline", "baseline", default=None, metavar="PROGRAM", callback=_existing_file,
                     help="A program made for the healthy fabric: report its simulated time on the edited fabric "
                          "and its ratio to the new bound, or that it uses a removed link."),
    ]
    if not baseline:
        options.pop()
    for option in reversed(options):
        func = option(func)
    return func


def apply_fabric_edits(topology: Topology, exclude_link: tuple = (), degrade: tuple = (),
                       exclude_rank: tuple = ()) -> tuple[Topology, Degraded | None]:
    """The topology to work on and the edit record (``None`` and ``topology`` itself when no edit is given)."""
    from synth.topology.degrade import FabricEdits, degrade_topology

    edits = FabricEdits(exclude_links=tuple(exclude_link), degrade=tuple(degrade), exclude_ranks=tuple(exclude_rank))
    if edits.empty:
        return topology, None
    degraded = degrade_topology(topology, edits)
    return degraded.topology, degraded


def edited_root(degraded: Degraded | None, collective: str, root: int) -> int:
    """``--root`` in the numbering of the edited fabric. It names a rank of the fabric as given, as
    ``--exclude-rank`` does; once excluded ranks are gone the rest are renumbered densely (``rank_map``), so the
    root becomes its new number. An excluded root is one ``error:`` line; a collective without a root keeps 0."""
    from synth.collectives import ROOTED, canonical_name

    if degraded is None or not degraded.excluded_ranks:
        return root
    if canonical_name(collective) not in ROOTED:
        return 0
    if not 0 <= root < len(degraded.rank_map):
        raise SynthError(f"--root {root} is not a rank of {degraded.original.name} (0..{len(degraded.rank_map) - 1})")
    new = degraded.rank_map[root]
    if new is None:
        raise SynthError(f"--root {root} is a rank --exclude-rank takes out; name a remaining rank with --root")
    return new


def healthy_fabric(degraded: Degraded | None) -> Topology | None:
    """The fabric a re-synthesis warm-starts from (``SynthOptions.healthy``): the original one where links were
    removed or slowed, ``None`` without edits or where ranks were excluded (no healthy tree spans the rest)."""
    if degraded is None or degraded.excluded_ranks:
        return None
    return degraded.original


def baseline_report(path: str, topology: Topology, collective: str, size_bytes: float,
                    bound_us: float | None) -> dict:
    """A healthy program on ``topology`` (the edited fabric): ``{"program", "usable": True, "time_us",
    "ratio_to_bound" (time / bound, >= 1), "healthy_time_us" (on its own fabric), "slowdown" (time /
    healthy time)}``, or ``{"program", "usable": False, "reason"}`` where it cannot run there (a removed link,
    other ranks, another collective). The program file itself must load (else SynthError, exit 2)."""
    from synth.program.fabric import resolve_fabric
    from synth.program.load import load_program
    from synth.simulation import simulate

    program = load_program(path)
    if program.collective != collective:
        return {"program": path, "usable": False,
                "reason": f"{path} is a {program.collective} program, not {collective}"}
    try:
        fabric, _ = resolve_fabric(program, topology, where=path, given="the edited fabric")
        time_us = simulate(program, fabric, size_bytes, record_events=False).time_us
    except SynthError as exc:
        return {"program": path, "usable": False, "reason": str(exc)}
    out: dict = {"program": path, "usable": True, "time_us": time_us,
                 "ratio_to_bound": time_us / bound_us if bound_us else None}
    try:
        own, _ = resolve_fabric(program, None, where=path)
        healthy = simulate(program, own, size_bytes, record_events=False).time_us
        out.update(healthy_time_us=healthy, slowdown=time_us / healthy if healthy > 0 else None)
    except SynthError:   # a foreign program without a fabric of its own: no healthy time to compare
        out.update(healthy_time_us=None, slowdown=None)
    return out


def baseline_line(report: dict) -> str:
    """One human line for :func:`baseline_report`."""
    if not report["usable"]:
        return f"baseline     not usable: {report['reason']}"
    ratio = f", {report['ratio_to_bound']:.3f}x the new bound" if report.get("ratio_to_bound") else ""
    slow = f", {report['slowdown']:.3f}x its healthy time" if report.get("slowdown") else ""
    return f"baseline     {report['program']}: {report['time_us']:.3f} us on the edited fabric{ratio}{slow}"


def edits_line(degraded: Degraded) -> str:
    """One human line naming the edited fabric and its rank mapping."""
    line = f"fabric       {degraded.topology.name} (sha256 {degraded.topology.sha256[:12]}): " + \
        "; ".join(degraded.changes)
    if degraded.excluded_ranks:
        line += "; the program's ranks are the new ones"
    return line
