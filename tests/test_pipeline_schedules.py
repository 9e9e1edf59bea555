"""Pipeline schedules over several microbatches (issue 27): training steps whose loss is averaged
over the microbatches and whose gradients are accumulated (GPipe, 1F1B, interleaved 1F1B with
virtual stages, torch.distributed.pipelining's scale_grads), proven by rules/microbatch.egg's
reductions over blocks, and a PP x TP forward over microbatches (mbsh); their bug twins
(gradients overwritten, a stale activation, virtual stages assigned contiguously, a missing
all-reduce) diverged with the witness executing the composed stages; and a
PP x TP pipeline of tplm's decoder layers with an uneven layer split. Small shapes: the whole
file is one run of the front end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_runs import ROOT, run_template

_CONFIG = """\
version: 1
root: {root}
python_path: [{pipeline}, {examples}]
hide_frames: ["examples/tplm/parallel.py"]
defaults:
  tp: 1
  timeout: 300
  memory_mb: 4096
  size: {{hidden: 8, layers: 4, batch: 4, microbatches: 2, pp: 2}}
models:
  - name: gpipe_train_m2
    entry: gpipe:gpipe_train
  - name: one_f_one_b_m2
    entry: gpipe:one_f_one_b
  - name: scale_grads_m2
    entry: gpipe:gpipe_train
    size: {{scale_grads: true}}
  - name: interleaved_pp2_vp2
    entry: interleaved:interleaved_1f1b
    size: {{layers: 4}}
  - name: bug_grad_overwritten
    entry: gpipe:gpipe_train
    variant: grad_overwritten
  - name: bug_stale_activation
    entry: gpipe:gpipe_train
    variant: stale_activation
  - name: bug_interleaved_contiguous_chunks
    entry: interleaved:interleaved_1f1b
    size: {{layers: 4}}
    variant: contiguous_chunks
  - name: pp2_tp2_m2
    entry: gpipe:gpipe_tp
    tp: 2
  - name: bug_pp2_tp2_m2_missing_allreduce
    entry: gpipe:gpipe_tp
    tp: 2
    variant: tp_missing_allreduce
  - name: llama_pp2_tp2_uneven
    entry: pipeline.llama_pp:decoder_pipeline
    tp: 2
    size: {{hidden: 32, heads: 4, kv_heads: 2, ffn: 64, seq: 4, batch: 2, layers: 3, vocab: 64}}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("schedules"), ".shardproof.yml", _CONFIG, pipeline=ROOT / "examples" / "pipeline")


def _entry(report: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    return next(m for m in report[0]["models"] if m["name"] == name)


@pytest.mark.parametrize("name", ["gpipe_train_m2", "one_f_one_b_m2", "scale_grads_m2", "interleaved_pp2_vp2", "pp2_tp2_m2", "llama_pp2_tp2_uneven"])
def test_correct_schedules_are_verified(report: tuple[dict[str, Any], Path], name: str) -> None:
    model = _entry(report, name)
    assert model["status"] == "verified", (model["build"].get("error"), (model.get("result") or {}).get("reason"))


def test_training_over_microbatches_proves_the_loss_and_every_gradient(report: tuple[dict[str, Any], Path]) -> None:
    # 4 blocks and the head: 10 gradients and the loss, each the baseline's (duplicate).
    model = _entry(report, "gpipe_train_m2")
    assert [o["ok"] for o in model["result"]["outputs"]] == [True] * 11


def test_interleaved_ranks_own_non_adjacent_stages(report: tuple[dict[str, Any], Path]) -> None:
    import yaml

    spec = yaml.safe_load((report[1] / "interleaved_pp2_vp2" / "pipeline.yaml").read_text())
    # The activation laps the two ranks twice: rank 1 sends back to rank 0 between the laps.
    channels = {(e["src"], e["dst"]) for e in spec["edges"]}
    assert {(0, 1), (1, 0)} <= channels, channels
    params = {st["stage"]: [p["name"] for p in st["parameters"] if p["kind"] == "weight"] for st in spec["stages"]}
    assert any(n.startswith("layers.0.") for n in params[0]) and any(n.startswith("layers.2.") for n in params[0]), params[0]


def test_llama_stages_split_unevenly(report: tuple[dict[str, Any], Path]) -> None:
    import yaml

    spec = yaml.safe_load((report[1] / "llama_pp2_tp2_uneven" / "pipeline.yaml").read_text())
    layers = {st["stage"]: sorted({p["name"].split(".")[1] for p in st["parameters"] if p["kind"] == "weight" and p["name"].startswith("layers.")}) for st in spec["stages"]}
    assert layers == {0: ["0", "1"], 1: ["2"]}, layers


@pytest.mark.parametrize("name", ["bug_grad_overwritten", "bug_stale_activation", "bug_interleaved_contiguous_chunks", "bug_pp2_tp2_m2_missing_allreduce"])
def test_schedule_bugs_are_diverged_with_the_composed_witness(report: tuple[dict[str, Any], Path], name: str) -> None:
    model = _entry(report, name)
    result = model["result"]
    assert model["status"] == "diverged", result["reason"]
    assert result["witness"]["status"] == "confirmed", result["witness"]
    if name == "bug_stale_activation":
        # Inside the repeated block, not at its output: the backward multiply that mixes one
        # microbatch's activation with the next one's gradient (the unfolded run localizes there).
        first = result["divergences"][0]
        lines = (ROOT / "examples" / "pipeline" / "gpipe.py").read_text().splitlines()
        assert first["source"]["file"] == "examples/pipeline/gpipe.py", first
        assert lines[first["source"]["line"] - 1].strip() == "return x + torch.tanh(self.fc(x))", first
        assert first["opcode"] == "multiply", first
