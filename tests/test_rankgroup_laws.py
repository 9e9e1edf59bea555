"""Rank groups under a layout (rules/layout.egg, kind ``g:d:K``): grouped-query attention with
fewer KV heads than ranks. The baseline transposes the KV heads to the front, repeats each K
times (``repeat_interleave``) and transposes again; rank r picks KV head floor(r/K) with
index_select and transposes once (torch-xla's two transposes, composed by the normalizer, or
one written so). The head index is spelled as torch lowers ``rank // K`` (through f32: convert,
divide, floor, convert) and as JAX does (an integer divide). Every correct pair is verified AND
executed by the witness (XLA's CPU runtime, every output equal); every bug, a real change of
value, is never verified and the witness confirms the difference.

Also here, the other layout laws of issue 15 written with them: the untiled all-gather (JAX's
``all_gather(tiled=False)``, rules/layout.egg agu) and attention whose rank merges batch and
heads into one bmm dim (normalize.unmerge_batch_dots through a transpose or with one merged
operand; a reduce and a broadcast under a layout, rules/layout.egg lpair).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import VERIFIED
from shardproof.engine.relations import load_relations

REL = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {distributed: 1, relation: rank}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
"""

# x: (seq 8, KV heads 2, head dim 4). Query head h (of 4 = c) uses KV head floor(h/2).
BASE = """HloModule gqa_b

ENTRY %main {
  %x = f32[8,2,4] parameter(0)
  %t = f32[2,8,4] transpose(%x), dimensions={1,0,2}
  %b = f32[2,2,8,4] broadcast(%t), dimensions={0,2,3}
  %k = f32[4,8,4] reshape(%b)
  %kt = f32[4,4,8] transpose(%k), dimensions={0,2,1}
  ROOT %y = f32[4,4,8] tanh(%kt)
}
"""

HEAD = {
    # torch-xla's rank // 2: f32(r) / f32(2), floor, back to s32
    "torch_float_floor": "  %rf = f32[] convert(%r)\n  %two = s32[] constant(2)\n  %twof = f32[] convert(%two)\n  %q = f32[] divide(%rf, %twof)\n  %fl = f32[] floor(%q)\n  %h = s32[] convert(%fl)\n",
    # JAX's axis_index // 2: an integer divide
    "jax_int_divide": "  %two = s32[] constant(2)\n  %h = s32[] divide(%r, %two)\n",
}
HEAD_BUGS = {
    # r mod 2: the tiled KV order against the baseline's interleaved repeat
    "rank_mod": "  %two = s32[] constant(2)\n  %h = s32[] remainder(%r, %two)\n",
    # floor((r + 1) / 2): the next group's head on odd ranks
    "next_group": "  %one = s32[] constant(1)\n  %r1 = s32[] add(%r, %one)\n  %two = s32[] constant(2)\n  %h = s32[] divide(%r1, %two)\n",
}

# Where the rank picks and transposes: (pick along the heads dim of x, then one composite
# transpose, or two), or (transpose first, then pick along dim 0).
TAIL = {
    "pick_then_one_transpose": "  %g = f32[8,1,4] gather(%x, %h1), offset_dims={0,2}, collapsed_slice_dims={1}, start_index_map={1}, index_vector_dim=1, slice_sizes={8,1,4}\n  %kt = f32[1,4,8] transpose(%g), dimensions={1,2,0}\n",
    "pick_then_two_transposes": "  %g = f32[8,1,4] gather(%x, %h1), offset_dims={0,2}, collapsed_slice_dims={1}, start_index_map={1}, index_vector_dim=1, slice_sizes={8,1,4}\n  %t1 = f32[1,8,4] transpose(%g), dimensions={1,0,2}\n  %kt = f32[1,4,8] transpose(%t1), dimensions={0,2,1}\n",
    "transpose_then_pick": "  %t = f32[2,8,4] transpose(%x), dimensions={1,0,2}\n  %g = f32[1,8,4] gather(%t, %h1), offset_dims={1,2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8,4}\n  %kt = f32[1,4,8] transpose(%g), dimensions={0,2,1}\n",
}


