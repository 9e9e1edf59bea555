"""Fold repeated layers in the HLO text, before it is parsed.

A 126-layer model is one layer written 126 times under other names. Parsing, normalizing and
building every copy costs time linear in the layers even when the memo proves each distinct
layer once. This pass reads both texts line by line (regular expressions, no parser), cuts the
entry computation into layer blocks the way ``analysis.partition`` does, and gives each block a
canonical text: metadata and channel ids dropped (value-neutral), instruction names replaced by
their order of definition, names read from outside the block by their order of first use, called
computations by the canonical text of their bodies. A layer whose baseline *and* distributed
canonical texts (and the shapes of what they read from outside) equal those of an earlier layer
is folded: its lines are blanked, and each instruction that is read from outside the block is
replaced, on its own line, by a placeholder ``custom-call`` naming the outside values its
cone reads. Line numbers never move, so every location in an error stays right.

The verifier relates a folded layer's outputs by proving the block itself (its own lines cut
out of the original text, outside values as parameters) under the facts its inputs carry — or
by reusing that proof for an earlier block with the same canonical text and the same input
facts. Equal canonical texts mean the same computation up to names, so a reused proof is a
proof of this block. Whenever the text is not in the printer's regular form (a line this pass
does not read, a use before its definition, a name defined twice), nothing is folded and the
full parser sees everything, with its located errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .parser import _ScanError, _strip_comments

FOLD_TARGET = "shardproof.folded-layer"

_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_ARRAY_SHAPE = r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^{}\n]*\})?"
_TUPLE_SHAPE = r"\((?:[^()\n]|\((?:[^()\n]|\([^()\n]*\))*\))*\)"
_SHAPE = f"(?:{_TUPLE_SHAPE}|{_ARRAY_SHAPE})"
_NAME = r"%[\w.\-]+"
_META = rf",[ \t]*metadata=\{{(?:[^{{}}\"\n]++|{_STR}|\{{[^{{}}\n]*\}})*+\}}"
_OPERANDS = rf"(?:(?:{_SHAPE} )?{_NAME}(?:, (?:{_SHAPE} )?{_NAME})*)?"
# One entry instruction as XLA's printer writes it: name, shape, then either a constant's
# literal / a parameter's number, or an opcode whose operands are all %names (with or without
# their shapes), then the attributes. Anything else is not folded.
_LINE = re.compile(
    rf"(\s*)(ROOT\s+)?%([\w.\-]+) = ({_SHAPE}) "
    rf"(?:(constant|parameter)\(((?:[^()\n]|\([^()\n]*\))*)\)|([a-z][a-z0-9\-]*)\(({_OPERANDS})\))"
    r"((?:,.*)?)\Z"
)
_COMP_HEAD = re.compile(r"(ENTRY\s+)?%?([\w.\-]+)\s*(.*?)\s*\{\s*\Z")
_DEFINED = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=")
_ARG_NAME = re.compile(r"%([\w.\-]+)")
_REF = re.compile(rf"{_STR}|%([\w.\-]+)")
# Canonical text in one left-to-right pass: a string is kept whole (so nothing inside it is
# read as metadata or a name); metadata and channel ids (value-neutral) are dropped; names
# are renamed.
# Metadata is dropped only where it ends the line (the printer's place for it); anywhere else
# it may sit inside another attribute's value and stays.
_TOKEN = re.compile(rf"({_STR})|({_META})(?=\n|\Z)|%([\w.\-]+)")
_META_RE = re.compile(_META)
_SPLIT = re.compile(r"%([\w.\-]+)")
# A channel id's number is value-neutral; whether there is one is kept (it changes what the
# replica groups of a collective mean).
_CHANNEL = re.compile(r"(,[ \t]*channel_id=)\d+")
_STR_AT = re.compile(_STR)
_PARAM_NAME = re.compile(r"([\w.\-]+):\s")

LEAF_OPS = frozenset({"parameter", "constant", "iota", "replica-id", "partition-id"})
COPIED_LEAVES = frozenset({"constant", "iota", "replica-id", "partition-id"})


@dataclass(slots=True)
class _Ins:
    line: int  # 0-based line number
    core: str  # the line without its metadata (when that is certain to be metadata)
    name: str
    shape: str
    opcode: str
    operands: list[str]
    refs: list[str]  # every %name of the line outside strings (operands, called computations, ...)
    op_name: str
    root: bool


@dataclass
class _Side:
    lines: list[str]
    entry_head: int
    entry_close: int
    instructions: dict[str, _Ins]
    comps: dict[str, tuple[int, int]]  # computation name -> (header line, closing line)
    copied: set[str]  # leaves and literal cones: copied into every block that reads them
    label: dict[str, int]


@dataclass
class FoldedSide:
    ext: list[str]  # values read from outside the block, in canonical order
    outputs: list[str]  # block instructions read outside it (or the ROOT), in canonical order
    closure: list[str]  # the block's instructions and the copied leaves it reads, in text order
    shapes: dict[str, str]  # ext and output name -> shape text


@dataclass
class FoldedLayer:
    label: int
    cls: int  # layers of one class are one problem up to names
    first: int  # the layer of this class kept whole in the text
    baseline: FoldedSide
    distributed: FoldedSide

    def side(self, side: str) -> FoldedSide:
        return self.baseline if side == "baseline" else self.distributed


@dataclass
class Fold:
    baseline_text: str  # the texts with folded layers replaced (same line numbers)
    distributed_text: str
    layers: dict[int, FoldedLayer] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)  # side -> the file, for locations
    _sides: dict[str, _Side] = field(default_factory=dict, repr=False)

    def placeholders(self, side: str) -> dict[str, int]:
        """Placeholder instruction name -> its layer."""
        return {o: k for k, fl in self.layers.items() for o in fl.side(side).outputs}

    def block_text(self, side: str, layer: FoldedLayer) -> str:
        """The original text with only this block left in the entry: what it reads from outside
        becomes parameters (numbered from 1,000,000 unless they are parameters), and the ROOT a
        tuple of the block's outputs. Every kept line stays on its own line number."""
        s = self._sides[side]
        fs = layer.side(side)
        lines = list(s.lines)
        keep = set(fs.closure) | set(fs.ext)
        for ins in s.instructions.values():
            if ins.name not in keep:
                lines[ins.line] = ""
        for i, name in enumerate(fs.ext):
            ins = s.instructions[name]
            if ins.opcode != "parameter":
                lines[ins.line] = f"  %{name} = {ins.shape} parameter({1_000_000 + i})"
        for name in fs.closure:
            ins = s.instructions[name]
            if ins.root:
                lines[ins.line] = re.sub(r"^(\s*)ROOT\s+", r"\1", lines[ins.line])
        shapes = ", ".join(fs.shapes[o] for o in fs.outputs)
        operands = ", ".join(f"%{o}" for o in fs.outputs)
        lines[s.entry_close] = f"  ROOT %shardproof.fold.root = ({shapes}) tuple({operands})\n}}"
        _blank_unused_computations(s, lines, [n for n in keep])
        return "\n".join(lines)


