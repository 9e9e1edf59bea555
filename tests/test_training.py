"""Training at depth: forward + backward + optimizer step, verified layer by layer.

The front end names every autograd instruction by the forward call it differentiates
(``backward.N/<module path>/...`` in op_name, the forward call's frames in the source map); the
partitioner cuts the backward at layer boundaries in reverse order and memoizes (and folds)
repeated backward layers like forward ones. Real torch-xla builds of examples/tplm, real egglog,
XLA's CPU runtime as the witness.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bug_sites import bug_sites
from config_runs import TPLM_HEAD, run_template

from shardproof.engine.analysis.partition import (
    BACKWARD_BASE,
    DEFAULT_LAYER_PATTERN,
    Side,
    label_text,
    layer_label,
    plan,
)
from shardproof.engine.analysis.verify import Budget, verify
from shardproof.engine.hlo import fold as hlofold
from shardproof.engine.hlo.parser import parse_hlo, parse_hlo_file
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap

ROOT = Path(__file__).parents[1]
GAPS = ROOT / "tests" / "gaps"
SITES = bug_sites(sorted((ROOT / "examples" / "tplm").glob("*.py")), ROOT)
RX = re.compile(DEFAULT_LAYER_PATTERN)

CONFIG = TPLM_HEAD + """\
  size: {{vocab: 256, hidden: 64, layers: 3, heads: 8, kv_heads: 4, ffn: 128, seq: 8, batch: 2}}
models:
  - {{name: train3_fused, entry: tplm.models:train_step, expect: verified}}
  - {{name: train3_wrong_group, entry: tplm.models:train_step, variant: sp_norm_grad_wrong_group, expect: diverged}}
  - {{name: train2_norm_twice, entry: tplm.models:train_step, variant: sp_norm_grad_twice, size: {{layers: 2}}, expect: diverged}}
  - {{name: dp_ok, entry: tplm.models:dp_train_step, size: {{layers: 2, batch: 8}}, expect: verified}}
  - {{name: dp_missing, entry: tplm.models:dp_train_step, variant: dp_grad_missing, size: {{layers: 2, batch: 8}}, expect: diverged}}
  - {{name: dp_twice, entry: tplm.models:dp_train_step, variant: dp_grad_scaled_twice, size: {{layers: 2, batch: 8}}, expect: diverged}}
  - {{name: adamw_accumulated, entry: tplm.models:train_step, size: {{layers: 2, optimizer: adamw, micro_batches: 2}}, expect: verified}}
  - {{name: mixed_ok, entry: tplm.train:mixed_train_step, size: {{layers: 2, fused: false}}, expect: verified}}
  - {{name: mixed_unscale, entry: tplm.train:mixed_train_step, variant: mp_unscale_missing, size: {{layers: 1, fused: false}}, expect: diverged}}
  - {{name: zero_ok, entry: tplm.train:zero_train_step, size: {{layers: 2, fused: false, batch: 8}}, expect: verified}}
  - {{name: zero_wrong_shard, entry: tplm.train:zero_train_step, variant: zero_wrong_shard, size: {{layers: 2, fused: false, batch: 8}}, expect: diverged}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("training"), "train.shardproof.yml", CONFIG)


