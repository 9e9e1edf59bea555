"""Padded sharding (issue 15, item 4; rules/padded.egg): heads or FFN features that do not
divide over the ranks, padded to c·w and split in blocks of w, as Neuron lays them out.

Hand-written HLO pairs check each law with the real rules (egglog), and XLA's CPU runtime
(tests/oracle.py) confirms that the pairs said to be equal are and the others are not: a padded
tail that is not zero (exp(0) = 1) or is not multiplied by zeros must never verify. The tplm
models are real torch-xla builds at small shapes (TP 6: 8 heads padded to 12, FFN 128 to 132).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.analysis.verify import verify
from shardproof.engine.errors import InputError
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

C, N, W = 4, 10, 3  # 10 features over 4 ranks: padded to 12, 3 per rank (rank 3: 1 real, 2 zeros)
GROUPS = "{{0,1,2,3}}"
ROOT = Path(__file__).parents[1]

ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}
"""


def _verdict(baseline: str, distributed: str, relations: dict[str, Any]) -> str:
    return verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "distributed.hlo")).verdict


def _equal(baseline: str, distributed: str, relations: dict[str, Any]) -> bool:
    oracle = pytest.importorskip("oracle")
    return all(oracle.run_pair(baseline, distributed, relations, seed=s).equal for s in (0, 1))


def _mlp(act: str, n: int) -> str:
    """x (2, 8) -> act(x A^T) B^T, A (n, 8), B (8, n): n = N (baseline) or W (a rank)."""
    return f"""  %x = f32[2,8]{{1,0}} parameter(0)
  %A = f32[{n},8]{{1,0}} parameter(1)
  %B = f32[8,{n}]{{1,0}} parameter(2)
  %u = f32[2,{n}]{{1,0}} dot(f32[2,8]{{1,0}} %x, f32[{n},8]{{1,0}} %A), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
  %t = f32[2,{n}]{{1,0}} {act}(f32[2,{n}]{{1,0}} %u)
  %y = f32[2,8]{{1,0}} dot(f32[2,{n}]{{1,0}} %t, f32[8,{n}]{{1,0}} %B), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
"""


def _mlp_pair(act: str) -> tuple[str, str, dict[str, Any]]:
    base = f"HloModule b\n\nENTRY %main (x: f32[2,8], A: f32[{N},8], B: f32[8,{N}]) -> f32[2,8] {{\n{_mlp(act, N)}  ROOT %r = f32[2,8]{{1,0}} copy(f32[2,8]{{1,0}} %y)\n}}\n"
    dist = f"""HloModule d

{ADD}
ENTRY %main (x: f32[2,8], A: f32[{W},8], B: f32[8,{W}]) -> f32[2,8] {{
{_mlp(act, W)}  ROOT %r = f32[2,8]{{1,0}} all-reduce(f32[2,8]{{1,0}} %y), replica_groups={GROUPS}, to_apply=%add
}}
"""
    rel = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, "relation": "padded", "dim": 0, "width": W},
            {"baseline": 2, "distributed": 2, "relation": "padded", "dim": 1, "width": W},
        ],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return base, dist, rel


@pytest.mark.parametrize("act", ["tanh", "exponential"])
def test_padded_ffn_sums_to_the_baseline_when_its_weights_pad_with_zeros(act: str) -> None:
    """Column- then row-parallel with zero-padded weights: the padding meets zero columns of B,
    so even exp (exp(0) = 1 on the padding) contributes nothing."""
    base, dist, rel = _mlp_pair(act)
    assert _verdict(base, dist, rel) == "verified"
    assert _equal(base, dist, rel)


def _sum_pair(act: str) -> tuple[str, str, dict[str, Any]]:
    """sum over the features of act(x A^T): the padded tail is summed directly."""
    base = f"""HloModule b

{ADD}
ENTRY %main (x: f32[2,8], A: f32[{N},8]) -> f32[2] {{
  %x = f32[2,8]{{1,0}} parameter(0)
  %A = f32[{N},8]{{1,0}} parameter(1)
  %u = f32[2,{N}]{{1,0}} dot(f32[2,8]{{1,0}} %x, f32[{N},8]{{1,0}} %A), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
  %t = f32[2,{N}]{{1,0}} {act}(f32[2,{N}]{{1,0}} %u)
  %z = f32[] constant(0)
  ROOT %s = f32[2]{{0}} reduce(f32[2,{N}]{{1,0}} %t, f32[] %z), dimensions={{1}}, to_apply=%add
}}
"""
    dist = f"""HloModule d

{ADD}
ENTRY %main (x: f32[2,8], A: f32[{W},8]) -> f32[2] {{
  %x = f32[2,8]{{1,0}} parameter(0)
  %A = f32[{W},8]{{1,0}} parameter(1)
  %u = f32[2,{W}]{{1,0}} dot(f32[2,8]{{1,0}} %x, f32[{W},8]{{1,0}} %A), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
  %t = f32[2,{W}]{{1,0}} {act}(f32[2,{W}]{{1,0}} %u)
  %z = f32[] constant(0)
  %s = f32[2]{{0}} reduce(f32[2,{W}]{{1,0}} %t, f32[] %z), dimensions={{1}}, to_apply=%add
  ROOT %r = f32[2]{{0}} all-reduce(f32[2]{{0}} %s), replica_groups={GROUPS}, to_apply=%add
}}
"""
    rel = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, "relation": "padded", "dim": 0, "width": W},
        ],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return base, dist, rel


