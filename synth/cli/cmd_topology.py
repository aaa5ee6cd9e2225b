"""``synth topology list|show|validate|generate|import|degrade`` (docs/cli.md)."""

from __future__ import annotations

import re
from typing import Any

import click

from synth.cli.common import OUTPUT_FILE, console, emit_json, guarded, json_option
from synth.cli.common import count as count_option
from synth.cli.fabric_edits import fabric_edit_options
from synth.errors import SynthError

KINDS = ("ring", "line", "fully-connected", "mesh", "torus", "hypercube", "star", "leaf-spine", "fat-tree", "boxes")


def _summary(topology) -> dict[str, Any]:
    """``links`` counts directed links (an undirected file entry is two)."""
    return {
        "name": topology.name,
        "ranks": topology.num_ranks,
        "switches": len(topology.switches),
        "links": len(topology.links),
    }


@click.group(name="topology")
def command() -> None:
    """List, inspect, validate, generate and import topologies."""


@command.command(name="list")
@json_option
@guarded
def list_cmd(as_json: bool) -> None:
    """List the built-in topologies (usable as -t NAME)."""
    from synth.topology.builtin import builtin_names
    from synth.topology.io import load_topology

    rows = []
    for name in builtin_names():
        topology = load_topology(name)
        rows.append({**_summary(topology), "description": topology.description})
    if as_json:
        emit_json({"topologies": rows})
        return
    from rich.table import Table

    table = Table(title="built-in topologies")
    for column in ("name", "ranks", "switches", "links"):
        table.add_column(column, justify="left" if column == "name" else "right", no_wrap=True,
                         min_width=len(column))
    table.add_column("description", no_wrap=True, overflow="ellipsis", max_width=32)
    for row in rows:
        table.add_row(row["name"], str(row["ranks"]), str(row["switches"]), str(row["links"]), row["description"])
    console().print(table)


# BFS work (ranks x (nodes + links)) past which the hop diameter is not computed: ~3 s. It is all-pairs,
# so a 10^5-rank ring took minutes (and 4 GB for the distance rows) for a number only printed.
MAX_DIAMETER_WORK = 300_000_000


def _diameter(topology) -> int | None:
    """The hop diameter (:func:`synth.topology.io.hop_diameter`), or None where it would cost more than
    :data:`MAX_DIAMETER_WORK`."""
    from synth.topology.io import hop_diameter

    if topology.num_ranks * (topology.num_nodes + len(topology.links)) > MAX_DIAMETER_WORK:
        return None
    return hop_diameter(topology)


def _diameter_text(diameter: int | None) -> str:
    return "diameter not computed (too large)" if diameter is None else f"diameter {diameter}"


def _details(topology) -> dict[str, Any]:
    return {
        **_summary(topology),
        "diameter": _diameter(topology),
        "description": topology.description,
        "source": topology.source,
        "switch_names": list(topology.switches),
        "machines": [list(m) for m in topology.machines],
        "per_rank": [
            {"rank": r, "in_bw_GBps": topology.in_bw(r), "out_bw_GBps": topology.out_bw(r)}
            for r in topology.ranks
        ],
        "circuit_capped_links": _capped(topology),
        "in_network": _in_network(topology),
    }


def _in_network(topology) -> list[dict[str, Any]]:
    """The switches that reduce or multicast in the network (docs/topology.md, "In-network reduction"),
    with the ranks each serves; ``reduce_bw`` None where the switch sets no limit of its own."""
    import math

    from synth.topology.checks import switch_ranks

    return [{"switch": name, "reduce": f.reduce, "multicast": f.multicast, "reduce_alpha_us": f.reduce_alpha,
             "reduce_bw": f.reduce_bw if math.isfinite(f.reduce_bw) else None,
             "ranks": list(switch_ranks(topology, topology.node_id(name)))}
            for name, f in topology.features]


