"""``synth tune``: a program set an MSCCL runtime loads, one program per band of buffer sizes.

The sizes of a range (``1KiB..4GiB``, factor 2: nccl-tests' grid) are swept through
:func:`synth.sweep.run_sweep`, which keeps each row's verified program (and caches it). To spend the
solver work where the answer changes, ``auto`` runs at every ``stride``-th size (the *anchors*) and at
both ends; between two anchors won by the same heuristic method only that method runs, elsewhere
``auto`` again (a solver method is left to ``auto``, which sets its work budget).
NCCL's own algorithm (the ``nccl`` baseline: ring or double binary tree by α-β time) runs at every size.

Every program found is then a candidate at every size: it is simulated there
(:func:`synth.simulation.simulate`; a program's chunks scale with SIZE), where the runtime would select
it (:func:`synth.runtimes.select`: ``nchunksperloop`` must divide the call), and the fastest wins, so a
size's program is at least as fast as the best single program synthesized anywhere in the range. A
size where NCCL's time is no worse falls back to NCCL (no file). Adjacent sizes won by the same method
and program (the same XML apart from its name and size attributes) form a *band*; a boundary between
two bands lies where their simulated times cross (bisection in bytes), and the bands tile the range
without gaps or overlaps. microsoft/msccl loads at most ``RuntimeProfile.max_files`` files: past that,
the cheapest merges are made (two neighbouring bands on one of their programs, or a band given back to
NCCL), each costing the least worst-case slowdown, and listed in the notes.

:func:`write_set` writes the set into a directory atomically (built beside it, then renamed): one MSCCL
XML per band that has a program (in a subdirectory named after the runtime, since the executor parses
every file of ``MSCCL_ALGO_DIR``), ``manifest.json``, ``env.sh`` (the lines that load the set) and
``algbw.png`` (predicted algbw against size, per band, with the bound).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from synth.collectives import canonical_name
from synth.errors import SynthError
from synth.program.ir import Program
from synth.runtime_limits import RuntimeProfile, runtime_profile
from synth.synthesis.base import SynthOptions
from synth.topology.model import Topology

FORMAT = "synth-tune"
VERSION = 1
STRIDE = 4                 # auto at every 4th size of the grid (and at both ends)
DEFAULT_RANGE = "1KiB..4GiB"
MANIFEST = "manifest.json"
ENV_FILE = "env.sh"
PLOT_FILE = "algbw.png"
FALLBACK = "nccl"          # the method name of a band the runtime leaves to NCCL
_UNBOUNDED = 1 << 62       # a maxBytes above every SIZE, to ask the selection rule about divisibility only
_BISECTIONS = 40


@dataclass(frozen=True)
class Candidate:
    """A verified program found by the sweep: its method, the SIZE it was synthesized for, and its shape
    (a digest of its XML apart from name and size attributes)."""

    method: str
    size_bytes: int
    program: Program = field(compare=False)
    shape: str


@dataclass(frozen=True)
class Point:
    """One size of the grid: the time of the program its band runs (NCCL's where it falls back), NCCL's time
    and the lower bound."""

    size_bytes: int
    time_us: float | None
    nccl_us: float | None
    bound_us: float | None

    @property
    def ratio_to_bound(self) -> float | None:
        return self.time_us / self.bound_us if self.time_us and self.bound_us else None


@dataclass(frozen=True)
class Band:
    """Sizes ``min_bytes..max_bytes`` (inclusive) of one collective and the program that serves them
    (``candidate`` None: NCCL's own algorithm, no file)."""

    collective: str
    min_bytes: int
    max_bytes: int
    candidate: Candidate | None
    points: tuple[Point, ...]
    merged: bool = False      # made by a merge to fit the runtime's file limit (not the fastest at every size)

    @property
    def method(self) -> str:
        return self.candidate.method if self.candidate is not None else FALLBACK


@dataclass
class TuneResult:
    topology: Topology
    runtime: RuntimeProfile
    inplace: bool
    collectives: list[str]
    sizes: list[int]
    bands: list[Band]
    computed: int = 0
    cached: int = 0
    failed: list[str] = field(default_factory=list)   # sweep rows that failed, one line each
    notes: list[str] = field(default_factory=list)

    @property
    def program_bands(self) -> list[Band]:
        return [band for band in self.bands if band.candidate is not None]


# ---- the size grid --------------------------------------------------------------------------------
def parse_range(text: str, factor: float = 2.0) -> list[int]:
    """``MIN..MAX`` -> the sizes ``MIN, MIN·f, …`` up to MAX, MAX itself always last (nccl-tests' grid,
    :func:`synth.sweep.size_range`); a single SIZE is a one-size range."""
    from synth.sweep import size_range
    from synth.units import parse_size

    low, sep, high = text.partition("..")
    if not sep:
        return [parse_size(text)]
    if not low.strip() or not high.strip():
        raise SynthError(f"--sizes {text!r}: give MIN..MAX, e.g. {DEFAULT_RANGE}")
    sizes = size_range(parse_size(low), parse_size(high), factor)
    if sizes[-1] != parse_size(high):
        sizes.append(parse_size(high))
    return sizes


# ---- sweeping -------------------------------------------------------------------------------------
def _ok(entry: tuple[dict, Program | None] | None) -> bool:
    from synth.sweep import OK_STATUSES

    return entry is not None and entry[0]["status"] in OK_STATUSES and entry[1] is not None


def _winner(entry: tuple[dict, Program | None] | None) -> str | None:
    return (entry[0]["picked"] or entry[0]["method"]) if _ok(entry) else None


def _solve(topology: Topology, collective: str, sizes: list[int], options: SynthOptions, inplace: bool,
           stride: int, sweep_kw: dict, counts: dict) -> dict[int, dict[str, tuple[dict, Program | None]]]:
    """``{size: {"synth": (row, program), "nccl": (row, program)}}`` through :func:`synth.sweep.run_sweep`."""
    from synth.sweep import OK_STATUSES, run_sweep
    from synth.synthesis.registry import METHODS

    found: dict[int, dict[str, tuple[dict, Program | None]]] = {}

    def run(group: list[int], methods: list[str]) -> None:
        res = run_sweep([topology], [collective], group, methods, options, programs=True, inplace=inplace,
                        **sweep_kw)
        counts["computed"] += res.computed
        counts["cached"] += res.cached
        for row, program in zip(res.rows, res.programs):
            kind = FALLBACK if row["method"] == FALLBACK else "synth"
            found.setdefault(int(row["size_bytes"]), {})[kind] = (row, program)
            if row["status"] not in OK_STATUSES | {"unsupported"}:
                counts["failed"].append(f"{collective} {int(row['size_bytes'])} B {row['method']}: {row['error']}")

    anchors = sorted(set(range(0, len(sizes), stride)) | {len(sizes) - 1})
    run([sizes[i] for i in anchors], ["auto", FALLBACK])
    groups: dict[tuple[str, ...], list[int]] = {}
    for a, b in zip(anchors, anchors[1:]):
        if b - a < 2:
            continue
        first, last = _winner(found[sizes[a]].get("synth")), _winner(found[sizes[b]].get("synth"))
        if first == last == FALLBACK:
            methods: tuple[str, ...] = (FALLBACK,)
        elif first is not None and first == last and getattr(METHODS.get(first), "kind", None) == "heuristic":
            methods = (first, FALLBACK)    # the same method at both ends: only it between them
        else:   # different winners, or a solver's (auto gives it its own work budget): auto between them
            methods = ("auto", FALLBACK)
        groups.setdefault(methods, []).extend(sizes[a + 1:b])
    for methods, group in groups.items():
        run(group, list(methods))
    return found


def _shape(program: Program, profile: RuntimeProfile) -> str:
    from synth.program.msccl_xml import program_to_xml

    text = program_to_xml(program.with_(name="", min_bytes=0, max_bytes=0), runtime=profile)
    return hashlib.sha256(text.encode()).hexdigest()


class _Timer:
    """Simulated times of programs at sizes (memoised: bisection and merging ask again)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._times: dict[tuple[int, int], float] = {}

    def __call__(self, program: Program, size_bytes: int) -> float:
        from synth.simulation import simulate

        key = (id(program), int(size_bytes))
        if key not in self._times:
            self._times[key] = simulate(program, self.topology, size_bytes, record_events=False).time_us
        return self._times[key]


def _selectable(profile: RuntimeProfile, program: Program, size_bytes: int, inplace: bool,
                attrs_cache: dict[int, dict]) -> bool:
    """Whether ``profile``'s own selection rule (:func:`synth.runtimes.select`) would run ``program`` for a
    call of SIZE ``size_bytes``, sizes limits aside (divisibility, rank count, in-place flag)."""
    from synth.program.msccl_xml import program_to_xml
    from synth.runtimes import Call, algo_attributes, select

    if id(program) not in attrs_cache:
        top = profile.max_bytes_unbounded if profile.max_bytes_unbounded is not None else _UNBOUNDED
        text = program_to_xml(program.with_(min_bytes=0, max_bytes=top), runtime=profile)
        head = next(line for line in text.split("\n") if line.startswith("<algo "))   # after the fabric comment
        attrs_cache[id(program)] = algo_attributes(head + "</algo>")
    call = Call(program.collective, int(size_bytes), inplace, program.num_ranks)
    return select(profile, attrs_cache[id(program)], call).selected


def tune(topology: Topology, collectives: Sequence[str], sizes: Sequence[int], options: SynthOptions | None = None,
         *, inplace: bool = False, stride: int = STRIDE, cache_dir: str | Path | None = None, jobs: int = 1,
         on_start: Callable | None = None, on_row: Callable | None = None) -> TuneResult:
    """Sweep ``collectives`` over ``sizes`` on ``topology`` and cut the range into bands (module docstring).

    ``options.runtime`` names the runtime the set is for (its limits hold during synthesis, its selection
    rule decides where a program can serve). Deterministic: budgets are solver work, and every later choice
    is made on simulated times. The set is MSCCL XML, so only programs the runtime loads are kept where any is
    (``SynthOptions.loads_only``)."""
    options = replace(options or SynthOptions(), loads_only=True)
    try:
        profile = runtime_profile(options.runtime)
    except ValueError as exc:
        raise SynthError(str(exc)) from None
    if stride < 1:
        raise SynthError(f"stride must be at least 1, got {stride}")
    grid = sorted({int(s) for s in sizes})
    if not grid or grid[0] < 1:
        raise SynthError("tune needs at least one positive SIZE")
    names = []
    for coll in collectives:
        name = canonical_name(coll)
        if profile.coll(name) is None:
            raise SynthError(f"{profile.repo} (--runtime {profile.name}) does not load {name} programs")
        if name not in names:
            names.append(name)
    if not names:
        raise SynthError("tune needs at least one collective")
    counts: dict = {"computed": 0, "cached": 0, "failed": []}
    sweep_kw = {"cache_dir": cache_dir, "jobs": jobs, "on_start": on_start, "on_row": on_row}
    timer = _Timer(topology)
    bands: list[Band] = []
    for name in names:
        found = _solve(topology, name, grid, options, inplace, stride, sweep_kw, counts)
        bands.extend(_bands(profile, name, grid, found, inplace, timer))
    result = TuneResult(topology, profile, inplace, names, grid, bands, counts["computed"], counts["cached"],
                        counts["failed"])
    _fit_file_limit(result, timer, {})
    return result


def _bands(profile: RuntimeProfile, collective: str, grid: list[int],
           found: dict[int, dict[str, tuple[dict, Program | None]]], inplace: bool, timer: _Timer) -> list[Band]:
    """The bands of one collective: the best candidate per size, NCCL where it is as good, runs merged."""
    candidates: dict[tuple[str, str], Candidate] = {}
    for size in grid:
        entry = found.get(size, {}).get("synth")
        if _ok(entry):
            row, program = entry
            method = row["picked"] or row["method"]
            if method == FALLBACK:
                continue     # auto's pick was NCCL's own algorithm: that size falls back
            cand = Candidate(method, size, program, _shape(program, profile))
            candidates.setdefault((cand.method, cand.shape), cand)
    attrs: dict[int, dict] = {}
    chosen: list[tuple[Candidate | None, Point, Program | None]] = []   # (winner, point, NCCL's program)
    for size in grid:
        nccl_entry = found.get(size, {}).get(FALLBACK)
        nccl_program = nccl_entry[1] if _ok(nccl_entry) else None
        nccl_us = nccl_entry[0]["time_us"] if _ok(nccl_entry) else None
        bound = next((e[0].get("bound_us") for e in found.get(size, {}).values() if e[0].get("bound_us")), None)
        best: tuple[float, float, int, Candidate] | None = None
        for k, cand in enumerate(candidates.values()):
            if not _selectable(profile, cand.program, size, inplace, attrs):
                continue
            key = (timer(cand.program, size), abs(math.log(cand.size_bytes / size)), k, cand)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None or (nccl_us is not None and nccl_us <= best[0]):
            chosen.append((None, Point(size, nccl_us, nccl_us, bound), nccl_program))
        else:
            chosen.append((best[3], Point(size, best[0], nccl_us, bound), nccl_program))
    runs: list[list[tuple[Candidate | None, Point, Program | None]]] = []
    for item in chosen:
        if runs and runs[-1][-1][0] == item[0]:
            runs[-1].append(item)
        else:
            runs.append([item])
    cuts = [_crossover(left[-1], right[0], timer) for left, right in zip(runs, runs[1:])]
    lows = [grid[0], *cuts]
    highs = [c - 1 for c in cuts] + [grid[-1]]
    return [Band(collective, lo, hi, run[0][0], tuple(p for _, p, _ in run)) for lo, hi, run in zip(lows, highs, runs)]


def _crossover(left: tuple, right: tuple, timer: _Timer) -> int:
    """The first byte count after ``left``'s size at which ``right``'s program is simulated faster (NCCL's
    program of that size for a fallback side; ties go to NCCL), by bisection; the first size of the band
    that follows. Without a program to time, the geometric middle."""
    (lc, lp, ln), (rc, rp, rn) = left, right
    a, b = lp.size_bytes, rp.size_bytes
    lprog = lc.program if lc is not None else ln
    rprog = rc.program if rc is not None else rn
    if lprog is None or rprog is None:
        return max(a + 1, min(b, round(math.sqrt(a * b))))

    def right_wins(size: int) -> bool:
        lt, rt = timer(lprog, size), timer(rprog, size)
        return rt <= lt if rc is None else rt < lt

    lo, hi = a, b          # left serves lo, right serves hi
    for _ in range(_BISECTIONS):
        if hi - lo <= 1:
            break
        mid = min(hi - 1, max(lo + 1, round(math.sqrt(lo * hi))))
        if right_wins(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ---- the runtime's file limit ---------------------------------------------------------------------
def _fit_file_limit(result: TuneResult, timer: _Timer, attrs: dict[int, dict]) -> None:
    """Make the set fit ``runtime.max_files`` (microsoft/msccl: 4): each step makes the cheapest merge, by its
    worst slowdown over the sizes it changes, and says so in ``result.notes``."""
    profile = result.runtime
    while len(result.program_bands) > profile.max_files:
        best: tuple[float, int, Band, Band | None, Candidate | None] | None = None
        bands = result.bands
        for i, band in enumerate(bands):
            if band.candidate is None:
                continue
            # give the band back to NCCL
            cost = max((p.nccl_us / p.time_us if p.nccl_us else math.inf) for p in band.points)
            if best is None or cost < best[0]:
                best = (cost, i, band, None, None)
            # or serve it and its right neighbour with one of their programs
            nxt = bands[i + 1] if i + 1 < len(bands) else None
            if nxt is None or nxt.candidate is None or nxt.collective != band.collective:
                continue
            points = band.points + nxt.points
            for cand in (band.candidate, nxt.candidate):
                if not all(_selectable(profile, cand.program, p.size_bytes, result.inplace, attrs) for p in points):
                    continue
                cost = max(timer(cand.program, p.size_bytes) / p.time_us for p in points)
                if cost < best[0]:
                    best = (cost, i, band, nxt, cand)
        cost, i, band, nxt, cand = best
        if nxt is None:
            merged = replace(band, candidate=None, points=tuple(replace(p, time_us=p.nccl_us) for p in band.points),
                             merged=True)
            result.bands[i:i + 1] = [merged]
            what = f"{band.collective} {band.min_bytes}..{band.max_bytes} B ({band.method}) left to NCCL"
        else:
            points = tuple(replace(p, time_us=timer(cand.program, p.size_bytes)) for p in band.points + nxt.points)
            result.bands[i:i + 2] = [Band(band.collective, band.min_bytes, nxt.max_bytes, cand, points, True)]
            what = (f"{band.collective} {band.min_bytes}..{nxt.max_bytes} B served by one {cand.method} program "
                    f"(was {band.method} and {nxt.method})")
        _join_neighbours(result)
        result.notes.append(f"{profile.repo} loads at most {profile.max_files} files: {what}, at most "
                            f"{cost:.3f}x slower at its sizes")


def _join_neighbours(result: TuneResult) -> None:
    """Neighbouring bands of one collective served alike (both by NCCL, or by the same program) become one."""
    out: list[Band] = []
    for band in result.bands:
        prev = out[-1] if out else None
        if prev is not None and prev.candidate == band.candidate and prev.collective == band.collective:
            out[-1] = replace(prev, max_bytes=band.max_bytes, points=prev.points + band.points,
                              merged=prev.merged or band.merged)
        else:
            out.append(band)
    result.bands = out


# ---- writing the set ------------------------------------------------------------------------------
def band_files(result: TuneResult) -> list[tuple[Band, str]]:
    """``(band, relative path)`` of every band with a program, in band order (names sort by collective and
    band number, which is the executor's path order)."""
    out = []
    for coll in result.collectives:
        for k, band in enumerate((b for b in result.bands if b.collective == coll), 1):
            if band.candidate is not None:
                out.append((band, f"{result.runtime.name}/{coll}-{k:02d}-{band.method}.xml"))
    return out


def band_program(result: TuneResult, band: Band) -> Program:
    """The band's program with its name and the runtime's ``minBytes``/``maxBytes`` for the band
    (:func:`synth.runtimes.byte_range`)."""
    from synth.runtimes import byte_range

    cand = band.candidate
    low, high = byte_range(result.runtime, band.points[0].size_bytes, band.min_bytes, band.max_bytes)
    name = f"{band.collective}-{cand.method}-{result.topology.name}-{band.min_bytes}-{band.max_bytes}"
    return cand.program.with_(name=name, min_bytes=low, max_bytes=high)


def env_lines(result: TuneResult) -> list[str]:
    """The shell lines that load the set into its runtime (``env.sh``: paths relative to that file)."""
    profile = result.runtime
    files = [path for _, path in band_files(result)]
    lines = [f"# synth tune: {', '.join(result.collectives)} on {result.topology.name} for {profile.repo}; "
             f"{'in-place' if result.inplace else 'out-of-place'} calls",
             "# load the set in the job's shell: source DIR/env.sh (paths are relative to this file)"]
    if not files:
        return [*lines, "# no band needs a program: NCCL's own algorithms are as fast everywhere"]
    lines.append('SYNTH_SET="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"')
    if profile.load_env == "MSCCL_ALGO_DIR":
        lines += [f'export MSCCL_ALGO_DIR="$SYNTH_SET/{profile.name}"', "export NCCL_MSCCL_ENABLE=1"]
    else:
        joined = ":".join(f"$SYNTH_SET/{path}" for path in files)
        lines += [f'export {profile.load_env}="{joined}"', "export NCCL_ALGO=MSCCL,RING,TREE"]
    return lines


def manifest(result: TuneResult) -> dict:
    """The set's description: one entry per band (range, method, file, predicted time and ratio to the
    bound per size), no wall-clock figures (the same inputs give the same bytes)."""
    from synth import __version__
    from synth.runtimes import export_notes
    from synth.units import algbw_GBps

    files = dict((id(band), path) for band, path in band_files(result))
    entries = []
    for coll in result.collectives:
        for k, band in enumerate((b for b in result.bands if b.collective == coll), 1):
            entry: dict = {"collective": coll, "band": k, "min_bytes": band.min_bytes, "max_bytes": band.max_bytes,
                           "method": band.method, "file": files.get(id(band)), "merged": band.merged, "notes": []}
            if band.candidate is not None:
                program = band_program(result, band)
                entry.update(synthesized_at_bytes=band.candidate.size_bytes, nchunksperloop=program.nchunksperloop,
                             minBytes=program.min_bytes, maxBytes=program.max_bytes, shape=band.candidate.shape[:16],
                             notes=export_notes(result.runtime, program, band.points[-1].size_bytes))
            entry["points"] = [
                {"size_bytes": p.size_bytes, "time_us": p.time_us,
                 "algbw_GBps": algbw_GBps(p.size_bytes, p.time_us) if p.time_us else None,
                 "bound_us": p.bound_us, "ratio_to_bound": p.ratio_to_bound, "nccl_time_us": p.nccl_us,
                 "speedup_vs_nccl": p.nccl_us / p.time_us if p.nccl_us and p.time_us else None}
                for p in band.points]
            ratios = [p.ratio_to_bound for p in band.points if p.ratio_to_bound]
            entry["worst_ratio_to_bound"] = max(ratios) if ratios else None
            entries.append(entry)
    topo = result.topology
    return {"format": FORMAT, "version": VERSION, "synth_version": __version__, "topology": topo.name,
            "fabric_sha256": topo.sha256, "ranks": topo.num_ranks, "runtime": result.runtime.name,
            "repo": result.runtime.repo, "inplace": result.inplace, "collectives": result.collectives,
            "min_bytes": result.sizes[0], "max_bytes": result.sizes[-1], "sizes": result.sizes,
            "load": {"env": result.runtime.load_env, "files": [path for _, path in band_files(result)],
                     "env_file": ENV_FILE},
            "bands": entries, "notes": result.notes}


def plot_set(result: TuneResult, path: str | Path) -> Path:
    """Predicted algbw against SIZE, one panel per collective (:func:`synth.plots.plot_size_bands`)."""
    from synth.plots import plot_size_bands
    from synth.units import algbw_GBps

    def curve(points, attr: str) -> list[tuple[int, float]]:
        return [(p.size_bytes, algbw_GBps(p.size_bytes, getattr(p, attr))) for p in points if getattr(p, attr)]

    panels = []
    for coll in result.collectives:
        bands = [b for b in result.bands if b.collective == coll]
        points = [p for b in bands for p in b.points]
        panels.append({
            "title": f"{coll} on {result.topology.name} ({result.runtime.name})",
            "bound": curve(points, "bound_us"), "reference": curve(points, "nccl_us"), "reference_label": "nccl",
            "bands": [{"label": f"band {k}: {b.method}", "points": curve(b.points, "time_us"),
                       "fallback": b.candidate is None, "start": b.min_bytes} for k, b in enumerate(bands, 1)],
        })
    return plot_size_bands(panels, path)


def write_set(result: TuneResult, directory: str | Path) -> Path:
    """Write the set into ``directory``: built in a temporary directory beside it and renamed into place, so
    a failure leaves no half-written set. An existing ``directory`` must be empty or an earlier set."""
    from synth.fileio import atomic_write_text
    from synth.program.load import save_program

    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise SynthError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not _is_set(out):
        raise SynthError(f"{out}: exists and is not a synth tune set (no {MANIFEST}); remove it or choose another -o")
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        for band, rel in band_files(result):
            save_program(band_program(result, band), build / rel, runtime=result.runtime.name)
        plot_set(result, build / PLOT_FILE)
        atomic_write_text(build / ENV_FILE, "\n".join(env_lines(result)) + "\n")
        atomic_write_text(build / MANIFEST, json.dumps(manifest(result), indent=1) + "\n")
        os.chmod(build, 0o777 & ~_umask())
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=parent))
            os.replace(out, old / "set")
        os.replace(build, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out


def _is_set(path: Path) -> bool:
    try:
        doc = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