def _without_comments(text: str) -> str | None:
    """The text as the parser reads it, comments blanked (line breaks kept); None when a comment
    is unterminated (the parser says where). Comments closed on the HloModule or ENTRY header
    line (``/*index=5*/`` in torch-xla's layouts) are left: the fold copies those lines."""
    if "/*" not in text and "//" not in text:
        return text
    confined = True
    for m in re.finditer(r"/\*|//", text):
        start = text.rfind("\n", 0, m.start()) + 1
        end_of_line = text.find("\n", m.start())
        end_of_line = len(text) if end_of_line < 0 else end_of_line
        close = text.find("*/", m.end())
        if m.group(0) == "//" or not text.startswith(("HloModule", "ENTRY"), start) or '"' in text[start:m.start()] or close < 0 or close > end_of_line or '"' in text[m.start() : close]:
            confined = False
            break
    if confined:
        return text
    try:
        return _strip_comments(text)[0]
    except _ScanError:
        return None


def _unquote(s: str) -> str:
    return s[1:-1].replace('\\"', '"').replace("\\\\", "\\")


def _scan(text: str, op_name: Callable[[str, str], str]) -> _Side | None:
    """The entry's instructions, or None when the text is not in the printer's regular form."""
    plain = _without_comments(text)
    if plain is None:
        return None
    lines = plain.split("\n")
    comps: dict[str, tuple[int, int]] = {}
    entry: tuple[int, int] | None = None
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip() or line.startswith("HloModule") or line.lstrip().startswith("//"):
            i += 1
            continue
        if line[0].isspace():
            return None
        m = _COMP_HEAD.match(line)
        if m is None:
            return None
        j = i + 1
        while j < n and lines[j] != "}":
            j += 1
        if j == n or m.group(2) in comps:
            return None
        comps[m.group(2)] = (i, j)
        if m.group(1):
            if entry is not None:
                return None
            entry = (i, j)
        i = j + 1
    if entry is None:
        return None
    head, close = entry
    del comps[next(k for k, v in comps.items() if v == entry)]
    for first, last in comps.values():
        for ln in range(first + 1, last):
            d = _DEFINED.match(lines[ln])
            if d is not None and d.group(1) in comps:
                return None  # an instruction named like a computation: names would be ambiguous
    instructions: dict[str, _Ins] = {}
    for ln in range(head + 1, close):
        line = lines[ln]
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            return None
        _, root, name, shape, literal_op, _literal, opcode, args, rest = m.groups()
        if name in instructions or name in comps:
            return None
        core, meta = line, ""
        # The printer puts metadata last: cut it off when it runs to the end of the line and
        # nothing before it opens a string (so the cut is not inside one).
        at = rest.rfind(", metadata={")
        if at >= 0 and '"' not in rest[:at]:
            mm = _META_RE.match(rest, at)
            if mm is not None and mm.end() == len(rest):
                meta = rest[at:]
                rest = rest[:at]
                core = line[: len(line) - len(meta)]
        operands = _ARG_NAME.findall(args) if args else []
        refs = operands + ([r for r in _REF.findall(rest) if r] if "%" in rest else [])
        for r in refs:
            if r not in instructions and r not in comps:
                return None  # used before its definition (or never defined): the parser says where
        raw = ""
        if not meta:
            mm = _META_RE.search(rest)
            meta = mm.group(0) if mm else ""
        if meta:
            at = meta.find('op_name="')
            if at >= 0:
                end = meta.find('"', at + 9)
                raw = meta[at + 9 : end]
                if "\\" in raw and (ms := _STR_AT.match(meta, at + 8)) is not None:
                    raw = _unquote(ms.group(0))
        instructions[name] = _Ins(ln, core, name, shape, literal_op or opcode, operands, refs, op_name(name, raw), bool(root))
    if not instructions:
        return None
    return _Side(lines, head, close, instructions, comps, set(), {})


