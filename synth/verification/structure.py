"""Verification pass 2, the structure: threadblocks indexed globally, connections and their endpoints, and
every step checked and compiled into a record the symbolic execution runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from synth.program.ir import READS_SRC, RECEIVES, SENDS, WRITES_DST, Program
from synth.verification.common import KIND, NOP, STEP_FIELDS, TYPE_INFO, UNKNOWN_TYPE, Errors
from synth.verification.layout import Layout


@dataclass(frozen=True)
class Connections:
    """The sending and receiving threadblock of every connection (src, dst, channel), and per threadblock
    whether its send and recv peers are usable."""

    sender: dict[tuple, int]
    receiver: dict[tuple, int]
    send_ok: tuple[bool, ...]
    recv_ok: tuple[bool, ...]


@dataclass(frozen=True)
class Structure:
    """What execution needs. ``records[g][s]``: step s of global threadblock g compiled to (kind, receives,
    sends, cnt, src slots, src offset, dst slots, dst writers, dst offset, dependency (g, s) or None)."""

    errors: Errors
    complete: bool                    # False: gpu ids are not 0..N-1, nothing else was indexed
    tbs: tuple = ()                   # global index -> (rank, Threadblock)
    gindex: dict = field(default_factory=dict)    # (rank, tb id) -> global index
    conns: Connections = field(default_factory=lambda: Connections({}, {}, (), ()))
    deps: tuple = ()                  # per threadblock, per step: its dependency (g, s) or None
    records: tuple = ()


def structure(program: Program, lay: Layout, max_errors: int) -> Structure:
    """Index threadblocks and connections and compile every step; incomplete where the gpu ids are not 0..N-1."""
    err = Errors(max_errors)
    n = program.num_ranks
    if [g.id for g in program.gpus] != list(range(n)):
        err.add(f"program has num_ranks={n} but gpu ids {[g.id for g in program.gpus]}")
        return Structure(err, False)
    tbs, gindex = index_threadblocks(program, err)
    conns = connections(n, tbs, err, len(program.switches))
    deps, records, depended = compile_steps(program, lay, tbs, gindex, conns, err)
    check_hasdep(tbs, depended, err)
    return Structure(err, True, tbs, gindex, conns, deps, records)


def index_threadblocks(program: Program, err: Errors) -> tuple[tuple, dict[tuple[int, int], int]]:
    """Number threadblocks globally (``tbs``, ``gindex``); a duplicate id on a rank is dropped."""
    tbs = []          # global index -> (rank, Threadblock)
    gindex = {}       # (rank, tb id) -> global index
    for gpu in program.gpus:
        for tb in gpu.threadblocks:
            if (gpu.id, tb.id) in gindex:
                err.add(f"rank {gpu.id} tb {tb.id}: duplicate threadblock id")
                continue
            gindex[(gpu.id, tb.id)] = len(tbs)
            tbs.append((gpu.id, tb))
    return tuple(tbs), gindex


def connections(n: int, tbs: tuple, err: Errors, switches: int = 0) -> Connections:
    """The sending and receiving threadblock of every connection (src, dst, channel); bad peers flagged. Peers
    ``n .. n + switches - 1`` are the program's switches (docs/programs.md, "Switch steps")."""
    sender: dict[tuple, int] = {}
    receiver: dict[tuple, int] = {}
    send_ok, recv_ok = [], []
    for g, (r, tb) in enumerate(tbs):
        where = f"rank {r} tb {tb.id}"
        ok_peer = {}
        for peer, role, table, key in ((tb.send, "send", sender, (r, tb.send, tb.chan)),
                                       (tb.recv, "recv", receiver, (tb.recv, r, tb.chan))):
            good = 0 <= peer < n + switches and peer != r and tb.chan >= 0
            if peer != -1 and not good:
                also = f" nor a switch ({n}..{n + switches - 1})" if switches else ""
                err.add(f"{where}: {role} peer {peer} is not another rank (0..{n - 1}, not {r}){also} "
                        f"or channel {tb.chan} is negative")
            if good:
                if key in table:
                    other = tbs[table[key]][1].id
                    err.add(f"{where}: connection {key[0]}->{key[1]} channel {tb.chan} is already used for "
                            f"{role} by tb {other} (one threadblock per channel, peer and direction)")
                else:
                    table[key] = g
            ok_peer[role] = good
        send_ok.append(ok_peer["send"])
        recv_ok.append(ok_peer["recv"])
    return Connections(sender, receiver, tuple(send_ok), tuple(recv_ok))


