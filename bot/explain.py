"""A finding in the author's words: the code of the line, the module, the cause naming the bad
operand by its own source line, a fix where the cause determines one, the numeric witness.

Everything here is presentation of what the verifier reported (its divergence entry, the hint
it attached, the bijections it inferred, the witness it ran) plus the source files of the
checked-out workspace. Nothing here decides a verdict.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_SOURCE_BYTES = 2_000_000  # a larger "source file" is not worth reading for a snippet
CONTEXT_LINES = 2
REDUCER_WORD = {"add": "sum", "max": "max", "min": "min", "multiply": "product", "and": "logical and", "or": "logical or"}


@dataclass(frozen=True)
class Site:
    """A place in the author's code: file, line, the code there, and its module path."""

    path: str  # repository-relative
    line: int
    module: str | None = None
    call: str | None = None  # the call expression on the line, e.g. ``self.out(...)``
    code: str | None = None  # the line's statement, stripped

    @property
    def short(self) -> str:
        return f"{self.path.rsplit('/', 1)[-1]}:{self.line}"


@dataclass
class Story:
    """What a person reads first; every field may be missing, the templates say only what is there."""

    snippet: list[tuple[int, str]] = field(default_factory=list)  # (line number, text)
    language: str = "text"
    module: str | None = None
    cause: str = ""  # one sentence, markdown
    fix: str = ""  # words, markdown; empty where the cause determines none
    suggestion: str | None = None  # the whole replacement line, for a ```suggestion block
    original: str | None = None  # the line it replaces
    witness: str = ""  # one line, markdown
    reproduce: str | None = None  # a shell command
    gap: bool = False  # the rules stopped here, the values agree numerically


# ---------------------------------------------------------------------------------------------
# Source files of the workspace.


class Sources:
    """Reads repository files from the checked-out workspace, once each, never outside it."""

    def __init__(self, workspace: str | Path | None) -> None:
        self.root = Path(workspace or ".").resolve()
        self._cache: dict[str, tuple[list[str], ast.AST | None] | None] = {}

    def _load(self, path: str) -> tuple[list[str], ast.AST | None] | None:
        if path in self._cache:
            return self._cache[path]
        out: tuple[list[str], ast.AST | None] | None = None
        try:
            p = (self.root / path).resolve()
            if p.is_relative_to(self.root) and p.is_file() and p.stat().st_size <= MAX_SOURCE_BYTES:
                text = p.read_text(errors="replace")
                try:
                    tree: ast.AST | None = ast.parse(text) if path.endswith(".py") else None
                except (SyntaxError, ValueError):
                    tree = None
                out = (text.splitlines(), tree)
        except OSError:
            out = None
        self._cache[path] = out
        return out

    def lines(self, path: str) -> list[str] | None:
        got = self._load(path)
        return got[0] if got else None

    def line(self, path: str, n: int) -> str | None:
        ls = self.lines(path)
        return ls[n - 1] if ls and 0 < n <= len(ls) else None

    def snippet(self, path: str, n: int, around: int = CONTEXT_LINES) -> list[tuple[int, str]]:
        ls = self.lines(path)
        if not ls or not 0 < n <= len(ls):
            return []
        lo, hi = max(1, n - around), min(len(ls), n + around)
        while hi > n and not ls[hi - 1].strip():
            hi -= 1  # no trailing blank lines
        while lo < n and not ls[lo - 1].strip():
            lo += 1
        return [(k, ls[k - 1].rstrip()) for k in range(lo, hi + 1)]

    def calls(self, path: str, n: int) -> list[ast.Call]:
        """Calls that start on line n, outermost first."""
        got = self._load(path)
        if not got or got[1] is None:
            return []
        found = [c for c in ast.walk(got[1]) if isinstance(c, ast.Call) and c.lineno == n]
        return sorted(found, key=lambda c: (c.col_offset, -(c.end_col_offset or 0)))

    def imports(self, path: str, name: str) -> bool:
        ls = self.lines(path) or []
        return any(re.match(rf"\s*(import|from)\s+{name}\b", x) for x in ls)


