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

``"expert_list"`` names a module list of experts (``nn.ModuleList``, one module per expert, as
DeepSpeed's ``Experts`` and most MoE code hold them): the baseline lists all E experts, each rank
its E/c local ones, and rank r's local expert j is the baseline's expert r·E/c + j. Each
parameter of the experts (``experts.*.fc1.weight``) becomes one stacked placeholder of shape
(E, ...) in the baseline and (E/c, ...) per rank, sharded along dim 0 (build.py).

``{"style": ..., "padded": true}`` (or ``{"shard": d, "padded": true}``): the sharded dim does
not divide over the ranks, so each rank holds a block of w of the baseline extended with zeros
to c·w (attention heads or FFN features padded to a multiple of the group size, as Neuron does);
w is the per-rank extent the distributed module really has. With ``"blocks"`` too (a fused QKV
whose heads do not divide: neuronx-distributed-inference pads q, k and v each at its tail), each
block is padded on its own; the blocks' per-rank widths are ``"width": [...]``, or w split
equally when the blocks are equal.

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
    widths: tuple[int, ...] = ()  # padded with blocks: each block's per-rank width
    head_groups: int = 1  # GQA.REPLICATE_TO_TP_DEGREE: K groups, c/K ranks each (relation_for)


@dataclass(frozen=True)
class ParamRelation:
    """How one parameter is held by the ranks."""

    relation: str  # duplicate | sharded | padded
    dim: int | None = None
    blocks: tuple[int, ...] = ()
    source: str = ""  # the plan key that decided it ("" = default: replicated)
    width: int | None = None  # padded: the per-rank extent along dim
    widths: tuple[int, ...] = ()  # padded with blocks: each block's per-rank width (sum: width)
    # FSDP on top (DTensor: Shard(d) over a mesh dim that is not the model's groups): each
    # device holds its rank's value cut in len(group) blocks along dim, gathered over these groups.
    gathered: tuple[int, tuple[tuple[int, ...], ...]] | None = None
    head_groups: int = 1  # grouped / padded within K head groups (rules/kvgroups.egg)

    def describe(self) -> str:
        if self.relation == "grouped":
            return f"grouped along dim {self.dim} in {self.head_groups} head groups (each block on c/{self.head_groups} ranks)"
        if self.relation == "padded" and self.head_groups > 1:
            return f"padded along dim {self.dim} within {self.head_groups} head groups to width {self.width} per rank"
        if self.relation == "padded":
            if self.blocks:
                return f"padded along dim {self.dim} in blocks {list(self.blocks)} to widths {list(self.widths)} per rank"
            return f"padded along dim {self.dim} to width {self.width} per rank"
        if self.relation == "sharded":
            blocks = f", blocks {list(self.blocks)}" if self.blocks else ""
            return f"sharded along dim {self.dim}{blocks}"
        return "replicated"


EXPERT_LIST = "expert_list"
_STYLES = (*STYLES, EXPERT_LIST)


def parse_style(key: str, value: Any) -> Style:
    if isinstance(value, str):
        if value == EXPERT_LIST:
            return Style(EXPERT_LIST)
        if value not in STYLES:
            raise PlanError(key, f"expected one of {', '.join(_STYLES)} or {{shard: DIM}}, got {value!r}")
        return Style(value)
    if isinstance(value, Mapping):
        extra = set(value) - {"style", "shard", "blocks", "padded", "width", "head_groups"}
        if extra:
            raise PlanError(key, f"unknown key {sorted(extra)[0]!r}; expected style, shard, blocks, padded, width, head_groups")
        # head_groups K (neuronx-distributed-inference's GQA.REPLICATE_TO_TP_DEGREE): without
        # padded, rank r holds block floor(r·K/c) of K (KV heads replicated to the degree); with
        # padded, each of the K groups is padded at its tail and split over its c/K ranks.
        hg = value.get("head_groups", 1)
        if not isinstance(hg, int) or isinstance(hg, bool) or hg < 1 or ("head_groups" in value and value.get("blocks")):
            raise PlanError(key, f"head_groups: expected the number of KV head groups (a positive integer, without blocks), got {hg!r}")
        padded = value.get("padded", False)
        if not isinstance(padded, bool):
            raise PlanError(key, f"padded: expected true or false, got {padded!r}")
        blocks = value.get("blocks") or ()
        if not isinstance(blocks, Sequence) or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blocks):
            raise PlanError(key, f"blocks: expected a list of positive block sizes, got {blocks!r}")
        # padded with blocks (a fused weight, each block padded on its own): the blocks' per-rank
        # widths, given, or the rank's extent split equally over equal blocks (relation_for).
        widths = value.get("width", ())
        if "width" in value and (not (padded and blocks) or not isinstance(widths, Sequence) or len(widths) != len(blocks) or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths)):
            raise PlanError(key, f"width: expected one positive per-rank width per block of a padded fused weight (padded: true, blocks: [...]), got {widths!r}")
        if ("style" in value) == ("shard" in value):
            raise PlanError(key, "expected exactly one of 'style' or 'shard'")
        if "shard" in value:
            dim = value["shard"]
            if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
                raise PlanError(key, f"shard: expected a dimension >= 0, got {dim!r}")
            return Style("shard", dim, tuple(blocks), padded, tuple(widths), hg)
        style = parse_style(key, value["style"])
        if (blocks or padded or hg > 1) and style.kind in ("replicate", "sequence_parallel", EXPERT_LIST):
            raise PlanError(key, f"{'blocks' if blocks else 'padded'} apply to a sharded style, not {style.kind}")
        return Style(style.kind, style.dim, tuple(blocks), padded, tuple(widths), hg)
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

    def stacked(self, param: str) -> tuple[str, int] | None:
        """For a parameter of an expert list (``moe.experts.3.fc1.weight`` under an
        ``expert_list`` entry ``moe.experts``): its stacked name (``moe.experts.*.fc1.weight``)
        and its expert's index in the list (3); else None."""
        parts = param.split(".")
        for _, style, rx in self.entries:
            if style.kind != EXPERT_LIST:
                continue
            for i in range(1, len(parts) - 1):
                if parts[i].isdigit() and rx.fullmatch(".".join(parts[:i])):
                    return ".".join([*parts[:i], "*", *parts[i + 1 :]]), int(parts[i])
        return None

    def _expert_list(self, param: str) -> tuple[str, Style] | None:
        """The expert_list entry whose list a stacked name (``moe.experts.*.fc1.weight``) is of."""
        head, star, _ = param.partition(".*.")
        if not star:
            return None
        for key, style, rx in self.entries:
            if style.kind == EXPERT_LIST and rx.fullmatch(head):
                return key, style
        return None

    def lookup(self, param: str) -> tuple[str, Style, bool] | None:
        """(plan key, style, whether the key names the parameter itself) for ``param``.

        An entry naming the parameter wins over one naming its module; among equals the first
        declared wins, as in Hugging Face plans. A stacked expert-list name takes its list's entry.
        """
        listed = self._expert_list(param)
        if listed is not None:
            return listed[0], listed[1], False
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
        for key, style, rx in self.entries:
            if style.kind == EXPERT_LIST:
                used = any(rx.fullmatch(p.partition(".*.")[0]) for p in params if ".*." in p)
            else:
                used = any(rx.fullmatch(p) or ("." in p and rx.fullmatch(p.rsplit(".", 1)[0])) for p in params)
            if not used:
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
    elif style.kind == EXPERT_LIST:
        if ".*." not in param:
            raise PlanError(key, f"{param!r} is not inside a list of modules indexed 0, 1, ...; expert_list names an nn.ModuleList of experts")
        per_rank = full[0] // c if full[0] % c == 0 else None
        if per_rank is None or local != (per_rank, *full[1:]):
            raise PlanError(
                key,
                f"{param.replace('.*.', '.<j>.')!r}: expert_list over {c} ranks gives rank r the baseline's experts r*E/{c} ... r*E/{c} + E/{c} - 1, "
                f"but the baseline lists {full[0]} expert(s) of shape {list(full[1:])} and each rank {local[0]} of shape {list(local[1:])}"
                + ("" if full[0] % c == 0 else f" ({full[0]} experts do not divide over {c} ranks)"),
            )
        return ParamRelation("sharded", 0, (), key)
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
    if style.head_groups > 1:
        return _head_groups(key, param, style, dim, full, local, c)
    if style.padded:
        w = local[dim] if len(local) == len(full) else 0
        want_other = tuple(n for i, n in enumerate(full) if i != dim)
        if len(local) != len(full) or tuple(n for i, n in enumerate(local) if i != dim) != want_other or w < 1 or c * w < full[dim]:
            raise PlanError(
                key,
                f"{param!r} is {style.kind} padded along dim {dim} over {c} ranks, so each rank should hold "
                f"w >= {-(-full[dim] // c)} along dim {dim} and the baseline's extents elsewhere ({list(full)}), but the distributed module holds {list(local)}",
            )
        if style.blocks:
            return _padded_blocks(key, param, style, dim, full[dim], w, c)
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


