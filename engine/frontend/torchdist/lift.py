"""Lift the c per-rank programs of an int-rank model into the one program every rank runs.

Every rank's program was traced from the same code; torch-xla numbers instructions
deterministically, so the texts agree line by line wherever the ranks compute the same thing.
Lines may differ in two ways only:

- a ``constant``'s literal (the rank's offsets, baked in as Python ints): the lifted program
  reads the literal from a table of every rank's value indexed by the device id,
  ``reshape(dynamic-slice(constant(table), replica-id()))``. That is the per-rank program
  exactly; the verifier's rank evaluation (``hlo.rank``) turns a table that is ``a·r + b`` in the
  rank within its group, on every group, into rank arithmetic, and the numeric witness runs the
  table as it is;
- a collective's ``replica_groups``: each rank names only its own group; the lifted program
  names the union, which must partition the world the same way on every rank.

Any other difference, and any literal that is not ``a·r + b`` across a group, is a
``rank-specific`` finding: its instruction, the source line, and the odd rank(s) out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

_INSTRUCTION = re.compile(r"^(\s+)(ROOT )?%(\S+) = (\S+) (\S+?)\((.*)$")
_CONSTANT = re.compile(r"^(\s+)(ROOT )?%(\S+) = ((\w+)\[([\d,]*)\](?:\{[\d,]*\})?) constant\((.*?)\)(, metadata=\{.*\})?$")
_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_SOURCE = re.compile(r'source_file="([^"]*)" source_line=(\d+)')


@dataclass
class Finding:
    """One rank-specific difference."""

    instruction: str
    where: str  # file:line
    ranks: list[int]  # the odd rank(s) out
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"instruction": self.instruction, "where": self.where, "ranks": self.ranks, "message": self.message}


@dataclass
class Lifted:
    text: str
    findings: list[Finding] = field(default_factory=list)
    tables: int = 0  # literals read from a per-rank table
    affine: int = 0  # of which a·r + b in the rank within its group
    merged_groups: int = 0


def _groups_of(line: str) -> list[list[int]] | None:
    m = _GROUPS.search(line)
    if m is None:
        return None
    return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]


def _numbers(literal: str) -> list[str]:
    return literal.replace("{", " ").replace("}", " ").replace(",", " ").split()


def _value(token: str) -> Fraction | None:
    try:
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _fit(values: list[Fraction | None], positions: list[int]) -> tuple[Fraction, Fraction, list[int]] | None:
    """The line a·p + b through most (position, value) pairs: (a, b, indices that miss it)."""
    points = [(p, v) for p, v in zip(positions, values, strict=True) if v is not None]
    if len(points) != len(values):
        return None
    best: tuple[Fraction, Fraction, list[int]] | None = None
    candidates = [(points[i], points[j]) for i in range(len(points)) for j in range(i + 1, len(points)) if points[i][0] != points[j][0]]
    if not candidates:  # one position: every rank must agree
        common = Counter(v for _, v in points).most_common(1)[0][0]
        return Fraction(0), common, [i for i, (_, v) in enumerate(points) if v != common]
    for (p0, v0), (p1, v1) in candidates:
        a = (v1 - v0) / (p1 - p0)
        b = v0 - a * p0
        misses = [i for i, (p, v) in enumerate(points) if a * p + b != v]
        if best is None or len(misses) < len(best[2]):
            best = (a, b, misses)
    return best


def _where(line: str, sources: dict[str, str], name: str) -> str:
    if name in sources:
        return sources[name]
    m = _SOURCE.search(line)
    return f"{m.group(1)}:{m.group(2)}" if m else "?"


def _table(dtype: str, dims: list[int], literals: list[str]) -> str:
    rank_dims = [len(literals), *dims]
    layout = "{" + ",".join(str(i) for i in reversed(range(len(rank_dims)))) + "}"
    shape = f"{dtype}[{','.join(str(d) for d in rank_dims)}]{layout}"
    body = ", ".join(literals) if not dims else " ".join(("{ " + ", ".join(literals) + " }").split())
    return f"{shape} constant({{{body}}})" if not dims else f"{shape} constant({body})"


def lift(texts: list[str], world: list[int], groups: list[list[int]], sources: dict[str, str] | None = None) -> Lifted:
    """One program from ``texts[i]``, the program of world rank ``world[i]``.

    ``groups`` are the model's sharding groups (rank r of group k is ``groups[k][r]``);
    ``sources`` maps instruction names to ``file:line`` for findings.
    """
    sources = sources or {}
    index = {rank: (k, r) for k, group in enumerate(groups) for r, rank in enumerate(group)}
    split = [t.split("\n") for t in texts]
    out = Lifted("")
    if len({len(lines) for lines in split}) != 1:
        counts = Counter(len(lines) for lines in split)
        usual = counts.most_common(1)[0][0]
        odd = [world[i] for i, lines in enumerate(split) if len(lines) != usual]
        out.findings.append(Finding("", "?", odd, f"rank(s) {odd} trace a program of a different length ({[len(s) for s in split]} lines): the ranks run different code"))
        out.text = texts[0]
        return out
    lines_out: list[str] = []
    for n, variants in enumerate(zip(*split, strict=True)):
        first = variants[0]
        if all(v == first for v in variants):
            lines_out.append(first)
            continue
        constants = [_CONSTANT.match(v) for v in variants]
        if all(constants) and len({(m.group(3), m.group(4), m.group(8)) for m in constants if m}) == 1:
            lines_out += _lift_constant(constants, world, index, out, sources, first)  # type: ignore[arg-type]
            continue
        group_lists = [_groups_of(v) for v in variants]
        if all(g is not None for g in group_lists) and len({_GROUPS.sub("", v) for v in variants}) == 1:
            merged = _merge_groups(group_lists, world, out, first, sources)  # type: ignore[arg-type]
            lines_out.append(_GROUPS.sub("replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in merged) + "}", first))
            continue
        usual = Counter(variants).most_common(1)[0][0]
        odd = [world[i] for i, v in enumerate(variants) if v != usual]
        m = _INSTRUCTION.match(first)
        name = m.group(3) if m else f"line {n + 1}"
        out.findings.append(Finding(name, _where(first, sources, name), odd, f"rank(s) {odd} compute {name} differently from the other ranks"))
        lines_out.append(first)
    out.text = "\n".join(lines_out)
    return out


def _lift_constant(matches: list[re.Match[str]], world: list[int], index: dict[int, tuple[int, int]], out: Lifted, sources: dict[str, str], line: str) -> list[str]:
    m0 = matches[0]
    indent, root, name, shape, dtype, dims_text, _, metadata = m0.groups()
    dims = [int(d) for d in dims_text.split(",") if d]
    literals = [m.group(7) for m in matches]
    out.tables += 1
    # Is the literal a·r + b in the rank r within its group, the same on every group?
    per_rank = [[_value(t) for t in _numbers(lit)] for lit in literals]
    positions = [index.get(w, (0, 0))[1] for w in world]
    odd: set[int] = set()
    detail = ""
    affine = True
    for element in range(len(per_rank[0])):
        values = [vals[element] if element < len(vals) else None for vals in per_rank]
        fit = _fit(values, positions)
        if fit is None:
            affine = False
            continue
        a, b, misses = fit
        if misses:
            affine = False
            for i in misses:
                if world[i] not in odd and not detail:
                    expect = a * positions[i] + b
                    detail = f"{name} = {_show(values[i])} on rank {world[i]} where {_show(a)}·r+{_show(b)} gives {_show(expect)}"
                odd.add(world[i])
    if affine:
        out.affine += 1
    elif odd:
        where = _where(line, sources, name)
        out.findings.append(Finding(name, where, sorted(odd), f"{detail} ({where})"))
    ds = f"{dtype}[{len(world)}{''.join(',' + str(d) for d in dims)}]"
    zero = f"%{name}.rank_zero"
    lines = [f"{indent}%{name}.rank_table = {_table(dtype, dims, literals)}", f"{indent}%{name}.rank_id = u32[] replica-id()"]
    starts = [f"%{name}.rank_id"]
    if dims:
        lines.append(f"{indent}{zero} = u32[] constant(0)")
        starts += [zero] * len(dims)
    layout = "{" + ",".join(str(i) for i in reversed(range(len(dims) + 1))) + "}"
    lines.append(f"{indent}%{name}.rank_slice = {ds.split('[')[0]}[1{''.join(',' + str(d) for d in dims)}]{layout} dynamic-slice({', '.join(starts)}), dynamic_slice_sizes={{1{''.join(',' + str(d) for d in dims)}}}".replace("dynamic-slice(", f"dynamic-slice(%{name}.rank_table, "))
    lines.append(f"{indent}{root or ''}%{name} = {shape} reshape(%{name}.rank_slice){metadata or ''}")
    # The table is indexed by the device id, so it must list every device 0..N-1 in order.
    assert world == sorted(world) == list(range(len(world)))
    return lines


def _show(v: Fraction | None) -> str:
    if v is None:
        return "?"
    return str(v.numerator) if v.denominator == 1 else f"{float(v):g}"


def _merge_groups(group_lists: list[list[list[int]]], world: list[int], out: Lifted, line: str, sources: dict[str, str]) -> list[list[int]]:
    merged: list[list[int]] = []
    odd: list[int] = []
    for rank, groups in zip(world, group_lists, strict=True):
        own = [g for g in groups if rank in g]
        if len(groups) != 1 or len(own) != 1:
            odd.append(rank)
            continue
        if own[0] not in merged:
            merged.append(own[0])
    flat = [r for g in merged for r in g]
    if odd or len(set(flat)) != len(flat) or sorted(flat) != sorted(world):
        m = _INSTRUCTION.match(line)
        name = m.group(3) if m else "?"
        out.findings.append(Finding(name, _where(line, sources, name), odd or sorted(world), f"the ranks' groups of {name} do not partition the ranks: {[g for gl in group_lists for g in gl]}"))
    out.merged_groups += 1
    return sorted(merged)
