"""normalize.unit_dim_broadcasts rewrites the text the rules read, while the witness executes the
original: every rewrite it admits must keep the values exactly. Checked here by executing the
original and the normalized module on XLA's CPU runtime, for broadcasts whose unit operand dims
land on unit result dims in place and elsewhere, several broadcasts of one operand with
different squeezes, and reshape operands."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.printer import print_hlo


def _module(operand: tuple[int, ...], results: list[tuple[tuple[int, ...], tuple[int, ...]]], via_reshape: tuple[int, ...] | None = None) -> str:
    """p0 (``operand``, viewed as ``via_reshape`` when given) broadcast into each (shape, dims)."""
    def s(dims: tuple[int, ...]) -> str:
        return f"f32[{','.join(map(str, dims))}]"

    src = "%p0"
    lines = [f"  %p0 = {s(operand)} parameter(0)"]
    if via_reshape is not None:
        lines.append(f"  %v = {s(via_reshape)} reshape({s(operand)} %p0)")
        src, operand = "%v", via_reshape
    outs = []
    for i, (shape, dims) in enumerate(results):
        lines.append(f"  %b{i} = {s(shape)} broadcast({s(operand)} {src}), dimensions={{{','.join(map(str, dims))}}}")
        # An add keeps each broadcast from being the ROOT tuple's bare operand.
        lines.append(f"  %a{i} = {s(shape)} add({s(shape)} %b{i}, {s(shape)} %b{i})")
        outs.append(f"%a{i}")
    tys = ", ".join(s(shape) for shape, _ in results)
    lines.append(f"  ROOT %t = ({tys}) tuple({', '.join(outs)})")
    return "HloModule m\n\nENTRY %main {\n" + "\n".join(lines) + "\n}\n"


def _same_values(text: str) -> str:
    runtime = pytest.importorskip("shardproof.engine.witness.runtime")
    module = parse_hlo(text, "case.hlo")
    normalized = normalize(module)
    for ins in normalized.entry.instructions:
        if ins.opcode == "broadcast":
            operand = normalized.entry[ins.operands[0]]
            # a well-formed broadcast: one result dim per operand dim
            assert len(ins.parsed["dimensions"]) == operand.shape.rank, (ins.name, operand.shape, ins.parsed["dimensions"])
            # the printer writes the attributes' text; the rewrite changed the parsed list
            ins.attrs = dict(ins.attrs, dimensions="{" + ",".join(map(str, ins.parsed["dimensions"])) + "}")
    printed = print_hlo(normalized)
    p0 = module.entry.parameters[0].shape.dims
    x = np.random.default_rng(0).standard_normal(p0).astype(np.float32)
    want, got = runtime.run_hlo(text, [x]), runtime.run_hlo(printed, [x])
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(w, g)
    return printed


def test_two_broadcasts_of_one_operand_that_squeeze_differently_get_their_own_squeezes() -> None:
    # p0's dim 0 stays where it is in b0 (kept) but moves in b1 (squeezed): one shared squeeze
    # of the first broadcast's shape gave b1 a rank-2 operand with a one-entry dimensions list.
    printed = _same_values(_module((1, 1, 4), [((1, 5, 1, 4), (0, 2, 3)), ((7, 1, 1, 4), (1, 2, 3))]))
    assert "p0.squeeze" in printed and "p0.squeeze.1" in printed


def test_every_unit_dim_placement_keeps_the_values() -> None:
    # A seeded sample of operand shapes with unit dims, broadcast into results with extra dims
    # of size 1 or 3, every strictly increasing dims placement.
    rnd = random.Random(7)
    cases = 0
    for operand in [(1, 4), (4, 1), (1, 1, 4), (1, 4, 1), (2, 1, 3)]:
        for rank in (len(operand), len(operand) + 1, len(operand) + 2):
            for dims in itertools.combinations(range(rank), len(operand)):
                extra = [d for d in range(rank) if d not in dims]
                shape = [0] * rank
                for i, d in enumerate(dims):
                    shape[d] = operand[i]
                for d in extra:
                    shape[d] = rnd.choice((1, 3))
                _same_values(_module(operand, [(tuple(shape), dims)]))
                cases += 1
    assert cases > 40


def test_broadcast_of_a_unit_dim_reshape_keeps_the_values() -> None:
    # in place, moved, and a degenerate broadcast of the unit dim onto a dim of 5
    _same_values(_module((4, 3), [((2, 1, 4, 3), (1, 2, 3)), ((1, 4, 3, 5), (0, 1, 2)), ((5, 4, 3), (0, 1, 2))], via_reshape=(1, 4, 3)))


@pytest.mark.parametrize(("x", "lo", "hi"), [((4, 3), 3, 9), ((4, 2, 3), 6, 24), ((4, 3), 0, 12), ((4, 3), 2, 8)])
def test_a_flat_slice_of_rows_keeps_the_values(x: tuple[int, ...], lo: int, hi: int) -> None:
    # normalize.flat_row_slices, the other rewrite of the DTensor work: rows lo/k .. hi/k of x
    # where k divides lo and hi, else left alone (2..8 of a [4,3] is no run of whole rows).
    k = 1
    for n in x[1:]:
        k *= n
    n_all = k * x[0]
    rows = (hi - lo) // k
    out = (rows, *x[1:]) if (hi - lo) % k == 0 else (hi - lo,)
    s = ",".join(map(str, x))
    text = (
        "HloModule m\n\nENTRY %main {\n"
        f"  %p0 = f32[{s}] parameter(0)\n"
        f"  %flat = f32[{n_all}] reshape(f32[{s}] %p0)\n"
        f"  %sl = f32[{hi - lo}] slice(f32[{n_all}] %flat), slice={{[{lo}:{hi}]}}\n"
        f"  %r = f32[{','.join(map(str, out))}] reshape(f32[{hi - lo}] %sl)\n"
        f"  ROOT %a = f32[{','.join(map(str, out))}] add(%r, %r)\n"
        "}\n"
    )
    printed = _same_values(text)
    assert ("slice={[" + f"{lo // k}:{hi // k}]" in printed) == (lo % k == 0 and hi % k == 0), printed
