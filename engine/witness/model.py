"""The programs in the float model of ``verified`` (README, Semantics), for the rounding recheck.

``verified`` promises equality with every sum's reassociation taken as exact, each op computed
in its written dtype otherwise, and every written change of precision (a lossy ``convert``) a
rounding. Executed as written, two verified programs still differ by the rounding of their two
summation orders, and a long computation can amplify that past any fixed tolerance. Two texts
tell the two apart, on both programs alike:

- ``model_text``: every f32 value computed in f64 (f32 rounding, including the reassociated f32
  sums, drops ~2^29-fold), while every *written* rounding stays a rounding: a lossy convert into
  f32 (f64->f32, s32->f32, ...) becomes the same convert followed by an exact f32->f64 one, and
  an f32 constant keeps its f32 value. So a value sent through f32 on one side only still
  differs (the earlier recheck, which widened the convert away, had to be skipped for any
  program with an f64->f32 convert - torch's ``masked_fill`` writes one for its -FLT_MAX
  constant - which left every f32 training step unrecheckable). bf16/f16 ops stay as written:
  an op computing in bf16 where the baseline computes in f32 is a precision change, not noise.
- ``perturbed_sums``: the same text with the summation order of every bf16/f16 sum (a reduce
  whose combiner is ``add``, a dot's contraction) changed, reversed or rotated along the summed
  dims. The baseline so perturbed is another program ``verified`` counts equal to it; how far it
  moves an output is the scale of the rounding of low-precision sums that output carries.
"""

from __future__ import annotations

import re

# Widened to f64 in the model. bf16/f16/f8 stay (see the module docstring).
_WIDE_FROM = "f32"
_WIDE = re.compile(r"\bf32\[")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([a-z][a-z0-9]*)\[", re.MULTILINE)
_SHAPE = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{[^}]*\})?\s", re.MULTILINE)
# An operand as XLA prints it: ``%name`` (canonical text) or ``f32[4]{0} %name``.
_OPND = r"(?:[a-z][a-z0-9]*\[[0-9,]*\](?:\{[^}]*\})?\s+)?%([\w.\-]+)"
_CONVERT = re.compile(r"^(\s*)(ROOT\s+)?%([\w.\-]+)\s*=\s*f32(\[[0-9,]*\](?:\{[^}]*\})?)\s+convert\(" + _OPND + r"\)(.*)$")
_CONSTANT = re.compile(r"^(\s*)(ROOT\s+)?%([\w.\-]+)\s*=\s*f32(\[[0-9,]*\](?:\{[^}]*\})?)\s+constant\((.*)$")
# Ops whose meaning depends on the bit width of a float type: the widened text would compute
# something else (or not compile), so there is no model text.
_BIT_LEVEL = re.compile(r"\s(?:bitcast-convert|custom-call|rng-bit-generator)\(")


def model_text(text: str) -> str | None:
    """``text`` (XLA's printing, one instruction per line) in the model: see the module
    docstring. None when the text has an op the widening would change the meaning of."""
    from .pair import convert_is_exact  # (pair imports this module)

    if _BIT_LEVEL.search(text):
        return None
    types = dict(_DEF.findall(text))
    out = []
    for line in text.split("\n"):
        m = _CONVERT.match(line)
        if m and not convert_is_exact(types.get(m.group(5), "?"), _WIDE_FROM):
            ind, root, name, shape, opnd, rest = m.groups()
            out.append(f"{ind}%{name}.model.round = f32{shape} convert(%{opnd}){rest}")
            out.append(f"{ind}{root or ''}%{name} = f64{shape} convert(f32{shape} %{name}.model.round)")
            continue
        m = _CONSTANT.match(line)
        if m:
            ind, root, name, shape, rest = m.groups()
            out.append(f"{ind}%{name}.model.round = f32{shape} constant({rest}")
            out.append(f"{ind}{root or ''}%{name} = f64{shape} convert(f32{shape} %{name}.model.round)")
            continue
        out.append(_WIDE.sub("f64[", line))
    return "\n".join(out)


