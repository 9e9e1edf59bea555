"""Table of rules/reshapesplit.egg: a baseline reshape A -> S through a gathered shape M.

``rsplit(kb, km, ks)``  kb the signature of a baseline reshape from A to S; km the reshape A -> M
        and ks the reshape M -> S on kb's element type, M the result shape of a distributed
        all-gather whose operand is a reshape (or of the concatenation of slices of one: DTensor's
        gather along a last dim), or of a distributed reshape read by a dynamic-slice (DTensor's
        split of a replicated input, rowwise_split_input), with as many elements as A and neither A nor S.
        The two new baseline terms get their shape rows from core.Tables.

Cost: one pass over the nodes' opcodes; nothing is written (and no rule loaded) unless the
distributed program all-gathers a reshape or dynamic-slices one.
"""

from __future__ import annotations

import dataclasses
from math import prod
from typing import TYPE_CHECKING

from ...ir import Shape
from ..signature import make_sig
from .core import Tables

if TYPE_CHECKING:
    from ..graph import Graphs

Rows = dict[str, list[tuple[object, ...]]]

TABLES: tuple[str, ...] = ("rsplit",)


def graph_rows(rows: Rows, g: Graphs) -> None:
    gathered: set[tuple[str, tuple[int, ...]]] = set()
    ag_of_reshape: set[int] = set()
    for n in g.nodes:
        if n.side != "distributed" or n.ins.shape.is_tuple:
            continue
        if n.ins.opcode == "all-gather" and len(n.operands) == 1 and g.nodes[n.operands[0]].ins.opcode == "reshape":
            ag_of_reshape.add(n.gid)
            gathered.add((n.ins.shape.dtype, tuple(n.ins.shape.dims)))
        elif n.ins.opcode == "concatenate" and n.operands and all(
            g.nodes[o].ins.opcode == "slice" and g.nodes[o].operands and g.nodes[o].operands[0] in ag_of_reshape for o in n.operands
        ):
            # DTensor's gather along a last dim: all-gather along dim 0, split, concatenated.
            gathered.add((n.ins.shape.dtype, tuple(n.ins.shape.dims)))
        elif n.ins.opcode == "dynamic-slice" and n.operands and g.nodes[n.operands[0]].ins.opcode == "reshape":
            # DTensor's split of a replicated input (rowwise_split_input): the rank's block of a
            # view the baseline composes with the next one.
            r = g.nodes[n.operands[0]].ins.shape
            if not r.is_tuple:
                gathered.add((r.dtype, tuple(r.dims)))
    if not gathered:
        return
    tables = Tables(g.spec.c, rows)
    for n in g.nodes:
        if n.side != "baseline" or n.ins.opcode != "reshape" or n.sig is None or len(n.operands) != 1:
            continue
        src = g.nodes[n.operands[0]].ins.shape
        dtype, a, s = n.ins.shape.dtype, tuple(src.dims), tuple(n.ins.shape.dims)
        if src.is_tuple or src.dtype != dtype:
            continue
        for t, m in sorted(gathered):
            if t != dtype or m in (a, s) or prod(m) != prod(a):
                continue
            km_ins = dataclasses.replace(n.ins, name="reshapesplit", shape=Shape(dtype, m), operands=["o0"])
            ks_ins = dataclasses.replace(n.ins, name="reshapesplit", shape=Shape(dtype, s), operands=["o0"])
            km, ks = make_sig(km_ins, [Shape(dtype, a)]), make_sig(ks_ins, [Shape(dtype, m)])
            tables.baseline(km, km_ins)
            tables.baseline(ks, ks_ins)
            rows["rsplit"].append((n.sig.key(), km.key(), ks.key()))
