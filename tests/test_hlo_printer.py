"""The IR -> HLO text printer: parse(print(parse(x))) == parse(x) on every HLO file of the tests,
and XLA's own parser reads the printed text as the same module."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.printer import print_hlo, print_shape
from shardproof.engine.ir import Instruction, Module, Shape

ROOT = Path(__file__).resolve().parent
HLO_FILES = sorted(p for p in (*ROOT.rglob("*.hlo"), *(ROOT.parent / "examples").rglob("*.hlo")) if "__pycache__" not in p.parts)


def _canon(m: Module) -> tuple[Any, ...]:
    """Everything the IR holds except source locations (they move when text is reprinted)."""
    comps = {n: (c.is_entry, [dataclasses.replace(i, loc=None) for i in c.instructions]) for n, c in m.computations.items()}
    return (m.name, m.entry_name, m.header, comps)


@pytest.mark.parametrize("path", HLO_FILES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_round_trip(path: Path) -> None:
    first = parse_hlo(path.read_text(), str(path))
    printed = print_hlo(first)
    assert _canon(parse_hlo(printed, "printed.hlo")) == _canon(first)
    assert print_hlo(parse_hlo(printed)) == printed  # printing is a fixed point


@pytest.mark.parametrize("path", HLO_FILES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_xla_reads_the_printed_module_as_the_original(path: Path) -> None:
    hlo = pytest.importorskip("jaxlib._hlo")
    text = path.read_text()
    if "{...}" in text:
        pytest.skip("elided literals: XLA fills them with arbitrary values")
    try:
        want = hlo.hlo_module_from_text(text).to_string()
    except Exception:  # files XLA itself rejects have nothing to compare
        pytest.skip("XLA does not parse the original")
    assert hlo.hlo_module_from_text(print_hlo(parse_hlo(text))).to_string() == want


def test_edited_module_prints_consistently() -> None:
    m = parse_hlo(
        "HloModule m\n"
        "ENTRY e {\n  p = f32[2,3]{1,0} parameter(0)\n  ROOT t = f32[3,2]{0,1} transpose(p), dimensions={1,0}\n}\n"
    )
    t = m.entry["t"]
    t.is_root = False
    n = Instruction("n", "negate", Shape("f32", (3, 2)), ["t"], is_root=True)
    m.entry.instructions.append(n)
    m.entry.reindex()
    text = print_hlo(m)
    # the signature follows the new root, and the new instruction prints without a layout
    assert "ENTRY %e (p: f32[2,3]) -> f32[3,2] {" in text
    assert "ROOT %n = f32[3,2] negate(%t)" in text
    assert parse_hlo(text).entry.root.name == "n"


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (Shape("f32", (8, 4), "1,0"), "f32[8,4]{1,0}"),
        (Shape("f32", (8, -1), None, (), (True, True)), "f32[<=8,?]"),
        (Shape("tuple", (), None, (Shape("s32"), Shape("tuple"))), "(s32[], ())"),
        (Shape("token"), "token[]"),
    ],
)
def test_shapes(shape: Shape, text: str) -> None:
    assert print_shape(shape) == text
    printed = parse_hlo(f"HloModule m\nENTRY e {{\n  ROOT p = {text} parameter(0)\n}}\n").entry["p"].shape
    assert print_shape(printed) == text
