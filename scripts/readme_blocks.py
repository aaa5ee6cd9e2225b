"""Regenerate (or check) the README's console blocks from real runs of the commands they show.

A block is marked in README.md like this::

    <!-- console -->
    ```console
    $ synth topology list
    ...the output...
    ```
    <!-- /console -->

Every ``$ synth ...`` line in a marked block is run, in README order, in one scratch directory (with
``topologies/`` and ``tests/fixtures/`` linked to the repository's, so relative paths in the README work,
and ``docs/img/`` created for plots), as ``python -m synth ...`` with this checkout first on ``PYTHONPATH``,
``COLUMNS=100`` and ``MPLBACKEND=Agg``. Its stdout and stderr replace the lines up to the next ``$``.
A command must exit 0. Later blocks may read files that earlier ones wrote.

The marker takes words after ``console``:

- ``slow``: the block takes too long for ``tests/test_readme.py`` (which runs only the other blocks, and
  only if no fast block needs a file a slow one writes); this script still regenerates it.
- ``head=N`` (and ``tail=M``, default 1): each command's output is cut to its first N lines, a line
  ``...`` (indented like the line above it) and its last M lines, for long JSON objects.

**Normalisation.** Numbers that depend on the wall clock are written as ``…``, both in the README and in
what the test compares, so the blocks are deterministic:

- the value of every ``synthesis_s`` or ``wall_s`` key (``synthesis_s  …``, ``"wall_s": …``);
- ``in 0.32 s`` in summary lines (``in … s``);
- the cells of a table column headed ``synth s`` or ``synthesis_s`` (right-justified in the same width);
- for ``synth execute``, the measured ``time_us``, ``algbw_GBps`` and ``busbw_GBps``.

Usage: ``python scripts/readme_blocks.py`` rewrites README.md; ``--check`` only reports drift (exit 1);
``--fast`` skips the blocks marked ``slow`` (they are kept as they are).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OPEN = re.compile(r"^<!-- console(?P<flags>(?: [\w=]+)*) -->$")
CLOSE = "<!-- /console -->"
TIMEOUT_S = 900  # per command; the slowest README command (compare with trees and lp) takes well under that
ELLIPSIS = "…"
TIMING_COLUMNS = ("synth s", "synthesis_s")
EXECUTE_TIMING = ("time_us", "algbw_GBps", "busbw_GBps")


@dataclass(frozen=True)
class Command:
    """One ``$ synth ...`` line of a block and the output the README shows for it."""

    line: str
    output: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A marked console block: the README lines ``start..end`` (the fences' contents, exclusive)."""

    start: int
    end: int
    slow: bool
    head: int | None
    tail: int
    commands: tuple[Command, ...]


def parse_blocks(text: str) -> list[Block]:
    """The marked blocks of ``text``, in order; a marker without a ``console`` fence is an error."""
    lines = text.split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        match = OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        flags = match.group("flags").split()
        if i + 1 >= len(lines) or lines[i + 1] != "```console":
            raise ValueError(f"README line {i + 1}: a console marker must be followed by a ```console fence")
        end = lines.index("```", i + 2)
        if end + 1 >= len(lines) or lines[end + 1] != CLOSE:
            raise ValueError(f"README line {end + 1}: the console block must end with {CLOSE}")
        head = next((int(f.split("=", 1)[1]) for f in flags if f.startswith("head=")), None)
        tail = next((int(f.split("=", 1)[1]) for f in flags if f.startswith("tail=")), 1)
        blocks.append(Block(i + 2, end, "slow" in flags, head, tail, tuple(_commands(lines[i + 2:end], i + 3))))
        i = end + 2
    return blocks


def _commands(body: list[str], first_line: int) -> list[Command]:
    commands: list[Command] = []
    for n, line in enumerate(body):
        if line.startswith("$ "):
            if not line.startswith("$ synth "):
                raise ValueError(f"README line {first_line + n}: only `$ synth ...` commands can be regenerated")
            commands.append(Command(line, ()))
        elif not commands:
            raise ValueError(f"README line {first_line + n}: a console block must start with a `$ synth` line")
        else:
            commands[-1] = Command(commands[-1].line, (*commands[-1].output, line))
    return commands


# ---- normalisation -------------------------------------------------------------------------------------------
_KEY_VALUE = re.compile(r"^(?P<key>synthesis_s|wall_s)(?P<gap>\s+)\S+")
_JSON_VALUE = re.compile(r'(?P<key>"(?:synthesis_s|wall_s)": )-?[0-9][0-9.e+-]*')
_IN_SECONDS = re.compile(r"\bin [0-9]+(?:\.[0-9]+)? s\b")
_EXECUTE = re.compile(r"^(?P<key>" + "|".join(EXECUTE_TIMING) + r")(?P<gap>\s+)[0-9][0-9.e+-]*")


