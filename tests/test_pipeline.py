"""Pipelines (issue 27): stage programs joined by point-to-point transfers, composed and checked.

End to end: the GPipe example's stages are traced with their real torch.distributed calls,
composed (engine/pipeline/compose.py) and checked against the single-device model; a bug at a
stage boundary is diverged at its line with the witness executing the composed stages; a
pipeline that cannot run (a wrong peer, a receive-first handshake) is bad input naming both
ends. The schedule checks are also exercised on their own (no torch).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_runs import ROOT, run_template

from shardproof.engine.pipeline.compose import PipelineError, check_schedule

_CONFIG = """\
version: 1
root: {root}
python_path: [{pipeline}]
defaults:
  tp: 1
  timeout: 300
  memory_mb: 4096
  size: {{hidden: 8, layers: 4, batch: 4, microbatches: 1, pp: 2}}
models:
  - name: gpipe_pp4_batch
    entry: gpipe:gpipe
    size: {{pp: 4, transport: batch}}
  - name: bug_drop_layer
    entry: gpipe:gpipe
    variant: drop_layer
    expect: diverged
  - name: train_pp2
    entry: gpipe:gpipe_train
  - name: pp2_tp2
    entry: gpipe:gpipe_tp
    tp: 2
  - name: bug_loss_not_scaled
    entry: gpipe:gpipe
    size: {{loss: true, microbatches: 2}}
    variant: loss_not_scaled
    expect: diverged
  - name: gpipe_m2_isend
    entry: gpipe:gpipe
    size: {{microbatches: 2, transport: isend_irecv}}
  - name: bug_microbatch_order
    entry: gpipe:gpipe
    size: {{microbatches: 2}}
    variant: microbatch_order
    expect: diverged
  - name: wrong_peer
    entry: gpipe:gpipe
    size: {{pp: 4}}
    variant: wrong_peer
  - name: deadlock
    entry: gpipe:gpipe
    variant: deadlock
  - name: deadlock_1f1b
    entry: gpipe:one_f_one_b
    size: {{pp: 4, microbatches: 4}}
    variant: 1f1b_blocking
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("pipeline"), ".shardproof.yml", _CONFIG, pipeline=ROOT / "examples" / "pipeline")


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def _line(marker: str) -> int:
    lines = (ROOT / "examples" / "pipeline" / "gpipe.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


def test_pp4_with_batch_isend_irecv_is_verified(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "gpipe_pp4_batch")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    folder = out / "gpipe_pp4_batch"
    assert all((folder / f"stage{k}.hlo").exists() for k in range(4))
    spec = (folder / "pipeline.yaml").read_text()
    assert spec.count("- src:") == 3  # one transfer per boundary, one microbatch
    # Every stage's instructions keep their stage prefix and their own source lines.
    hlo = (folder / "distributed.hlo").read_text()
    assert "%s0." in hlo and "%s3." in hlo


def test_training_step_loss_and_every_gradient_verified(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "train_pp2")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    # 2 blocks per stage and the head: 10 gradients and the loss, each related to the baseline's
    assert (out / "train_pp2" / "relations.yaml").read_text().count("relation: duplicate}  # stage") == 11


def test_pp_x_tp_stage_is_its_groups_spmd_program(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "pp2_tp2")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    relations = (out / "pp2_tp2" / "relations.yaml").read_text()
    assert "groups: [[0, 1]]" in relations
    assert "relation: sharded, dim: 0}  # weight layers.3.up.weight" in relations  # stage 1's block, column-parallel
    assert "relation: sharded, dim: 1}  # weight layers.0.down.weight" in relations  # stage 0's block, row-parallel
    assert re.search(r"%s1\.all-reduce\S* = ", (out / "pp2_tp2" / "distributed.hlo").read_text())


def test_forward_over_microbatches_is_verified(report: tuple[dict[str, Any], Path]) -> None:
    # rules/microbatch.egg: stage 0's chunks are constant blocks of the batch, every block runs
    # the same row-wise layers on both stages, and the last stage's cat joins them in order.
    summary, out = report
    model = _entry(summary, "gpipe_m2_isend")
    assert model["status"] == "verified", (model["build"].get("error"), model.get("result", {}).get("reason"))
    assert (out / "gpipe_m2_isend" / "pipeline.yaml").read_text().count("- src:") == 2  # one transfer per microbatch


@pytest.mark.parametrize("name", ["bug_drop_layer", "bug_loss_not_scaled", "bug_microbatch_order"])
def test_stage_bugs_are_diverged_with_the_composed_witness(report: tuple[dict[str, Any], Path], name: str) -> None:
    model = _entry(report[0], name)
    result = model["result"]
    assert model["status"] == "diverged", result["reason"]
    assert result["witness"]["status"] == "confirmed", result["witness"]
    assert result["divergences"], result["reason"]
    # Reported at the user's line, not inside a repeated layer: the microbatch slices of the
    # input are proven blocks of the baseline's input before the first (folded) layer reads them.
    at = {"bug_loss_not_scaled": "total = loss if total is None else total + loss", "bug_microbatch_order": "torch.cat(results)"}
    if name in at:
        assert result["divergences"][0]["source"]["line"] == _line(at[name]), result["divergences"][0]


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("wrong_peer", r"send #1 at examples/pipeline/gpipe.py:(\d+) \(stage 0 to stage 3\) has no matching receive on stage 3 \(it receives 0 time\(s\) from stage 0\); receive #1 at examples/pipeline/gpipe.py:(\d+) \(stage 1 from stage 0\) has no matching send on stage 0"),
        ("deadlock", r"the schedule deadlocks: stage 0 waits in recv from stage 1 at examples/pipeline/gpipe.py:(\d+); stage 1 waits in recv from stage 0 at examples/pipeline/gpipe.py:(\d+)"),
        # 1F1B's steady state with a blocking send of the activation before the receive of the
        # gradient: stage 2 sends to 3 while 3 sends its gradient to 2 (rendezvous sends).
        ("deadlock_1f1b", r"stage 2 waits in send to stage 3 at examples/pipeline/gpipe.py:(\d+); stage 3 waits in send to stage 2 at examples/pipeline/gpipe.py:(\d+)"),
    ],
)
def test_pipelines_that_cannot_run_are_bad_input_at_both_ends(report: tuple[dict[str, Any], Path], name: str, pattern: str) -> None:
    model = _entry(report[0], name)
    assert model["status"] == "bad-input", model
    error = model["build"]["error"]
    m = re.search(pattern, error)
    assert m, error
    sends = {_line("dist.send(h, dst=dst)"), _line("dist.recv(buf, src=src)"), _line("dist.recv(flag, src=peer)"), _line("BUG-SITE: 1f1b_blocking"), _line("# send_backward")}
    assert {int(g) for g in m.groups()} <= sends, error


