"""Lift the c per-rank programs of an int-rank model into the one program every rank runs.

Every rank's program was traced from the same code; torch-xla numbers instructions
deterministically, so the texts agree instruction by instruction wherever the ranks compute the
same thing. They are compared modulo what does not change a value:

- metadata (``op_name``, ``source_file``, ...): torch-xla's scope counters are process-wide,
  so the rank traced first reads ``layers.0.7/...`` where the others read ``layers.0.2/...``;
- no-op round trips: a reshape to another shape and straight back (torch-xla writes one for
  the rank's own slot of a list ``all_gather``, whose tensor is a view of another shape) is
  its operand; it is removed, and the instructions after it are matched by position, not by
  their (shifted) numbers.

What remains may differ in three ways:

- a ``constant``'s literal (the rank's offsets, baked in as Python ints): the lifted program
  reads the literal from a table of every rank's value indexed by the device id,
  ``reshape(dynamic-slice(constant(table), replica-id()))``. That is the per-rank program
  exactly; the verifier's rank evaluation (``hlo.rank``) turns a table that is ``a·r + b`` in the
  rank within its group, on every group, into rank arithmetic, and the numeric witness runs the
  table as it is;
- a collective's ``replica_groups``: each rank names only its own group; the lifted program
  names the union, which must partition the world the same way on every rank;
- any other instruction of the same shape (an operator, an attribute): every rank's variant is
  computed and the rank's own one selected by the device id (a rank switch), so the lifted
  program is still what each rank runs.

A literal that is not ``a·r + b`` across a group, and any rank switch, is a difference between
the ranks: its instruction, the source line and the odd rank(s) out. It is not yet a bug: the
runner reports it as ``rank-specific`` only when the witness, executing the lifted program,
shows an output differs (``Lifted.faithful`` says whether the lifted program is every rank's
program; when the ranks' programs cannot be put into one, nothing is executed and nothing is
claimed).
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import sysconfig
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
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
    round_trips: int = 0  # instructions of no-op round trips removed (per rank, on average)
    faithful: bool = True  # the text is every rank's program (else rank 0's: nothing to execute)


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


def lift(texts: list[str], world: list[int], groups: list[list[int]], sources: dict[str, str] | None = None, read_source: Callable[[str], str | None] | None = None) -> Lifted:
    """One program from ``texts[i]``, the program of world rank ``world[i]``.

    ``groups`` are the model's sharding groups (rank r of group k is ``groups[k][r]``);
    ``sources`` maps instruction names to ``file:line`` for findings; ``read_source`` reads a
    file the source map names (``source_reader``), so that a literal off the line is named by
    the Python expression it was traced from.
    """
    sources = sources or {}
    graph = _Graph(texts[0]) if read_source is not None else None
    index = {rank: (k, r) for k, group in enumerate(groups) for r, rank in enumerate(group)}
    out = Lifted("")
    programs = [_drop_round_trips(t.split("\n")) for t in texts]
    out.round_trips = sum(n for _, n in programs) // max(1, len(programs))
    split = [lines for lines, _ in programs]
    if len({len(lines) for lines in split}) != 1:
        counts = Counter(len(lines) for lines in split)
        usual = counts.most_common(1)[0][0]
        odd = [world[i] for i, lines in enumerate(split) if len(lines) != usual]
        out.findings.append(Finding("", "?", odd, f"rank(s) {odd} trace a program of a different length ({[len(s) for s in split]} instructions after removing no-op round trips): the ranks run different code"))
        out.text = texts[0]
        out.faithful = False
        return out
    # Each rank's names in rank 0's: instructions (and computations) are matched by position, so
    # a rank whose numbering shifted (a round trip removed, a scope pushed) reads like rank 0.
    renames = [_alignment(split[0], lines) for lines in split]
    lines_out: list[str] = []
    for n, originals in enumerate(zip(*split, strict=True)):
        first = originals[0]
        variants = [_canonical(v, renames[i]) for i, v in enumerate(originals)]
        if all(v == variants[0] for v in variants):
            lines_out.append(first)
            continue
        metadata = _metadata_of(first)
        constants = [_CONSTANT.match(v) for v in variants]
        if all(constants) and len({(m.group(3), m.group(4)) for m in constants if m}) == 1:
            lines_out += _lift_constant(constants, world, index, out, sources, first, _Namer(graph, read_source) if graph is not None and read_source is not None else None, metadata)  # type: ignore[arg-type]
            continue
        sliced = _lift_slice(variants, first, world, index, out, sources, metadata)
        if sliced is not None:
            lines_out += sliced
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
        switch = _rank_switch(variants, metadata, world) if m else None
        if switch is None:
            out.faithful = False
            lines_out.append(first)
            how = "the lifted program keeps rank " + str(world[0]) + "'s, so it is not every rank's program"
        else:
            lines_out += switch
            how = "the lifted program computes every rank's variant and selects the rank's own"
        out.findings.append(Finding(name, _where(first, sources, name), odd, f"rank(s) {odd} compute {name} differently from the other ranks ({how})"))
    out.text = "\n".join(lines_out)
    return out


# ---- comparing programs modulo metadata and no-op round trips -------------------------------

_METADATA = re.compile(r", metadata=\{[^{}]*\}")
_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) \(")
_NAME = re.compile(r"(?<![\w.\-])[A-Za-z_][\w.\-]*")
_TYPE = re.compile(r"^(\w+)\[([\d,]*)\]")
_COLLECTIVE = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "all-reduce-start", "all-gather-start", "collective-permute-start", "send", "recv")


def _metadata_of(line: str) -> str:
    m = _METADATA.search(line)
    return m.group(0) if m else ""


_DEFINES = re.compile(r"^(\s+(?:ROOT )?%(\S+) = )(.*)$")  # any instruction, tuple-typed too


def _defines(line: str) -> str | None:
    m = _DEFINES.match(line)
    if m:
        return m.group(2)
    h = _HEADER.match(line)
    return h.group(1) if h else None


def _alignment(reference: list[str], lines: list[str]) -> dict[str, str]:
    """Names defined in ``lines`` -> the name defined at the same position in ``reference``."""
    out = {}
    for a, b in zip(reference, lines, strict=True):
        na, nb = _defines(a), _defines(b)
        if na is not None and nb is not None and na != nb:
            out[nb] = na
    return out


def _canonical(line: str, rename: dict[str, str]) -> str:
    """The line without metadata, its names in the reference rank's."""
    line = _METADATA.sub("", line)
    return _NAME.sub(lambda m: rename.get(m.group(0), m.group(0)), line) if rename else line


