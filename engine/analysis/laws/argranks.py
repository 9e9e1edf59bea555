"""Tables of rules/argranks.egg: a vocab-parallel arg-reduce combined over the ranks by
all-gathering (extreme, global id) pairs and taking the id at the arg-reduce of the extremes.

``rowsq(k)``          a reshape, copy or full slice whose operand and result share dim 0 and
                      have extent 1 in every other dim (a per-row value moved, never reordered);
``takerow(k, t)``     a gather of a 2-D operand [S, m] by indices [S, 1, 2] (index_vector_dim 2,
                      start_index_map {0, 1}, both dims collapsed, slices 1 x 1): out[s, 0] =
                      operand[idx[s, 0, 0], idx[s, 0, 1]], result [S, 1] of type t;
``catidx(k)``         a concatenate of two [S, 1, 1] operands along dim 2 (the [S, 1, 2] indices);
``posbcast(k, d, d2, S2)``  a broadcast carrying operand dim d to result dim d2 (same extent),
                      S2 the result's type and dims (rules/rankpos.egg rpos);
``argshape(k, S)``    an int get-tuple-element, convert, copy, reshape or gather k with result S (the
                      baseline's index, matched by its shape).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...hlo.literals import INT_BITS
from .values import shape_text

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("rowsq", "takerow", "catidx", "posbcast", "argshape")
OPCODES = frozenset({"reshape", "copy", "slice", "gather", "concatenate", "broadcast", "get-tuple-element", "convert"})


def _rowlike(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return bool(a) and bool(b) and a[0] == b[0] and all(n == 1 for n in a[1:]) and all(n == 1 for n in b[1:])


def _takes_row(ins: Instruction, src: tuple[int, ...], idx: tuple[int, ...]) -> bool:
    p = ins.parsed
    if len(src) != 2 or idx != (src[0], 1, 2) or ins.shape.dims != (src[0], 1):
        return False
    if p.get("index_vector_dim") != 2 or list(p.get("start_index_map", [])) != [0, 1]:
        return False
    if list(p.get("collapsed_slice_dims", [])) != [0, 1] or list(p.get("slice_sizes", [])) != [1, 1] or list(p.get("offset_dims", [])):
        return False
    return not (p.get("operand_batching_dims") or p.get("start_indices_batching_dims"))


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    op, out, key = ins.opcode, ins.shape, sig.key()
    if out.is_tuple or not opnd:
        return
    if op in ("get-tuple-element", "convert", "copy", "reshape", "gather") and out.dtype in INT_BITS:
        rows["argshape"].append((key, shape_text(out.dtype, tuple(out.dims))))
    if any(s.is_tuple for s in opnd):
        return
    dims = tuple(out.dims)
    if op in ("reshape", "copy") and len(opnd) == 1 and opnd[0].dtype == out.dtype and _rowlike(tuple(opnd[0].dims), dims):
        rows["rowsq"].append((key,))
    elif op == "slice" and len(opnd) == 1 and tuple(opnd[0].dims) == dims and _rowlike(dims, dims):
        # A slice keeping every extent keeps every element (start 0, stride 1, or one element).
        rows["rowsq"].append((key,))
    elif op == "gather" and len(opnd) == 2 and opnd[1].dtype in INT_BITS and _takes_row(ins, tuple(opnd[0].dims), tuple(opnd[1].dims)):
        rows["takerow"].append((key, out.dtype))
    elif op == "concatenate" and len(opnd) == 2 and list(ins.parsed.get("dimensions", [])) == [2]:
        s = opnd[0].dims
        if len(s) == 3 and tuple(s) == tuple(opnd[1].dims) and s[1:] == (1, 1) and dims == (s[0], 1, 2):
            rows["catidx"].append((key,))
    elif op == "broadcast" and len(opnd) == 1 and opnd[0].dtype == out.dtype:
        bd = [int(x) for x in ins.parsed.get("dimensions", [])]
        if len(bd) == len(opnd[0].dims):
            for d, d2 in enumerate(bd):
                # rpos values depend on the index along d alone: a broadcast copies them along
                # its new dims and keeps them along d (now d2).
                if 0 <= d2 < len(dims) and dims[d2] == opnd[0].dims[d]:
                    rows["posbcast"].append((key, d, d2, shape_text(out.dtype, dims)))
