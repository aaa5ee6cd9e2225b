"""The default ``synth synthesize`` over a public, seeded family of generated fabrics (issue 30).

Usage: python benchmarks/bench_fabrics.py [--filter REGEX] [--max-ranks N]
       [--collectives allgather,reducescatter,allreduce] [--size 1GiB] [--method M] [--timeout 600]
       [--workdir DIR] [--csv FILE] [--markdown FILE] [--list]

The family is :func:`synth.topology.families.fabric_family` (88 fabrics: MI250 / DGX A100 / DGX H100 boxes,
mixed boxes, leaf-spine 1:1 and 2:1, 2-D and 3-D tori and meshes, random regular graphs; names such as
``mi250x3-ib16``, ``mi250x3-ib16-nomachines``, ``torus-8x8``, ``rr3-16-s1``). Each fabric is written as
``WORKDIR/NAME.yaml``; then, one at a time so that timings do not disturb each other, every fabric x
collective runs ``synth synthesize -t NAME.yaml -c COLL -s SIZE -o NAME-COLL.json --json`` (``-m METHOD``
only with ``--method``) in a child process, and ``synth verify`` on its program. A row gives the bound and
simulated time from the JSON (``bound_us``, ``time_us``), ratio = bound_us / time_us (1 = optimal), the
method the default picked and the child's CPU seconds (``getrusage(RUSAGE_CHILDREN)`` deltas, synthesize
only). Failures (exit codes, timeouts, verify errors, a program no MSCCL runtime loads: its JSON runs, but
issue 30 asks for programs within the runtimes' limits) are rows too. The last line is the least ratio per
collective: ``least ratio: allgather 0.912 (fabric), ...``. The whole family takes hours; filter it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

COLUMNS = ("fabric", "ranks", "collective", "bound_us", "time_us", "ratio", "method", "cpu_s", "wall_s", "status",
           "message", "tried")
# Shown columns: (header, width, justify).
SHOWN = (("fabric", 32, "left"), ("ranks", 5, "right"), ("collective", 13, "left"), ("bound us", 11, "right"),
         ("time us", 11, "right"), ("ratio", 6, "right"), ("method", 10, "left"), ("CPU s", 8, "right"),
         ("status", 24, "left"))


@dataclass(frozen=True)
class Row:
    fabric: str
    ranks: int
    collective: str
    bound_us: float | None
    time_us: float | None
    ratio: float | None
    method: str
    cpu_s: float
    wall_s: float
    status: str    # ok | error (exit N) | timeout | verify failed | verify error (exit N) | verify timeout |
    #                over MSCCL limits
    message: str
    tried: str = ""  # auto's candidates: "ring 11729.2; greedy 5374.7; trees 6288.1" (CSV only)


@dataclass(frozen=True)
class Child:
    rc: int | None     # None: timed out (killed)
    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_child(cmd: list[str], timeout: float) -> Child:
    """Run ``cmd`` in its own session; on timeout kill its whole process group. CPU = rusage delta."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # our child's group only (start_new_session)
        out, err = proc.communicate()
        rc = None
    return Child(rc, out, err, _children_cpu() - cpu0, time.perf_counter() - t0)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def synth_cmd(*args: str) -> list[str]:
    """``python -m synth ARGS`` with this interpreter (PYTHONPATH and the environment pass through)."""
    return [sys.executable, "-m", "synth", *args]


def run_one(fabric: str, ranks: int, topo_file: Path, collective: str, size: str, method: str | None,
            timeout: float, workdir: Path) -> Row:
    """Synthesize (default method unless ``method``), read its JSON, then ``synth verify`` the program."""
    prog = workdir / f"{fabric}-{collective}.json"
    cmd = synth_cmd("synthesize", "-t", str(topo_file), "-c", collective, "-s", size, "-o", str(prog), "--json")
    if method:
        cmd += ["-m", method]
    child = run_child(cmd, timeout)

    def row(status: str, message: str = "", result: dict | None = None) -> Row:
        result = result or {}
        bound, t = result.get("bound_us"), result.get("time_us")
        ratio = bound / t if isinstance(bound, (int, float)) and isinstance(t, (int, float)) and t > 0 else None
        return Row(fabric, ranks, collective, bound, t, ratio, str(result.get("method") or ""),
                   round(child.cpu_s, 3), round(child.wall_s, 3), status, message, tried_text(result))

    if child.rc is None:
        return row("timeout", f"synthesize ran past {timeout:g} s")
    if child.rc != 0:
        return row(f"error (exit {child.rc})", _last_line(child.stderr) or _last_line(child.stdout))
    try:
        result = json.loads(child.stdout)
    except json.JSONDecodeError as exc:
        return row("error (bad JSON)", f"{exc}: {_last_line(child.stdout)}")
    check = run_child(synth_cmd("verify", str(prog), "--json"), timeout)
    if check.rc is None:
        return row("verify timeout", f"verify ran past {timeout:g} s", result)
    if check.rc == 1:
        try:
            errors = json.loads(check.stdout).get("errors") or []
        except json.JSONDecodeError:
            errors = []
        return row("verify failed", str(errors[0]) if errors else _last_line(check.stderr), result)
    if check.rc != 0:
        return row(f"verify error (exit {check.rc})", _last_line(check.stderr), result)
    refusal = runtime_refusal(result)
    if refusal is not None:   # the JSON program runs, but the programs must load in the MSCCL runtimes
        return row("over MSCCL limits", refusal, result)
    return row("ok", "", result)


def runtime_refusal(result: dict) -> str | None:
    """The note of ``synth synthesize --json`` saying no MSCCL runtime loads the program (the bench writes JSON
    programs, which run anyway), or None."""
    return next((note[:300] for note in result.get("notes") or []
                 if isinstance(note, str) and note.startswith("no MSCCL runtime loads")), None)


