"""The real executor: programs run on gloo processes and every output chunk is checked.

Process start-up dominates, so each test batches several programs into one process-group launch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from synth.cli import cli  # noqa: E402
from synth.errors import CheckFailed, SynthError  # noqa: E402
from synth.execution import samples  # noqa: E402
from synth.execution.plan import BATCH, COPY, compile_plan  # noqa: E402
from synth.execution.runner import chunk_elems_for, execute, execute_many  # noqa: E402
from synth.program.ir import Gpu, Program, Step, Threadblock, collective_of  # noqa: E402
from synth.program.load import load_program  # noqa: E402
from synth.program.msccl_xml import program_to_xml  # noqa: E402
from synth.verification import verify  # noqa: E402

FIXTURES = Path("/work/shared/fixtures/msccl")
if not FIXTURES.exists():
    FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "msccl"
SMALL = 4 * 1024 * 3  # divisible by every chunk count used below


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


def _assert_all_ok(results):
    for r in results:
        assert r.ok, (r.program, r.errors)
        assert r.errors == []
        assert r.time_us > 0 and r.algbw_GBps > 0
        assert len(r.times_us) == r.iters


# ---- correct programs ------------------------------------------------------------------------

@pytest.mark.skipif(not FIXTURES.exists(), reason="msccl fixtures not available")
def test_every_msccl_fixture_executes_on_4_ranks():
    paths = sorted(FIXTURES.glob("*.xml"))
    programs = [load_program(p) for p in paths]
    programs = [p for p in programs if p.num_ranks == 4]
    assert len(programs) >= 4
    results = execute_many(programs, size_bytes=SMALL, iters=2, warmup=1, dtype="float32")
    _assert_all_ok(results)
    assert {r.collective for r in results} >= {"allgather", "allreduce", "alltoall"}
    assert all(r.ranks == 4 and r.backend == "gloo" for r in results)


LOCAL_FIXTURE = Path(__file__).parent / "fixtures" / "sccl_dgx1_allgather_steps2.xml"


@pytest.mark.skipif(not LOCAL_FIXTURE.exists(), reason="SCCL fixture not available")
def test_sccl_published_dgx1_allgather_executes_on_8_ranks():
    res = execute(load_program(LOCAL_FIXTURE), size_bytes=8 * 6 * 4 * 16, iters=1, warmup=0, dtype="int64")
    _assert_all_ok([res])
    assert res.ranks == 8


def test_hand_built_programs_for_all_eight_collectives_int32():
    programs = [samples.sample_program(c, 4) for c in samples.SAMPLES] + [samples.direct_allreduce(4)]
    results = execute_many(programs, size_bytes=SMALL, iters=1, warmup=0, dtype="int32")
    _assert_all_ok(results)
    assert sorted({r.collective for r in results}) == sorted(samples.SAMPLES)


def test_hand_built_programs_float_dtypes_on_3_ranks():
    """Odd rank count, float reductions within the documented tolerance, bf16/fp16 transport."""
    programs = [samples.sample_program(c, 3) for c in ("allreduce", "reducescatter", "reduce", "allgather")]
    for dtype in ("float64", "bfloat16"):
        results = execute_many(programs, size_bytes=3 * 8 * 64, iters=1, warmup=0, dtype=dtype)
        _assert_all_ok(results)


def test_ring_programs_on_8_ranks_and_repeated_iterations():
    programs = [samples.ring_allreduce(8, m=2), samples.ring_allgather(8), samples.direct_allreduce(8)]
    results = execute_many(programs, size_bytes=16 * 4 * 32, iters=3, warmup=1, dtype="float16")
    _assert_all_ok(results)
    assert results[0].busbw_GBps == pytest.approx(results[0].algbw_GBps * 2 * 7 / 8)


def _snapshot_broadcast() -> Program:
    """In-place 2-rank broadcast whose root overwrites chunk 0 right after sending it and restores
    it only after an echo from the leaf: correct only if the executor sends the value as of the
    send step (the real isend is posted after the overwrite)."""
    root = Gpu(0, 2, 0, 2, (
        Threadblock(0, send=1, recv=1, steps=(Step("s", "i", 0, "i", 0, hasdep=True),
                                              Step("r", "s", 1, "s", 1, hasdep=True),
                                              Step("s", "i", 1, "i", 1, depid=1, deps=2))),
        Threadblock(1, steps=(Step("cpy", "i", 0, "s", 0, depid=0, deps=0),
                              Step("cpy", "i", 1, "i", 0),
                              Step("cpy", "s", 0, "i", 0, depid=0, deps=1, hasdep=True))),
    ))
    leaf = Gpu(1, 2, 0, 0, (Threadblock(0, send=0, recv=0, steps=(
        Step("r", "i", 0, "i", 0), Step("s", "i", 0, "s", 1), Step("r", "i", 1, "i", 1))),))
    return Program("snapshot_broadcast", "broadcast", 2, (root, leaf), inplace=True, chunk_factor=2)


def test_send_source_overwritten_before_post_is_snapshotted_and_runs_correctly():
    prog = _snapshot_broadcast()
    plan = compile_plan(prog, collective_of(prog))
    assert plan.ranks[0].temps == (1,)
    assert verify(prog).ok
    ops = plan.ranks[0].ops
    snap = ops.index((COPY, (0, 0, 1), ("i", 0, 1)))
    batch = next(k for k, op in enumerate(ops) if op[0] == BATCH)
    assert snap < batch and ("send", 1, (0, 0, 1), 0) in ops[batch][1]
    _assert_all_ok([execute(prog, size_bytes=2 * 4 * 16, iters=1, warmup=0, dtype="int64")])


# ---- plan properties (no processes) --------------------------------------------------------------

def _interpret(plan):
    """Run a plan symbolically (chunk contents = sets of contributions) with NCCL matching: per
    (src, dst) pair in posting order, tags ignored. Returns each rank's output chunks."""
    coll = plan.collective
    state = []
    for rp in plan.ranks:
        bufs = {b: [None] * c for b, c in rp.buffers.items()}
        bufs.update({t: [None] * c for t, c in enumerate(rp.temps)})
        state.append(bufs)

    def resolve(rank, buf, off):
        rp = plan.ranks[rank]
        if buf in rp.aliases:
            tgt, base = rp.aliases[buf]
            return tgt, base + off
        return buf, off

    for (r, slot), c in coll.precondition.items():
        b, o = resolve(r, "i", slot)
        state[r][b][o] = frozenset({c})

    def get(r, reg):
        return list(state[r][reg[0]][reg[1]:reg[1] + reg[2]])

    def put(r, reg, vals):
        state[r][reg[0]][reg[1]:reg[1] + reg[2]] = vals

    queues, pcs, posted = {}, [0] * len(plan.ranks), [False] * len(plan.ranks)
    while any(pc < len(rp.ops) for pc, rp in zip(pcs, plan.ranks)):
        progress = False
        for r, rp in enumerate(plan.ranks):
            while pcs[r] < len(rp.ops):
                op = rp.ops[pcs[r]]
                if op[0] == COPY:
                    put(r, op[1], get(r, op[2]))
                elif op[0] != BATCH:
                    a, b = get(r, op[2]), get(r, op[3])
                    assert all(x and y and not (x & y) for x, y in zip(a, b)), "double-counted contribution"
                    put(r, op[1], [x | y for x, y in zip(a, b)])
                else:
                    if not posted[r]:
                        for kind, peer, reg, _ in op[1]:
                            if kind == "send":
                                queues.setdefault((r, peer), []).append(get(r, reg))
                        posted[r] = True
                    recvs = [(peer, reg) for kind, peer, reg, _ in op[1] if kind == "recv"]
                    need = {}
                    for peer, _ in recvs:
                        need[peer] = need.get(peer, 0) + 1
                    if any(len(queues.get((peer, r), [])) < k for peer, k in need.items()):
                        break
                    for peer, reg in recvs:
                        put(r, reg, queues[(peer, r)].pop(0))
                    posted[r] = False
                pcs[r] += 1
                progress = True
        assert progress, "plan deadlocks"
    assert not any(queues.values()), "messages left unreceived"
    out = {}
    for (r, slot) in coll.postcondition:
        b, o = resolve(r, "o", slot)
        out[(r, slot)] = state[r][b][o]
    return out


