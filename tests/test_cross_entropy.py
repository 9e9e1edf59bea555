"""rules/crossentropy.egg: Megatron's vocab-parallel cross entropy against torch's cross entropy.

The pair is real torch-xla HLO (tests/adversarial/pairs/c_megatron_cross_entropy, generated from
tests/adversarial/torch_pairs.py): logits f32[8, 32] sharded along the vocab over 4 ranks, targets
s32[8] in [0, 32). The baseline's nll_loss is torch-xla's one-hot form. The correct pair verifies
and XLA's CPU runtime finds every output equal; each bug variant (a real change of value, made
in the distributed HLO) is diverged with the witness confirming it, never verified.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import DIVERGED, VERIFIED
from shardproof.engine.relations import load_relations

PAIR = Path(__file__).resolve().parent / "adversarial" / "pairs" / "c_megatron_cross_entropy"

# (what the variant breaks, the text in the distributed HLO, its replacement)
BUGS = {
    # vocab_start_index = 7·r: blocks overlap and miss ids; the rank picks the wrong column
    "wrong_offset": ("%constant.5 = s32[] constant(8)", "%constant.5 = s32[] constant(7)"),
    # each rank shifts by its own max: the all-reduce(max) of logits_max is gone
    "missing_max_all_reduce": (
        "%all-reduce.77 = f32[8]{0} all-reduce(f32[8]{0} %reduce.42), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%MaxComputation.73",
        "%all-reduce.77 = f32[8]{0} copy(f32[8]{0} %reduce.42)",
    ),
    # the predicted logit stays on the rank that holds the target
    "missing_predicted_all_reduce": (
        "%all-reduce.102 = f32[8]{0} all-reduce(f32[8]{0} %select.97), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%AddComputation.98",
        "%all-reduce.102 = f32[8]{0} copy(f32[8]{0} %select.97)",
    ),
    # the row index of the pick counts along a unit dim (all zeros): every row picks row 0
    "wrong_row_index": ("%iota.85 = u32[8,1,1]{1,0,2} iota(), iota_dimension=0", "%iota.85 = u32[8,1,1]{1,0,2} iota(), iota_dimension=1"),
    # the sum of exponentials stays per rank
    "missing_sum_exp_all_reduce": (
        "%all-reduce.115 = f32[8]{0} all-reduce(f32[8]{0} %reduce.110), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%AddComputation.111",
        "%all-reduce.115 = f32[8]{0} copy(f32[8]{0} %reduce.110)",
    ),
}


def _check(tmp_path: Path, dist: str, relations: str | None = None, witness: str = "always") -> object:
    (tmp_path / "distributed.hlo").write_text(dist)
    (tmp_path / "relations.yaml").write_text(relations if relations is not None else (PAIR / "relations.yaml").read_text())
    return check_files(load_relations(tmp_path / "relations.yaml"), PAIR / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


def test_megatron_cross_entropy_verifies(tmp_path: Path) -> None:
    r = _check(tmp_path, (PAIR / "distributed.hlo").read_text())
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness
    # the output's duplicate is this law's (no other rule proves the pair: it was unproven)
    assert "crossentropy/vocab-parallel-cross-entropy" in str(r.to_json()["trace"])


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_cross_entropy_bug_diverges(tmp_path: Path, bug: str) -> None:
    old, new = BUGS[bug]
    text = (PAIR / "distributed.hlo").read_text()
    assert text.count(old) == 1, bug
    r = _check(tmp_path, text.replace(old, new), witness="auto")
    assert r.verdict == DIVERGED, (bug, r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


def test_ignore_index_needs_the_target_range(tmp_path: Path) -> None:
    # With targets that may be negative (ignore_index -100 among them), the baseline gives 0 on
    # such rows and Megatron log(sum exp): the `t != -100` guard is no longer true by range, and
    # no rank's mask is false. The pair must not verify.
    rel = (PAIR / "relations.yaml").read_text().replace("int_range: [0, 32]", "int_range: [-100, 32]")
    assert "[-100, 32]" in rel
    r = _check(tmp_path, (PAIR / "distributed.hlo").read_text(), rel, witness="auto")
    assert r.verdict != VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


def test_predicted_logit_unmasked_diverges() -> None:
    # The stored bug pair: the picked logit is not zeroed on ranks that do not hold the target.
    bug = PAIR.parent / "b_ce_predicted_unmasked"
    r = check_files(load_relations(bug / "relations.yaml"), bug / "baseline.hlo", bug / "distributed.hlo")
    assert r.verdict == DIVERGED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- Megatron's [s, b, V] logits against a baseline that flattens to 2-D (rules/layout.egg,
# "a pointwise op before vs after a reshape"): the ranks subtract the max in 3-D, the baseline
# in 2-D. The pair is built from examples/megatron (cross_entropy_3d_tp4: f32[8, 2, 64] logits
# sharded along the vocab over 4 ranks).
ROOT = Path(__file__).resolve().parents[1]

# (what the variant breaks, the text in the distributed HLO, its replacement)
BUGS_3D = {
    # each rank shifts by its own max: the all-reduce(max) is gone (the sharded-reduce step)
    "missing_max_all_reduce": (
        r"(%all-reduce\.\d+) = f32\[8,2\]\{1,0\} all-reduce\((f32\[8,2\]\{1,0\} %reduce\.\d+)\)[^\n]*MaxComputation[^\n]*",
        r"\1 = f32[8,2]{1,0} copy(\2)",
    ),
    # the shifted logits are flattened (b, s)-major for the pick: each token picks another
    # token's logit (the reshape's element order must be tracked, not only its shape)
    "pick_rows_transposed": (
        r"(%reshape\.\d+) = f32\[16,16\]\{1,0\} reshape\(f32\[8,2,16\]\{2,1,0\} (%subtract\.\d+)\)",
        r"%rows.t = f32[2,8,16]{2,1,0} transpose(f32[8,2,16]{2,1,0} \2), dimensions={1,0,2}\n  \1 = f32[16,16]{1,0} reshape(f32[2,8,16]{2,1,0} %rows.t)",
    ),
}


@pytest.fixture(scope="module")
def pair_3d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("ce3d")
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    cmd = [sys.executable, "-c", "import sys; from shardproof.engine.cli import main; sys.exit(main())", "build",
           "--config", "examples/megatron/.shardproof.yml", "--models", "cross_entropy_3d_tp4", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "cross_entropy_3d_tp4"


def _check_3d(pair: Path, tmp_path: Path, dist: str, witness: str) -> object:
    (tmp_path / "distributed.hlo").write_text(dist)
    return check_files(load_relations(pair / "relations.yaml"), pair / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


def test_cross_entropy_3d_verifies(pair_3d: Path, tmp_path: Path) -> None:
    assert "f32[8,2,64]" in (pair_3d / "baseline.hlo").read_text()
    r = _check_3d(pair_3d, tmp_path, (pair_3d / "distributed.hlo").read_text(), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness
    trace = str(r.to_json()["trace"])
    # the max and the sum of exponentials cross the baseline's flattening by the new steps
    assert "layout/reduce-sharded-dim" in trace and "crossentropy/vocab-parallel-cross-entropy" in trace


@pytest.mark.parametrize("bug", sorted(BUGS_3D))
def test_cross_entropy_3d_bug_diverges(pair_3d: Path, tmp_path: Path, bug: str) -> None:
    pattern, repl = BUGS_3D[bug]
    text, n = re.subn(pattern, repl, (pair_3d / "distributed.hlo").read_text())
    assert n == 1, bug
    r = _check_3d(pair_3d, tmp_path, text, "auto")
    assert r.verdict == DIVERGED, (bug, r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- DTensor's loss_parallel (rules/crossentropy.egg, sections e and g): the decoder of
# examples/dtensor with one block, its cross entropy under loss_parallel (labels compared with the
# rank's bounds, picked by MaskPartial, the mean over count(labels != -100)) against torch's
# nll_loss over the whole vocabulary, on labels in [0, V) and on labels shifted with -100 at the
# end (examples/dtensor/loss_models.py); the twins patch loss_parallel's forward
# (examples/dtensor/loss_bugs.py), each diverged at its line with the witness confirming it.

_LOSS_CONFIG = """\
version: 1
root: {root}
python_path: [{dtensor}]
defaults: {{tp: 4, rank: int, timeout: 300, memory_mb: 4096, size: {{layers: 1, loss: true}}}}
models:
  - name: decoder_loss_tp4
    entry: models:decoder
  - name: bug_loss_label_offset
    entry: models:decoder
    variant: label_offset_next_shard
    verify: {{partition: false}}
    expect: diverged
  - name: decoder_shifted_loss_tp4
    entry: loss_models:decoder_shifted_labels
  - name: bug_loss_ignore_not_masked
    entry: loss_models:decoder_shifted_labels
    variant: ignore_not_masked
    verify: {{partition: false}}
    expect: diverged
  - name: bug_loss_mean_over_all_tokens
    entry: loss_models:decoder_shifted_labels
    variant: mean_over_all_tokens
    verify: {{partition: false}}
    expect: diverged
