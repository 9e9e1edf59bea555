"""rules/neutral.egg on the code that needed it: fairscale's VocabParallelEmbedding built at
degree 1 (the baseline) still masks `ids < 0 | ids >= V`; the declared int_range [0, V) decides
both compares false (rules/rankpos.egg), and the mask's `|` on u8 and the shift `ids - 0*1` fold
away with the neutral-element laws, so the TP 4 program verifies. Its bug twin (each rank masks
the ids of another rank's rows) diverges at fairscale's mask line, confirmed by the witness.
The laws' property test against XLA execution is tests/test_law_properties.py (family
"neutral")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shardproof.engine.frontend.runner import run_models

EXAMPLE = Path(__file__).parents[1] / "examples" / "torchdist" / ".shardproof.yml"


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch_xla", "fairscale")), reason="needs the frontend and fairscale extras")
def test_fairscale_vocab_parallel_embedding_verifies_and_its_twin_diverges_at_the_mask(tmp_path: Path) -> None:
    doc = run_models(EXAMPLE, tmp_path, ["fairscale_vocab_embedding_tp4", "bug_fairscale_vocab_range_reversed"])
    rows = {r["name"]: r for r in doc["models"]}
    good, bug = rows["fairscale_vocab_embedding_tp4"], rows["bug_fairscale_vocab_range_reversed"]
    assert good["status"] == "verified", good.get("result", {}).get("reason")
    assert bug["status"] == "diverged" and bug["result"]["witness"]["status"] == "confirmed", bug.get("result", {}).get("reason")
    first = bug["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == ("<site-packages>/fairscale/nn/model_parallel/layers.py", 131), first