@pytest.mark.parametrize("prog", [samples.direct_allreduce(4), samples.ring_allreduce(5, m=2),
                                  samples.direct_gather(4, root=2), samples.chain_reduce(4, root=1),
                                  _snapshot_broadcast()] + [load_program(p) for p in sorted(FIXTURES.glob("*.xml"))],
                         ids=lambda p: p.name)
def test_plan_computes_the_collective_under_nccl_order_matching(prog):
    """Both ends of every pair post in the same order, snapshots and temporaries are right."""
    coll = collective_of(prog)
    plan = compile_plan(prog, coll)
    assert not plan.stuck and not plan.unmatched_sends
    assert _interpret(plan) == coll.postcondition


@pytest.mark.skipif(not FIXTURES.exists(), reason="msccl fixtures not available")
def test_inplace_aliasing_allocates_only_the_aliased_buffer():
    prog = load_program(FIXTURES / "allgather_ring_4.xml")  # in place: i is o[r]
    plan = compile_plan(prog, collective_of(prog))
    for r, rp in enumerate(plan.ranks):
        assert rp.buffers == {"o": 4} and rp.aliases == {"i": ("o", r)}
    ar = compile_plan(samples.ring_allreduce(4), collective_of(samples.ring_allreduce(4)))
    assert ar.ranks[1].buffers == {"i": 4} and ar.ranks[1].aliases == {"o": ("i", 0)}


