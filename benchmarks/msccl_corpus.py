"""Third-party programs: MSCCL XML written by msccl-tools' own MSCCLang examples, through synth.

Usage: python benchmarks/msccl_corpus.py --msccl-tools DIR [--python PY] [--size 64M] [--execute] [--keep DIR]

``DIR`` is a checkout of microsoft/msccl-tools; ``PY`` a Python that can ``import msccl`` (its
dependencies: lxml, z3-solver, igraph, humanfriendly, tabulate). Each example in ``EXAMPLES`` is
run with its command-line arguments and its stdout taken as the XML. Every program that comes out
is checked the way a user would: ``synth verify``, ``synth simulate`` on a built-in topology with
as many ranks (a fully-connected one otherwise) and, with ``--execute``, ``synth execute`` on gloo.
Nothing here is synth's own output, so it shows what the importer, verifier, simulator and
executor make of programs written elsewhere. Examples whose generator fails, or prints text
after its XML, are reported as such (msccl-tools' own checks print there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# (name, example script under examples/mscclang, its arguments)
EXAMPLES = [
    ("allgather_a100_pcie", "allgather_a100_pcie.py", ["4", "1"]),
    ("allgather_allpairs", "allgather_allpairs.py", ["8", "2"]),
    ("allgather_recursive_doubling", "allgather_recursive_doubling.py", ["8", "1"]),
    ("allgather_ring_4ch_2inst", "allgather_ring.py", ["8", "4", "2"]),
    ("allgather_ring_simple", "allgather_ring.py", ["8", "1", "1", "--protocol", "Simple"]),
    ("allreduce_1step", "allreduce_1step.py", ["8", "1"]),
    ("allreduce_a100_allpairs", "allreduce_a100_allpairs.py", ["8", "2"]),
    ("allreduce_a100_allpairs_v2", "allreduce_a100_allpairs_v2.py", ["8", "1"]),
    ("allreduce_multinode_allpairs", "allreduce_a100_multinode_allpairs.py", ["8", "1"]),
    ("allreduce_ncv4", "allreduce_a100_ncv4.py", ["4", "1"]),
    ("allreduce_ncv4_v2", "allreduce_a100_ncv4_v2.py", ["4", "1"]),
    ("allreduce_pcie_hierarchical", "allreduce_a100_pcie_hierarchical.py", ["4", "1"]),
    ("allreduce_a100_ring", "allreduce_a100_ring.py", ["8", "4", "1"]),
    ("allreduce_recursive_doubling_halving", "allreduce_recursive_doubling_halving.py", ["8", "1"]),
    ("alltoall_three_step", "alltoall_a100_three_step.py", ["2", "4", "1"]),
    ("alltoall_two_step", "alltoall_a100_two_step.py", ["2", "4"]),
    ("alltoall_allpairs", "alltoall_allpairs.py", ["8", "1"]),
    ("hierarchical_allreduce", "hierarchical_allreduce.py", ["4", "2", "1"]),
    ("pipeline_a100_allpairs", "pipeline_a100_allpairs.py", ["8", "1"]),
    ("pipeline_a100_ring", "pipeline_a100_ring.py", ["8", "2", "1"]),
    ("simple_allreduce_ring", "simple/allreduce_ring.py", ["8", "1"]),
    ("simple_allgather_ring", "simple/allgather_ring.py", []),
]

TOPOLOGY_FOR_RANKS = {8: "dgx-a100", 16: "dgx-a100-2node"}


def _synth(*args: str, timeout: int = 600) -> tuple[int, dict | str]:
    done = subprocess.run([sys.executable, "-m", "synth", *args, "--json"], capture_output=True, text=True,
                          timeout=timeout)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done.returncode, (done.stderr.strip().splitlines() or ["no output"])[-1]


def _generate(python: str, tools: str, script: str, args: list[str], out: str) -> str | None:
    """Run one example; None on success, else why not."""
    done = subprocess.run([python, os.path.join(tools, "examples", "mscclang", script), *args],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return "generator failed: " + ((done.stderr.strip().splitlines() or ["?"])[-1])[:100]
    text = done.stdout
    end = text.rfind("</algo>")
    if end < 0:
        return "generator wrote no <algo>"
    if text[end + len("</algo>"):].strip():
        return "generator printed text after the XML: " + text[end + len("</algo>"):].strip().splitlines()[0][:80]
    with open(out, "w") as handle:
        handle.write(text)
    return None


def _topology_for(ranks: int, workdir: str) -> str:
    if ranks in TOPOLOGY_FOR_RANKS:
        return TOPOLOGY_FOR_RANKS[ranks]
    path = os.path.join(workdir, f"fc{ranks}.yaml")
    if not os.path.exists(path):
        subprocess.run([sys.executable, "-m", "synth", "topology", "generate", "fully-connected", "--ranks",
                        str(ranks), "-o", path], check=True, capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--msccl-tools", required=True, help="checkout of microsoft/msccl-tools")
    parser.add_argument("--python", default=sys.executable, help="a Python that can import msccl")
    parser.add_argument("--size", default="64M")
    parser.add_argument("--execute", action="store_true", help="also run each program on gloo (1 MB)")
    parser.add_argument("--keep", help="write the generated XML here")
    args = parser.parse_args()
    workdir = args.keep or tempfile.mkdtemp(prefix="msccl-corpus-")
    os.makedirs(workdir, exist_ok=True)
    print(f"{'program':38} {'coll':13} {'ranks':>5}  {'verify':24} {'sim us':>9}  {'execute':8}")
    counts = {"verified": 0, "programs": 0}
    for name, script, script_args in EXAMPLES:
        path = os.path.join(workdir, name + ".xml")
        why = _generate(args.python, args.msccl_tools, script, script_args, path)
        if why is not None:
            print(f"{name:38} {why}")
            continue
        counts["programs"] += 1
        with open(path) as handle:
            head = handle.read(400)
        coll = (re.search(r'coll="([^"]*)"', head) or [None, "?"])[1]
        ranks = int((re.search(r'ngpus="(\d+)"', head) or [None, "0"])[1])
        rc, verified = _synth("verify", path)
        verdict = ("ok" if verified["ok"] else "FAILS: " + verified["errors"][0][:16]) if isinstance(
            verified, dict) else f"rc {rc}: {verified[:18]}"
        counts["verified"] += isinstance(verified, dict) and verified["ok"]
        rc, simulated = _synth("simulate", path, "-t", _topology_for(ranks, workdir), "-s", args.size)
        sim = f"{simulated['time_us']:9.1f}" if isinstance(simulated, dict) else f"rc {rc}"
        executed = ""
        if args.execute and isinstance(verified, dict) and verified["ok"]:
            rc, run = _synth("execute", path, "--backend", "gloo", "-s", "1M", "--iters", "2")
            executed = ("ok" if run["ok"] else "FAILS") if isinstance(run, dict) else f"rc {rc}"
        print(f"{name:38} {coll:13} {ranks:5d}  {verdict:24} {sim:>9}  {executed:8}")
    print(f"{counts['verified']} of {counts['programs']} generated programs verify; XML in {workdir}")


if __name__ == "__main__":
    main()