def test_sum_over_padding_verifies_only_when_the_padding_stays_zero() -> None:
    """The soundness pair: tanh(0) = 0 keeps the padding zero, so the ranks' sums add up to the
    baseline's; exp(0) = 1 adds 1 per padded feature (two on rank 3), which must not verify."""
    base, dist, rel = _sum_pair("tanh")
    assert _verdict(base, dist, rel) == "verified"
    assert _equal(base, dist, rel)
    base, dist, rel = _sum_pair("exponential")
    assert _verdict(base, dist, rel) != "verified"
    assert not _equal(base, dist, rel)


def _gather_pair(zero_weights: bool) -> tuple[str, str, dict[str, Any]]:
    """Rows r·w .. r·w + w - 1 of an identical table K (N, 8) picked by index_select at
    rank·w + arange(w) (past N the gather clamps to row N - 1), dotted over the padded dim with
    V: zero-padded (right), or V's rows picked the same way (the clamped rows count twice)."""
    base = f"""HloModule b

ENTRY %main (K: f32[{N},8], V: f32[{N},8]) -> f32[8,8] {{
  %K = f32[{N},8]{{1,0}} parameter(0)
  %V = f32[{N},8]{{1,0}} parameter(1)
  ROOT %y = f32[8,8]{{1,0}} dot(f32[{N},8]{{1,0}} %K, f32[{N},8]{{1,0}} %V), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
}}
"""
    pick_v = "" if zero_weights else f"""  %gv = f32[{W},8]{{1,0}} gather(f32[{N},8]{{1,0}} %V, u32[{W}]{{0}} %iu), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,8}}
"""
    v_shape = f"f32[{W},8]" if zero_weights else f"f32[{N},8]"
    v_use = "%V" if zero_weights else "%gv"
    dist = f"""HloModule d

{ADD}
ENTRY %main (K: f32[{N},8], V: {v_shape}, r: s32[]) -> f32[8,8] {{
  %K = f32[{N},8]{{1,0}} parameter(0)
  %V = {v_shape}{{1,0}} parameter(1)
  %r = s32[] parameter(2)
  %w = s32[] constant({W})
  %rw = s32[] multiply(s32[] %r, s32[] %w)
  %rb = s32[{W}]{{0}} broadcast(s32[] %rw), dimensions={{}}
  %io = s32[{W}]{{0}} iota(), iota_dimension=0
  %i = s32[{W}]{{0}} add(s32[{W}]{{0}} %rb, s32[{W}]{{0}} %io)
  %iu = u32[{W}]{{0}} convert(s32[{W}]{{0}} %i)
  %gk = f32[{W},8]{{1,0}} gather(f32[{N},8]{{1,0}} %K, u32[{W}]{{0}} %iu), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,8}}
{pick_v}  %y = f32[8,8]{{1,0}} dot(f32[{W},8]{{1,0}} %gk, f32[{W},8]{{1,0}} {v_use}), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}
  ROOT %s = f32[8,8]{{1,0}} all-reduce(f32[8,8]{{1,0}} %y), replica_groups={GROUPS}, to_apply=%add
}}
"""
    v_rel = {"relation": "padded", "dim": 0, "width": W} if zero_weights else {"relation": "duplicate"}
    rel = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, **v_rel},
            {"distributed": 2, "relation": "rank"},
        ],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return base, dist, rel


def test_rank_rows_gather_meets_zero_weights() -> None:
    base, dist, rel = _gather_pair(zero_weights=True)
    assert _verdict(base, dist, rel) == "verified"
    assert _equal(base, dist, rel)


def test_clamped_padding_summed_with_clamped_padding_does_not_verify() -> None:
    """Padding by repeating the last row on both sides of the dot: row N - 1 is counted once
    per padded position (a padded head leaking into the output)."""
    base, dist, rel = _gather_pair(zero_weights=False)
    assert _verdict(base, dist, rel) != "verified"
    assert not _equal(base, dist, rel)


