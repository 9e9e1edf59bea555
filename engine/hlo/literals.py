"""Exact values of scalar HLO literals.

A literal is read as a value of its element type, never through a wider or narrower one:
integers as Python ints checked against the type's range (s8..s64, u8..u64), ``pred`` as a
bool, floats as the value of the type itself (the printed decimal is read as a double and then
rounded to the type, which is what XLA's own parser does), bit-exactly: ``-0.0`` keeps its sign,
``inf``/``-inf``/``nan`` (also ``-nan`` and ``nan(0x...)`` payloads) and hexadecimal floats
(``0x1.8p3``) are understood, denormals stay denormal and a finite decimal beyond the type's
largest value rounds to infinity only when IEEE rounding does.

``read_scalar`` raises ``LiteralError`` for text that is no value of the type (an integer out
of range, a fraction for an int type); the parser turns that into a located bad-input error.
Types without an exact reading here (f8 variants, complex, s4, ...) give ``None``: callers treat
such literals as opaque (no rule computes with them).
"""

from __future__ import annotations

import copy
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from ..ir import Instruction, Module

INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}
FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
# The largest finite value of each float type.
FLOAT_MAX = {
    "f16": 65504.0,
    "bf16": float.fromhex("0x1.fep127"),
    "f32": float.fromhex("0x1.fffffep127"),
    "f64": float.fromhex("0x1.fffffffffffffp1023"),
}

_INT_RE = re.compile(r"[+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+)\Z")
_NAN_RE = re.compile(r"[+-]?nan(?:\(0x[0-9a-fA-F]+\))?\Z", re.IGNORECASE)
_INF_RE = re.compile(r"([+-]?)inf(?:inity)?\Z", re.IGNORECASE)
_DEC_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
_HEX_RE = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?\Z")


class LiteralError(ValueError):
    """Text that is not a value of the literal's type."""


def int_range(dtype: str) -> tuple[int, int]:
    """[lo, hi] of an int type, exactly."""
    bits = INT_BITS[dtype]
    if dtype[0] == "u":
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def scalar_text(literal: str | None) -> str | None:
    """The one value's text of a scalar literal (``5``, ``{5}``), or None."""
    if literal is None:
        return None
    text = literal.strip()
    while text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    return text or None


def read_scalar(dtype: str, text: str) -> int | float | bool | None:
    """The exact value of a scalar of element type ``dtype`` written as ``text``; None for types
    read opaquely. Raises LiteralError when ``text`` is no value of the type."""
    t = text.strip()
    if dtype == "pred":
        if t in ("true", "false"):
            return t == "true"
        if t in ("0", "1"):
            return t == "1"
        raise LiteralError(f"'{_short(t)}' is not a pred value (true or false)")
    if dtype in INT_BITS:
        if not _INT_RE.match(t):
            raise LiteralError(f"'{_short(t)}' is not an integer")
        v = int(t, 0) if "x" in t.lower() else int(t)
        lo, hi = int_range(dtype)
        if not lo <= v <= hi:
            raise LiteralError(f"{_short(t)} is out of range for {dtype} [{lo}, {hi}]")
        return v
    if dtype in FLOAT_TYPES:
        return round_to(dtype, _read_float(t))
    return None


def scalar_value(dtype: str, literal: str | None) -> int | float | bool | None:
    """read_scalar of a literal's text, None when it is unreadable (the parser has already
    refused such text for the types read_scalar knows)."""
    text = scalar_text(literal)
    if text is None:
        return None
    try:
        return read_scalar(dtype, text)
    except LiteralError:
        return None


def _read_float(t: str) -> float:
    if _NAN_RE.match(t):
        return -math.nan if t.startswith("-") else math.nan
    m = _INF_RE.match(t)
    if m:
        return -math.inf if m.group(1) == "-" else math.inf
    if _HEX_RE.match(t):
        return float.fromhex(t)
    if _DEC_RE.match(t):
        return float(t)  # correctly rounded to a double; beyond the double range: ±inf
    raise LiteralError(f"'{_short(t)}' is not a floating-point value")


