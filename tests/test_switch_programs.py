"""Programs with in-network steps (issue 35, docs/programs.md "Switch steps"): JSON version 2, the MSCCL XML
export's refusal, the verifier's data flow and structure checks, and the simulator's timing of switch ops."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from synth.cli import cli
from synth.errors import SynthError
from synth.program.ir import Gpu, Program, Step, SwitchOp, SwitchProgram, Threadblock
from synth.program.json_io import program_from_dict, program_from_json, program_to_dict, program_to_json
from synth.program.load import load_program, save_program
from synth.program.msccl_xml import program_to_xml
from synth.simulation import simulate
from synth.topology import generators as gen
from synth.topology.model import SwitchFeatures
from synth.verification import verify

BW, ALPHA = 450.0, 0.7
NVLS = SwitchFeatures(reduce=True, multicast=True)


def featured(n: int = 4, features: SwitchFeatures = NVLS, bw: float = BW, alpha: float = ALPHA):
    """A star of ``n`` ranks on switch ``switch`` that declares ``features``."""
    return replace(gen.star(n, bw=bw, alpha=alpha), features=(("switch", features),))


def allreduce(n: int = 4, chunks: int = 2, inplace: bool = False) -> Program:
    """Reduce-to-switch allreduce written out by hand: op j = reduce(all -> all) of chunk j; one threadblock per
    rank sends its chunks to the switch (peer n) and receives the sums."""
    everyone = tuple(range(n))
    gpus = tuple(Gpu(r, chunks, chunks, 0, (Threadblock(0, n, n, 0, tuple(
        [Step("s", "i", j, "i", j) for j in range(chunks)] + [Step("r", "o", 0, "o", j) for j in range(chunks)])),))
        for r in range(n))
    ops = tuple(SwitchOp("reduce", everyone, everyone, 1, 0) for _ in range(chunks))
    return Program(name="ar-switch", collective="allreduce", num_ranks=n, gpus=gpus, inplace=inplace,
                   chunk_factor=chunks, nchunksperloop=chunks, switches=(SwitchProgram("switch", ops),))


def with_ops(program: Program, *ops: SwitchOp) -> Program:
    return program.with_(switches=(SwitchProgram(program.switches[0].name, tuple(ops)),))


def with_steps(program: Program, rank: int, steps: list[Step]) -> Program:
    gpus = list(program.gpus)
    tb = gpus[rank].threadblocks[0]
    gpus[rank] = replace(gpus[rank], threadblocks=(replace(tb, steps=tuple(steps)),))
    return program.with_(gpus=tuple(gpus))


# ---- JSON version 2 ----------------------------------------------------------------------------------
def test_json_v2_round_trips_and_plain_programs_stay_version_1():
    program = allreduce()
    doc = program_to_dict(program)
    assert doc["version"] == 2
    assert doc["switches"] == [{"name": "switch", "ops": [["reduce", [0, 1, 2, 3], [0, 1, 2, 3], 1, 0]] * 2}]
    assert program_from_json(program_to_json(program)) == program
    plain = program.with_(switches=())
    text = program_to_json(plain)
    assert json.loads(text)["version"] == 1 and '"switches"' not in text


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(version=1), "\"switches\" needs \"version\": 2"),
    (lambda d: d.update(version=3), "version 3 is not supported"),
    (lambda d: d["switches"][0]["ops"][0].__setitem__(0, "gather"), "invalid JSON program at switches/0/ops/0/0"),
    (lambda d: d["switches"][0]["ops"][0].__setitem__(3, 0), "invalid JSON program at switches/0/ops/0/3"),
    (lambda d: d["switches"][0]["ops"][0].__setitem__(1, [0, 9]), "op 0: srcs member 9 is not a rank (0..3)"),
    (lambda d: d["switches"][0]["ops"][0].__setitem__(2, [1, 1]), "op 0: dsts names a rank twice"),
    (lambda d: d["switches"][0]["ops"][0].__setitem__(0, "multicast"), "a multicast has one src, not 4"),
    (lambda d: d["switches"].append(dict(d["switches"][0])), "switch named twice"),
    (lambda d: d["gpus"][2]["threadblocks"][0].update(send=5), "gpu 2 tb 0: send peer 5 is not a rank (0..3) nor "
                                                               "a switch (4..4"),
])
def test_hostile_json_v2_is_refused_with_one_line(edit, message):
    doc = program_to_dict(allreduce())
    edit(doc)
    with pytest.raises(SynthError, match="^x.json: ") as info:
        program_from_dict(doc, "x.json")
    assert message in str(info.value) and "\n" not in str(info.value)


# ---- MSCCL XML refuses ---------------------------------------------------------------------------------
def test_xml_export_refuses_switch_steps_with_one_line_and_writes_nothing(tmp_path):
    program = allreduce(chunks=3)
    expected = ("MSCCL XML cannot express in-network steps (3 reduce and 0 multicast ops on switch switch); "
                "write a .json program")
    with pytest.raises(SynthError) as info:
        program_to_xml(program)
    assert str(info.value) == expected
    with pytest.raises(SynthError, match="cannot express in-network steps"):
        save_program(program, tmp_path / "p.xml")
    assert not (tmp_path / "p.xml").exists()
    assert load_program(save_program(program, tmp_path / "p.json")) == program


def test_convert_to_xml_exits_2_with_one_line(tmp_path):
    src = save_program(allreduce(), tmp_path / "p.json")
    res = CliRunner().invoke(cli, ["convert", str(src), "-o", str(tmp_path / "p.xml")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "MSCCL XML cannot express in-network steps (2 reduce and 0 multicast" in lines[0]
    assert not (tmp_path / "p.xml").exists()
    res = CliRunner().invoke(cli, ["verify", str(src)])
    assert res.exit_code == 0, res.output


# ---- verification ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("inplace", [False, True])
def test_switch_allreduce_verifies_with_and_without_the_fabric(inplace):
    program = allreduce(inplace=inplace)
    assert verify(program).ok
    assert verify(program, topology=featured()).ok


def _first_error(program: Program, **kw) -> str:
    result = verify(program, **kw)
    assert not result.ok
    return result.errors[0]


def test_reduce_over_the_wrong_ranks_fails_the_postcondition():
    program = with_ops(allreduce(chunks=1), SwitchOp("reduce", (0, 1, 2), (0, 1, 2, 3), 1, 0))
    errors = verify(program).errors
    assert any("rank 3 sends 1 messages to switch switch on channel 0 but 0 ops name it" in e for e in errors), errors
    quiet = with_steps(program, 3, [Step("r", "o", 0, "o", 0)])   # rank 3 left out of the sum altogether
    errors = verify(quiet).errors
    assert errors and all("missing ranks [3]" in e for e in errors), errors


def test_a_double_counting_reduce_is_named():
    n = 3
    program = allreduce(n, chunks=1)
    # rank 0 sends its chunk twice: ops 0 and 1 both reduce it, op 1's sum then goes into a reduce with rank 1
    ops = (SwitchOp("reduce", (0, 1), (0,), 1, 0), SwitchOp("reduce", (0, 1, 2), (0, 1, 2), 1, 0))
    steps0 = [Step("s", "i", 0, "i", 0), Step("r", "o", 0, "o", 0), Step("s", "o", 0, "o", 0),
              Step("r", "o", 0, "o", 0)]
    bad = with_steps(with_ops(program, *ops), 0, steps0)
    bad = with_steps(bad, 1, [Step("s", "i", 0, "i", 0), Step("s", "i", 0, "i", 0), Step("r", "o", 0, "o", 0)])
    errors = verify(bad).errors
    assert any("switch switch op 1 (reduce): chunk 0 double counts ranks [1]" in e for e in errors), errors


def test_counts_links_and_features_are_checked_against_the_fabric():
    program = allreduce(chunks=1)
    assert "rank 0 sends it cnt=1 but the op has cnt=2" in _first_error(
        with_ops(program, SwitchOp("reduce", (0, 1, 2, 3), (0, 1, 2, 3), 2, 0)))
    plain = featured(features=SwitchFeatures(multicast=True))
    assert _first_error(program, topology=plain) == ("switch switch: the program gives it reduce ops but the fabric "
                                                     "star-4 does not declare reduce: true for it")
    cut = replace(featured(), links=tuple(link for link in featured().links if (link.src, link.dst) != (4, 2)))
    assert "op 0: dst rank 2 has no link from the switch in the fabric" in _first_error(program, topology=cut)
    renamed = replace(program, switches=(SwitchProgram("nvs", program.switches[0].ops),))
    assert "switch nvs: not a switch of the fabric star-4 (switch)" in _first_error(renamed, topology=featured())


def test_a_receive_with_no_op_behind_it_is_reported():
    program = allreduce(chunks=1)
    extra = with_steps(program, 3, [Step("s", "i", 0, "i", 0), Step("r", "o", 0, "o", 0), Step("r", "o", 0, "o", 0)])
    errors = verify(extra).errors
    assert any("rank 3 receives 2 messages from switch switch on channel 0 but 1 ops" in e for e in errors), errors


def test_race_check_follows_switch_edges():
    # in place, a second threadblock receives the sums into the slots the first one sends from: ordered only
    # through the switch (every sum needs the rank's own message), so no race
    n, c = 3, 2
    everyone = tuple(range(n))
    gpus = tuple(Gpu(r, c, c, 0, (Threadblock(0, n, -1, 0, tuple(Step("s", "i", j, "i", j) for j in range(c))),
                                  Threadblock(1, -1, n, 0, tuple(Step("r", "o", 0, "o", j) for j in range(c)))))
                 for r in range(n))
    program = Program("split", "allreduce", n, gpus, inplace=True, chunk_factor=c, nchunksperloop=c,
                      switches=(SwitchProgram("switch", tuple(SwitchOp("reduce", everyone, everyone, 1, 0)
                                                              for _ in range(c))),))
    assert verify(program).ok, verify(program).errors


# ---- simulation -----------------------------------------------------------------------------------------
def test_switch_ops_are_timed_on_the_links_and_the_engine():
    """Cut-through (simulation docstring): a stage inside the switch starts on its input's first bytes and ends no
    earlier than its input's last bytes plus its own α."""
    size = 8e6
    program = allreduce(chunks=1)
    data = size / (BW * 1e3)
    t = simulate(program, featured(), size).time_us
    assert t == pytest.approx(2 * ALPHA + data)   # in on the rank->switch link, out as the bytes come in
    engine = SwitchFeatures(reduce=True, reduce_alpha=3.0, reduce_bw=200.0)
    slow = size / 200e3
    assert slow > data
    # the engine (slower than the links) starts at the first bytes in and sets the pace: out ends its α after it
    engine_end = ALPHA + 3.0 + slow
    t2 = simulate(program, featured(features=engine), size).time_us
    assert t2 == pytest.approx(engine_end + ALPHA)
    two = allreduce(chunks=2)   # the engine serves one op at a time: op 1 waits for op 0 on it
    red = 3.0 + slow / 2
    assert simulate(two, featured(features=engine), size).time_us == pytest.approx(ALPHA + 2 * red + ALPHA)


