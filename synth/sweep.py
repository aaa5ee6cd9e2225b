"""Optimality-gap sweeps: topologies × collectives × sizes × methods through :func:`synth.pipeline.synthesize`.

Every cell of the grid becomes one row of a tidy table (:data:`COLUMNS`): the simulated time of the
method's verified program, its algbw/busbw (docs/units.md), the exact lower bound of
:func:`synth.lower_bounds.compute_bounds` and ``gap = (time - bound) / time``. A method that fails, or does
not support the collective, gives a row with its ``status`` and ``error``; it never stops the sweep.

Rows are cached one file per row under a cache directory (default ``.synth-cache/``), keyed by the
SHA-256 of (topology content, collective, size, method, options, synth version), so re-running a
sweep only computes what is new. Tables are written atomically as CSV or JSON.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from synth.collectives import canonical_name
from synth.errors import SynthError
from synth.fileio import read_input_text
from synth.program.ir import Program
from synth.synthesis.base import SynthOptions
from synth.topology.model import Topology

COLUMNS: tuple[str, ...] = (
    "topology", "collective", "method", "size_bytes", "status", "time_us", "algbw_GBps", "busbw_GBps",
    "bound_us", "gap", "synthesis_s", "error",
    # context after the required columns
    "ranks", "solver", "chunks", "verified", "picked",
)
REQUIRED = COLUMNS[:12]
NUMERIC = ("size_bytes", "time_us", "algbw_GBps", "busbw_GBps", "bound_us", "gap", "synthesis_s")
INTEGER = ("ranks", "chunks")
OK_STATUSES = frozenset({"optimal", "feasible", "heuristic"})
DEFAULT_CACHE_DIR = ".synth-cache"
TABLE_FORMAT = "synth-sweep"


@dataclass(frozen=True)
class SweepTask:
    """One cell of the grid."""

    topology: Topology
    collective: str
    size_bytes: int
    method: str


@dataclass
class SweepResult:
    """The rows in grid order; with ``run_sweep(programs=True)``, ``programs[i]`` is row ``i``'s verified
    program (None where the row failed)."""

    rows: list[dict]
    computed: int = 0
    cached: int = 0
    wall_s: float = 0.0
    programs: list[Program | None] = field(default_factory=list)
    failed: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.failed = sum(1 for row in self.rows if row["status"] not in OK_STATUSES)

    @property
    def ok_rows(self) -> list[dict]:
        """The rows that produced a verified program."""
        return [row for row in self.rows if row["status"] in OK_STATUSES]

    def best(self) -> dict[tuple[str, str, float], dict]:
        """The fastest verified row per (topology, collective, size): :func:`best_by_cell`."""
        return best_by_cell(self.rows)

    def write(self, path: str | Path) -> Path:
        """The rows as CSV (``.csv``) or JSON (``.json``), written atomically: :func:`write_table`."""
        return write_table(self.rows, path)


# ---- keys -----------------------------------------------------------------------------------------
def _version() -> str:
    from synth import __version__

    return __version__


def topology_hash(topology: Topology) -> str:
    """SHA-256 of the topology's content (its canonical file form), independent of where it came from."""
    from synth.topology.io import topology_to_dict

    text = json.dumps(topology_to_dict(topology), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def options_key(options: SynthOptions) -> dict:
    """The options that can change a row (``extra`` included when JSON-serialisable)."""
    doc = asdict(replace(options, healthy=None))
    del doc["healthy"]
    if options.healthy is not None:   # a warm start from the healthy fabric (keys without one are unchanged)
        doc["healthy"] = options.healthy.sha256
    try:
        json.dumps(doc["extra"], sort_keys=True)
    except TypeError:
        doc["extra"] = repr(doc["extra"])
    return doc


def cache_key(topology: Topology, collective: str, size_bytes: int, method: str, options: SynthOptions,
              version: str | None = None) -> str:
    doc = {
        "topology": topology_hash(topology),
        "collective": collective,
        "size_bytes": int(size_bytes),
        "method": method,
        "options": options_key(options),
        "version": version or _version(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


class RowCache:
    """One JSON file per finished row: ``DIR/ab/abcdef....json``. Corrupt entries count as misses."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def _entry(self, key: str) -> dict | None:
        try:
            doc = json.loads(read_input_text(self._path(key), "cache entry"))
        except (SynthError, ValueError, RecursionError):
            return None
        row = doc.get("row") if isinstance(doc, dict) else None
        if not isinstance(row, dict) or not set(REQUIRED) <= set(row):
            return None
        return doc

    def get(self, key: str) -> dict | None:
        doc = self._entry(key)
        if doc is None:
            return None
        return {**dict.fromkeys(COLUMNS), **doc["row"]}  # context columns added later read as None

    def get_with_program(self, key: str) -> tuple[dict, Program | None] | None:
        """The row and its program; None where there is no entry, or a successful row's entry holds no
        (readable) program (it was stored by a sweep that did not keep programs)."""
        from synth.program.json_io import program_from_dict

        doc = self._entry(key)
        if doc is None:
            return None
        row = {**dict.fromkeys(COLUMNS), **doc["row"]}
        if row["status"] not in OK_STATUSES:
            return row, None
        try:
            return row, program_from_dict(doc.get("program"), "cache entry")
        except SynthError:
            return None

    def put(self, key: str, row: dict, program: Program | None = None) -> None:
        from synth.fileio import atomic_write_text

        doc: dict = {"key": key, "row": row}
        if program is not None:
            from synth.program.json_io import program_to_dict

            doc["program"] = program_to_dict(program)
        atomic_write_text(self._path(key), json.dumps(doc, default=str))


# ---- the grid -------------------------------------------------------------------------------------
def parse_list(text: str | Sequence[str]) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item and item.strip()]


#: Most sizes one ``-b/-e/-f`` range may expand to (``-b 1 -e 1T -f 2`` is 41): a typo such as ``-f 1.0001``
#: fails at once instead of planning millions of rows.
MAX_RANGE_SIZES = 64


def size_range(min_bytes: int, max_bytes: int, factor: float, *, max_sizes: int = MAX_RANGE_SIZES) -> list[int]:
    """The sizes of nccl-tests' ``-b MIN -e MAX -f FACTOR``: ``MIN, MIN·f, MIN·f², …`` while ``≤ MAX``.

    Each size is ``round(MIN · f^k)`` bytes (exact for integer factors), so ``size_range(2**10, 2**30, 2)`` is
    ``2^10 … 2^30`` (21 sizes), nccl-tests' ``-b 1K -e 1G -f 2``. MAX itself is included only when the
    progression reaches it, as in nccl-tests.
    """
    if min_bytes < 1 or max_bytes < 1:
        raise SynthError(f"size range {min_bytes}..{max_bytes}: sizes must be at least 1 byte")
    if min_bytes > max_bytes:
        raise SynthError(f"size range: --minbytes {min_bytes} is larger than --maxbytes {max_bytes}")
    if not math.isfinite(factor) or factor <= 1:
        raise SynthError(f"--stepfactor {factor:g} must be greater than 1")
    # The count first, from logarithms with a little slack, so a huge range fails before any list is built.
    estimate = math.floor(math.log(max_bytes / min_bytes) / math.log(factor) + 1e-9) + 1
    if estimate > max_sizes:
        raise SynthError(f"size range {min_bytes}..{max_bytes} by {factor:g} has {estimate} sizes, more than "
                         f"{max_sizes}: use a larger --stepfactor or a narrower range")
    sizes: list[int] = []
    k = 0
    while True:
        size = min_bytes * int(factor) ** k if float(factor).is_integer() else round(min_bytes * factor**k)
        if size > max_bytes:
            return sizes
        if not sizes or size > sizes[-1]:  # a factor just above 1 may round to the same byte count
            sizes.append(size)
        k += 1


def expand_methods(methods: Sequence[str], collective: str) -> list[str]:
    """``all`` -> every registered method supporting ``collective``; names are checked against the registry."""
    from synth.synthesis.registry import METHODS, methods_for

    out: list[str] = []
    for m in methods:
        key = m.strip().lower()
        names = methods_for(collective) if key == "all" else [key]
        for name in names:
            if name != "auto" and name not in METHODS:
                raise SynthError(f"unknown method {m!r}; expected all, auto or one of {', '.join(METHODS)}")
            if name not in out:
                out.append(name)
    return out


def plan(topologies: Sequence[Topology], collectives: Sequence[str], sizes: Sequence[int],
         methods: Sequence[str]) -> list[SweepTask]:
    """The grid in a stable order: topology, collective, size, method."""
    if not (topologies and collectives and sizes and methods):
        raise SynthError("a sweep needs at least one topology, collective, size and method")
    tasks = []
    for topo in topologies:
        for coll in collectives:
            name = canonical_name(coll)
            for size in sizes:
                if size <= 0:
                    raise SynthError(f"size must be positive, got {size}")
                for method in expand_methods(methods, name):
                    tasks.append(SweepTask(topo, name, int(size), method))
    return tasks


# ---- one row --------------------------------------------------------------------------------------
def _bound(topology: Topology, collective: str, size_bytes: int, root: int) -> float | None:
    try:
        from synth.lower_bounds import compute_bounds
    except ImportError:
        return None
    try:
        return float(compute_bounds(topology, collective, size_bytes, root=root).time_bound_us)
    except SynthError:
        return None


def _empty_row(task: SweepTask) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(topology=task.topology.name, collective=task.collective, method=task.method,
               size_bytes=task.size_bytes, ranks=task.topology.num_ranks, verified=False)
    return row


def run_row(task: SweepTask, options: SynthOptions, *, root: int = 0, bound_us: float | None = None,
            inplace: bool = False) -> dict:
    """Synthesize, verify and time one cell. Failures become a row with ``status`` and ``error``."""
    return _row_and_program(task, options, root, bound_us, inplace)[0]


def _row_and_program(task: SweepTask, options: SynthOptions, root: int, bound_us: float | None,
                     inplace: bool) -> tuple[dict, Program | None]:
    """:func:`run_row`'s row and the verified program behind it (None where the row failed)."""
    from synth.pipeline import synthesize
    from synth.synthesis.registry import METHODS

    row = _empty_row(task)
    row["bound_us"] = bound_us
    if task.method != "auto" and task.collective not in METHODS[task.method].collectives:
        row.update(status="unsupported", error=f"method {task.method} does not support {task.collective}")
        return row, None
    t0 = time.perf_counter()
    try:
        res = synthesize(task.topology, task.collective, task.size_bytes, task.method, options, root=root,
                         inplace=inplace)
    except SynthError as exc:
        row.update(status="error", error=str(exc), synthesis_s=time.perf_counter() - t0)
        return row, None
    except Exception as exc:  # a bug in one method must not stop the sweep; record it
        row.update(status="error", error=f"internal: {type(exc).__name__}: {exc}",
                   synthesis_s=time.perf_counter() - t0)
        return row, None
    bound = res.bound_us if res.bound_us is not None else bound_us
    gap = (res.time_us - bound) / res.time_us if bound is not None and res.time_us > 0 else None
    row.update(
        picked=res.method,  # the method that produced the program (differs from ``method`` for auto)
        status=res.status, time_us=res.time_us, algbw_GBps=res.algbw_GBps, busbw_GBps=res.busbw_GBps,
        bound_us=bound, gap=gap, synthesis_s=res.synthesis_s, solver=res.solver,
        chunks=res.collective.chunk_factor, verified=True,  # the pipeline verifies before it simulates
    )
    return row, res.program


# ---- the sweep ------------------------------------------------------------------------------------
ProgressFn = Callable[[SweepTask, dict, bool], None]


def run_sweep(topologies: Sequence[Topology], collectives: Sequence[str], sizes: Sequence[int],
              methods: Sequence[str], options: SynthOptions | None = None, *, root: int = 0,
              cache_dir: str | Path | None = DEFAULT_CACHE_DIR, retry_failed: bool = False, jobs: int = 1,
              on_start: Callable[[SweepTask], None] | None = None,
              on_row: ProgressFn | None = None, programs: bool = False, inplace: bool = False) -> SweepResult:
    """Run the grid. ``cache_dir=None`` disables the cache; ``retry_failed`` recomputes cached failures.

    ``jobs > 1`` computes rows in that many worker processes (spawned, so solver threads of the parent
    are never forked); rows come back in grid order either way. ``on_start(task)`` is called when a
    row is started and ``on_row(task, row, cached)`` when it is done (progress bars). ``programs`` keeps
    each row's verified program (``SweepResult.programs``; the cache then stores it with the row, and a
    cached row without one is computed again); ``inplace`` synthesizes in-place programs (its own cache keys).
    """
    if jobs < 1:
        raise SynthError(f"jobs must be at least 1, got {jobs}")
    options = options or SynthOptions()
    tasks = plan(topologies, collectives, sizes, methods)
    cache = RowCache(cache_dir) if cache_dir is not None else None
    bounds: dict[tuple[str, str, int], float | None] = {}
    rows: list[dict | None] = [None] * len(tasks)
    kept: list[Program | None] = [None] * len(tasks)
    pending: list[tuple[int, str, float | None]] = []
    cached = 0
    t0 = time.perf_counter()
    version = _version()
    for i, task in enumerate(tasks):
        key = cache_key(task.topology, task.collective, task.size_bytes, task.method,
                        options, version) + f"-r{root}" + ("-inplace" if inplace else "")
        hit: dict | None = None
        if cache is not None and programs:
            entry = cache.get_with_program(key)
            if entry is not None:
                hit, kept[i] = entry
        elif cache is not None:
            hit = cache.get(key)
        if hit is not None and (not retry_failed or hit["status"] in OK_STATUSES | {"unsupported"}):
            rows[i] = hit
            cached += 1
            if on_row:
                on_row(task, hit, True)
            continue
        kept[i] = None
        bkey = (topology_hash(task.topology), task.collective, task.size_bytes)
        if bkey not in bounds:  # one bound per cell, shared by its methods
            bounds[bkey] = _bound(task.topology, task.collective, task.size_bytes, root)
        pending.append((i, key, bounds[bkey]))

    def done(i: int, key: str, row: dict, program: Program | None) -> None:
        if cache:
            cache.put(key, row, program if programs else None)
        rows[i] = row
        kept[i] = program if programs else None
        if on_row:
            on_row(tasks[i], row, False)

    if jobs == 1 or len(pending) <= 1:
        for i, key, bound in pending:
            if on_start:
                on_start(tasks[i])
            done(i, key, *_row_and_program(tasks[i], options, root, bound, inplace))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(jobs, len(pending)),
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {}
            for i, key, bound in pending:
                future = pool.submit(_row_and_program, tasks[i], options, root, bound, inplace)
                futures[future] = (i, key, bound)
                if on_start:
                    on_start(tasks[i])
            for future in as_completed(futures):
                i, key, bound = futures[future]
                try:
                    row, program = future.result()
                except Exception as exc:  # a worker that died (e.g. out of memory) is one failed row
                    row, program = _empty_row(tasks[i]), None
                    row.update(status="error", error=f"internal: worker failed: {type(exc).__name__}: {exc}",
                               bound_us=bound)
                done(i, key, row, program)
    return SweepResult([r for r in rows if r is not None], computed=len(pending), cached=cached,
                       wall_s=time.perf_counter() - t0, programs=kept if programs else [])


# ---- tables ---------------------------------------------------------------------------------------
def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    return str(value)


def rows_to_csv(rows: Iterable[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k)) for k in COLUMNS})
    return buf.getvalue()


def _json_value(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_table(rows: Sequence[dict], path: str | Path) -> Path:
    """Write rows as CSV (``.csv``) or JSON (``.json``: ``{"format": "synth-sweep", "rows": [...]}``), atomically."""
    from synth.fileio import atomic_write_text

    out = Path(path)
    suffix = out.suffix.lower()
    if suffix == ".csv":
        return atomic_write_text(out, rows_to_csv(rows))
    if suffix == ".json":
        doc = {"format": TABLE_FORMAT, "version": 1, "synth_version": _version(), "columns": list(COLUMNS),
               "rows": [{k: _json_value(row.get(k)) for k in COLUMNS} for row in rows]}
        return atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    raise SynthError(f"{path}: results table must end in .csv or .json")


def _typed(row: dict) -> dict:
    out = {}
    for k in COLUMNS:
        v = row.get(k)
        if v == "" or v is None:
            out[k] = None if k != "verified" else False
        elif k in NUMERIC:
            out[k] = float(v)
        elif k in INTEGER:
            out[k] = int(float(v))
        elif k == "verified":
            out[k] = v if isinstance(v, bool) else str(v).strip().lower() == "true"
        else:
            out[k] = str(v)
    return out


def read_table(path: str | Path) -> list[dict]:
    """Rows of a table written by :func:`write_table` (CSV or JSON), with numbers as floats and blanks as None."""
    p = Path(path)
    text = read_input_text(p, "results table")
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SynthError(f"{path}: not JSON: {exc}") from None
        except RecursionError:
            raise SynthError(f"{path}: not JSON: nested too deeply") from None
        raw = doc.get("rows") if isinstance(doc, dict) else doc
        if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
            raise SynthError(f"{path}: not a synth sweep table (no list of rows)")
    else:
        reader = csv.DictReader(io.StringIO(text))
        missing = {"topology", "collective", "method", "size_bytes"} - set(reader.fieldnames or ())
        if missing:
            raise SynthError(f"{path}: not a synth sweep table (missing columns {', '.join(sorted(missing))})")
        raw = list(reader)
    try:
        return [_typed(r) for r in raw]
    except (TypeError, ValueError) as exc:
        raise SynthError(f"{path}: bad value in results table: {exc}") from None


def is_table(path: str | Path) -> bool:
    """Whether ``path`` looks like a sweep table rather than a program (by suffix and content)."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        return True
    if p.suffix.lower() != ".json":
        return False
    if not p.is_file():     # a FIFO cannot be peeked at (and opening one without a writer blocks)
        return False
    try:
        with open(p, "rb") as handle:  # the start is enough
            head = handle.read(4096).decode("utf-8", errors="replace")
    except OSError:
        return False
    return f'"format": "{TABLE_FORMAT}"' in head or head.lstrip().startswith("[")


def best_by_cell(rows: Iterable[dict]) -> dict[tuple[str, str, float], dict]:
    """The fastest successful row per (topology, collective, size)."""
    best: dict[tuple[str, str, float], dict] = {}
    for row in rows:
        if row["status"] not in OK_STATUSES or row["time_us"] is None:
            continue
        key = (row["topology"], row["collective"], row["size_bytes"])
        if key not in best or row["time_us"] < best[key]["time_us"]:
            best[key] = row
    return best