def model(built: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    return next(m for m in built[0]["models"] if m["name"] == name)


# ---- labels and cutting, no torch ---------------------------------------------------------------


def test_backward_labels_run_the_layers_in_reverse() -> None:
    assert layer_label("model.1/model.layers.3.2/aten__mm", RX) == 3
    assert layer_label("backward.4/model.layers.3.attn.q.1/aten__mm", RX) == BACKWARD_BASE - 3
    assert layer_label("backward/model.layers.0/aten__mm", RX) == BACKWARD_BASE
    assert layer_label("jit(f)/transpose(jvp(f))/layers_2/dot_general", RX) == BACKWARD_BASE - 2
    assert layer_label("backward.1/model.norm.1/aten__mul", RX) == -1  # no layer: inherits
    assert layer_label("model.backwardish.layers.2/aten__mm", RX) == 2  # a module named so is no marker
    backward = [BACKWARD_BASE - k for k in (31, 7, 0)]
    assert sorted(backward) == backward and min(backward) > 10**6
    assert label_text(BACKWARD_BASE - 7) == "backward of 7" and label_text(7) == "7"


def test_tuples_with_index_comments_still_fold() -> None:
    """XLA writes /*index=5*/ into operand lists of more than five; a training step returns one
    output per parameter, so its ROOT always has them."""
    body = []
    for k in range(3):
        src = "p0" if k == 0 else f"m{k - 1}"
        body.append(f'  %m{k} = f32[4]{{0}} multiply(f32[4]{{0}} %{src}, f32[4]{{0}} %{src}), metadata={{op_name="layers.{k}/aten__mul"}}')
    outs = ", ".join(["f32[4]{0} %m2"] * 5) + ", /*index=5*/f32[4]{0} %m2"
    text = "HloModule m\n\nENTRY %main (p0: f32[4]) -> (f32[4], f32[4], f32[4], f32[4], f32[4], /*index=5*/f32[4]) {\n  %p0 = f32[4]{0} parameter(0)\n" + "\n".join(body) + f"\n  ROOT %t = (f32[4], f32[4], f32[4], f32[4], f32[4], /*index=5*/f32[4]) tuple({outs})\n}}\n"
    parse_hlo(text)  # the parser reads it
    f = hlofold.fold(text, text, {"baseline": lambda n, md: md, "distributed": lambda n, md: md}, DEFAULT_LAYER_PATTERN)
    assert f is not None and sorted(f.layers) == [0, 1]  # layers 0 and 1 are one class (2 holds the ROOT)


# ---- the fused-block pad law (closed gap) and its negative --------------------------------------


def test_pad_at_a_wrong_block_offset_is_not_verified() -> None:
    d = GAPS / "fused_block_pad"
    spec = load_relations(d / "relations.yaml")
    good = (d / "distributed.hlo").read_text()
    assert verify(spec, parse_hlo_file(d / "baseline.hlo"), parse_hlo(good), SourceMap.load(d / "sourcemap.json"), Budget()).verdict == "verified"
    # k's shard placed at v's per-rank offset, and v's at k's: every pad still has the right
    # widths, the sum is the wrong tensor.
    assert "padding=0_0x8_4" in good and "padding=0_0x12_0" in good
    bad = good.replace("padding=0_0x8_4", "padding=0_0xTMP").replace("padding=0_0x12_0", "padding=0_0x8_4").replace("padding=0_0xTMP", "padding=0_0x12_0")
    res = verify(spec, parse_hlo_file(d / "baseline.hlo"), parse_hlo(bad), SourceMap.load(d / "sourcemap.json"), Budget())
    assert res.verdict != "verified"


# ---- real builds ------------------------------------------------------------------------------


def test_backward_instructions_name_the_forward_call(built: tuple[dict[str, Any], Path]) -> None:
    _, out = built
    folder = out / "train3_fused"
    text = (folder / "distributed.hlo").read_text()
    assert "shardproof_site_" not in text and "shardproof_site_" not in (folder / "sourcemap.json").read_text()
    entries = json.loads((folder / "sourcemap.json").read_text())["instructions"]
    backward = {n: e for n, e in entries.items() if e.get("backward")}
    assert len(backward) > 100
    for name, e in backward.items():
        assert e["op_name"].startswith("backward"), (name, e)
        for f in e["frames"]:  # user frames only: never torch's decompositions or autograd
            assert f["file"].startswith("examples/tplm/") and f["file"] != "examples/tplm/parallel.py", (name, f)
    # The forward lines of the three decoder layers are all differentiated, each in its module.
    modules = {e.get("module") for e in backward.values()}
    assert {f"model.layers.{k}.attn" for k in range(3)} <= modules
    assert {f"model.layers.{k}.mlp.gate_up" for k in range(3)} <= modules
    lines = {(f["file"], f["line"]) for e in backward.values() for f in e["frames"][:1]}
    assert ("examples/tplm/train.py", next(i for i, t in enumerate((ROOT / "examples/tplm/train.py").read_text().splitlines(), 1) if "reduce_from_region(((out - ts)" in t)) in lines


def test_the_backward_is_cut_into_layers_in_reverse(built: tuple[dict[str, Any], Path]) -> None:
    _, out = built
    folder = out / "train3_fused"
    base, dist = parse_hlo_file(folder / "baseline.hlo"), parse_hlo_file(folder / "distributed.hlo")
    sm = SourceMap.load(folder / "sourcemap.json")
    segments = plan(base, dist, lambda i: i.metadata.op_name, sm.op_name)
    assert segments is not None
    labels = [s.label for s in segments]
    assert labels == [-1, 0, 1, 2, BACKWARD_BASE - 2, BACKWARD_BASE - 1, BACKWARD_BASE]
    # Each backward segment holds about one layer's worth of work, not the whole backward.
    sizes = {s.label: len(s.distributed) for s in segments}
    assert sizes[BACKWARD_BASE - 1] < 2 * sizes[1] + 200
    # A backward segment reads the forward activations of its layer: they are its boundary.
    side = Side(dist)
    seg = next(s for s in segments if s.label == BACKWARD_BASE - 1)
    view = side.view(seg.distributed)
    owners = {n: s.label for s in segments for n in s.distributed}
    assert {owners[n] for n in view.boundary if n in owners} >= {1, BACKWARD_BASE - 2}


def test_deep_train_step_verifies_with_backward_layers_reused(built: tuple[dict[str, Any], Path]) -> None:
    m = model(built, "train3_fused")
    assert m["status"] == "verified", (m["result"]["reason"], m["result"]["divergences"][:2])
    stats = m["result"]["stats"]
    # Layer 1's backward is layer 2's backward up to names: folded or reused, not proven again.
    report = {s["layer"]: s for s in stats["segment_report"]}
    assert report[BACKWARD_BASE - 1]["reused"] or report[BACKWARD_BASE - 1].get("folded")
    assert stats["fold"]["folded_layers"] >= 1


@pytest.mark.parametrize("name, variant", [("train3_wrong_group", "sp_norm_grad_wrong_group"), ("train2_norm_twice", "sp_norm_grad_twice")])
def test_sp_norm_gradient_bugs_are_diverged_witnessed_at_their_line(built: tuple[dict[str, Any], Path], name: str, variant: str) -> None:
    m = model(built, name)
    assert m["status"] == "diverged", m["result"]["reason"]
    assert m["result"]["witness"]["status"] == "confirmed", m["result"]["witness"]
    first = m["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == SITES[variant]


def test_data_parallel_step_verifies(built: tuple[dict[str, Any], Path]) -> None:
    """Each rank's mean loss over its batch shard: its gradients are 4x its shard's, summed by
    the all-reduce and divided back by DDP's average (rules/scaling.egg)."""
    m = model(built, "dp_ok")
    assert m["status"] == "verified", (m["result"]["reason"], m["result"]["divergences"][:2])


@pytest.mark.parametrize("name, variant", [("dp_missing", "dp_grad_missing"), ("dp_twice", "dp_grad_scaled_twice")])
def test_dp_gradient_bugs_are_diverged_witnessed_at_their_line(built: tuple[dict[str, Any], Path], name: str, variant: str) -> None:
    m = model(built, name)
    assert m["status"] == "diverged", m["result"]["reason"]
    assert m["result"]["witness"]["status"] == "confirmed", m["result"]["witness"]
    first = m["result"]["divergences"][0]
    assert (first["source"]["file"], first["source"]["line"]) == SITES[variant], first
    assert first["kind"] == "divergence" and first["numeric"]["holds"] is False, first
    # Never at a frame inside torch: every divergence names a file of the repository.
    for d in m["result"]["divergences"]:
        assert d["source"]["file"].startswith("examples/tplm/"), d["source"]


def test_a_data_parallel_gradient_not_averaged_back_is_not_verified() -> None:
    """The scale law's negative: dividing the all-reduced gradients by 2 instead of the group
    size 4 (or not at all) leaves them 2x (4x) the baseline's, and the pair is diverged."""
    d = GAPS / "dp_batch_rows"
    spec = load_relations(d / "relations.yaml")
    good = (d / "distributed.hlo").read_text()
    assert verify(spec, parse_hlo_file(d / "baseline.hlo"), parse_hlo(good), SourceMap.load(d / "sourcemap.json"), Budget()).verdict == "verified"
    assert good.count("f32[] constant(4)") == 2 and good.count("f32[] constant(128)") == 1  # two averages, one seed 1/(n/c)
    # Averaged by 2, 1 or 16 instead of 4; or the seed 1/n of the whole batch (then the average
    # divides by 4 once too often).
    for old, wrong in (("constant(4)", "constant(2)"), ("constant(4)", "constant(1)"), ("constant(4)", "constant(16)"), ("constant(128)", "constant(512)")):
        res = verify(spec, parse_hlo_file(d / "baseline.hlo"), parse_hlo(good.replace(f"f32[] {old}", f"f32[] {wrong}")), SourceMap.load(d / "sourcemap.json"), Budget())
        assert res.verdict == "diverged", (wrong, res.reason)


def test_adamw_with_gradient_accumulation_verifies(built: tuple[dict[str, Any], Path]) -> None:
    """Two micro-batches (forward + backward each, gradients summed) and the first AdamW step."""
    m = model(built, "adamw_accumulated")
    assert m["status"] == "verified", (m["result"]["reason"], m["result"]["divergences"][:2])
    text = (built[1] / "adamw_accumulated" / "distributed.hlo").read_text()
    assert " sqrt(" in text  # the AdamW denominator is in the program
    labels = [s["layer"] for s in m["result"]["stats"]["segment_report"]]
    assert BACKWARD_BASE - 1 in labels and BACKWARD_BASE in labels


# ---- mixed precision and ZeRO ---------------------------------------------------------------


def test_mixed_precision_step_verifies(built: tuple[dict[str, Any], Path]) -> None:
    """bf16 parameters and gradients, the loss scaled by 1024 and the gradients unscaled in f32,
    SGD on f32 master weights, the masters cast back to bf16: every output proven."""
    m = model(built, "mixed_ok")
    assert m["status"] == "verified", (m["result"]["reason"], m["result"]["divergences"][:2])
    text = (built[1] / "mixed_ok" / "distributed.hlo").read_text()
    assert re.search(r"bf16\[[\d,]*\]\{[\d,]*\} dot\(", text)  # the matmuls run in bf16
    assert re.search(r"f32\[[\d,]*\]\{[\d,]*\} convert\(bf16", text)  # gradients widened to f32
    assert " constant(1024)" in text  # the loss scale


def test_mixed_precision_unscale_missing_is_diverged_at_its_line(built: tuple[dict[str, Any], Path]) -> None:
    m = model(built, "mixed_unscale")
    assert m["status"] == "diverged", m["result"]["reason"]
    w = m["result"]["witness"]
    assert w["status"] == "confirmed", w
    # The witness's difference is the bug's: a norm weight's master 1024x the step away.
    assert w["outputs"][0]["max_rel_err"] > 100, w["outputs"][0]
    first = m["result"]["divergences"][0]
    assert (first["source"]["file"], first["source"]["line"]) == SITES["mp_unscale_missing"], first


def test_zero_step_verifies(built: tuple[dict[str, Any], Path]) -> None:
    """Gradients reduce-scattered and averaged, each rank's block of the f32 masters updated,
    the blocks all-gathered: the parameters replicated and the master blocks sharded, proven."""
    m = model(built, "zero_ok")
    assert m["status"] == "verified", (m["result"]["reason"], m["result"]["divergences"][:2])
    text = (built[1] / "zero_ok" / "distributed.hlo").read_text()
    assert " reduce-scatter(" in text and " all-gather(" in text
    relations = (built[1] / "zero_ok" / "relations.yaml").read_text()
    assert "sharded" in relations  # the master blocks


def test_zero_wrong_shard_is_diverged_at_its_line(built: tuple[dict[str, Any], Path]) -> None:
    m = model(built, "zero_wrong_shard")
    assert m["status"] == "diverged", m["result"]["reason"]
    assert m["result"]["witness"]["status"] == "confirmed", m["result"]["witness"]
    first = m["result"]["divergences"][0]
    assert (first["source"]["file"], first["source"]["line"]) == SITES["zero_wrong_shard"], first
    assert first["hint"]["kind"] == "wrong-groups", first
