"""The ``synth`` command line. Subcommands live in ``synth/cli/cmd_*.py`` and are imported lazily,
so ``synth --help`` stays instant (torch, OR-Tools and matplotlib load only when used)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

import synth.cli as _pkg


def _command_modules() -> dict[str, str]:
    names = {}
    for info in pkgutil.iter_modules(_pkg.__path__):
        if info.name.startswith("cmd_"):
            names[info.name[4:].replace("_", "-")] = f"synth.cli.{info.name}"
    return names


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_command_modules())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = _command_modules().get(name)
        if module is None:
            return None
        return importlib.import_module(module).command


@click.group(cls=LazyGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, envvar="SYNTH_DEBUG", help="Show tracebacks on errors.")
@click.version_option(package_name="synth")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """synth: synthesize, verify, simulate and execute collective-communication schedules."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if ctx.invoked_subcommand is None:  # bare `synth`: show the commands, not a usage error
        click.echo(ctx.get_help())


def main() -> None:
    sys.exit(cli.main(standalone_mode=True))
