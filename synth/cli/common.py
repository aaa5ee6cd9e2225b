"""Shared CLI plumbing: --json output, error handling with the exit codes of docs/cli.md, argument loaders."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from synth.errors import CheckFailed, SynthError

if TYPE_CHECKING:
    from synth.program.ir import Program
    from synth.topology.model import Topology

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


# Upper limits of integer options: far above any useful value, low enough that a typo such as
# --chunks 100000000 fails at once instead of running out of memory or time.
MAX_CHUNKS = 1_000_000  # trees explains why a count this large does not fit the runtime
MAX_THREADS = 1024
MAX_TREES = 4096
MAX_JOBS = 1024
MAX_ITERS = 1_000_000
MAX_RANKS = 1_000_000  # the topology schema's limit
#: Longest time limit or timeout, seconds (about 11.6 days); solvers take it in int milliseconds.
MAX_SECONDS = 1e6


class OptionError(click.BadParameter):
    """A bad option value, shown like every other error: one ``error:`` line (no usage banner)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {shorten(self.format_message())}", err=True)


class _OneLineErrors:
    """Mixin for parameter types: their failures are :class:`OptionError`."""

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> NoReturn:
        raise OptionError(message, ctx=ctx, param=param)


class Count(_OneLineErrors, click.IntRange):
    """An integer in a closed range."""

    name = "integer"


class FiniteFloat(_OneLineErrors, click.FloatRange):
    """A float in a range that is also finite: ``nan`` passes every range comparison and ``inf``
    makes deadlines that never come, so both are refused like any bad value."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


#: Seconds for --time-limit and --timeout: positive, finite, at most MAX_SECONDS.
SECONDS = FiniteFloat(0, MAX_SECONDS, min_open=True)
#: GB/s: positive and finite.
BANDWIDTH = FiniteFloat(0, min_open=True)
#: µs: non-negative and finite.
LATENCY = FiniteFloat(0)


class OutputFile(_OneLineErrors, click.Path):
    """A file to write: not a directory, and not empty (``-o ''`` would otherwise print to stdout, be skipped
    as "no file" or be renamed over the current directory)."""

    name = "file"

    def __init__(self) -> None:
        super().__init__(dir_okay=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("an empty path names no file to write.", param, ctx)
        return super().convert(value, param, ctx)


#: -o/--output and --gantt: the file a command writes.
OUTPUT_FILE = OutputFile()


def count(low: int, high: int) -> Count:
    """An integer option between ``low`` and ``high`` (inclusive)."""
    return Count(low, high)


#: --root: a rank (checked against the topology once it is loaded).
ROOT = count(0, MAX_RANKS - 1)
#: --gap: a relative MIP gap in [0, 1).
GAP = FiniteFloat(0, 1, max_open=True)


def _debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.obj and ctx.obj.get("debug"):
            return True
        ctx = ctx.parent
    return False


#: The longest error line printed: a message quoting a hostile value (a 5 MB step type, a collective name)
#: keeps its start and end, and says how much was left out.
MAX_MESSAGE_CHARS = 2000


def shorten(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` as one printable line of at most about ``limit`` characters: a control character quoted from a
    file (a line break, an escape sequence in a recorded fabric source) is written as its escape, and a longer line
    keeps its start and end around a count of the rest."""
    if len(message) > limit:
        head, tail = message[: limit * 3 // 4], message[-(limit // 4):]
        message = f"{head} ... ({len(message) - len(head) - len(tail):,} characters left out) ... {tail}"
    if not message.isprintable():
        message = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in message)
    return message


def guarded(func: Callable) -> Callable:
    """Map SynthError -> exit 2 and CheckFailed -> exit 1 with one line on stderr (no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (SynthError, CheckFailed) as exc:
            if _debug_enabled():
                raise
            code = 1 if isinstance(exc, CheckFailed) else 2
            click.echo(f"error: {shorten(str(exc))}", err=True)
            sys.exit(code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(2)
        except MemoryError:     # past synth's stated limits, the machine's memory (or a ulimit) is the last one
            if _debug_enabled():
                raise
            click.echo("error: out of memory: the input is too large for the memory available to synth "
                       "(docs/cli.md lists synth's size limits)", err=True)
            sys.exit(2)
        except Exception as exc:  # unexpected: still one line unless --debug
            if _debug_enabled():
                raise
            click.echo(f"error: internal error: {type(exc).__name__}: {shorten(str(exc))} (rerun with --debug)",
                       err=True)
            sys.exit(2)

    return wrapper


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return _clean(value.item())
    return value


def emit_json(payload: dict) -> None:
    click.echo(json.dumps(_clean(payload), indent=2, sort_keys=False))


def console():
    from rich.console import Console

    return Console(highlight=False)


def load_topology_arg(name_or_path: str):
    from synth.topology.io import load_topology

    return load_topology(name_or_path)


def load_program_arg(path: str):
    from synth.program.load import load_program

    return load_program(path)


#: -c/--collective and --root of the commands that read a program: they name what a ``coll="custom"`` program
#: computes (docs/programs.md, "Custom programs").
collective_option = click.option(
    "-c", "--collective", default=None,
    help="Collective the program implements (default: the one it declares; required for coll=\"custom\").")
root_option = click.option("--root", type=ROOT, default=None,
                           help="Root rank for rooted collectives (default: the program's).")


def name_collective(program: Program, collective: str | None, root: int | None, prog: str) -> Program:
    """``program`` as the collective ``collective`` with root ``root`` (each None: the program's own); a
    program whose ``coll`` synth does not know (``custom``) without ``collective`` is one clear SynthError."""
    from synth.collectives import COLLECTIVES, canonical_name

    if collective is not None:
        program = program.with_(collective=canonical_name(collective))
    elif program.collective not in COLLECTIVES:
        raise SynthError(f"{prog}: coll={program.collective!r} does not say which collective the program computes; "
                         "name it with -c/--collective (and --root for broadcast, reduce, gather, scatter)")
    if root is not None:
        if root >= program.num_ranks:
            raise SynthError(f"--root {root} is not a rank of {prog} (0..{program.num_ranks - 1})")
        program = program.with_(root=root)
    return program


def fabric_arg(program: Program, topology_name: str | None, prog: str) -> Topology:
    """The topology to time ``program`` on (:func:`synth.program.fabric.resolve_fabric`); warnings go to stderr."""
    from synth.program.fabric import resolve_fabric

    topology, warnings = resolve_fabric(program, topology_name, prog)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    return topology