def _segment(line: str, node: ast.AST) -> str | None:
    if getattr(node, "lineno", None) != getattr(node, "end_lineno", None):
        return None
    # ast offsets count UTF-8 bytes.
    raw = line.encode()
    return raw[node.col_offset : node.end_col_offset].decode(errors="replace")  # type: ignore[attr-defined]


def call_text(src: Sources, path: str, n: int) -> str | None:
    """The outermost call on the line as ``func(...)``, e.g. ``self.attn(...)``."""
    text = src.line(path, n)
    if text is None:
        return None
    for c in src.calls(path, n):
        func = _segment(text, c.func)
        if func and len(func) <= 60:
            return f"{func}(...)"
    return None


def strip_comment(text: str) -> str:
    """A line of code without its trailing ``# comment`` (kept when a quote follows the #)."""
    return re.sub(r"\s+#[^'\"]*$", "", text).strip()


def site(src: Sources, path: str | None, line: int, module: str | None) -> Site | None:
    if not path or line <= 0:
        return None
    text = src.line(path, line)
    return Site(path, line, module, call_text(src, path, line), strip_comment(text) if text else None)


def module_call(src: Sources, frames: list[tuple[str, int]], module: str | None, within: str | None) -> Site | None:
    """The caller's line ``self.<leaf>(...)`` of a module's forward, named in the parent module:
    an author knows ``self.out(ctx)`` in ``layers.0.attn`` better than the F.linear inside. Only
    when the module lies strictly inside ``within`` (the module of the reported line; None is the
    top level): a value made in the reported line's own module is named where it is made."""
    if not module or module == within or (within and not module.startswith(within + ".")):
        return None
    parent, leaf = module.rsplit(".", 1) if "." in module else (None, module)
    if leaf.isdigit():
        return None
    for path, line in frames[1:]:
        text = src.line(path, line) or ""
        if re.search(rf"\bself\.{re.escape(leaf)}\s*\(", text):
            return Site(path, line, parent, f"self.{leaf}(...)", text.strip())
    return None


# ---------------------------------------------------------------------------------------------
# Words.


def code(s: Any) -> str:
    s = str(s)
    fence = "``" if "`" in s else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def where_text(s: Site) -> str:
    """the output of ``self.out(...)`` at llama.py:142 in ``layers.0.attn``"""
    what = f"the output of {code(s.call)}" if s.call else (f"the result of {code(s.code)}" if s.code and len(s.code) <= 70 else "the value computed")
    return f"{what} at {code(s.short)}" + (f" in {code(s.module)}" if s.module else "")


def ranks_text(groups: Any) -> str:
    if isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], list):
        return f"the {len(groups[0])} ranks {{{', '.join(map(str, groups[0]))}}}"
    return f"the ranks of each group of {groups}"


def _group_size(groups: Any) -> str:
    return str(len(groups[0])) if isinstance(groups, list) and groups and isinstance(groups[0], list) else "c"


def groups_literal(groups: Any) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]" if isinstance(groups, list) else str(groups)


def parse_shape(text: str) -> tuple[int, ...] | None:
    m = re.match(r"^\w+\[([\d,]*)\]", text or "")
    if not m:
        return None
    return tuple(int(x) for x in m.group(1).split(",") if x)


# ---------------------------------------------------------------------------------------------
# Layout: the inferred bijection as reshape/transpose steps, and a one-line rewrite.