def test_size_rounding_and_too_small():
    coll = collective_of(samples.ring_allgather(4))
    assert chunk_elems_for(coll, 1 << 20, "float32") == (65536, 1 << 20, None)
    elems, actual, note = chunk_elems_for(coll, 1000, "int64")
    assert (elems, actual) == (31, 992) and "rounded down to 992" in note
    with pytest.raises(SynthError, match="at least 16 B"):
        chunk_elems_for(coll, 3, "float32")


def test_torchrun_world_size_must_match(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SynthError, match="world size is 2 but the program has 4 ranks"):
        execute(samples.ring_allgather(4), size_bytes=SMALL)


# ---- CLI: JSON, refusals, wrong output, hangs ------------------------------------------------------

def _broken_allgather(tmp_path: Path) -> Path:
    """Ring allgather whose last receive on rank 2 lands in the wrong output slot."""
    prog = samples.ring_allgather(4)
    gpu = prog.gpus[2]
    tb = gpu.threadblocks[0]
    last = tb.steps[-1]
    moved = replace(last, srcoff=(last.dstoff + 1) % 4, dstoff=(last.dstoff + 1) % 4)
    tb = replace(tb, steps=tb.steps[:-1] + (moved,))
    prog = replace(prog, gpus=prog.gpus[:2] + (replace(gpu, threadblocks=(tb,)),) + prog.gpus[3:])
    path = tmp_path / "broken.xml"
    path.write_text(program_to_xml(prog))
    return path


