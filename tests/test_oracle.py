"""Tests of the numeric oracle (tests/oracle.py): XLA's CPU runtime with real collectives."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import yaml

pytest.importorskip("jax")

from oracle import run_distributed, run_hlo, run_pair

ADD_F32 = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""

# ---------------------------------------------------------------- 2-layer MLP, tensor parallel

MLP_BASE = (
    "HloModule mlp_base\n"
    + """
ENTRY main {
  x = f32[8,16]{1,0} parameter(0)
  w1 = f32[16,32]{1,0} parameter(1)
  w2 = f32[32,16]{1,0} parameter(2)
  h = f32[8,32]{1,0} dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  zero = f32[] constant(0)
  zeros = f32[8,32]{1,0} broadcast(zero), dimensions={}
  r = f32[8,32]{1,0} maximum(h, zeros)
  ROOT y = f32[8,16]{1,0} dot(r, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
)


def mlp_dist(groups: str | None) -> str:
    """W1 column-sharded, W2 row-sharded over 4 ranks; all-reduce over ``groups`` (or none)."""
    tail = (
        f"  ROOT y = f32[8,16]{{1,0}} all-reduce(p), replica_groups={groups}, to_apply=add\n"
        if groups is not None
        else ""
    )
    root = "  " if groups is not None else "  ROOT "
    return (
        "HloModule mlp_dist\n"
        + ADD_F32
        + """
ENTRY main {
  x = f32[8,16]{1,0} parameter(0)
  w1 = f32[16,8]{1,0} parameter(1)
  w2 = f32[8,16]{1,0} parameter(2)
  h = f32[8,8]{1,0} dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  zero = f32[] constant(0)
  zeros = f32[8,8]{1,0} broadcast(zero), dimensions={}
  r = f32[8,8]{1,0} maximum(h, zeros)
"""
        + root
        + "p = f32[8,16]{1,0} dot(r, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        + tail
        + "}\n"
    )


MLP_RELATIONS: dict[str, Any] = yaml.safe_load(
    """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 1}
  - {baseline: 2, distributed: 2, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""
)


def test_mlp_tensor_parallel_equal() -> None:
    res = run_pair(MLP_BASE, mlp_dist("{{0,1,2,3}}"), MLP_RELATIONS)
    assert res.equal, res.summary()
    (out,) = res.outputs
    assert out.allclose and out.max_abs_diff < 1e-3
    assert res.flavour == "replica"
    # The baseline really ran: the ReLU MLP of N(0,1) inputs is not all zeros.
    assert np.abs(res.baseline_outputs[0]).max() > 1.0


def test_mlp_without_all_reduce_not_equal() -> None:
    res = run_pair(MLP_BASE, mlp_dist(None), MLP_RELATIONS)
    assert not res.equal
    assert res.outputs[0].max_abs_diff > 0.5
    # ... but each rank does hold a partial sum of the baseline output.
    partial = {**MLP_RELATIONS, "outputs": [{"baseline": 0, "distributed": 0,
                                             "relation": "partial"}]}
    assert run_pair(MLP_BASE, mlp_dist(None), partial).equal


def test_mlp_wrong_replica_groups_not_equal() -> None:
    res = run_pair(MLP_BASE, mlp_dist("{{0,1},{2,3}}"), MLP_RELATIONS)
    assert not res.equal, res.summary()
    assert res.outputs[0].worst is not None


def test_two_groups_of_two() -> None:
    """Two TP groups of 2 ranks; all-reduce over {{0,1},{2,3}} is right for them."""
    dist = mlp_dist("{{0,1},{2,3}}").replace("f32[16,8]", "f32[16,16]").replace(
        "f32[8,16]{1,0} parameter(2)", "f32[16,16]{1,0} parameter(2)"
    ).replace("f32[8,8]", "f32[8,16]")
    rel = {**MLP_RELATIONS, "groups": [[0, 1], [2, 3]]}
    res = run_pair(MLP_BASE, dist, rel)
    assert res.equal, res.summary()
    # ... and wrong for one group of 4 (shapes fit c=2 only).
    with pytest.raises(ValueError, match="would get"):
        run_pair(MLP_BASE, dist, {**rel, "groups": [[0, 1, 2, 3]]})


# ---------------------------------------------------------------- all-gather + reduce-scatter

SEQ_BASE = """
HloModule seq_base

ENTRY main {
  x = f32[8,16]{1,0} parameter(0)
  w1 = f32[16,32]{1,0} parameter(1)
  w2 = f32[32,16]{1,0} parameter(2)
  h = f32[8,32]{1,0} dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[8,32]{1,0} tanh(h)
  ROOT y = f32[8,16]{1,0} dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

SEQ_DIST = (
    "HloModule seq_dist\n"
    + ADD_F32
    + """
ENTRY main {
  xs = f32[2,16]{1,0} parameter(0)
  w1 = f32[16,8]{1,0} parameter(1)
  w2 = f32[8,16]{1,0} parameter(2)
  x = f32[8,16]{1,0} all-gather(xs), replica_groups={{0,1,2,3}}, dimensions={0}
  h = f32[8,8]{1,0} dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[8,8]{1,0} tanh(h)
  p = f32[8,16]{1,0} dot(t, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT y = f32[2,16]{1,0} reduce-scatter(p), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=add
}
"""
)

SEQ_RELATIONS = yaml.safe_load(
    """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 1}
  - {baseline: 2, distributed: 2, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
"""
)


def test_all_gather_reduce_scatter_equal() -> None:
    res = run_pair(SEQ_BASE, SEQ_DIST, SEQ_RELATIONS)
    assert res.equal, res.summary()


def test_all_gather_reduce_scatter_wrong_output_dim() -> None:
    rel = {**SEQ_RELATIONS, "outputs": [{"baseline": 0, "distributed": 0,
                                         "relation": "sharded", "dim": 1}]}
    res = run_pair(SEQ_BASE, SEQ_DIST, rel)
    assert not res.equal
    assert "expected" in res.outputs[0].note  # shape mismatch is reported, not raised


# ---------------------------------------------------------------- rank input

RANK_BASE = """
HloModule rank_base

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  two = f32[] constant(2)
  b = f32[8,4]{1,0} broadcast(two), dimensions={}
  ROOT y = f32[8,4]{1,0} multiply(x, b)
}
"""

RANK_DIST = """
HloModule rank_dist

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  rank = s32[] parameter(1)
  size = s32[] constant(SIZE)
  start = s32[] multiply(rank, size)
  zero = s32[] constant(0)
  piece = f32[2,4]{1,0} dynamic-slice(x, start, zero), dynamic_slice_sizes={2,4}
  two = f32[] constant(2)
  b = f32[2,4]{1,0} broadcast(two), dimensions={}
  ROOT y = f32[2,4]{1,0} multiply(piece, b)
}
"""

RANK_RELATIONS = yaml.safe_load(
    """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: x, distributed: "%x", relation: duplicate}
  - {distributed: rank, relation: rank}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
"""
)


def test_rank_input_dynamic_slice_equal() -> None:
    res = run_pair(RANK_BASE, RANK_DIST.replace("SIZE", "2"), RANK_RELATIONS)
    assert res.equal, res.summary()


def test_rank_input_wrong_offset_not_equal() -> None:
    res = run_pair(RANK_BASE, RANK_DIST.replace("SIZE", "1"), RANK_RELATIONS)
    assert not res.equal
    assert res.outputs[0].worst is not None and res.outputs[0].worst[1] > 0


# ---------------------------------------------------------------- more relations


def test_fused_blocks_sharding() -> None:
    """A fused weight [q | k]: dim 1 is a concat of blocks 8 and 4, each split across ranks."""
    base = """
HloModule fused_base

ENTRY main {
  x = f32[3,6]{1,0} parameter(0)
  w = f32[6,12]{1,0} parameter(1)
  ROOT y = f32[3,12]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    dist = base.replace("f32[6,12]", "f32[6,3]").replace("f32[3,12]", "f32[3,3]")
    rel = yaml.safe_load(
        """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 1, blocks: [8, 4]}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1, blocks: [8, 4]}
"""
    )
    assert run_pair(base, dist, rel).equal
    # Without blocks the pieces are plain quarters of the output: not what the ranks compute.
    rel["outputs"][0].pop("blocks")
    assert not run_pair(base, dist, rel).equal


def test_partial_input_and_int_range_gather() -> None:
    """Embedding lookup: token ids in [0, 16); the table arrives as partial sums per rank."""
    base = """
HloModule emb_base

ENTRY main {
  table = f32[16,8]{1,0} parameter(0)
  ids = s32[6]{0} parameter(1)
  ROOT g = f32[6,8]{1,0} gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
}
"""
    dist = (
        "HloModule emb_dist\n"
        + ADD_F32
        + """
ENTRY main {
  table = f32[16,8]{1,0} parameter(0)
  ids = s32[6]{0} parameter(1)
  g = f32[6,8]{1,0} gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  ROOT s = f32[6,8]{1,0} all-reduce(g), replica_groups={{0,1}}, to_apply=add
}
"""
    )
    rel = yaml.safe_load(
        """
groups: [[0, 1]]
inputs:
  - {baseline: 0, distributed: 0, relation: partial}
  - {baseline: 1, distributed: 1, relation: duplicate, int_range: [0, 16]}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""
    )
    res = run_pair(base, dist, rel)
    assert res.equal, res.summary()
    assert res.outputs[0].max_abs_diff == 0.0  # 1/8-grid pieces sum exactly


