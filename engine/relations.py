"""The relations file: how inputs of the two graphs are related, and what outputs must satisfy.

This is a contract with the front end and with users writing it by hand for foreign HLO; the
names (groups, inputs, outputs, baseline, distributed, relation, dim, blocks) stay.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import InputError
from .yamltext import check_nesting, load

INPUT_RELATIONS = ("duplicate", "sharded", "partial", "rank", "token", "padded", "grouped")
# rank and token inputs exist only in the distributed program.
DIST_ONLY = ("rank", "token")
OUTPUT_RELATIONS = ("duplicate", "sharded", "partial")
REDUCE_OPS = ("add", "max", "min")
# Assumptions a user may state (``assume:`` in the relations file, ``--assume`` on the command
# line, ``verify: {assume: [...]}`` in .shardproof.yml). Each weakens what ``verified`` promises,
# so every verdict reached under one names it (Result.assumptions).
# - elided-constants: an elided constant (``constant({...})``, its values left out of the text)
#   of the distributed program equals the baseline's elided constant with the same instruction
#   name, shape and element type — and nothing else (no value is known; any other elided
#   constant stays unknown).
ASSUMPTIONS = ("elided-constants",)
ASSUMPTION_TEXT = {"elided-constants": "elided constants equal by name"}


@dataclass(frozen=True)
class Relation:
    kind: str  # duplicate | sharded | partial | rank | token (torch-xla's collective token) | padded
    dim: int | None = None
    blocks: tuple[int, ...] = ()
    op: str = "add"
    # padded (an input only): rank r holds elements [r·width, r·width + width) along dim of the
    # baseline extended with zeros to c·width there (heads or FFN features padded to a
    # multiple of the group size, as Neuron does when they do not divide).
    width: int | None = None
    # padded with blocks (a fused weight, [q | k | v]): the dim is the concatenation of the
    # blocks, each padded on its own to c·widths[i] and split over the ranks; rank r holds its
    # piece of every block, in block order (width is then their sum, the per-rank extent).
    widths: tuple[int, ...] = ()
    # head_groups K (neuronx-distributed-inference's GQA.REPLICATE_TO_TP_DEGREE; rules/kvgroups.egg):
    # dim is K groups of equal extent, q = c/K ranks per group, rank r in group floor(r/q).
    # padded: each group padded at its tail to q·width and split over its q ranks (q heads
    # padded interleaved); grouped: rank r holds its group's whole block (KV heads replicated).
    head_groups: int = 1

    def padded_spec(self) -> str:
        """A padded relation's blocks as rules/padded.egg's padb spec: "n:w,..." (baseline
        extent : per-rank width of each block, in block order)."""
        return ",".join(f"{n}:{w}" for n, w in zip(self.blocks, self.widths, strict=True))

    def describe(self) -> str:
        if self.kind == "grouped":
            return f"grouped(dim={self.dim}, head_groups={self.head_groups})"
        if self.kind == "padded":
            if self.head_groups > 1:
                return f"padded(dim={self.dim}, width={self.width}, head_groups={self.head_groups})"
            if self.blocks:
                return f"padded(dim={self.dim}, blocks={list(self.blocks)}, width={list(self.widths)})"
            return f"padded(dim={self.dim}, width={self.width})"
        if self.kind == "sharded":
            b = f", blocks={list(self.blocks)}" if self.blocks else ""
            return f"sharded(dim={self.dim}{b})"
        if self.kind == "partial":
            return f"partial({self.op})"
        return self.kind


@dataclass(frozen=True)
class Gathered:
    """An input cut further over devices outside the sharding group and gathered whole inside
    the program (FSDP on a data-parallel axis): each device holds its rank's value (the
    binding's relation) cut into ``len(group)`` equal blocks along ``dim``, block j on the j-th
    device of its group in ``groups``; every member of such a group has the same rank. The
    program's all-gather of the parameter along ``dim`` over exactly these groups restores the
    rank's value, so the relation holds for that all-gather's result (the parameter itself
    relates to nothing)."""

    dim: int
    groups: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Binding:
    baseline: int | str | None
    distributed: int | str | None
    relation: Relation
    key: str  # "inputs[2]" for messages
    int_range: tuple[int, int] | None = None
    gathered: Gathered | None = None
    # The groups hold different values of this input (data parallel: each group its own part of
    # the global batch, the baseline's input being one group's part). Relations hold within a
    # group as ever; the witness gives each group its own value (engine.witness.inputs).
    per_group_data: bool = False


CUSTOM_CALL_KEEPS = ("duplicate", "sharded")


@dataclass
class CustomCallRule:
    """What a custom-call target is declared to compute (the relations file's custom_calls).

    - ``keeps: [duplicate]``: a deterministic function; identical operands give identical results.
    - ``keeps: all`` (``identity``): the call returns operand 0 unchanged (a transfer or marker
      call such as Neuron's AwsNeuronTransferWithStaticRing); it keeps every relation.
    - ``keeps: [duplicate, sharded]`` with ``reduces: [dims]``: the call works independently
      along every result dim not in ``reduces`` (a row-wise norm reduces only its last dim), so
      a block of operand 0 along such a dim gives the same block of the result. Operands with
      the result's shape are blocked alike; every other operand (a norm's weight) must be
      identical on all ranks.
    """

    target: str
    keeps: tuple[str, ...]  # relations the call preserves, e.g. ("duplicate",)
    identity: bool = False
    reduces: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.identity:
            return "keeps: all (the identity on operand 0)"
        r = f", reduces: {list(self.reduces)}" if "sharded" in self.keeps else ""
        return f"keeps: {list(self.keeps)}{r}"


@dataclass
class RelationSpec:
    groups: list[list[int]]
    inputs: list[Binding]
    outputs: list[Binding]
    custom_calls: dict[str, CustomCallRule] = field(default_factory=dict)
    path: str = "<relations>"
    assume: tuple[str, ...] = ()  # ASSUMPTIONS the user stated, in ASSUMPTIONS' order

    @property
    def c(self) -> int:
        return len(self.groups[0])


def load_relations(path: str | Path) -> RelationSpec:
    p = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(p, "", f"cannot read relations file: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise InputError(p, f"byte {e.start}", "not UTF-8 text") from e
    check_nesting(text, p)
    try:
        data = load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise InputError(p, where, f"not valid YAML: {getattr(e, 'problem', e)}") from e
    except (ValueError, TypeError) as e:  # PyYAML's constructors, e.g. the date 2001-13-45
        raise InputError(p, "", f"not valid YAML: {e}") from e
    except RecursionError as e:
        raise InputError(p, "", "YAML nested too deeply") from e
    return parse_relations(data, p)


def parse_relations(data: Any, path: str = "<relations>") -> RelationSpec:
    def fail(key: str, msg: str) -> InputError:
        return InputError(path, key, msg)

    if not isinstance(data, dict):
        raise fail("", "expected a mapping with keys groups, inputs, outputs")
    unknown = set(data) - {"groups", "inputs", "outputs", "custom_calls", "assume", "description"}
    if unknown:
        # The key goes in quotes: a key like "3:4" must not read as a line and column.
        raise fail("", f"unknown key {sorted(map(str, unknown))[0]!r}; expected one of groups, inputs, outputs, custom_calls, assume")
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups or not all(isinstance(g, list) and g and all(isinstance(r, int) and not isinstance(r, bool) for r in g) for g in groups):
        raise fail("groups", "expected a non-empty list of rank lists, e.g. [[0, 1, 2, 3]]")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise fail("groups", f"all groups must have the same size, got sizes {sorted(sizes)}")
    flat = [r for g in groups for r in g]
    if len(set(flat)) != len(flat):
        raise fail("groups", "a rank appears in two groups")
    inputs = [_binding(x, f"inputs[{i}]", INPUT_RELATIONS, fail) for i, x in enumerate(_list(data, "inputs", fail))]
    outputs = [_binding(x, f"outputs[{i}]", OUTPUT_RELATIONS, fail) for i, x in enumerate(_list(data, "outputs", fail))]
    if not outputs:
        raise fail("outputs", "expected at least one output relation")
    for b in inputs:
        if b.relation.kind in DIST_ONLY:
            if b.distributed is None or b.baseline is not None:
                raise fail(b.key, f"a {b.relation.kind} input names only a distributed parameter")
        elif b.baseline is None or b.distributed is None:
            raise fail(b.key, "expected both 'baseline' and 'distributed' parameters")
    for b in inputs:
        if b.gathered is not None:
            _check_gathered(b, groups, fail)
    for b in outputs:
        if not isinstance(b.baseline, int) or not isinstance(b.distributed, int):
            raise fail(b.key, "outputs name ROOT tuple indices (integers) for baseline and distributed")
    ccs: dict[str, CustomCallRule] = {}
    custom_calls = data.get("custom_calls") or []
    if not isinstance(custom_calls, list):
        raise fail("custom_calls", "expected a list of {target: NAME, keeps: [duplicate]}")
    for i, cc in enumerate(custom_calls):
        rule = _custom_call(cc, f"custom_calls[{i}]", fail)
        if rule.target in ccs:
            raise fail(f"custom_calls[{i}].target", f"custom-call target {rule.target!r} is declared twice")
        ccs[rule.target] = rule
    assume = parse_assumptions(data.get("assume", []), lambda msg: fail("assume", msg))
    return RelationSpec(groups, inputs, outputs, ccs, path, assume)


def parse_assumptions(value: Any, fail: Any) -> tuple[str, ...]:
    """A list of assumption names (ASSUMPTIONS), as a tuple in ASSUMPTIONS' order; ``fail(msg)``
    builds the error for anything else."""
    if not isinstance(value, list) or any(not isinstance(a, str) for a in value):
        raise fail(f"expected a list of assumption names, of {', '.join(ASSUMPTIONS)}; got {value!r}")
    for a in value:
        if a not in ASSUMPTIONS:
            raise fail(f"unknown assumption {a!r}; expected one of {', '.join(ASSUMPTIONS)}")
    return tuple(a for a in ASSUMPTIONS if a in value)


def with_assumptions(spec: RelationSpec, extra: tuple[str, ...] | list[str]) -> RelationSpec:
    """``spec`` with the assumptions ``extra`` added (those of the file kept)."""
    if not extra or set(extra) <= set(spec.assume):
        return spec
    return dataclasses.replace(spec, assume=tuple(a for a in ASSUMPTIONS if a in spec.assume or a in extra))


def _check_gathered(b: Binding, groups: list[list[int]], fail: Any) -> None:
    """The gathered groups cover every device once, are of one size, and each holds devices of
    one rank (so the gathered blocks are pieces of one rank's value)."""
    assert b.gathered is not None
    key = f"{b.key}.gathered.groups"
    rank_of = {d: r for g in groups for r, d in enumerate(g)}
    flat = [d for g in b.gathered.groups for d in g]
    if sorted(flat) != sorted(rank_of):
        raise fail(key, f"the gathered groups must cover the devices of groups {groups} once each, got {[list(g) for g in b.gathered.groups]}")
    if len({len(g) for g in b.gathered.groups}) != 1:
        raise fail(key, "all gathered groups must have the same size")
    for g in b.gathered.groups:
        if len({rank_of[d] for d in g}) != 1:
            raise fail(key, f"gathered group {list(g)} mixes ranks {sorted({rank_of[d] for d in g})} of the sharding groups; its devices must hold the same rank's value")
    # A gathered group of two or more devices joins devices of different sharding groups (one
    # rank each), whose blocks make one value: that value cannot also differ between the groups.
    # Both together were verified although the all-gather joins blocks of different values
    # (tests/soundness_regressions/gathered_per_group_data).
    if b.per_group_data and len(b.gathered.groups[0]) > 1:
        raise fail(f"{b.key}.per_group_data", f"a gathered input holds one value across its gathered groups {[list(g) for g in b.gathered.groups]}, which join devices of different sharding groups; it cannot differ between the groups (drop per_group_data, or gathered)")


def _custom_call(cc: Any, key: str, fail: Any) -> CustomCallRule:
    """One custom_calls entry; errors name the entry's key, its target and what was expected."""
    if not isinstance(cc, dict) or not isinstance(cc.get("target"), str) or not cc["target"]:
        raise fail(key, "expected {target: NAME, keeps: [duplicate] | all | [duplicate, sharded], reduces: [dims]}")
    target = cc["target"]
    extra = set(cc) - {"target", "keeps", "reduces", "description"}
    if extra:
        raise fail(f"{key}.{sorted(map(str, extra))[0]}", f"unknown key in the entry of custom-call target {target!r}; expected target, keeps, reduces")
    keeps = cc.get("keeps", ["duplicate"])
    has_reduces = "reduces" in cc
    if keeps == "all":
        if has_reduces:
            raise fail(f"{key}.reduces", f"custom-call target {target!r} keeps all (the identity on operand 0); 'reduces' only goes with keeps: [duplicate, sharded]")
        return CustomCallRule(target, ("duplicate", "sharded", "partial"), identity=True)
    if not isinstance(keeps, list) or any(not isinstance(k, str) or k not in CUSTOM_CALL_KEEPS for k in keeps) or len(set(keeps)) != len(keeps):
        raise fail(f"{key}.keeps", f"custom-call target {target!r}: expected 'all' or a list of the relations the call preserves, of {', '.join(CUSTOM_CALL_KEEPS)}; got {keeps!r}")
    if "sharded" in keeps:
        # A call that maps blocks to blocks computes a function of its operands: it is
        # deterministic, so it keeps duplicates too (the dup law applies to it either way).
        if "duplicate" not in keeps:
            raise fail(f"{key}.keeps", f"custom-call target {target!r}: keeps [sharded] needs duplicate too: [duplicate, sharded]")
        reduces = cc.get("reduces")
        if not has_reduces or not isinstance(reduces, list) or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in reduces) or len(set(reduces)) != len(reduces):
            raise fail(f"{key}.reduces", f"custom-call target {target!r} keeps sharded: expected 'reduces', the list of dims the call reduces or mixes (e.g. [2] for a norm over the last of 3 dims; [] for a pointwise call)")
        return CustomCallRule(target, tuple(keeps), reduces=tuple(sorted(reduces)))
    if has_reduces:
        raise fail(f"{key}.reduces", f"custom-call target {target!r}: 'reduces' only goes with keeps: [duplicate, sharded]")
    return CustomCallRule(target, tuple(keeps))


def _list(data: dict[str, Any], key: str, fail: Any) -> list[Any]:
    v = data.get(key)
    if not isinstance(v, list):
        raise fail(key, "expected a list of {baseline, distributed, relation, ...} entries")
    return v


def _binding(x: Any, key: str, allowed: tuple[str, ...], fail: Any) -> Binding:
    if not isinstance(x, dict):
        raise fail(key, "expected a mapping like {baseline: 0, distributed: 0, relation: duplicate}")
    extra = set(x) - {"baseline", "distributed", "relation", "dim", "blocks", "op", "int_range", "name", "width", "gathered", "per_group_data", "head_groups"}
    if extra:
        raise fail(f"{key}.{sorted(map(str, extra))[0]}", "unknown key")
    rel = x.get("relation")
    if rel not in allowed:
        raise fail(f"{key}.relation", f"expected one of {', '.join(allowed)}, got {rel!r}")
    for side in ("baseline", "distributed"):
        v = x.get(side)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, int) and v < 0)):
            raise fail(f"{key}.{side}", "expected a parameter number (0-based) or a parameter name")
    dim = x.get("dim")
    if rel in ("sharded", "padded", "grouped"):
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise fail(f"{key}.dim", f"a {rel} relation needs 'dim', a non-negative integer")
    elif dim is not None:
        raise fail(f"{key}.dim", f"'dim' only applies to sharded, not {rel}")
    blocks = x.get("blocks") or []
    if not isinstance(blocks, list) or (blocks and (rel not in ("sharded", "padded") or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blocks))):
        raise fail(f"{key}.blocks", "expected a list of positive block sizes on a sharded or padded relation")
    op = x.get("op", "add")
    if op not in REDUCE_OPS:
        raise fail(f"{key}.op", f"expected one of {', '.join(REDUCE_OPS)}")
    width = x.get("width")
    widths: tuple[int, ...] = ()
    if rel == "padded" and blocks:
        # One width per block (or one for all): block i is padded to c·widths[i] on its own.
        ws = width if isinstance(width, list) else [width] * len(blocks)
        if len(ws) != len(blocks) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in ws):
            raise fail(f"{key}.width", f"a padded relation with blocks {blocks} needs 'width', the per-rank extent of each block: a list of {len(blocks)} positive integers (or one for all)")
        widths = tuple(ws)
        width = sum(widths)
    elif rel == "padded":
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise fail(f"{key}.width", "a padded relation needs 'width', the per-rank extent along dim (a positive integer)")
    elif width is not None:
        raise fail(f"{key}.width", f"'width' only applies to padded, not {rel}")
    hg = x.get("head_groups", 1)
    if "head_groups" in x:
        if rel not in ("padded", "grouped") or (rel == "padded" and blocks):
            raise fail(f"{key}.head_groups", f"'head_groups' applies to padded (without blocks) and grouped, not {rel}{' with blocks' if blocks else ''}")
        if not isinstance(hg, int) or isinstance(hg, bool) or hg < 1:
            raise fail(f"{key}.head_groups", f"expected the number of head groups (KV heads), a positive integer; got {hg!r}")
    elif rel == "grouped":
        raise fail(f"{key}.head_groups", "a grouped relation needs 'head_groups' K: rank r holds block floor(r·K/c) of K equal blocks along dim")
    ir = x.get("int_range")
    if ir is not None and not (isinstance(ir, list) and len(ir) == 2 and all(isinstance(v, int) for v in ir)):
        raise fail(f"{key}.int_range", "expected [lo, hi]")
    gathered = None
    if "gathered" in x:
        gx = x["gathered"]
        if rel not in ("duplicate", "sharded") or not isinstance(gx, dict) or set(gx) != {"dim", "groups"}:
            raise fail(f"{key}.gathered", "expected {dim: D, groups: [[device, ...], ...]} on a duplicate or sharded input")
        gd, gg = gx["dim"], gx["groups"]
        if not isinstance(gd, int) or isinstance(gd, bool) or gd < 0:
            raise fail(f"{key}.gathered.dim", "expected a non-negative integer")
        if not isinstance(gg, list) or not gg or not all(isinstance(g, list) and g and all(isinstance(d, int) and not isinstance(d, bool) for d in g) for g in gg):
            raise fail(f"{key}.gathered.groups", "expected a non-empty list of device lists")
        gathered = Gathered(gd, tuple(tuple(g) for g in gg))
    pgd = x.get("per_group_data", False)
    if not isinstance(pgd, bool):
        raise fail(f"{key}.per_group_data", "expected true or false")
    if pgd and (rel in DIST_ONLY or "rank" not in allowed):  # outputs allow no rank
        raise fail(f"{key}.per_group_data", "only an input with a baseline value (not an output, rank or token) can differ between the groups")
    return Binding(x.get("baseline"), x.get("distributed"), Relation(rel, dim, tuple(blocks), op, width, widths, hg), key, tuple(ir) if ir else None, gathered, pgd)