def _operands_and_end(rest: str) -> tuple[list[str], int]:
    """The operand names of an instruction's text after its opening parenthesis, and where
    that operand list closes (the attributes follow)."""
    depth, end = 1, len(rest)
    for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            end = i
            break
    return re.findall(r"%([\w.\-]+)", rest[:end]), end


def _operand_names(rest: str) -> list[str]:
    return _operands_and_end(rest)[0]


def _same_shape(a: str, b: str) -> bool:
    """Same element type and dims (a layout is physical: a reshape reads logical order)."""
    ma, mb = _TYPE.match(a), _TYPE.match(b)
    return bool(ma and mb and ma.group(1) == mb.group(1) and ma.group(2) == mb.group(2))


def _drop_round_trips(lines: list[str]) -> tuple[list[str], int]:
    """``lines`` without reshapes that return to a shape their operand chain of reshapes started
    from: reshape(reshape(x, s), shape(x)) is x (a reshape reads and writes elements in the same
    row-major order, so a chain of them ending at x's own dims is the identity). Uses of such a
    reshape read x; reshapes left without users on the way are dropped too."""
    info: dict[str, tuple[str, str, list[str]]] = {}  # name -> (type, opcode, operands)
    roots: set[str] = set()
    for line in lines:
        m = _INSTRUCTION.match(line)
        if m:
            info[m.group(3)] = (m.group(4), m.group(5), _operand_names(m.group(6)))
            if m.group(2):
                roots.add(m.group(3))
    replace: dict[str, str] = {}
    for name, (typ, opcode, operands) in info.items():
        if opcode != "reshape" or name in roots or len(operands) != 1:
            continue
        y = replace.get(operands[0], operands[0])
        while y in info:
            if _same_shape(info[y][0], typ):
                replace[name] = y
                break
            if info[y][1] != "reshape" or len(info[y][2]) != 1:
                break
            y = replace.get(info[y][2][0], info[y][2][0])
    if not replace:
        return lines, 0

    def resolve(x: str) -> str:
        while x in replace:
            x = replace[x]
        return x

    ref = re.compile(r"(?:([a-z][a-z0-9]*\[[\d,]*\](?:\{[^}]*\})?) )?%(" + "|".join(re.escape(k) for k in sorted(replace, key=len, reverse=True)) + r")(?![\w.\-])")

    def sub(m: re.Match[str]) -> str:
        target = resolve(m.group(2))
        typ = info[target][0]
        return (f"{typ} " if m.group(1) else "") + f"%{target}"

    kept: list[str] = []
    for line in lines:
        name = _defines(line)
        if name in replace:
            continue
        m = _DEFINES.match(line)
        # Rewrite what follows the defined name (every instruction, whatever its type).
        kept.append(m.group(1) + ref.sub(sub, m.group(3)) if m else line)
    # Reshapes of a removed chain now without users.
    while True:
        used = Counter(o for line in kept if (m := _DEFINES.match(line)) for o in re.findall(r"%([\w.\-]+)", m.group(3)))
        dead = {name for line in kept if (name := _defines(line)) and info.get(name, ("", "", []))[1] == "reshape" and not used[name] and name not in roots and _INSTRUCTION.match(line)}
        if not dead:
            break
        kept = [line for line in kept if _defines(line) not in dead]
    return kept, len(lines) - len(kept)


