"""Literals are read exactly (engine/hlo/literals.py): integers as integers of their type, floats
bit-exactly as values of their type; a literal that is no value of its type is a located bad-input
error; values egglog's i64 column cannot hold stay opaque instead of crashing the fact load; and
the value ranges that let a bounded float->int convert through (engine/analysis/ranges.py)."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.graph import build
from shardproof.engine.analysis.ranges import Ranges, fits_int
from shardproof.engine.analysis.verify import verify
from shardproof.engine.errors import HloParseError
from shardproof.engine.hlo.literals import LiteralError, read_scalar, round_to
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

PAIRS = Path(__file__).parent / "pairs"
F32_MAX = float.fromhex("0x1.fffffep127")


def _bits32(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


@pytest.mark.parametrize(
    ("dtype", "text", "value"),
    [
        ("s64", "9223372036854775807", 2**63 - 1),
        ("s64", "-9223372036854775808", -(2**63)),
        ("u64", "18446744073709551615", 2**64 - 1),
        ("s64", "9007199254740993", 2**53 + 1),  # not a double: read as the integer it is
        ("s8", "-128", -128),
        ("u8", "255", 255),
        ("s32", "0x7fffffff", 2**31 - 1),
        ("pred", "true", True),
        ("f32", "-3.40282347e+38", -F32_MAX),  # torch's lowest f32, exactly the type's lowest
        ("f32", "3.4028235e+38", F32_MAX),
        ("f32", "1e39", math.inf),  # beyond the largest f32 after rounding
        ("f32", "1e-45", 2.0**-149),  # the smallest denormal, from decimal ...
        ("f32", "0x1p-149", 2.0**-149),  # ... and from a hex float
        ("f32", "5e-324", 0.0),  # an f64 denormal is 0 in f32
        ("f64", "5e-324", 5e-324),
        ("f32", "9007199254740993", 2.0**53),  # rounded to f32 (and to double first, as XLA does)
        ("f16", "65504", 65504.0),
        ("f16", "65520", math.inf),  # halfway to 2^16: ties to even, which overflows
        ("bf16", "-3.38953139e+38", -float.fromhex("0x1.fep127")),
        ("bf16", "1.00390625", 1.0),  # halfway between bf16 1 and 1 + 2^-7: ties to even
        ("f32", "-inf", -math.inf),
        ("f32", "0x1.8p3", 12.0),
    ],
)
def test_scalars_read_exactly(dtype: str, text: str, value: object) -> None:
    got = read_scalar(dtype, text)
    assert got == value and type(got) is type(value)


def test_signed_zero_and_nan_keep_their_bits() -> None:
    z = read_scalar("f32", "-0")
    assert z == 0 and math.copysign(1.0, z) == -1.0  # type: ignore[arg-type]
    for text in ("nan", "-nan", "nan(0x7fc00001)", "NaN"):
        v = read_scalar("f32", text)
        assert isinstance(v, float) and math.isnan(v)
    assert _bits32(round_to("f32", 2.0**-149)) == 1  # denormals stay denormal


@pytest.mark.parametrize(
    ("dtype", "text"),
    [("s8", "128"), ("u8", "-1"), ("s64", "9223372036854775808"), ("u64", "18446744073709551616"), ("s32", "1.5"), ("s32", "inf"), ("pred", "2"), ("f32", "abc")],
)
def test_values_outside_the_type_are_refused(dtype: str, text: str) -> None:
    with pytest.raises(LiteralError):
        read_scalar(dtype, text)


def test_the_parser_locates_an_out_of_range_literal() -> None:
    text = "HloModule m\n\nENTRY %e () -> s8[] {\n  ROOT %c = s8[] constant(300)\n}\n"
    with pytest.raises(HloParseError) as err:
        parse_hlo(text, "m.hlo")
    assert err.value.line == 4 and "out of range for s8" in err.value.message


def _rows(hlo_body: str, c: int = 2) -> dict[str, list[tuple[object, ...]]]:
    text = "HloModule m\n\nENTRY %e (p: s64[]) -> s64[] {\n  %p = s64[] parameter(0)\n" + hlo_body + "}\n"
    spec = parse_relations({"groups": [list(range(c))], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}, "r.yaml")
    m = normalize(parse_hlo(text, "m.hlo"))
    return build(spec, m, m, set()).rows


def test_int64_max_is_an_exact_egglog_integer_and_u64_max_stays_opaque() -> None:
    rows = _rows(
        "  %a = s64[] constant(9223372036854775807)\n  %b = u64[] constant(18446744073709551615)\n"
        "  %x = u64[] convert(%p)\n  %y = u64[] add(%x, %b)\n  %z = s64[] convert(%y)\n  ROOT %r = s64[] add(%z, %a)\n"
    )
    ints = {v for _, v in rows["litint"]}
    assert 2**63 - 1 in ints and 2**64 - 1 not in ints
    idents = {(k.split("|")[1], op) for k, op in rows["identlit"]}
    assert ("s64[]", "min") in idents and ("u64[]", "min") in idents  # int max: identity of min


def test_identities_compare_exact_values() -> None:
    rows = _rows(
        "  %a = f32[] constant(-3.40282347e+38)\n  %b = f32[] constant(-3.4028e+38)\n  %c = s64[] constant(-9223372036854775808)\n"
        "  %d = bf16[] constant(-3.38953139e+38)\n  ROOT %r = (s64[], f32[], f32[], bf16[]) tuple(%c, %a, %b, %d)\n"
    )
    idents = {(k.split("|", 2)[2], op) for k, op in rows["identlit"]}
    assert ("-3.40282347e+38", "max") in idents  # the lowest f32 itself
    assert not any(lit == "-3.4028e+38" for lit, _ in idents)  # close to it is not it
    assert ("-9223372036854775808", "max") in idents
    assert ("-3.38953139e+38", "max") in idents


def test_the_int64_max_argmin_repro_verifies() -> None:
    """torch-xla's amin on int64 (argmin over the gathered candidates of a vocab-parallel
    argmax) starts from constant(9223372036854775807): once read through a double as 2^63, it
    broke egglog's fact load (EggSmolError: Incorrect format in file 'litint.N.tsv')."""
    d = PAIRS / "greedy_argmax_gather_tp4"
    dist = (d / "distributed.hlo").read_text()
    assert re.search(r"s64\[\] constant\(9223372036854775807\).*\n.*reduce\(s64\[8,4\]", dist)
    result = verify(parse_relations(yaml.safe_load((d / "relations.yaml").read_text()), "r.yaml"), parse_hlo((d / "baseline.hlo").read_text()), parse_hlo(dist))
    assert result.verdict == "verified", result.reason


