"""Texts the witness executes besides the pair itself, all made from XLA's own printing of a
module (one instruction per line, names kept):

- ``with_outputs``: a copy of a program whose ROOT also returns some inner instructions
  (numeric localization: a frontier instruction and its baseline counterpart);
- ``cut_instruction``: a program computing one instruction only, its operands as parameters
  (a diverging instruction of a pair too big to execute, whose operands the caller seeds with
  their proven relations).

Only the witness's copies change; the verifier reads the texts as written.
"""

from __future__ import annotations

import functools
import re

from . import flat
from .runtime import canonical

_HEADER = re.compile(r"^HloModule\s+([^\s,]+)")
_DEF = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_SHAPE_HEAD = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^{}]*\})?")


def _shape_at(s: str, i: int) -> int:
    """End of the shape starting at s[i] (an array shape or a parenthesized tuple shape)."""
    if s[i] == "(":
        depth = 0
        for j in range(i, len(s)):
            depth += {"(": 1, ")": -1}.get(s[j], 0)
            if depth == 0:
                return j + 1
        raise ValueError("unbalanced tuple shape")
    m = _SHAPE_HEAD.match(s, i)
    if m is None:
        raise ValueError(f"no shape at {s[i:i + 30]!r}")
    return m.end()


class Entry:
    """The entry computation of a canonical text: its instruction lines by name."""

    def __init__(self, text: str) -> None:
        self.lines = text.split("\n")
        self.head = next(i for i, ln in enumerate(self.lines) if ln.startswith("ENTRY"))
        self.close = next(i for i in range(self.head + 1, len(self.lines)) if self.lines[i].startswith("}"))
        self.at: dict[str, int] = {}
        self.root = ""
        for i in range(self.head + 1, self.close):
            m = _DEF.match(self.lines[i])
            if m:
                self.at[m.group(2)] = i
                if m.group(1):
                    self.root = m.group(2)

    def shape(self, name: str) -> str:
        line = self.lines[self.at[name]]
        start = _DEF.match(line).end()  # type: ignore[union-attr]
        return line[start:_shape_at(line, start)]

    def operands(self, name: str) -> list[str]:
        line = self.lines[self.at[name]]
        start = _DEF.match(line).end()  # type: ignore[union-attr]
        i = _shape_at(line, start)
        j = line.index("(", i)
        depth, k = 0, j
        for k in range(j, len(line)):
            depth += {"(": 1, ")": -1}.get(line[k], 0)
            if depth == 0:
                break
        return re.findall(r"%([\w.\-]+)", line[j:k])

    def others(self) -> list[str]:
        """The lines outside the entry (module header excepted): the called computations."""
        return self.lines[1 : self.head] + self.lines[self.close + 1 :]


def _module_line(text: str) -> str:
    m = _HEADER.match(text)
    return f"HloModule {m.group(1) if m else 'witness'}"


@functools.lru_cache(maxsize=8)
def _entry(canon: str) -> Entry:
    return Entry(canon)


def with_outputs(text: str, names: list[str]) -> tuple[str, list[str]]:
    """A copy of ``text`` whose ROOT is (original ROOT, names...) — the original leaves first,
    then one leaf per name it could add (array-shaped instructions of the entry); returns the
    names added."""
    canon = canonical(text)
    e = Entry(canon)
    added = [n for n in dict.fromkeys(names) if n in e.at and n != e.root and not e.shape(n).startswith("(")]
    if not added:
        return canon, []
    lines = list(e.lines)
    lines[0] = _module_line(canon)
    lines[e.head] = re.sub(r"^ENTRY\s+(%?[\w.\-]+).*\{\s*$", r"ENTRY \1 {", lines[e.head])
    r = e.at[e.root]
    lines[r] = lines[r].replace("ROOT ", "", 1)
    shapes = ", ".join([e.shape(e.root), *(e.shape(n) for n in added)])
    operands = ", ".join(f"%{n}" for n in [e.root, *added])
    lines[e.close] = f"  ROOT %shardproof.witness.root = ({shapes}) tuple({operands})\n" + lines[e.close]
    return "\n".join(lines), added


def cut_instruction(text: str, name: str) -> tuple[str, list[str]]:
    """A program computing only instruction ``name`` of the entry, each distinct operand a
    parameter (numbered in order of first use); returns it and the operand names."""
    # A compiled module's frontier names instructions of its flattened form (fusions inlined).
    canon = canonical(flat.executable(text))
    e = _entry(canon)
    if name not in e.at:
        raise KeyError(f"no instruction %{name} in the entry")
    ops = list(dict.fromkeys(e.operands(name)))
    body = [f"  %{o} = {e.shape(o)} parameter({i})" for i, o in enumerate(ops)]
    line = e.lines[e.at[name]].replace("ROOT ", "", 1).strip()
    body.append(f"  ROOT {line}")
    # The called computations are kept whole (XLA drops what nothing calls).
    return "\n".join([_module_line(canon), *e.others(), "ENTRY %shardproof.segment {", *body, "}", ""]), ops