def tried_text(result: dict) -> str:
    """The ``tried`` list of ``synth synthesize --json`` as ``method time_us`` (or why it has none) pairs."""
    parts = []
    for entry in result.get("tried") or []:
        if not isinstance(entry, dict):
            continue
        t = entry.get("time_us")
        why = entry.get("error") or (f"skipped ({entry['skipped']})" if entry.get("skipped") else "-")
        parts.append(f"{entry.get('method')} " + (f"{t:.1f}" if isinstance(t, (int, float)) else why))
    return "; ".join(parts)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def shown_cells(row: Row) -> list[str]:
    return [row.fabric, str(row.ranks), row.collective, _fmt(row.bound_us, 1), _fmt(row.time_us, 1),
            _fmt(row.ratio, 4), row.method or "-", f"{row.cpu_s:.1f}", row.status]


def print_row(console, row: Row | None, header: bool) -> None:
    """One row as a rich table whose fixed column widths line up with the rows before it."""
    from rich.table import Table

    table = Table(box=None, show_header=header, header_style="bold", pad_edge=False)
    for title, width, justify in SHOWN:
        table.add_column(title, width=width, justify=justify, no_wrap=True, overflow="ellipsis")
    if row is not None:
        table.add_row(*shown_cells(row), style=None if row.status == "ok" else "red")
    console.print(table)


def least_line(rows: list[Row], collectives: list[str]) -> str:
    """``least ratio: allgather 0.912 (fabric), ...`` over the rows that succeeded (``n/a`` if none did)."""
    parts = []
    for coll in collectives:
        done = [r for r in rows if r.collective == coll and r.status == "ok" and r.ratio is not None]
        if done:
            worst = min(done, key=lambda r: (r.ratio, r.fabric))
            parts.append(f"{coll} {worst.ratio:.3f} ({worst.fabric})")
        else:
            parts.append(f"{coll} n/a")
    return "least ratio: " + ", ".join(parts)


def to_csv(rows: list[Row]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})
    return buf.getvalue()


def to_markdown(rows: list[Row]) -> str:
    heads = [title for title, _, _ in SHOWN] + ["message"]
    lines = ["| " + " | ".join(heads) + " |",
             "|" + "|".join("---:" if justify == "right" else "---" for _, _, justify in SHOWN) + "|---|"]
    for row in rows:
        cells = [*shown_cells(row), row.message]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--filter", default=None, help="Only fabrics whose name matches this regex (re.search).")
    parser.add_argument("--max-ranks", type=int, default=None, help="Only fabrics of at most N ranks.")
    parser.add_argument("-c", "--collectives", default="allgather,reducescatter,allreduce")
    parser.add_argument("-s", "--size", default="1GiB", help="SIZE passed to synth synthesize -s (default 1GiB).")
    parser.add_argument("-m", "--method", default=None, help="Pass -m METHOD (default: synth's default method).")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per child run (default 600).")
    parser.add_argument("--workdir", default=None, help="Where fabrics and programs go (default: a new temp dir).")
    parser.add_argument("--csv", default=None, help="Write the rows as CSV.")
    parser.add_argument("--markdown", default=None, help="Write the rows as a Markdown table.")
    parser.add_argument("--list", action="store_true", help="Only print the selected fabric names.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the bench; 0 if every run succeeded, 1 if some failed, 2 on bad arguments."""
    from rich.console import Console

    from synth.collectives import canonical_name
    from synth.errors import SynthError
    from synth.fileio import atomic_write_text
    from synth.topology.families import fabric_family
    from synth.topology.io import save_topology
    from synth.units import parse_size

    args = parse_args(argv)
    try:
        collectives = [canonical_name(c) for c in args.collectives.split(",") if c.strip()]
        parse_size(args.size)
        pattern = re.compile(args.filter) if args.filter else None
    except (SynthError, re.error) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("error: --timeout must be positive", file=sys.stderr)
        return 2
    specs = [s for s in fabric_family()
             if (pattern is None or pattern.search(s.name)) and (args.max_ranks is None or s.ranks <= args.max_ranks)]
    if args.list:
        for spec in specs:
            print(spec.name)
        return 0
    if not specs or not collectives:
        print("error: no fabric or collective selected", file=sys.stderr)
        return 2
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_fabrics-"))
    workdir.mkdir(parents=True, exist_ok=True)
    console = Console(highlight=False, width=max(sum(w for _, w, _ in SHOWN) + 2 * len(SHOWN), 80))
    console.print(f"{len(specs)} fabrics x {len(collectives)} collectives, SIZE {args.size}, method "
                  f"{args.method or 'default'}, work dir {workdir}", soft_wrap=True)
    print_row(console, None, header=True)
    rows: list[Row] = []
    for spec in specs:
        topo_file = save_topology(spec.build(), workdir / f"{spec.name}.yaml")
        for coll in collectives:
            row = run_one(spec.name, spec.ranks, topo_file, coll, args.size, args.method, args.timeout, workdir)
            rows.append(row)
            print_row(console, row, header=False)
    if args.csv:
        atomic_write_text(args.csv, to_csv(rows))
    if args.markdown:
        atomic_write_text(args.markdown, to_markdown(rows))
    failed = [r for r in rows if r.status != "ok"]
    if failed:
        console.print(f"{len(failed)} of {len(rows)} runs failed: " + "; ".join(
            f"{r.fabric} {r.collective}: {r.status} {r.message}".strip() for r in failed), soft_wrap=True)
    print(least_line(rows, collectives), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
