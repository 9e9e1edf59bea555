"""Canonical signature keys of instructions, and their per-rank forms.

A key names *what* an instruction computes, independently of its name and position: opcode, the
attributes that change its value, operand shapes and result shape. Equal keys on equal operands
give equal values — the e-graph's hash-consing relies on that. Attributes that never change values
(metadata, sharding, channel ids, ...) are left out; anything else, understood or not, is kept, so
an unknown attribute can only make keys differ (lose a proof), never collide.

The per-rank form of a baseline instruction (what each rank must run on its shard) is the same
signature with some dimensions divided by the group size; ``Sig.with_dims`` builds it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..ir import Instruction, Shape
from .ops import COLLECTIVES, VALUE_NEUTRAL_ATTRS

Dims = tuple[int, ...]


@dataclass(frozen=True)
class Sig:
    opcode: str
    attrs: tuple[tuple[str, str], ...]
    ins: tuple[tuple[str, Dims], ...]  # operand (dtype, dims)
    out: tuple[str, Dims]

    def key(self) -> str:
        # Kept on the (immutable) instance: every law family's hook asks a node's key again.
        got = self.__dict__.get("_key")
        if got is None:
            a = ";".join(f"{k}={v}" for k, v in self.attrs)
            i = ",".join(f"{t}[{'x'.join(map(str, d))}]" for t, d in self.ins)
            got = self.__dict__["_key"] = f"{self.opcode}|{a}|{i}|{self.out[0]}[{'x'.join(map(str, self.out[1]))}]"
        return got

    def pointwise_name(self) -> str:
        """The op without its shapes: pointwise ops with equal names compute the same map."""
        a = ";".join(f"{k}={v}" for k, v in self.attrs)
        return f"{self.opcode}|{a}|{','.join(t for t, _ in self.ins)}|{self.out[0]}"

    def attr(self, name: str) -> str | None:
        for k, v in self.attrs:
            if k == name:
                return v
        return None

    def with_dims(self, ins: list[Dims] | None = None, out: Dims | None = None, **attrs: Any) -> Sig:
        new_ins = self.ins if ins is None else tuple((t, d) for (t, _), d in zip(self.ins, ins, strict=True))
        new_out = self.out if out is None else (self.out[0], out)
        new_attrs = dict(self.attrs)
        for k, v in attrs.items():
            new_attrs[k] = _text(v)
        return replace(self, ins=new_ins, out=new_out, attrs=tuple(sorted(new_attrs.items())))


def _text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_text(x) for x in v) + "]"
    return str(v)


def _dims(s: Shape) -> Dims:
    return tuple(s.dims)


# Value-relevant attributes with a default that XLA lets a printer write or leave out: the
# default is dropped, so both spellings give one key (never two values under one key: the
# default is what an absent attribute means).
_DEFAULT_FALSE = frozenset({"is_stable", "indices_are_sorted", "unique_indices"})
_PRECISION = frozenset({"operand_precision", "precision_config"})


def _is_default(k: str, text: str) -> bool:
    t = text.strip().strip("{}[]").strip().lower()
    if k in _DEFAULT_FALSE:
        return t == "false"
    if k in _PRECISION:
        return all(p.strip() in ("default", "'default'") for p in t.split(","))
    if k == "result_accuracy":
        return t.replace(" ", "") == "mode=default"
    return False


def make_sig(ins: Instruction, operand_shapes: list[Shape], groups_ok: bool | None = None) -> Sig:
    """The signature key: opcode, every value-relevant attribute (all but ops.VALUE_NEUTRAL_ATTRS,
    defaults dropped), operand and result types. Two instructions with one key over equal
    operands compute one value (the duplicate law), so nothing that can change a value (element
    types, is_stable, precision, promises, reducers, comparators, permute pairs, and whether a
    collective's groups are the sharding groups) may be left out."""
    attrs: dict[str, str] = {}
    for k in sorted(set(ins.attrs) | set(ins.parsed)):
        if k in VALUE_NEUTRAL_ATTRS or k in ("replica_groups", "to_apply", "source_target_pairs", "reducer", "comparator"):
            continue
        v = ins.parsed.get(k, ins.attrs.get(k))
        if _is_default(k, _text(v)):
            continue
        attrs[k] = _text(v)
    if ins.parsed.get("reducer"):
        attrs["reducer"] = str(ins.parsed["reducer"])
    if ins.parsed.get("comparator"):
        attrs["comparator"] = str(ins.parsed["comparator"])
    if ins.opcode in COLLECTIVES:
        # Collectives discharge relations only over the sharding group; the key says which.
        attrs["groups"] = "G" if groups_ok else _text(ins.parsed.get("replica_groups", []))
    if "source_target_pairs" in ins.parsed:
        attrs["pairs"] = _text(ins.parsed["source_target_pairs"])
    if ins.opcode == "custom-call" and "backend_config" in ins.attrs:
        attrs["backend_config"] = ins.attrs["backend_config"]
    return Sig(
        ins.opcode,
        tuple(sorted(attrs.items())),
        tuple((s.dtype, _dims(s)) for s in operand_shapes),
        (ins.shape.dtype, _dims(ins.shape)),
    )


def scale(dims: Dims, d: int, c: int) -> Dims | None:
    """dims with dims[d] divided by c, or None when it does not divide."""
    if d < 0 or d >= len(dims) or dims[d] % c or dims[d] < c:
        return None
    return (*dims[:d], dims[d] // c, *dims[d + 1 :])


def gscale(dims: Dims, d: int, k: int, e: int, c: int) -> Dims | None:
    """The per-rank shape of a rank-group relation grp(d, K, e): dims[d] divided by q = c/K,
    dims[e] (e >= 0) by K; None when they do not divide."""
    q = c // k
    if not 0 <= d < len(dims) or dims[d] % q or dims[d] < q or e == d or e >= len(dims):
        return None
    out = list(dims)
    out[d] //= q
    if e >= 0:
        if dims[e] % k or dims[e] < k:
            return None
        out[e] //= k
    return tuple(out)


def prod(xs: Dims) -> int:
    n = 1
    for x in xs:
        n *= x
    return n
