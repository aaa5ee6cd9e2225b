"""Pictures of programs and topologies (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from synth.errors import SynthError

if TYPE_CHECKING:
    from synth.simulate import SimResult
    from synth.topology.model import Topology

MAX_GANTT_ROWS = 64


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gantt(sim: SimResult, topology: Topology, path: str | Path, max_rows: int = MAX_GANTT_ROWS) -> Path:
    """Timeline of link occupancy: one row per directed link, one bar per transfer holding it.

    A routed transfer appears on every link of its route. Rows are the busiest links first (at most
    ``max_rows``), colored by sending rank. Written atomically to ``path`` (format from the suffix).
    """
    if not sim.events:
        raise SynthError("no transfer events to draw (was the simulation run with record_events=False?)")
    from synth.fileio import atomic_write_bytes

    bars: dict[str, list[tuple[float, float, int]]] = {}
    for rank, _tb, _step, start, end, route in sim.events:
        for name in route:
            bars.setdefault(name, []).append((start, end - start, rank))
    busy = sorted(bars, key=lambda name: (-sim.link_utilization.get(name, 0.0), name))[:max_rows]
    plt = _pyplot()
    cmap = plt.get_cmap("tab20")
    height = max(2.5, 0.28 * len(busy) + 1.2)
    fig, ax = plt.subplots(figsize=(11, height))
    for row, name in enumerate(busy):
        spans = bars[name]
        ax.broken_barh([(s, d) for s, d, _ in spans], (row - 0.4, 0.8),
                       facecolors=[cmap(r % 20) for _, _, r in spans], edgecolors="black", linewidths=0.2)
    senders = sorted({r for name in busy for _, _, r in bars[name]})
    if len(senders) <= 16:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=cmap(r % 20), label=f"rank {r}") for r in senders], fontsize=6,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_yticks(range(len(busy)))
    ax.set_yticklabels([f"{name} ({sim.link_utilization.get(name, 0.0):.0%})" for name in busy], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, sim.time_us if sim.time_us > 0 else 1)
    ax.set_xlabel("time (µs)")
    shown = f"top {len(busy)} of {len(bars)} links" if len(bars) > len(busy) else f"{len(bars)} links"
    ax.set_title(f"{topology.name}: {sim.transfers} transfers, {sim.time_us:.1f} µs, "
                 f"algbw {sim.algbw_GBps:.2f} GB/s ({shown})", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    import io

    buf = io.BytesIO()
    fmt = out.suffix.lstrip(".").lower() or "png"
    try:
        fig.savefig(buf, format=fmt, dpi=120)
    except ValueError as exc:
        raise SynthError(f"cannot write a {fmt!r} image to {out}: {exc}") from exc
    finally:
        plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    return out
