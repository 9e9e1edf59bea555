"""Differential test: our HLO parser against XLA's own, on every ``*.hlo`` file under tests/.

XLA's parser is reached through jaxlib: ``jaxlib._hlo.hlo_module_from_text`` (jaxlib 0.10.2; the
same function is ``jax._src.lib.xla_client._xla.hlo_module_from_text`` in older releases). Its
``HloInstruction`` has ``name``, ``opcode`` (an enum), ``operands()`` and ``to_string()`` but no
shape accessor, so opcode text and shape are read from ``to_string()``, whose
``%name = SHAPE opcode(`` prefix XLA prints canonically. That prefix is read here with a small
shape reader of this file's own, so no code of the parser under test judges its own output.

XLA makes instruction names unique across the whole module (a second ``x`` becomes ``x.1``), so
instructions are paired by position inside their computation, and operands are compared through
that pairing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.ir import Instruction, Module, Shape

TESTS_DIR = Path(__file__).resolve().parent
HLO_FILES = sorted(p for p in TESTS_DIR.rglob("*.hlo") if "__pycache__" not in p.parts)


def _xla_parser() -> Callable[[str], Any]:
    """XLA's HLO text parser from jaxlib, wherever this jaxlib version keeps it."""
    try:
        from jaxlib import _hlo

        return _hlo.hlo_module_from_text
    except ImportError:
        pass
    try:
        from jax._src.lib import xla_client

        return xla_client._xla.hlo_module_from_text  # older jaxlib
    except (ImportError, AttributeError):
        pytest.skip("jaxlib (XLA's HLO parser) is not importable")


# --- reading XLA's canonical instruction text -------------------------------------------------

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](?:\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\})?")
_PREFIX = re.compile(r"%([^ ]+) = ")
_CALLS = re.compile(r"\b(to_apply|calls|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_CALL_LISTS = re.compile(r"\b(calls|branch_computations)=\{([^}]*)\}")

Canon = tuple[Any, ...]


def _read_shape(text: str, pos: int) -> tuple[Canon, str | None, int]:
    """(canonical shape, layout text, end) for the shape printed at ``text[pos:]``."""
    if text[pos] == "(":
        pos += 1
        items: list[Canon] = []
        while text[pos] != ")":
            if text.startswith("/*", pos):  # XLA numbers long tuples: /*index=5*/
                pos = text.index("*/", pos) + 2
            item, _, pos = _read_shape(text, pos)
            items.append(item)
            if text.startswith(", ", pos):
                pos += 2
        return ("tuple", tuple(items)), None, pos + 1
    m = _ARRAY.match(text, pos)
    assert m is not None, f"cannot read XLA's shape at: {text[pos:pos + 60]!r}"
    dims: list[tuple[int, bool]] = []
    for d in filter(None, m.group(2).split(",")):
        dims.append((-1, True) if d == "?" else (int(d[2:]), True) if d.startswith("<=") else (int(d), False))
    return (m.group(1), tuple(dims)), m.group(3), m.end()


def _canon(shape: Shape) -> Canon:
    if shape.is_tuple:
        return ("tuple", tuple(_canon(s) for s in shape.tuple_shapes))
    dynamic = shape.dynamic or (False,) * len(shape.dims)
    return (shape.dtype, tuple(zip(shape.dims, dynamic, strict=True)))


def _layouts(shape: Shape, canon_layout: str | None) -> list[tuple[str, str | None]]:
    """(ours, XLA's) layout pairs for an array shape where we recorded a layout."""
    if shape.is_tuple or shape.layout is None:
        return []
    return [(shape.layout, canon_layout)]


def _xla_instruction(text: str) -> tuple[str, Canon, str | None, str]:
    """(name, canonical shape, layout, opcode) from ``%name = SHAPE opcode(...`` text."""
    m = _PREFIX.match(text)
    assert m is not None, f"unexpected instruction text from XLA: {text[:80]!r}"
    shape, layout, pos = _read_shape(text, m.end())
    assert text[pos] == " ", text[:120]
    opcode = text[pos + 1 : text.index("(", pos)]
    return m.group(1), shape, layout, opcode


def _xla_calls(text: str) -> list[str]:
    found = [name for _, name in _CALLS.findall(text)]
    for _, inner in _CALL_LISTS.findall(text):
        found += [p.strip().lstrip("%") for p in inner.split(",") if p.strip()]
    return sorted(found)


def _base(name: str) -> str:
    return re.sub(r"\.\d+$", "", name)


# --- the comparison ---------------------------------------------------------------------------


def _compare(ours: Module, xla: Any) -> list[str]:
    problems: list[str] = []
    module_text = xla.to_string()
    xla_comps = {c.name: c for c in xla.computations()}
    if set(xla_comps) != set(ours.computations):
        problems.append(
            f"computations differ: only ours {sorted(set(ours.computations) - set(xla_comps))}, "
            f"only XLA's {sorted(set(xla_comps) - set(ours.computations))}"
        )
    entry = re.search(r"^ENTRY %?(\S+)", module_text, re.M)
    if entry is None or entry.group(1) != ours.entry_name:
        problems.append(f"entry: ours {ours.entry_name}, XLA {entry.group(1) if entry else None}")
    xla_roots = set(re.findall(r"^\s*ROOT %(\S+) =", module_text, re.M))
    for cname, comp in ours.computations.items():
        xc = xla_comps.get(cname)
        if xc is None:
            continue
        xinstrs = list(xc.instructions())
        if len(xinstrs) != len(comp.instructions):
            problems.append(f"%{cname}: {len(comp.instructions)} instructions, XLA has {len(xinstrs)}")
            continue
        to_ours: dict[str, str] = {}
        for mine, theirs in zip(comp.instructions, xinstrs, strict=True):
            to_ours[theirs.name] = mine.name
            problems += _compare_instruction(cname, mine, theirs, to_ours)
        root = comp.root
        xroot = [x.name for x in xinstrs if x.name in xla_roots]
        if [to_ours[n] for n in xroot] != [root.name]:
            problems.append(f"%{cname}: root ours %{root.name}, XLA {xroot}")
    return problems


