"""Shape tables of rules/crossentropy.egg (vocab-parallel cross entropy, Megatron's form).

Each table row is a fact about one signature, written only for the exact shapes the laws are
stated for (anything else gets no row, so a rule cannot fire on it):

``xpickg(k, n, w)``   distributed gather k picks one element per row: operand [n, w], indices
                      [n, 1, 2] (index_vector_dim 2) or [n, 2] (index_vector_dim 1),
                      start_index_map {0, 1}, both dims collapsed, slice sizes {1, 1}, no offset
                      dims, result [n, 1] or [n]; element i of the result is operand[a_i, b_i]
                      with (a_i, b_i) the i-th index pair
``xcat2(k)``          concatenate k of two operands of shape [n, 1, 1] along dim 2 (-> [n, 1, 2])
                      or of shape [n, 1] along dim 1 (-> [n, 2])
``xreshape(k)``       k is a reshape (keeps the row-major order of the elements)
``xbg(k, n, v)``      gather k picks one element per row, batched over the rows (jnp's
                      take_along_axis along the last dim): operand [n, v], indices [n, 1, 1]
                      (index_vector_dim 2) or [n, 1] (index_vector_dim 1), operand and index
                      batching dims {0}, start_index_map {1}, collapsed {1}, slice sizes {1, 1},
                      no offset dims, result [n, 1]: result[i, 0] = operand[i, index[i]]
``xsqz(k, d)``        reshape k to a 1-D [v] of an operand whose dims are all 1 but d (extent v)
``xcolbc(k)``         broadcast k of a 1-D [v] into [n, v] along dim 1 (dimensions={1})
``xrowbc(k)``         broadcast k of a 1-D [n] into [n, v] along dim 0 (dimensions={0})
``xrowsum(k, v)``     reduce k with the reducer add over dim 1 of [n, v] to [n]
``xsum2(k, n, v, top, kind)``  reduce k with the reducer add over both dims {0, 1} of [n, v] to a
                      scalar (nll_loss's weighted sum and its weight total)
``xsumall(k, n, top, kind)``   reduce k with the reducer add over every dim of an operand of n
                      elements to a scalar (a sum of the picks, a count of the kept labels)

In xsum2 and xsumall, kind is "int" or "float" (the result's element type) and top the largest
integer the result type holds exactly: 2^(significand bits) for floats (every integer of
magnitude <= top is exact there), the type's maximum for ints (capped at 2^62).

Side conditions (audit, issue 23): the rows are shape facts (every dtype); the value laws they
feed take ranges from rpos (exact iotas only, graph.iota_exact) and inrange (declared ranges
on duplicates), and decide only int compares.
"""

from __future__ import annotations

from ...ir import Instruction, Shape
from ..signature import Sig

XENT_TABLES = ("xpickg", "xcat2", "xsqz", "xcolbc", "xrowbc", "xrowsum", "xreshape", "xsum2", "xsumall", "xbg")

# Significand bits of the float types and width of the int types (every integer of magnitude
# <= 2^p is exact in a float of p significand bits).
_FLOAT_P = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}
_INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def _exact_top(dtype: str) -> tuple[int, str] | None:
    """The largest integer a dtype holds exactly, and its kind; None for other types."""
    if dtype in _FLOAT_P:
        return 1 << _FLOAT_P[dtype], "float"
    if dtype in _INT_BITS:
        bits = _INT_BITS[dtype] - (1 if dtype.startswith("s") else 0)
        return (1 << min(bits, 62)) - 1, "int"
    return None


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def xent_rows(rows: dict[str, list[tuple[object, ...]]], side: str, sig: Sig, ins: Instruction, opnd: list[Shape]) -> None:
    key = sig.key()
    op, out = ins.opcode, tuple(ins.shape.dims)
    p = ins.parsed
    if ins.shape.is_tuple:
        return
    if op == "gather" and side == "distributed" and len(opnd) == 2:
        src, idx = tuple(opnd[0].dims), tuple(opnd[1].dims)
        form3 = len(idx) == 3 and idx[1:] == (1, 2) and out == (idx[0], 1) and p.get("index_vector_dim") == 2
        form2 = len(idx) == 2 and idx[1] == 2 and out == (idx[0],) and p.get("index_vector_dim") == 1
        if (len(src) == 2 and (form3 or form2)
                and list(p.get("start_index_map", [])) == [0, 1]
                and list(p.get("collapsed_slice_dims", [])) == [0, 1]
                and list(p.get("slice_sizes", [])) == [1, 1]
                and list(p.get("offset_dims", [])) == []
                and not p.get("operand_batching_dims") and not p.get("start_indices_batching_dims")
                and src[0] == idx[0]):
            rows["xpickg"].append((key, src[0], src[1]))
    if op == "gather" and len(opnd) == 2:
        src, idx = tuple(opnd[0].dims), tuple(opnd[1].dims)
        if (len(src) == 2 and out == (src[0], 1)
                and ((idx == (src[0], 1, 1) and p.get("index_vector_dim") == 2) or (idx == (src[0], 1) and p.get("index_vector_dim") == 1))
                and list(p.get("operand_batching_dims", [])) == [0] and list(p.get("start_indices_batching_dims", [])) == [0]
                and list(p.get("start_index_map", [])) == [1] and list(p.get("collapsed_slice_dims", [])) == [1]
                and list(p.get("slice_sizes", [])) == [1, 1] and list(p.get("offset_dims", [])) == []):
            rows["xbg"].append((key, src[0], src[1]))
    elif op == "concatenate" and len(opnd) == 2:
        a, b = tuple(opnd[0].dims), tuple(opnd[1].dims)
        if a == b and ((len(a) == 3 and a[1:] == (1, 1) and list(p.get("dimensions", [])) == [2] and out == (a[0], 1, 2))
                       or (len(a) == 2 and a[1] == 1 and list(p.get("dimensions", [])) == [1] and out == (a[0], 2))):
            rows["xcat2"].append((key,))
    if op == "reshape" and len(opnd) == 1:
        rows["xreshape"].append((key,))
    if op == "reshape" and len(opnd) == 1 and len(out) == 1:
        src = tuple(opnd[0].dims)
        big = [d for d, n in enumerate(src) if n != 1]
        if len(big) == 1 and src[big[0]] == out[0]:
            rows["xsqz"].append((key, big[0]))
    elif op == "broadcast" and len(opnd) == 1 and len(opnd[0].dims) == 1 and len(out) == 2:
        dims = list(p.get("dimensions", []))
        n = opnd[0].dims[0]
        if dims == [1] and out[1] == n:
            rows["xcolbc"].append((key,))
        elif dims == [0] and out[0] == n:
            rows["xrowbc"].append((key,))
    elif (op == "reduce" and len(opnd) == 2 and len(opnd[0].dims) == 2 and list(p.get("dimensions", [])) == [1]
          and p.get("reducer") == "add" and out == (opnd[0].dims[0],) and opnd[1].dims == ()):
        rows["xrowsum"].append((key, opnd[0].dims[1]))
    if (op == "reduce" and len(opnd) == 2 and out == () and opnd[1].dims == () and p.get("reducer") == "add"
            and sorted(p.get("dimensions", [])) == list(range(len(opnd[0].dims)))):
        top = _exact_top(ins.shape.dtype)
        src = tuple(opnd[0].dims)
        if top is not None:
            rows["xsumall"].append((key, _numel(src), *top))
            if len(src) == 2:
                rows["xsum2"].append((key, src[0], src[1], *top))