def compile_steps(program: Program, lay: Layout, tbs: tuple, gindex: dict[tuple[int, int], int],
                  conns: Connections, err: Errors) -> tuple[tuple, tuple, dict[tuple[int, int], tuple[int, int]]]:
    """Check every step's operands and dependency and compile it into a record for the execution pass.

    One pass per step with everything hoisted: the step's fields come out in one C-level attrgetter
    call, the type's properties in one dict lookup, and the full check runs in :func:`step_problems`
    only when the fast range test fails. Returns the dependencies, the records and the depended-on
    steps: (tb, step) -> first dependent."""
    deps: list[list] = []
    records: list[list[tuple]] = []
    depended: dict[tuple[int, int], tuple[int, int]] = {}
    lengths = [len(tb.steps) for _, tb in tbs]
    tb_index: list[dict[int, int]] = [{} for _ in range(program.num_ranks)]  # per rank: tb id -> global index
    for (rank, tb_id), g in gindex.items():
        tb_index[rank][tb_id] = g
    for g, (r, tb) in enumerate(tbs):
        get_view = lay.views[r].get
        local = tb_index[r]
        dl, recs = [], []
        can_send, can_recv = conns.send_ok[g], conns.recv_ok[g]
        for s, (t, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, dep_s) in enumerate(map(STEP_FIELDS, tb.steps)):
            info = TYPE_INFO.get(t)
            if info is None:
                err.add(f"rank {r} tb {tb.id} step {s}: unknown step type {t!r} (expected one of "
                        f"{', '.join(KIND)})")
                info = UNKNOWN_TYPE
            kind, is_send, is_recv, reads, writes = info
            sv = get_view(srcbuf)
            dv = get_view(dstbuf)
            ok = kind != NOP
            problems = None
            if ok and (cnt < 1 or (is_send and not can_send) or (is_recv and not can_recv)
                       or (reads and (sv is None or srcoff < 0 or srcoff + cnt > sv[3]))
                       or (writes and (dv is None or dstoff < 0 or dstoff + cnt > dv[3]))):
                ok, problems = step_problems(lay, r, tb, tb.steps[s])
            dep = None
            if depid != -1:  # the runtimes ignore deps when depid is -1
                target = local.get(depid)
                if target is None or not 0 <= dep_s < lengths[target]:
                    problems = (problems or []) + [f"depends on tb {depid} step {dep_s}, which does not "
                                                   f"exist on rank {r}"]
                else:
                    dep = (target, dep_s)
                    if dep not in depended:
                        depended[dep] = (tb.id, s)
            if problems:
                for problem in problems:
                    err.add(f"rank {r} tb {tb.id} step {s} ({t}): {problem}")
            recs.append((kind if ok else NOP, can_recv and is_recv, can_send and is_send,
                         cnt if cnt > 0 else 0,
                         sv[0] if sv else None, sv[2] + srcoff if sv else 0,
                         dv[0] if dv else None, dv[1] if dv else None, dv[2] + dstoff if dv else 0, dep))
            dl.append(dep)
        deps.append(tuple(dl))
        records.append(tuple(recs))
    return tuple(deps), tuple(records), depended


def check_hasdep(tbs: tuple, depended: dict[tuple[int, int], tuple[int, int]], err: Errors) -> None:
    """A depended-on step must set ``hasdep``, else the runtime never signals its dependents."""
    for (target, s), (tb_id, s2) in depended.items():
        r, ttb = tbs[target]
        if not ttb.steps[s].hasdep:
            err.add(f"rank {r} tb {ttb.id} step {s} ({ttb.steps[s].type}): tb {tb_id} step {s2} depends on "
                    f"it but it has hasdep=0, so the runtime never signals it")


def step_problems(lay: Layout, r: int, tb, st) -> tuple[bool, list[str]]:
    """Why a step is malformed (slow path of compile_steps); ok=False means its data effect is skipped."""
    t, views = st.type, lay.views[r]
    ok, problems = True, []
    if st.cnt < 1:
        problems.append(f"cnt={st.cnt} must be at least 1")
        ok = False
    if t in SENDS and tb.send == -1:
        problems.append("sends but the threadblock has no send peer")
    if t in RECEIVES and tb.recv == -1:
        problems.append("receives but the threadblock has no recv peer")
    for used, buf, off, name in ((t in READS_SRC, st.srcbuf, st.srcoff, "src"),
                                 (t in WRITES_DST, st.dstbuf, st.dstoff, "dst")):
        if not used:
            continue
        if buf not in views:
            problems.append(f"{name} buffer {buf!r} is not i, o or s")
            ok = False
        elif off < 0 or off + max(st.cnt, 1) > views[buf][3]:
            note = " after in-place aliasing" if (r, buf) in lay.aliased else ""
            problems.append(f"{name} {buf}[{off}:{off + st.cnt}] is out of range (buffer "
                            f"{buf} has {views[buf][3]} chunks on rank {r}{note})")
            ok = False
    return ok, problems