def _capped(topology) -> list[dict[str, Any]]:
    """Links a transfer can never fill: it holds its whole route at the route's smallest bandwidth
    (``Topology.circuit_capacities``, what the bounds and methods plan with)."""
    capped = topology.circuit_capacities()
    return [{"src": topology.node_name(a.src), "dst": topology.node_name(a.dst), "bw_GBps": a.bw,
             "circuit_GBps": b.bw} for a, b in zip(topology.links, capped.links) if b.bw < a.bw]


@command.command(name="show")
@click.argument("topology")
@json_option
@guarded
def show_cmd(topology: str, as_json: bool) -> None:
    """Summary of TOPOLOGY (a file or a built-in name): counts, diameter, per-rank bandwidth."""
    from synth.topology.io import load_topology

    topo = load_topology(topology)
    info = _details(topo)
    if as_json:
        emit_json(info)
        return
    from rich.table import Table

    out = console()
    out.print(f"[bold]{topo.name}[/bold]  {topo.description}")
    out.print(
        f"ranks {info['ranks']}, switches {info['switches']}, directed links {info['links']}, "
        f"{_diameter_text(info['diameter'])}{' hops' if info['diameter'] is not None else ''}, "
        f"machines {len(topo.machines) or '-'}"
    )
    if topo.switches:
        out.print("switches: " + ", ".join(topo.switches))
    table = Table(title="per-rank bandwidth (GB/s)")
    for column in ("rank", "in", "out", "neighbours"):
        table.add_column(column, justify="right" if column != "neighbours" else "left")
    for r in topo.ranks:
        neighbours = ", ".join(str(topo.node_name(link.dst)) for link in topo.out_links[r])
        table.add_row(str(r), f"{topo.in_bw(r):g}", f"{topo.out_bw(r):g}", neighbours[:60])
    out.print(table)
    if info["in_network"]:
        switches = Table(title="in-network switches")
        for column in ("switch", "reduce", "multicast", "reduce α (µs)", "reduce bw (GB/s)", "ranks"):
            switches.add_column(column, justify="left" if column in ("switch", "ranks") else "right")
        for row in info["in_network"]:
            bw = "-" if row["reduce_bw"] is None else f"{row['reduce_bw']:g}"
            switches.add_row(str(row["switch"]), "yes" if row["reduce"] else "no", "yes" if row["multicast"] else "no",
                             f"{row['reduce_alpha_us']:g}" if row["reduce"] else "-", bw if row["reduce"] else "-",
                             _rank_list(row["ranks"]))
        out.print(switches)
    capped = info["circuit_capped_links"]
    if capped:
        first = capped[0]
        out.print(f"{len(capped)} link directions move less than their bandwidth, since a transfer holds its whole "
                  f"route at the route's smallest bandwidth (e.g. {first['src']}->{first['dst']} "
                  f"{first['bw_GBps']:g} -> {first['circuit_GBps']:g} GB/s); bounds and methods count that")


def _rank_list(ranks: list[int]) -> str:
    """``0-7`` for a contiguous run, else the list (cut at 60 characters)."""
    if ranks and ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    text = ", ".join(map(str, ranks))
    return text if len(text) <= 60 else text[:57] + "..."


@command.command(name="validate")
@click.argument("file")
@json_option
@guarded
def validate_cmd(file: str, as_json: bool) -> None:
    """Check a topology file (exit 0 with a summary, exit 2 with the problem)."""
    from synth.topology.io import load_topology

    topo = load_topology(file)
    info = {"ok": True, "file": str(topo.source or file), **_summary(topo), "diameter": _diameter(topo)}
    if as_json:
        emit_json(info)
    else:
        click.echo(
            f"ok: {info['file']}: {topo.name}, {topo.num_ranks} ranks, {len(topo.switches)} switches, "
            f"{len(topo.links)} directed links, {_diameter_text(info['diameter'])}"
        )