def test_pipelined_switch_allreduce_nears_size_over_bw():
    size = float(1 << 30)
    ideal = size / (BW * 1e3)
    t = simulate(allreduce(8, chunks=58), featured(8), size).time_us
    assert t == pytest.approx(59 * ALPHA + ideal, rel=1e-9)   # 58 α on each uplink, the last chunk's way out
    one = simulate(allreduce(8, chunks=1), featured(8), size).time_us
    assert one == pytest.approx(2 * ALPHA + ideal, rel=1e-9)  # cut-through: no pipeline needed
    assert 1.0 < one / ideal < 1.001


def test_simulation_refuses_a_switch_that_does_not_reduce():
    with pytest.raises(SynthError, match="op 0 is a reduce but the topology does not declare reduce on it"):
        simulate(allreduce(), featured(features=SwitchFeatures(multicast=True)), 1e6)
    with pytest.raises(SynthError, match="switch 'nvs' is not a switch of topology"):
        simulate(allreduce().with_(switches=(SwitchProgram("nvs", allreduce().switches[0].ops),)), featured(), 1e6)


def test_multicast_needs_the_feature_and_a_src_link():
    n = 3
    # rank 0 multicasts its chunk to 1 and 2 (a broadcast through the switch)
    gpus = (Gpu(0, 1, 1, 0, (Threadblock(0, n, -1, 0, (Step("s", "i", 0, "i", 0),)),)),
            *(Gpu(r, 1, 1, 0, (Threadblock(0, -1, n, 0, (Step("r", "o", 0, "o", 0),)),)) for r in (1, 2)))
    program = Program("bcast", "broadcast", n, gpus, chunk_factor=1, nchunksperloop=1,
                      switches=(SwitchProgram("switch", (SwitchOp("multicast", (0,), (1, 2), 1, 0),)),))
    assert verify(program, topology=featured(n)).errors == ["rank 0 output slot 0: holds no data, expected input "
                                                            "slot 0 of ranks [0]; never written by any step"]
    reduce_only = featured(n, features=SwitchFeatures(reduce=True))
    assert "does not declare multicast: true" in _first_error(program, topology=reduce_only)
    cut = replace(featured(n), links=tuple(link for link in featured(n).links if (link.src, link.dst) != (0, 3)))
    assert "op 0: src rank 0 has no link to the switch in the fabric" in _first_error(program, topology=cut)