@dataclass(frozen=True)
class Steps:
    """``reshape(split)``, ``transpose(perm)``, ``reshape(out)`` — the bijection's normal form."""

    src: tuple[int, ...]
    split: tuple[int, ...]
    perm: tuple[int, ...]
    out: tuple[int, ...]

    @classmethod
    def parse(cls, key: str) -> Steps | None:
        m = re.fullmatch(r"bij\(([\d,]*):([\d,]*)\|([\d,]*)\|([\d,]*)\)", key or "")
        if not m:
            return None
        a, b, c, d = (tuple(int(x) for x in g.split(",") if x) for g in m.groups())
        return cls(a, b, c, d)

    def simplified(self) -> Steps:
        """Merge split axes that stay adjacent and in order through the transpose."""
        groups: list[list[int]] = []
        for p in self.perm:
            if groups and groups[-1][-1] + 1 == p:
                groups[-1].append(p)
            else:
                groups.append([p])
        order = sorted(groups, key=lambda g: g[0])
        split = tuple(_prod(self.split[k] for k in g) for g in order)
        perm = tuple(order.index(g) for g in groups)
        return Steps(self.src, split, perm, self.out)

    def ops(self) -> list[tuple[str, tuple[int, ...]]]:
        if self.perm == tuple(range(len(self.perm))):
            # No transpose: the bijection is one reshape (a row-major reshape of a reshape is a
            # reshape of the original).
            return [("reshape", self.out)] if self.out != self.src else []
        out: list[tuple[str, tuple[int, ...]]] = []
        if self.split != self.src:
            out.append(("reshape", self.split))
        out.append(("transpose", self.perm))
        moved = tuple(self.split[p] for p in self.perm)
        if moved != self.out:
            out.append(("reshape", self.out))
        return out


def _prod(xs: Any) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def steps_text(ops: list[tuple[str, tuple[int, ...]]]) -> str:
    return " → ".join(f"{op}({', '.join(map(str, a))})" for op, a in ops) or "nothing"


def layout_steps(f: Any) -> tuple[str | None, Steps] | None:
    """A bijection from the frontier's operand (or the frontier itself, when it reshapes that
    operand) to the baseline value it must equal: (operand name or None for the frontier, steps)."""
    d = f.divergence
    targets = [e.get("baseline") for i, e in sorted(f.expected.items()) if e.get("distributed") == d.get("instruction")]
    bc = str(d.get("baseline_counterpart") or "").split(" ", 1)[0]
    targets += [bc] if bc else []
    operands = [o.get("instruction") for o in d.get("operands") or []]
    for t in targets:
        for o in operands:
            for b in f.bijections_all:
                if b.get("distributed") == o and b.get("baseline") == t and (st := Steps.parse(str(b.get("key")))):
                    return o, st
        if d.get("opcode") == "reshape":
            for b in f.bijections_all:
                if b.get("distributed") == d.get("instruction") and b.get("baseline") == t and (st := Steps.parse(str(b.get("key")))):
                    return None, st
    return None


def layout_rewrite(src: Sources, path: str, n: int, shape: tuple[int, ...], ops: list[tuple[str, tuple[int, ...]]], torch: bool) -> tuple[str, str] | None:
    """The line with its one ``.reshape(...)``/``.view(...)`` of this shape replaced by the steps,
    each size written with the expression the author used for it. None when that is not one
    unambiguous edit (two such calls, repeated sizes, a size no argument names)."""
    text = src.line(path, n)
    if text is None:
        return None
    cands = []
    for c in src.calls(path, n):
        if isinstance(c.func, ast.Attribute) and c.func.attr in ("reshape", "view") and len(c.args) == len(shape) and not c.keywords and not any(isinstance(a, ast.Starred) for a in c.args):
            cands.append(c)
    if len(cands) != 1 or len(set(shape)) != len(shape):
        return None
    call = cands[0]
    args = [_segment(text, a) for a in call.args]
    if any(a is None for a in args):
        return None
    names = dict(zip(shape, args, strict=True))

    def size(v: int) -> str | None:
        if v in names:
            return names[v]
        pairs = [(a, b) for i, a in enumerate(shape) for b in shape[i + 1 :] if a * b == v]
        if len(pairs) == 1:
            x, y = pairs[0]
            return f"{_atom(names[x])} * {_atom(names[y])}"
        return None

    parts = []
    for op, a in ops:
        if op == "reshape":
            sizes = [size(v) for v in a]
            if any(s is None for s in sizes):
                return None
            parts.append(f".reshape({', '.join(s for s in sizes if s)})")
        elif torch:
            parts.append(f".permute({', '.join(map(str, a))})")
        else:
            parts.append(f".transpose({', '.join(map(str, a))})")
    if not parts:
        return None
    raw = text.encode()
    start, end = call.func.value.end_col_offset, call.end_col_offset  # type: ignore[attr-defined]
    if start is None or end is None:
        return None
    new = (raw[:start] + "".join(parts).encode() + raw[end:]).decode(errors="replace")
    return text, new