def test_padded_relation_errors_name_the_key() -> None:
    base, dist, rel = _mlp_pair("tanh")
    bad = {**rel, "inputs": [rel["inputs"][0], {**rel["inputs"][1], "width": 2}, rel["inputs"][2]]}
    with pytest.raises(InputError, match=r"inputs\[1\]\.width.*covers 8 elements, fewer than the 10"):
        verify(parse_relations(bad, "relations.yaml"), parse_hlo(base, "b.hlo"), parse_hlo(dist, "d.hlo"))
    missing = {**rel, "inputs": [rel["inputs"][0], {k: v for k, v in rel["inputs"][1].items() if k != "width"}, rel["inputs"][2]]}
    with pytest.raises(InputError, match=r"inputs\[1\]\.width"):
        parse_relations(missing, "relations.yaml")
    with pytest.raises(InputError, match=r"inputs\[0\]\.width"):
        parse_relations({**rel, "inputs": [{**rel["inputs"][0], "width": 3}, *rel["inputs"][1:]]}, "relations.yaml")


def test_plan_padded_style_writes_the_padded_relation() -> None:
    from shardproof.engine.frontend.plan import Plan, PlanError, relation_for

    plan = Plan.parse({"attn.q": {"style": "colwise", "padded": True}, "attn.out": {"style": "rowwise", "padded": True}})
    # 48 heads of 128 over 32 ranks: 2 heads (256 rows) per rank, 64 heads in all.
    rel = relation_for(plan, "attn.q.weight", "linear", (6144, 6144), (256, 6144), 32)
    assert (rel.relation, rel.dim, rel.width) == ("padded", 0, 256)
    rel = relation_for(plan, "attn.out.weight", "linear", (6144, 6144), (6144, 256), 32)
    assert (rel.relation, rel.dim, rel.width) == ("padded", 1, 256)
    with pytest.raises(PlanError, match=r"w >= 192 along dim 0.*holds \[128, 6144\]"):
        relation_for(plan, "attn.q.weight", "linear", (6144, 6144), (128, 6144), 32)
    with pytest.raises(PlanError, match="padded: expected true or false"):
        Plan.parse({"attn.q": {"style": "colwise", "padded": "yes"}})
    # Padded with blocks (a fused weight, each block padded on its own): equal blocks split the
    # rank's extent equally; unequal ones need their widths.
    fused = Plan.parse({"attn.qkv": {"style": "colwise", "padded": True, "blocks": [6, 6, 6]}})
    rel = relation_for(fused, "attn.qkv.weight", "linear", (18, 8), (6, 8), 4)
    assert (rel.relation, rel.dim, rel.blocks, rel.width, rel.widths) == ("padded", 0, (6, 6, 6), 6, (2, 2, 2))
    gqa = Plan.parse({"attn.qkv": {"style": "colwise", "padded": True, "blocks": [6, 2, 2]}})
    with pytest.raises(PlanError, match=r"need their per-rank widths"):
        relation_for(gqa, "attn.qkv.weight", "linear", (10, 8), (4, 8), 4)
    gqa = Plan.parse({"attn.qkv": {"style": "colwise", "padded": True, "blocks": [6, 2, 2], "width": [2, 1, 1]}})
    assert relation_for(gqa, "attn.qkv.weight", "linear", (10, 8), (4, 8), 4).widths == (2, 1, 1)
    with pytest.raises(PlanError, match=r"widths of at least \[2, 1, 1\]"):
        relation_for(Plan.parse({"q": {"style": "colwise", "padded": True, "blocks": [6, 2, 2], "width": [1, 2, 1]}}), "q.weight", "linear", (10, 8), (4, 8), 4)
    with pytest.raises(PlanError, match="width: expected one positive per-rank width per block"):
        Plan.parse({"attn.q": {"style": "colwise", "padded": True, "width": [4, 4]}})


# ---- tplm, real torch-xla builds -----------------------------------------------------------

MODELS = ["llama_padded_tp6", "bug_padded_head_leak", "bug_padded_kv_index"]


@pytest.fixture(scope="module")
def tplm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    from shardproof.engine.frontend.runner import run_models

    report = run_models(ROOT / "examples" / ".shardproof.yml", tmp_path_factory.mktemp("padded"), MODELS)
    return {m["name"]: m for m in report["models"]}


def test_tplm_padded_heads_and_ffn_verify(tplm: dict[str, dict[str, Any]]) -> None:
    model = tplm["llama_padded_tp6"]
    assert model["build"]["error"] is None, model["build"]["error"]
    assert model["result"]["verdict"] == "verified", model["result"]["reason"]


@pytest.mark.parametrize("name", ["bug_padded_head_leak", "bug_padded_kv_index"])
def test_tplm_padding_bugs_diverge_with_a_numeric_witness(tplm: dict[str, dict[str, Any]], name: str) -> None:
    result = tplm[name]["result"]
    assert result["verdict"] == "diverged", result["reason"]
    witness = result["witness"]
    assert witness["status"] == "confirmed"
    assert any(not o["equal"] and o["max_abs_err"] > 1e-2 for o in witness["outputs"])
    variant = name.removeprefix("bug_")
    first = result["divergences"][0]["source"]
    line = (ROOT / first["file"]).read_text().splitlines()[first["line"] - 1]
    assert f"BUG-SITE: {variant}" in line
