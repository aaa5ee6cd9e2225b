"""``synth verify PROG [-c C] [--root R] [--json]``: symbolic check of a program (exit 0 ok, 1 wrong, 2 bad input)."""

from __future__ import annotations

import sys

import click

from synth.cli.common import ROOT, emit_json, guarded, json_option, name_collective

SHOWN_ERRORS = 20


@click.command("verify")
@click.argument("prog", type=click.Path(dir_okay=False))
@click.option("-c", "--collective", default=None,
              help="Collective to check against (default: the one the program declares).")
@click.option("--root", type=ROOT, default=None, help="Root rank for rooted collectives (default: the program's).")
@click.option("--runtime", type=click.Choice(["msccl-executor", "msccl"]), default=None,
              help="Check everything this MSCCL runtime's loader checks (its attributes, `coll` spelling and "
                   "limits; docs/programs.md) instead of the checks common to both.")
@click.option("-s", "--size", default=None,
              help="With --runtime: also check that the runtime selects the program for a SIZE buffer.")
@json_option
@guarded
def command(prog: str, collective: str | None, root: int | None, runtime: str | None, size: str | None,
            as_json: bool) -> None:
    """Check that PROG (MSCCL XML or JSON program) computes its collective and cannot deadlock."""
    from dataclasses import replace

    from synth.errors import SynthError
    from synth.fileio import read_input_text
    from synth.program.load import parse_program_text
    from synth.runtimes import loader_errors, shared_loader_errors
    from synth.units import parse_size
    from synth.verification import verify

    if size is not None and runtime is None:
        raise SynthError("verify -s/--size needs --runtime (the runtime whose selection rule is checked)")
    size_b = parse_size(size) if size is not None else None     # a bad -s is exit 2 whatever PROG's format
    text = read_input_text(prog, "program file")    # read once: PROG may be a FIFO
    program, fmt = parse_program_text(text, prog)
    program = name_collective(program, collective, root, prog)
    result = verify(program, None, msccl_limits=fmt == "xml", runtime=runtime)  # XML must load in the runtimes
    if fmt == "xml":   # what synth's reader fills in or normalises, as the loaders see it
        if runtime is not None:
            raw = [f"runtime {runtime}: {e}" for e in loader_errors(runtime, text, size_b)]
        else:
            raw = list(shared_loader_errors(text))
        if raw:
            result = replace(result, ok=False, errors=[*raw, *result.errors])
    if as_json:
        emit_json(result.to_dict())
    else:
        if result.ok:
            click.echo(f"ok: {prog} implements {result.collective} on {result.ranks} ranks "
                      f"({program.num_steps()} steps) and cannot deadlock")
        else:
            click.echo(f"FAILED: {prog} does not implement {result.collective} on {result.ranks} ranks "
                       f"({len(result.errors)} errors)", err=True)
            for line in result.errors[:SHOWN_ERRORS]:
                click.echo(f"  {line}", err=True)
            if len(result.errors) > SHOWN_ERRORS:
                click.echo(f"  ... {len(result.errors) - SHOWN_ERRORS} more (use --json for all)", err=True)
            sys.stderr.flush()
    if not result.ok:
        sys.exit(1)
