"""Shared CLI plumbing: --json output, error handling with the exit codes of docs/cli.md, argument loaders."""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from synth.errors import CheckFailed, SynthError

if TYPE_CHECKING:
    from synth.program.ir import Program
    from synth.topology.model import Topology

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def _debug_enabled() -> bool:
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.obj and ctx.obj.get("debug"):
            return True
        ctx = ctx.parent
    return False


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
            click.echo(f"error: {exc}", err=True)
            sys.exit(code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(2)
        except Exception as exc:  # unexpected: still one line unless --debug
            if _debug_enabled():
                raise
            click.echo(f"error: internal error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
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


def fabric_arg(program: Program, topology_name: str | None, prog: str) -> Topology:
    """The topology to time ``program`` on (:func:`synth.program.fabric.resolve_fabric`); warnings go to stderr."""
    from synth.program.fabric import resolve_fabric

    topology, warnings = resolve_fabric(program, topology_name, prog)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    return topology
