"""A bug deep in a long stack survives the layer partitioning and its memo.

A small-width Llama with Llama-3.1-405B's 126 layers is built by the front end twice: correct,
and with the attention all-reduce missing in layer 117 only (``bug_layer: 117``, the per-rank
model's other 125 layers are correct). The correct one verifies with almost every layer reused
from the memo; the buggy one is diverged, localized in layer 117 at the ``BUG-SITE`` line of
the variant in examples/tplm. Both builds share one worker (one torch-xla import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from bug_sites import bug_sites

from shardproof.engine.frontend.runner import run_models

ROOT = Path(__file__).parents[1]
SITES = bug_sites(sorted((ROOT / "examples" / "tplm").glob("*.py")), ROOT)
LAYERS, BUG_LAYER, VARIANT = 126, 117, "missing_attn_allreduce"
SIZE = {
    "vocab": 64,
    "hidden": 32,
    "layers": LAYERS,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 64,
    "seq": 4,
    "batch": 2,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("scale_bug_layer")
    entry = {"entry": "tplm.models:llama", "tp": 2}
    config = {
        "version": 1,
        "root": str(ROOT),
        "python_path": [str(ROOT / "examples")],
        "hide_frames": ["examples/tplm/parallel.py"],
        "defaults": {"timeout": 600, "memory_mb": 4096, "size": SIZE},
        "models": [
            {"name": "correct", **entry},
            {"name": "bug_in_117", **entry, "variant": VARIANT, "size": {"bug_layer": BUG_LAYER}},
            # The knob's checks: a layer that does not exist, a bug outside the layers.
            {
                "name": "bad_layer",
                **entry,
                "variant": VARIANT,
                "size": {"layers": 2, "bug_layer": 2},
            },
            {
                "name": "bad_variant",
                **entry,
                "variant": "bsh_logits_layout",
                "size": {"layers": 2, "bug_layer": 0},
            },
        ],
    }
    path = tmp / ".shardproof.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    doc = run_models(path, tmp / "out")
    return {m["name"]: m for m in doc["models"]}


def _layers(model: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in model["result"]["stats"]["segment_report"] if s["layer"] >= 0]


def test_the_correct_stack_verifies_with_most_layers_reused(
    models: dict[str, dict[str, Any]],
) -> None:
    model = models["correct"]
    assert model["status"] == "verified", model["result"]["reason"]
    layers = _layers(model)
    assert [s["layer"] for s in layers] == list(range(LAYERS))
    reused = sum(s["reused"] for s in layers)
    assert reused >= 120, f"only {reused} of {LAYERS} layers reused"


def test_a_bug_in_layer_117_only_is_found_and_pinpointed(models: dict[str, dict[str, Any]]) -> None:
    model = models["bug_in_117"]
    assert model["build"]["error"] is None, model["build"]["error"]
    assert model["status"] == "diverged", model["result"]["reason"]
    divergences = model["result"]["divergences"]
    assert divergences
    # Every reported instruction is in layer 117, and the first is at the variant's line.
    assert all(f"layers.{BUG_LAYER}." in d["op_name"] for d in divergences), [
        d["op_name"] for d in divergences
    ]
    first = divergences[0]
    assert (first["source"]["file"], first["source"]["line"]) == SITES[VARIANT]
    assert "missing" in first["cause"]
    # The correct layers before it still come from the memo.
    assert sum(s["reused"] for s in _layers(model) if s["layer"] < BUG_LAYER) >= BUG_LAYER - 5


def test_bug_layer_is_checked(models: dict[str, dict[str, Any]]) -> None:
    bad = models["bad_layer"]
    assert (
        bad["status"] == "build-failed"
        and "bug_layer 2 is not a layer index" in bad["build"]["error"]
    )
    bad = models["bad_variant"]
    assert (
        bad["status"] == "build-failed" and "bug_layer cannot confine it" in bad["build"]["error"]
    )
