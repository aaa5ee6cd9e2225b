"""Issue 32: ``synth verify`` rejects what the MSCCL runtimes' loaders reject, and synth never writes it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from synth.program.load import load_program
from synth.program.msccl_xml import runtime_limit_errors
from synth.verification import verify

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "tests" / "fixtures").glob("*.xml")) + sorted(Path("/work/shared/fixtures").rglob("*.xml"))


def _synth(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "synth", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)


@pytest.fixture(scope="module")
def ring_xml(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("ring") / "ring.xml"
    done = _synth("synthesize", "-t", "dgx1", "-c", "allgather", "-m", "ring", "-s", "1MiB", "-o", str(out),
                  cwd=out.parent)
    assert done.returncode == 0, done.stderr
    return out.read_text()


def _first(pattern: str, replacement: str, text: str) -> str:
    changed = re.sub(pattern, replacement, text, count=1)
    assert changed != text, pattern
    return changed


# (name, pattern, replacement, needle): each mutation breaks exactly one loader check of docs/programs.md.
MUTATIONS = [
    ("dense tb ids", r'<tb id="1" ', '<tb id="1000000" ', "not dense from 0"),
    ("nchannels >= 1", r'nchannels="\d+"', 'nchannels="0"', "nchannels=0"),
    ("nchannels <= 32", r'nchannels="\d+"', 'nchannels="33"', "exceeds 32 channels"),
    ("chan < nchannels", r'nchannels="\d+"', 'nchannels="1"', "uses channel"),
    ("peer is not self", r'(<tb id="\d+" send=")\d+', r"\g<1>0", "equal to itself"),
    ("peer is a rank", r'(<tb id="\d+" send=")\d+', r"\g<1>8", "not a rank"),
    ("send needs a peer", r'(<tb id="\d+" send=")(\d+)(" recv="-1")', r"\g<1>-1\3", "no send peer"),
    ("cnt < 72", r'cnt="\d+"', 'cnt="72"', "cnt=72"),
    ("int16 offsets", r'(type="r" srcbuf="\w" srcoff="\d+" dstbuf="o" dstoff=")\d+', r"\g<1>40000",
     "int16 offset limit (32767)"),
    ("depid <= 127", r'depid="-1" deps="-1"', 'depid="200" deps="0"', "<= 127"),
    ("nchunksperloop >= 1", r'nchunksperloop="\d+"', 'nchunksperloop="0"', "nchunksperloop=0"),
    ("proto", r'proto="Simple"', 'proto="Fast"', "proto='Fast'"),
    ("byte range", r'minBytes="0" maxBytes="0"', 'minBytes="9" maxBytes="4"', "greater than maxBytes"),
    ("nthreads", r'<algo ', '<algo nthreads="33" ', "multiple of 32"),
]


@pytest.mark.parametrize("name, pattern, replacement, needle", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_verify_rejects_each_loader_check(ring_xml, tmp_path, name, pattern, replacement, needle):
    bad = tmp_path / "bad.xml"
    bad.write_text(_first(pattern, replacement, ring_xml))
    result = verify(load_program(bad), msccl_limits=True)
    assert not result.ok
    assert any(needle in e for e in result.errors), (name, result.errors[:3])


def test_steps_per_threadblock_and_collective(ring_xml, tmp_path):
    unnumbered = re.sub(r' s="\d+"', "", ring_xml)   # s then defaults to the position
    step = re.search(r'\n(\s*<step [^\n]*/>)', unnumbered).group(1)
    bad = tmp_path / "bad.xml"
    bad.write_text(unnumbered.replace(step, "\n".join([step] * 70), 1))
    result = verify(load_program(bad), msccl_limits=True)
    assert any("more than 64" in e for e in result.errors), result.errors[:3]
    good = tmp_path / "good.xml"
    good.write_text(ring_xml)
    odd = load_program(good).with_(collective="allfoo")   # verify itself refuses an unknown collective first
    assert any("neither MSCCL runtime" in e for e in runtime_limit_errors(odd))


def test_valid_program_verifies_and_cli_reports(ring_xml, tmp_path):
    good = tmp_path / "good.xml"
    good.write_text(ring_xml)
    assert verify(load_program(good), msccl_limits=True).ok
    bad = tmp_path / "bad.xml"
    bad.write_text(_first(r'nchannels="\d+"', 'nchannels="0"', ring_xml))
    done = _synth("verify", str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "nchannels=0" in done.stderr


@pytest.mark.parametrize("pattern, replacement, needle", [
    (r'ngpus="\d+"', 'ngpus="99999999999"', "ngpus="),
    (r'o_chunks="\d+"', 'o_chunks="99999999999"', "o_chunks="),
    (r'cnt="\d+"', 'cnt="99999999999"', "cnt="),
])
def test_huge_attributes_are_clear_errors(ring_xml, tmp_path, pattern, replacement, needle):
    bad = tmp_path / "huge.xml"
    bad.write_text(_first(pattern, replacement, ring_xml))
    done = _synth("verify", str(bad), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr and "cap" in done.stderr and "MemoryError" not in done.stderr


@pytest.mark.parametrize("args", [
    ("-t", "dgx1", "-c", "allgather", "-m", "ring", "--chunks", "8192", "-s", "1GiB"),
    ("-c", "alltoall", "-m", "direct", "--chunks", "8200", "-t", "fully-connected-8", "-s", "1GiB"),
])
def test_reported_command_lines_refuse_clearly(tmp_path, args):
    done = _synth("synthesize", *args, "-o", "x.xml", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "int16 offset limit (32767)" in done.stderr and "rank 0" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.xml").exists()


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_runtime_accepted_fixtures_still_verify(path):
    result = verify(load_program(path), msccl_limits=True)
    assert result.ok, result.errors[:3]
