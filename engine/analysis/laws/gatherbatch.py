"""Table of rules/gatherbatch.egg: gathers whose index batch dims carry a sharding.

``gbatch(k, di, do, A)``  gather k: di a batch dim of its indices (not the index vector dim),
                          do the result's batch dim it becomes (XLA: the result dims outside
                          offset_dims, in order, are the indices' dims without the index vector
                          dim, in order); A the gather's form (operand type and dims, indices
                          type and rank, offset_dims, collapsed_slice_dims, start_index_map,
                          index_vector_dim, slice_sizes): two gathers of one form differ only in
                          their batch extents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...hlo.literals import INT_BITS

if TYPE_CHECKING:
    from ...ir import Instruction, Shape
    from ..signature import Sig

TABLES = ("gbatch",)
OPCODES = frozenset({"gather"})


def instruction_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape], c: int) -> None:
    if ins.opcode != "gather" or len(opnd) != 2 or ins.shape.is_tuple or opnd[1].dtype not in INT_BITS:
        return
    p = ins.parsed
    if p.get("operand_batching_dims") or p.get("start_indices_batching_dims"):
        return
    ivd = p.get("index_vector_dim")
    idims, out = tuple(opnd[1].dims), tuple(ins.shape.dims)
    offset = [int(x) for x in p.get("offset_dims", [])]
    if not isinstance(ivd, int) or not 0 <= ivd <= len(idims):
        return
    batch_in = [d for d in range(len(idims)) if d != ivd]
    batch_out = [d for d in range(len(out)) if d not in offset]
    if len(batch_in) != len(batch_out) or any(idims[a] != out[b] for a, b in zip(batch_in, batch_out, strict=True)):
        return
    form = "|".join(str(v) for v in (opnd[0].dtype, tuple(opnd[0].dims), opnd[1].dtype, len(idims), tuple(offset), tuple(p.get("collapsed_slice_dims", [])),
                                       tuple(p.get("start_index_map", [])), ivd, tuple(p.get("slice_sizes", [])), ins.shape.dtype, p.get("indices_are_sorted", False)))
    for a, b in zip(batch_in, batch_out, strict=True):
        rows["gbatch"].append((sig.key(), a, b, form))
