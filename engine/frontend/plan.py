"""Sharding plans in PyTorch's tensor-parallel vocabulary, turned into input relations.

A plan maps module paths (``layers.*.attn.qkv``) or parameter paths (``layers.*.attn.qkv.weight``)
to a style, the way ``parallelize_module`` plans and Hugging Face ``tp_plan`` do:

==================== ============================== ==================================
style                nn.Linear-like weight (out,in)  nn.Embedding weight (vocab, dim)
==================== ============================== ==================================
colwise              weight dim 0, bias dim 0        weight dim 1
rowwise              weight dim 1, bias replicated   weight dim 0 (vocab-parallel)
replicate            replicated                      replicated
sequence_parallel    replicated (norm weights)       replicated
expert               dim 0 (stacked expert weights)  dim 0
{shard: d}           dim d                           dim d
==================== ============================== ==================================

``{"style": ..., "padded": true}`` (or ``{"shard": d, "padded": true}``): the sharded dim does
not divide over the ranks, so each rank holds a block of w of the baseline extended with zeros
to c·w (attention heads or FFN features padded to a multiple of the group size, as Neuron does);
w is the per-rank extent the distributed module really has.

``{"style": ..., "blocks": [...]}`` marks a fused weight (QKV, gate+up) whose sharded dim is a
concatenation of blocks, each sharded on its own. Every derived relation is checked against the
two shapes the modules really have, so a plan that does not describe the code is an error
naming the parameter, the plan key and both shapes — never a silently wrong proof obligation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .declare import STYLES


class PlanError(ValueError):
    """A plan entry that is malformed or does not match the modules (``key`` names it)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"plan[{key!r}]: {message}" if key else message)


@dataclass(frozen=True)
class Style:
    kind: str  # one of STYLES, or "shard"
    dim: int | None = None
    blocks: tuple[int, ...] = ()
    padded: bool = False


@dataclass(frozen=True)
class ParamRelation:
    """How one parameter is held by the ranks."""

    relation: str  # duplicate | sharded | padded
    dim: int | None = None
    blocks: tuple[int, ...] = ()
    source: str = ""  # the plan key that decided it ("" = default: replicated)
    width: int | None = None  # padded: the per-rank extent along dim

    def describe(self) -> str:
        if self.relation == "padded":
            return f"padded along dim {self.dim} to width {self.width} per rank"
        if self.relation == "sharded":
            blocks = f", blocks {list(self.blocks)}" if self.blocks else ""
            return f"sharded along dim {self.dim}{blocks}"
        return "replicated"


def parse_style(key: str, value: Any) -> Style:
    if isinstance(value, str):
        if value not in STYLES:
            raise PlanError(key, f"expected one of {', '.join(STYLES)} or {{shard: DIM}}, got {value!r}")
        return Style(value)
    if isinstance(value, Mapping):
        extra = set(value) - {"style", "shard", "blocks", "padded"}
        if extra:
            raise PlanError(key, f"unknown key {sorted(extra)[0]!r}; expected style, shard, blocks, padded")
        padded = value.get("padded", False)
        if not isinstance(padded, bool):
            raise PlanError(key, f"padded: expected true or false, got {padded!r}")
        if padded and value.get("blocks"):
            raise PlanError(key, "padded and blocks do not go together (pad each block's weight on its own)")
        blocks = value.get("blocks") or ()
        if not isinstance(blocks, Sequence) or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blocks):
            raise PlanError(key, f"blocks: expected a list of positive block sizes, got {blocks!r}")
        if ("style" in value) == ("shard" in value):
            raise PlanError(key, "expected exactly one of 'style' or 'shard'")
        if "shard" in value:
            dim = value["shard"]
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
                raise PlanError(key, f"shard: expected a dimension >= 0, got {dim!r}")
            return Style("shard", dim, tuple(blocks), padded)
        style = parse_style(key, value["style"])
        if (blocks or padded) and style.kind in ("replicate", "sequence_parallel"):
            raise PlanError(key, f"{'blocks' if blocks else 'padded'} apply to a sharded style, not {style.kind}")
        return Style(style.kind, style.dim, tuple(blocks), padded)
    raise PlanError(key, f"expected a style name or a mapping, got {value!r}")


def _pattern(key: str) -> re.Pattern[str]:
    parts = [r"[^.]+" if part == "*" else re.escape(part) for part in key.split(".")]
    return re.compile(r"\.".join(parts))


