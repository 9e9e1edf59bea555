"""Property test of the strided microbatch law (rules/microbatch.egg, mbi / mbrs / mbi-contract):
a batch dim that is not the first, cut into n microbatches and merged with the dims before it
by a reshape (Megatron's (seq, batch, hidden) -> (seq*batch, hidden) in a 3-D linear), stays a
block in flat order, so row-wise layers on the merged view keep it and a reshape back returns
the plain block; a dot contracting the merged dim of two such blocks is the block's
contribution. Programs are drawn and judged as tests/test_law_properties.py does (verifier,
then XLA's execution): no pair that XLA finds different may be verified, some must verify and
some must really differ. (The generator lives here, not in tests/laws/families.py, so that the
pipeline tests own it; it uses the same Program / judge machinery.)"""

from __future__ import annotations

import random

import pytest
from laws.families import FLOAT_TYPES, LAYOUTS, Program
from laws.run import judge, tally

COUNT = 24
SEED = 20261128


def mbstrided(rng: random.Random) -> Program:
    """x [o, n*b, h] cut into n blocks along dim 1. Forward form: each block reshaped to
    [o*b, h], a pointwise op, for some types a dot with a duplicate weight, reshaped back to
    [o, b, h2] and the blocks concatenated along dim 1. Contract form: the weight gradient
    dot(reshape(x)^T, reshape(y)) contracting the merged dim, summed over the blocks. Drawn:
    element type (narrow, unsigned, float), o, n, b, and the side conditions: blocks joined
    out of order, a reshape back that splits the merged dim the other way round ([b, o] then
    transposed), a reverse of the merged dim (mixes rows across the blocks), a contraction of
    one block of x with another block of y."""
    groups = rng.choice(LAYOUTS)
    t = rng.choice(["f32", "bf16", "s32", "s8", "u16"])
    o, n, b, h = rng.choice([2, 3]), rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([2, 3])
    s = n * b
    form = rng.choice(["forward", "forward", "contract"])
    defects = ["order", "split", "reverse"] if form == "forward" else ["cross", "reverse"]
    defect = rng.choice(["none"] * 4 + defects)
    if defect == "split" and b == 1:
        defect = "none"  # [1, o] then transposed is the same layout: not a defect
    dot = t in ("f32", "s32") and rng.random() < 0.7
    h2 = 2 if dot else h

    def ty(*dd: int) -> str:
        return f"{t}[{','.join(map(str, dd))}]"

    def row_ops(p: str, x: str, m: int) -> tuple[list[str], str]:
        """Row-wise layers on the merged view [m, h] -> [m, h2]."""
        sh = ty(m, h)
        op = "tanh" if t in FLOAT_TYPES else "multiply"
        ln = [f"  %{p}u = {sh} {op}({sh} %{x}{'' if t in FLOAT_TYPES else f', {sh} %' + x})"]
        last = f"{p}u"
        if defect == "reverse":
            ln.append(f"  %{p}rv = {sh} reverse({sh} %{last}), dimensions={{0}}")
            last = f"{p}rv"
        if dot:
            ln.append(f"  %{p}y = {ty(m, h2)} dot({sh} %{last}, {ty(h, h2)} %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
            last = f"{p}y"
        return ln, last

    params = f"x: {ty(o, s, h)}, y: {ty(o, s, h)}, w: {ty(h, h2)}"
    head = [f"  %x = {ty(o, s, h)} parameter(0)", f"  %y = {ty(o, s, h)} parameter(1)", f"  %w = {ty(h, h2)} parameter(2)"]
    red = f"%sum (a: {t}[], c: {t}[]) -> {t}[] {{\n  %a = {t}[] parameter(0)\n  %c = {t}[] parameter(1)\n  ROOT %r = {t}[] add({t}[] %a, {t}[] %c)\n}}\n\n"

    def blk(v: str, e: int, i: int) -> list[str]:
        return [f"  %{v}b{i} = {ty(o, b, h)} slice({ty(o, s, h)} %{v}), slice={{[0:{o}], [{e * b}:{(e + 1) * b}], [0:{h}]}}",
                f"  %{v}m{i} = {ty(o * b, h)} reshape({ty(o, b, h)} %{v}b{i})"]

    if form == "forward":
        bl = [f"  %xm = {ty(o * s, h)} reshape({ty(o, s, h)} %x)"]
        ln, last = row_ops("b", "xm", o * s)
        bl += [*ln, f"  %bo = {ty(o, s, h2)} reshape({ty(o * s, h2)} %{last})"]
        out_t, broot = ty(o, s, h2), "bo"
        order = list(range(n))
        if defect == "order":
            order[0], order[1] = order[1], order[0]
        dl: list[str] = []
        for i, e in enumerate(order):
            dl += blk("x", e, i)
            ln, last = row_ops(f"m{i}", f"xm{i}", o * b)
            dl += ln
            if defect == "split":
                dl += [f"  %s{i} = {ty(b, o, h2)} reshape({ty(o * b, h2)} %{last})",
                       f"  %o{i} = {ty(o, b, h2)} transpose({ty(b, o, h2)} %s{i}), dimensions={{1,0,2}}"]
            else:
                dl.append(f"  %o{i} = {ty(o, b, h2)} reshape({ty(o * b, h2)} %{last})")
        ops = ", ".join(f"{ty(o, b, h2)} %o{i}" for i in range(n))
        dl.append(f"  %cat = {out_t} concatenate({ops}), dimensions={{1}}")
        droot = "cat"
    else:
        bl = [f"  %xm = {ty(o * s, h)} reshape({ty(o, s, h)} %x)", f"  %ym = {ty(o * s, h)} reshape({ty(o, s, h)} %y)"]
        xv = "xm"
        if defect == "reverse":
            bl.append(f"  %xr = {ty(o * s, h)} reverse({ty(o * s, h)} %xm), dimensions={{0}}")
            xv = "xr"
        bl.append(f"  %g = {ty(h, h)} dot({ty(o * s, h)} %{xv}, {ty(o * s, h)} %ym), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}")
        out_t, broot = ty(h, h), "g"
        dl = []
        for i in range(n):
            dl += blk("x", i, i) + blk("y", (i + 1) % n if defect == "cross" else i, i)
            xv = f"xm{i}"
            if defect == "reverse":
                dl.append(f"  %xr{i} = {ty(o * b, h)} reverse({ty(o * b, h)} %xm{i}), dimensions={{0}}")
                xv = f"xr{i}"
            dl.append(f"  %g{i} = {ty(h, h)} dot({ty(o * b, h)} %{xv}, {ty(o * b, h)} %ym{i}), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}")
        acc = "g0"
        for i in range(1, n):
            dl.append(f"  %acc{i} = {ty(h, h)} add({ty(h, h)} %{acc}, {ty(h, h)} %g{i})")
            acc = f"acc{i}"
        droot = acc
    base = f"HloModule mbs_base\n\n{red}ENTRY %main ({params}) -> {out_t} {{\n" + "\n".join(head + bl) + f"\n  ROOT %out = {out_t} copy({out_t} %{broot})\n}}\n"
    dist = f"HloModule mbs_dist\n\n{red}ENTRY %main ({params}) -> {out_t} {{\n" + "\n".join(head + dl) + f"\n  ROOT %out = {out_t} copy({out_t} %{droot})\n}}\n"
    rel = {"groups": groups, "inputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in range(3)],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    desc = f"{form}: {n} microbatches of {b} along dim 1 of {t}[{o},{s},{h}], dot {dot}, defect {defect}"
    return Program("mbstrided", desc, base, dist, rel)


def test_no_strided_microbatch_pair_that_differs_is_verified() -> None:
    pytest.importorskip("jax")
    rng = random.Random(f"mbstrided:{SEED}")
    judged = [judge(mbstrided(rng)) for _ in range(COUNT)]
    counts = tally(judged)
    print("mbstrided", dict(sorted(counts.items())))
    bad = [j for j in judged if j.unsound]
    assert not bad, "\n".join(f"{j.program.form}: {j.detail}\n--- baseline\n{j.program.baseline}--- distributed\n{j.program.distributed}" for j in bad)
    assert sum(v for k, v in counts.items() if k.startswith("verified/")) >= 2, counts
    assert sum(v for k, v in counts.items() if k.endswith("/differs")) >= 2, counts
    assert sum(v for k, v in counts.items() if k.endswith("/error")) <= COUNT // 6, [j.detail for j in judged if j.equal is None]
    # Both forms of the law are exercised: a forward and a contraction verify.
    forms = {j.program.form.split(":")[0] for j in judged if j.verdict == "verified"}
    assert forms == {"forward", "contract"}, counts
