"""Rank groups under a layout (rules/layout.egg, kind ``g:d:K``): grouped-query attention with
fewer KV heads than ranks. The baseline transposes the KV heads to the front, repeats each K
times (``repeat_interleave``) and transposes again; rank r picks KV head floor(r/K) with
index_select and transposes once (torch-xla's two transposes, composed by the normalizer, or
one written so). The head index is spelled as torch lowers ``rank // K`` (through f32: convert,
divide, floor, convert) and as JAX does (an integer divide). Every correct pair is verified AND
executed by the witness (XLA's CPU runtime, every output equal); every bug, a real change of
value, is never verified and the witness confirms the difference.
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