def _padded_blocks(key: str, param: str, style: Style, dim: int, n: int, w: int, c: int) -> ParamRelation:
    """A fused weight whose blocks are each padded on their own (rank extent w along dim): the
    blocks' widths as given, or w split equally over equal blocks."""
    blocks = style.blocks
    if sum(blocks) != n:
        raise PlanError(key, f"blocks {list(blocks)} of {param!r} sum to {sum(blocks)}, but dim {dim} has {n}")
    widths = style.widths
    if not widths:
        if len(set(blocks)) != 1 or w % len(blocks):
            raise PlanError(key, f"{param!r}: blocks {list(blocks)} padded over {c} ranks need their per-rank widths (width: [...], summing to the rank's {w} along dim {dim})")
        widths = (w // len(blocks),) * len(blocks)
    if sum(widths) != w or any(c * x < b for x, b in zip(widths, blocks, strict=True)):
        raise PlanError(
            key,
            f"{param!r}: blocks {list(blocks)} padded to widths {list(widths)} per rank need widths of at least {[-(-b // c) for b in blocks]} summing to the rank's extent along dim {dim}, which is {w}",
        )
    return ParamRelation("padded", dim, tuple(blocks), key, w, tuple(widths))


def _head_groups(key: str, param: str, style: Style, dim: int, full: tuple[int, ...], local: tuple[int, ...], c: int) -> ParamRelation:
    """K head groups along dim over c ranks (c/K per group, rank r in group floor(r·K/c)):
    ``grouped`` (each rank its group's whole block: KV heads replicated to the degree) or, with
    padded, ``padded`` within the groups (each group padded at its tail, split over its ranks)."""
    k = style.head_groups
    others_ok = len(local) == len(full) and all(a == b for i, (a, b) in enumerate(zip(full, local, strict=True)) if i != dim)
    if c % k or full[dim] % k or not others_ok:
        raise PlanError(key, f"{param!r}: {k} head groups along dim {dim} over {c} ranks need c and the baseline's {full[dim]} to divide by {k}, and the ranks to hold the baseline's extents elsewhere ({list(full)}); the distributed module holds {list(local)}")
    n, w = full[dim] // k, local[dim]
    if not style.padded:
        if w != n:
            raise PlanError(key, f"{param!r} is grouped in {k} head groups along dim {dim}: each rank holds its group's whole block of {n}, but the distributed module holds {list(local)}")
        return ParamRelation("grouped", dim, (), key, head_groups=k)
    if (c // k) * w < n:
        raise PlanError(key, f"{param!r} is padded within {k} head groups along dim {dim}: the {c // k} ranks of a group hold w >= {-(-n // (c // k))} each of its {n}, but the distributed module holds {list(local)}")
    return ParamRelation("padded", dim, (), key, w, head_groups=k)
