"""``synth convert PROG -o OUT [-c C] [--root R] [--runtime R] [--min-bytes S] [--max-bytes S] [--no-verify]``:
re-write a program (MSCCL XML, JSON program or an msccl-tools SCCL algorithm) as MSCCL XML or a JSON program
(docs/programs.md)."""

from __future__ import annotations

import click

from synth.cli.common import (
    OUTPUT_FILE,
    collective_option,
    emit_json,
    guarded,
    json_option,
    name_collective,
    root_option,
)


@click.command("convert")
@click.argument("prog", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=OUTPUT_FILE,
              help="File to write: .xml (MSCCL XML) or .json (JSON program).")
@collective_option
@root_option
@click.option("--runtime", type=click.Choice(["msccl-executor", "msccl"]), default=None,
              help="The MSCCL runtime the XML is for (its attributes, coll spelling and limits; default "
                   "msccl-executor).")
@click.option("--min-bytes", default=None, help="The smallest buffer SIZE the runtime should use the program for.")
@click.option("--max-bytes", default=None,
              help="The largest buffer SIZE it should use the program for, inclusive (required for --runtime msccl "
                   "when the program records none: that runtime has no unbounded value).")
@click.option("--no-verify", "no_verify", is_flag=True, help="Write without checking the program first.")
@json_option
@guarded
def command(prog: str, output: str, collective: str | None, root: int | None, runtime: str | None,
            min_bytes: str | None, max_bytes: str | None, no_verify: bool, as_json: bool) -> None:
    """Read PROG in any format synth reads, check it (synth verify; exit 1 if wrong) and write it to OUTPUT.

    \b
    Examples:
      synth convert Allgather.n8-DGX1-steps2.msccl.json -o dgx1-allgather.xml
      synth convert broadcast.msccl.xml -c broadcast --root 0 -o broadcast.json
    """
    from synth.errors import CheckFailed, SynthError
    from synth.program.load import load_program_format, save_program
    from synth.runtime_limits import runtime_profile
    from synth.runtimes import byte_range
    from synth.units import parse_size
    from synth.verification import verify

    profile = runtime_profile(runtime)
    program, fmt = load_program_format(prog)
    program = name_collective(program, collective, root, prog)
    if min_bytes is not None or max_bytes is not None:
        low = parse_size(min_bytes, allow_zero=True) if min_bytes is not None else None
        high = parse_size(max_bytes, allow_zero=True) if max_bytes is not None else None
        program = program.with_(**dict(zip(("min_bytes", "max_bytes"),
                                           byte_range(profile, high or low or 0, low, high), strict=True)))
    elif output.lower().endswith(".xml") and profile.max_bytes_unbounded is None and program.max_bytes == 0 \
            and not program.size_bytes:
        raise SynthError(f"{prog} records no SIZE and {profile.repo} has no unbounded maxBytes: give --max-bytes, "
                         "the largest SIZE it should serve")
    if not no_verify:
        result = verify(program, None, msccl_limits=fmt == "xml")
        if not result.ok:
            extra = f" (and {len(result.errors) - 1} more; synth verify lists them)" if len(result.errors) > 1 else ""
            raise CheckFailed(f"{prog} does not implement {result.collective} on {result.ranks} ranks: "
                              f"{result.errors[0]}{extra}; nothing written")
    written = str(save_program(program, output, coll_spelling=None, runtime=profile.name))
    info = {"program": prog, "format": fmt, "output": written, "collective": program.collective,
            "root": program.root, "ranks": program.num_ranks, "steps": program.num_steps(), "verified": not no_verify}
    if as_json:
        emit_json(info)
    else:
        click.echo(f"wrote {written}: {program.collective} on {program.num_ranks} ranks, {program.num_steps()} steps "
                   f"(from {fmt}{', verified' if not no_verify else ', not verified'})")
