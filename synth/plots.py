"""Pictures of programs and topologies (matplotlib, Agg backend, imported lazily)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from synth.errors import SynthError

if TYPE_CHECKING:
    import numpy as np

    from synth.simulation import SimResult
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
    return _save(fig, path)


def _save(fig, path: str | Path, dpi: int = 120) -> Path:
    """Render ``fig`` in memory (format from the suffix) and write it atomically; always closes ``fig``."""
    import io

    from synth.fileio import atomic_write_bytes

    plt = _pyplot()
    out = Path(path)
    buf = io.BytesIO()
    fmt = out.suffix.lstrip(".").lower() or "png"
    try:
        fig.savefig(buf, format=fmt, dpi=dpi, bbox_inches="tight")
    except ValueError as exc:
        raise SynthError(f"cannot write a {fmt!r} image to {out}: {exc}") from exc
    finally:
        plt.close(fig)
    try:
        atomic_write_bytes(out, buf.getvalue())
    except OSError as exc:     # a full disk, a read-only directory, /dev/full: the user's problem, one line
        raise SynthError(f"{out}: cannot write image ({exc.strerror or exc})") from None
    return out


# ---- topology drawing -----------------------------------------------------------------------------
def _pairs(topology: Topology) -> dict[tuple[int, int], tuple[float, float]]:
    """Undirected node pairs (u < v) -> (bw u→v, bw v→u); a missing direction has bw 0."""
    pairs: dict[tuple[int, int], list[float]] = {}
    for link in topology.links:
        u, v = sorted((link.src, link.dst))
        entry = pairs.setdefault((u, v), [0.0, 0.0])
        entry[0 if link.src == u else 1] += link.bw
    return {k: (a, b) for k, (a, b) in pairs.items()}


def topology_layout(topology: Topology) -> dict[int, tuple[float, float]]:
    """Node positions for :func:`plot_topology`.

    Ranks of each machine sit on a circle (on a line when ranks have no direct links, as behind a
    switch), machines side by side. Switches are placed in tiers by hop distance from the ranks, at the
    mean x of their neighbours: switches that serve several ranks (NVSwitch, leaf, IB switch of a flat
    fabric) go below the ranks, single-rank attachments (NICs) above them, and the next tier beyond
    whichever side its neighbours are on. A fabric of ranks only, without machines, gets a Kamada-Kawai
    layout (meshes, tori and hypercubes keep their shape).
    """
    import math

    n = topology.num_ranks
    pos: dict[int, tuple[float, float]] = {}
    direct = any(topology.is_rank(link.src) and topology.is_rank(link.dst) for link in topology.links)
    machines = [list(m) for m in topology.machines] or [list(range(n))]
    covered = {r for m in machines for r in m}
    machines += [[r] for r in range(n) if r not in covered]
    if not topology.switches and len(machines) == 1 and n > 8:
        import networkx as nx

        graph = nx.Graph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(_pairs(topology))
        layout = nx.kamada_kawai_layout(graph)
        scale = max(2.0, math.sqrt(n) * 0.9)
        return {int(k): (float(x) * scale, float(y) * scale) for k, (x, y) in layout.items()}
    x0 = 0.0
    for box in machines:
        k = len(box)
        if direct and k > 2:
            radius = max(1.0, k / (2 * math.pi) * 1.1)
            for i, r in enumerate(box):
                angle = math.pi / 2 - 2 * math.pi * i / k
                pos[r] = (x0 + radius + radius * math.cos(angle), radius * math.sin(angle))
            x0 += 2 * radius + 1.5
        else:
            for i, r in enumerate(box):
                pos[r] = (x0 + i, 0.0)
            x0 += k + 0.8
    if not topology.switches:
        return pos
    neighbours: dict[int, set[int]] = {v: set() for v in range(topology.num_nodes)}
    for link in topology.links:
        neighbours[link.src].add(link.dst)
        neighbours[link.dst].add(link.src)
    ys = [y for _, y in pos.values()]
    top, bottom = max(ys), min(ys)
    side: dict[int, int] = {}
    frontier = set(range(n))
    placed = set(range(n))
    tier = 0
    while len(placed) < topology.num_nodes:
        tier += 1
        layer = sorted({w for v in frontier for w in neighbours[v]} - placed)
        if not layer:
            break
        rows: dict[int, list[tuple[float, int]]] = {}
        for s in layer:
            near = [v for v in neighbours[s] if v in placed]
            if tier == 1:
                side[s] = 1 if sum(topology.is_rank(v) for v in near) == 1 else -1
            else:
                votes = sum(side.get(v, 0) for v in near)
                side[s] = 1 if votes >= 0 else -1
            x = sum(pos[v][0] for v in near) / len(near)
            rows.setdefault(side[s], []).append((x, s))
        for sgn, items in rows.items():
            items.sort()
            y = (top + 1.4 * tier) if sgn > 0 else (bottom - 1.4 * tier)
            spacing = (0.9 if sgn > 0 else 1.6) if tier == 1 else 3.0  # NICs sit over their GPUs; spines spread
            xs = [x for x, _ in items]
            for i in range(1, len(xs)):  # keep neighbours in a tier apart, then re-centre the tier
                xs[i] = max(xs[i], xs[i - 1] + spacing)
            shift = (sum(x for x, _ in items) - sum(xs)) / len(xs)
            for x, (_, s) in zip(xs, items):
                pos[s] = (x + shift, y)
        placed.update(layer)
        frontier = set(layer)
    for s in range(topology.num_nodes):  # unreachable switches (cannot happen for a valid file)
        pos.setdefault(s, (x0, bottom - 1.4 * (tier + 1)))
    return pos


def plot_topology(topology: Topology, path: str | Path, *, title: str | None = None,
                  highlight: Collection[int] | None = None) -> Path:
    """Draw a topology: ranks as circles, switches as squares, one line per connected node pair
    whose width and colour give its bandwidth (GB/s per direction; both directions are shown when
    they differ). ``highlight`` (node ids, e.g. a cut set S) outlines those nodes in red and draws
    the pairs crossing its boundary red and dashed. Written atomically to ``path``."""
    plt = _pyplot()
    from matplotlib.colors import Normalize
    from matplotlib.lines import Line2D

    pos = topology_layout(topology)
    pairs = _pairs(topology)
    bws = [max(a, b) for a, b in pairs.values()]
    lo, hi = min(bws), max(bws)
    norm = Normalize(vmin=lo * 0.8 if lo < hi else lo * 0.5, vmax=hi)
    cmap = plt.get_cmap("viridis")
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    width_in = min(16.0, max(6.0, (max(xs) - min(xs)) * 0.55 + 2.5))
    height_in = min(12.0, max(4.0, (max(ys) - min(ys)) * 0.6 + 2.0))
    fig, ax = plt.subplots(figsize=(width_in, height_in))
    for (u, v), (a, b) in sorted(pairs.items(), key=lambda kv: max(kv[1])):
        bw = max(a, b)
        (x1, y1), (x2, y2) = pos[u], pos[v]
        lw = 0.6 + 5.0 * (bw / hi)
        ax.plot([x1, x2], [y1, y2], color=cmap(norm(bw)), linewidth=lw, alpha=0.85, zorder=1,
                solid_capstyle="round")
        if a != b:  # asymmetric pair: print both directions
            label = f"{a:g}/{b:g}" if a and b else f"{a or b:g}→"
            ax.text((x1 + x2) / 2, (y1 + y2) / 2, label, fontsize=6, ha="center", va="center", zorder=4,
                    bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    marked = set(highlight or ())
    if marked:
        for (u, v) in pairs:
            if (u in marked) != (v in marked):
                (x1, y1), (x2, y2) = pos[u], pos[v]
                ax.plot([x1, x2], [y1, y2], color="#d62828", linewidth=1.6, linestyle=(0, (4, 2)), zorder=2)
    rank_size = 260 if topology.num_ranks <= 32 else 90
    rx = [pos[r][0] for r in topology.ranks]
    ry = [pos[r][1] for r in topology.ranks]
    ax.scatter(rx, ry, s=rank_size, c="#f4a259", zorder=3, marker="o",
               edgecolors=["#d62828" if r in marked else "black" for r in topology.ranks],
               linewidths=[2.4 if r in marked else 0.8 for r in topology.ranks])
    if topology.num_ranks <= 64:
        for r in topology.ranks:
            ax.text(pos[r][0], pos[r][1], str(r), fontsize=7 if r < 100 else 5, ha="center", va="center",
                    zorder=5)
    if topology.switches:
        sw = list(range(topology.num_ranks, topology.num_nodes))
        ax.scatter([pos[s][0] for s in sw], [pos[s][1] for s in sw], s=rank_size * 0.9, c="#8ecae6",
                   edgecolors=["#d62828" if s in marked else "black" for s in sw],
                   linewidths=[2.4 if s in marked else 0.8 for s in sw], marker="s", zorder=3)
        small = len(sw) > 12
        for s in sw:
            ax.text(pos[s][0], pos[s][1] + (0.38 if pos[s][1] > 0 else -0.38), str(topology.node_name(s)),
                    fontsize=6, ha="center", va="bottom" if pos[s][1] > 0 else "top", zorder=5,
                    rotation=45 if small and pos[s][1] > 0 else 0)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    sm.set_array([])
    bar = fig.colorbar(sm, ax=ax, fraction=0.03, pad=0.01)
    bar.set_label("bandwidth per direction (GB/s); line width ∝ bandwidth", fontsize=8)
    handles = [Line2D([], [], marker="o", linestyle="", markerfacecolor="#f4a259", markeredgecolor="black",
                      markersize=9, label="rank (GPU)")]
    if topology.switches:
        handles.append(Line2D([], [], marker="s", linestyle="", markerfacecolor="#8ecae6",
                              markeredgecolor="black", markersize=9, label="switch / NIC (forwards only)"))
    if marked:
        handles.append(Line2D([], [], marker="o", linestyle=(0, (4, 2)), color="#d62828", markerfacecolor="white",
                              markeredgecolor="#d62828", markeredgewidth=2, markersize=9,
                              label="highlighted set and the links crossing its boundary"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.02), ncol=3, fontsize=8, frameon=False)
    alphas = sorted({link.alpha for link in topology.links})
    alpha_txt = ", ".join(f"{a:g}" for a in alphas[:4]) + (" …" if len(alphas) > 4 else "")
    ax.set_title(title or f"{topology.name}: {topology.num_ranks} ranks, {len(topology.switches)} switches, "
                 f"{len(topology.links)} directed links, α ∈ {{{alpha_txt}}} µs", fontsize=10)
    ax.set_aspect("equal", adjustable="datalim")
    ax.margins(0.08)
    ax.axis("off")
    return _save(fig, path)


# ---- link utilisation heatmap ---------------------------------------------------------------------
def link_matrix(topology: Topology, link_utilization: dict[str, float]) -> tuple[np.ndarray, list[str]]:
    """``(M, labels)``: ``M[i, j]`` is the utilisation of link i→j (NaN where there is no link), over
    the nodes in id order, from a ``link_utilization`` dict keyed ``"src->dst"`` by node name."""
    import numpy as np

    labels = [str(topology.node_name(v)) for v in range(topology.num_nodes)]
    index = {name: i for i, name in enumerate(labels)}
    mat = np.full((topology.num_nodes, topology.num_nodes), np.nan)
    for link in topology.links:
        mat[link.src, link.dst] = 0.0
    for name, util in link_utilization.items():
        src, sep, dst = name.partition("->")
        if not sep or src not in index or dst not in index:
            raise SynthError(f"link_utilization names an unknown link {name!r} of {topology.name}")
        mat[index[src], index[dst]] = util
    return mat, labels


def plot_link_heatmap(sim: SimResult, topology: Topology, path: str | Path, *, title: str | None = None) -> Path:
    """Per-link utilisation (busy time / completion time) as a src × dst heatmap; blank cells have no
    link. Values are written in the cells when the fabric is small. Written atomically to ``path``."""
    import numpy as np

    plt = _pyplot()
    mat, labels = link_matrix(topology, sim.link_utilization)
    n = len(labels)
    size = min(14.0, max(5.0, 0.32 * n + 2.5))
    fig, ax = plt.subplots(figsize=(size + 1.2, size))
    cmap = plt.get_cmap("magma_r").with_extremes(bad="#eeeeee")
    image = ax.imshow(np.ma.masked_invalid(mat), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    if n <= 24:
        for i in range(n):
            for j in range(n):
                if not np.isnan(mat[i, j]):
                    ax.text(j, i, f"{mat[i, j]:.0%}", ha="center", va="center", fontsize=6,
                            color="white" if mat[i, j] > 0.6 else "black")
    font = 8 if n <= 24 else 6 if n <= 48 else 4
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(labels, fontsize=font, rotation=90)
    ax.set_yticklabels(labels, fontsize=font)
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
    bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("utilisation (busy time / completion time)")
    used = [u for u in sim.link_utilization.values() if u > 0]
    mean = sum(used) / len(used) if used else 0.0
    ax.set_title(title or f"{topology.name}: link utilisation, {sim.time_us:.1f} µs, algbw {sim.algbw_GBps:.2f} "
                 f"GB/s\n{len(used)} of {len(topology.links)} links used, mean {mean:.0%} on used links",
                 fontsize=9)
    return _save(fig, path)


# ---- optimality gaps ------------------------------------------------------------------------------
def plot_gaps(rows: list[dict], path: str | Path, *, title: str | None = None) -> Path:
    """algbw (GB/s) against SIZE per method, log-log, one panel per (topology, collective), with the
    lower bound's algbw (SIZE / bound) as a dashed black line: the distance from a method's curve to
    the line is its optimality gap. ``rows`` are sweep rows (:mod:`synth.sweep`)."""
    import math

    ok = [r for r in rows if r.get("status") in ("optimal", "feasible", "heuristic") and r.get("time_us")]
    panels = sorted({(r["topology"], r["collective"]) for r in rows})
    if not panels:
        raise SynthError("no rows to plot")
    plt = _pyplot()
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols + 1.8, 3.9 * nrows), squeeze=False)
    methods = list(dict.fromkeys(r["method"] for r in ok))  # sweep order (registry order)
    palette = [plt.get_cmap("tab10")(i) for i in range(10)] + ["#7f3b08", "#01665e", "#c51b7d", "#4d4d4d"]
    color = {m: palette[i % len(palette)] for i, m in enumerate(methods)}
    markers = "osD^v<>phX*Pd"
    for k, (topo, coll) in enumerate(panels):
        ax = axes[k // ncols][k % ncols]
        bound: dict[float, float] = {}
        for r in rows:
            if (r["topology"], r["collective"]) == (topo, coll) and r.get("bound_us"):
                bound[r["size_bytes"]] = r["size_bytes"] / (r["bound_us"] * 1e3)
        if bound:
            xs = sorted(bound)
            ax.plot(xs, [bound[x] for x in xs], color="black", linestyle="--", linewidth=1.6, label="lower bound",
                    zorder=5)
        for i, m in enumerate(methods):
            pts = sorted((r["size_bytes"], r["algbw_GBps"]) for r in ok
                         if (r["topology"], r["collective"], r["method"]) == (topo, coll, m))
            if pts:
                # earlier methods get bigger markers so that identical curves stay visible
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                        markersize=max(3.0, 8.0 - 0.45 * i), linewidth=1.2, color=color[m], label=m, alpha=0.85,
                        linestyle="-" if i < 10 else (0, (5, 2)))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("SIZE (bytes)")
        ax.set_ylabel("algbw (GB/s)")
        ax.set_title(f"{topo} · {coll}", fontsize=10)
        ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=9)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_size_bands(panels: list[dict], path: str | Path) -> Path:
    """algbw against SIZE (log-log), one panel per entry of ``panels``: ``{"title", "bound": [(size, GB/s)],
    "reference": [...], "reference_label", "bands": [{"label", "points": [...], "fallback": bool, "start":
    first byte}]}``; fallback bands are dashed, a thin line marks where each later band starts
    (``synth tune``'s picture). Written atomically to ``path``."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, panel in zip(axes[0], panels):
        if panel["bound"]:
            ax.plot(*zip(*panel["bound"]), color="black", linewidth=1.2, label="bound")
        if panel["reference"]:
            ax.plot(*zip(*panel["reference"]), color="grey", linestyle=":", linewidth=1.2,
                    label=panel.get("reference_label", "reference"))
        for k, band in enumerate(panel["bands"]):
            if k:
                ax.axvline(band["start"], color="lightgrey", linewidth=0.8, zorder=0)
            if not band["points"]:
                continue
            style = {"linestyle": "--"} if band["fallback"] else {"marker": "o", "markersize": 3}
            ax.plot(*zip(*band["points"]), color=cmap(k % 10), linewidth=2, label=band["label"], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("SIZE (bytes)")
        ax.set_ylabel("algbw (GB/s)")
        ax.set_title(panel["title"], fontsize=9)
        ax.legend(fontsize=7, loc="upper left", frameon=False)
        ax.grid(True, which="major", linewidth=0.3)
    fig.tight_layout()
    return _save(fig, path)