def _rank_switch(variants: list[str], metadata: str, world: list[int]) -> list[str] | None:
    """Lines computing every distinct variant of one instruction and selecting rank r's by the
    device id; None when that would not be each rank's program (a collective every rank would
    then run, a parameter, a tuple or token value, or variants of different types)."""
    matches = [_INSTRUCTION.match(v) for v in variants]
    if not all(matches):
        return None
    ms = [m for m in matches if m]
    indent, root, name, typ = ms[0].group(1), ms[0].group(2) or "", ms[0].group(3), ms[0].group(4)
    if any(m.group(4) != typ or m.group(3) != name for m in ms) or not _TYPE.match(typ) or typ.startswith(("token", "(")):
        return None
    if any(m.group(5) in _COLLECTIVE or m.group(5) in ("parameter", "rng", "rng-bit-generator", "infeed", "outfeed") for m in ms):
        return None
    distinct = list(dict.fromkeys(variants))
    choice = [distinct.index(v) for v in variants]
    dims = _TYPE.match(typ).group(2)  # type: ignore[union-attr]
    lines = []
    for k, v in enumerate(distinct):
        m = _INSTRUCTION.match(v)
        assert m is not None
        lines.append(f"{indent}%{name}.variant{k} = {typ} {m.group(5)}({m.group(6)}{metadata}")
    lines.append(f"{indent}%{name}.variant_table = s32[{len(world)}]{{0}} constant({{{', '.join(map(str, choice))}}})")
    lines.append(f"{indent}%{name}.variant_id = u32[] replica-id()")
    lines.append(f"{indent}%{name}.variant_slice = s32[1]{{0}} dynamic-slice(s32[{len(world)}]{{0}} %{name}.variant_table, u32[] %{name}.variant_id), dynamic_slice_sizes={{1}}")
    lines.append(f"{indent}%{name}.variant = s32[] reshape(s32[1]{{0}} %{name}.variant_slice)")
    acc = f"%{name}.variant0"
    pred = f"pred[{dims}]"
    for k in range(1, len(distinct)):
        last = k == len(distinct) - 1
        lines.append(f"{indent}%{name}.is{k}.k = s32[] constant({k})")
        lines.append(f"{indent}%{name}.is{k}.eq = pred[] compare(s32[] %{name}.variant, s32[] %{name}.is{k}.k), direction=EQ")
        lines.append(f"{indent}%{name}.is{k} = {pred} broadcast(pred[] %{name}.is{k}.eq), dimensions={{}}")
        target = f"{root}%{name}" if last else f"%{name}.pick{k}"
        lines.append(f"{indent}{target} = {typ} select({pred} %{name}.is{k}, {typ} %{name}.variant{k}, {typ} {acc}){metadata if last else ''}")
        acc = f"%{name}.pick{k}"
    return lines


_SLICE = re.compile(r"^(\s+)(ROOT )?%(\S+) = (\S+) slice\((\S+ %[^\s,)]+)\), slice=\{((?:\[\d+:\d+(?::1)?\],?\s?)+)\}(.*)$")
_BOUNDS = re.compile(r"\[(\d+):(\d+)(?::1)?\]")


