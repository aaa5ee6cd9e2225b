"""Run Programs for real on N processes with torch.distributed and check every output byte.

Launch modes:
- local (default): N = program.num_ranks processes on this machine. gloo forks them
  (``torch.multiprocessing.start_processes(start_method="fork")``, ``file://`` rendezvous,
  ``GLOO_SOCKET_IFNAME=lo``: 8 ranks start in about 2 s); nccl spawns them (CUDA cannot fork).
- torchrun: when RANK/WORLD_SIZE/LOCAL_RANK are set, this process is one rank of that world
  (multi-node); the world size must equal the program's ranks (plus one, below); rank 0 reports.

A program with in-network steps (``Program.switches``, NVLS/SHARP) runs with ONE extra process, after
the ranks, that emulates every switch (:mod:`synth.execution.plan`); it holds no collective buffers and
takes no part in the timing or the check.

Timing: every iteration starts after a barrier; a rank's time is from the barrier to its last op;
an iteration's time is the slowest rank's; ``time_us`` is the median over the timed iterations
(after ``warmup`` untimed ones). Buffers are reset (inputs restored, outputs poisoned) before each
iteration, outside the timed region; the last iteration's outputs are checked on every rank.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace

from synth.collectives import Collective
from synth.errors import CheckFailed, SynthError
from synth.execution.plan import Plan, compile_plan
from synth.execution.worker import Job, local_worker, median_of_max, run_rank
from synth.program.ir import Program, collective_of
from synth.units import algbw_GBps

BACKENDS = ("gloo", "nccl")
ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bfloat16": 2, "float16": 2}


@dataclass
class ExecResult:
    ok: bool
    backend: str
    ranks: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    errors: list[str] = field(default_factory=list)
    program: str = ""
    collective: str = ""
    size_bytes: int = 0
    chunk_elems: int = 0
    dtype: str = "float32"
    iters: int = 0
    warmup: int = 0
    times_us: list[float] = field(default_factory=list)
    waves: int = 0
    messages: int = 0
    notes: list[str] = field(default_factory=list)
    baseline_time_us: float | None = None
    leader: bool = True  # False on torchrun ranks other than 0 (they print nothing)

    def to_json(self) -> dict:
        out = {k: getattr(self, k) for k in ("ok", "backend", "ranks", "time_us", "algbw_GBps", "busbw_GBps",
                                              "errors", "program", "collective", "size_bytes", "chunk_elems",
                                              "dtype", "iters", "warmup", "times_us", "waves", "messages", "notes")}
        if self.baseline_time_us is not None:
            out["baseline_time_us"] = self.baseline_time_us
        return out


def chunk_elems_for(coll: Collective, size_bytes: int, dtype: str) -> tuple[int, int, str | None]:
    """Elements per chunk for SIZE (docs/units.md, the nccl-tests convention), the SIZE actually run, and a note
    when SIZE had to be rounded down to a multiple of ``size_chunks * itemsize``."""
    item = ITEMSIZE[dtype]
    unit = coll.size_chunks * item
    elems = size_bytes // unit
    if elems < 1:
        raise SynthError(f"size {size_bytes} B is too small for this program: {coll.name} on {coll.num_ranks} "
                         f"ranks splits SIZE into {coll.size_chunks} chunks of {dtype}; use at least {unit} B")
    actual = elems * unit
    note = None
    if actual != size_bytes:
        note = (f"SIZE {size_bytes} B is not a multiple of {coll.size_chunks} chunks x {item} B; "
                f"rounded down to {actual} B")
    return elems, actual, note


def torchrun_world() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when launched by torchrun, else None."""
    env = os.environ
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"])
    return None