def _names_op(call: str, opcode: str) -> bool:
    """Whether the line's call is the operation itself (a collective wrapper, a reshape), so
    that naming the instruction by it is right; ``x + self.attn(...)``'s add is not the call."""
    if opcode in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"):
        return True
    name = call.split("(", 1)[0].rsplit(".", 1)[-1]
    return {"reshape": name in ("reshape", "view", "flatten", "unflatten"), "transpose": name in ("transpose", "permute", "t")}.get(opcode, False)


def _atom(expr: str) -> str:
    return expr if re.fullmatch(r"[\w.]+", expr) else f"({expr})"


def groups_rewrite(src: Sources, path: str, n: int, found: Any, expected: Any) -> tuple[str, str] | None:
    """The line with its one literal of the wrong replica groups replaced by the right ones."""
    text = src.line(path, n)
    got = src._load(path)
    if text is None or not got or got[1] is None:
        return None
    hits = []
    for node in ast.walk(got[1]):
        if isinstance(node, ast.List) and node.lineno == n and node.end_lineno == n:
            try:
                value = ast.literal_eval(node)
            except ValueError:
                continue
            if value == found:
                hits.append(node)
    if len(hits) != 1:
        return None
    raw = text.encode()
    new = (raw[: hits[0].col_offset] + groups_literal(expected).encode() + raw[hits[0].end_col_offset :]).decode(errors="replace")  # type: ignore[operator]
    return text, new


# ---------------------------------------------------------------------------------------------
# The witness in one line.


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def witness_line(witness: dict[str, Any] | None, outputs: list[int], gap: bool) -> tuple[str, str | None]:
    """(one line of markdown, the command that reproduces it)."""
    if not isinstance(witness, dict):
        return "", None
    status = str(witness.get("status") or "")
    n = int(witness.get("trials") or len(witness.get("seeds") or []) or 0)
    seeds = witness.get("seeds") or []
    cmd = witness.get("command") or None
    reason = str(witness.get("reason") or "")
    inputs = f"{n} random input{'s' if n != 1 else ''}" if n else "random inputs"
    if status == "equal" and witness.get("rounding_seeds"):  # a difference was seen: never "numerically equal"
        return f"equal up to rounding on {inputs} at these shapes (seed(s) {witness['rounding_seeds']} differ as written and agree when rechecked: f32 in f64 with every written rounding kept, bf16/f16 sums within the baseline's own reordering noise)", cmd
    if status == "equal":
        return f"numerically equal on {inputs} at these shapes (XLA's CPU runtime ran the baseline and every rank)", cmd
    if status == "confirmed":
        outs = [o for o in witness.get("outputs") or [] if not o.get("equal", True)]
        mine = [o for o in outs if o.get("output") in outputs] or outs
        if not mine:
            return f"confirmed: the outputs differ on {inputs}", cmd
        o = mine[0]
        at = (f" at index {list(o['index'])}" if o["index"] else " (a scalar)") if o.get("index") is not None else ""
        rank = f"rank {o['rank']}" if o.get("rank") is not None else "the distributed program"
        seed = f", seed {seeds[0]}" if seeds else ""
        err = f" (max abs error {_num(o.get('max_abs_err'))}, max rel error {_num(o.get('max_rel_err'))})" if o.get("max_abs_err") is not None else ""
        return f"**confirmed** — output {o.get('output')} ({o.get('dtype', '?')}, expected {o.get('relation', '?')}){at}: baseline {_num(o.get('baseline_value'))}, {rank} {_num(o.get('distributed_value'))}{err}{seed}", cmd
    if status == "unconfirmed":
        return f"**unconfirmed** — {reason or 'the pair was not executed'}", cmd
    if status == "error":
        return f"the numeric check failed ({reason or 'no reason given'}); the verdict rests on the rules alone", cmd
    if status == "skipped":
        return f"not run{': ' + reason if reason else ''}", cmd
    return (f"{status}: {reason}" if status else ""), cmd


