"""Tables of rules/dotscale.egg: a row scaling moved out of a dot, the dot's operands swapped.

``dscaler(k, kdiv, kb, ksw, kb2, kdiv2, kt)``  baseline dot k = dot(L, P) whose rhs P is
        divide(E, broadcast_kb(D)) (kdiv), where kb repeats D along exactly P's contracting dims;
        ksw is dot(E, L) (the operands swapped, batch pairs kept), kb2 the broadcast of D onto
        ksw's result at P's rows, kdiv2 the divide on that shape, kt the transpose from ksw's
        layout back to k's.
``dscalel(k, kdiv, kb, kb2, kdiv2)``  the same with P the lhs (no swap: dot(E, R) has k's shape).
``tcompose(k1, k2, k3)``  transpose k2 after transpose k1 is transpose k3 (k1 one of the kt
        above, k2 a baseline transpose of k's result).

The synthesized instructions (ksw, kb2, kdiv2, the transposes) get their shape rows from the
core tables (laws/core.Tables.baseline) like any baseline instruction, so the ring's rules
relate their per-rank pieces exactly as they would a baseline's own dot.

Side conditions (checked here): one dtype for L, E, D and both results, a float type (division
does not distribute over an integer sum); the dot carries no attribute beyond its dimension
numbers (no precision config, whose per-operand lists a swap would have to move); the broadcast
maps D's dims in order onto P's non-contracting dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...ir import Instruction, Shape
from ..signature import make_sig
from .core import Tables

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]

TABLES: tuple[str, ...] = ("dscaler", "dscalel", "tcompose")

FLOATS = frozenset({"f16", "bf16", "f32", "f64"})
DOT_KEYS = frozenset({"lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims"})


def _ins(opcode: str, dtype: str, dims: tuple[int, ...], n: int, **parsed: Any) -> Instruction:
    return Instruction(name="dotscale", opcode=opcode, shape=Shape(dtype, dims), operands=[f"o{i}" for i in range(n)], parsed=dict(parsed))


def graph_rows(rows: Rows, g: Graphs) -> None:
    tables = Tables(g.spec.c, rows)

    def key(ins: Instruction, opnd: list[tuple[int, ...]], dtype: str) -> str:
        sig = make_sig(ins, [Shape(dtype, d) for d in opnd])
        tables.baseline(sig, ins)
        return sig.key()

    users: dict[int, list[Node]] = {}
    for n in g.nodes:
        if n.side == "baseline":
            for o in n.operands:
                users.setdefault(o, []).append(n)
    for z in g.nodes:
        if z.side != "baseline" or z.ins.opcode != "dot" or z.sig is None or len(z.operands) != 2:
            continue
        if set(z.ins.parsed) - DOT_KEYS or set(z.ins.attrs) - DOT_KEYS - {"metadata"}:
            continue
        pd = {k: [int(x) for x in z.ins.parsed.get(k, [])] for k in DOT_KEYS}
        for side in ("rhs", "lhs"):
            p = g.nodes[z.operands[1 if side == "rhs" else 0]]
            other = g.nodes[z.operands[0 if side == "rhs" else 1]]
            if p.ins.opcode != "divide" or len(p.operands) != 2 or p.sig is None:
                continue
            e, b = g.nodes[p.operands[0]], g.nodes[p.operands[1]]
            if b.ins.opcode != "broadcast" or len(b.operands) != 1 or b.sig is None:
                continue
            d = g.nodes[b.operands[0]]
            dtype = z.ins.shape.dtype
            if dtype not in FLOATS or any(x.ins.shape.dtype != dtype for x in (p, e, b, d, other)):
                continue
            pshape, oshape, dshape = tuple(p.ins.shape.dims), tuple(other.ins.shape.dims), tuple(d.ins.shape.dims)
            pb, pc = pd[f"{side}_batch_dims"], pd[f"{side}_contracting_dims"]
            other_side = "lhs" if side == "rhs" else "rhs"
            ob, oc = pd[f"{other_side}_batch_dims"], pd[f"{other_side}_contracting_dims"]
            bd = [int(x) for x in b.ins.parsed.get("dimensions", [])]
            rowdims = [i for i in range(len(pshape)) if i not in pc]
            if bd != rowdims:
                continue
            pfree = [i for i in range(len(pshape)) if i not in pb and i not in pc]
            ofree = [i for i in range(len(oshape)) if i not in ob and i not in oc]
            # Where each of P's dims lands in dot(E, other): its batch dims first, then its free dims.
            pos = {dim: i for i, dim in enumerate(pb)} | {dim: len(pb) + j for j, dim in enumerate(pfree)}
            b2 = [pos[x] for x in bd]
            if b2 != sorted(b2):
                continue
            zdims = tuple(z.ins.shape.dims)
            kdiv, kb = p.sig.key(), b.sig.key()
            if side == "lhs":
                # dot(E / D, R) and dot(E, R) / D share k's result layout.
                kb2 = key(_ins("broadcast", dtype, zdims, 1, dimensions=b2), [dshape], dtype)
                kdiv2 = key(_ins("divide", dtype, zdims, 2), [zdims, zdims], dtype)
                rows["dscalel"].append((z.sig.key(), kdiv, kb, kb2, kdiv2))
                continue
            nb = len(pb)
            sw = {"lhs_batch_dims": pb, "lhs_contracting_dims": pc, "rhs_batch_dims": ob, "rhs_contracting_dims": oc}
            wdims = tuple([pshape[i] for i in pb] + [pshape[i] for i in pfree] + [oshape[i] for i in ofree])
            ksw = key(_ins("dot", dtype, wdims, 2, **sw), [pshape, oshape], dtype)
            kb2 = key(_ins("broadcast", dtype, wdims, 1, dimensions=b2), [dshape], dtype)
            kdiv2 = key(_ins("divide", dtype, wdims, 2), [wdims, wdims], dtype)
            # k's result is [batch, other's free, P's free]; W = dot(E, other) is [batch, P's free, other's free].
            perm = list(range(nb)) + [nb + len(pfree) + j for j in range(len(ofree))] + [nb + j for j in range(len(pfree))]
            if [wdims[i] for i in perm] != list(zdims):
                continue
            kt = key(_ins("transpose", dtype, zdims, 1, dimensions=perm), [wdims], dtype)
            rows["dscaler"].append((z.sig.key(), kdiv, kb, ksw, kb2, kdiv2, kt))
            for t in users.get(z.gid, []):
                if t.ins.opcode != "transpose" or t.sig is None:
                    continue
                p2 = [int(x) for x in t.ins.parsed.get("dimensions", [])]
                comp = [perm[i] for i in p2]
                k3 = key(_ins("transpose", dtype, tuple(t.ins.shape.dims), 1, dimensions=comp), [wdims], dtype)
                rows["tcompose"].append((kt, t.sig.key(), k3))