def prepare(program: Program, *, verify_first: bool = True) -> Plan:
    """Verify (unless told not to) and compile the plan; refuse programs that cannot be run."""
    coll = collective_of(program)
    if verify_first:
        from synth.verification import verify

        res = verify(program, coll)
        if not res.ok:
            shown = "; ".join(res.errors[:3])
            more = f" (+{len(res.errors) - 3} more)" if len(res.errors) > 3 else ""
            raise CheckFailed(f"{program.name}: verify failed, not executing: {shown}{more}")
    try:
        plan = compile_plan(program, coll, allow_hang=not verify_first)
    except ValueError as exc:
        raise CheckFailed(f"{program.name}: cannot execute: {exc}") from None
    if plan.stuck and verify_first:
        raise CheckFailed(f"{program.name}: the program deadlocks: {plan.stuck[0]}")
    return plan


def execute(program: Program, **kwargs) -> ExecResult:
    """Run one program; see :func:`execute_many` for the options."""
    return execute_many([program], **kwargs)[0]


def execute_many(programs: list[Program], *, backend: str = "gloo", size_bytes: int = 1 << 20,
                 dtype: str = "float32", iters: int = 5, warmup: int = 1, timeout: float = 120.0,
                 verify_first: bool = True, seed: int = 0, baselines: list[str | None] | None = None,
                 ) -> list[ExecResult]:
    """Run several programs with the same rank count in one process group (start-up paid once).

    Raises SynthError on bad options, CheckFailed when a program is refused, a worker fails or the
    run times out. A wrong output does not raise: the result has ``ok=False`` and ``errors`` naming
    the rank and output chunk.
    """
    if backend not in BACKENDS:
        raise SynthError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if dtype not in ITEMSIZE:
        raise SynthError(f"unknown dtype {dtype!r}; expected one of {', '.join(ITEMSIZE)}")
    if iters < 1 or warmup < 0:
        raise SynthError("--iters must be >= 1 and --warmup >= 0")
    if timeout <= 0:
        raise SynthError("--timeout must be positive")
    if not programs:
        return []
    world = programs[0].num_ranks
    if any(p.num_ranks != world for p in programs):
        raise SynthError("programs run together must have the same number of ranks")
    ranks = world
    world += 1 if any(p.switches for p in programs) else 0   # the switch process (module docstring)
    plans, elems, actual, notes = [], [], [], []
    for p in programs:
        plan = prepare(p, verify_first=verify_first)
        e, a, note = chunk_elems_for(plan.collective, size_bytes, dtype)
        plans.append(plan)
        elems.append(e)
        actual.append(a)
        notes.append([note] if note else [])
        if plan.stuck:
            notes[-1].append(f"the plan deadlocks ({plan.stuck[0]}); running it anyway (--no-verify)")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise SynthError("backend nccl needs CUDA GPUs; none is available (use --backend gloo)")
        if torchrun_world() is None and torch.cuda.device_count() < world:
            extra = " + 1 switch process" if world > ranks else ""
            raise SynthError(f"backend nccl runs one rank per GPU: the program has {ranks} ranks{extra} but this "
                             f"machine has {torch.cuda.device_count()} GPUs (use torchrun across machines, or gloo)")
    job = Job(tuple(plans), tuple(elems), dtype=dtype, backend=backend, iters=iters, warmup=warmup, seed=seed,
              timeout_s=timeout, baselines=tuple(baselines or ()))
    tr = torchrun_world()
    if tr is not None:
        per_rank, leader = _run_torchrun(job, world, tr, timeout)
    else:
        per_rank, leader = _run_local(job, world, timeout, plans), True
    results = []
    per_rank = per_rank[:ranks]   # the switch process is neither timed nor checked
    for pi, (plan, p) in enumerate(zip(plans, programs)):
        rank_results = [r[pi] for r in per_rank]
        t_s = median_of_max([r["times_s"] for r in rank_results])
        times_us = [max(ts) * 1e6 for ts in zip(*[r["times_s"] for r in rank_results])]
        errors = [e for r in rank_results for e in r["errors"]]
        # a message nobody receives is a broken program even if the outputs happen to be right
        errors += list(plan.unmatched_sends[:8])
        coll = plan.collective
        t_us = t_s * 1e6
        alg = algbw_GBps(actual[pi], t_us)
        base = None
        if "baseline_times_s" in rank_results[0]:
            base = median_of_max([r["baseline_times_s"] for r in rank_results]) * 1e6
        results.append(ExecResult(
            ok=not errors, backend=backend, ranks=ranks, time_us=t_us, algbw_GBps=alg,
            busbw_GBps=alg * coll.busbw_factor, errors=errors, program=p.name, collective=coll.name,
            size_bytes=actual[pi], chunk_elems=elems[pi], dtype=dtype, iters=iters, warmup=warmup,
            times_us=times_us, waves=plan.waves, messages=plan.messages, notes=notes[pi],
            baseline_time_us=base, leader=leader))
    return results