def _t5(name: str = "t5_relative_bias_tp4") -> tuple[str, str, dict]:
    d = PAIRS / name
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


def test_bounded_float_to_int_convert_verifies() -> None:
    base, dist, rel = _t5()
    assert "s64[8,8]{1,0} convert(f32[8,8]" in dist
    result = verify(parse_relations(rel, "r.yaml"), parse_hlo(base), parse_hlo(dist))
    assert result.verdict == "verified", result.reason


def _t5_unclamped() -> tuple[str, str, dict]:
    base, dist, rel = _t5()
    pattern = r"convert\(s64\[8,8\]\{1,0\} %clamp\.\d+\)"
    unclamped = [re.sub(pattern, lambda _m, t=t: "convert(s64[8,8]{1,0} %" + re.search(r"%(abs\.\d+) = s64\[8,8\]", t).group(1) + ")", t) for t in (base, dist)]  # type: ignore[union-attr]
    assert all(u != t for u, t in zip(unclamped, (base, dist), strict=True))
    return unclamped[0], unclamped[1], rel


def test_unbounded_float_to_int_convert_guarded_by_where_verifies() -> None:
    """Without the clamp (HF T5 as written) the log sees 0: -inf reaches the convert, whose
    result is implementation-defined there; but only where rel < max_exact, where
    `where(is_small, rel, large)` keeps rel: the convert's every use flows into that select's
    other branch, and on the elements it keeps (rel >= 2) the operand is in range
    (analysis.ranges.guarded_fits_int). So the model as written is proven."""
    base, dist, rel = _t5_unclamped()
    result = verify(parse_relations(rel, "r.yaml"), parse_hlo(base), parse_hlo(dist))
    assert result.verdict == "verified", result.reason