def test_all_to_all_and_collective_permute_tuple_outputs() -> None:
    """all-to-all reshards rows->cols; collective-permute passes rows to the next rank."""
    base = """
HloModule a2a_base

ENTRY main {
  x = f32[8,8]{1,0} parameter(0)
  n = f32[8,8]{1,0} negate(x)
  ROOT t = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(x, n)
}
"""
    dist = """
HloModule a2a_dist

ENTRY main {
  x = f32[2,8]{1,0} parameter(0)
  xb = f32[2,4,2]{2,1,0} reshape(x)
  xt = f32[4,2,2]{2,1,0} transpose(xb), dimensions={1,0,2}
  at = f32[4,2,2]{2,1,0} all-to-all(xt), replica_groups={{0,1,2,3}}, dimensions={0}
  a = f32[8,2]{1,0} reshape(at)
  n = f32[2,8]{1,0} negate(x)
  p = f32[2,8]{1,0} collective-permute(n), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT t = (f32[8,2]{1,0}, f32[2,8]{1,0}) tuple(a, p)
}
"""
    rel = yaml.safe_load(
        """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 0}
"""
    )
    res = run_pair(base, dist, rel)
    # The all-to-all is a correct reshard; the permute shifts the pieces by one rank.
    assert res.outputs[0].allclose, res.summary()
    assert not res.outputs[1].allclose
    assert not res.equal
    unshifted = dist.replace("{{0,1},{1,2},{2,3},{3,0}}", "{{0,0},{1,1},{2,2},{3,3}}")
    assert run_pair(base, unshifted, rel).equal


