"""Expand XLA's batch-norm instructions into the plain ops XLA's own BatchNormExpander writes.

torch-xla lowers ``torch.nn.LayerNorm`` to ``batch-norm-training`` (over a reshape that makes
the normalised rows the feature dim), its backward to ``batch-norm-grad``, and eval-mode norms to
``batch-norm-inference``. The analysis knows reductions and elementwise ops, so each batch-norm
becomes those, with the formulas of XLA's expander (operation semantics of BatchNormTraining /
BatchNormInference / BatchNormGrad), ``n`` = elements per feature (all dims but
``feature_index``), sums over all dims but ``feature_index``, ``·_b`` = broadcast along
``feature_index``:

- training(x, scale, offset) = (((x - mean_b) · rsqrt(var + eps)_b) · scale_b + offset_b,
  mean, var) with mean = sum(x) / n, var = sum(x·x) / n - mean·mean (E[x²] - E[x]², as XLA;
  XLA adds eps after broadcasting var, elementwise the same value).

Unit dims besides the feature dim are squeezed before and restored after (``_unsqueezed``):
torch-xla's LayerNorm reshapes (s, h) to (1, s, h), and the rows' own shapes are the ones a
sharded program writes. Both rewrites compute every element with the same operations on the
same values, so the result is bit-identical to XLA's expansion.
- inference(x, scale, offset, mean, var) = x · s_b + (offset - mean·s)_b, s = scale · rsqrt(var + eps).
- grad(x, scale, mean, var, dy) = (scale_b · rsqrt(var_b + eps) / n · ((dy·n - I2_b) -
  (x - mean_b) · I3_b / (var_b + eps)), I3 · rsqrt(var + eps), I2) with I2 = sum(dy),
  I3 = sum(dy · (x - mean_b)).

Like XLA, epsilon is the f32 attribute converted to the element type, and ``n`` is an s32
count converted to it (written as the literal when the convert is exact, ``_exact``), so bf16/f16/f64 programs round as the expanded program XLA runs. The
expansion is written as HLO text and read by the project's parser, so every new instruction
carries the same attrs/parsed forms as parsed ones; each takes the batch-norm's metadata (the
source line of the norm) and the tuple keeps the batch-norm's name, so ``get-tuple-element``
users resolve in ``normalize.split_tuples``.

Holds for every float element type (the only ones batch-norm admits); the expansion is exact
in the sense that XLA's CPU backend runs this same expansion for the original instruction.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace
from typing import NoReturn

from ..errors import HloParseError
from ..ir import Computation, Instruction, Module, Shape

BATCH_NORMS = frozenset({"batch-norm-training", "batch-norm-inference", "batch-norm-grad"})
FLOATS = frozenset({"f16", "bf16", "f32", "f64", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e5m2fnuz", "f8e4m3fnuz", "f8e4m3b11fnuz", "f8e3m4"})


def _ty(dtype: str, dims: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, dims))}]"


# Significand bits (with the implicit one) of the float types batch-norm admits.
_SIGNIFICAND = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53, "f8e4m3fn": 4, "f8e5m2": 3, "f8e4m3": 4, "f8e5m2fnuz": 3, "f8e4m3fnuz": 4, "f8e4m3b11fnuz": 4, "f8e3m4": 5}


def _exact(n: int, dtype: str) -> bool:
    """Whether the count n converts to ``dtype`` without rounding: then the literal n is the
    value XLA's convert(s32 n) gives, and it meets the same count written as a literal by the
    distributed program (a mean's divisor). Narrow types keep the convert (it may round)."""
    bits = _SIGNIFICAND.get(dtype)
    if bits is None or n <= 0 or dtype.startswith("f8"):
        return False
    odd = n >> ((n & -n).bit_length() - 1)  # n without its trailing zero bits
    return odd.bit_length() <= bits and n < 2 ** (bits + 16)


def _body(opcode: str, dtype: str, dims: tuple[int, ...], f: int, eps: str, reducer: str) -> list[str]:
    """Instruction lines of one expansion over parameters x, scale, ... (the operand order of
    ``opcode``); the last line is the tuple."""
    # Unit dims besides the feature dim (torch-xla's LayerNorm reshapes (s, h) to (1, s, h))
    # are squeezed away first and restored on the result: the same elements in the same
    # order, so the same values; the norm's ops then have the shapes of the rows themselves,
    # which a hidden- or token-sharded program writes too (its reductions, broadcasts).
    kept = [d for d in range(len(dims)) if d == f or dims[d] != 1]
    if len(kept) < len(dims) and len(kept) > 1:
        inner = _body(opcode, dtype, tuple(dims[d] for d in kept), kept.index(f), eps, reducer)
        return _unsqueezed(opcode, dtype, dims, tuple(dims[d] for d in kept), inner)
    X, F, S = _ty(dtype, dims), _ty(dtype, (dims[f],)), f"{dtype}[]"
    others = ",".join(str(d) for d in range(len(dims)) if d != f)
    n = 1
    for d, size in enumerate(dims):
        if d != f:
            n *= size
    lines = [
        f"eps.f32 = f32[] constant({eps})",
        f"eps = {S} convert(eps.f32)",
        *([f"n = {S} constant({n})"] if _exact(n, dtype) else [f"n.s32 = s32[] constant({n})", f"n = {S} convert(n.s32)"]),
        f"zero = {S} constant(0)",
        f"eps.x = {X} broadcast(eps), dimensions={{}}",
        f"n.f = {F} broadcast(n), dimensions={{}}",
    ]

    def red(name: str, of: str) -> str:
        return f"{name} = {F} reduce({of}, zero), dimensions={{{others}}}, to_apply=%{reducer}"

    def bc(name: str, of: str) -> str:
        return f"{name} = {X} broadcast({of}), dimensions={{{f}}}"

    if opcode == "batch-norm-training":
        lines += [
            red("sum", "x"),
            f"sq = {X} multiply(x, x)",
            red("sqsum", "sq"),
            f"mean = {F} divide(sum, n.f)",
            f"sqmean = {F} divide(sqsum, n.f)",
            f"mean2 = {F} multiply(mean, mean)",
            f"var = {F} subtract(sqmean, mean2)",
            bc("mean.x", "mean"), bc("scale.x", "scale"), bc("offset.x", "offset"),
            # rsqrt(var + eps) per feature, then broadcast: XLA adds eps after broadcasting var,
            # the same value per element; per feature is how norms are written (keepdim).
            f"eps.f = {F} broadcast(eps), dimensions={{}}",
            f"vareps.f = {F} add(var, eps.f)",
            f"rs.f = {F} rsqrt(vareps.f)",
            bc("rs", "rs.f"),
            f"xm = {X} subtract(x, mean.x)",
            f"norm = {X} multiply(xm, rs)",
            f"scaled = {X} multiply(norm, scale.x)",
            f"out = {X} add(scaled, offset.x)",
            f"ROOT t = ({X}, {F}, {F}) tuple(out, mean, var)",
        ]
    elif opcode == "batch-norm-inference":
        lines += [
            bc("mean.x", "mean"), bc("var.x", "var"), bc("scale.x", "scale"), bc("offset.x", "offset"),
            f"vareps = {X} add(var.x, eps.x)",
            f"rs = {X} rsqrt(vareps)",
            f"tscale = {X} multiply(scale.x, rs)",
            f"mscale = {X} multiply(mean.x, tscale)",
            f"tshift = {X} subtract(offset.x, mscale)",
            f"xs = {X} multiply(x, tscale)",
            f"ROOT out = {X} add(xs, tshift)",
        ]
    else:  # batch-norm-grad(x, scale, mean, var, dy)
        lines += [
            f"eps.f = {F} broadcast(eps), dimensions={{}}",
            f"n.x = {X} broadcast(n), dimensions={{}}",
            bc("mean.x", "mean"), bc("var.x", "var"), bc("scale.x", "scale"),
            f"vareps = {X} add(var.x, eps.x)",
            f"rs = {X} rsqrt(vareps)",
            f"vareps.f = {F} add(var, eps.f)",
            f"rs.f = {F} rsqrt(vareps.f)",
            f"xm = {X} subtract(x, mean.x)",
            f"dyxm = {X} multiply(dy, xm)",
            red("i3", "dyxm"),
            red("i2", "dy"),
            f"gscale = {F} multiply(i3, rs.f)",
            f"i1 = {X} multiply(dy, n.x)",
            bc("i2.x", "i2"), bc("i3.x", "i3"),
            f"i4 = {X} multiply(xm, i3.x)",
            f"i5 = {X} divide(i4, vareps)",
            f"i12 = {X} subtract(i1, i2.x)",
            f"i6 = {X} subtract(i12, i5)",
            f"srs = {X} multiply(scale.x, rs)",
            f"srsn = {X} divide(srs, n.x)",
            f"gx = {X} multiply(srsn, i6)",
            f"ROOT t = ({X}, {F}, {F}) tuple(gx, gscale, i2)",
        ]
    return lines


def _unsqueezed(opcode: str, dtype: str, dims: tuple[int, ...], small: tuple[int, ...], inner: list[str]) -> list[str]:
    """``inner`` (the expansion at the squeezed shape ``small``) over squeezed x (and dy),
    its X-shaped result reshaped back to ``dims``."""
    X, XS = _ty(dtype, dims), _ty(dtype, small)
    shaped = ("x", "dy") if opcode == "batch-norm-grad" else ("x",)
    ref = re.compile(r"(?<![\w.])(" + "|".join(shaped) + r")(?![\w.])")
    lines = [f"{p}.s = {XS} reshape({p})" for p in shaped]
    for line in inner[:-1]:
        name, rhs = line.split(" = ", 1)
        op_at = rhs.index("(")
        close = rhs.index(")", op_at)
        lines.append(f"{name} = {rhs[:op_at]}{ref.sub(lambda m: m.group(1) + '.s', rhs[op_at:close])}{rhs[close:]}")
    root = inner[-1]
    if opcode == "batch-norm-inference":  # ROOT out = XS add(xs, tshift)
        lines.append(root.replace("ROOT out = ", "out.s = ", 1))
        lines.append(f"ROOT out = {X} reshape(out.s)")
        return lines
    first = "out" if opcode == "batch-norm-training" else "gx"  # ROOT t = (XS, F, F) tuple(first, ...)
    lines.append(f"{first}.r = {X} reshape({first})")
    lines.append(root.replace(f"({XS},", f"({X},", 1).replace(f"tuple({first},", f"tuple({first}.r,", 1))
    return lines


_PARAMS = {
    "batch-norm-training": ("x", "scale", "offset"),
    "batch-norm-inference": ("x", "scale", "offset", "mean", "var"),
    "batch-norm-grad": ("x", "scale", "mean", "var", "dy"),
}


def _expand(ins: Instruction, by: dict[str, Instruction], reducer: str) -> tuple[list[Instruction], str]:
    """The instructions replacing ``ins`` (the last one named ``ins.name``) and the element type."""
    from .parser import parse_hlo  # parser imports nothing of normalize; late import avoids a cycle

    def fail(message: str) -> NoReturn:
        loc = ins.loc
        raise HloParseError(loc.path if loc else "<hlo>", loc.line if loc else 0, loc.column if loc else 0, f"%{ins.name}: {message}")

    x = by[ins.operands[0]].shape
    if x.is_tuple or x.dtype not in FLOATS:
        fail(f"{ins.opcode} of {x}: XLA admits only float arrays")
    if len(ins.operands) != len(_PARAMS[ins.opcode]):
        fail(f"{ins.opcode} takes {len(_PARAMS[ins.opcode])} operands, got {len(ins.operands)}")
    try:
        f = int(ins.attrs["feature_index"])
        eps = float(ins.attrs.get("epsilon", "0"))
    except (KeyError, ValueError) as e:
        fail(f"{ins.opcode} needs an integer feature_index and a float epsilon ({e!r})")
    if not 0 <= f < x.rank:
        fail(f"{ins.opcode} feature_index={f} outside the operand's {x.rank} dims")
    dt = x.dtype
    params = []
    for k, p in enumerate(_PARAMS[ins.opcode]):
        shp = by[ins.operands[k]].shape
        params.append(f"{p} = {_ty(shp.dtype, shp.dims)} parameter({k})")
    text = "\n".join([
        "HloModule bn",
        f"{reducer} {{\na = {dt}[] parameter(0)\nb = {dt}[] parameter(1)\nROOT s = {dt}[] add(a, b)\n}}",
        "ENTRY e {", *params, *_body(ins.opcode, dt, x.dims, f, repr(eps), reducer), "}",
    ])
    parsed = parse_hlo(text, f"<{ins.opcode} expansion>")
    rename = {p: ins.operands[k] for k, p in enumerate(_PARAMS[ins.opcode])}
    out: list[Instruction] = []
    for new in parsed.entry.instructions:
        if new.opcode == "parameter":
            continue
        rename[new.name] = ins.name if new.is_root else f"{ins.name}.bn.{new.name}"
    for new in parsed.entry.instructions:
        if new.opcode == "parameter":
            continue
        out.append(replace(new, name=rename[new.name], operands=[rename[o] for o in new.operands],
                           metadata=ins.metadata, loc=ins.loc, is_root=ins.is_root and new.is_root,
                           origin=ins.origin or ins.name))
    return out, dt


def expand_batch_norms(module: Module) -> Module:
    """A new module whose entry has every batch-norm expanded (the input is not changed)."""
    entry = module.entry
    if not any(i.opcode in BATCH_NORMS for i in entry.instructions):
        return module
    by = {i.name: i for i in entry.instructions}
    module = copy.copy(module)
    module.computations = dict(module.computations)
    out: list[Instruction] = []
    for ins in entry.instructions:
        if ins.opcode not in BATCH_NORMS:
            out.append(ins)
            continue
        dt = by[ins.operands[0]].shape.dtype if ins.operands and ins.operands[0] in by else "?"
        reducer = f"batch_norm.add.{dt}"
        new, dt = _expand(ins, by, reducer)
        if reducer not in module.computations:
            a, b = (Instruction(f"{reducer}.{p}", "parameter", Shape(dt), [], parameter_number=k) for k, p in enumerate("ab"))
            s = Instruction(f"{reducer}.s", "add", Shape(dt), [a.name, b.name], is_root=True)
            module.computations = {reducer: Computation(reducer, [a, b, s]), **module.computations}
        out.extend(new)
    module.computations[module.entry_name] = Computation(entry.name, out, entry.is_entry, entry.loc)
    return module