def _run_local(job: Job, world: int, timeout: float, plans: list[Plan]) -> list[list[dict]]:
    import torch.multiprocessing as mp

    tmpdir = tempfile.mkdtemp(prefix="synth-exec-")
    try:
        job = replace(job, init_method="file://" + os.path.join(tmpdir, "rendezvous"), result_dir=tmpdir)
        # CUDA cannot fork; SYNTH_EXECUTE_START=spawn forces spawn on CPU too (slower start-up)
        method = "spawn" if job.backend == "nccl" else os.environ.get("SYNTH_EXECUTE_START", "fork")
        if job.backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        ctx = mp.start_processes(local_worker, args=(job, world), nprocs=world, join=False, start_method=method)
        procs = ctx.processes
        deadline = time.monotonic() + timeout
        timed_out = False
        stragglers: list[int] = []
        try:
            while True:
                alive = [p for p in procs if p.exitcode is None]
                failed = [p for p in procs if p.exitcode not in (None, 0)]
                if failed or not alive:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                multiprocessing.connection.wait([p.sentinel for p in alive], timeout=min(remaining, 1.0))
            stragglers = [i for i, p in enumerate(procs) if p.exitcode is None]
        finally:  # never leave a worker behind, whatever happened here (Ctrl-C included)
            for p in procs:
                if p.exitcode is None:
                    p.kill()
            for p in procs:
                p.join()
        payloads = {}
        for r in range(world):
            path = os.path.join(tmpdir, f"rank{r}.json")
            if os.path.exists(path):
                with open(path) as fh:
                    payloads[r] = json.load(fh)
        if timed_out:
            hint = ""
            stuck = [s for plan in plans for s in plan.stuck]
            if stuck:
                hint = f"; the program deadlocks: {stuck[0]}"
            raise CheckFailed(f"execution timed out after {timeout:g} s: killed {len(stragglers)} of {world} "
                              f"workers (ranks {_fmt(stragglers)} still running){hint}")
        crashed = [r for r in range(world) if not payloads.get(r, {}).get("ok")]
        if crashed:
            r = next((r for r in crashed if r in payloads), crashed[0])
            code = procs[r].exitcode
            why = payloads.get(r, {}).get("error") or (
                f"killed by signal {-code} (out of memory? try a smaller --size)" if code is not None and code < 0
                else f"exit code {code}")
            who = f"rank {r}" if r < plans[0].collective.num_ranks else f"the switch process ({r})"
            raise CheckFailed(f"{who} failed: {why}")
        return [payloads[r]["plans"] for r in range(world)]
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _run_torchrun(job: Job, world: int, tr: tuple[int, int, int], timeout: float) -> tuple[list[list[dict]], bool]:
    rank, size, local_rank = tr
    if size != world:
        ranks = job.plans[0].collective.num_ranks
        needs = f"needs {world} processes (its {ranks} ranks + 1 switch process)" if world > ranks else \
            f"has {world} ranks"
        raise SynthError(f"torchrun world size is {size} but the program {needs}; "
                         f"launch exactly {world} processes in total")

    def expire() -> None:
        print(f"error: execution timed out after {timeout:g} s on rank {rank}", flush=True)
        os._exit(1)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        job = replace(job, init_method="env://")
        gathered: list = [None] * world
        run_rank(rank, world, job, local_rank=local_rank, gather_into=gathered)
    finally:
        watchdog.cancel()
    return gathered, rank == 0


def _fmt(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