def test_partition_flavoured_program() -> None:
    """SPMD-partitioner style: partition-id, channel ids, use_global_device_ids."""
    base = (
        "HloModule part_base\n"
        + ADD_F32
        + """
ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  zero = f32[] constant(0)
  ROOT s = f32[4]{0} reduce(x, zero), dimensions={0}, to_apply=add
}
"""
    )
    dist = (
        "HloModule part_dist\n"
        + ADD_F32
        + """
ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  pid = u32[] partition-id()
  two = u32[] constant(2)
  start = u32[] multiply(pid, two)
  z = u32[] constant(0)
  piece = f32[2,4]{1,0} dynamic-slice(x, start, z), dynamic_slice_sizes={2,4}
  zero = f32[] constant(0)
  part = f32[4]{0} reduce(piece, zero), dimensions={0}, to_apply=add
  id = f32[4]{0} collective-permute(part), channel_id=1, source_target_pairs={{0,0},{1,1},{2,2},{3,3}}
  ROOT s = f32[4]{0} all-reduce(id), channel_id=2, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
}
"""
    )
    rel = yaml.safe_load(
        """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""
    )
    res = run_pair(base, dist, rel)
    assert res.flavour == "partition"
    assert res.equal, res.summary()


def test_bf16_tolerance() -> None:
    base = MLP_BASE.replace("f32[8", "bf16[8").replace("f32[16", "bf16[16").replace(
        "f32[32", "bf16[32").replace("f32[]", "bf16[]")
    dist = mlp_dist("{{0,1,2,3}}").replace("f32", "bf16")
    res = run_pair(base, dist, MLP_RELATIONS, seed=3)
    assert res.outputs[0].dtype == "bfloat16"
    assert res.equal, res.summary()
    assert not run_pair(base, mlp_dist("{{0,1},{2,3}}").replace("f32", "bf16"),
                        MLP_RELATIONS).equal


def test_contract_errors() -> None:
    with pytest.raises(ValueError, match="no input entry"):
        run_pair(MLP_BASE, mlp_dist("{{0,1,2,3}}"),
                 {**MLP_RELATIONS, "inputs": MLP_RELATIONS["inputs"][:2]})
    with pytest.raises(ValueError, match="no parameter named"):
        run_pair(RANK_BASE, RANK_DIST.replace("SIZE", "2"),
                 {**RANK_RELATIONS, "inputs": [{"baseline": "nope", "distributed": 0,
                                                "relation": "duplicate"}]})
    with pytest.raises(ValueError, match="cover ranks"):
        run_pair(MLP_BASE, mlp_dist("{{0,1,2,3}}"), {**MLP_RELATIONS, "groups": [[1, 2, 3, 4]]})


def test_low_level_runners() -> None:
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    (y,) = run_hlo(RANK_BASE, [x])
    np.testing.assert_array_equal(y, 2 * x)
    outs = run_distributed(RANK_DIST.replace("SIZE", "2"),
                           [[x, np.array(r, np.int32)] for r in range(4)])
    np.testing.assert_array_equal(np.concatenate([o[0] for o in outs]), 2 * x)


def test_fast_after_warmup() -> None:
    run_pair(MLP_BASE, mlp_dist("{{0,1,2,3}}"), MLP_RELATIONS)
    t = time.perf_counter()
    res = run_pair(MLP_BASE, mlp_dist("{{0,1,2,3}}"), MLP_RELATIONS, seed=7)
    assert res.equal
    assert time.perf_counter() - t < 2.0


def test_jax_generated_baseline_and_partial_max() -> None:
    """Baseline HLO text from JAX's lowering; distributed per-rank max with partial(max)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def f(x: Any) -> Any:
        return jnp.max(jnp.tanh(x), axis=0)

    base = jax.jit(f).lower(jax.ShapeDtypeStruct((8, 4), jnp.float32)).as_text(dialect="hlo")
    dist = """
HloModule max_dist

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY main {
  x = f32[2,4]{1,0} parameter(0)
  t = f32[2,4]{1,0} tanh(x)
  lowest = f32[] constant(-inf)
  ROOT m = f32[4]{0} reduce(t, lowest), dimensions={0}, to_apply=max
}
"""
    rel = yaml.safe_load(
        """
groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: partial, op: max}
"""
    )
    assert run_pair(base, dist, rel).equal
    rel["outputs"][0]["op"] = "add"
    assert not run_pair(base, dist, rel).equal


def test_command_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from oracle import main

    (tmp_path / "b.hlo").write_text(MLP_BASE)
    (tmp_path / "d.hlo").write_text(mlp_dist("{{0,1,2,3}}"))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(MLP_RELATIONS))
    args = [str(tmp_path / n) for n in ("b.hlo", "d.hlo", "r.yaml")]
    assert main(args) == 0
    assert "EQUAL" in capsys.readouterr().out
    (tmp_path / "d.hlo").write_text(mlp_dist(None))
    assert main([*args, "--seed", "2"]) == 1
    assert "NOT EQUAL" in capsys.readouterr().out


def test_mixed_replica_and_partition_collectives_rejected() -> None:
    dist = (
        "HloModule mixed\n"
        + ADD_F32
        + """
ENTRY main {
  x = f32[4]{0} parameter(0)
  a = f32[4]{0} all-reduce(x), replica_groups={{0,1}}, to_apply=add
  ROOT p = f32[4]{0} collective-permute(a), channel_id=1, source_target_pairs={{0,1},{1,0}}
}
"""
    )
    with pytest.raises(ValueError, match="mixes"):
        run_distributed(dist, [[np.zeros(4, np.float32)] for _ in range(2)])
