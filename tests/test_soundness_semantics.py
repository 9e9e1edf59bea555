"""The other side of the soundness fixes of issue 12 (tests/soundness_regressions holds the
holes): what each fix must still prove, and the attribute and literal cases no numeric oracle on
CPU can tell apart (an elided constant, a dot's precision on TPU, a broken gather promise).

Each pair is checked by the verifier; where it claims `verified`, XLA's CPU runtime (the
numeric oracle) must agree on random inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

REGRESSIONS = Path(__file__).parent / "soundness_regressions"


def _check(base: str, dist: str, relations: dict[str, Any], *, numeric: bool = True) -> Any:
    result = verify(parse_relations(relations), parse_hlo(base, "baseline.hlo"), parse_hlo(dist, "distributed.hlo"))
    if numeric and result.verdict == "verified":
        oracle = pytest.importorskip("oracle")
        for seed in range(3):
            run = oracle.run_pair(base, dist, relations, seed=seed)
            assert run.equal, run.summary()
    return result


def _case(name: str) -> tuple[str, str, dict[str, Any]]:
    d = REGRESSIONS / name
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


# -- integer partial max/min through add / subtract ------------------------------------------


@pytest.mark.parametrize(
    ("b", "op", "verified"),
    [
        # x (the maximum of the pieces) lies in [-3, 3), so every piece is <= 2; a piece may be
        # as low as the type allows. max_r(a_r + b) moves for b >= 0 while 2 + b fits.
        ("2147483647", "add", False),  # 2 + INT32_MAX wraps (the regression)
        ("2147483646", "add", False),  # 2 + (INT32_MAX - 1) wraps
        ("2147483645", "add", True),  # 2 + (INT32_MAX - 2) = INT32_MAX fits
        ("5", "add", True),
        ("-5", "add", False),  # a piece at INT32_MIN + 1 wraps
        ("-5", "subtract", True),  # a_r - (-5) >= a_r, and 2 + 5 fits
        ("5", "subtract", False),  # a piece at INT32_MIN + 1 wraps
        ("-2147483645", "subtract", True),  # 2 + (INT32_MAX - 2) fits
        ("-2147483646", "subtract", False),
    ],
)
def test_integer_partial_max_moves_only_where_no_add_wraps(b: str, op: str, verified: bool) -> None:
    base, dist, rel = _case("s32_partial_max_through_wrapping_add")
    base = base.replace("2147483647", b).replace("add(%x, %bb)", f"{op}(%x, %bb)")
    dist = dist.replace("2147483647", b).replace("add(%x, %bb)", f"{op}(%x, %bb)")
    assert (_check(base, dist, rel).verdict == "verified") == verified


@pytest.mark.parametrize(
    ("b_range", "verified"),
    [
        ([-100, 1], True),  # b <= 0: a_r + b >= x + b >= -103 for a min, no piece can wrap
        ([0, 100], False),  # a piece above x (a min) may be INT32_MAX: + b wraps
        (None, False),  # b unbounded
    ],
)
def test_integer_partial_min_through_add_of_a_bounded_input(b_range: list[int] | None, verified: bool) -> None:
    base, dist, rel = _case("s32_partial_max_through_wrapping_add")
    # b is an input, identical on every rank: bounded by its int_range, or not at all.
    for text in (base, dist):
        assert "%big = s32[] constant(2147483647)" in text
    base = base.replace("(x: s32[8])", "(x: s32[8], b: s32[])").replace("%big = s32[] constant(2147483647)", "%big = s32[] parameter(1)")
    dist = dist.replace("(x: s32[8])", "(x: s32[8], b: s32[])").replace("%big = s32[] constant(2147483647)", "%big = s32[] parameter(1)")
    dist = dist.replace("maximum(%a, %b)", "minimum(%a, %b)")
    rel["inputs"][0]["op"] = "min"
    b = {"baseline": 1, "distributed": 1, "relation": "duplicate", **({"int_range": b_range} if b_range else {})}
    assert (_check(base, dist, {**rel, "inputs": [*rel["inputs"], b]}).verdict == "verified") == verified


def test_float_partial_max_still_moves_through_add() -> None:
    base, dist, rel = _case("s32_partial_max_through_wrapping_add")
    base, dist = (t.replace("s32", "f32").replace("2147483647", "1e30") for t in (base, dist))
    rel["inputs"][0].pop("int_range")
    assert _check(base, dist, rel).verdict == "verified"


# -- sort stability ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_attr", "dist_attr", "verified"),
    [
        (", is_stable=true", ", is_stable=true", True),
        ("", "", True),
        (", is_stable=false", "", True),  # the default written out is the same sort
        (", is_stable=true", "", False),  # the regression
        ("", ", is_stable=true", False),
    ],
)
def test_sort_stability_counts(base_attr: str, dist_attr: str, verified: bool) -> None:
    base, dist, rel = _case("sort_stability_ignored")
    base = base.replace(", is_stable=true", base_attr)
    dist = dist.replace("dimensions={0}, to_apply", f"dimensions={{0}}{dist_attr}, to_apply")
    assert (_check(base, dist, rel, numeric=False).verdict == "verified") == verified


# -- attributes that were value-neutral -------------------------------------------------------

_DOT = """HloModule m
ENTRY %main (a: f32[4,8], b: f32[8,4]) -> f32[4,4] {{
  %a = f32[4,8] parameter(0)
  %b = f32[8,4] parameter(1)
  ROOT %d = f32[4,4] dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}{attr}
}}
"""
_DUP2 = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}, {"baseline": 1, "distributed": 1, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}


@pytest.mark.parametrize(
    ("base_attr", "dist_attr", "verified"),
    [
        ("", ", operand_precision={default,default}", True),
        (", operand_precision={highest,highest}", ", operand_precision={highest,highest}", True),
        # DEFAULT is a one-pass bf16 product on TPU: a rounding, like a convert to bf16.
        (", operand_precision={highest,highest}", "", False),
    ],
)
def test_dot_precision_counts(base_attr: str, dist_attr: str, verified: bool) -> None:
    result = _check(_DOT.format(attr=base_attr), _DOT.format(attr=dist_attr), _DUP2, numeric=False)
    assert (result.verdict == "verified") == verified


_GATHER = """HloModule m
ENTRY %main (t: f32[16,4], i: s32[6,1]) -> f32[6,4] {{
  %t = f32[16,4] parameter(0)
  %i = s32[6,1] parameter(1)
  ROOT %g = f32[6,4] gather(%t, %i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,4}}{attr}
}}
"""


@pytest.mark.parametrize(
    ("base_attr", "dist_attr", "verified"),
    [
        ("", ", indices_are_sorted=false", True),
        (", indices_are_sorted=true", ", indices_are_sorted=true", True),
        # A promise: indices that break it make the result implementation-defined.
        ("", ", indices_are_sorted=true", False),
        ("", ", unique_indices=true", False),
    ],
)
def test_gather_promises_count(base_attr: str, dist_attr: str, verified: bool) -> None:
    result = _check(_GATHER.format(attr=base_attr), _GATHER.format(attr=dist_attr), _DUP2, numeric=False)
    assert (result.verdict == "verified") == verified


# -- elided literals --------------------------------------------------------------------------


def test_an_elided_constant_is_unknown_and_the_reason_says_how_to_dump_it() -> None:
    base, _dist, rel = _case("elided_constants_differ")
    # The same text on both sides is still no proof: {...} may hold any values.
    result = _check(base, base.replace("cosine_scale_baseline", "cosine_scale_distributed"), rel, numeric=False)
    assert result.verdict == "unsupported"
    assert {(u["side"], u["instruction"]) for u in result.unsupported} == {("baseline", "steps"), ("distributed", "steps")}
    for hint in ("--xla_dump_large_constants", "print_large_constants=True", "shardproof build"):
        assert hint in result.reason
    assert not result.divergences  # no divergence is claimed from values nobody has


def test_an_elided_constant_no_output_needs_stops_nothing() -> None:
    base, dist, rel = _case("elided_constants_differ")
    # The table only feeds a second output that is not checked: the first is still proven.
    base = base.replace("-> f32[4,16]", "-> (f32[4,16], f32[4,16])").replace("ROOT %y = f32[4,16] multiply(%x, %cb)", "%y = f32[4,16] multiply(%x, %cb)\n  %z = f32[4,16] add(%x, %x)\n  ROOT %t = (f32[4,16], f32[4,16]) tuple(%z, %y)")
    dist = dist.replace("-> f32[4,16]", "-> (f32[4,16], f32[4,16])").replace("ROOT %y = f32[4,16] multiply(%x, %cb)", "%y = f32[4,16] multiply(%x, %cb)\n  %z = f32[4,16] add(%x, %x)\n  ROOT %t = (f32[4,16], f32[4,16]) tuple(%z, %y)")
    assert _check(base, dist, rel, numeric=False).verdict == "verified"
    both = {**rel, "outputs": [*rel["outputs"], {"baseline": 1, "distributed": 1, "relation": "duplicate"}]}
    assert _check(base, dist, both, numeric=False).verdict == "unsupported"


def test_an_elided_constant_in_a_called_computation_is_unsupported() -> None:
    text = """HloModule m
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %t = f32[12] constant({...})
  %s = f32[1] slice(%t), slice={[0:1]}
  %r = f32[] reshape(%s)
  %ab = f32[] add(%a, %b)
  ROOT %c = f32[] add(%ab, %r)
}