def _op(op: str, peer: int, at: str, shape: str = "f32[2,8]", blocking: bool = True) -> dict[str, Any]:
    return {"op": op, "peer": peer, "blocking": blocking, "shape": shape, "at": at}


def test_schedule_checks_name_both_ends() -> None:
    ok = {"schedule": {0: [_op("send", 1, "a.py:1"), _op("recv", 1, "a.py:2")], 1: [_op("recv", 0, "b.py:1"), _op("send", 0, "b.py:2")]}}
    check_schedule(ok)
    shapes = {"schedule": {0: [_op("send", 1, "a.py:1")], 1: [_op("recv", 0, "b.py:1", shape="f32[4,8]")]}}
    with pytest.raises(PipelineError, match=re.escape("shapes disagree: stage 0 sends f32[2,8] at a.py:1, stage 1 receives into f32[4,8] at b.py:1")):
        check_schedule(shapes)
    orphan = {"schedule": {0: [], 1: [_op("recv", 0, "b.py:7")]}}
    with pytest.raises(PipelineError, match=re.escape("receive #1 at b.py:7 (stage 1 from stage 0) has no matching send on stage 0 (it sends 0 time(s) to stage 1)")):
        check_schedule(orphan)
    # Both send first, blocking: a rendezvous send waits for its receive, so neither goes on;
    # the same order with isend does not block.
    both_send = {"schedule": {0: [_op("send", 1, "a.py:1"), _op("recv", 1, "a.py:2")], 1: [_op("send", 0, "b.py:1"), _op("recv", 0, "b.py:2")]}}
    with pytest.raises(PipelineError, match=re.escape("deadlocks: stage 0 waits in send to stage 1 at a.py:1; stage 1 waits in send to stage 0 at b.py:1")):
        check_schedule(both_send)
    for ops in both_send["schedule"].values():
        ops[0]["blocking"] = False
    check_schedule(both_send)


def test_compose_command_rebuilds_the_program_and_rejects_a_broken_artifact(report: tuple[dict[str, Any], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from shardproof.engine.cli import main

    # A dropped layer leaves baseline weights no stage reads: the artifact records them.
    folder = tmp_path / "drop"
    shutil.copytree(report[1] / "bug_drop_layer", folder)
    assert main(["compose", str(folder), "--out", str(tmp_path / "again.hlo")]) == 0
    assert (tmp_path / "again.hlo").read_text() == (folder / "distributed.hlo").read_text()
    spec = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert spec["unread"] and spec["unread"][0]["name"] == "layers.2.fc.weight"
    spec["schedule"][1] = [op for op in spec["schedule"][1] if op["op"] != "recv"]
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(spec))
    assert main(["compose", str(folder)]) == 3
    err = capsys.readouterr().err
    assert re.search(r"pipeline\.yaml:transfers: send #1 at examples/pipeline/gpipe\.py:\d+ \(stage 0 to stage 1\) has no matching receive on stage 1", err), err


def test_odd_layers_of_a_training_step_are_found_without_walking_the_backward_gap() -> None:
    # A pipeline training step folds forward and backward layers (numbered from BACKWARD_BASE
    # down); the odd layer search once walked every integer in between (84 s for train_1f1b_pp4).
    from types import SimpleNamespace

    from shardproof.engine.analysis.check import odd_layers
    from shardproof.engine.analysis.partition import BACKWARD_BASE

    a, b = SimpleNamespace(cls=0), SimpleNamespace(cls=1)
    layers = {0: a, 2: a, 3: a, 5: b, BACKWARD_BASE - 3: b, BACKWARD_BASE - 1: b}
    assert odd_layers(SimpleNamespace(layers=layers)) == [1, BACKWARD_BASE - 2]