# ---------------------------------------------------------------------------------------------
# The story of one finding.


def _operand_site(src: Sources, o: dict[str, Any], frames_of: Any, repo: Any, within: str | None) -> Site | None:
    """The operand's origin (where its partial sum or layout entered) as the author's code."""
    info = o.get("origin") or o
    if info.get("opcode") in ("parameter", "constant"):
        return None  # a parameter's "line" is the def line: no code an author would call its value
    name = str(info.get("instruction") or "").lstrip("%")
    frames = frames_of(name)
    module = info.get("module")
    if frames:
        up = module_call(src, frames, module, within)
        if up:
            return up
        return site(src, frames[0][0], frames[0][1], module)
    s = info.get("source") or {}
    path = repo(str(s.get("file") or ""))
    return site(src, path, int(s.get("line") or 0), module)


def tell(f: Any, src: Sources, frames_of: Any, repo: Any) -> Story:
    """The Story of finding f. frames_of(name) gives an instruction's repository frames
    (innermost first); repo(file) maps a reported file to a repository path (or None)."""
    d = f.divergence
    st = Story(gap=f.is_gap)
    fr = f.source
    if fr is not None:
        st.snippet = src.snippet(fr.path, fr.line)
        st.language = "python" if fr.path.endswith(".py") else "text"
    st.module = d.get("module") or None
    here = site(src, fr.path, fr.line, st.module) if fr else None
    hint = d.get("hint") if isinstance(d.get("hint"), dict) else {}
    kind = hint.get("kind")
    ops = {o.get("instruction"): o for o in d.get("operands") or []}
    opcode = code(d.get("opcode", "?"))
    this = f"this {opcode}" + (f" ({code(here.call)})" if here and here.call and _names_op(here.call, str(d.get("opcode", ""))) else "")

    if kind == "missing-reduction":
        o = ops.get(hint.get("operand")) or {}
        s = _operand_site(src, o, frames_of, repo, st.module)
        what = where_text(s) if s else f"operand {code(hint.get('operand'))}"
        word = REDUCER_WORD.get(str(hint.get("reducer")), str(hint.get("reducer")))
        st.cause = f"{what} is a partial {word} over {ranks_text(hint.get('groups'))}, and {this} uses it as if it were complete: nothing reduces it first."
        after = f" right after {code(s.call or s.code)} at {code(s.short)}" if s and (s.call or s.code) else " before this line"
        st.fix = f"all-reduce it ({word}) over the tensor-parallel group {code(groups_literal(hint.get('groups')))}{after}."
    elif kind == "wrong-groups":
        o = next(iter(ops.values()), {})
        s = _operand_site(src, o, frames_of, repo, st.module)
        what = f" ({where_text(s)})" if s else ""
        st.cause = f"{this} reduces over replica groups {code(groups_literal(hint.get('found')))}, but its operand{what} is a partial sum over {code(groups_literal(hint.get('expected')))}: each rank adds up the wrong ranks' terms."
        st.fix = f"reduce over {code(groups_literal(hint.get('expected')))}, the group the model is sharded over, instead of {code(groups_literal(hint.get('found')))}."
        if fr is not None:
            rw = groups_rewrite(src, fr.path, fr.line, hint.get("found"), hint.get("expected"))
            if rw:
                st.original, st.suggestion = rw
    elif kind == "redundant-reduction":
        o = next(iter(ops.values()), {})
        s = _operand_site(src, o, frames_of, repo, st.module)
        what = where_text(s) if s else f"operand {code(o.get('instruction'))}"
        st.cause = f"{this} sums a value that is already complete and identical on every rank ({what}), so the result is {_group_size(hint.get('groups'))} times too large."
        st.fix = "remove this all-reduce, or the earlier reduction of the same value."
    elif kind == "layout":
        shape = parse_shape(str(d.get("shape", "")))
        found = layout_steps(f)
        o = next(iter(ops.values()), {})
        # The operand itself, not where its (intended) layout began: it is what the line misreads.
        s = _operand_site(src, {k: v for k, v in o.items() if k != "origin"}, frames_of, repo, st.module) if o else None
        of = f" {where_text(s)}" if s else " its operand"
        if found:
            operand, steps = found
            simple = steps.simplified()
            if operand is None:
                # The frontier reshapes its operand: start from the operand, not the frontier.
                simple = Steps((), simple.split, simple.perm, simple.out)
            ops_ = simple.ops()
            st.cause = f"{this} reads{of} in a different element order than the baseline: the baseline's value is that operand after {code(steps_text(ops_))}."
            st.fix = f"rearrange with {code(steps_text(ops_))} (the inferred bijection) in place of this {opcode}."
            if fr is not None and shape and d.get("opcode") in ("reshape",):
                rw = layout_rewrite(src, fr.path, fr.line, shape, ops_, torch=src.imports(fr.path, "torch"))
                if rw:
                    st.original, st.suggestion = rw
                    st.fix = f"rearrange with {code(steps_text(ops_))}, the inferred bijection, in place of this {opcode} (suggested below)."
        else:
            st.cause = f"{this} reads{of} in a different element order than the baseline (an axis is split, merged or transposed differently), and no later step undoes it."
    if not st.cause:
        # No hint: the verifier's own sentence, with the operands named by their code.
        st.cause = str(f.cause).rstrip(".") + "."
        named = []
        for o in d.get("operands") or []:
            s = _operand_site(src, o, frames_of, repo, st.module)
            if s:
                named.append(f"{code(o.get('instruction'))} is {where_text(s)}")
        if named:
            st.cause += " (" + "; ".join(named) + ")"
    if f.is_gap:
        # Not a bug claim: where the proof stopped, and which relation it was after.
        expected = [(i, e.get("expected")) for i, e in sorted(f.expected.items()) if e.get("expected")]
        need = f", so the {code(expected[0][1])} relation output {expected[0][0]} needs is not proven past this line" if expected else ""
        st.cause = f"no rule relates {this} to the baseline{need}. The values agree when executed, so a rule is missing here, most likely not a bug."
        st.fix = ""
        st.suggestion = st.original = None
    outs = [int(i) for i in d.get("outputs") or []]
    st.witness, st.reproduce = witness_line(f.witness, outs, f.is_gap)
    if st.reproduce:
        st.reproduce = portable_command(st.reproduce, src.root)
    return st


# The report folder as the action uploads it (its `out` input's default); a reproducing command
# names the model's artifacts inside it, whatever machine or shard wrote them.
REPORT_FOLDER = "shardproof-report"
_ARTIFACTS = ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json", "baseline.sourcemap.json")


def portable_command(cmd: str, root: Path) -> str:
    """``cmd`` with no path of the machine that ran it: files in the workspace read relative to
    it, a model's artifacts (an absolute ``.../<model>/<artifact>``) read inside the report
    folder, so the same finding reads the same from one run or from merged shards."""
    words = []
    for w in cmd.split(" "):
        if w.startswith("/"):
            p = Path(w)
            if p.is_relative_to(root):
                w = p.relative_to(root).as_posix()
            elif p.name in _ARTIFACTS and len(p.parts) >= 3:
                w = f"{REPORT_FOLDER}/{p.parent.name}/{p.name}"
        words.append(w)
    return " ".join(words)
