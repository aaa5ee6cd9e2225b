"""``synth execute PROG [--backend gloo|nccl] [-s SIZE] [--dtype D] [--iters K] [-c C] [--root R] [--json]``:
run for real."""

from __future__ import annotations

import sys

import click

from synth.cli.common import (
    MAX_ITERS,
    SECONDS,
    collective_option,
    count,
    emit_json,
    guarded,
    json_option,
    load_program_arg,
    name_collective,
    root_option,
)
from synth.errors import CheckFailed, SynthError

DTYPE_CHOICES = ("float32", "float64", "int32", "int64", "bfloat16", "float16")


@click.command("execute")
@click.argument("prog", type=click.Path(dir_okay=False))
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="torch.distributed backend: gloo (CPU processes) or nccl (one GPU per rank).")
@click.option("-s", "--size", default="1MiB", show_default=True,
              help="SIZE (nccl-tests buffer convention); rounded down to a whole number of elements per chunk.")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="float32", show_default=True)
@click.option("--iters", type=count(1, MAX_ITERS), default=5, show_default=True,
              help="Timed iterations (median reported).")
@click.option("--warmup", type=count(0, MAX_ITERS), default=1, show_default=True, help="Untimed iterations first.")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True,
              help="Seconds before every worker is killed and the run fails (exit 1).")
@click.option("--no-verify", "no_verify", is_flag=True,
              help="Run without the symbolic verifier first (a deadlocking program then hits --timeout).")
@collective_option
@root_option
@json_option
@guarded
def command(prog: str, backend: str, size: str, dtype: str, iters: int, warmup: int, timeout: float,
            no_verify: bool, collective: str | None, root: int | None, as_json: bool) -> None:
    """Run PROG (a synth program or foreign MSCCL XML) on one process per rank with torch.distributed,
    check every output chunk of every rank against an independent reference, and report the median
    time per iteration (slowest rank) and algbw = SIZE / time. Exit 1 on wrong output or timeout.
    Under torchrun (RANK/WORLD_SIZE set) the torchrun world is used and rank 0 reports."""
    import importlib.util

    from synth.execution.runner import execute
    from synth.units import parse_size

    if importlib.util.find_spec("torch") is None:
        raise SynthError("synth execute needs torch: pip install torch==2.13.0 (CPU) or "
                         "pip install 'synth[exec]' (any torch >= 2.2)")

    program = name_collective(load_program_arg(prog), collective, root, prog)
    result = execute(program, backend=backend, size_bytes=parse_size(size), dtype=dtype, iters=iters,
                     warmup=warmup, timeout=timeout, verify_first=not no_verify)
    if not result.leader:
        sys.exit(0 if result.ok else 1)
    if as_json:
        emit_json(result.to_json())
        if not result.ok:
            sys.exit(1)
        return
    from synth.cli.common import console
    from synth.units import format_size

    con = console()
    con.print(f"[bold]{result.program}[/bold] ({result.collective}) on {result.ranks} {backend} ranks, "
              f"SIZE {format_size(result.size_bytes)} {dtype}, {result.waves} waves, {result.messages} messages")
    for note in result.notes:
        con.print(f"note: {note}")
    con.print(f"time_us     {result.time_us:.1f}  (median of {iters}, slowest rank)")
    con.print(f"algbw_GBps  {result.algbw_GBps:.4f}")
    con.print(f"busbw_GBps  {result.busbw_GBps:.4f}")
    if result.ok:
        con.print("check       ok: every output chunk matches the reference")
        return
    for err in result.errors[1:]:
        click.echo(f"  {err}", err=True)
    raise CheckFailed(f"check failed: {result.errors[0]}")