def round_to(dtype: str, v: float) -> float:
    """``v`` (a double) rounded to the nearest value of float type ``dtype``, ties to even, as
    a C cast does; a magnitude IEEE rounding takes beyond the largest finite value is ±inf."""
    if dtype == "f64" or math.isnan(v) or math.isinf(v):
        return v
    if dtype == "f16":
        try:
            return float(struct.unpack("<e", struct.pack("<e", v))[0])
        except OverflowError:
            return math.copysign(math.inf, v)
    try:
        f = float(struct.unpack("<f", struct.pack("<f", v))[0])
    except OverflowError:
        return math.copysign(math.inf, v)
    if dtype == "f32":
        return f
    # bf16: the upper 16 bits of the f32, rounded to nearest even on the dropped 16 (XLA goes
    # double -> float -> bfloat16 the same way).
    bits = struct.unpack("<I", struct.pack("<f", f))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    bits &= 0xFFFF0000
    if bits > 0xFFFFFFFF:  # cannot happen for finite f (the exponent field absorbs the carry)
        return math.copysign(math.inf, v)
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def is_int_value(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(t: str) -> str:
    return t if len(t) <= 40 else t[:37] + "..."


# --- the elided-constants assumption -------------------------------------------------------

# Instruction.parsed key of an elided constant assumed equal to its namesake in the other
# program (relations.ASSUMPTIONS "elided-constants"): the value is the shared name. The
# analysis gives both constants one literal term (analysis/graph.py), and nothing else: no value
# is known, so no rule computes with it.
ASSUMED_EQUAL = "assumed_equal"


@dataclass(frozen=True)
class ElidedPair:
    """One elided constant of the distributed program assumed equal to the baseline's."""

    name: str
    shape: str  # e.g. f32[32]
    baseline_line: int | None
    distributed_line: int | None

    def to_json(self) -> dict[str, Any]:
        return {"name": f"%{self.name}", "shape": self.shape, "baseline_line": self.baseline_line, "distributed_line": self.distributed_line}


def _elided_constants(module: Module) -> dict[str, Instruction]:
    # Only the entry computation's: a constant inside a called computation is named in that
    # computation's scope (and inlining may rename it), so its name identifies nothing.
    return {i.name: i for i in module.entry.instructions if i.opcode == "constant" and i.literal is not None and "..." in i.literal}


def assume_elided_equal(baseline: Module, distributed: Module) -> tuple[list[ElidedPair], list[str]]:
    """Mark each elided constant of ``distributed``'s entry computation that has a namesake
    in ``baseline``'s entry computation — also elided, of the same element type and dims — as
    assumed equal to it (both get ``parsed[ASSUMED_EQUAL]``; the instructions are replaced by
    marked copies, the modules' other contents untouched). Returns the pairs, and a sentence
    for each elided constant left unknown (no namesake, or one of another shape)."""
    base, dist = _elided_constants(baseline), _elided_constants(distributed)
    pairs: list[ElidedPair] = []
    left: list[str] = []
    marked: dict[str, str] = {}
    for name, d in dist.items():
        b = base.get(name)
        if b is None:
            left.append(f"distributed %{name} ({d.shape}): the baseline has no elided constant of that name")
        elif b.shape.dtype != d.shape.dtype or tuple(b.shape.dims) != tuple(d.shape.dims):
            left.append(f"distributed %{name} is {d.shape}, the baseline's is {b.shape}: not the same shape and type")
        else:
            marked[name] = name
            pairs.append(ElidedPair(name, f"{d.shape.dtype}[{','.join(map(str, d.shape.dims))}]", b.loc.line if b.loc else None, d.loc.line if d.loc else None))
    for name, b in base.items():
        if name not in dist:
            left.append(f"baseline %{name} ({b.shape}): the distributed program has no elided constant of that name")
    for module in (baseline, distributed):
        if marked:
            entry = module.entry
            entry.instructions = [_marked(i) if i.opcode == "constant" and i.name in marked and "..." in (i.literal or "") else i for i in entry.instructions]
            entry.reindex()
    return pairs, left


def _marked(ins: Instruction) -> Instruction:
    new = copy.copy(ins)
    new.parsed = {**ins.parsed, ASSUMED_EQUAL: ins.name}
    return new
