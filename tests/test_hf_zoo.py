"""transformers causal LMs beyond Llama/Qwen2/Mixtral with their own TP plans (examples/dtensor
hf_zoo.py, transformers unmodified): Starcoder2's LayerNorm reads the all-reduced embedding rows
through a reshape the baseline's normalizer composes away (rules/reshapeback.egg). One run
builds the correct model (verified) and its bug twin (the last layer's norm reading the rows in
(sequence, batch) order: diverged at the hook's line, witness confirmed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_runs import run_template

ROOT = Path(__file__).resolve().parents[1]

_CONFIG = """\
version: 1
root: {root}
python_path: [{dtensor}]
defaults: {{tp: 4, rank: int, timeout: 300, memory_mb: 4096}}
models:
  - name: hf_starcoder2_tp4
    entry: hf_zoo:causal_lm
    size: {{family: Starcoder2}}
  - name: bug_starcoder2_rows_seq_major
    entry: hf_zoo:causal_lm
    size: {{family: Starcoder2}}
    variant: rows_seq_major
    verify: {{partition: false}}
    expect: diverged
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("transformers")
    return run_template(tmp_path_factory.mktemp("hf_zoo"), ".shardproof.yml", _CONFIG, dtensor=ROOT / "examples" / "dtensor")[0]


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def test_starcoder2_layernorm_after_the_embedding_all_reduce_is_verified(report: dict[str, Any]) -> None:
    model = _entry(report, "hf_starcoder2_tp4")
    assert model["status"] == "verified", (model["build"]["error"], model.get("result", {}).get("reason"))


def test_rows_in_the_wrong_order_are_diverged_at_the_hook(report: dict[str, Any]) -> None:
    model = _entry(report, "bug_starcoder2_rows_seq_major")
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    lines = (ROOT / "examples" / "dtensor" / "hf_zoo.py").read_text().splitlines()
    hook = next(i for i, text in enumerate(lines, 1) if "return (x.transpose(0, 1).reshape(x.shape),)" in text)
    source = result["divergences"][0]["source"]
    assert (source["file"], source["line"]) == ("examples/dtensor/hf_zoo.py", hook), source