@dataclass(frozen=True)
class Plan:
    entries: tuple[tuple[str, Style, re.Pattern[str]], ...]

    @classmethod
    def parse(cls, plan: Mapping[str, Any]) -> Plan:
        if not isinstance(plan, Mapping):
            raise PlanError("", f"the plan must be a mapping of module paths to styles, got {type(plan).__name__}")
        entries = []
        for key, value in plan.items():
            if not isinstance(key, str) or not key:
                raise PlanError(str(key), "expected a module or parameter path")
            entries.append((key, parse_style(key, value), _pattern(key)))
        return cls(tuple(entries))

    def lookup(self, param: str) -> tuple[str, Style, bool] | None:
        """(plan key, style, whether the key names the parameter itself) for ``param``.

        An entry naming the parameter wins over one naming its module; among equals the first
        declared wins, as in Hugging Face plans.
        """
        module = param.rsplit(".", 1)[0] if "." in param else ""
        for key, style, rx in self.entries:
            if rx.fullmatch(param):
                return key, style, True
        for key, style, rx in self.entries:
            if module and rx.fullmatch(module):
                return key, style, False
        return None

    def unused(self, params: Sequence[str]) -> list[str]:
        """Plan keys that match no parameter (a typo in a module path, usually)."""
        out = []
        for key, _, rx in self.entries:
            if not any(rx.fullmatch(p) or ("." in p and rx.fullmatch(p.rsplit(".", 1)[0])) for p in params):
                out.append(key)
        return out


def relation_for(
    plan: Plan,
    param: str,
    module_kind: str,
    full: tuple[int, ...],
    local: tuple[int, ...],
    c: int,
) -> ParamRelation:
    """The relation of ``param`` (baseline shape ``full``, per-rank shape ``local``) over ``c`` ranks.

    ``module_kind`` is ``"embedding"`` for nn.Embedding (sub)classes, else ``"linear"``.
    """
    found = plan.lookup(param)
    if found is None:
        if full != local:
            raise PlanError(
                "",
                f"parameter {param!r} is {list(full)} in the baseline but {list(local)} per rank, "
                "and no plan entry names it or its module; add one (e.g. colwise, rowwise, expert)",
            )
        return ParamRelation("duplicate")
    key, style, direct = found
    leaf = param.rsplit(".", 1)[-1]
    dim: int | None
    if style.kind in ("replicate", "sequence_parallel"):
        dim = None
    elif style.kind == "shard":
        dim = style.dim
    elif style.kind == "expert":
        dim = 0
    elif direct or len(full) != 1:
        # A 2-D weight (or a parameter named directly): the table above.
        if style.kind == "colwise":
            dim = 1 if module_kind == "embedding" else 0
        else:
            dim = 0 if module_kind == "embedding" else (1 if len(full) >= 2 else 0)
    else:
        # A 1-D parameter of a linear module: a bias follows the output features.
        dim = 0 if style.kind == "colwise" else None
    if dim is None:
        if full != local:
            raise PlanError(key, f"{param!r} is {style.kind} (replicated) but is {list(full)} in the baseline and {list(local)} per rank")
        return ParamRelation("duplicate", source=key)
    if dim >= len(full):
        raise PlanError(key, f"{param!r} has {len(full)} dim(s); {style.kind} shards dim {dim}")
    if style.padded:
        w = local[dim] if len(local) == len(full) else 0
        want_other = tuple(n for i, n in enumerate(full) if i != dim)
        if len(local) != len(full) or tuple(n for i, n in enumerate(local) if i != dim) != want_other or w < 1 or c * w < full[dim]:
            raise PlanError(
                key,
                f"{param!r} is {style.kind} padded along dim {dim} over {c} ranks, so each rank should hold "
                f"w >= {-(-full[dim] // c)} along dim {dim} and the baseline's extents elsewhere ({list(full)}), but the distributed module holds {list(local)}",
            )
        # Also when c·w is exactly the extent (no padding): the layout the code declared, which
        # its other padded tensors (a rank's own rows of replicated KV heads) are related by.
        return ParamRelation("padded", dim, (), key, w)
    blocks = style.blocks
    if blocks and sum(blocks) != full[dim]:
        raise PlanError(key, f"blocks {list(blocks)} of {param!r} sum to {sum(blocks)}, but dim {dim} has {full[dim]} (the {leaf})")
    parts = blocks or (full[dim],)
    bad = [b for b in parts if b % c]
    if bad:
        raise PlanError(key, f"{param!r}: dim {dim} ({'blocks ' + str(list(parts)) if blocks else full[dim]}) is not divisible by {c} ranks")
    want = tuple(n // c if i == dim else n for i, n in enumerate(full))
    if local != want:
        raise PlanError(
            key,
            f"{param!r} is {style.kind} (sharded along dim {dim} over {c} ranks), so each rank "
            f"should hold {list(want)} of the baseline's {list(full)}, but the distributed module holds {list(local)}",
        )
    return ParamRelation("sharded", dim, tuple(blocks), key)