def _label(side: _Side, pattern: re.Pattern[str]) -> None:
    """Layer numbers as partition._layers gives them: explicit from op_name, never earlier than
    an operand; leaves and literal cones have none (they are copied into each block)."""
    cone: set[str] = set()
    for ins in side.instructions.values():
        if ins.opcode in ("constant", "iota") or (ins.operands and ins.opcode != "parameter" and all(o in cone for o in ins.operands)):
            cone.add(ins.name)
    side.copied = cone | {n for n, ins in side.instructions.items() if ins.opcode in COPIED_LEAVES}
    explicit: dict[str, int] = {}
    for ins in side.instructions.values():
        if ins.opcode in LEAF_OPS or ins.name in cone:
            continue
        inherited = max((side.label[o] for o in ins.operands if o in side.label), default=-1)
        if ins.op_name not in explicit:
            m = pattern.search(ins.op_name)
            explicit[ins.op_name] = int(m.group(1)) if m else -1
        side.label[ins.name] = max(explicit[ins.op_name], inherited)


class _Canon:
    """Canonical texts: names by order, computations by the canonical text of their bodies."""

    def __init__(self, side: _Side) -> None:
        self.side = side
        self.comp_ids: dict[str, int] = {}
        self.comp_of: dict[str, str] = {}

    def computation(self, name: str) -> str:
        if name in self.comp_of:
            return self.comp_of[name]
        head, close = self.side.comps[name]
        header = _COMP_HEAD.match(self.side.lines[head])
        assert header is not None
        sig = _PARAM_NAME.sub("", header.group(3))
        local: dict[str, str] = {}
        text = sig + "\n" + self._rename("\n".join(self.side.lines[ln].strip() for ln in range(head + 1, close)), local, "v")
        cid = self.comp_ids.setdefault(text, len(self.comp_ids))
        self.comp_of[name] = f"@C{cid}"
        return self.comp_of[name]

    def _rename(self, text: str, local: dict[str, str], prefix: str, ext: dict[str, str] | None = None) -> str:
        """Rename along the tokens; metadata goes, strings stay whole (nothing inside them is
        a name or a channel id)."""

        def sub_name(name: str) -> str:
            if name in self.side.comps:
                return self.computation(name)
            if name in local:
                return local[name]
            if ext is not None and name in self.side.instructions:
                return ext.setdefault(name, f"%E{len(ext)}")
            return local.setdefault(name, f"%{prefix}{len(local)}")

        pieces = _TOKEN.split(text)
        # split() interleaves text between tokens with the token's groups: (str, meta, name).
        out = []
        for i in range(0, len(pieces), 4):
            out.append(_CHANNEL.sub(r"\1N", pieces[i]))
            if i + 3 < len(pieces):
                string, _meta, name = pieces[i + 1 : i + 4]
                if name is not None:
                    out.append(sub_name(name))
                elif string is not None:
                    out.append(string)
        return "".join(out)

    def block(self, closure: list[str]) -> tuple[str, list[str]]:
        """Canonical text of the closure's lines, and the outside names in order of first use."""
        local = {name: f"%L{i}" for i, name in enumerate(closure)}
        ext: dict[str, str] = {}
        ins = self.side.instructions
        comps = self.side.comps
        out = []
        for name in closure:
            core = ins[name].core.strip()
            if '"' in core:
                out.append(self._rename(core, local, "L", ext))
                continue
            # No string on the line: every %name is a name; split on them (no callback each).
            parts = _SPLIT.split(_CHANNEL.sub(r"\1N", core) if "channel_id" in core else core)
            for i in range(1, len(parts), 2):
                ref = parts[i]
                new = local.get(ref)
                if new is None:
                    if ref in comps:
                        new = self.computation(ref)
                    elif ref in ins:
                        new = ext.get(ref)
                        if new is None:
                            new = ext[ref] = f"%E{len(ext)}"
                    else:
                        new = local[ref] = f"%L{len(local)}"
                parts[i] = new
            out.append("".join(parts))
        return "\n".join(out), list(ext)


