"""Mutations of one layer of a multi-layer pair, the three verifier modes, and the oracle.

``MUTATIONS`` maps a class name to a function (pair, layer, rng) -> mutated pair or None (the
class does not apply). ``run_modes`` answers each mode's verdict ("bad-input" for an
InputError); ``violation`` says whether a folded or memoized ``verified`` stands without a
whole-graph ``verified``, the property the fold and the memo must keep."""

from __future__ import annotations

import inspect
import json
import random
import re
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import Budget
from shardproof.engine.errors import InputError
from shardproof.engine.relations import parse_relations
from shardproof.engine.sourcemap import SourceMap

from .pairs import Pair, handwritten

TESTS = Path(__file__).resolve().parent.parent
MODES: dict[str, dict[str, bool]] = {"default": {}, "no-fold": {"fold": False}, "whole": {"fold": False, "partition": False}}


def frontend_pair(name: str = "deep_mlp_tp4") -> Pair:
    """A pair built by the front end (torch-xla), from tests/pairs."""
    d = TESTS / "pairs" / name
    sm = json.loads((d / "sourcemap.json").read_text()) if (d / "sourcemap.json").exists() else None
    return Pair(name, (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text()), sm)


def base_pairs() -> list[Pair]:
    return [handwritten(5), handwritten(4, extra_attrs=True), frontend_pair("deep_mlp_tp4")]


# --- reading the text ---------------------------------------------------------------------------

_DEF = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+) = ")


def _layer_of(line: str) -> int | None:
    m = re.search(r'op_name="[^"]*?layers[._](\d+)[./]', line)
    return int(m.group(1)) if m else None


def _entry(text: str) -> tuple[list[str], int, int]:
    lines = text.split("\n")
    head = next(i for i, x in enumerate(lines) if x.startswith("ENTRY"))
    close = next(i for i in range(head, len(lines)) if lines[i] == "}")
    return lines, head, close


def _layer_lines(text: str, layer: int) -> list[int]:
    lines, head, close = _entry(text)
    return [i for i in range(head + 1, close) if _layer_of(lines[i]) == layer and " parameter(" not in lines[i]]


def layers_of(pair: Pair) -> list[int]:
    lines, head, close = _entry(pair.distributed)
    return sorted({k for i in range(head + 1, close) if (k := _layer_of(lines[i])) is not None})


def _with(pair: Pair, distributed: str | None = None, baseline: str | None = None, relations: dict[str, Any] | None = None) -> Pair | None:
    d = pair.distributed if distributed is None else distributed
    b = pair.baseline if baseline is None else baseline
    if d == pair.distributed and b == pair.baseline and relations is None:
        return None  # nothing changed: not a mutant
    return replace(pair, distributed=d, baseline=b, relations=relations if relations is not None else pair.relations)


def _edit_line(pair: Pair, layer: int, rng: random.Random, fn: Callable[[str], str | None], side: str = "distributed") -> Pair | None:
    text = pair.distributed if side == "distributed" else pair.baseline
    lines = text.split("\n")
    cands = _layer_lines(text, layer)
    rng.shuffle(cands)
    for i in cands:
        new = fn(lines[i])
        if new is not None and new != lines[i]:
            lines[i] = new
            return _with(pair, **{side: "\n".join(lines)})
    return None


def _rename(text: str, old: str, new: str) -> str:
    return re.sub(rf"%{re.escape(old)}(?![A-Za-z0-9_.\-])", lambda _m: f"%{new}", text)


# --- mutations ----------------------------------------------------------------------------------

_INT_ATTR = re.compile(r"\b(dimensions|lhs_contracting_dims|rhs_contracting_dims|dynamic_slice_sizes|replica_groups)=(\{[^a-z]*?\})(?=,|$)")


