"""One rank of an execution: set up buffers once, replay the precomputed plan, time it, check it.

Each job runs several plans (same world size) in one process group, so tests and benchmarks pay
the process start-up once. A worker writes ``rank<r>.json`` into the job's result folder (local
launch) or returns its result (torchrun launch, where rank 0 gathers everything).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta

from synth.execution.plan import ADD, BATCH, COPY, Plan


@dataclass(frozen=True)
class Job:
    plans: tuple[Plan, ...]
    chunk_elems: tuple[int, ...]  # per plan
    dtype: str = "float32"
    backend: str = "gloo"
    iters: int = 5
    warmup: int = 1
    seed: int = 0
    timeout_s: float = 120.0
    init_method: str = ""
    result_dir: str = ""
    # extra work per plan for the benchmark: time torch.distributed's own collective too
    baselines: tuple[str | None, ...] = field(default=())


def _same(a: tuple, b: tuple) -> bool:
    return a == b


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2] and a != b


class _Runner:
    """Tensors and compiled ops for one plan on one rank (built once, replayed every iteration)."""

    def __init__(self, plan: Plan, rank: int, elems: int, dtype, device, backend: str, seed: int):
        import torch

        from synth.execution import reference

        self.torch = torch
        self.coll = plan.collective
        # the process after the ranks emulates the switches (plan.py); a plan without switches leaves it idle
        self.switch = rank >= self.coll.num_ranks
        processes = plan.processes
        rp = processes[rank] if rank < len(processes) else None
        self.rank, self.elems, self.dtype, self.device, self.seed = rank, elems, dtype, device, seed
        self.nccl = backend == "nccl"
        self.bufs = {b: torch.empty(c * elems, dtype=dtype, device=device) for b, c in rp.buffers.items()} if rp else {}
        self.temps = [torch.empty(c * elems, dtype=dtype, device=device) for c in rp.temps] if rp else []
        self.aliases = rp.aliases if rp else {}
        ops = []
        for op in (rp.ops if rp else ()):
            if op[0] == COPY:
                dst, src = op[1], op[2]
                ops.append((0, self.view(dst), self.view(src), _overlaps(dst, src)))
            elif op[0] == ADD:
                dst, a, b = op[1], op[2], op[3]
                clone = _overlaps(dst, a) or _overlaps(dst, b)
                ops.append((1, self.view(dst), self.view(a), self.view(b), clone, _same(dst, a)))
            elif op[0] == BATCH:
                p2p, local = [], []
                for kind, peer, reg, chan in op[1]:
                    if kind == "self":
                        local.append((self.view(reg[0]), self.view(reg[1])))
                        continue
                    tag = 0 if self.nccl else chan
                    p2p.append((kind == "send", peer, self.view(reg), tag))
                ops.append((2, p2p, local))
        self.ops = ops
        self.poison = reference.poison(dtype)
        if self.switch:
            return
        self.inputs = reference.make_inputs(self.coll, rank, elems, dtype, seed).to(device)
        self.input_view = self.view(self._resolve("i", 0, self.coll.input_chunks))

    def _resolve(self, buf: str, off: int, cnt: int) -> tuple:
        if buf in self.aliases:
            tgt, base = self.aliases[buf]
            return (tgt, base + off, cnt)
        return (buf, off, cnt)

    def view(self, reg: tuple):
        space, start, cnt = reg
        base = self.temps[space] if isinstance(space, int) else self.bufs[space]
        return base[start * self.elems:(start + cnt) * self.elems]

    def reset(self) -> None:
        if self.switch:
            return
        for buf in self.bufs.values():
            buf.fill_(self.poison)
        self.input_view.copy_(self.inputs)

    def run(self) -> None:
        import torch.distributed as dist

        torch = self.torch
        for op in self.ops:
            code = op[0]
            if code == 0:
                op[1].copy_(op[2].clone() if op[3] else op[2])
            elif code == 1:
                _, dst, a, b, clone, inplace = op
                if clone:
                    dst.copy_(a + b)
                elif inplace:
                    dst.add_(b)
                else:
                    torch.add(a, b, out=dst)
            else:
                for dst, src in op[2]:
                    dst.copy_(src)
                if self.nccl:
                    reqs = dist.batch_isend_irecv(
                        [dist.P2POp(dist.isend if s else dist.irecv, t, peer, tag=tag) for s, peer, t, tag in op[1]])
                else:
                    reqs = [dist.isend(t, peer, tag=tag) if s else dist.irecv(t, peer, tag=tag)
                            for s, peer, t, tag in op[1]]
                for req in reqs:
                    req.wait()

    def check(self) -> list[str]:
        from synth.execution import reference

        if self.switch:
            return []
        out = self._resolve("o", 0, self.coll.output_chunks)

        def slot(k: int):
            return self.view((out[0], out[1] + k, 1)).cpu()

        errors = reference.check_rank(self.coll, self.rank, slot, self.elems, self.dtype, self.seed)
        if not self.coll.inplace:
            # NCCL's sendbuff is const and frameworks reuse it (issue 32, docs/programs.md "Input buffer")
            errors += reference.check_input(self.rank, self.input_view.cpu(), self.inputs.cpu(), self.elems)
        return errors


def _sync(device) -> None:
    import torch

    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _baseline(kind: str, elems_total: int, world: int, dtype, device, iters: int, warmup: int) -> list[float]:
    """Time torch.distributed's own collective on the same processes (benchmark yardstick)."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor's rename notice
    if kind == "allreduce":
        buf = torch.ones(elems_total, dtype=dtype, device=device)

        def call():
            dist.all_reduce(buf)
    elif kind == "allgather":
        out = torch.empty(elems_total, dtype=dtype, device=device)
        inp = torch.ones(elems_total // world, dtype=dtype, device=device)

        def call():
            dist.all_gather_into_tensor(out, inp)
    else:
        raise ValueError(kind)
    times = []
    for it in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        _sync(device)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_rank(rank: int, world: int, job: Job, local_rank: int | None = None,
             gather_into: list | None = None) -> list[dict]:
    """Run every plan of ``job`` as rank ``rank``; return one result dict per plan.

    With ``gather_into`` (a list of ``world`` entries) every rank's results are all-gathered into
    it before the group is torn down (torchrun launches have no parent to collect files)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = None
    kwargs = {}
    if job.backend == "nccl":
        device = torch.device("cuda", local_rank if local_rank is not None else rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    if job.init_method:
        kwargs["init_method"] = job.init_method
    dist.init_process_group(job.backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(job.timeout_s, 1.0)), **kwargs)
    from synth.execution.reference import torch_dtype

    dtype = torch_dtype(job.dtype)
    results = []
    try:
        if job.backend == "nccl":
            # NCCL: the first P2P batch must involve every rank; a collective creates the communicator.
            dist.all_reduce(torch.zeros(1, device=device))
        for pi, plan in enumerate(job.plans):
            runner = _Runner(plan, rank, job.chunk_elems[pi], dtype, device, job.backend, job.seed)
            times, errors = [], []
            total = job.warmup + job.iters
            for it in range(total):
                runner.reset()
                _sync(device)
                dist.barrier()
                t0 = time.perf_counter()
                runner.run()
                _sync(device)
                elapsed = time.perf_counter() - t0
                if it >= job.warmup:
                    times.append(elapsed)
                if it == total - 1:
                    errors = runner.check()
            del runner
            result = {"rank": rank, "times_s": times, "errors": errors}
            base = job.baselines[pi] if pi < len(job.baselines) else None
            if base:
                coll = plan.collective
                total_elems = job.chunk_elems[pi] * coll.size_chunks
                result["baseline_times_s"] = _baseline(base, total_elems, world, dtype, device,
                                                       job.iters, job.warmup)
            results.append(result)
        if gather_into is not None:
            dist.all_gather_object(gather_into, results)
        dist.barrier()  # nobody leaves while a peer may still read from it
    finally:
        dist.destroy_process_group()
    return results


def local_worker(index: int, job: Job, world: int) -> None:
    """Entry point for torch.multiprocessing.start_processes (one per rank on this machine)."""
    path = os.path.join(job.result_dir, f"rank{index}.json")
    try:
        payload = {"ok": True, "plans": run_rank(index, world, job, local_rank=index)}
    except BaseException as exc:  # report, then fail so the parent stops the others at once
        payload = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=6)}
        _write(path, payload)
        os._exit(3)
    _write(path, payload)


def _write(path: str, payload: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def median_of_max(per_rank_times: list[list[float]]) -> float:
    """Median over iterations of the slowest rank's time (seconds)."""
    per_iter = [max(ts) for ts in zip(*per_rank_times)]
    return statistics.median(per_iter) if per_iter else float("nan")