def _compare_instruction(cname: str, mine: Instruction, theirs: Any, to_ours: dict[str, str]) -> list[str]:
    where = f"%{cname}/%{mine.name}"
    if mine.loc is not None:
        where += f" (line {mine.loc.line})"
    problems: list[str] = []
    text = theirs.to_string()
    xname, xshape, xlayout, xopcode = _xla_instruction(text)
    if xname != mine.name and _base(xname) != _base(mine.name):
        problems.append(f"{where}: XLA names it %{xname}")
    if xopcode != mine.opcode:
        problems.append(f"{where}: opcode ours {mine.opcode}, XLA {xopcode}")
    if _canon(mine.shape) != xshape:
        problems.append(f"{where}: shape ours {_canon(mine.shape)}, XLA {xshape}")
    for ours_layout, xla_layout in _layouts(mine.shape, xlayout):
        if ours_layout.replace(" ", "") != (xla_layout or "").replace(" ", ""):
            problems.append(f"{where}: layout ours {{{ours_layout}}}, XLA {{{xla_layout}}}")
    xoperands = [to_ours.get(o.name, f"?{o.name}") for o in theirs.operands()]
    if xoperands != mine.operands:
        problems.append(f"{where}: operands ours {mine.operands}, XLA {xoperands}")
    if sorted(mine.called) != _xla_calls(text):
        problems.append(f"{where}: calls ours {sorted(mine.called)}, XLA {_xla_calls(text)}")
    if mine.opcode == "parameter":
        m = re.search(r" parameter\((\d+)\)", text)
        if m is None or int(m.group(1)) != mine.parameter_number:
            problems.append(f"{where}: parameter number ours {mine.parameter_number}, XLA {text}")
    if mine.opcode == "get-tuple-element":
        m = re.search(r"\bindex=(\d+)", text)
        if m is None or int(m.group(1)) != mine.tuple_index:
            problems.append(f"{where}: tuple index ours {mine.tuple_index}, XLA {text}")
    return problems


def _first_error_line(message: str) -> str:
    for line in message.splitlines():
        if "error:" in line:
            return line.strip()
    return message.strip().splitlines()[0] if message.strip() else "(no message)"


@pytest.mark.parametrize("path", HLO_FILES, ids=[str(p.relative_to(TESTS_DIR)) for p in HLO_FILES])
def test_parse_matches_xla(path: Path) -> None:
    xla_parse = _xla_parser()
    text = path.read_text(encoding="utf-8")
    rel = str(path.relative_to(TESTS_DIR))
    try:
        xla_module = xla_parse(text)
    except Exception as e:  # XLA reports every parse failure as a RuntimeError subtype
        try:
            parse_hlo(text, rel)
            ours = "our parser accepts it"
        except Exception as ours_error:
            ours = f"our parser rejects it too: {str(ours_error).splitlines()[0]}"
        pytest.xfail(f"jaxlib rejects {rel}: {_first_error_line(str(e))} ({ours})")
    module = parse_hlo(text, rel)
    problems = _compare(module, xla_module)
    assert not problems, f"{rel} parses differently from XLA:\n  " + "\n  ".join(problems[:50])


def test_fixture_files_are_found() -> None:
    """The hand-written and generated fixtures of this suite are among the compared files."""
    names = {p.name for p in HLO_FILES}
    assert {"syntax_forms.hlo", "neuron_style.hlo", "jax_ops.hlo", "torch_mlp_forward.hlo"} <= names


def test_comparison_catches_each_kind_of_difference() -> None:
    """The comparison is not vacuous: a wrong name, opcode, shape, operand, call or root shows."""
    xla_parse = _xla_parser()
    text = (TESTS_DIR / "hlo" / "syntax_forms.hlo").read_text(encoding="utf-8")
    xla_module = xla_parse(text)
    assert _compare(parse_hlo(text), xla_module) == []

    def mutated(change: Callable[[Module], None]) -> list[str]:
        module = parse_hlo(text)
        change(module)
        return _compare(module, xla_module)

    def rename(m: Module) -> None:
        m.entry["arg1"].name = "renamed"

    def set_opcode(m: Module) -> None:
        m.entry["ar"].opcode = "all-gather"

    def set_shape(m: Module) -> None:
        m.entry["sl"].shape = Shape("f32", (4, 65), "1,0")

    def set_dtype(m: Module) -> None:
        m.entry["nest"].shape = Shape("tuple", tuple_shapes=(Shape("f32", (4,)),))

    def swap_operands(m: Module) -> None:
        m.entry["pd"].operands.reverse()

    def set_call(m: Module) -> None:
        m.entry["ar"].parsed["to_apply"] = "max_s32"

    def move_root(m: Module) -> None:
        m.entry.root.is_root = False
        m.entry["cc"].is_root = True

    def set_layout(m: Module) -> None:
        m.entry["arg0"].shape = Shape("f32", (8, 128), "0,1")

    def set_entry(m: Module) -> None:
        m.entry_name = "body"

    changes = (rename, set_opcode, set_shape, set_dtype, swap_operands, set_call, move_root, set_layout, set_entry)
    for change in changes:
        assert mutated(change), f"{change.__name__} went unnoticed"
