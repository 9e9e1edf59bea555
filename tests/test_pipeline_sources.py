"""Pipelines from torch.distributed.pipelining, as written (issue 27, sources).

Each rank of examples/pipeline/torch_pipelining builds its stage (``pipeline()`` or a manual
``PipelineStage``) and a real torch schedule and calls ``schedule.step``; the front end records
the schedule's transfers per rank, composes the ranks' programs and checks them against the
single-device model. Bugs of the user's code are diverged with the witness executing the
composed ranks; ranks that disagree about the schedule are bad input naming both ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_runs import ROOT, run_template

_CONFIG = """\
version: 1
root: {root}
python_path: [{pipeline}]
defaults:
  tp: 1
  timeout: 300
  memory_mb: 4096
  size: {{hidden: 8, layers: 4, batch: 4, microbatches: 2, pp: 2}}
models:
  - name: manual_gpipe
    entry: torch_pipelining.models:manual_gpipe
  - name: train_1f1b
    entry: torch_pipelining.models:manual_train
    size: {{scaling: loss}}
  - name: train_interleaved
    entry: torch_pipelining.models:interleaved_train
    size: {{layers: 8, batch: 8, microbatches: 4}}
  - name: bug_drop_layer
    entry: torch_pipelining.models:manual_gpipe
    variant: drop_layer
    expect: diverged
  - name: bug_loss_not_scaled
    entry: torch_pipelining.models:manual_train
    size: {{scaling: loss}}
    variant: loss_not_scaled
    expect: diverged
  - name: bad_shapes
    entry: torch_pipelining.models:manual_gpipe
    variant: whole_batch_input_args
  - name: bad_microbatches
    entry: torch_pipelining.models:manual_gpipe
    variant: microbatches_disagree
  - name: megatron_train
    entry: megatron_pp.models:training
    size: {{microbatches: 1, batch: 2}}
  - name: megatron_train_m2
    entry: megatron_pp.models:training
    size: {{batch: 4}}
  - name: bug_megatron_stale_target
    entry: megatron_pp.models:training
    size: {{batch: 2}}
    variant: stale_target
    expect: diverged
  - name: bad_megatron_seq_length
    entry: megatron_pp.models:forward_only
    size: {{microbatches: 1, batch: 2}}
    variant: seq_length_disagrees
  - name: megatron_gpt_uneven
    entry: megatron_pp.gpt:forward_only
    size: {{hidden: 16, heads: 2, first_stage_layers: 1, vocab: 32}}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("pipeline_sources"), ".shardproof.yml", _CONFIG, pipeline=ROOT / "examples" / "pipeline")


def _entry(report: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    return next(m for m in report[0]["models"] if m["name"] == name)


def _line(marker: str, after: str, source: str = "torch_pipelining/models.py") -> int:
    lines = (ROOT / "examples" / "pipeline" / source).read_text().splitlines()
    start = next(i for i, text in enumerate(lines, 1) if after in text)
    return next(i for i, text in enumerate(lines, 1) if i > start and marker in text)


# megatron_train_m2: 2 microbatches cut along the batch dim of (seq, batch, hidden), which the
# 3-D linear merges with seq: strided blocks (rules/microbatch.egg mbi), weight gradients
# contracted over them.
@pytest.mark.parametrize("name", ["manual_gpipe", "train_1f1b", "train_interleaved", "megatron_train", "megatron_train_m2", "megatron_gpt_uneven"])
def test_torch_schedules_are_verified(report: tuple[dict[str, Any], Path], name: str) -> None:
    model = _entry(report, name)
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))


def test_schedule_transfers_are_recorded_per_microbatch(report: tuple[dict[str, Any], Path]) -> None:
    out = report[1]
    # GPipe forward, 2 ranks, 2 microbatches: one activation per microbatch, no handshake.
    assert (out / "manual_gpipe" / "pipeline.yaml").read_text().count("- src:") == 2
    # 1F1B training: activations forward and their gradients back, per microbatch.
    assert (out / "train_1f1b" / "pipeline.yaml").read_text().count("- src:") == 4
    # Interleaved, 2 ranks x 2 virtual stages: 3 stage boundaries (one from rank 1 back to
    # rank 0), each crossed by 4 microbatches forward and 4 gradients back.
    assert (out / "train_interleaved" / "pipeline.yaml").read_text().count("- src:") == 24


