"""Soundness of the laws that closed the rank-group and elided-broadcast gaps (tests/gaps/):
hand-made single-point mutants of the closed pairs, each a real change of value (the numeric
oracle confirms it), must never be verified, and the laws' side conditions are checked directly.

- rank groups (rules/slicing.egg, ``faffine`` .. ``grp-*``): a rank picks KV head floor(a·r / v)
  with index_select; the baseline repeats the KV heads (``kv_heads_fewer_than_ranks``) or runs
  grouped attention (``kv_heads_grouped_attention``);
- a broadcast the rank elides (rules/layout.egg ``want-b-bcast``): ``one_expert_per_rank``,
  ``one_head_per_rank_batch1``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

GAPS = Path(__file__).parent / "gaps"

# (pair, side, regex, replacement, what it changes). Each pattern must occur; the first
# occurrence is replaced.
MUTANTS = [
    # the rank's KV head: floor(r / 2) over 4 ranks and 2 heads
    (
        "kv_heads_fewer_than_ranks",
        "distributed",
        r"s32\[\] constant\(2\)",
        "s32[] constant(4)",
        "floor(r/4): ranks 2, 3 pick head 0",
    ),
    (
        "kv_heads_fewer_than_ranks",
        "distributed",
        r"s32\[\] constant\(2\)",
        "s32[] constant(1)",
        "floor(r/1): ranks 1.. pick the wrong head (clamped)",
    ),
    (
        "kv_heads_fewer_than_ranks",
        "distributed",
        r"floor\(",
        "ceil(",
        "ceil(r/2): rank 1 picks head 1",
    ),
    (
        "kv_heads_fewer_than_ranks",
        "distributed",
        r"%convert\.4 = f32\[\] convert\(s32\[\] %p0\.3\)",
        "%convert.4 = f32[] convert(s32[] %constant.14)",
        "a constant index (4 // 2, clamped): every rank picks head 1",
    ),
    # the baseline tiles (repeat) instead of repeat_interleave: new dim before the head dim
    (
        "kv_heads_fewer_than_ranks",
        "baseline",
        r"dimensions=\{0,1,3\}",
        "dimensions={0,2,3}",
        "baseline repeat instead of repeat_interleave",
    ),
    # grouped attention: head floor(2r / 4) over 4 ranks, 2 KV heads, 2 query heads per rank
    (
        "kv_heads_grouped_attention",
        "distributed",
        r"%constant\.48 = s32\[\] constant\(4\)",
        "%constant.48 = s32[] constant(8)",
        "floor(2r/8): ranks 2, 3 pick head 0",
    ),
    (
        "kv_heads_grouped_attention",
        "distributed",
        r"%constant\.48 = s32\[\] constant\(4\)",
        "%constant.48 = s32[] constant(2)",
        "floor(2r/2) = r: wrong heads (clamped)",
    ),
    (
        "kv_heads_grouped_attention",
        "distributed",
        r"%constant\.50 = s32\[\] constant\(2\)",
        "%constant.50 = s32[] constant(1)",
        "floor(r/4): ranks 2, 3 pick head 0",
    ),
    (
        "kv_heads_grouped_attention",
        "distributed",
        r"floor\(f32\[\] %divide\.53\)",
        "ceil(f32[] %divide.53)",
        "ceil(2r/4): rank 1 picks head 1",
    ),
    (
        "kv_heads_grouped_attention",
        "distributed",
        r"(%slice\.\d+ = f32\[4,2,1,1,4\]\{4,3,2,1,0\} slice\(f32\[4,2,2,1,4\]\{4,3,2,1,0\} %gather\.145\), slice=\{\[0:4\], \[0:2\], )\[0:1\]",
        r"\g<1>[1:2]",
        "the picked head's v used as its k",
    ),
    (
        "kv_heads_grouped_attention_batch1",
        "distributed",
        r"%constant\.48 = s32\[\] constant\(4\)",
        "%constant.48 = s32[] constant(8)",
        "floor(2r/8): ranks 2, 3 pick head 0",
    ),
    # one expert per rank: the router mask compares with the all-reduced row maximum
    (
        "one_expert_per_rank",
        "distributed",
        r"%all-reduce\.15\), direction=LT",
        "%reshape.10), direction=LT",
        "the local maximum (all-reduce skipped)",
    ),
    (
        "one_expert_per_rank",
        "distributed",
        r"maximum\(f32\[\] %x\.12",
        "minimum(f32[] %x.12",
        "all-reduce(min) of the maxima",
    ),
    # one head per rank, batch 1: the rank's rotary table
    ("one_head_per_rank_batch1", "distributed", r"cosine\(", "sine(", "sine table on the ranks"),
]


def _pair(name: str) -> tuple[str, str, dict[str, object]]:
    d = GAPS / name
    return (
        (d / "baseline.hlo").read_text(),
        (d / "distributed.hlo").read_text(),
        yaml.safe_load((d / "relations.yaml").read_text()),
    )


def _mutant(name: str, side: str, pattern: str, repl: str) -> tuple[str, str, dict[str, object]]:
    baseline, distributed, relations = _pair(name)
    text = baseline if side == "baseline" else distributed
    new, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, (
        f"pattern {pattern!r} no longer occurs in {name}/{side}.hlo: update the mutant list"
    )
    return (new, distributed, relations) if side == "baseline" else (baseline, new, relations)


def _verdict(baseline: str, distributed: str, relations: dict[str, object]) -> str:
    return verify(
        parse_relations(relations, "relations.yaml"),
        parse_hlo(baseline, "baseline.hlo"),
        parse_hlo(distributed, "distributed.hlo"),
    ).verdict


@pytest.mark.parametrize(
    ("name", "side", "pattern", "repl", "what"), MUTANTS, ids=[f"{m[0]}:{m[4]}" for m in MUTANTS]
)
def test_a_mutant_of_a_closed_gap_is_never_verified(
    name: str, side: str, pattern: str, repl: str, what: str
) -> None:
    assert _verdict(*_mutant(name, side, pattern, repl)) in (
        "diverged",
        "unsupported",
        "inconclusive",
    ), what


@pytest.mark.parametrize(
    ("name", "side", "pattern", "repl", "what"), MUTANTS, ids=[f"{m[0]}:{m[4]}" for m in MUTANTS]
)
def test_the_oracle_confirms_the_mutant_changes_the_value(
    name: str, side: str, pattern: str, repl: str, what: str
) -> None:
    oracle = pytest.importorskip("oracle")
    baseline, distributed, relations = _mutant(name, side, pattern, repl)
    try:
        equal = [oracle.run_pair(baseline, distributed, relations, seed=s).equal for s in (0, 1)]
    except Exception as e:  # the oracle's own limits are not this test's subject
        pytest.skip(f"the oracle cannot run this mutant: {type(e).__name__}: {str(e)[:120]}")
    assert not all(equal), what


def test_the_rank_division_needs_the_float_type_to_hold_the_rank_values() -> None:
    # floor(fl(a·r / v)) = floor(r / K) is proven only while a·r is exact in the float type: in
    # bf16 (integers up to 256) 128·r reaches 384 at r = 3, so the law must not fire.
    baseline, distributed, relations = _pair("kv_heads_fewer_than_ranks")
    text = distributed
    for old, new in (
        (
            "%convert.4 = f32[] convert(s32[] %p0.3)",
            "%c128 = s32[] constant(128)\n  %m128 = s32[] multiply(s32[] %p0.3, s32[] %c128)\n  %convert.4 = bf16[] convert(s32[] %m128)",
        ),
        ("%constant.1 = s32[] constant(2)", "%constant.1 = s32[] constant(256)"),
        (
            "%convert.2 = f32[] convert(s32[] %constant.1)",
            "%convert.2 = bf16[] convert(s32[] %constant.1)",
        ),
        (
            "%divide.5 = f32[] divide(f32[] %convert.4, f32[] %convert.2)",
            "%divide.5 = bf16[] divide(bf16[] %convert.4, bf16[] %convert.2)",
        ),
        ("%floor.6 = f32[] floor(f32[] %divide.5)", "%floor.6 = bf16[] floor(bf16[] %divide.5)"),
        (
            "%convert.7 = s32[] convert(f32[] %floor.6)",
            "%convert.7 = s32[] convert(bf16[] %floor.6)",
        ),
    ):
        assert old in text
        text = text.replace(old, new)
    assert _verdict(baseline, text, relations) != "verified"
    # The same arithmetic in f32 (exact up to 2^24) is floor(128·r / 256) = floor(r / 2).
    assert _verdict(baseline, text.replace("bf16[]", "f32[]"), relations) == "verified"


def test_a_float_to_int_convert_stays_unsupported_without_a_range_proof() -> None:
    # floor(x / 2) of an arbitrary float input: out-of-range values are implementation-defined.
    baseline, distributed, relations = _pair("kv_heads_fewer_than_ranks")
    old = "%convert.4 = f32[] convert(s32[] %p0.3)"
    assert old in distributed
    text = distributed.replace(
        old,
        "%slice.99 = f32[1,1,1]{2,1,0} slice(f32[8,2,4]{2,1,0} %p1.9), slice={[0:1], [0:1], [0:1]}\n  %convert.4 = f32[] reshape(f32[1,1,1]{2,1,0} %slice.99)",
    )
    assert _verdict(baseline, text, relations) == "unsupported"


# The combine of one expert per rank (moe_one_expert_per_rank): y[0:1] is the rank's whole
# expert output, a partial sum of the baseline's sum over all experts only until it is
# all-reduced over the expert group. The oracle cannot run the MoE pairs (XLA rejects their
# tuple layout), so these are checked against the verifier only; each clearly changes the value.
MOE_MUTANTS = [
    (
        r"(%all-reduce\.361 = .*?)replica_groups=\{\{0,1,2,3\}\}",
        r"\g<1>replica_groups={{0,1},{2,3}}",
        "the combine summed over half the experts",
    ),
    (
        r"(%all-reduce\.361 = .*?)to_apply=%AddComputation\.357",
        r"\g<1>to_apply=%MaxComputation.306",
        "the combine reduced with max",
    ),
    (
        r"multiply\(f32\[2,1,16\]\{2,1,0\} %all-reduce\.361,",
        "multiply(f32[2,1,16]{2,1,0} %reshape.356,",
        "the combine used without its all-reduce",
    ),
]


@pytest.mark.parametrize(("pattern", "repl", "what"), MOE_MUTANTS, ids=[m[2] for m in MOE_MUTANTS])
def test_a_mutant_of_the_one_expert_combine_is_never_verified(
    pattern: str, repl: str, what: str
) -> None:
    baseline, distributed, relations = _pair("moe_one_expert_per_rank")
    new, n = re.subn(pattern, repl, distributed, count=1)
    assert n == 1, f"pattern {pattern!r} no longer occurs: update the mutant list"
    assert _verdict(baseline, new, relations) != "verified", what