def test_unbounded_float_to_int_convert_with_a_guard_that_keeps_it_stays_unsupported() -> None:
    """The same with the guard turned around (is_small = rel > max_exact): the convert's -inf at
    rel = 0 is kept, so no proof."""
    base, dist, rel = _t5_unclamped()
    turned = [re.sub(r"(compare\(s64\[8,8\]\{1,0\} %abs\.\d+, s64\[8,8\]\{1,0\} %broadcast\.\d+\)), direction=LT", r"\1, direction=GT", t) for t in (base, dist)]
    assert all(u != t for u, t in zip(turned, (base, dist), strict=True))
    result = verify(parse_relations(rel, "r.yaml"), parse_hlo(turned[0]), parse_hlo(turned[1]))
    assert result.verdict == "unsupported"
    assert any("convert f32->s64" in u["reason"] for u in result.unsupported), result.unsupported


def _range_of(body: str, name: str) -> tuple[float, float]:
    m = parse_hlo("HloModule m\n\nENTRY %e (p: s32[], q: f32[4]) -> f32[] {\n  %p = s32[] parameter(0)\n  %q = f32[4] parameter(1)\n" + body + "}\n", "m.hlo")
    r = Ranges(m)
    return r.of(m.entry.get(name))  # type: ignore[arg-type]


def test_ranges() -> None:
    lo, hi = _range_of("  %f = f32[] convert(%p)\n  %c = f32[] constant(2)\n  ROOT %d = f32[] divide(%f, %c)\n", "d")
    assert lo <= -(2.0**30) and hi >= 2.0**30 and hi < 2.0**31
    lo, hi = _range_of("  %l = f32[4] log(%q)\n  %a = f32[] constant(-8)\n  %b = f32[] constant(8)\n  %ab = f32[4] broadcast(%a), dimensions={}\n  %bb = f32[4] broadcast(%b), dimensions={}\n  ROOT %k = f32[4] clamp(%ab, %l, %bb)\n", "k")
    assert -8.001 < lo <= -8 and 8 <= hi < 8.001
    assert _range_of("  %l = f32[4] log(%q)\n  ROOT %n = f32[4] negate(%l)\n", "n") == (-math.inf, math.inf)
    # clamp bounds are ranges too: clamp(0, 5, hi) for hi in [0, 2^31) is min(5, hi), in [0, 5]
    body = "  %z = s32[] constant(0)\n  %f = s32[] constant(5)\n  %h = s32[] and(%p, %p)\n  %m = s32[] constant(2147483647)\n  %g = s32[] and(%h, %m)\n"
    assert _range_of(body + "  ROOT %k = s32[] clamp(%z, %f, %m)\n", "k") == (5, 5)
    assert _range_of(body + "  %a = s32[] abs(%g)\n  %c = s32[] clamp(%z, %a, %a)\n  ROOT %k = s32[] clamp(%z, %f, %c)\n", "k")[0] <= 0
    # an s32 abs may wrap (abs(INT_MIN) = INT_MIN): the whole type
    assert _range_of("  ROOT %a = s32[] abs(%p)\n", "a") == (-(2**31), 2**31 - 1)


def test_fits_int_needs_the_truncated_value_in_the_type() -> None:
    m = parse_hlo("HloModule m\n\nENTRY %e (p: s32[]) -> s32[] {\n  %p = s32[] parameter(0)\n  %f = f32[] convert(%p)\n  %h = f64[] convert(%p)\n  ROOT %r = s32[] convert(%f)\n}\n", "m.hlo")
    r = Ranges(m)
    f, h = m.entry.get("f"), m.entry.get("h")
    assert not fits_int(r, f, "s32")  # type: ignore[arg-type]  # f32(2^31 - 1) = 2^31
    assert fits_int(r, h, "s32")  # type: ignore[arg-type]  # f64 holds every s32
    assert fits_int(r, f, "s64") and not fits_int(r, f, "u32")  # type: ignore[arg-type]