@pytest.mark.parametrize("name", ["bug_drop_layer", "bug_loss_not_scaled", "bug_megatron_stale_target"])
def test_bugs_are_diverged_with_a_confirmed_witness(report: tuple[dict[str, Any], Path], name: str) -> None:
    model = _entry(report, name)
    result = model["result"]
    assert model["status"] == "diverged", result["reason"]
    assert result["witness"]["status"] == "confirmed", result["witness"]


def test_ranks_that_disagree_are_bad_input_naming_both_ends(report: tuple[dict[str, Any], Path]) -> None:
    step = _line("return schedule.step(x) if rank == 0 else schedule.step()", "def manual_gpipe")
    shapes = _entry(report, "bad_shapes")
    assert shapes["status"] == "bad-input"
    assert f"shapes disagree: stage 0 sends f32[2,8] at examples/pipeline/torch_pipelining/models.py:{step}, stage 1 receives into f32[4,8] at examples/pipeline/torch_pipelining/models.py:{step}" in shapes["build"]["error"]
    counts = _entry(report, "bad_microbatches")
    assert counts["status"] == "bad-input"
    assert f"receive #3 at examples/pipeline/torch_pipelining/models.py:{step} (stage 1 from stage 0) has no matching send on stage 0 (it sends 2 time(s) to stage 1)" in counts["build"]["error"]



def test_megatron_transfers_name_the_users_line(report: tuple[dict[str, Any], Path]) -> None:
    # Megatron's p2p_communication posts the transfers; the error names the user's call of the
    # schedule on both ranks, not the library's line.
    call = _line("get_forward_backward_func()(", "def forward_only", "megatron_pp/models.py")
    model = _entry(report, "bad_megatron_seq_length")
    assert model["status"] == "bad-input"
    at = f"examples/pipeline/megatron_pp/models.py:{call}"
    assert f"shapes disagree: stage 0 sends f32[2,2,8] at {at}, stage 1 receives into f32[4,2,8] at {at}" in model["build"]["error"]


def test_megatron_gpt_stage_layers_are_named_by_megatrons_offset(report: tuple[dict[str, Any], Path]) -> None:
    # Megatron numbers each stage's layers from 0; stage 1 (3 of 4 layers) holds the baseline's
    # decoder.layers.1 .. 3, stage 0 the embeddings and decoder.layers.0.
    spec = (report[1] / "megatron_gpt_uneven" / "pipeline.yaml").read_text()
    stage1 = spec[spec.index("- stage: 1"):spec.index("edges:")]
    assert "gpt.decoder.layers.3.mlp.linear_fc2.weight" in stage1 and "gpt.decoder.layers.0." not in stage1
    assert "gpt.output_layer.weight" in stage1 and "gpt.embedding" not in stage1


def test_rank_program_keeps_the_stage_modules_names() -> None:
    import torch.nn as nn

    from shardproof.engine.frontend.pipeline.program import rank_program

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({str(i): nn.Linear(2, 2) for i in range(4)})

    a, b = Net(), Net()
    del a.layers["1"], a.layers["3"], b.layers["0"], b.layers["2"]
    program = rank_program([a, b], lambda x: x)
    assert sorted(n for n, _ in program.named_parameters()) == sorted(f"layers.{i}.{k}" for i in range(4) for k in ("weight", "bias"))
    # The program holds the stage modules' own submodules: a weight swapped on it is theirs.
    assert program.get_submodule("layers.1") is b.layers["1"]
    with pytest.raises(ValueError, match="held by two stage modules"):
        rank_program([a, Net()], lambda x: x)


_JAX_CONFIG = """\
version: 1
framework: jax
root: {root}
python_path: [{pipeline}]
defaults:
  devices: 4
models:
  - name: gpipe_per_rank
    entry: jax_gpipe.models:gpipe_per_rank
    size: {{layers_per_stage: 2}}
  - name: bug_wrong_peer
    entry: jax_gpipe.models:gpipe_per_rank
    variant: wrong_peer
    expect: diverged
  - name: gpipe_spmd
    entry: jax_gpipe.models:gpipe
    expect: unproven
  - name: gpipe_pp2_tp2
    entry: jax_gpipe.models:gpipe_tp
  - name: bug_pp2_tp2_missing_psum
    entry: jax_gpipe.models:gpipe_tp
    variant: tp_missing_psum
    expect: diverged
"""


@pytest.fixture(scope="module")
def jax_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("pipeline_jax"), ".shardproof.yml", _JAX_CONFIG, pipeline=ROOT / "examples" / "pipeline")


def test_jax_gpipe_split_per_rank_is_verified_and_its_bug_diverged(jax_report: tuple[dict[str, Any], Path]) -> None:
    model = _entry(jax_report, "gpipe_per_rank")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    out = jax_report[1] / "gpipe_per_rank"
    # The composed program holds every rank's work: 4 microbatches x 4 stages x 2 layers, and
    # no collective is left (the permutes are wiring, the psum a sum of the ranks' values).
    hlo = (out / "distributed.hlo").read_text()
    assert hlo.count(" dot(") == 32
    assert "collective-permute" not in hlo and "all-reduce" not in hlo
    bug = _entry(jax_report, "bug_wrong_peer")
    assert bug["status"] == "diverged", bug["result"]["reason"]
    assert bug["result"]["witness"]["status"] == "confirmed", bug["result"]["witness"]
    # As one SPMD program the same pipeline is not proven: the per-rank where has no relation.
    assert _entry(jax_report, "gpipe_spmd")["status"] == "unproven"


def test_jax_pp_x_tp_keeps_the_tp_collectives_spmd(jax_report: tuple[dict[str, Any], Path]) -> None:
    model = _entry(jax_report, "gpipe_pp2_tp2")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    out = jax_report[1] / "gpipe_pp2_tp2"
    # One SPMD program over the TP group: the stages composed inside it, the weights still
    # split over tp (column-parallel up along its last dim, row-parallel down along its middle).
    relations = (out / "relations.yaml").read_text()
    assert "- [0, 1]" in relations and "relation: sharded, dim: 2, name: up" in relations and "relation: sharded, dim: 1, name: down" in relations
    hlo = (out / "distributed.hlo").read_text()
    assert "all-reduce" in hlo and "collective-permute" not in hlo
    bug = _entry(jax_report, "bug_pp2_tp2_missing_psum")
    assert bug["status"] == "diverged" and bug["result"]["witness"]["status"] == "confirmed", bug["result"]["reason"]


def test_jax_split_refuses_a_collective_it_cannot_compose() -> None:
    import jax
    import jax.numpy as jnp
    from jax import shard_map
    from jax.sharding import PartitionSpec as P

    from shardproof.engine.frontend.jax.declare import JaxInput, JaxModel
    from shardproof.engine.frontend.pipeline.jaxsplit import JaxPipeline, SplitError, composed

    mesh = jax.make_mesh((1,), ("pp",))
    dist = shard_map(lambda x: jax.lax.pmax(x, "pp"), mesh=mesh, in_specs=(P(),), out_specs=P(), check_vma=False)
    model = JaxModel(lambda x: x, dist, mesh, [JaxInput("x", (2, 2))])
    fn, *_ = composed(JaxPipeline(model), [jax.ShapeDtypeStruct((2, 2), jnp.float32)])
    with pytest.raises(SplitError, match=r"pmax at .*test_pipeline_sources\.py:\d+: pmax has no per-rank form"):
        jax.jit(fn).lower(jax.ShapeDtypeStruct((2, 2), jnp.float32))
