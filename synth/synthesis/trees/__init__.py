"""Method ``trees``: throughput-optimal pipelined spanning trees (ForestColl, arXiv 2402.06787).

Planning (see :mod:`synth.synthesis.packing`): the exact cut-bound rate, switch removal by edge
splitting, and ``k`` spanning out-arborescences per root (a few distinct trees with multiplicities).

Collectives:
- allgather: every rank broadcasts its piece over its ``k`` trees;
- broadcast / scatter: the root's trees (scatter sends each rank's piece down the root->rank path of
  the trees; the rate is then the broadcast forest's, optimal for broadcast, a heuristic for scatter);
- reducescatter / reduce / gather: the broadcast schedule planned and timed on the *reversed*
  fabric, then mirrored in time (t -> T - t) and direction: data flows leaf -> root along each
  tree and ranks combine (reduce) or relay (gather) on the way; the makespan, link serialization
  and data dependencies carry over unchanged;
- allreduce: the optimal reducescatter (every rank owns ``1/N`` of the buffer) then the optimal
  allgather of the reduced pieces, in one schedule; where it is faster, the two overlap (a piece's
  allgather leaves its owner once its reduction is complete there, :func:`timed_forward`). On
  switchless fabrics where the phases' bottlenecks differ (a mesh), the two forests are also planned
  on link capacities split between them by an LP (:mod:`synth.synthesis.split`), rounded to whole
  trees in both phases at once, and run side by side (:func:`split_allreduce`); the faster
  allreduce is kept.

Chunking (cost model). A root's data of ``M`` bytes is cut into ``C`` chunks; a distinct tree of
multiplicity ``m`` carries ``≈ C·m/k`` of them (largest remainder), each chunk pipelined down the
tree. For a candidate ``C`` with chunk size ``b = M/C`` we predict

    time(C) ≈ max_link Σ_{transfers on it} (α_route + b / bw_route)  +  (D − 1) · (α_max + b / bw_min)

(busiest link's α-β work, plus the pipeline fill/drain of the deepest tree, depth ``D``). The first
term grows with ``C`` through α, the second shrinks; we take the ``C`` minimising it, bounded by
MSCCL's limits (≤ 32 channels × 64 steps per connection). Timings in the Schedule come from an
in-order list schedule: transfers in pipeline-round order, each starting when its data is ready
and every link of its route is free (one transfer at a time per link direction, docs/cost-model.md). Where
schedules are cheap the neighbouring pipeline depths are timed too and the fastest is kept, and
where fill, drain and α cost more than 1 % the last message of every tree is also split
geometrically (:func:`message_shapes`): large messages mid-pipeline, small ones where the drain starts.
A message of more than 71 chunks is lowered as several MSCCL steps and is timed with one α per step.

Coalescing (broadcasts, and reductions timed as mirrored broadcasts): when a link frees up, the
transfer it starts also carries the queued transfers of the same root that continue its chunks on
the same route (one step with ``cnt`` > 1, one α), until α is ``timing.ALPHA_SHARE`` of the message. Only
bottleneck links build such a backlog, so α drops where it costs time while the pipeline keeps
small messages elsewhere; each phase keeps the faster of the coalesced and the plain timing. The
shape the search settles on is built once more with each share in ``TUNING.alpha_shares``: where α is most
of the gap (NVSwitch ports pay it twice), half the share means longer messages and fewer α.
The shape finally kept (after the trees-per-root search) is polished (:func:`polish`, ``TUNING.polish``):
timed again with messages that are at most ``0.7×`` what their links still carry after them
(each link's stream ends in shrinking messages while its earlier ones grow) and with the transfers
ready at one instant queued together before a link starts one (so the first does not leave alone).
The search's next best shapes are timed there too (batched only where their schedules are large), and
the shapes planned within ``TUNING.runner_up_margin`` of the fastest go with it as alternatives the
pipeline simulates: close plans can simulate far apart on switch fabrics.

Round timing: where α, fill and drain still cost more than 1 % at a bandwidth-bound SIZE, the same
forests are also timed by rounds (:mod:`synth.synthesis.rounds`): an LP over ``TUNING.rounds`` rounds
chooses which prefix of each tree's data crosses each tree edge in which round, with one α per
message, and every connection then sends in round order as soon as data and links allow. The faster
schedule is kept (mi250 1 GiB allgather: 0.968 of the bound as a list schedule, 0.985 by rounds).
The LP grows with tree edges × rounds; beyond ``TUNING.round_variables`` shares (over the distinct LPs of
all phases) it is not tried, nor on
switch fabrics (see :func:`schedule_from_plans`).

Switches: ranks are first paired through the switches so that no two rank pairs share a switch
link (:func:`synth.synthesis.packing.disjoint_pair_split`; rails between boxes, a ring inside a
box or over all ranks), kept only when the optimal rate survives; a routed transfer then never
waits for another pair's transfer (docs/cost-model.md: a transfer holds its whole route). Otherwise general edge
splitting (below) applies.

Routes: an MSCCL program names peers, not paths, so a planned arc through switches may only use
the path a send between those ranks takes (:func:`synth.topology.routes.rank_routes`, the simulator's rule);
switch splitting is restricted to such paths, which can cost rate on fabrics whose fixed paths leave
links idle (e.g. a second spine).

Scale: beyond ``TUNING.large_ranks`` ranks one tree per root comes from :mod:`synth.synthesis.scale`.
Translates of one tree (tori, boxes) are timed once and the times copied to every translate
(:func:`slot_schedule`, :func:`replicated_schedule`); other huge schedules level by level
(:func:`level_schedule`). Up to ``TUNING.tree_search_ranks`` ranks 16, 8 and 4 trees per root are tried
besides the optimum's count (fewer messages per link at a rate within ~1/K of the optimum).
Reductions are also timed forward, leaf to root (:func:`timed_forward`), below ``TUNING.forward_jobs``.

Composed forests (:mod:`.composed`): on equal switchless boxes joined by rails (MI250 GCDs, each on its own
NIC), the rails from every rank to its position in the other boxes plus the box's optimal forest copied into
every box; pipelined too where their bandwidth time leaves room below the schedule kept, and kept where faster
(fewer distinct trees than the whole fabric's packing, so fewer α: 3 MI250 boxes at 16 GB/s, 1 GiB allgather).

Modules: :mod:`.forest` (planning), :mod:`.composed` (rails + box forests), :mod:`.jobs` (messages down and up
trees), :mod:`.messages`
(message shapes, chunk counts, MSCCL limits), :mod:`.timed` (timing forests on
:mod:`synth.synthesis.timing`), :mod:`.depth` (cost model, depth search), :mod:`.pathsched` (flow
paths), :mod:`.rounds_timing` (round timing), :mod:`.split_allreduce`, :mod:`.programs`,
:mod:`.pipeline`, :mod:`.method`, and :mod:`.tuning` (the constants).
"""

from synth.synthesis.trees.forest import Forest, PlannedTree, plan_forest
from synth.synthesis.trees.messages import split_chunks
from synth.synthesis.trees.method import METHOD, synthesize
from synth.synthesis.trees.pipeline import schedule_from_plans
from synth.synthesis.trees.tuning import TreesTuning

__all__ = ["METHOD", "Forest", "PlannedTree", "TreesTuning", "plan_forest", "schedule_from_plans", "split_chunks",
           "synthesize"]