def _dist(head: str, tail: str) -> str:
    return ("HloModule gqa_d\n\nENTRY %main {\n  %x = f32[8,2,4] parameter(0)\n  %r = s32[] parameter(1)\n" + head
            + "  %h1 = s32[1] reshape(%h)\n" + tail + "  ROOT %y = f32[1,4,8] tanh(%kt)\n}\n")


def _check(tmp_path: Path, dist: str, witness: str) -> object:
    for name, text in (("baseline.hlo", BASE), ("distributed.hlo", dist), ("relations.yaml", REL)):
        (tmp_path / name).write_text(text)
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


@pytest.mark.parametrize("tail", sorted(TAIL))
@pytest.mark.parametrize("head", sorted(HEAD))
def test_kv_head_of_the_rank_group_verifies_in_every_spelling(tmp_path: Path, head: str, tail: str) -> None:
    r = _check(tmp_path, _dist(HEAD[head], TAIL[tail]), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("tail", sorted(TAIL))
@pytest.mark.parametrize("bug", sorted(HEAD_BUGS))
def test_wrong_kv_head_is_diverged(tmp_path: Path, bug: str, tail: str) -> None:
    r = _check(tmp_path, _dist(HEAD_BUGS[bug], TAIL[tail]), "auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


def test_floor_head_against_tiled_kv_heads_is_diverged(tmp_path: Path) -> None:
    """The baseline tiles the KV heads ([kv0, kv1, kv0, kv1]: the new dim before the heads),
    so query head h uses KV head h mod 2; the rank's floor(r/2) is then wrong on ranks 1 and 2."""
    tiled = BASE.replace("%b = f32[2,2,8,4] broadcast(%t), dimensions={0,2,3}", "%b = f32[2,2,8,4] broadcast(%t), dimensions={1,2,3}")
    assert tiled != BASE
    (tmp_path / "baseline.hlo").write_text(tiled)
    (tmp_path / "distributed.hlo").write_text(_dist(HEAD["jax_int_divide"], TAIL["pick_then_one_transpose"]))
    (tmp_path / "relations.yaml").write_text(REL)
    r = check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo", witness="auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- the untiled all-gather (rules/layout.egg agu): JAX's all_gather(x, tiled=False) -------
AG_REL = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""
AG_BASE = "HloModule ag_b\n\nENTRY %main {\n  %x = f32[16,8] parameter(0)\n  ROOT %y = f32[16,8] tanh(%x)\n}\n"
AG_DIST = {
    # stack, merge, then the map (lowered JAX)
    "merge_then_map": "  %u = f32[1,4,8] reshape(%x)\n  %g = f32[4,4,8] all-gather(%u), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true\n  %m = f32[16,8] reshape(%g)\n  ROOT %y = f32[16,8] tanh(%m)\n",
    # the map before the merge (XLA's compiled fusion)
    "map_then_merge": "  %u = f32[1,4,8] reshape(%x)\n  %g = f32[4,4,8] all-gather(%u), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true\n  %t = f32[4,4,8] tanh(%g)\n  ROOT %y = f32[16,8] reshape(%t)\n",
}
AG_BUGS = {
    # the unit dim after the block's rows: the merge interleaves the ranks' rows
    "stacked_after_rows": "  %u = f32[4,1,8] reshape(%x)\n  %g = f32[4,4,8] all-gather(%u), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={1}, use_global_device_ids=true\n  %m = f32[16,8] reshape(%g)\n  ROOT %y = f32[16,8] tanh(%m)\n",
    # the ranks stacked in reverse order
    "reversed_group": "  %u = f32[1,4,8] reshape(%x)\n  %g = f32[4,4,8] all-gather(%u), channel_id=1, replica_groups={{3,2,1,0}}, dimensions={0}, use_global_device_ids=true\n  %m = f32[16,8] reshape(%g)\n  ROOT %y = f32[16,8] tanh(%m)\n",
}


def _ag_check(tmp_path: Path, body: str, witness: str) -> object:
    dist = "HloModule ag_d\n\nENTRY %main {\n  %x = f32[4,8] parameter(0)\n" + body + "}\n"
    for name, text in (("baseline.hlo", AG_BASE), ("distributed.hlo", dist), ("relations.yaml", AG_REL)):
        (tmp_path / name).write_text(text)
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


@pytest.mark.parametrize("spelling", sorted(AG_DIST))
def test_untiled_all_gather_merged_is_the_whole(tmp_path: Path, spelling: str) -> None:
    r = _ag_check(tmp_path, AG_DIST[spelling], "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("bug", sorted(AG_BUGS))
def test_untiled_all_gather_in_another_order_is_not_verified(tmp_path: Path, bug: str) -> None:
    r = _ag_check(tmp_path, AG_BUGS[bug], "auto")
    assert r.verdict != VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- attention whose rank merges batch and heads into one bmm dim (rules/layout.egg lpair;
# engine/hlo/normalize.py unmerge_batch_dots): the baseline keeps (batch, heads) apart, heads
# sharded, keys transposed (q @ k^T); the rank merges (batch, its heads) for both bmms, the key
# transposed after the merge,
# and runs the softmax's max and its broadcast on the merged tensor.
MAX = "%max (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %m = f32[] maximum(%a, %b)\n}\n\n"
BMM_REL = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 1}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}
"""
BMM_BASE = "HloModule bmm_b\n\n" + MAX + """ENTRY %main {
  %x = f32[2,8,8,2] parameter(0)
  %y = f32[2,8,8,2] parameter(1)
  %yt = f32[2,8,2,8] transpose(%y), dimensions={0,1,3,2}
  %s = f32[2,8,8,8] dot(%x, %yt), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %ninf = f32[] constant(-inf)
  %m = f32[2,8,8] reduce(%s, %ninf), dimensions={3}, to_apply=%max
  %mb = f32[2,8,8,8] broadcast(%m), dimensions={0,1,2}
  %d = f32[2,8,8,8] subtract(%s, %mb)
  %e = f32[2,8,8,8] exponential(%d)
  ROOT %o = f32[2,8,8,2] dot(%e, %y), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
}
"""
BMM_DIST = """  %x = f32[2,2,8,2] parameter(0)
  %y = f32[2,2,8,2] parameter(1)
  %xm = f32[4,8,2] reshape(%XSRC)
  %ym = f32[4,8,2] reshape(%y)
  %yt = f32[4,2,8] transpose(%ym), dimensions={0,2,1}
  %s = f32[4,8,8] dot(%xm, %yt), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %ninf = f32[] constant(-inf)
  %m = f32[4,8] reduce(%s, %ninf), dimensions={RDIM}, to_apply=%max
  %mb = f32[4,8,8] broadcast(%m), dimensions={BDIMS}
  %d = f32[4,8,8] subtract(%s, %mb)
  %e = f32[4,8,8] exponential(%d)
  %o = f32[4,8,2] dot(%e, %ym), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %out = f32[2,2,8,2] reshape(%o)
"""
BMM_OK = {"XSRC": "x", "RDIM": "2", "BDIMS": "0,1"}
BMM_BUGS = {
    "max_over_queries": {"RDIM": "1"},  # the max over the other dim of the scores
    "max_spread_transposed": {"BDIMS": "0,2"},  # the row max broadcast along the wrong dim
    "heads_before_batch": {"XSRC": "xh"},  # queries merged as (heads, batch): other pairs meet
}


def _bmm_dist(subs: dict[str, str]) -> str:
    body = BMM_DIST
    for k, v in {**BMM_OK, **subs}.items():
        body = body.replace(k, v)
    if "%xh" in body:
        body = body.replace("  %xm =", "  %xh = f32[2,2,8,2] transpose(%x), dimensions={1,0,2,3}\n  %xm =")
    return "HloModule bmm_d\n\n" + MAX + "ENTRY %main {\n" + body + "}\n"


def _bmm_check(tmp_path: Path, dist: str, witness: str) -> object:
    for name, text in (("baseline.hlo", BMM_BASE), ("distributed.hlo", dist), ("relations.yaml", BMM_REL)):
        (tmp_path / name).write_text(text)
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


def test_attention_with_merged_batch_heads_verifies(tmp_path: Path) -> None:
    r = _bmm_check(tmp_path, _bmm_dist({}), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("bug", sorted(BMM_BUGS))
def test_attention_with_merged_batch_heads_bugs_are_not_verified(tmp_path: Path, bug: str) -> None:
    r = _bmm_check(tmp_path, _bmm_dist(BMM_BUGS[bug]), "auto")
    assert r.verdict != VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness
