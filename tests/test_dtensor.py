"""DTensor code in the torch.distributed front end (engine/frontend/dtensor).

The placement -> relation logic is tested without torch. End to end, one run builds a few
models of examples/dtensor (one worker: one import of torch-xla) - a "cuda" mesh, sequence
parallelism (DTensor's reduce-scatter along the sequence dim), a bug patched into
RowwiseParallel, a style swap on a fused projection that builds - and the bad inputs of a DTensor model: a placement that does not divide a dim,
a mesh larger than the world, a plan entry naming no module, an "xla" mesh.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from config_runs import run_template

from shardproof.engine.frontend.dtensor.placements import (
    Placed,
    PlacementError,
    input_relation,
    output_relation,
    param_relation,
)

ROOT = Path(__file__).resolve().parents[1]
WORLD = [[0, 1, 2, 3]]
TP2 = [[0, 1], [2, 3]]


def _placed(*placements: tuple[str, int | None], groups: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3),), names: tuple[str, ...] = ("tp",)) -> Placed:
    return Placed(tuple(placements), groups, names, "(...)")


# ---- placements -> relations, no torch ------------------------------------------------------


def test_shard_replicate_and_2d_meshes_give_relations() -> None:
    rel = param_relation("up.weight", _placed(("shard", 0)), (64, 32), (16, 32), WORLD)
    assert (rel.relation, rel.dim) == ("sharded", 0) and rel.source.startswith("placement")
    assert param_relation("down.bias", _placed(("replicate", None)), (32,), (32,), WORLD).relation == "duplicate"
    # (dp, tp): replicated over dp, sharded over the tp dim whose group is the model's.
    two_d = _placed(("replicate", None), ("shard", 1), groups=((0, 2), (0, 1)), names=("dp", "tp"))
    assert param_relation("w", two_d, (32, 64), (32, 32), TP2).dim == 1
    # transformers' packed gate/up: _StridedShard(1, split_factor=2) is two blocks, each sharded.
    packed = Placed((("shard", 1),), ((0, 1, 2, 3),), ("tp",), "(_StridedShard(dim=1, sf=2))", split=2)
    rel = param_relation("experts.gate_up_proj", packed, (4, 128, 32), (4, 32, 32), WORLD)
    assert (rel.relation, rel.dim, rel.blocks) == ("sharded", 1, (64, 64))
    assert output_relation(0, _placed(("partial", None)), (2, 8), (2, 8), WORLD) == {"relation": "partial"}
    assert output_relation(0, _placed(("shard", 1)), (2, 8, 32), (2, 2, 32), WORLD) == {"relation": "sharded", "dim": 1}


@pytest.mark.parametrize(
    ("placed", "full", "local", "groups", "message"),
    [
        (_placed(("shard", 0)), (66, 32), (17, 32), WORLD, "does not divide over the 4 ranks"),
        (_placed(("shard", 0)), (64, 32), (64, 32), WORLD, "should hold [16, 32]"),
        (_placed(("replicate", None)), (64,), (16,), WORLD, "(replicated) but is [64]"),
        (_placed(("partial", None)), (64,), (64,), WORLD, "partial sum over ranks has no relation"),
        # sharded over the dp dim of a (dp, tp) mesh while the model's groups are the tp groups
        (_placed(("shard", 0), ("replicate", None), groups=((0, 2), (0, 1)), names=("dp", "tp")), (64, 8), (32, 8), TP2, "mesh dim 'dp' groups ranks [0, 2]"),
        (_placed(("shard", 0), ("shard", 1), groups=((0, 2), (0, 1)), names=("dp", "tp")), (64, 8), (32, 4), TP2, "over mesh dims dp, tp at once"),
    ],
)
def test_placements_no_relation_describes_are_errors(placed: Placed, full: tuple[int, ...], local: tuple[int, ...], groups: list[list[int]], message: str) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        param_relation("w", placed, full, local, groups)


DP_TP = ((0, 2), (0, 1))  # rank 0's groups on a (dp, tp) = (2, 2) mesh
DP_TP_ALL = (((0, 2), (1, 3)), ((0, 1), (2, 3)))


def test_fsdp_over_tensor_parallel_is_gathered_over_the_dp_groups() -> None:
    both = Placed((("shard", 0), ("shard", 1)), DP_TP, ("dp", "tp"), "(...)", all_groups=DP_TP_ALL)
    rel = param_relation("w_in", both, (32, 64), (16, 32), TP2)
    assert (rel.relation, rel.dim, rel.gathered) == ("sharded", 1, (0, ((0, 2), (1, 3))))
    bias = Placed((("shard", 0), ("replicate", None)), DP_TP, ("dp", "tp"), "(...)", all_groups=DP_TP_ALL)
    assert param_relation("bias", bias, (32,), (16,), TP2).gathered == (0, ((0, 2), (1, 3)))
    # the same dim over dp and tp: DTensor cuts dp outside the tp pieces, a gathered relation inside
    same = Placed((("shard", 0), ("shard", 0)), DP_TP, ("dp", "tp"), "(...)", all_groups=DP_TP_ALL)
    with pytest.raises(PlacementError, match="DTensor nests the 'dp' cut outside the other"):
        param_relation("w", same, (64, 32), (16, 32), TP2)
    # a local shape that is not the two cuts
    with pytest.raises(PlacementError, match=re.escape("should hold [32, 32] of the baseline's [32, 64], but it holds [16, 32] once its 2 blocks along dim 0 are gathered over 'dp' (it holds [8, 32])")):
        param_relation("w_in", both, (32, 64), (8, 32), TP2)
    # partial over dp (no FSDP): still no relation
    partial = Placed((("partial", None), ("shard", 1)), DP_TP, ("dp", "tp"), "(...)", all_groups=DP_TP_ALL)
    with pytest.raises(PlacementError, match="over mesh dims dp, tp at once"):
        param_relation("w", partial, (32, 64), (32, 32), TP2)


def test_input_relations_from_from_local_placements() -> None:
    seq = _placed(("shard", 1))
    # declared and placed alike; without a declaration (and no plan) the placement decides
    assert input_relation("x", seq, (2, 8, 32), 1, (), False, WORLD) == 1
    assert input_relation("x", seq, (2, 8, 32), None, (), True, WORLD) == 1
    assert input_relation("x", _placed(("replicate", None)), (2, 8, 32), None, (), False, WORLD) is None
    two_d = _placed(("replicate", None), ("shard", 1), groups=((0, 2), (0, 1)), names=("dp", "tp"))
    assert input_relation("x", two_d, (2, 8, 32), None, (), True, TP2) == 1
    strided = Placed((("shard", 1),), ((0, 1, 2, 3),), ("tp",), "(_StridedShard(dim=1, sf=2))", split=2)
    assert input_relation("x", strided, (2, 16, 32), 1, (8, 8), False, WORLD) == 1


@pytest.mark.parametrize(
    ("placed", "shard", "blocks", "derive", "message"),
    [
        (_placed(("replicate", None)), 1, (), False, "is declared Input(shard=1), so each rank holds a piece of the baseline's [2, 8, 32], but DTensor.from_local places it (...) on mesh (tp=4): replicated"),
        (_placed(("shard", 1)), None, (), False, "is declared replicated (Input without shard=) (every rank holds all of [2, 8, 32]), but DTensor.from_local places it (...) on mesh (tp=4): DTensor takes each rank's whole tensor for one of 4 pieces along dim 1; declare Input(shard=1)"),
        (_placed(("shard", 2)), 1, (), False, "another piece of it than declared; declare Input(shard=2)"),
        (_placed(("shard", 1)), 1, (4, 4), False, "another piece of it than declared; declare Input(shard=1)"),
        (_placed(("partial", None)), None, (), True, "an input held as partial sums has no relation"),
        (_placed(("shard", 1), ("replicate", None), groups=((0, 2), (0, 1)), names=("dp", "tp")), None, (), True, "mesh dim 'dp' groups ranks [0, 2], which is not a group of the model"),
    ],
)
def test_input_placements_that_disagree_with_the_declaration(placed: Placed, shard: int | None, blocks: tuple[int, ...], derive: bool, message: str) -> None:
    with pytest.raises(PlacementError, match=re.escape(message)):
        input_relation("x", placed, (2, 8, 32), shard, blocks, derive, TP2 if len(placed.groups) > 1 else WORLD)


# ---- the per-rank lift of DTensor's Replicate -> Shard cut ---------------------------------


def _cut_program(start: int) -> str:
    """One rank's program: its piece of a replicated input, cut at a literal offset (DTensor's
    ``torch.chunk`` of a replicated tensor, indexed by the Python rank)."""
    return f"""HloModule IrToHlo.4

ENTRY %IrToHlo.4 (p0.1: f32[2,64]) -> (f32[2,16]) {{
  %p0.1 = f32[2,64]{{1,0}} parameter(0), metadata={{op_type="xla__device_data" source_file="model.py" source_line=7}}
  %slice.2 = f32[2,16]{{1,0}} slice(f32[2,64]{{1,0}} %p0.1), slice={{[0:2], [{start}:{start + 16}]}}, metadata={{op_type="aten__split" source_file="model.py" source_line=8}}
  ROOT %tuple.3 = (f32[2,16]{{1,0}}) tuple(f32[2,16]{{1,0}} %slice.2)
}}
"""


_CUT_BASELINE = """HloModule base

ENTRY %base (p0.1: f32[2,64]) -> (f32[2,64]) {
  %p0.1 = f32[2,64]{1,0} parameter(0)
  ROOT %tuple.2 = (f32[2,64]{1,0}) tuple(f32[2,64]{1,0} %p0.1)
}
"""
_CUT_RELATIONS = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}


@pytest.mark.parametrize(("starts", "affine", "equal"), [((0, 16, 32, 48), True, True), ((0, 32, 16, 48), False, False)])
def test_slices_at_per_rank_offsets_lift_to_a_dynamic_slice_at_the_rank_s_offset(starts: tuple[int, ...], affine: bool, equal: bool) -> None:
    from shardproof.engine.frontend.torchdist.lift import lift

    lifted = lift([_cut_program(s) for s in starts], [0, 1, 2, 3], [[0, 1, 2, 3]])
    assert lifted.faithful and "dynamic-slice(f32[2,64]{1,0} %p0.1, s32[] %slice.2.start0, s32[] %slice.2.start1), dynamic_slice_sizes={2,16}" in lifted.text
    assert f"constant({{{', '.join(map(str, starts))}}})" in lifted.text and lifted.affine == int(affine)
    # ranks 1 and 2 swapped: a rank-specific finding (a claim only with the witness, below)
    assert len(lifted.findings) == (0 if affine else 1)
    oracle = pytest.importorskip("oracle")
    assert oracle.run_pair(_CUT_BASELINE, lifted.text, _CUT_RELATIONS, seed=0).equal is equal


# ---- end to end -----------------------------------------------------------------------------

_CONFIG = """\
version: 1
root: {root}
python_path: [{dtensor}]
defaults: {{tp: 4, rank: int, timeout: 300, memory_mb: 4096}}
models:
  - name: mlp_cuda_tp4
    entry: models:mlp
    size: {{device: cuda}}
  - name: block_sp_tp4
    entry: models:block
    size: {{sequence_parallel: true}}
  - name: bug_dropped_reduction
    entry: models:block
    variant: dropped_reduction
    expect: diverged
  - name: uneven
    entry: models:uneven
    size: {{hidden: 66}}
  - name: big_mesh
    entry: models:big_mesh
  - name: bad_plan_key
    entry: models:bad_plan_key
  - name: xla_mesh
    entry: models:xla_mesh
  - name: input_declared_sharded
    entry: models:mlp
    size: {{input_shard: 1}}
  - name: fused_mlp_tp4
    entry: models:fused_mlp
  - name: bug_fused_colwise
    entry: models:fused_mlp
    variant: fused_colwise
    expect: diverged
  - name: fully_sharded
    entry: models:fully_sharded
    groups: [[0, 1], [2, 3]]
  - name: fsdp_dp2_tp2
    entry: models:fsdp_tp
    groups: [[0, 1], [2, 3]]
  - name: bug_fsdp_gather_over_tp
    entry: models:fsdp_tp
    groups: [[0, 1], [2, 3]]
    variant: gather_over_tp
    expect: diverged
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("dtensor")
    return run_template(folder, ".shardproof.yml", _CONFIG, dtensor=ROOT / "examples" / "dtensor")


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def test_cuda_mesh_and_sequence_parallel_verify_with_relations_from_placements(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    for name in ("mlp_cuda_tp4", "block_sp_tp4"):
        model = _entry(summary, name)
        assert model["status"] == "verified", (model["build"]["error"], model.get("result", {}).get("reason"))
    relations = (out / "mlp_cuda_tp4" / "relations.yaml").read_text()
    # Local-shape placeholders, each relation beside the placement it came from.
    assert "relation: sharded, dim: 0}  # up.weight: f32[64,32] -> f32[16,32] (placement (Shard(dim=0)) on mesh (tp=4))" in relations
    assert "relation: duplicate}  # down.bias: f32[32] (placement (Replicate()) on mesh (tp=4))" in relations
    # The block declares its input without shard=: SequenceParallel's from_local places it Shard(1).
    relations = (out / "block_sp_tp4" / "relations.yaml").read_text()
    assert "relation: sharded, dim: 1}  # input x: f32[2,8,32] -> f32[2,2,32] (placement (Shard(dim=1)) on mesh (tp=4))" in relations
    # DTensor's reduce-scatter along the sequence dim (blocks concatenated on dim 0) is proven.
    hlo = (out / "block_sp_tp4" / "distributed.hlo").read_text()
    assert re.search(r"reduce-scatter\(f32\[8,2,32\]", hlo)


def test_dropped_reduction_is_diverged_at_the_patched_hook(report: tuple[dict[str, Any], Path]) -> None:
    model = _entry(report[0], "bug_dropped_reduction")
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    source = result["divergences"][0]["source"]
    # the attention output (a row-parallel wo) reaches the residual add unreduced
    lines = (ROOT / "examples" / "dtensor" / "models.py").read_text().splitlines()
    residual = next(i for i, text in enumerate(lines, 1) if "h = x + self.attention(self.attention_norm(x))" in text)
    assert (source["file"], source["line"]) == ("examples/dtensor/models.py", residual), source


def test_a_style_swap_that_builds_is_diverged_and_its_correct_plan_verified(report: tuple[dict[str, Any], Path]) -> None:
    """Llama's Colwise/Rowwise pair on a fused gate/up projection builds (every shape fits) and
    pairs gate rows with gate rows on each rank; gathering before the chunk verifies."""
    correct = _entry(report[0], "fused_mlp_tp4")
    assert correct["status"] == "verified", correct.get("result", {}).get("reason")
    model = _entry(report[0], "bug_fused_colwise")
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    lines = (ROOT / "examples" / "dtensor" / "models.py").read_text().splitlines()
    use = next(i for i, text in enumerate(lines, 1) if "return self.w2(F.silu(gate) * up)" in text)
    source = result["divergences"][0]["source"]
    assert (source["file"], source["line"]) == ("examples/dtensor/models.py", use), source


def test_fsdp_over_tensor_parallel_verifies_and_a_gather_over_the_wrong_mesh_dim_diverges(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "fsdp_dp2_tp2")
    assert model["status"] == "verified", (model["build"]["error"], model.get("result", {}).get("reason"))
    relations = (out / "fsdp_dp2_tp2" / "relations.yaml").read_text()
    assert "relation: sharded, dim: 1, gathered: {dim: 0, groups: [[0, 2], [1, 3]]}}  # w_in: f32[32,64] -> f32[16,32] (placement (Shard(dim=0), Shard(dim=1)) on mesh (dp=2, tp=2), gathered over 'dp')" in relations
    bug = _entry(summary, "bug_fsdp_gather_over_tp")
    result = bug["result"]
    assert bug["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    lines = (ROOT / "examples" / "dtensor" / "models.py").read_text().splitlines()
    site = next(i for i, text in enumerate(lines, 1) if "# BUG-SITE: gather_over_tp" in text)
    source = result["divergences"][0]["source"]
    assert (source["file"], source["line"]) == ("examples/dtensor/models.py", site), source


@pytest.mark.parametrize(
    ("name", "where", "message"),
    [
        ("uneven", "models[3].entry", "parameter 'up.weight' is (Shard(dim=0)) on mesh (tp=4): dim 0 of its global shape [66, 32] (66) does not divide over the 4 ranks"),
        ("big_mesh", "models[4].tp", "device mesh of shape (8,) (8 ranks), but its world has 4 rank(s)"),
        ("bad_plan_key", "models[5].entry", "Parallelize plan key 'down_proj' could not be resolved"),
        ("xla_mesh", "models[6].entry", "an 'xla' device mesh, which sends DTensor to torch-xla's SPMD partitioner"),
        ("fully_sharded", "models[10].entry", "'the model' is wrapped by fully_shard (FSDP2), which is not hosted yet"),
        ("input_declared_sharded", "models[7].entry", "input 'x' is declared Input(shard=1), so each rank holds a piece of the baseline's [2, 8, 32], but DTensor.from_local places it (Replicate()) on mesh (tp=4): replicated, so DTensor takes each rank's piece for the whole tensor; declare it without shard= or place it Shard(1) (DTensor.from_local at models.py:"),
    ],
)
def test_bad_input_names_the_config_line(report: tuple[dict[str, Any], Path], name: str, where: str, message: str) -> None:
    model = _entry(report[0], name)
    assert model["status"] == "bad-input", model["build"]["error"]
    error = model["build"]["error"]
    assert re.match(r"\S*\.shardproof\.yml:\d+: " + re.escape(where) + ": ", error), error
    assert message in error, error
