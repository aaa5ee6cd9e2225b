"""Executing programs with in-network steps (Program.switches): one extra process emulates the switches
(synth/execution/plan.py, runner.py, worker.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from synth.execution import samples  # noqa: E402
from synth.execution.plan import ADD, BATCH, compile_plan  # noqa: E402
from synth.execution.runner import execute_many  # noqa: E402
from synth.program.ir import Gpu, Program, Step, SwitchOp, SwitchProgram, Threadblock, collective_of  # noqa: E402

# verify() learns switch steps on another branch (JSON v2); until then these runs skip it
RUN = {"iters": 2, "warmup": 1, "verify_first": False, "timeout": 60.0}


def test_nvls_plan_has_one_switch_process_that_reduces_and_multicasts():
    prog = samples.nvls_allreduce(4, chunks=3)
    plan = compile_plan(prog, collective_of(prog))
    assert not plan.stuck and not plan.unmatched_sends
    assert len(plan.ranks) == 4 and plan.switch_process is not None and plan.switch_process.rank == 4
    ops = plan.switch_process.ops
    # 4 ranks x 3 chunks in, three reduce ops of 4 inputs (3 adds each), one multicast (no add)
    assert sum(1 for op in ops if op[0] == ADD) == 3 * 3
    received = [e for op in ops if op[0] == BATCH for e in op[1] if e[0] == "recv"]
    sent = [e for op in ops if op[0] == BATCH for e in op[1] if e[0] == "send"]
    assert len(received) == 4 * 3 + 1 and len(sent) == 2 * 4 + 1 + 3
    for rank_plan in plan.ranks:   # every rank talks to process 4 only
        assert {e[1] for op in rank_plan.ops if op[0] == BATCH for e in op[1]} == {4}


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_nvls_allreduce_executes_and_matches_the_reference(dtype):
    programs = [samples.nvls_allreduce(2), samples.nvls_allreduce(2, chunks=4)]
    results = execute_many(programs, size_bytes=2 * 4 * 256, dtype=dtype, **RUN)
    for r in results:
        assert r.ok, r.errors
        assert r.ranks == 2 and r.time_us > 0 and len(r.times_us) == 2


def test_nvls_allreduce_on_4_ranks_with_a_plain_program_in_the_same_job():
    """A job mixing a switch program and a host-only one: the switch process idles for the latter."""
    results = execute_many([samples.nvls_allreduce(4), samples.direct_allreduce(4)], size_bytes=4 * 4 * 64,
                           dtype="float32", **RUN)
    assert [r.ok for r in results] == [True, True], [r.errors for r in results]
    assert all(r.ranks == 4 for r in results)


def test_a_wrong_switch_program_fails_the_check():
    """The first reduce leaves rank 3 out: rank 3's first chunk then feeds the next op, so the sums are
    wrong and one message is left over. The executor must say so, naming ranks and chunks."""
    prog = samples.nvls_allreduce(4)
    ops = prog.switches[0].ops
    bad = replace(prog, switches=(SwitchProgram("nvswitch", (SwitchOp("reduce", (0, 1, 2), (0, 1, 2, 3)),
                                                             *ops[1:])),))
    plan = compile_plan(bad, collective_of(bad))
    assert any("no switch op takes it" in u for u in plan.unmatched_sends)
    res = execute_many([bad], size_bytes=4 * 4 * 64, dtype="int32", **RUN)[0]
    assert not res.ok and any("rank" in e for e in res.errors)


def test_a_switch_op_that_never_gets_its_input_is_a_deadlock():
    prog = samples.nvls_allreduce(2)
    ops = prog.switches[0].ops
    waits = replace(prog, switches=(SwitchProgram("nvswitch", (*ops[:-1], SwitchOp("multicast", (1,), (0,)))),))
    plan = compile_plan(waits, collective_of(waits))
    assert any(line.startswith("switch 0 op 2 (multicast) waits for a message from rank 1") for line in plan.stuck)
    assert any("rank 1 tb 0 step 3 (r) waits for a message from switch 0" in line for line in plan.stuck)


def _two_switch_allreduce(n: int) -> Program:
    """Chunk 0 is reduced by switch 0 on channel 0, chunk 1 by switch 1 on channel 1 (two threadblocks per
    rank): both switches live in the one extra process, and their messages share its connections."""
    gpus = []
    for g in range(n):
        tbs = tuple(Threadblock(k, send=n + k, recv=n + k, chan=k, steps=(Step("s", "i", k, "i", k),
                                                                            Step("r", "o", k, "o", k)))
                    for k in range(2))
        gpus.append(Gpu(g, 2, 2, 0, tbs))
    ranks = tuple(range(n))
    switches = tuple(SwitchProgram(f"sw{k}", (SwitchOp("reduce", ranks, ranks, chan=k),)) for k in range(2))
    return Program(f"two_switch_allreduce_{n}", "allreduce", n, tuple(gpus), chunk_factor=2, switches=switches)


def test_two_switches_on_two_channels_execute():
    prog = _two_switch_allreduce(3)
    plan = compile_plan(prog, collective_of(prog))
    assert not plan.stuck and not plan.unmatched_sends and plan.switch_process.rank == 3
    res = execute_many([prog], size_bytes=2 * 4 * 64, dtype="int64", **RUN)[0]
    assert res.ok, res.errors


@pytest.mark.parametrize(("op", "needle"), [
    (SwitchOp("multicast", (0, 1), (0, 1)), "a multicast takes one source"),
    (SwitchOp("reduce", (0, 0), (0, 1)), "srcs must be distinct ranks 0..1"),
    (SwitchOp("reduce", (0, 1), (0, 2)), "dsts must be distinct ranks 0..1"),
    (SwitchOp("gather", (0, 1), (0, 1)), "unknown switch op type"),
])
def test_switch_ops_the_executor_cannot_run_are_refused(op, needle):
    from synth.errors import CheckFailed
    from synth.execution.runner import prepare

    prog = samples.nvls_allreduce(2)
    bad = replace(prog, switches=(SwitchProgram("nvswitch", (op, *prog.switches[0].ops[1:])),))
    with pytest.raises(CheckFailed, match=needle):
        prepare(bad, verify_first=False)
