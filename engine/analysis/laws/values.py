"""Exact values and type bounds the law families share (not a family: no rules, no tables).

What a scalar literal's value is and which reducers it is an identity of, whether an iota
counts exactly, which int converts keep every value, and the shapes of index_select gathers.
"""

from __future__ import annotations

import math

from ...hlo.literals import FLOAT_MAX, INT_BITS, int_range, scalar_value
from ...hlo.parser import literal_is_elided
from ...ir import Instruction

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1  # the range of egglog's i64 column

# Significand precision: every integer of magnitude <= 2**p is exactly representable.
FLOAT_PRECISION = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53}


def scalar_of(ins: Instruction) -> int | float | None:
    """The exact value of a scalar int or float constant (hlo.literals): an int of its type,
    or the float of its type as a double. None for pred, opaque types and non-scalars."""
    if ins.opcode != "constant" or ins.shape.dims != () or ins.shape.is_tuple:
        return None
    v = scalar_value(ins.shape.dtype, ins.literal)
    return None if isinstance(v, bool) else v


def identity_of(ins: Instruction, value: int | float | None) -> list[str]:
    """Reducers this scalar literal is an identity of, compared exactly. For floats the lowest
    finite value counts for max (and the highest for min): torch lowers amax with it, and it is
    the identity on finite inputs. For ints the type's minimum is the identity of max and its
    maximum that of min (torch's amin/amax on s64 start from them)."""
    if value is None or ins.shape.dims != ():
        return []
    dtype = ins.shape.dtype
    out = []
    if value == 0:
        out.append("add")
    if value == 1:
        out.append("mul")
    if dtype in INT_BITS:
        lo, hi = int_range(dtype)
        if value == lo:
            out.append("max")
        if value == hi:
            out.append("min")
    elif dtype in FLOAT_MAX:
        if value == -math.inf or value == -FLOAT_MAX[dtype]:
            out.append("max")
        if value == math.inf or value == FLOAT_MAX[dtype]:
            out.append("min")
    return out


def iota_exact(dtype: str, n: int) -> bool:
    """An iota of ``n`` elements along its dim holds exactly 0 .. n-1 in ``dtype``: for an int
    type n - 1 is at most the type's largest value (else it wraps: s8 counts 127, -128, ...),
    for a float type at most 2^(significand bits) (else rounding repeats values)."""
    if dtype in INT_BITS:
        return n - 1 <= int_range(dtype)[1]
    p = FLOAT_PRECISION.get(dtype)
    return p is not None and n - 1 <= 1 << p


def widens(a: str, b: str) -> bool:
    """Every value of int type a is representable in int type b."""
    if a not in INT_BITS or b not in INT_BITS:
        return False
    if a[0] == b[0]:
        return INT_BITS[b] >= INT_BITS[a]
    return a[0] == "u" and b[0] == "s" and INT_BITS[b] > INT_BITS[a]


def int_bounds(dtype: str) -> tuple[int, int]:
    """[lo, hi] within the int type's values (capped to ±2^62 so that egglog's i64 bounds
    arithmetic has room; a narrower range only loses proofs)."""
    if dtype[0] == "u":
        return 0, int_top(dtype)
    return -int_top(dtype) - 1 if INT_BITS[dtype] < 64 else -(1 << 62), int_top(dtype)


def int_top(dtype: str) -> int:
    """The largest value of an int type (capped: egglog's i64)."""
    bits = INT_BITS[dtype] - (1 if dtype[0] == "s" else 0)
    return (1 << min(bits, 62)) - 1


def shape_text(dtype: str, dims: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


def index_select_dim(ins: Instruction, src: tuple[int, ...], idx: tuple[int, ...]) -> int | None:
    """d when gather ``ins`` is index_select along d with one index: out = x[i] along d, kept as
    a unit dim at d (indices of one element, each a scalar start along d; whole slices of every
    other dim, which keep their places)."""
    p = ins.parsed
    if len(idx) != 1 or idx[0] != 1 or p.get("index_vector_dim") != 1:
        return None
    collapsed = list(p.get("collapsed_slice_dims", []))
    if len(collapsed) != 1 or list(p.get("start_index_map", [])) != collapsed:
        return None
    d = collapsed[0]
    if not 0 <= d < len(src):
        return None
    if list(p.get("slice_sizes", [])) != [1 if i == d else n for i, n in enumerate(src)]:
        return None
    if list(p.get("offset_dims", [])) != [i for i in range(len(src)) if i != d] or ins.shape.dims != tuple(1 if i == d else n for i, n in enumerate(src)):
        return None
    if any(k in p for k in ("operand_batching_dims", "start_indices_batching_dims")) and (p.get("operand_batching_dims") or p.get("start_indices_batching_dims")):
        return None
    return d


def arange_start(ins: Instruction) -> int | None:
    """b when the 1-D int constant ``ins`` is b, b+1, ..., b+n-1 (an arange literal)."""
    if ins.shape.dtype not in INT_BITS or len(ins.shape.dims) != 1 or literal_is_elided(ins.literal):
        return None
    text = (ins.literal or "").strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        vals = [int(v) for v in text[1:-1].replace(" ", "").split(",") if v]
    except ValueError:
        return None
    if len(vals) != ins.shape.dims[0] or not vals or any(v != vals[0] + i for i, v in enumerate(vals)):
        return None
    return vals[0] if I64_MIN <= vals[0] <= I64_MAX else None