def _lift_slice(variants: list[str], line: str, world: list[int], index: dict[int, tuple[int, int]], out: Lifted, sources: dict[str, str], metadata: str) -> list[str] | None:
    """A ``slice`` of one operand whose starts differ between the ranks, of one size: the
    rank's piece cut at the rank's offsets (DTensor's Replicate -> Shard of a replicated
    tensor, ``torch.chunk`` indexed by the Python rank). The lifted program reads each start
    from a table of every rank's value (as a literal, ``_lift_constant``) and cuts with
    ``dynamic-slice`` there: exactly each rank's slice, the starts being within bounds. None
    when the variants are anything else."""
    matches = [_SLICE.match(v) for v in variants]
    if not all(matches):
        return None
    ms = [m for m in matches if m]
    bounds = [[(int(a), int(b)) for a, b in _BOUNDS.findall(m.group(6))] for m in ms]
    if len({(m.group(4), m.group(5), m.group(7)) for m in ms}) != 1 or len({tuple(b - a for a, b in bs) for bs in bounds}) != 1:
        return None
    m0 = _SLICE.match(line)
    assert m0 is not None
    indent, root, name, typ, operand = m0.group(1), m0.group(2) or "", m0.group(3), m0.group(4), m0.group(5)
    lines: list[str] = []
    starts = []
    for d in range(len(bounds[0])):
        values = [bs[d][0] for bs in bounds]
        start = f"%{name}.start{d}"
        starts.append(f"s32[] {start}")
        if len(set(values)) == 1:
            lines.append(f"{indent}{start} = s32[] constant({values[0]})")
            continue
        literal = [_CONSTANT.match(f"{indent}{start} = s32[] constant({v})") for v in values]
        lines += _lift_constant(literal, world, index, out, sources, line, None, "")  # type: ignore[arg-type]
    sizes = ",".join(str(b - a) for a, b in bounds[0])
    lines.append(f"{indent}{root}%{name} = {typ} dynamic-slice({operand}, {', '.join(starts)}), dynamic_slice_sizes={{{sizes}}}{metadata}")
    return lines


def _lift_constant(matches: list[re.Match[str]], world: list[int], index: dict[int, tuple[int, int]], out: Lifted, sources: dict[str, str], line: str, namer: _Namer | None = None, metadata: str = "") -> list[str]:
    m0 = matches[0]
    indent, root, name, shape, dtype, dims_text, _, _ = m0.groups()
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
        expr = namer.expression(name, where) if namer is not None else None
        if expr is not None:
            # Named by the Python expression the literal was traced from, the instruction after.
            detail = f"`{expr}`" + detail[len(name) :] + f" ({name}, {where})"
        else:
            detail += f" ({where})"
        out.findings.append(Finding(name, where, sorted(odd), detail))
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
        out.faithful = False
    out.merged_groups += 1
    return sorted(merged)


# ---- naming a literal by the Python expression it was traced from ---------------------------
#
# A rank's Python int reaches the program as a literal at its first use: ``x < self.start``
# traces as compare(x, broadcast(constant), direction=LT), ``x - self.start`` as
# subtract(x, broadcast(multiply(constant, alpha))). Following the literal to the first
# instruction that computes with it gives the operator and the operand position; the source
# line's AST has the one expression in that position of that operator. No framework's names
# are assumed: only how torch writes a Python binary operator on a tensor and a number.

_THROUGH = frozenset({"broadcast", "reshape", "convert", "copy", "bitcast", "transpose"})
_COMPARE = {"LT": ast.Lt, "LE": ast.LtE, "GT": ast.Gt, "GE": ast.GtE, "EQ": ast.Eq, "NE": ast.NotEq}
_MIRROR = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_ARITH: dict[str, tuple[type[ast.operator], ...]] = {"subtract": (ast.Sub,), "add": (ast.Add,), "multiply": (ast.Mult,), "divide": (ast.Div, ast.FloorDiv), "remainder": (ast.Mod,)}
_DIRECTION = re.compile(r"direction=(\w+)")


