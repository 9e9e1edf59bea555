"""Fold repeated layers in the HLO text, before it is parsed.

A 126-layer model is one layer written 126 times under other names. Parsing, normalizing and
building every copy costs time linear in the layers even when the memo proves each distinct
layer once. This pass reads both texts line by line (regular expressions, no parser), cuts the
entry computation into layer blocks the way ``analysis.partition`` does, and gives each block a
canonical text: instruction names replaced by their order of definition, operands read from
outside the block by their order of first use, metadata and channel id numbers dropped
(value-neutral), callees by the canonical text of their bodies; every other attribute value
as written, names inside it included, as the verifier's signatures keep it. Layers whose
baseline *and* distributed canonical texts (and the shapes of what they read from outside)
are equal form a class; every layer of a class of two or more is folded (the first too):
its lines are blanked, and each instruction that is
read from outside the block is replaced, on its own line, by a placeholder ``custom-call``
naming the outside values its cone reads. Line numbers never move, so every location in an
error stays right.

The verifier relates a folded layer's outputs by proving the block itself (its own lines cut
out of the original text, outside values as parameters) under the facts its inputs carry — or
by reusing that proof for an earlier block with the same canonical text and the same input
facts. Equal canonical texts mean the same computation up to names, so a reused proof is a
proof of this block. Whenever the text is not in the printer's regular form (a line this pass
does not read, a use before its definition, a name defined twice), nothing is folded and the
full parser sees everything, with its located errors.

Soundness rests on three rules (issue 19): the fold reads text exactly as the parser does where
it drops or renames anything (names by the parser's name pattern, attributes by its attribute
scanner, metadata, channel ids and callees by its readers; text they refuse is never folded, so
the parser still refuses it); its notion of the result is the parser's (the ROOT, else the last
instruction), which is never blanked; and what it blanks is only what a folded layer stands for
(dead lines and computations no line calls stay for the parser to read).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..analysis.partition import layer_label
from ..gcpause import gc_paused
from .parser import (
    _CALL_KEYS,
    _FAST_ATTR,
    _LINE_END,
    _METADATA_FULL,
    _READERS,
    _STRING_1L,
    _read_int,
    _read_metadata,
    _ScanError,
    _strip_comments,
    _unquote,
    _value_end,
)
from .parser import _NAME as _PARSER_NAME

FOLD_TARGET = "shardproof.folded-layer"

# A name as the parser reads it (its own pattern, without the optional '%'): ASCII letters,
# digits, '_', '.', '-', not starting with '.' or '-'. Anything else is not a name here either,
# so a line the parser would refuse never matches and nothing is folded.
_N = _PARSER_NAME.pattern.removeprefix("%?(").removesuffix(")")
assert _N == r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", _N
_STR = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_ARRAY_SHAPE = r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^{}\n]*\})?"
_TUPLE_SHAPE = r"\((?:[^()\n]|\((?:[^()\n]|\([^()\n]*\))*\))*\)"
_SHAPE = f"(?:{_TUPLE_SHAPE}|{_ARRAY_SHAPE})"
_NAME = rf"%{_N}"
# ", " may be followed by the blanks of a comment (XLA writes ``/*index=5*/`` in long operand
# lists; _without_comments blanks it as the parser skips it).
_OPERANDS = rf"(?:(?:{_SHAPE} )?{_NAME}(?:, *(?:{_SHAPE} )?{_NAME})*)?"
# One instruction as XLA's printer writes it: name, shape, then either a constant's literal /
# a parameter's number, or an opcode whose operands are all %names (with or without their
# shapes), then the attributes (read by the parser's own attribute scanner). Anything else is
# not folded.
_LINE = re.compile(
    rf"(\s*)(ROOT\s+)?%({_N}) = ({_SHAPE}) "
    rf"(?:(constant|parameter)\(((?:[^()\n]|\([^()\n]*\))*)\)|([a-z][a-z0-9\-]*)\(({_OPERANDS})\))"
    r"((?:,.*)?)\Z"
)
_COMP_HEAD = re.compile(rf"(ENTRY\s+)?%?({_N})\s*(.*?)\s*\{{\s*\Z")
_DEFINED = re.compile(rf"\s*(?:ROOT\s+)?%?({_N})\s*=")
_ARG_NAME = re.compile(rf"%({_N})")
_REF = re.compile(rf"{_STR}|%({_N})")
_PARAM_NAME = re.compile(rf"({_N}):\s")


class _Refuse(Exception):
    """Text the fold cannot vouch for (the parser might refuse it): fold nothing."""


# Metadata is value-neutral, so it is dropped from the canonical text; but only after the
# parser's own reader accepted it (else the parser would refuse the line, and a folded copy of
# it would hide that). Shared by both sides; metadata repeats a lot.
_METADATA_OK: dict[str, str | None] = {}


def _metadata_op_name(raw: str) -> str | None:
    """op_name of metadata ``raw`` as the parser reads it; None when the parser refuses it."""
    got = _METADATA_OK.get(raw, False)
    if got is not False:
        return got
    op_name: str | None = None
    # The common form, checked for less than the reader costs: the parser's whole-metadata
    # pattern, and every integer field an integer (stricter than the parser: it also looks
    # inside strings). The op_name found by text only names the layer (a cut, never a proof).
    if _METADATA_FULL.match(raw) and _BAD_INT.search(raw) is None and raw.count("op_name=") <= 1:
        at = raw.find('op_name="')
        if at < 0 and "op_name=" not in raw:
            op_name = ""
        elif at > 0 and raw[at - 1] in "{ \t" and (m := _STRING_1L.match(raw, at + 8)) is not None:
            op_name = _unquote(m.group(0))
    if op_name is None:
        try:
            op_name = _read_metadata(raw).op_name
        except (_ScanError, ValueError, TypeError):
            op_name = None
    if len(_METADATA_OK) > 200_000:
        _METADATA_OK.clear()
    _METADATA_OK[raw] = op_name
    return op_name


_BAD_INT = re.compile(r"(?:source_line|stack_frame_id)=(?!-?\d+[\s}])")


def _attributes(rest: str) -> list[tuple[str, str]] | None:
    """``, key=value`` pairs of one line, scanned as the parser scans them (its fast pattern,
    its value scanner for deeper nesting); None when the parser would not read them so."""
    out: list[tuple[str, str]] = []
    pos, n = 0, len(rest)
    while True:
        m = _FAST_ATTR.match(rest, pos)
        if m is None:
            break
        vstart, vend = m.span(2)
        if vend < n and rest[vend] in '{[("':
            try:
                vend = _value_end(rest, vstart)
            except _ScanError:
                return None
        out.append((m.group(1), rest[vstart:vend]))
        pos = vend
    end = _LINE_END.match(rest, pos)
    if end is None or end.end() != n:
        return None
    return out


# Attributes the canonical text reads through a reader of its own (every other attribute is
# kept verbatim, %names and all, as the verifier's signature keeps it):
#   metadata: dropped, once the parser's reader accepts it (value-neutral);
#   channel_id: its number dropped once it reads as the parser's integer (whether there is one
#     is kept: it changes what the replica groups of a collective mean);
#   to_apply, calls, ... (the parser's call keys): callees by the canonical text of their
#     bodies (the verifier reads reducers and comparators by their bodies too).
_Attr = str | tuple[str, list[str], bool]  # verbatim text, or (key, callees, written as a list)


def _read_attrs(rest: str) -> tuple[list[_Attr], str, str, list[str]] | None:
    """(canonical attribute pieces, metadata op_name, metadata raw, callees); None when the
    parser would refuse the attributes. Scanning is left to right and a value never runs past
    a top-level ',', so the attributes before a trailing metadata (the printer's place for it)
    are scanned on their own and their reading is shared by every line that repeats them."""
    at = rest.rfind(", metadata={")
    head, tail = (rest[:at], rest[at:]) if at >= 0 else (rest, "")
    if head in _HEADS:
        got = _HEADS[head]
    else:
        got = _read_head(head)
        if len(_HEADS) > 100_000:
            _HEADS.clear()
        _HEADS[head] = got
    m = _FAST_ATTR.match(tail) if tail and got is not None else None
    if got is not None and m is not None and m.end() == len(tail) and m.group(1) == "metadata" and "metadata" not in got[1]:
        pieces, keys, callees = got
        meta = m.group(2)
    elif got is not None and not tail:
        pieces, keys, callees = got
        meta = keys.get("metadata", "")
    else:
        # Not the common form (or the cut fell inside a value): scan the whole line.
        full = _read_head(rest)
        if full is None:
            return None
        pieces, keys, callees = full
        meta = keys.get("metadata", "")
    op_name = ""
    if meta:
        got_name = _metadata_op_name(meta)
        if got_name is None:
            return None
        op_name = got_name
    return pieces, op_name, meta, callees


_Head = tuple[list[_Attr], dict[str, str], list[str]]
_HEADS: dict[str, _Head | None] = {}

LEAF_OPS = frozenset({"parameter", "constant", "iota", "replica-id", "partition-id"})
COPIED_LEAVES = frozenset({"constant", "iota", "replica-id", "partition-id"})


def _read_head(rest: str) -> _Head | None:
    """Canonical pieces, raw value by key, and callees of attributes ``rest``; None when the
    parser would refuse them."""
    attrs = _attributes(rest) if rest else []
    if attrs is None:
        return None
    pieces: list[_Attr] = []
    keys: dict[str, str] = {}
    callees: list[str] = []
    for key, raw in attrs:
        if key in keys:
            return None  # the parser refuses a duplicate attribute
        keys[key] = raw
        if key == "metadata":
            if _metadata_op_name(raw) is None:
                return None
        elif key == "channel_id":
            try:
                _read_int(raw)
            except (_ScanError, ValueError):
                return None
            pieces.append(",channel_id=N")
        elif key in _CALL_KEYS:
            try:
                value = _READERS[key](raw)
            except (_ScanError, ValueError):
                return None
            names = [value] if isinstance(value, str) else list(value)
            callees += names
            pieces.append((key, names, not isinstance(value, str)))
        else:
            pieces.append(f",{key}={raw}")
    if not callees and len(pieces) > 1:
        pieces = ["".join(pieces)]  # type: ignore[list-item]
    return pieces, keys, callees


@dataclass(slots=True)
class _Ins:
    line: int  # 0-based line number
    name: str
    shape: str
    opcode: str
    operands: list[str]
    refs: list[str]  # operands, then the computations the line calls
    op_name: str
    root: bool
    body: list[str]  # the text after the name and shape (opcode and operands, or the literal),
    # split at operand names: text, name, text, ..., text (names without their '%')
    attrs: list[_Attr]  # canonical attribute pieces (_read_attrs)
    meta: str  # the metadata value as written ("" when none)
    commented: bool  # a comment sat on the line: never folded (the parser reads it otherwise)


@dataclass
class _Side:
    lines: list[str]
    entry_head: int
    entry_close: int
    instructions: dict[str, _Ins]
    comps: dict[str, tuple[int, int]]  # computation name -> (header line, closing line)
    copied: set[str]  # leaves and literal cones: copied into every block that reads them
    label: dict[str, int]
    original: list[str]  # the lines as written (comments kept)
    calls: dict[str, list[str]]  # instruction -> the computations it calls (when any)


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
    first: int  # the first layer of this class (folded too once the class repeats)
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


# _read_attrs by the attribute text it read: a reading is a function of that text alone, and
# half the lines of a deep model repeat another line's attributes, metadata included.
_RESTS: dict[str, tuple[list[_Attr], str, str, list[str]] | None] = {}


def _read_line(line: str) -> tuple[re.Match[str], tuple[list[_Attr], str, str, list[str]]] | None:
    m = _LINE.match(line)
    if m is None:
        return None
    rest = m.group(9)
    got = _RESTS.get(rest, False)
    if got is False:
        got = _read_attrs(rest)
        if len(_RESTS) > 200_000:
            _RESTS.clear()
        _RESTS[rest] = got
    return None if got is None else (m, got)


def _scan(text: str, op_name: Callable[[str, str], str]) -> _Side | None:
    """The entry's instructions, or None when the text is not in the printer's regular form."""
    plain = _without_comments(text)
    if plain is None:
        return None
    lines = plain.split("\n")
    original = text.split("\n") if plain is not text else lines
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
    calls: dict[str, list[str]] = {}
    roots = 0
    for ln in range(head + 1, close):
        line = lines[ln]
        if not line.strip():
            continue
        got = _read_line(line)
        if got is None:
            return None
        m, (attrs, raw_op_name, meta, callees) = got
        _, root, name, shape, literal_op, literal, opcode, args, _rest = m.groups()
        if name in instructions or name in comps:
            return None
        body = _ARG_NAME.split(f"{opcode}({args})") if args else [f"{literal_op}({literal})" if literal_op else f"{opcode}()"]
        operands = body[1::2]
        for r in operands:
            if r not in instructions:
                return None  # used before its definition (or never defined): the parser says where
        if callees:
            calls[name] = callees
        for c in callees:
            if c not in comps:
                return None  # the parser says which computation is missing
        roots += bool(root)
        commented = original is not lines and original[ln] != line
        instructions[name] = _Ins(ln, name, shape, literal_op or opcode, operands, operands + callees, op_name(name, raw_op_name), bool(root), body, attrs, meta, commented)
    if not instructions or roots > 1:
        return None  # no instruction, or a second ROOT: the parser says where
    if roots == 0:
        # The parser's (and XLA's) rule: without a ROOT keyword the last instruction is the
        # result. The fold's notion of outputs must be exactly that.
        instructions[next(reversed(instructions))].root = True
    return _Side(lines, head, close, instructions, comps, set(), {}, original, calls)


def _label(side: _Side, pattern: re.Pattern[str]) -> None:
    """Layer numbers as partition._layers gives them: explicit from op_name, never earlier than
    an operand; leaves and literal cones have none (they are copied into each block)."""
    cone: set[str] = set()
    for ins in side.instructions.values():
        if ins.opcode in ("constant", "iota") or (ins.operands and ins.opcode != "parameter" and cone.issuperset(ins.operands)):
            cone.add(ins.name)
    side.copied = cone | {n for n, ins in side.instructions.items() if ins.opcode in COPIED_LEAVES}
    explicit: dict[str, int] = {}
    label = side.label
    for ins in side.instructions.values():
        if ins.opcode in LEAF_OPS or ins.name in cone:
            continue
        k = explicit.get(ins.op_name)
        if k is None:
            k = explicit[ins.op_name] = layer_label(ins.op_name, pattern)  # backward layers: reversed
        for o in ins.operands:  # never earlier than an operand
            got = label.get(o)
            if got is not None and got > k:
                k = got
        label[ins.name] = k


class _Canon:
    """Canonical texts: names by order, computations by the canonical text of their bodies,
    attributes as _read_attrs reads them (the rest verbatim)."""

    def __init__(self, side: _Side) -> None:
        self.side = side
        self.comp_ids: dict[str, int] = {}
        self.comp_of: dict[str, str] = {}

    def computation(self, name: str) -> str:
        if name in self.comp_of:
            return self.comp_of[name]
        self.comp_of[name] = f"@R{name}"  # a recursive call: never shared
        head, close = self.side.comps[name]
        header = _COMP_HEAD.match(self.side.lines[head])
        assert header is not None
        sig = _PARAM_NAME.sub("", header.group(3))
        local: dict[str, str] = {}
        out = [sig]
        for ln in range(head, close + 1):
            if self.side.original[ln] != self.side.lines[ln]:
                return self.comp_of[name]  # a comment inside: the parser reads it otherwise
        for ln in range(head + 1, close):
            line = self.side.lines[ln]
            if not line.strip():
                continue
            got = _read_line(line)
            if got is None:
                return self.comp_of[name]  # not read here: a name of its own, never shared
            m = got[0]
            _, root, iname, shape, literal_op, literal, opcode, args, _rest = m.groups()
            if iname in local:
                return self.comp_of[name]
            local[iname] = f"%v{len(local)}"
            if literal_op:
                body = f"{literal_op}({literal})"
            else:
                def sub(a: re.Match[str]) -> str:
                    return local.get(a.group(1), f"%?{a.group(1)}")

                body = f"{opcode}({_ARG_NAME.sub(sub, args)})"
            # As the verifier reads a called body (normalize.body_text): every attribute but
            # metadata as written, channel ids and callees by name included.
            read = _read_head(m.group(9))
            assert read is not None  # _read_line read it
            written = "".join(f",{k}={v}" for k, v in read[1].items() if k != "metadata")
            out.append(f"{'ROOT ' if root else ''}{local[iname]} = {shape} {body}{written}")
        text = "\n".join(out)
        cid = self.comp_ids.setdefault(text, len(self.comp_ids))
        self.comp_of[name] = f"@C{cid}"
        return self.comp_of[name]

    def attrs(self, attrs: list[_Attr]) -> str:
        if not attrs:
            return ""
        if len(attrs) == 1 and isinstance(attrs[0], str):
            return attrs[0]
        out = []
        for a in attrs:
            if isinstance(a, str):
                out.append(a)
            else:
                key, names, listed = a
                ids = ",".join(self.computation(c) for c in names)
                out.append(f",{key}={{{ids}}}" if listed else f",{key}={ids}")
        return "".join(out)

    def block(self, closure: list[str]) -> tuple[str, list[str]]:
        """Canonical text of the closure's lines, and the outside names in order of first use."""
        local = {name: f"%L{i}" for i, name in enumerate(closure)}
        ext: dict[str, str] = {}
        ins = self.side.instructions

        out = []
        for name in closure:
            i = ins[name]
            if len(i.body) == 1:
                body = i.body[0]
            else:
                pieces = list(i.body)
                for j in range(1, len(pieces), 2):
                    ref = pieces[j]
                    new = local.get(ref)
                    if new is None:
                        new = ext.get(ref)
                        if new is None:
                            new = ext[ref] = f"%E{len(ext)}"
                    pieces[j] = new
                body = "".join(pieces)
            out.append(f"{'ROOT ' if i.root else ''}{local[name]} = {i.shape} {body}{self.attrs(i.attrs)}")
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
    ins = side.instructions
    return sorted(own, key=lambda x: ins[x].line)


def _outputs(side: _Side, blocks: dict[int, list[str]]) -> dict[int, list[str]]:
    """Block instructions read by an instruction of another layer (or the ROOT itself)."""
    used: set[str] = set()
    label = side.label
    for ins in side.instructions.values():
        k = label.get(ins.name)
        for o in ins.operands:
            got = label.get(o)
            if got is not None and got != k:
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


def _reachable(side: _Side, roots: set[str]) -> set[str]:
    """The computations ``roots`` are, or call (by %name), transitively."""
    needed: set[str] = set()
    stack = list(roots)
    while stack:
        c = stack.pop()
        if c in needed:
            continue
        needed.add(c)
        head, close = side.comps[c]
        for ln in range(head + 1, close):
            stack.extend(r for r in _REF.findall(side.lines[ln]) if r and r in side.comps and r not in needed)
    return needed


def _blank_unused_computations(side: _Side, lines: list[str], kept: list[str], only: set[str] | None = None) -> None:
    """Blank the computations no kept instruction calls by %name (they would only cost parsing),
    among ``only`` when given. A call by a bare name to a blanked computation fails the parse,
    and check_files then reads the whole pair: never a wrong answer."""
    needed = _reachable(side, {r for n in kept for r in side.instructions[n].refs if r in side.comps})
    for c, (head, close) in side.comps.items():
        if c not in needed and (only is None or c in only):
            for ln in range(head, close + 1):
                lines[ln] = ""


@gc_paused()
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
    firsts: dict[str, dict[str, FoldedSide]] = {}  # class key -> its first layer, until it repeats
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
            if any(s.instructions[x].commented for x in closure):
                key_parts.append(f"commented layer {k}")  # read by the parser alone: never shared
            parts[side] = FoldedSide(ext, outs, closure, shapes)
        key = "\n\x00".join(key_parts)
        if key not in classes:
            classes[key] = (len(classes), k)
            firsts[key] = parts
            continue
        if not parts["baseline"].outputs or not parts["distributed"].outputs:
            continue
        cls, first = classes[key]
        # The class repeats: its first layer is folded too. Kept whole, it would be proven as a
        # segment of the parsed pair and then once more as the block the next layer reuses;
        # folded, its block proof is the one the later layers reuse when their input facts
        # are its own (in a deep model they are: 4 proofs instead of 5 for 126 layers).
        fp = firsts.pop(key, None)
        if fp is not None and fp["baseline"].outputs and fp["distributed"].outputs:
            result.layers[first] = FoldedLayer(first, cls, first, fp["baseline"], fp["distributed"])
        result.layers[k] = FoldedLayer(k, cls, first, parts["baseline"], parts["distributed"])
    if not result.layers:
        return None
    for side, s in sides.items():
        lines = list(s.lines)
        kept_names = set(s.instructions)
        # What a folded layer's lines read (its copied leaves, the computations it calls) may be
        # blanked only when no kept line reads it; anything else stays, dead code included, so
        # the parser still reads (and refuses) all the text no folded layer stands for.
        covered: set[str] = set()
        for fl in result.layers.values():
            fs = fl.side(side)
            closure = set(fs.closure)
            covered.update(fs.closure)
            for name in fs.closure:
                if name not in s.copied:
                    lines[s.instructions[name].line] = ""
                    kept_names.discard(name)
            for o in fs.outputs:
                ins = s.instructions[o]
                reads = ", ".join(f"%{e}" for e in _cone_ext(s, o, closure, fs.ext))
                m = _LINE.match(s.lines[ins.line])
                assert m is not None
                meta = f", metadata={ins.meta}" if ins.meta else ""
                lines[ins.line] = f"{m.group(1)}{'ROOT ' if ins.root else ''}%{o} = {ins.shape} custom-call({reads}), custom_call_target=\"{FOLD_TARGET}\"{meta}"
        # Copied leaves only folded layers read: blank them too (the parser would only pay).
        # Never the result (the ROOT, or the last instruction when none is written).
        needed: set[str] = set()
        for name in reversed(s.instructions):  # text order, last line first
            if name not in kept_names:
                continue
            ins = s.instructions[name]
            if name in s.copied and name in covered and not ins.root and ins.opcode != "parameter" and name not in needed:
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
        callees = {c for n, cs in s.calls.items() if n in covered for c in cs}
        _blank_unused_computations(s, lines, [n for n in kept_names] + [e for fl in result.layers.values() for e in fl.side(side).ext], _reachable(s, callees))
        text = "\n".join(lines)
        if side == "baseline":
            result.baseline_text = text
        else:
            result.distributed_text = text
    return result