def _blank_columns(lines: list[str]) -> list[str]:
    """Cells of rich box-table columns headed by a :data:`TIMING_COLUMNS` name become ``…``."""
    out = list(lines)
    columns: list[int] = []
    for i, line in enumerate(out):
        if line.startswith("┃"):
            heads = [cell.strip() for cell in line.strip("┃").split("┃")]
            columns = [k for k, head in enumerate(heads) if head in TIMING_COLUMNS]
        elif line.startswith("│") and columns:
            cells = line[1:-1].split("│")
            for k in columns:
                if k < len(cells) and cells[k].strip() not in ("", "-"):
                    cells[k] = " " + ELLIPSIS.rjust(len(cells[k]) - 2) + " "
            out[i] = "│" + "│".join(cells) + "│"
        elif line.startswith("└"):
            columns = []
    return out


def normalise(command: str, output: list[str]) -> list[str]:
    """``output`` of ``command`` with its wall-clock numbers replaced by ``…`` (module docstring)."""
    argv = shlex.split(command.removeprefix("$ "))
    executes = len(argv) > 1 and argv[1] == "execute"
    out = []
    for line in _blank_columns([line.rstrip() for line in output]):  # rich pads titles with spaces
        line = _KEY_VALUE.sub(lambda m: m["key"] + m["gap"] + ELLIPSIS, line)
        line = _JSON_VALUE.sub(lambda m: m["key"] + ELLIPSIS, line)
        line = _IN_SECONDS.sub(f"in {ELLIPSIS} s", line)
        if executes:
            line = _EXECUTE.sub(lambda m: m["key"] + m["gap"] + ELLIPSIS, line)
        out.append(line)
    return out


def shorten(output: list[str], head: int | None, tail: int = 1) -> list[str]:
    """The first ``head`` lines, ``...`` and the last ``tail`` lines (unchanged when that saves nothing)."""
    if head is None or len(output) <= head + tail + 1:
        return output
    indent = re.match(r"\s*", output[head - 1]).group(0)
    return [*output[:head], indent + "...", *output[len(output) - tail:]]


# ---- running -------------------------------------------------------------------------------------------------
def scratch_dir(base: Path) -> Path:
    """A working directory in which the README's relative paths resolve."""
    (base / "topologies").symlink_to(ROOT / "topologies")
    (base / "tests").mkdir()
    (base / "tests" / "fixtures").symlink_to(ROOT / "tests" / "fixtures")   # what `topology import` reads
    (base / "docs" / "img").mkdir(parents=True)
    return base


def run(command: str, cwd: Path) -> list[str]:
    """Run one ``$ synth ...`` line; its stdout and stderr lines (trailing blank lines dropped)."""
    argv = shlex.split(command.removeprefix("$ "))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "100", "LINES": "50", "MPLBACKEND": "Agg", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run([sys.executable, "-m", "synth", *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{command} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return (proc.stdout + proc.stderr).rstrip("\n").split("\n")


def regenerate(block: Block, cwd: Path) -> list[str]:
    """The block's new body: every command run, normalised and shortened."""
    body: list[str] = []
    for cmd in block.commands:
        body += [cmd.line, *shorten(normalise(cmd.line, run(cmd.line, cwd)), block.head, block.tail)]
    return body


def current(block: Block) -> list[str]:
    return [line for cmd in block.commands for line in (cmd.line, *cmd.output)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("readme", nargs="?", type=Path, default=README)
    parser.add_argument("--check", action="store_true", help="report drift (exit 1), write nothing")
    parser.add_argument("--fast", action="store_true", help="skip the blocks marked slow")
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    blocks = [b for b in parse_blocks(text) if not (args.fast and b.slow)]
    bodies = []
    with tempfile.TemporaryDirectory(prefix="synth-readme-") as tmp:
        cwd = scratch_dir(Path(tmp))
        for block in blocks:  # in README order: later blocks read what earlier ones wrote
            bodies.append(regenerate(block, cwd))
    lines = text.split("\n")
    drift = 0
    for block, body in reversed(list(zip(blocks, bodies))):  # from the end, so earlier offsets hold
        if body != current(block):
            drift += 1
            print(f"{args.readme.name}:{block.start}: drift in `{block.commands[0].line}`")
        lines[block.start:block.end] = body
    if args.check:
        return 1 if drift else 0
    if drift:
        args.readme.write_text("\n".join(lines), encoding="utf-8")
    print(f"{len(blocks)} blocks, {drift} regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
