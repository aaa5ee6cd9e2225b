"""``auto``: which registered methods to try for a (topology, collective, size), in what order, and
for how long.

The pipeline (:func:`synth.pipeline.synthesize`) runs the plan made here candidate by candidate,
lowers, verifies and simulates each result, and keeps the fastest verified program. This module only
decides *what* to run: it never imports the program, verify or simulate stages.

**Size classes.** ``piece`` is the bytes one rank contributes (SIZE / N for allgather,
reducescatter, alltoall, gather, scatter and allreduce; SIZE for broadcast and reduce). A case is
*bandwidth-bound* when ``piece >= 1 MB`` (``BANDWIDTH_PIECE``) and *latency-bound* otherwise.

**The rule** (``RULES``; a row is tried when its predicate holds and the method supports the
collective; rows are in execution order, cheapest first, except that a bandwidth-bound case (and one where
``trees``' scale path runs below 1 MB pieces, ``_scale_trees``) runs the tree methods, ``leafring``,
``railblocks``, ``multiring``, ``rsag``, ``spantree``, ``trees``, ``mirror`` and ``lp``, first: they are the
expected winners there, and a wall-clock ``--time-limit`` that runs out must cut the baselines, not them).
Figures are simulated gaps ``(time - bound) / time`` from the full sweep of ``notebooks/optimality_gaps.ipynb`` (dgx1,
dgx-a100-2node, mi250, ndv2-2node × allgather, allreduce × 1 KB, 1 MB, 64 MB, 1 GB × every method,
10 s limit), plus the runs named below:

========  ===============================================  =======  =====================================
method    tried when                                        limit    why (measured)
========  ===============================================  =======  =====================================
nvls      a switch declares reduce: true (first); never on     -        in-network reduction halves the bytes
          other fabrics                                              per rank: 8 ranks on one 450 GB/s
                                                                     NVSwitch, 1 GiB allreduce 1.0006x
                                                                     SIZE/bw (hosts: >= 1.75x)
ring      always; first up to 64 ranks, above that last     -        verified fallback everywhere; optimal
          and only if nothing else produced a program                on dgx1 at 64 MB/1 GB (gap 1.3 %/0.1 %);
                                                                     256-rank torus 1 KB allgather: 41 s
                                                                     through the pipeline, 3.7x greedy
leafring  bandwidth-bound, every rank behind one leaf       -        two-level rings: (L-1)+(p-1) steps, so
          switch (leaf_groups); first                                1024-rank leaf-spine 1 GiB allgather
                                                                     0.990 of the bound in 12 s of CPU
                                                                     (a ring's N-1 steps of α: 0.84)
                                                                     and block rings on oversubscribed leaves
                                                                     (leafspine-8x16-2to1 0.9965 in 2 s)
railbl.   bandwidth-bound AG/RS/AR, 2 or more boxes (it     -        one network message per block of a box's
          refuses where they are no crossbars on NIC                 pieces: 128 DGX A100 boxes 1 GiB allgather
          rails); above 256 ranks also where only the                0.948 of the bound (trees 0.908, a message
          box blocks reach 1 MB (first; greedy then a                per piece paying the IB route's α); own
          fallback: _scale_blocks)                                   pieces on few boxes: 8 A100 boxes 0.982
                                                                     (trees 0.978), 17 boxes 0.978 (0.925);
                                                                     512 boxes (4096 ranks) in two stages:
                                                                     0.935 in 365 s of CPU
multir.   bandwidth-bound AG/RS/AR, N <= 256; on a          -        rings at the rank-pair cut rate are
          leaf fabric N <= 128                                       optimal among rings: 8x8 torus 1 GiB
                                                                     AG/AR 0.994 of the bound (ring 0.499),
                                                                     3x3x3 torus 0.996, leaf-spine 8x8
                                                                     0.988, in 3-8 s of CPU
direct    N <= 64 and (alltoall or latency-bound); a        -        alltoall's natural pattern (dgx2 64 MiB
          bandwidth-bound alltoall behind switches up to             1.02x bound, dgx-a100 1.05x); 1 GiB on
          512 ranks                                                  16 A100 boxes 0.934 of the bound, 16x8
                                                                     leaf-spine (4 spines) 0.972, 7 s; 32
                                                                     boxes 0.914 (6 s), 64 boxes 0.923 (24 s)
rdh, dbt  latency-bound, N <= 256 (greedy's scale); rdh also  -        dbt best at 1 KB allreduce on
nccl      on one switch (_crossbar) at every size                    dgx-a100-2node and ndv2-2node; 1-3 s
                                                                     of CPU at 96-256 ranks, where greedy
                                                                     alone took 141 s for a 256-rank
                                                                     leaf-spine's 64 KiB allreduce, 21x
                                                                     rdh's time (_latency_baselines)
levels    latency-bound AR, AG or RS behind             -        reduce in clusters of cheap routes,
          switches, N <= 256 (it reads every rank pair's             doubling among the top leaders: two
          route; switchless, its binomial leaders are
          seldom neighbours)
                                                                     sites 500 us apart 64 KiB 512 us (ring
                                                                     1533), eight 4-GPU boxes on one NIC
                                                                     each 28 us (dbt 50)
hierar.   multi-box, N <= 64                                -        best at 1 KB/1 MB on dgx-a100-2node
greedy    N <= 256; above: alltoall/gather/scatter or       -        cheap (<0.5 s at 16 ranks, 15 s in all
          latency-bound; not where direct's switched                 at 256); best on mi250 1 KB/1 MB, dgx1
          alltoall row above holds, nor bandwidth-bound      1 KB; won every >16-rank case the
          AG/RS/AR on a leaf fabric above 128 ranks                  milp author measured (16 A100 boxes
          (a fallback after trees' scale path where                  alltoall 1 GiB: 0.68 of the bound, 70 s;
          that runs below 1 MB pieces, and after rdh,                32 boxes: over 10 minutes); 256-rank
          dbt, nccl where latency-bound, 65-256 ranks,               2:1 leaf-spine allgather 0.58 in 128 s
          behind leaf switches: _leaf_baselines_first)
trees     N <= 32 at any size; bandwidth-bound at          -        best at 64 MB/1 GB on multi-box fabrics
          N <= 128 or N > 256 (its fast scale path),
          not bandwidth-bound switchless allreduce
          at 17-128 ranks (spantree's), nor AG/RS/AR             (dgx-a100-2node 1 GB 10.1 % vs ring
          above 256 ranks on rail boxes (railblocks');
          AG/RS/AR above 256 ranks on a torus whose
          pieces take >= 8 α (_scale_trees)
                                                                     54.5 %; dgx-a100-4node 1 GiB 1.05x
                                                                     bound vs greedy 3.5x) and at 1 KB/1 MB
                                                                     on ndv2-2node. The exact packing
                                                                     takes 19 s at 128 ranks (8x16 torus),
                                                                     164 s at 256 (16x16 torus, 1 GiB:
                                                                     2.5 % better than greedy), ignoring
                                                                     any limit, so 129-256 is greedy's
rsag      bandwidth-bound allreduce, 64 < N <= 128, on      -        trees' best allgather's time mirror, then
          a fabric equal to its reverse whose allreduce              that allgather: mi250x8-ib12.5 1 GiB
          bound is the RS + AG bounds (_rsag); trees,                0.906 (trees 0.853), torus-4x4x8 0.987
          spantree and greedy then only as fallbacks;                (spantree 0.967); 12 ranks in three
          N <= 24: the same, after trees                             uplinked boxes 0.963 (leafring 0.866)
mirror    bandwidth-bound AG/RS, N <= 24, broadcast /  -        the other collective's trees program run
          reduce, N <= 64, on a fabric equal to its                  backwards: mixed-mi250-h100 1 GiB
          reverse (_mirror); after trees                             reducescatter 0.981 (trees 0.972)
lp        bandwidth-bound, N <= 32, and no switches     20 s     best on mi250 64 MB in the sweep (23.3 %
          and <= 60k LP columns (lp.AUTO_VARIABLES;      (25k     vs trees 30.9 %; today's trees: 224 us
          its simplex 25k iterations at 20 units),       iter.)
          or alltoall; alltoall N <= 64, behind                      vs lp 240 us); ties trees behind
          switches up to 128                                         switches, hence not tried there but
                                                                     for alltoall, where its concurrent
                                                                     flow's paths in rounds of circuits
                                                                     beat direct and greedy (1 GiB:
                                                                     mi250-2node 0.998 of the bound vs
                                                                     0.499, torus-3x3x3 0.987 vs 0.692,
                                                                     torus 8x8 0.989 vs 0.888 in 24 s; 8
                                                                     A100 boxes, 64 ranks, on the runtime's
                                                                     routes: 0.994 vs direct's 0.884; 16
                                                                     boxes, 128 ranks: 0.988 vs 0.934, 34 s)
spantr.   bandwidth-bound allreduce, no switches,     -        reduce + broadcast over packed spanning
          N <= 128                                                   trees reaches the strength (partition)
                                                                     bound's rate: mesh-8x8 1 GiB 0.876
                                                                     (multiring 0.67), rr4-32-s2 0.923 of
                                                                     the tightened bound (trees 0.55)
pareto    N <= 8, no switches, latency-bound                10 s     best at 1 MB on dgx1 (43.4 % vs ring
                                                                     45.7 %); can stay undecided on NICs
milp      N <= 16 and (alltoall, or latency-bound           30 s     on CP-SAT: optimal in 0.1 s on dgx1/
          allgather/reducescatter/allreduce)                (5 s)    mi250 1 KB; behind switches at 16
                                                                     ranks 5 s (it rarely beats greedy
                                                                     there): dgx-a100-2node 1 KB allgather
                                                                     optimal in the epoch model in 2.3 s,
                                                                     0.657 of the bound against rdh's
                                                                     0.435 (on HiGHS its root node ran
                                                                     past the 100 s safety stop)
========  ===============================================  =======  =====================================

**Small messages behind a switch** (issue 35, ``benchmarks/bench_small.py``). There ``milp`` runs its port
model (one run of consecutive chunks per port transfer, recursive doubling as a warm start): behind one
switch with a power-of-two rank count it meets its epoch lower bound without a solve (dgx2 1 KB allgather in
place: 2.808 µs, 1.003x the bound, where it used to run to its limit), and ``rdh`` does allreduce by plain
recursive doubling (dgx-a100 1 KB: 4.21 µs, 1.002x, against 8.41 for reduce-scatter + allgather).

**Alltoall chunking.** ``auto`` no longer tries ``milp`` with 2, 3 and 4 chunks per piece on small
switchless alltoalls. HiGHS' work limit is a node count and one node of those models can take seconds, so
the runs lasted until the wall-clock stop (dgx1 64 MiB, 3 chunks: 75 s on the loaded development machine,
4 chunks cut at 100 s): whether they finished depended on the machine's load. They never changed the
result: ``lp`` gives 1.016x on dgx1 (3 chunks 1.0125x, which no power-of-two buffer divides, so the
runtime-runnable lp program is kept; 4 chunks 1.048x) and 1.003x on ring-8; auto takes 1.7 s instead of
110 s there. ``--chunks`` given by the user is used for every candidate instead.

**Budgets are deterministic work.** The same topology, collective, SIZE and options give the same
program on an idle and on a loaded machine. A candidate's "limit" above is deterministic solver work
(``SynthOptions.work_limit``: CP-SAT deterministic time on a fixed worker count, branch-and-bound
nodes; :mod:`synth.solvers`), never seconds of wall clock. The wall clock is only a *safety stop*:
``--time-limit`` (none unless the user gives one) bounds the whole plan, and a candidate with a work
limit also stops after ``CLOCK_FACTOR`` (20) times it in seconds: a stop for a hang, far enough that a
loaded machine never reaches it. ``milp`` runs on CP-SAT (``MILP_SOLVER``) unless ``--solver`` names another:
HiGHS bounds branch-and-bound nodes but not its root node (presolve, cuts, heuristics), which behind switches
took past the stop (dgx-a100-2node 1 KB allgather: over 100 s on HiGHS, optimal in the epoch model in 2.3 s on
CP-SAT). (At 2× a MILP
given 30 s of deterministic work was cut on the 2-core development machine beside a test suite, and
`synth tune` then wrote a different program set than on an idle machine). A candidate that a clock
stops reports ``not_tried`` with the reason and its program is not used; once ``--time-limit`` runs
out, every later candidate reports ``not_tried`` too (never a silently different program).
``SynthesisResult.not_tried`` lists them for ``--json`` and the table.

**Floors.** A method may prove a floor for an instance (``MethodSpec.floor_us``: no program of it is faster;
``multiring``'s is the ring traffic over the weakest cut that splits the ranks). Where the floor is more than
``CLOSE_ENOUGH`` above the lower bound the method cannot stop the plan early, so it runs after the other tree
methods, and the pipeline skips it once a verified program is as fast as its floor: on two MI250 boxes rings
reach at most 0.75 of the bound, and multiring took 16 s of CPU for 0.185 (mi250x2-ib16 allgather, 43.0 -> 27.2 s
in all, the same program).

**Early stop.** The pipeline stops the plan once the best verified program is within
``CLOSE_ENOUGH`` (1 %) of the lower bound of :func:`synth.lower_bounds.compute_bounds`: no later candidate
can gain more. The rest are listed in ``tried`` as ``skipped``.

**Quickstart** (``synth synthesize -t dgx1 -c allgather``, 1 GiB): trees first (bandwidth-bound), then the
ring, 1.001x the bound, so nothing else runs. dgx1 allgather 1 KB: greedy reaches 1.007x after the baselines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from synth.synthesis.base import BANDWIDTH_PIECE, Instance, SynthOptions  # noqa: F401  (re-exported)
from synth.synthesis.registry import METHODS, registered

MIN_START_S = 0.5            # a candidate is not started with less than this left of --time-limit
CLOCK_FACTOR = 20.0          # a candidate with a work limit W stops (not_tried) after CLOCK_FACTOR * W s
MILP_SOLVER = "cp-sat"       # auto's milp candidate's solver where --solver is the default (candidate_options)
DEFAULT_SOLVER = SynthOptions.solver
# first where bandwidth-bound (expected quality)
TREE_METHODS = ("leafring", "railblocks", "multiring", "rsag", "spantree", "trees", "mirror", "lp")
BASELINE_MAX_RANKS = 64      # baselines (and ring first) up to this scale
SPANTREE_MAX_RANKS = 128     # spanning-tree allreduce (switchless): its packing LP takes ~10 s at 128 ranks
TREES_ALLREDUCE_RANKS = 16   # ... and above this many ranks trees gives it way there (_spantree_allreduce)
GREEDY_MAX_RANKS = 256       # greedy at every size and collective up to this scale
EXACT_TREES_SLOW = 128       # trees' exact packing is skipped above this ...
LARGE_TREES = 256            # ... up to where its fast scale path starts (trees.LARGE_RANKS)
SCALE_PIECE_ALPHAS = 8.0     # ... which also runs below BANDWIDTH_PIECE where a piece costs this many α (_scale_trees)
MULTIRING_LEAF_RANKS = 128   # multiring after leafring on a leaf fabric up to here (_multiring_on_leaves)
RSAG_ABOVE = 64              # an allreduce's phases (rsag) in place of its own trees and spantree above this (_rsag)
RSAG_BESIDE = 24             # ... and after them up to this many ranks, where a trees search is cheap (_rsag)
MIRROR_MAX_RANKS = 24        # an allgather or reducescatter also as the other's mirror up to this (_mirror) ...
MIRROR_ROOTED_MAX_RANKS = 64  # ... a broadcast or reduce up to this (one root's trees: 18 s of CPU at 64 ranks)
CLOSE_ENOUGH = 0.01          # stop once the best program is within 1 % of the lower bound
SWITCHED_ALLTOALL_RANKS = 512  # bandwidth-bound alltoall behind switches: direct, no greedy, up to here ...
SWITCHED_ALLTOALL_LP_RANKS = 128  # ... and lp up to here (32 boxes: 0.734 of the bound in 74 s, direct 0.914)


@dataclass(frozen=True)
class Rule:
    method: str
    when: Callable[[Instance], bool]
    limit_s: float | Callable[[Instance], float] | None = None   # per-candidate cap; None: no solver

    def limit(self, inst: Instance) -> float | None:
        return self.limit_s(inst) if callable(self.limit_s) else self.limit_s


def _in_network(inst: Instance) -> bool:
    """Some switch reduces in the network (issue 35): ``nvls`` is tried (it says why where its shapes do not
    fit). False on every fabric without ``reduce: true``, so nothing changes there."""
    return inst.ranks >= 2 and bool(inst.topology.reducing_switches)


def _small(inst: Instance) -> bool:
    return inst.ranks <= BASELINE_MAX_RANKS


def _crossbar(inst: Instance) -> bool:
    """Every rank hangs off one switch and nothing else (an NVLink domain of 72 GPUs, a single InfiniBand switch):
    every rank pair is then one contention-free hop, where recursive doubling, or Bruck's rounds where N is no
    power of two (``rdh``), is bandwidth-optimal in ``⌈log2 N⌉`` messages per rank and phase; a ring or tree packing
    sends ``N − 1`` (72 ranks at 900 GB/s, α 0.8 µs a route, 1 GiB allgather: 0.954 of the bound against 0.991)."""
    topology = inst.topology
    if len(topology.switches) != 1:
        return False
    switch = topology.num_ranks
    return (len(topology.links) == 2 * topology.num_ranks
            and all(switch in (link.src, link.dst) for link in topology.links))


def _latency_baselines(inst: Instance) -> bool:
    """A latency-bound case up to ``GREEDY_MAX_RANKS``: rdh, dbt and nccl run before greedy. Past
    ``BASELINE_MAX_RANKS`` greedy was the only candidate there, and it sends one message per piece and hop: 64 KiB
    allreduce on a 128-rank 2:1 leaf-spine 1231 µs against rdh's 45 (AG 1 MiB: 635 against 71), on eight MI250
    boxes 217 against 36, on a 16x16 torus 67 against dbt's 27; each baseline takes 1-3 s of CPU there (dbt
    11 s on a 4x4x8 torus)."""
    return inst.latency_bound and inst.ranks <= GREEDY_MAX_RANKS


def _leaf_baselines_first(inst: Instance) -> bool:
    """A latency-bound case of ``BASELINE_MAX_RANKS`` to ``GREEDY_MAX_RANKS`` ranks behind leaf switches
    (:func:`synth.synthesis.leafring.leaf_groups`): greedy runs only if rdh, dbt and nccl made no program. Its
    messages per piece and hop cross the leaves' uplinks one circuit at a time: 64 KiB allreduce on leaf-spines of
    96 / 128 / 256 ranks 1300.9 / 1231.4 / 2569.0 µs against dbt's 146.2, rdh's 45.1 and 124.4, and 141 s of CPU at
    256 ranks (allgather 1 MiB: 722.0 / 635.1 / 1361.5 against 516.5 / 71.2 / 247.7)."""
    from synth.synthesis.leafring import leaf_groups

    return _latency_baselines(inst) and not _small(inst) and bool(leaf_groups(inst.topology))


def _greedy(inst: Instance) -> bool:
    return (inst.ranks <= GREEDY_MAX_RANKS or inst.collective.name in ("alltoall", "gather", "scatter")
            or inst.latency_bound)


def _scale_trees(inst: Instance) -> bool:
    """An allgather, reducescatter or allreduce past ``LARGE_TREES`` ranks on a torus (read from the links,
    ``scale.torus_dims``: where trees' scale path builds translated trees) whose pieces are small only because
    SIZE is cut N ways: each still takes ``SCALE_PIECE_ALPHAS`` α or more on the widest link
    (``Instance.piece_alphas``), so the case is bandwidth-bound in every sense but ``BANDWIDTH_PIECE``'s. trees'
    scale path runs first there and greedy only as a fallback: the 64×32 torus 1 GiB allgather (512 KiB pieces,
    21 α) took greedy 161 s of CPU for 0.910 of the bound and trees 143 s for 0.954; greedy's own run grows
    faster than its N² transfers (11 s at 1024 ranks, 76 s at 2048). On other switchless fabrics the scale path
    packs balanced BFS trees, which lost to greedy (32×32 mesh allgather at 256 MiB, 10.5 α: 0.866 against
    0.912), so nothing changes there."""
    if not (inst.ranks > LARGE_TREES and inst.collective.name in ("allgather", "reducescatter", "allreduce")
            and (inst.bandwidth_bound or inst.piece_alphas >= SCALE_PIECE_ALPHAS)):
        return False
    return inst.torus_dims is not None


def _switched_alltoall(inst: Instance) -> bool:
    """A bandwidth-bound alltoall behind switches past the baselines' scale, up to
    ``SWITCHED_ALLTOALL_RANKS``: direct (and lp's runtime-route rounds up to
    ``SWITCHED_ALLTOALL_LP_RANKS``), not greedy (module docstring)."""
    return (inst.collective.name == "alltoall" and inst.switches and inst.bandwidth_bound
            and BASELINE_MAX_RANKS < inst.ranks <= SWITCHED_ALLTOALL_RANKS)


def _spantree_allreduce(inst: Instance) -> bool:
    """A bandwidth-bound switchless allreduce past ``TREES_ALLREDUCE_RANKS`` ranks: ``spantree`` and ``multiring``
    serve it and ``trees`` does not run. Its reduce-scatter + allgather cannot pass the traffic bound's RS + AG
    share where spantree reaches the strength (mesh-8x8 0.67 against 0.914, mesh-4x4x4 0.68 against 0.90) and took
    94-317 s of CPU at 64 ranks; where it wins, on tori, multiring is within 0.5 % of it (torus-4x4x4 0.9882
    against 0.9835). At 32 ranks it lost on all four random regular graphs of bench_fabrics (rr3-32 / rr4-32
    seeds 1 and 2: 0.64-0.79 of spantree's speed) for 60-100 s of CPU that took rr3-32-s2 to 143 s, and at 25
    and 27 ranks (mesh-5x5, torus-3x3x3) auto kept spantree and multiring over it (no runnable chunk count)."""
    return (inst.collective.name == "allreduce" and inst.bandwidth_bound and not inst.switches
            and TREES_ALLREDUCE_RANKS < inst.ranks <= SPANTREE_MAX_RANKS)


def _leaf_fabric(inst: Instance) -> bool:
    """A bandwidth-bound case on a fabric whose ranks sit behind leaf switches
    (:func:`synth.synthesis.leafring.leaf_groups`): ``leafring`` runs first."""
    from synth.synthesis.leafring import leaf_groups

    return inst.bandwidth_bound and bool(leaf_groups(inst.topology))


def _leafring_only(inst: Instance, above: int) -> bool:
    """A bandwidth-bound allgather, reducescatter or allreduce of more than ``above`` ranks on a leaf fabric,
    where leafring is the method: at 256 ranks (leafspine-16x16, 1 GiB) it reaches 0.991-0.996 of the bound
    in about a second where multiring took 144-152 s for 0.9545, and at 1024 ranks the trees' and the ring's
    runs cost more than a minute for less (ring 0.84 reducescatter, 0.47 allreduce). Above 128 ranks greedy is
    not tried there either: leafspine-16x16-2to1 1 GiB allgather 0.58 of the bound in 128 s of CPU (leafring
    0.931, multiring 0.9545 in 15 s)."""
    return (_leaf_fabric(inst) and inst.ranks > above
            and inst.collective.name in ("allgather", "reducescatter", "allreduce"))


def _multiring_on_leaves(inst: Instance) -> bool:
    """multiring after leafring on a leaf fabric up to ``MULTIRING_LEAF_RANKS`` ranks. Above that leafring is the
    method on oversubscribed leaves too: its block rings (:func:`synth.synthesis.leafring.blockring_schedule`)
    reach 0.9936 of the bound on leafspine-16x16-2to1 (1 GiB allgather, reducescatter, allreduce) in 3-4 s of
    CPU, where multiring's rings took 146 s through auto for 0.9545 and its allreduce ran past 4 minutes."""
    return not _leafring_only(inst, MULTIRING_LEAF_RANKS)


def _rsag(inst: Instance) -> bool:
    """An allreduce of more than ``RSAG_ABOVE`` ranks whose bound is its phases' sum, on a fabric equal to its
    reverse (:func:`synth.synthesis.rsag.applies`): trees' best allgather and its mirror, one after the other. The
    allreduce's own trees and spantree, and greedy (8 s of CPU for 0.17 of the bound on mi250x8-ib12.5), then run
    only where it made no program (``plan``). At 128 ranks the phases
    won on every such fabric of bench_fabrics (1 GiB: mi250x8-ib12.5 0.906 against trees' 0.853, -ib16 0.875
    against 0.822, -ib50 0.863 against 0.802, -ib25 equal; torus-4x4x8 0.987 against spantree's 0.967), and
    running both takes mi250x8-ib16 past 200 s of CPU. At 48-64 ranks neither won everywhere (mi250x4-ib12.5 0.967
    against 0.937, mi250x4-ib25 0.908 against 0.930) and both together took up to 117 s, so the allreduce's own
    search stays there alone. Up to ``RSAG_BESIDE`` ranks, where a trees search takes seconds, the phases run
    after the allreduce's own tree methods instead, as ``mirror`` does for the phases themselves: three switch
    boxes of four GPUs, each box on one 50 GB/s uplink (fuzz64), 1 GiB: leafring 0.866, trees 0.854, the phases
    0.963 in 1.7 s of CPU."""
    from synth.synthesis.rsag import applies

    return (inst.ranks > RSAG_ABOVE or inst.ranks <= RSAG_BESIDE) and applies(inst)


def _mirror(inst: Instance) -> bool:
    """An allgather or reducescatter of at most ``MIRROR_MAX_RANKS`` ranks, or a broadcast or reduce of at most
    ``MIRROR_ROOTED_MAX_RANKS``, on a fabric equal to its reverse (:func:`synth.synthesis.mirror.applies`): after
    ``trees``, the time mirror of trees' program for the other collective, which its different search makes faster
    on some fabrics (1 GiB reducescatter: mixed-mi250-h100 0.9718 -> 0.9814, mixed-mi250-a100 0.9623 -> 0.9693,
    a100x3 0.9787 -> 0.9798; reduce to rank 0: two data centres 500 µs apart 31708 -> 29866 µs, four MI250 boxes at
    16 GB/s per GCD 4876 -> 4820 µs). It runs a second trees search, so only where the two stay well within two
    minutes of CPU: at 24 ranks they took up to 45 s (mixed-mi250-h100); at 32 ranks two MI250 boxes took 146 s
    (mi250x2-ib25's allgather, for 0.9343 -> 0.9367); one root's forest is cheaper (a 64-rank broadcast 18 s)."""
    from synth.synthesis.mirror import applies

    limit = MIRROR_ROOTED_MAX_RANKS if inst.collective.is_rooted else MIRROR_MAX_RANKS
    return inst.ranks <= limit and applies(inst)


def _milp(inst: Instance) -> bool:
    if inst.ranks > 16:
        return False
    return inst.collective.name == "alltoall" or (
        inst.latency_bound and inst.collective.name in ("allgather", "reducescatter", "allreduce"))


def _railblocks_only(inst: Instance) -> bool:
    """Above ``LARGE_TREES`` ranks on boxes joined by NIC rails railblocks is the method: trees' scale path sends
    a network message per piece (128 DGX A100 boxes, 1 GiB: trees 0.908 against railblocks 0.951 / 0.958 / 0.955)
    and running it too took auto's allreduce to 219 s of CPU and 6 GB."""
    if not (inst.ranks > LARGE_TREES and inst.boxes >= 2
            and inst.collective.name in ("allgather", "reducescatter", "allreduce")
            and (inst.bandwidth_bound or _box_blocks_bandwidth_bound(inst))):
        return False
    from synth.synthesis.railblocks import has_rail_boxes
    return has_rail_boxes(inst.topology)


def _box_blocks_bandwidth_bound(inst: Instance) -> bool:
    """A box's pieces together (what railblocks sends as one block per destination box) reach
    ``BANDWIDTH_PIECE``: railblocks moves blocks, not pieces, so a case whose pieces are small only because SIZE is
    cut N ways is bandwidth-bound for it (512 DGX A100 boxes at 1 GiB: 256 KiB pieces, 2 MiB blocks)."""
    return inst.piece_bytes * inst.ranks / max(inst.boxes, 1) >= BANDWIDTH_PIECE


def _scale_blocks(inst: Instance) -> bool:
    """Past ``LARGE_TREES`` ranks on rail boxes whose pieces are below ``BANDWIDTH_PIECE`` but whose box blocks
    are not (:func:`_box_blocks_bandwidth_bound`): railblocks runs first there and greedy only as a fallback
    (greedy sends a message per piece; 512 A100 boxes, 4096 ranks, 1 GiB: railblocks' two-stage blocks)."""
    return not inst.bandwidth_bound and _railblocks_only(inst)


def _small_lp(inst: Instance) -> bool:
    """lp's forest LP (one per phase, every rank a root) has at most ``lp.AUTO_VARIABLES`` columns: it takes no
    work limit, so auto bounds its size instead (rr4-32-s1 allreduce: 131k columns, 762 s of CPU)."""
    from synth.synthesis import lp

    return lp.lp_columns(inst.topology, inst.ranks) <= lp.AUTO_VARIABLES


def _milp_limit(inst: Instance) -> float:
    return 5.0 if inst.switches and inst.ranks > 8 else 30.0


# Execution order = row order (cheapest first), the tree methods first where bandwidth-bound; above
# BASELINE_MAX_RANKS ``ring`` moves to the end as a fallback (see ``plan``).
RULES: tuple[Rule, ...] = (
    Rule("nvls", _in_network),
    Rule("ring", lambda i: True),
    Rule("leafring", _leaf_fabric),
    Rule("railblocks", lambda i: i.bandwidth_bound and i.boxes >= 2 or _scale_blocks(i)),
    Rule("multiring", lambda i: i.bandwidth_bound and i.ranks <= GREEDY_MAX_RANKS and _multiring_on_leaves(i)),
    Rule("rsag", lambda i: i.bandwidth_bound and _rsag(i)),
    Rule("spantree", lambda i: i.bandwidth_bound and not i.switches and i.ranks <= SPANTREE_MAX_RANKS),
    Rule("direct", lambda i: _small(i) and (i.collective.name == "alltoall" or i.latency_bound)
         or _switched_alltoall(i)),
    Rule("rdh", lambda i: _latency_baselines(i) or _crossbar(i)),
    Rule("levels", lambda i: i.collective.name in ("allreduce", "allgather", "reducescatter") and i.switches
         and _latency_baselines(i)),
    Rule("dbt", _latency_baselines),
    Rule("nccl", _latency_baselines),
    Rule("hierarchical", lambda i: _small(i) and i.boxes >= 2),
    Rule("greedy", lambda i: _greedy(i) and not _switched_alltoall(i) and not _leafring_only(i, MULTIRING_LEAF_RANKS)),
    Rule("trees", lambda i: (i.ranks <= 32 or (i.bandwidth_bound and not EXACT_TREES_SLOW < i.ranks <= LARGE_TREES)
                             or _scale_trees(i))
         and not _spantree_allreduce(i) and not _leafring_only(i, LARGE_TREES) and not _railblocks_only(i)),
    Rule("mirror", lambda i: i.bandwidth_bound and _mirror(i)),
    Rule("lp", lambda i: i.bandwidth_bound and (
        i.ranks <= 32 and (not i.switches and _small_lp(i) or i.collective.name == "alltoall")
        or i.ranks <= 64 and i.collective.name == "alltoall")
        or _switched_alltoall(i) and i.ranks <= SWITCHED_ALLTOALL_LP_RANKS, 20.0),
    Rule("pareto", lambda i: i.ranks <= 8 and not i.switches and i.latency_bound, 10.0),
    Rule("milp", _milp, _milp_limit),
)


@dataclass(frozen=True)
class Candidate:
    """One run of the plan: a method, its own work limit (deterministic work, synth.solvers; None = no
    solver), its chunk count
    (None = the user's or the method's choice), and whether it only runs when nothing before it
    produced a program (``fallback``)."""

    method: str
    limit_s: float | None = None
    chunks: int | None = None
    fallback: bool = False
    floor_us: float | None = None   # no program of the method is faster (MethodSpec.floor_us), where known


def rules() -> tuple[Rule, ...]:
    """The built-in ``RULES``, then the rule each method added with :func:`registry.register` carries
    (``MethodSpec.auto``), in registration order."""
    own = tuple(Rule(spec.name, spec.auto.when, spec.auto.limit_s) for spec in registered()
                if spec.auto is not None and all(r.method != spec.name for r in RULES))
    return RULES + own


def candidates(inst: Instance) -> list[str]:
    """Registered methods, in execution order, that support the collective and whose rule accepts
    this instance."""
    name = inst.collective.name
    return [r.method for r in rules()
            if r.method in METHODS and name in METHODS[r.method].collectives and r.when(inst)]


def plan(inst: Instance, bound_us: float | None = None) -> list[Candidate]:
    """:func:`candidates` in order of expected quality, with each one's work limit (module docstring).
    Names without a rule (tests, plug-ins) run with no limit of their own.

    ``bound_us``: the instance's lower bound. A method with a floor (``MethodSpec.floor_us``) above
    ``CLOSE_ENOUGH`` of it can never end the plan early, so it runs after the tree methods that may; the pipeline
    skips it once a verified program is as fast as its floor (multiring on MI250 boxes: rings reach at most
    0.75 of the bound there, and its circuits took 9-56 s of CPU for 0.07-0.19)."""
    out: list[Candidate] = []
    names = candidates(inst)
    # Above BASELINE_MAX_RANKS the ring runs only if nothing else produced a program: 256-rank torus,
    # 1 KB allgather: ring 41 s through the pipeline for 3.7x greedy's time (greedy 15 s).
    demote = not _small(inst) and "ring" in names and len(names) > 1
    if demote:
        names = [n for n in names if n != "ring"] + ["ring"]
    scale_trees = _scale_trees(inst) or _scale_blocks(inst)
    greedy_last = scale_trees or _leaf_baselines_first(inst)   # greedy only where nothing before made a program
    if inst.bandwidth_bound or scale_trees:   # the expected winners first (module docstring)
        first = ("nvls", *TREE_METHODS)
        names = [n for n in names if n in first] + [n for n in names if n not in first]
    # a name outside METHODS (a test's stand-in) has no floor
    floors = {name: spec.floor_us(inst) for name in names
              if (spec := METHODS.get(name)) is not None and spec.floor_us is not None}
    if bound_us is not None:
        late = [n for n in names if floors.get(n) is not None and not close_enough(floors[n], bound_us)]
        kept = [n for n in names if n not in late]
        trees_at = [i for i, n in enumerate(kept) if n in TREE_METHODS]
        if late and trees_at:
            names = kept[:trees_at[-1] + 1] + late + kept[trees_at[-1] + 1:]
    # a planned method that stands in for others leaves them as fallbacks (rsag: the allreduce's own tree methods),
    # except where it runs beside them, after trees (rsag on few ranks, _rsag)
    beside = "rsag" in names and inst.ranks <= RSAG_BESIDE
    if beside and "trees" in names:
        names.remove("rsag")
        names.insert(names.index("trees") + 1, "rsag")
    superseded = {other for name in names if name in METHODS and not (beside and name == "rsag")
                  for other in METHODS[name].supersedes}
    for name in names:
        rule = next((r for r in rules() if r.method == name), None)
        limit = rule.limit(inst) if rule is not None else None
        fallback = (demote and name == "ring" or greedy_last and name == "greedy" or name in superseded)
        out.append(Candidate(name, limit, fallback=fallback, floor_us=floors.get(name)))
    return out


def budget_s(options: SynthOptions) -> float | None:
    """The wall-clock safety stop for the whole plan: ``--time-limit`` if given, else None (no stop)."""
    return float(options.time_limit) if options.time_limit is not None else None


def candidate_options(options: SynthOptions, cand: Candidate, left_s: float | None) -> SynthOptions | None:
    """The options one candidate runs with, given ``left_s`` seconds of ``--time-limit`` (None: no
    limit); None to skip it (less than ``MIN_START_S`` left).

    ``work_limit`` is the candidate's own (deterministic); ``time_limit``, the wall-clock safety stop,
    is what is left of ``--time-limit``, at most ``CLOCK_FACTOR`` × the work limit; ``chunks`` is the
    candidate's own, else the user's."""
    if left_s is not None and left_s < MIN_START_S:
        return None
    clock = left_s
    if cand.limit_s is not None:
        own = CLOCK_FACTOR * cand.limit_s
        clock = own if clock is None else min(own, clock)
    chunks = cand.chunks if cand.chunks is not None else options.chunks
    # HiGHS bounds a MIP's branch-and-bound nodes but not its root (presolve, cuts, heuristics): behind switches a
    # root took past the 100 s safety stop (dgx-a100-2node 1 KB allgather, a 12-rank two-switch 4 MiB allgather),
    # so whether milp ran depended on the machine's load. CP-SAT's deterministic time bounds all of its work.
    solver = MILP_SOLVER if cand.method == "milp" and options.solver == DEFAULT_SOLVER else options.solver
    return replace(options, time_limit=clock, work_limit=cand.limit_s, chunks=chunks, solver=solver)


def close_enough(time_us: float, bound_us: float) -> bool:
    """True when a verified program is within ``CLOSE_ENOUGH`` of the lower bound: no later candidate
    can gain more than that, so the plan stops there."""
    return bound_us > 0 and time_us <= bound_us * (1 + CLOSE_ENOUGH)
