"""Law families as plugins: one rules file, one table module, one line in ``FAMILIES``.

A family is the laws of one rules file (``rules/<family>.egg``, whose header states each law
and its side conditions) plus the Python that writes the tables those rules read. graph.build
turns both programs into e-graph terms and asks every registered family for its rows; nothing
in graph.py names a family. egg.RULE_FILES loads the registered rules files in registry order
(a file may use the relations of the files before it). The tree::

    rules/<family>.egg                  the laws, their side conditions, the relations
    engine/analysis/laws/__init__.py    this registry (FAMILIES, in load order)
    engine/analysis/laws/<family>.py    TABLES and the hooks that fill them
    engine/analysis/laws/values.py      exact literal values and type bounds (shared helpers)
    engine/analysis/graph.py            nodes, signatures, term rows; calls the hooks below
    tests/laws/families.py              per family: generated programs run by XLA against the
                                        verdict (tests/test_law_properties.py)

To add a family (graph.py, egg.py and the other families stay untouched):

1. ``rules/<family>.egg``: the relations its tables fill and the rules, with a header stating
   the law and its side conditions (dtypes, narrow-int wrap, NaN; group layouts: DP x TP);
2. ``engine/analysis/laws/<family>.py``: ``TABLES`` (the table names) and one or more hooks

   - ``instruction_rows(rows, side, sig, ins, opnd, c)``: called for every instruction with a
     signature whose opcode is in ``OPCODES`` (``None``: every opcode); stateless;
   - ``walk(rows, g)``: called once before the instructions are visited; returns ``None``
     (nothing to write for this pair) or ``visit(node, key, sig, opnd)``, called for every
     instruction in order, baseline first (``sig`` None for a constant, ``key`` its literal
     key), for families that need the node's operands, its module or state over the walk;
   - ``graph_rows(rows, g)``: called once after every node exists (whole-graph facts);

3. one ``Family(...)`` line below; then a generator in tests/laws/families.py.

What a family costs where it does not apply: nothing of its rules. egg.program reads which
relations each rule's query needs and which its actions write; a proof loads only the rules
that can fire from the tables its graph filled (and its seeds), the least fixpoint over the
rules' writes (egg.Program.loadable). So a family needs no trigger of its own: let its hooks
write no rows where its laws cannot apply, and its rules read its own tables. Rows of a hook's
table reach the e-graph through graph.build or a seed only (egg.Session.load refuses rows of a
table it assumed empty). ``leave_out`` unregisters families (bench/scale.py ``--without``).

Every hook appends tuples to ``rows[table]`` for its own TABLES only; build deduplicates and
sorts them. Rules-only families (tables filled by an earlier family, or none) register with
``()``. Example, the whole of one family: ``git show --stat d0b7832`` (modgroup: rules/modgroup.egg,
engine/analysis/laws/modgroup.py, its line here, its generator in tests/laws/families.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import (
    a2adup,
    a2astack,
    algebra,
    argranks,
    argreduce,
    clampgather,
    convmax,
    core,
    crossentropy,
    dotblock,
    dotscale,
    expertlist,
    fillbcast,
    fsdpslice,
    gatherbatch,
    gathercat,
    kvgroups,
    labelmove,
    layout,
    microbatch,
    modgroup,
    neutral,
    onehot,
    packedar,
    padded,
    rankint,
    rankpos,
    rankselect,
    reshapeback,
    reshapesplit,
    ring,
    ringfill,
    ringmask,
    ringrun,
    rollring,
    scaling,
    scancarry,
    scatter,
    selectpartial,
    slicing,
    splitscatter,
    takealong,
    tuplerows,
    unroll,
    vocabraw,
    window,
)

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..graph import Graphs, Node
    from ..signature import Sig

Rows = dict[str, list[tuple[object, ...]]]
InstructionHook = Callable[[Rows, str, "Sig", "Instruction", "list[Shape]", int], None]
Visit = Callable[["Node", str, "Sig | None", "list[Shape]"], None]
WalkHook = Callable[[Rows, "Graphs"], "Visit | None"]
GraphHook = Callable[[Rows, "Graphs"], None]


@dataclass(frozen=True)
class Family:
    name: str
    rules: str  # file in rules/
    tables: tuple[str, ...]  # the tables its hooks fill (declared as relations in ``rules``)
    opcodes: frozenset[str] | None = None  # the opcodes instruction_rows reads (None: all)
    instruction_rows: InstructionHook | None = None
    graph_rows: GraphHook | None = None
    walk: WalkHook | None = None


def _xent(rows: Rows, side: str, sig: Any, ins: Any, opnd: Any, c: int) -> None:
    crossentropy.xent_rows(rows, side, sig, ins, opnd)


FAMILIES: list[Family] = [
    Family("core", "core.egg", core.TABLES, walk=core.walk),  # shape rows of partition .. window too
    Family("algebra", "algebra.egg", algebra.TABLES, walk=algebra.walk, graph_rows=algebra.graph_rows),
    Family("partition", "partition.egg", ()),  # identlit: algebra; mergeblocks ...: core
    Family("collectives", "collectives.egg", ()),  # allreduce ...: core
    Family("slicing", "slicing.egg", slicing.TABLES, walk=slicing.walk, graph_rows=slicing.graph_rows),
    Family("argreduce", "argreduce.egg", argreduce.TABLES, walk=argreduce.walk),
    Family("unroll", "unroll.egg", unroll.TABLES, unroll.OPCODES, unroll.instruction_rows),
    Family("layout", "layout.egg", layout.TABLES, layout.OPCODES, layout.instruction_rows, layout.graph_rows),
    Family("customcall", "customcall.egg", ()),  # ccident, ccmoves: core
    Family("permute", "permute.egg", ()),  # cpshift: core
    Family("rankalgebra", "rankalgebra.egg", ()),  # litrecip: algebra
    Family("rankselect", "rankselect.egg", rankselect.TABLES, rankselect.OPCODES, rankselect.instruction_rows),
    Family("vocabraw", "vocabraw.egg", vocabraw.TABLES, graph_rows=vocabraw.graph_rows),
    Family("gathercat", "gathercat.egg", gathercat.TABLES, gathercat.OPCODES, gathercat.instruction_rows),
    Family("slicescatter", "slicescatter.egg", ()),
    Family("alltoall", "alltoall.egg", ()),  # alltoall, alltoalldim: core
    Family("rankpos", "rankpos.egg", rankpos.TABLES, walk=rankpos.walk, graph_rows=rankpos.graph_rows),
    Family("window", "window.egg", window.TABLES, window.OPCODES, window.instruction_rows),
    Family("scaling", "scaling.egg", scaling.TABLES, scaling.OPCODES, scaling.instruction_rows),
    Family("scatter", "scatter.egg", scatter.TABLES, walk=scatter.walk),
    Family("padded", "padded.egg", padded.TABLES, walk=padded.walk),
    Family("ring", "ring.egg", ring.TABLES, ring.OPCODES, ring.instruction_rows),
    Family("crossentropy", "crossentropy.egg", crossentropy.XENT_TABLES, frozenset({"gather", "concatenate", "reshape", "broadcast", "reduce"}), _xent),
    Family("ringcollect", "ringcollect.egg", ()),
    Family("rankint", "rankint.egg", rankint.TABLES, graph_rows=rankint.graph_rows),
    Family("neutral", "neutral.egg", neutral.TABLES, neutral.OPCODES, neutral.instruction_rows),
    Family("onehot", "onehot.egg", onehot.TABLES, graph_rows=onehot.graph_rows),
    Family("a2adup", "a2adup.egg", a2adup.TABLES),
    Family("microbatch", "microbatch.egg", microbatch.TABLES, graph_rows=microbatch.graph_rows),
    Family("clampgather", "clampgather.egg", clampgather.TABLES, graph_rows=clampgather.graph_rows),
    Family("ringrun", "ringrun.egg", ringrun.TABLES),
    Family("fsdpslice", "fsdpslice.egg", fsdpslice.TABLES, graph_rows=fsdpslice.graph_rows),
    Family("selectpartial", "selectpartial.egg", selectpartial.TABLES),
    Family("labelmove", "labelmove.egg", labelmove.TABLES, graph_rows=labelmove.graph_rows),
    Family("expertlist", "expertlist.egg", expertlist.TABLES, graph_rows=expertlist.graph_rows),
    Family("modgroup", "modgroup.egg", modgroup.TABLES, graph_rows=modgroup.graph_rows),
    Family("fillbcast", "fillbcast.egg", fillbcast.TABLES, fillbcast.OPCODES, fillbcast.instruction_rows),
    Family("scancarry", "scancarry.egg", scancarry.TABLES, scancarry.OPCODES, scancarry.instruction_rows),
    Family("a2astack", "a2astack.egg", a2astack.TABLES),
    Family("packedar", "packedar.egg", packedar.TABLES, graph_rows=packedar.graph_rows),
    Family("dotblock", "dotblock.egg", dotblock.TABLES, dotblock.OPCODES, dotblock.instruction_rows),
    Family("argranks", "argranks.egg", argranks.TABLES, argranks.OPCODES, argranks.instruction_rows),
    Family("gatherbatch", "gatherbatch.egg", gatherbatch.TABLES, gatherbatch.OPCODES, gatherbatch.instruction_rows),
    Family("ringfill", "ringfill.egg", ringfill.TABLES, ringfill.OPCODES, ringfill.instruction_rows),  # rot2, rred, osum, moves2x2: ring; fill: layout
    Family("dotscale", "dotscale.egg", dotscale.TABLES, graph_rows=dotscale.graph_rows),  # dotc2/moves1 rows of its new terms: core
    Family("ringmask", "ringmask.egg", ringmask.TABLES, graph_rows=ringmask.graph_rows),  # rlive: ring; rot2, rred: ring; rkany: rankint; sel2: ringfill
    Family("rollring", "rollring.egg", rollring.TABLES, graph_rows=rollring.graph_rows),  # rpart, rot: ringcollect, permute
    Family("convmax", "convmax.egg", convmax.TABLES, graph_rows=convmax.graph_rows),  # ident: partition; shape rows of its baseline terms: core
    Family("reshapeback", "reshapeback.egg", reshapeback.TABLES, graph_rows=reshapeback.graph_rows),  # dup: core
    Family("reshapesplit", "reshapesplit.egg", reshapesplit.TABLES, graph_rows=reshapesplit.graph_rows),  # shape rows of its baseline terms: core
    Family("takealong", "takealong.egg", takealong.TABLES, takealong.OPCODES, takealong.instruction_rows, takealong.graph_rows),  # xgb: crossentropy; shifted, outside, clamped: slicing
    Family("tuplerows", "tuplerows.egg", tuplerows.TABLES, tuplerows.OPCODES, tuplerows.instruction_rows),  # sharded, dup: core
    Family("splitscatter", "splitscatter.egg", splitscatter.TABLES, splitscatter.OPCODES, splitscatter.instruction_rows),  # reducescatter, partial: core
    Family("kvgroups", "kvgroups.egg", kvgroups.TABLES, walk=kvgroups.walk),  # repeated: slicing; dup, partial: core
]


def tables() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES for t in f.tables)


# Families left out (``leave_out``), by name, with the registry as it was before: their rules
# files keep their place in the load order.
_LEFT_OUT: dict[str, Family] = {}
_ORDER: list[Family] = []


def leave_out(names: Iterable[str]) -> None:
    """Unregister families (bench/scale.py ``--without``: what they cost; tests): no hooks, no
    rules. Their rules files' declarations still load, in their place, so the other families'
    rules that name their relations load too and every reader of their tables finds them empty.
    Leaving a law out can only lose proofs. ``leave_out(())`` registers them all again."""
    names = set(names)
    known = {f.name for f in FAMILIES} | set(_LEFT_OUT)
    if names - known:
        raise ValueError(f"no law family {sorted(names - known)} (registered: {', '.join(sorted(known))})")
    if not _ORDER:
        _ORDER[:] = FAMILIES
    order = _ORDER + [f for f in FAMILIES if f not in _ORDER]  # registered after the first call
    FAMILIES[:] = [f for f in order if f.name not in names]
    _LEFT_OUT.clear()
    _LEFT_OUT.update((f.name, f) for f in order if f.name in names)
    if not names:
        _ORDER.clear()


def rule_files() -> tuple[str, ...]:
    """Every rules file to load, in registry order, a left-out family's too (``declared_only``)."""
    if not _LEFT_OUT:
        return tuple(f.rules for f in FAMILIES)
    return tuple(f.rules for f in _ORDER + [f for f in FAMILIES if f not in _ORDER] if f in FAMILIES or f.name in _LEFT_OUT)


def all_tables() -> tuple[str, ...]:
    """The tables of every family, left out or not: hooks may fill another family's tables."""
    return tables() + tuple(t for f in _LEFT_OUT.values() for t in f.tables)


def declared_only() -> frozenset[str]:
    """The rules files of left-out families: their declarations load, none of their rules."""
    return frozenset(f.rules for f in _LEFT_OUT.values())
