"""Ring attention in bf16 (issue 25): examples/jax/spellings.py:_ring_attention_bf16 built by the
JAX front end and checked through `shardproof run`, the witness on every pair (also the verified
ones: a difference there would be a soundness error).

The correct forms keep q/k/v in bf16, the scores, running max, denominator and numerator in f32,
and cast to bf16 once, at the end, like their baseline (softmax attention in the same mixed
precision): verified, and XLA's outputs are bit-equal to the baseline's. The block max taken on
the bf16 scores needs rules/convmax.egg (a convert moved through a max). Twins: the numerator
not rescaled (diverged at its BUG-SITE line, witness confirmed); the running denominator rounded
to bf16 each step, and the exp terms cast to bf16 before their dot with v (what flash kernels
do): real precision differences - never verified, outputs not bit-equal, yet within the bf16
witness tolerance, so unproven."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = ROOT / ".venv" / "bin" / "shardproof"
SPELLINGS = ROOT / "examples" / "jax" / "spellings.py"

CORRECT = {"bf16": "ring_attention_bf16", "bf16_f32_logits": "ring_attention_bf16_f32_logits",
           "bf16_scores_upcast": "ring_attention_bf16_scores_upcast", "bf16_max": "ring_attention_bf16_max"}
TWINS = {"no_rescale": "ring_bf16_no_rescale", "denominator": "ring_bf16_denominator", "probs_cast": "ring_bf16_probs_cast"}


def _site(variant: str) -> int:
    return next(n for n, text in enumerate(SPELLINGS.read_text().splitlines(), 1) if text.rstrip().endswith(f"# BUG-SITE: {variant}"))


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("jax")
    tmp = tmp_path_factory.mktemp("ring_bf16")
    models = [f"  - {{name: {name}, entry: 'spellings:{entry}', expect: verified}}" for name, entry in CORRECT.items()]
    models += [f"  - {{name: {name}, entry: 'spellings:ring_attention_bf16', variant: {variant}, expect: diverged}}" for name, variant in TWINS.items()]
    cfg = tmp / "shardproof.yml"
    cfg.write_text(f"version: 1\nframework: jax\nroot: '{ROOT}'\npython_path: ['{ROOT / 'examples' / 'jax'}']\n"
                   "defaults: {devices: 4, verify: {witness: always}}\nmodels:\n" + "\n".join(models) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    out = tmp / "report"
    p = subprocess.run([str(CLI), "run", "--config", str(cfg), "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert (out / "result.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return {r["name"]: r for r in json.loads((out / "result.json").read_text())["models"]}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_bf16_ring_is_verified_and_bit_equal_in_xla(rows: dict[str, Any], name: str) -> None:
    r = rows[name]
    assert r["status"] == "verified", r
    w = r["result"]["witness"]
    assert w["status"] == "equal", w
    # One rounding to bf16 at the same point on both sides: not a single bit differs.
    assert [o["max_abs_err"] for o in w["outputs"]] == [0.0], w["outputs"]


def test_missing_rescale_is_diverged_at_its_line(rows: dict[str, Any]) -> None:
    r = rows["no_rescale"]
    assert r["status"] == "diverged", r
    assert r["result"]["witness"]["status"] == "confirmed", r["result"]["witness"]
    first = r["result"]["divergences"][0]
    assert first["source"]["file"] == "examples/jax/spellings.py" and first["source"]["line"] == _site("ring_bf16_no_rescale"), first


@pytest.mark.parametrize("name", ["denominator", "probs_cast"])
def test_per_block_bf16_rounding_is_never_verified(rows: dict[str, Any], name: str) -> None:
    # A precision difference the rules must refuse (it rounds where the baseline does not); the
    # outputs differ by a few bf16 ulps (XLA: up to 0.03 absolute), inside the witness's bf16
    # tolerance, so the honest verdict is unproven, never verified.
    r = rows[name]
    assert r["status"] == "unproven", r
    w = r["result"]["witness"]
    assert w["status"] == "equal", w
    assert max(o["max_abs_err"] for o in w["outputs"]) > 0, w["outputs"]