def _blocks(side: _Side) -> dict[int, list[str]]:
    blocks: dict[int, list[str]] = {}
    for name, k in side.label.items():
        if k >= 0:
            blocks.setdefault(k, []).append(name)
    return blocks


def _closure(side: _Side, block: list[str]) -> list[str]:
    own = set(block)
    stack = [o for n in block for o in side.instructions[n].operands if o in side.copied and o not in own]
    while stack:
        o = stack.pop()
        if o in own:
            continue
        own.add(o)
        stack.extend(x for x in side.instructions[o].operands if x not in own)
    return sorted(own, key=lambda x: side.instructions[x].line)


def _outputs(side: _Side, blocks: dict[int, list[str]]) -> dict[int, list[str]]:
    """Block instructions read by an instruction of another layer (or the ROOT itself)."""
    used: set[str] = set()
    for ins in side.instructions.values():
        k = side.label.get(ins.name)
        for o in ins.operands:
            if o in side.label and side.label[o] != k:
                used.add(o)
        if ins.root:
            used.add(ins.name)
    return {k: [n for n in names if n in used] for k, names in blocks.items()}


def _cone_ext(side: _Side, out: str, closure: set[str], ext: list[str]) -> list[str]:
    """The outside values an output's cone (within the closure) reads, in canonical order."""
    seen: set[str] = set()
    reads: set[str] = set()
    stack = [out]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for o in side.instructions[n].operands:
            if o in closure:
                stack.append(o)
            else:
                reads.add(o)
    return [e for e in ext if e in reads]


def _blank_unused_computations(side: _Side, lines: list[str], kept: list[str]) -> None:
    """Blank the computations no kept instruction calls by %name (they would only cost parsing).
    A call by a bare name to a blanked computation fails the parse, and check_files then reads
    the whole pair: never a wrong answer."""
    needed: set[str] = set()
    stack = [r for n in kept for r in side.instructions[n].refs if r in side.comps]
    while stack:
        c = stack.pop()
        if c in needed:
            continue
        needed.add(c)
        head, close = side.comps[c]
        for ln in range(head + 1, close):
            stack.extend(r for r in _REF.findall(side.lines[ln]) if r and r in side.comps and r not in needed)
    for c, (head, close) in side.comps.items():
        if c not in needed:
            for ln in range(head, close + 1):
                lines[ln] = ""