def test_cli_json_keys_and_success(tmp_path):
    path = tmp_path / "ring.xml"
    path.write_text(program_to_xml(samples.ring_allreduce(4)))
    res = _cli("execute", str(path), "-s", "64KiB", "--iters", "2", "--dtype", "int32", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("ok", "backend", "ranks", "time_us", "algbw_GBps", "busbw_GBps", "errors"):
        assert key in out
    assert out["ok"] is True and out["ranks"] == 4 and out["size_bytes"] == 65536
    assert out["algbw_GBps"] == pytest.approx(65536 / (out["time_us"] * 1e3))


def test_cli_wrong_output_names_rank_and_chunk(tmp_path):
    path = _broken_allgather(tmp_path)
    refused = _cli("execute", str(path), "-s", "4KiB")
    assert refused.exit_code == 1 and "verify failed" in refused.output
    res = _cli("execute", str(path), "-s", "4KiB", "--no-verify", "--iters", "1", "--json")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["ok"] is False
    assert any(e.startswith("rank 2 output chunk 0:") for e in out["errors"])
    assert any(e.startswith("rank 2 output chunk 3:") for e in out["errors"])
    assert all(e.startswith("rank 2 ") for e in out["errors"])  # other ranks are right
    text = _cli("execute", str(path), "-s", "4KiB", "--no-verify", "--iters", "1")
    assert text.exit_code == 1 and "check failed: rank 2 output chunk" in text.output


def test_float_reduction_with_a_wrong_operand_is_caught_within_tolerance():
    """Rank 0 starts the ring with block 1 instead of block 0: every rank's block 0 misses one
    contribution and has an extra one; bfloat16's tolerance must still flag it."""
    prog = samples.ring_allreduce(4)
    gpu = prog.gpus[0]
    tb = gpu.threadblocks[0]
    first = replace(tb.steps[0], srcoff=1, dstoff=1)
    prog = replace(prog, gpus=(replace(gpu, threadblocks=(replace(tb, steps=(first,) + tb.steps[1:]),)),)
                   + prog.gpus[1:])
    res = execute(prog, verify_first=False, size_bytes=4 * 2 * 256, iters=1, warmup=0, dtype="bfloat16")
    assert not res.ok
    assert {e.split(":")[0] for e in res.errors} == {f"rank {r} output chunk 0" for r in range(4)}


def test_send_without_receive_fails_the_run():
    prog = samples.ring_allgather(4)
    gpu = prog.gpus[0]
    tb = gpu.threadblocks[0]
    tb = replace(tb, steps=tb.steps + (Step("s", "i", 0, "o", 0),))
    prog = replace(prog, gpus=(replace(gpu, threadblocks=(tb,)),) + prog.gpus[1:])
    plan = compile_plan(prog, collective_of(prog))
    assert plan.unmatched_sends == ("rank 0 tb 0 step 5 sends to rank 1 on channel 0 but no receive takes it",)
    with pytest.raises(CheckFailed, match="verify failed"):
        execute(prog, size_bytes=4096)
    res = execute(prog, size_bytes=4096, verify_first=False, iters=1, warmup=0)
    assert not res.ok and res.errors == list(plan.unmatched_sends)  # outputs themselves are right


def test_cli_hanging_program_is_killed_after_timeout(tmp_path):
    prog = samples.ring_allgather(4)
    gpu = prog.gpus[0]
    tb = gpu.threadblocks[0]
    tb = replace(tb, steps=tuple(s for s in tb.steps if s.type != "s"))  # rank 1 waits forever
    prog = replace(prog, gpus=(replace(gpu, threadblocks=(tb,)),) + prog.gpus[1:])
    path = tmp_path / "hang.xml"
    path.write_text(program_to_xml(prog))
    start = time.monotonic()
    res = _cli("execute", str(path), "-s", "4KiB", "--no-verify", "--timeout", "10")
    took = time.monotonic() - start
    assert res.exit_code == 1
    assert "timed out after 10 s" in res.output and "rank 1 tb 0" in res.output
    assert 10 <= took < 40
    with pytest.raises(CheckFailed, match="verify failed"):
        execute(prog, size_bytes=4096)


def test_cli_bad_input_exit_2(tmp_path):
    path = tmp_path / "ring.xml"
    path.write_text(program_to_xml(samples.ring_allgather(4)))
    assert _cli("execute", str(path), "-s", "3").exit_code == 2
    assert _cli("execute", str(path), "--iters", "0").exit_code == 2
    assert _cli("execute", str(tmp_path / "missing.xml")).exit_code == 2


# ---- NCCL (GPU machines only) ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_backend_runs_ring_programs():
    n = min(torch.cuda.device_count(), 8)
    if n < 2:
        pytest.skip("needs at least 2 GPUs")
    programs = [samples.ring_allreduce(n), samples.ring_allgather(n), samples.direct_alltoall(n)]
    results = execute_many(programs, backend="nccl", size_bytes=n * 4 * 1024, iters=2, dtype="float32")
    _assert_all_ok(results)
    assert all(r.backend == "nccl" for r in results)


# ---- programs written by the synthesis pipeline ----------------------------------------------------

FAST_METHODS = ("ring", "trees", "greedy", "dbt", "rdh", "direct", "nccl")


def test_synthesized_dgx1_programs_execute_correctly():
    """Every collective each fast registered method supports, synthesized for dgx1 (8 GPUs),
    then executed on 8 gloo ranks in one launch (a method that declines an instance is skipped:
    that is the synthesizer's business, not the executor's)."""
    pipeline = pytest.importorskip("synth.pipeline")
    from synth.synthesis.registry import METHODS

    programs = []
    for method in FAST_METHODS:
        if method not in METHODS:
            continue
        for coll in sorted(METHODS[method].collectives):
            try:
                programs.append(pipeline.synthesize("dgx1", coll, 1 << 20, method=method).program)
            except SynthError:
                continue
    if not programs:
        pytest.skip("no fast synthesis method registered yet")
    results = execute_many(programs, size_bytes=1 << 20, iters=1, warmup=0, dtype="int32", timeout=600)
    _assert_all_ok(results)
    assert all(r.ranks == 8 for r in results)
    assert {r.collective for r in results} == set(samples.SAMPLES)


@pytest.mark.skipif(shutil.which("torchrun") is None or shutil.which("synth") is None, reason="needs torchrun")
def test_torchrun_launch_uses_the_torchrun_world(tmp_path):
    """The multi-node path: torchrun starts the ranks, each runs `synth execute`, rank 0 reports."""
    path = tmp_path / "ring2.xml"
    path.write_text(program_to_xml(samples.ring_allreduce(2)))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--no-python",
                           "synth", "execute", str(path), "-s", "64KiB", "--iters", "2", "--json"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count('"ok"') == 1  # only rank 0 prints
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["ranks"] == 2 and out["errors"] == []


def test_lp_alltoall_in_rounds_of_circuits_executes_on_16_ranks():
    """dgx-a100-2node: lp's alltoall runs its IB traffic in rounds of disjoint circuits, ordered on each
    uplink by cross-threadblock dependencies and relayed through ranks; the real processes exchange
    every chunk correctly and nothing deadlocks."""
    pipeline = pytest.importorskip("synth.pipeline")
    result = pipeline.synthesize("dgx-a100-2node", "alltoall", 4 << 20, method="lp")
    assert result.schedule.notes["priority"] == "rounds"
    assert any(step.depid >= 0 for gpu in result.program.gpus for tb in gpu.threadblocks for step in tb.steps)
    results = execute_many([result.program], size_bytes=4 << 20, iters=1, warmup=0, dtype="int32", timeout=600)
    _assert_all_ok(results)
    assert results[0].ranks == 16


def test_out_of_place_reductions_keep_their_input_after_a_run():
    # issue 32: the executor compares every rank's input bytes after the run (docs/programs.md, "Input buffer")
    from test_keep_input import _lowered, _mutated

    good = [_lowered("ring-8", name, "ring", 2) for name in ("reducescatter", "allreduce", "reduce")]
    bad, _ = _mutated(good[1])
    results = execute_many([*good, bad], size_bytes=4 * 8 * 2 * 64, iters=1, warmup=0, verify_first=False)
    _assert_all_ok(results[:3])
    assert not results[3].ok
    assert any("input chunk" in e and "changed by an out-of-place program" in e for e in results[3].errors)
