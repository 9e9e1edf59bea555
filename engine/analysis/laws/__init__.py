"""Law families as plugins: one rules file, one table module, one line in ``FAMILIES``.

A family is the laws of one rules file (``rules/<family>.egg``, whose header states each law
and its side conditions) plus the Python that writes the tables those rules read. graph.build
asks every registered family for its rows; nothing in graph.py names a family, and
egg.RULE_FILES loads every registered rules file. To add a family:

1. ``rules/<family>.egg``: the relations its tables fill and the rules, with a header stating
   the law and its side conditions;
2. ``engine/analysis/laws/<family>.py``: ``TABLES`` (the table names), and one or both hooks

   - ``instruction_rows(rows, side, sig, ins, opnd, c)``: called for every instruction with a
     signature whose opcode is in ``OPCODES`` (``None``: every opcode);
   - ``graph_rows(rows, g)``: called once after every node exists (whole-graph facts);

3. one ``Family(...)`` line below.

Families not yet moved here keep their module (window: engine/analysis/window.py) and are
registered by the same line; the older families (tables.py, padded.py, scatter.py, layouts)
are still wired by hand in graph.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import window
from . import a2adup, clampgather, crossentropy, expertlist, microbatch, neutral, onehot, rankint, ringrun

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..graph import Graphs
    from ..signature import Sig

Rows = dict[str, list[tuple[object, ...]]]
InstructionHook = Callable[[Rows, str, "Sig", "Instruction", "list[Shape]", int], None]
GraphHook = Callable[[Rows, "Graphs"], None]


@dataclass(frozen=True)
class Family:
    name: str
    rules: str  # file in rules/
    tables: tuple[str, ...]  # the tables its hooks fill (declared as relations in ``rules``)
    opcodes: frozenset[str] | None = None  # the opcodes instruction_rows reads (None: all)
    instruction_rows: InstructionHook | None = None
    graph_rows: GraphHook | None = None


def _xent(rows: Rows, side: str, sig: Any, ins: Any, opnd: Any, c: int) -> None:
    crossentropy.xent_rows(rows, side, sig, ins, opnd)


FAMILIES: list[Family] = [
    Family("crossentropy", "crossentropy.egg", crossentropy.XENT_TABLES, frozenset({"gather", "concatenate", "reshape", "broadcast", "reduce"}), _xent),
    Family("window", "window.egg", window.WINDOW_TABLES, frozenset({"reduce-window", "reduce", "broadcast", "transpose", "reshape"}), window.window_rows),
    Family("rankint", "rankint.egg", rankint.TABLES, graph_rows=rankint.graph_rows),
    Family("neutral", "neutral.egg", neutral.TABLES, neutral.OPCODES, neutral.instruction_rows),
    Family("onehot", "onehot.egg", onehot.TABLES, graph_rows=onehot.graph_rows),
    Family("a2adup", "a2adup.egg", a2adup.TABLES),
    Family("microbatch", "microbatch.egg", microbatch.TABLES, graph_rows=microbatch.graph_rows),
    Family("clampgather", "clampgather.egg", clampgather.TABLES, graph_rows=clampgather.graph_rows),
    Family("ringrun", "ringrun.egg", ringrun.TABLES),
    Family("expertlist", "expertlist.egg", expertlist.TABLES, graph_rows=expertlist.graph_rows),
]


def tables() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES for t in f.tables)


def rule_files() -> tuple[str, ...]:
    return tuple(f.rules for f in FAMILIES)