_LOW = ("bf16", "f16")
_REDUCE = re.compile(r"^(\s*)(ROOT\s+)?%([\w.\-]+)\s*=\s*(" + "|".join(_LOW) + r")(\[[0-9,]*\](?:\{[^}]*\})?)\s+reduce\(" + _OPND + r",\s*" + _OPND + r"\),\s*dimensions=\{([0-9,]+)\},\s*to_apply=%([\w.\-]+)(.*)$")
_DOT = re.compile(r"^(\s*)(ROOT\s+)?%([\w.\-]+)\s*=\s*(" + "|".join(_LOW) + r")(\[[0-9,]*\](?:\{[^}]*\})?)\s+dot\(" + _OPND + r",\s*" + _OPND + r"\)(.*)$")
# A two-parameter computation whose root adds them: a reduce with it sums.
_ADDER = re.compile(r"^%?([\w.\-]+)\s.*\{\n\s*%?[\w.\-]+\s*=\s*\S+\s+parameter\([01]\)[^\n]*\n\s*%?[\w.\-]+\s*=\s*\S+\s+parameter\([01]\)[^\n]*\n\s*ROOT\s+%?[\w.\-]+\s*=\s*\S+\s+add\(", re.MULTILINE)
VARIANTS = 3


def _reorder(ind: str, name: str, opnd: str, dtype: str, dims: list[int], along: list[int], variant: int) -> tuple[list[str], str]:
    """Lines computing ``opnd`` with its elements along ``along`` reordered (variant 0: reversed;
    1: rotated by half the first summed dim; 2: reversed and rotated by a third), and the name."""
    lines: list[str] = []
    cur = opnd
    shape = f"{dtype}[{','.join(map(str, dims))}]"
    if variant in (0, 2):
        lines.append(f"{ind}%{name}.rev = {shape} reverse(%{cur}), dimensions={{{','.join(map(str, along))}}}")
        cur = f"{name}.rev"
    if variant in (1, 2):
        d = along[0]
        k = dims[d] // (2 if variant == 1 else 3)
        if 0 < k < dims[d]:
            def part(lo: int, hi: int) -> str:
                return ", ".join(f"[{lo}:{hi}]" if i == d else f"[0:{n}]" for i, n in enumerate(dims))

            a = [n if i != d else dims[d] - k for i, n in enumerate(dims)]
            b = [n if i != d else k for i, n in enumerate(dims)]
            lines.append(f"{ind}%{name}.hi = {dtype}[{','.join(map(str, a))}] slice(%{cur}), slice={{{part(k, dims[d])}}}")
            lines.append(f"{ind}%{name}.lo = {dtype}[{','.join(map(str, b))}] slice(%{cur}), slice={{{part(0, k)}}}")
            lines.append(f"{ind}%{name}.rot = {shape} concatenate(%{name}.hi, %{name}.lo), dimensions={{{d}}}")
            cur = f"{name}.rot"
    return lines, cur


def perturbed_sums(text: str, variant: int) -> str | None:
    """``text`` with every bf16/f16 sum in another summation order (``variant`` < VARIANTS);
    None when it has no such sum (its outputs carry no low-precision summation noise)."""
    shapes = {n: (t, [int(x) for x in d.split(",") if x]) for n, t, d in _SHAPE.findall(text)}
    adders = set(_ADDER.findall(text))
    out: list[str] = []
    changed = False
    for line in text.split("\n"):
        m = _REDUCE.match(line)
        if m and m.group(9) in adders and m.group(6) in shapes:
            ind, root, name, dt, shape, opnd, init, dims, comp, rest = m.groups()
            t, ds = shapes[opnd]
            pre, cur = _reorder(ind, f"{name}.perturb", opnd, t, ds, [int(x) for x in dims.split(",")], variant)
            out += pre
            out.append(f"{ind}{root or ''}%{name} = {dt}{shape} reduce(%{cur}, %{init}), dimensions={{{dims}}}, to_apply=%{comp}{rest}")
            changed = True
            continue
        m = _DOT.match(line)
        if m and m.group(6) in shapes and m.group(7) in shapes:
            ind, root, name, dt, shape, lhs, rhs, rest = m.groups()
            lc = re.search(r"lhs_contracting_dims=\{([0-9,]+)\}", rest)
            rc = re.search(r"rhs_contracting_dims=\{([0-9,]+)\}", rest)
            if lc and rc:
                # The same reordering of the contracted elements on both operands.
                pl, cl = _reorder(ind, f"{name}.perturb.l", lhs, *shapes[lhs], [int(x) for x in lc.group(1).split(",")], variant)
                pr, cr = _reorder(ind, f"{name}.perturb.r", rhs, *shapes[rhs], [int(x) for x in rc.group(1).split(",")], variant)
                out += pl + pr
                out.append(f"{ind}{root or ''}%{name} = {dt}{shape} dot(%{cl}, %{cr}){rest}")
                changed = True
                continue
        out.append(line)
    return "\n".join(out) if changed else None