def m_attr_value(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        ms = list(_INT_ATTR.finditer(line.split(", metadata=")[0]))
        if not ms:
            return None
        m = rng.choice(ms)
        v = m.group(2)
        digits = [x.start() for x in re.finditer(r"\d", v)]
        if m.group(1) == "replica_groups":
            nv = rng.choice(["{{1,0}}", "{{0},{1}}", "{}", "{{0,1,2,3}}", "{{0,2},{1,3}}"])
        elif digits:
            at = rng.choice(digits)
            nv = v[:at] + str((int(v[at]) + rng.choice([1, 2, 3])) % 10) + v[at + 1 :]
        else:
            nv = "{0}"
        return line[: m.start(2)] + nv + line[m.end(2) :]

    return _edit_line(pair, layer, rng, fn)


def m_literal(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        m = re.search(r" constant\(([^()]*)\)", line)
        if not m:
            return None
        nv = rng.choice(["0.25", "1", "0", "-0.5", "2", "3", "{1}", "%x", "nan"])
        return line[: m.start(1)] + nv + line[m.end(1) :]

    return _edit_line(pair, layer, rng, fn)


_OPS = {"add": ["subtract", "multiply", "maximum"], "multiply": ["add", "maximum", "divide"], "maximum": ["minimum", "add"], "subtract": ["add"], "negate": ["abs", "exponential"], "dot": ["dot"]}


def m_opcode(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        m = re.search(r"\} ([a-z\-]+)\(", line) or re.search(r"\] ([a-z\-]+)\(", line)
        if not m or m.group(1) not in _OPS:
            return None
        return line[: m.start(1)] + rng.choice(_OPS[m.group(1)]) + line[m.end(1) :]

    return _edit_line(pair, layer, rng, fn)


def m_wiring(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    lines, head, close = _entry(pair.distributed)
    defined: list[tuple[str, str]] = []  # (name, shape) in order
    cands = set(_layer_lines(pair.distributed, layer))
    order = list(range(head + 1, close))
    picks = []
    for i in order:
        m = re.match(r"\s*(?:ROOT\s+)?%(\S+) = (\S+) ", lines[i])
        if i in cands:
            for om in re.finditer(r"(\S+) %([^\s,()]+)(?=[,)])", lines[i].split("), ")[0]):
                alts = [n for n, s in defined if s == om.group(1) and n != om.group(2)]
                if alts:
                    picks.append((i, om, alts))
        if m:
            defined.append((m.group(1), m.group(2)))
    if not picks:
        return None
    i, om, alts = rng.choice(picks)
    lines[i] = lines[i][: om.start(2)] + rng.choice(alts) + lines[i][om.end(2) :]
    return _with(pair, "\n".join(lines))


def _pick_def(pair: Pair, layer: int, rng: random.Random) -> str | None:
    names = [m.group(1) for i in _layer_lines(pair.distributed, layer) if (m := _DEF.match(pair.distributed.split("\n")[i]))]
    return rng.choice(names) if names else None


def m_rename(pair: Pair, layer: int, rng: random.Random, style: str = "plain") -> Pair | None:
    name = _pick_def(pair, layer, rng)
    if name is None:
        return None
    new = {"plain": f"renamed.{rng.randrange(10**6)}", "nonascii": name[:1] + "\u043e" + name[1:], "dash": "-" + name, "dotfirst": "." + name}[style]
    return _with(pair, _rename(pair.distributed, name, new))


def m_metadata(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    edits = [
        (r"source_line=\d+", "source_line=oops"),
        (r"source_line=\d+", "source_line=-"),
        (r'op_type="', "op_type="),
        (r"metadata=\{", "metadata={{"),
        (r"\}$", ""),
        (r'op_name="', 'op_name=""'),
        (r"metadata=\{", "metadata={ stack_frame_id=x "),
        (r"source_line=(\d+)", r"source_line=\1 source_line=9"),
    ]

    def fn(line: str) -> str | None:
        pat, rep = rng.choice(edits)
        new = re.sub(pat, rep, line, count=1)
        return new if new != line else None

    return _edit_line(pair, layer, rng, fn)


def m_layer_label(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """Label skew: one instruction's op_name names the next or the previous layer."""
    to = layer + rng.choice([-1, 1])
    if to < 0:
        to = layer + 1

    def fn(line: str) -> str | None:
        return re.sub(r'(op_name="[^"]*?layers[._])(\d+)([./])', lambda m: f"{m.group(1)}{to}{m.group(3)}", line, count=1)

    side = rng.choice(["distributed", "distributed", "baseline"])
    return _edit_line(pair, layer, rng, fn, side)


_LOOKALIKES = [
    ', foo={a, metadata={op_name="model.layers.{k}/x" source_line=1}}',
    ', foo={channel_id={n}}',
    ', foo={a, channel_id={n}}',
    ', backend_config="q, metadata={op_name=\\"model.layers.{k}/x\\"}"',
    ", control-predecessors={%{name}}",
    ", foo={%{name}}",
    ', frontend_attributes={note="%{name}"}',
    ", sharding={replicated}",
]


def m_attr_lookalike(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """An attribute whose value holds a metadata, channel id or %name look-alike, in one line of
    the layer (or, with the attributes in every layer already, a change inside them)."""
    if "foo={a=%hb." in pair.distributed and rng.random() < 0.6:
        def fn(line: str) -> str | None:
            choice = rng.randrange(4)
            if choice == 0:
                return re.sub(r"foo=\{a=%hb\.\d+", lambda _m: f"foo={{a=%hb.{max(layer - 1, 0)}", line) if layer else None
            if choice == 1:
                return line.replace("channel_id=3}", f"channel_id={rng.randrange(4, 99)}}}")
            if choice == 2:
                return re.sub(r'layers\.\d+/q\\"', lambda _m: f'layers.{layer + 1}/q\\"', line)
            return re.sub(r"control-predecessors=\{%xw\.\d+\}", lambda _m: f"control-predecessors={{%hb.{layer}}}", line)

        return _edit_line(pair, layer, rng, fn)
    name = _pick_def(pair, layer, rng)

    def fn2(line: str) -> str | None:
        if ", metadata=" not in line or name is None:
            return None
        text = rng.choice(_LOOKALIKES).replace("{k}", str(layer + rng.choice([0, 1]))).replace("{n}", str(rng.randrange(1, 9))).replace("{name}", name)
        at = line.index(", metadata=")
        return line[:at] + text + line[at:]

    return _edit_line(pair, layer, rng, fn2)


def _root(text: str) -> tuple[list[str], int]:
    lines, head, close = _entry(text)
    return lines, next(i for i in range(head + 1, close) if lines[i].lstrip().startswith("ROOT"))


def m_root_literal(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """The ranks return a broadcast constant (a literal cone) instead of the last layer."""
    lines, r = _root(pair.distributed)
    m = re.search(r"tuple\((\S+) %([^\s,()]+)\)", lines[r])
    if not m:
        return None
    shape = m.group(1)
    value = rng.choice(["0", "1", "0.5"])
    lines[r : r] = [f"  %lit.c = f32[] constant({value})", f"  %lit.b = {shape} broadcast(f32[] %lit.c), dimensions={{}}"]
    lines[r + 2] = lines[r + 2].replace(f"%{m.group(2)})", "%lit.b)")
    return _with(pair, "\n".join(lines))


def m_rootless(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """No ROOT keyword; the last line of the layer (read by no one) moves to the end of the entry,
    so it is the result (the parser's and XLA's rule)."""
    lines, r = _root(pair.distributed)
    lines[r] = lines[r].replace("ROOT ", "", 1)
    text = "\n".join(lines)
    ids = _layer_lines(text, layer)
    _, _, close = _entry(text)
    for i in reversed(ids):
        m = _DEF.match(lines[i])
        if m and not re.search(rf"%{re.escape(m.group(1))}(?![A-Za-z0-9_.\-])", "\n".join(lines[i + 1 :])):
            moved = lines.pop(i)
            lines.insert(close - 1, moved)
            return _with(pair, "\n".join(lines))
    return _with(pair, text) if rng.random() < 0.5 else None


def m_rank_param(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """The layer slices by another duplicated scalar, or by the token, instead of the rank."""
    if "%r, s32[] %four." not in pair.distributed:
        return None
    other = rng.choice(["q", "t"])
    return _edit_line(pair, layer, rng, lambda line: line.replace("s32[] %r,", f"s32[] %{other},") if "s32[] %r," in line else None)


def m_param_swap(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """A layer reads another (duplicate or sharded) parameter of the same shape."""
    lines, head, close = _entry(pair.distributed)
    params = [(m.group(1), m.group(2)) for i in range(head + 1, close) if (m := re.match(r"\s*%(\S+) = (\S+) parameter\(", lines[i]))]

    def fn(line: str) -> str | None:
        for name, shape in params:
            if re.search(rf"{re.escape(shape)} %{re.escape(name)}[,)]", line):
                alts = [n for n, s in params if s == shape and n != name]
                if alts:
                    alt = rng.choice(alts)
                    return re.sub(rf"%{re.escape(name)}(?=[,)])", lambda _m, a=alt: f"%{a}", line, count=1)
        return None

    return _edit_line(pair, layer, rng, fn)


def m_shape(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        m = re.search(r" = ([a-z0-9]+)\[(\d+),(\d+)\]", line)
        if not m:
            return None
        a, b = m.group(2), m.group(3)
        new = rng.choice([f"{m.group(1)}[{b},{a}]", f"f16[{a},{b}]", f"{m.group(1)}[{a}]", f"f33[{a},{b}]"])
        return line[: m.start(1)] + new + line[m.end(3) + 1 :]

    return _edit_line(pair, layer, rng, fn)


def m_channel(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        if "channel_id=" not in line:
            return None
        return rng.choice([re.sub(r"channel_id=\d+", f"channel_id={rng.randrange(50, 99)}", line), re.sub(r"channel_id=\d+, ", "", line), re.sub(r"channel_id=\d+", "channel_id=x", line)])

    return _edit_line(pair, layer, rng, fn)


def m_comment(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    def fn(line: str) -> str | None:
        spots = [m.start() for m in re.finditer(r"[,(){}]", line)]
        if not spots:
            return None
        at = rng.choice(spots)
        return line[:at] + rng.choice(["/* c */", "/**/", "/* , metadata={} */"]) + line[at:]

    return _edit_line(pair, layer, rng, fn)


def m_root_shape(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """The ROOT returns another value of the same shape (an earlier layer's) or one more."""
    lines, r = _root(pair.distributed)
    m = re.search(r"tuple\((\S+) %([^\s,()]+)\)", lines[r])
    ids = _layer_lines(pair.distributed, layer)
    if not m:
        return None
    alts = [d.group(1) for i in ids if (d := re.match(rf"\s*%(\S+) = {re.escape(m.group(1))} ", lines[i]))]
    if not alts:
        return None
    alt = rng.choice(alts)
    if rng.random() < 0.5:
        lines[r] = lines[r].replace(f"%{m.group(2)})", f"%{alt})")
    else:
        lines[r] = lines[r].replace(f"tuple({m.group(1)} %{m.group(2)})", f"tuple({m.group(1)} %{m.group(2)}, {m.group(1)} %{alt})").replace(f"= ({m.group(1)})", f"= ({m.group(1)}, {m.group(1)})")
    return _with(pair, "\n".join(lines))


def m_duplicate_def(pair: Pair, layer: int, rng: random.Random) -> Pair | None:
    """A name defined twice, or a second ROOT, in the layer."""
    lines = pair.distributed.split("\n")
    ids = _layer_lines(pair.distributed, layer)
    if not ids:
        return None
    i = rng.choice(ids)
    if rng.random() < 0.5:
        lines.insert(i + 1, lines[i])
    else:
        lines[i] = re.sub(r"^(\s*)%", r"\1ROOT %", lines[i])
    return _with(pair, "\n".join(lines))


MUTATIONS: dict[str, Callable[[Pair, int, random.Random], Pair | None]] = {
    "attribute-value": m_attr_value,
    "literal": m_literal,
    "opcode": m_opcode,
    "wiring": m_wiring,
    "rename": m_rename,
    "name-non-ascii": lambda p, k, r: m_rename(p, k, r, "nonascii"),
    "name-leading-dash": lambda p, k, r: m_rename(p, k, r, r.choice(["dash", "dotfirst"])),
    "metadata-malformed": m_metadata,
    "layer-numbering": m_layer_label,
    "attribute-lookalike": m_attr_lookalike,
    "root-literal": m_root_literal,
    "rootless": m_rootless,
    "rank-token-parameter": m_rank_param,
    "duplicate-parameter": m_param_swap,
    "shape": m_shape,
    "channel-id": m_channel,
    "comment": m_comment,
    "root-shape": m_root_shape,
    "duplicate-definition": m_duplicate_def,
}


# --- running ------------------------------------------------------------------------------------


def run_modes(pair: Pair, modes: dict[str, dict[str, bool]] = MODES, lazy: bool = False) -> dict[str, str]:
    """Each mode's verdict on the pair; "bad-input" for located bad input, "error: ..." for a
    crash of the tool. ``lazy``: the whole graph only when a shortcut mode said verified (all
    that ``violation`` needs)."""
    out: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="shardproof-folddiff-") as d:
        b, t = Path(d) / "baseline.hlo", Path(d) / "distributed.hlo"
        b.write_text(pair.baseline)
        t.write_text(pair.distributed)
        sm = None
        if pair.sourcemap is not None:
            (Path(d) / "sourcemap.json").write_text(json.dumps(pair.sourcemap))
            sm = SourceMap.load(Path(d) / "sourcemap.json")
        try:
            spec = parse_relations(pair.relations, "relations.yaml")
        except InputError:
            return dict.fromkeys(modes, "bad-input")
        # The rules' verdicts: the numeric witness never makes a pair verified, so it is left out.
        extra = {"witness": "never"} if "witness" in inspect.signature(check_files).parameters else {}
        for mode, kw in modes.items():
            if lazy and mode == "whole" and "verified" not in out.values():
                continue
            try:
                out[mode] = check_files(spec, b, t, sm, Budget(**kw), **extra).verdict  # type: ignore[arg-type]
            except InputError:
                out[mode] = "bad-input"
            except Exception as e:  # a crash is recorded, not hidden
                out[mode] = f"error: {type(e).__name__}: {e}"
    return out


def violation(verdicts: dict[str, str]) -> bool:
    """A folded or memoized ``verified`` without a whole-graph ``verified``."""
    return any(verdicts.get(m) == "verified" for m in ("default", "no-fold")) and verdicts.get("whole") != "verified"


def oracle(pair: Pair, seed: int = 0) -> bool | None:
    """XLA's CPU runtime: are the programs equal on random inputs? None when XLA refuses."""
    from oracle import run_pair  # tests/oracle.py (tests/ is on the path)

    try:
        return run_pair(pair.baseline, pair.distributed, pair.relations, seed=seed).equal
    except Exception:
        return None


def mutants(pairs: list[Pair], count: int, seed: int, classes: list[str] | None = None) -> list[tuple[str, str, int, Pair]]:
    """``count`` seeded mutants: (class, base pair name, layer, mutant), classes in turn."""
    rng = random.Random(seed)
    names = classes or list(MUTATIONS)
    out: list[tuple[str, str, int, Pair]] = []
    for n in range(count):
        cls = names[n % len(names)]
        for _ in range(30):  # a class may not apply to a pair or layer: draw again
            pair = rng.choice(pairs)
            layers = layers_of(pair)
            layer = rng.choice(layers[1:] or layers)
            m = MUTATIONS[cls](pair, layer, rng)
            if m is not None:
                out.append((cls, pair.name, layer, m))
                break
    return out