def _dims(text: str | None) -> list[int]:
    if not text:
        raise SynthError("mesh and torus need --dims, e.g. --dims 4x4 or --dims 3x3x3")
    if not re.fullmatch(r"\s*\d+(\s*[x,]\s*\d+)*\s*", text):
        raise SynthError(f"--dims must look like 4x4 or 3x3x3, got {text!r}")
    return [int(part) for part in re.split(r"[x,]", text.replace(" ", ""))]


def _need(value: Any, option: str, kind: str) -> Any:
    if value is None:
        raise SynthError(f"{kind} needs {option}")
    return value


@command.command(name="generate")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("-n", "--ranks", "n", type=int, help="ring, line, fully-connected, star: number of ranks "
              "(hypercube: a power of two).")
@click.option("--dims", help="mesh, torus: sizes such as 4x4 or 3x3x3.")
@click.option("--dim", type=int, help="hypercube: dimension (2**dim ranks).")
@click.option("--bw", type=float, default=50.0, show_default=True, help="GB/s per link per direction.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="µs per link.")
@click.option("--unidirectional", is_flag=True, help="ring: one-way links i -> i+1.")
@click.option("--leaves", type=int, help="leaf-spine: number of leaf switches.")
@click.option("--per-leaf", type=int, help="leaf-spine: ranks under each leaf.")
@click.option("--spines", type=int, default=1, show_default=True, help="leaf-spine: number of spine switches.")
@click.option("--uplink-bw", type=float, help="leaf-spine: leaf<->spine GB/s (default non-blocking).")
@click.option("--boxes", type=int, help="boxes: number of boxes (machines).")
@click.option("--per-box", type=int, default=8, show_default=True, help="boxes: ranks per box.")
@click.option("--intra", type=click.Choice(["nvswitch", "mesh"]), default="nvswitch", show_default=True,
              help="boxes: intra-box fabric (uses --bw and --alpha).")
@click.option("--nics-per-box", type=int, help="boxes: NIC nodes per box (default one per rank; 0 = ranks "
              "straight to the IB switches).")
@click.option("--nic-bw", type=float, default=25.0, show_default=True, help="boxes: NIC<->IB GB/s.")
@click.option("--gpu-nic-bw", type=float, help="boxes: rank<->NIC GB/s (default --nic-bw).")
@click.option("--ib-switches", type=int, default=1, show_default=True, help="boxes: IB switches (NIC j uses j % k).")
@click.option("--ib-alpha", type=float, default=2.0, show_default=True, help="boxes: α of NIC<->IB links, µs.")
@click.option("--name", help="Topology name (default from the kind and size).")
@click.option("-o", "--output", type=OUTPUT_FILE, help="File to write (.yaml/.yml or .json); "
              "default: print YAML on stdout.")
@json_option
@guarded
def generate_cmd(kind: str, n: int | None, dims: str | None, dim: int | None, bw: float, alpha: float,
                 unidirectional: bool, leaves: int | None, per_leaf: int | None, spines: int,
                 uplink_bw: float | None, boxes: int | None, per_box: int, intra: str, nics_per_box: int | None,
                 nic_bw: float, gpu_nic_bw: float | None, ib_switches: int, ib_alpha: float, name: str | None,
                 output: str | None, as_json: bool) -> None:
    """Write a parametric topology: ring, line, fully-connected, mesh, torus, hypercube, star,
    leaf-spine (= fat-tree), boxes (multi-node boxes behind NICs).

    \b
    Examples:
      synth topology generate torus --dims 4x4 -o torus.yaml
      synth topology generate hypercube --dim 4 --bw 25 -o hc.yaml
      synth topology generate leaf-spine --leaves 4 --per-leaf 8 --spines 2 -o ls.yaml
      synth topology generate boxes --boxes 2 --per-box 8 --bw 300 --alpha 0.7 --nic-bw 25 -o a100x2.yaml
    """
    from synth.topology import generators as gen

    if kind in ("ring", "line", "fully-connected", "star"):
        count = _need(n, "-n/--ranks", kind)
        if kind == "ring":
            topo = gen.ring(count, bw, alpha, bidirectional=not unidirectional, name=name)
        elif kind == "line":
            topo = gen.line(count, bw, alpha, name=name)
        elif kind == "fully-connected":
            topo = gen.fully_connected(count, bw, alpha, name=name)
        else:
            topo = gen.star(count, bw, alpha, name=name)
    elif kind in ("mesh", "torus"):
        shape = _dims(dims)
        topo = (gen.mesh if kind == "mesh" else gen.torus)(shape, bw, alpha, name=name)
    elif kind == "hypercube":
        if dim is None:
            count = _need(n, "--dim (or -n, a power of two)", kind)
            if count < 1 or count & (count - 1):
                raise SynthError(f"hypercube -n must be a power of two, got {count}")
            dim = count.bit_length() - 1
        topo = gen.hypercube(dim, bw, alpha, name=name)
    elif kind in ("leaf-spine", "fat-tree"):
        topo = gen.leaf_spine(_need(leaves, "--leaves", kind), _need(per_leaf, "--per-leaf", kind), spines, bw,
                              alpha, uplink_bw=uplink_bw, name=name)
    else:
        topo = gen.boxes_behind_nics(
            _need(boxes, "--boxes", kind), per_box, intra=intra, intra_bw=bw, intra_alpha=alpha,
            nics_per_box=nics_per_box, gpu_nic_bw=gpu_nic_bw, nic_bw=nic_bw, ib_switches=ib_switches,
            ib_alpha=ib_alpha, name=name,
        )

    _write_topology(topo, output, as_json)


def _write_topology(topo, output: str | None, as_json: bool, extra: dict | None = None, tail: str = "") -> None:
    """Write ``topo`` to ``output`` (or print its YAML) and report it, as text or ``--json`` (``extra`` keys
    added); a topology that would shadow a built-in name with other content is refused first."""
    from synth.topology.io import check_not_shadowing, dump_topology, save_topology

    check_not_shadowing(topo)   # on stdout too: the text is written to a file next
    if output:
        save_topology(topo, output)
    info = {**_summary(topo), "diameter": _diameter(topo), "output": output, **(extra or {})}
    if as_json:
        if not output:
            from synth.topology.io import topology_to_dict

            info["topology"] = topology_to_dict(topo)
        emit_json(info)
    elif output:
        click.echo(f"wrote {output}: {topo.name}, {topo.num_ranks} ranks, {len(topo.switches)} switches, "
                   f"{len(topo.links)} directed links, {_diameter_text(info['diameter'])}{tail}")
    else:
        click.echo(dump_topology(topo), nl=False)


IMPORT_MAX_NODES = 4096   # boxes one import builds (8 GPUs each: about the schema's rank range of the methods)


def _default_name(path: str, nodes: int) -> str:
    """The file's stem made a valid name (letters, digits, ``.``, ``_``, ``-``), ``-<K>node`` for K nodes."""
    from pathlib import Path

    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.") or "imported"
    return f"{stem}-{nodes}node" if nodes > 1 else stem


@command.command(name="import")
@click.argument("file")
@click.option("--format", "fmt", type=click.Choice(["nvidia-smi", "rocm-smi", "nccl-xml", "msccl-tools"]),
              help="Format of FILE (default: detected from its content).")
@click.option("--nodes", type=count_option(1, IMPORT_MAX_NODES), default=1, show_default=True,
              help="Boxes like FILE's, joined through their NICs by IB switches.")
@click.option("--ib-switches", type=count_option(1, IMPORT_MAX_NODES), default=1, show_default=True,
              help="IB switches for --nodes > 1 (NIC j uses ib<j % k>).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Override a rate (repeatable): link_bw, link_alpha (NVLink/xGMI, per link), pcie_bw, pcie_alpha, "
                   "nic_bw, ib_alpha; GB/s per direction and µs.")
@click.option("--name", help="Topology name (default: FILE's stem).")
@click.option("-o", "--output", type=OUTPUT_FILE, help="File to write (.yaml/.yml or .json); "
              "default: print YAML on stdout.")
@json_option
@guarded
def import_cmd(file: str, fmt: str | None, nodes: int, ib_switches: int, settings: tuple[str, ...], name: str | None,
               output: str | None, as_json: bool) -> None:
    """Build a topology from a machine's own description: `nvidia-smi topo -m`, `rocm-smi --showtopo`
    (with `--shownodesbw` for xGMI link counts), NCCL's topology dump (NCCL_TOPO_DUMP_FILE) or an
    msccl-tools topology JSON (one link unit = one NVLink).

    \b
    Examples:
      nvidia-smi topo -m > topo.txt; synth topology import topo.txt -o box.yaml
      synth topology import topo.txt --nodes 4 --set nic_bw=50 -o cluster.yaml
      synth topology import nccl_topo.xml --format nccl-xml -o box.yaml
    """
    from synth.fileio import read_input_text
    from synth.topology.importers import import_topology, parse_settings

    params = parse_settings(settings)
    text = read_input_text(file, "topology description")
    try:
        box, topo = import_topology(text, fmt, params, nodes=nodes, ib_switches=ib_switches,
                                    name=name or _default_name(file, nodes), source=file)
    except SynthError as exc:
        raise SynthError(f"{file}: {exc}") from None
    _write_topology(topo, output, as_json, {"format": box.fmt, "gpus": box.gpus, "nics": len(box.nics),
                                            "nodes": nodes, "description": topo.description},
                    f" ({box.fmt}, {len(box.nics)} NICs)")


@command.command(name="degrade")
@click.argument("topology")
@fabric_edit_options(baseline=False)
@click.option("--name", help="Name of the new topology (default: TOPOLOGY's name + '-degraded').")
@click.option("-o", "--output", type=OUTPUT_FILE, help="File to write (.yaml/.yml or .json); "
              "default: print YAML on stdout.")
@json_option
@guarded
def degrade_cmd(topology: str, exclude_link: tuple, degrade: tuple, exclude_rank: tuple, name: str | None,
                output: str | None, as_json: bool) -> None:
    """Write TOPOLOGY with links removed (--exclude-link), slowed (--degrade) or ranks taken out
    (--exclude-rank): the fabric a healthy program is then timed on with `synth simulate -t`.

    \b
    Examples:
      synth topology degrade dgx1 --exclude-link 0:1 -o dgx1-no01.yaml
      synth topology degrade dgx-a100-2node --exclude-link b0.nic3:ib1 --degrade 5:b0.nvswitch=0.5 -o a.yaml
    """
    from dataclasses import replace

    from synth.cli.common import load_topology_arg
    from synth.cli.fabric_edits import apply_fabric_edits
    from synth.topology.io import check_not_shadowing, dump_topology, save_topology

    if not (exclude_link or degrade or exclude_rank):
        raise SynthError("topology degrade needs at least one --exclude-link, --degrade or --exclude-rank")
    topo, degraded = apply_fabric_edits(load_topology_arg(topology), exclude_link, degrade, exclude_rank)
    if name:
        topo = replace(topo, name=name)
    check_not_shadowing(topo)
    if output:
        save_topology(topo, output)
    if as_json:
        info = {**_summary(topo), "output": output, **degraded.as_dict()}
        if not output:
            from synth.topology.io import topology_to_dict

            info["topology"] = topology_to_dict(topo)
        emit_json(info)
    elif output:
        click.echo(f"wrote {output}: {topo.name}, {topo.num_ranks} ranks, {len(topo.links)} directed links; "
                   + "; ".join(degraded.changes))
    else:
        click.echo(dump_topology(topo), nl=False)