ENTRY %main (x: f32[8]) -> f32[] {
  %x = f32[8] parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[] reduce(%x, %z), dimensions={0}, to_apply=%add
}
"""
    rel = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    result = _check(text, text, rel, numeric=False)
    assert result.verdict == "unsupported"
    assert "%add" in result.reason and "{...}" in result.reason


# -- the float model --------------------------------------------------------------------------

_SUM_SHIFTED = """HloModule m
%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}}
ENTRY %main (x: f32[{n}]) -> f32[] {{
  %x = f32[{n}] parameter(0)
  %k = f32[] constant(262144)
  %kb = f32[{n}] broadcast(%k), dimensions={{}}
  %y = f32[{n}] add(%x, %kb)
  %z = f32[] constant(0)
  %s = f32[] reduce(%y, %z), dimensions={{0}}, to_apply=%add
  {allreduce}
  %m = f32[] constant(16777216)
  ROOT %r = f32[] subtract(%t, %m)
}}
"""


def test_reassociated_sums_are_exact_in_the_model_but_not_in_f32() -> None:
    # README, Semantics: f32 sum(x + 2^18) - 2^24 over a sharded dim of 64 is verified (real
    # arithmetic), while XLA's f32 results differ by whole units: the baseline rounds its sum
    # at 2^24 (ulp 2), each of the 4 ranks at 2^22 (ulp 0.5).
    base = _SUM_SHIFTED.format(n=64, allreduce="%t = f32[] copy(%s)")
    dist = _SUM_SHIFTED.format(n=16, allreduce="%t = f32[] all-reduce(%s), replica_groups={{0,1,2,3}}, to_apply=%add")
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    assert _check(base, dist, rel, numeric=False).verdict == "verified"
    oracle = pytest.importorskip("oracle")
    runs = [oracle.run_pair(base, dist, rel, seed=seed) for seed in range(4)]
    assert not all(r.equal for r in runs), "the example no longer shows f32 reassociation error"
