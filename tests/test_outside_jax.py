"""An outside user's JAX programs (examples/jax/outside.py) that the laws added for them prove:
built by real JAX on 4 virtual CPU devices through the front end, checked with the real rules and
XLA's CPU runtime as the witness.

- rules/takealong.egg: the vocab-sharded ``take_along_axis`` of jnp's cross entropy, GSPMD's
  masked-after gather ([batch, seq, vocab] logits) and shard_map's ``jnp.clip`` index;
- rules/tuplerows.egg: GShard top-2 gating, whose ``jnp.argmax`` per token reduces a block of
  groups (a variadic reduce over a dim that is not the sharded one);
- rules/splitscatter.egg: an untiled ``psum_scatter`` after a hand split of the sequence.

Each correct program is verified by its law (named in the trace); each bug twin is diverged at
its ``# BUG-SITE`` line with a confirmed witness.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bug_sites import bug_sites

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples/jax/.shardproof.yml"
CORRECT = {
    "outside_gspmd_vocab_xent": "takealong/vocab-take-along-axis-masked-after",
    "outside_shard_map_vocab_xent": "crossentropy/vocab-parallel-take-along-axis",  # fed by takealong-pick
    "outside_gshard_moe": "tuplerows/variadic-reduce-other-dims",
    "outside_psum_scatter_untiled": "splitscatter/untiled-reduce-scatter",
}
TWINS = {
    "outside_gspmd_vocab_xent_xent_labels_shifted": "xent_labels_shifted",
    "outside_shard_map_vocab_xent_xent_unmasked": "xent_unmasked",
    "outside_gshard_moe_top1_argmin": "top1_argmin",
    "outside_psum_scatter_untiled_scatter_interleaved": "scatter_interleaved",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    pytest.importorskip("jax")
    from shardproof.engine.frontend.runner import run_models

    doc = run_models(CONFIG, tmp_path_factory.mktemp("outside"), [*CORRECT, *TWINS])
    return {m["name"]: m for m in doc["models"]}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_outside_program_is_verified_by_its_law(results: dict[str, dict[str, object]], name: str) -> None:
    model = results[name]
    assert model["status"] == "verified", json.dumps(model.get("result"), default=str)[:2000]
    assert CORRECT[name] in json.dumps(model["result"])


@pytest.mark.parametrize("name", sorted(TWINS))
def test_bug_twin_is_diverged_at_its_line(results: dict[str, dict[str, object]], name: str) -> None:
    model = results[name]
    result = model["result"]
    assert isinstance(result, dict)
    assert model["status"] == "diverged", json.dumps(result, default=str)[:2000]
    witness = result["witness"]
    assert isinstance(witness, dict) and witness["status"] == "confirmed", witness
    site = bug_sites([ROOT / "examples/jax/outside.py"], ROOT)[TWINS[name]]
    first = result["divergences"][0]["source"]
    assert (first["file"], first["line"]) == site, (first, site)
