"""What the verification passes share: the step kinds they compile to, the capped error list each pass
returns, and how errors name steps and symbolic values."""

from __future__ import annotations

from operator import attrgetter

from synth.program.columns import CPY, NOP, RCS, RE, RRC, RRCS, RRS, R, S

MAX_ERRORS = 1000

READ_KINDS = frozenset({S, RRS, RRC, RRCS, CPY, RE})
WRITE_KINDS = frozenset({R, RCS, RRC, RRCS, CPY, RE})
UNKNOWN_TYPE = (NOP, False, False, False, False)
STEP_FIELDS = attrgetter("type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps")
# The race check keeps a vector clock per threadblock (cost ~ threadblocks x executed steps, about
# 0.4 s per million on one core): it runs under this budget and is skipped above it.
RACE_CHECK_BUDGET = 6_000_000


def fit_count(values: tuple, cnt: int) -> tuple:
    """A message's ``values`` as a step of ``cnt`` chunks takes them: cut, or padded with unknown (None) chunks.
    The receiver's own ``cnt`` sizes the result, so it fits the receiver's buffer when that step is valid."""
    return values[:cnt] if len(values) >= cnt else values + (None,) * (cnt - len(values))


class Errors(list):
    """One pass's error messages: the first ``limit`` kept, the rest only counted."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.dropped = 0

    def add(self, msg: str) -> None:
        if len(self) < self.limit:
            self.append(msg)
        else:
            self.dropped += 1


def merge_errors(passes: list[Errors], limit: int) -> list[str]:
    """The passes' errors in order, capped at ``limit``, then one line counting the rest."""
    errors = [e for err in passes for e in err]
    dropped = sum(err.dropped for err in passes) + max(0, len(errors) - limit)
    errors = errors[:limit]
    if dropped:
        errors.append(f"... and {dropped} more errors")
    return errors


def ranks_of(bits: int) -> list[int]:
    """The ranks set in an origin bitset."""
    out, q = [], 0
    while bits:
        if bits & 1:
            out.append(q)
        bits >>= 1
        q += 1
    return out


def fmt_ranks(ranks: list[int], limit: int = 8) -> str:
    """A rank list as errors print it, cut after ``limit`` ranks."""
    text = ",".join(map(str, ranks[:limit]))
    return f"[{text}{',...' if len(ranks) > limit else ''}]"


def describe(value) -> str:
    """A symbolic value, ``(input slot, origin bitset)`` or None, in words."""
    if value is None:
        return "no data"
    slot, bits = value
    return f"input slot {slot} of ranks {fmt_ranks(ranks_of(bits))}"


def step_name(tbs: tuple, g: int, s: int) -> str:
    """How errors name step ``s`` of global threadblock ``g``."""
    r, tb = tbs[g]
    return f"rank {r} tb {tb.id} step {s} ({tb.steps[s].type})"


def operand(tbs: tuple, g: int, p: int, which: str) -> str:
    """Step (g, p)'s ``src`` or ``dst`` operand as ``buf[a:b]``."""
    st = tbs[g][1].steps[p]
    buf, off = (st.srcbuf, st.srcoff) if which == "src" else (st.dstbuf, st.dstoff)
    return f"{buf}[{off}:{off + st.cnt}]"