class _Graph:
    """Opcode, operands and users of every instruction of one HLO text (its entry and others)."""

    def __init__(self, text: str) -> None:
        self.opcode: dict[str, str] = {}
        self.operands: dict[str, list[str]] = {}
        self.attrs: dict[str, str] = {}
        self.users: dict[str, list[str]] = {}
        for line in text.split("\n"):
            m = _INSTRUCTION.match(line)
            if m is None:
                continue
            name, opcode, rest = m.group(3), m.group(5), m.group(6)
            operands, end = _operands_and_end(rest)
            self.opcode[name], self.operands[name], self.attrs[name] = opcode, operands, rest[end:]
            for o in operands:
                self.users.setdefault(o, []).append(name)

    def first_use(self, name: str) -> tuple[str, int] | None:
        """(operator, operand position) of the first instruction computing with ``name``'s
        value: ``cmp:LT`` etc. or an arithmetic opcode. Moves of the value (broadcast, reshape,
        convert, ...) and a multiply by another literal (torch's ``alpha``) are looked through."""
        seen: set[str] = set()
        frontier = [name]
        while frontier:
            x = frontier.pop(0)
            for u in self.users.get(x, []):
                if u in seen:
                    continue
                seen.add(u)
                op, operands = self.opcode[u], self.operands[u]
                position = operands.index(x)
                others = [o for i, o in enumerate(operands) if i != position]
                if op in _THROUGH or (op == "multiply" and all(self._literal(o) for o in others)):
                    frontier.append(u)
                elif op == "compare":
                    m = _DIRECTION.search(self.attrs[u])
                    if m and m.group(1) in _COMPARE:
                        return f"cmp:{m.group(1)}", position
                elif op in _ARITH and len(operands) == 2:
                    return op, position
        return None

    def _literal(self, name: str) -> bool:
        while self.opcode.get(name) in _THROUGH:
            name = self.operands[name][0]
        return self.opcode.get(name) == "constant"


class _Namer:
    def __init__(self, graph: _Graph, read_source: Callable[[str], str | None]) -> None:
        self.graph = graph
        self.read_source = read_source

    def expression(self, name: str, where: str) -> str | None:
        """The Python expression on line ``where`` that literal ``name`` was traced from."""
        use = self.graph.first_use(name)
        path, _, line = where.rpartition(":")
        if use is None or not line.isdigit():
            return None
        tree = _parse(self.read_source, path)
        return None if tree is None else operand_expression(tree, int(line), *use)


def _parse(read_source: Callable[[str], str | None], path: str) -> ast.AST | None:
    text = read_source(path)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def operand_expression(tree: ast.AST, line: int, op: str, position: int) -> str | None:
    """The one expression that is operand ``position`` (0 left, 1 right) of operator ``op``
    (``cmp:LT``, ..., or an arithmetic opcode) on source line ``line``; None when there is no
    such expression, or more than one, or it is a literal."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (getattr(node, "lineno", 0) <= line <= (getattr(node, "end_lineno", None) or 0)):
            continue
        sides: list[ast.expr] = []
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and op.startswith("cmp:"):
            direction = op[4:]
            pair = [node.left, node.comparators[0]]
            if isinstance(node.ops[0], _COMPARE[direction]):
                sides.append(pair[position])
            if isinstance(node.ops[0], _COMPARE[_MIRROR[direction]]):  # `n > x` traces as x < n
                sides.append(pair[1 - position])
        elif isinstance(node, ast.BinOp) and op in _ARITH and isinstance(node.op, _ARITH[op]):
            sides.append([node.left, node.right][position])
        found.update(ast.unparse(e) for e in sides if not isinstance(e, ast.Constant))
    return found.pop() if len(found) == 1 else None


def source_reader(root: Path) -> Callable[[str], str | None]:
    """Reads a file by the portable path a source map names it by (capture.portable_path):
    root-relative, ``<site-packages>/...`` (looked up on ``sys.path``) or ``<stdlib>/...``."""

    @functools.cache
    def read(path: str) -> str | None:
        head, _, rest = path.partition("/")
        if head == "<site-packages>":
            candidates = [Path(p) / rest for p in sys.path if p]
        elif head == "<stdlib>":
            candidates = [Path(sysconfig.get_paths()["stdlib"]) / rest]
        elif path.startswith("<") or Path(path).is_absolute():
            return None
        else:
            candidates = [root / path]
        for c in candidates:
            if c.is_file():
                try:
                    return c.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    return None
        return None

    return read
