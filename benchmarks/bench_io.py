"""Memory and CPU of writing, loading and verifying a large program (a ring allgather of ~1 M transfers).

Usage: ``python benchmarks/bench_io.py [--ranks 1024] [--chunks 1] [--phases ...] [--dir DIR]``.

Builds the ring allgather of ``benchmarks/bench_simulate.py`` (N ranks, C chunks: N·N·C steps, N(N-1)C
transfers) and runs each phase in a fresh child process, so that each peak resident set size
(``getrusage(RUSAGE_SELF).ru_maxrss``) is that phase's own: ``build`` (constructing the Program), ``write-xml``
and ``write-json`` (:func:`synth.program.load.save_program`, runtime limits not checked: a ring of
1024 ranks has more steps per threadblock than the MSCCL runtimes hold), ``load-xml`` and ``load-json``
(:func:`synth.api.load_program`) and ``verify`` (:func:`synth.verification.verify`). Prints, per phase, the CPU
seconds of the phase alone, the child's peak RSS and its RSS before the phase (the program built or the
interpreter with synth imported), and the file size for the writes. The write phases write to ``--dir``
(default: a temporary directory, removed afterwards); the load phases read what they wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("build", "write-xml", "write-json", "load-xml", "load-json", "verify")


def _maxrss_mib() -> float:
    """Peak RSS of this process in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _child(phase: str, ranks: int, chunks: int, directory: str) -> dict:
    """Run one phase in this (child) process; its CPU seconds and peak RSS."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_simulate import ring_allgather

    import synth.api as api
    from synth.program.load import save_program
    from synth.verification import verify

    stem = Path(directory) / f"ring_allgather_{ranks}x{chunks}"
    program = None
    if not phase.startswith("load"):
        c0 = time.process_time()
        program = ring_allgather(ranks, chunks)
        build_cpu = time.process_time() - c0
    before = _maxrss_mib()
    c0 = time.process_time()
    out: dict = {}
    if phase == "build":
        out["cpu_s"] = build_cpu
    elif phase.startswith("write"):
        path = stem.with_suffix("." + phase.split("-")[1])
        # the MSCCL runtimes' capacity limits (64 steps a threadblock) would refuse this program as XML
        save_program(program, path, check_limits=False)
        out["bytes"] = path.stat().st_size
    elif phase.startswith("load"):
        program = api.load_program(stem.with_suffix("." + phase.split("-")[1]))
        out["steps"] = program.num_steps()
    elif phase == "verify":
        result = verify(program)
        out["ok"] = result.ok
        if not result.ok:
            out["errors"] = result.errors[:3]
    out.setdefault("cpu_s", time.process_time() - c0)
    out.update(phase=phase, rss_before_mib=before, peak_rss_mib=_maxrss_mib())
    return out


def run_phase(phase: str, ranks: int, chunks: int, directory: str) -> dict:
    """One phase in a fresh interpreter; its measurements (a dict) or the child's error."""
    cmd = [sys.executable, __file__, "--child", phase, "--ranks", str(ranks), "--chunks", str(chunks),
           "--dir", directory]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{phase} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    parser.add_argument("--dir", default=None, help="where the write phases write (default: a temporary one)")
    parser.add_argument("--child", choices=PHASES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.ranks, args.chunks, args.dir)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or tmp
        os.makedirs(directory, exist_ok=True)
        steps = args.ranks * args.ranks * args.chunks
        print(f"ring allgather, {args.ranks} ranks x {args.chunks} chunks: {steps} steps, "
              f"{args.ranks * (args.ranks - 1) * args.chunks} transfers")
        print(f"{'phase':<11} {'cpu_s':>7} {'peak_MiB':>9} {'before_MiB':>10} {'file_MiB':>9}  note")
        for phase in args.phases:
            row = run_phase(phase, args.ranks, args.chunks, directory)
            size = f"{row['bytes'] / 2**20:9.3f}" if "bytes" in row else f"{'':9}"
            note = ""
            if "ok" in row:
                note = "ok" if row["ok"] else f"FAILED {row.get('errors')}"
            elif "steps" in row:
                note = f"{row['steps']} steps"
            print(f"{phase:<11} {row['cpu_s']:>7.2f} {row['peak_rss_mib']:>9.0f} {row['rss_before_mib']:>10.0f} "
                  f"{size}  {note}", flush=True)


if __name__ == "__main__":
    main()