def fold(baseline: str, distributed: str, op_names: dict[str, Callable[[str, str], str]], pattern: str, paths: dict[str, str] | None = None, min_layers: int = 2) -> Fold | None:
    """Fold the layers of the pair that repeat an earlier layer; None when nothing folds (or
    the texts are not in the regular form this pass reads)."""
    rx = re.compile(pattern)
    sides: dict[str, _Side] = {}
    for side, text in (("baseline", baseline), ("distributed", distributed)):
        s = _scan(text, op_names[side])
        if s is None:
            return None
        _label(s, rx)
        sides[side] = s
    blocks = {side: _blocks(s) for side, s in sides.items()}
    if sorted(blocks["baseline"]) != sorted(blocks["distributed"]) or len(blocks["baseline"]) < min_layers:
        return None
    outputs = {side: _outputs(s, blocks[side]) for side, s in sides.items()}
    canon = {side: _Canon(s) for side, s in sides.items()}
    classes: dict[str, tuple[int, int]] = {}  # class key -> (class id, first layer)
    result = Fold(baseline, distributed, paths=paths or {"baseline": "baseline.hlo", "distributed": "distributed.hlo"}, _sides=sides)
    for k in sorted(blocks["baseline"]):
        parts: dict[str, FoldedSide] = {}
        key_parts = []
        for side, s in sides.items():
            closure = _closure(s, blocks[side][k])
            text, ext = canon[side].block(closure)
            outs = outputs[side][k]
            local = {n: i for i, n in enumerate(closure)}
            shapes = {e: s.instructions[e].shape for e in ext} | {o: s.instructions[o].shape for o in outs}
            key_parts += [text, "|".join(shapes[e] for e in ext), ",".join(str(local[o]) for o in outs)]
            parts[side] = FoldedSide(ext, outs, closure, shapes)
        key = "\n\x00".join(key_parts)
        if key not in classes:
            classes[key] = (len(classes), k)
            continue
        if not parts["baseline"].outputs or not parts["distributed"].outputs:
            continue
        cls, first = classes[key]
        result.layers[k] = FoldedLayer(k, cls, first, parts["baseline"], parts["distributed"])
    if not result.layers:
        return None
    for side, s in sides.items():
        lines = list(s.lines)
        kept_names = set(s.instructions)
        for fl in result.layers.values():
            fs = fl.side(side)
            closure = set(fs.closure)
            for name in fs.closure:
                if name not in s.copied:
                    lines[s.instructions[name].line] = ""
                    kept_names.discard(name)
            for o in fs.outputs:
                ins = s.instructions[o]
                reads = ", ".join(f"%{e}" for e in _cone_ext(s, o, closure, fs.ext))
                original = s.lines[ins.line]
                meta = _META_RE.search(original)
                m = _LINE.match(original)
                assert m is not None
                lines[ins.line] = f"{m.group(1)}{'ROOT ' if ins.root else ''}%{o} = {ins.shape} custom-call({reads}), custom_call_target=\"{FOLD_TARGET}\"{meta.group(0) if meta else ''}"
        # Copied leaves only folded layers read: blank them too (the parser would only pay).
        needed: set[str] = set()
        for name in sorted(kept_names, key=lambda x: -s.instructions[x].line):
            ins = s.instructions[name]
            if name in s.copied and ins.opcode != "parameter" and name not in needed:
                lines[ins.line] = ""
                kept_names.discard(name)
                continue
            needed.update(ins.operands)
        for fl in result.layers.values():
            needed.update(fl.side(side).ext)
        # A copied leaf blanked above but read by a kept line comes back.
        for name in s.copied:
            if name in needed and not lines[s.instructions[name].line]:
                lines[s.instructions[name].line] = s.lines[s.instructions[name].line]
                kept_names.add(name)
        _blank_unused_computations(s, lines, [n for n in kept_names] + [e for fl in result.layers.values() for e in fl.side(side).ext])
        text = "\n".join(lines)
        if side == "baseline":
            result.baseline_text = text
        else:
            result.distributed_text = text
    return result