"""


@pytest.fixture(scope="module")
def loss_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pytest.importorskip("torch_xla")
    from config_runs import run_template

    summary, _out = run_template(tmp_path_factory.mktemp("xent_dtensor"), ".shardproof.yml", _LOSS_CONFIG, dtensor=ROOT / "examples" / "dtensor")
    return {m["name"]: m for m in summary["models"]}


def _line_of(marker: str) -> int:
    lines = (ROOT / "examples" / "dtensor" / "loss_bugs.py").read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


@pytest.mark.parametrize(
    ("name", "law"),
    [
        # labels in [0, V): the mean's numerator is the sum of the negated picks
        ("decoder_loss_tp4", "crossentropy/sum-of-negated-picks"),
        # labels shifted with -100 at the end: the sum over the kept rows, the count of kept labels
        ("decoder_shifted_loss_tp4", "crossentropy/masked-sum-of-negated-picks"),
        ("decoder_shifted_loss_tp4", "crossentropy/count-of-kept-labels"),
    ],
)
def test_loss_parallel_cross_entropy_verifies(loss_report: dict[str, object], name: str, law: str) -> None:
    model = loss_report[name]
    assert isinstance(model, dict)
    assert model["status"] == "verified", (model["build"]["error"], model.get("result", {}).get("reason"))
    assert law in str(model["result"]["trace"])


@pytest.mark.parametrize(
    ("name", "marker"),
    [
        # the labels shifted by the next rank's offset: the shift itself
        ("bug_loss_label_offset", "# BUG-SITE: label_offset_next_shard"),
        # the ignored labels' losses kept
        ("bug_loss_ignore_not_masked", "# BUG-SITE: ignore_not_masked"),
        # the mean over every token: its first use, the division (the count is a constant)
        ("bug_loss_mean_over_all_tokens", "return loss.sum() / total, total"),
    ],
)
def test_loss_parallel_bugs_diverge_at_their_line(loss_report: dict[str, object], name: str, marker: str) -> None:
    model = loss_report[name]
    assert isinstance(model, dict)
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    source = result["divergences"][0]["source"]
    assert (source["file"], source["line"]) == ("examples/dtensor/loss_bugs.py", _line_of(marker)), source


# ---- JAX's vocab-parallel cross entropy (rules/crossentropy.egg, section f): the label's block
# spelt (s >= 0) & (s < w), the pick by take_along_axis on each rank's shard, against the
# baseline's take_along_axis over the whole vocabulary (examples/jax/models.py).

_JAX_CONFIG = """\
version: 1
framework: jax
root: {root}
python_path: [{jax}]
defaults: {{devices: 4}}
models:
  - name: vocab_cross_entropy
    entry: models:vocab_cross_entropy
  - name: vocab_cross_entropy_offset_next_shard
    entry: models:vocab_cross_entropy
    variant: ce_offset_next_shard
    expect: diverged
"""


@pytest.fixture(scope="module")
def jax_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    pytest.importorskip("jax")
    from config_runs import run_template

    summary, _out = run_template(tmp_path_factory.mktemp("xent_jax"), ".shardproof.yml", _JAX_CONFIG, jax=ROOT / "examples" / "jax")
    return {m["name"]: m for m in summary["models"]}


def test_jax_vocab_cross_entropy_verifies(jax_report: dict[str, object]) -> None:
    model = jax_report["vocab_cross_entropy"]
    assert isinstance(model, dict)
    assert model["status"] == "verified", (model["build"]["error"], model.get("result", {}).get("reason"))
    assert "crossentropy/vocab-parallel-take-along-axis" in str(model["result"]["trace"])


def test_jax_label_offset_of_the_next_shard_diverges_at_its_line(jax_report: dict[str, object]) -> None:
    model = jax_report["vocab_cross_entropy_offset_next_shard"]
    assert isinstance(model, dict)
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    lines = (ROOT / "examples" / "jax" / "models.py").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "# BUG-SITE: ce_offset_next_shard" in text)
    source = result["divergences"][0]["source"]
    assert (source["file"], source["line"]) == ("examples/jax/models.py", line), source
