"""GQA with the KV heads replicated to the degree (rules/kvgroups.egg): neuronx-distributed-
inference's GQA.REPLICATE_TO_TP_DEGREE, each rank holding KV head floor(r·K/c) (relation
``grouped``) and its query heads padded within that KV group (``padded`` with ``head_groups``),
built by the torchdist front end from examples/torchdist/padded_qkv.py (``replicated_kv``).
The rules decide; the witness runs XLA's CPU runtime on the bug twins."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shardproof.engine.errors import InputError
from shardproof.engine.relations import parse_relations


def _rel(**q: Any) -> dict[str, Any]:
    return {
        "groups": [[0, 1, 2, 3]],
        "inputs": [
            {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "width": 2, "head_groups": 2, **q},
            {"baseline": 1, "distributed": 1, "relation": "grouped", "dim": 0, "head_groups": 2},
        ],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }


def test_head_group_relations_name_their_key() -> None:
    parsed = parse_relations(_rel(), "r.yaml")
    assert parsed.inputs[0].relation.describe() == "padded(dim=0, width=2, head_groups=2)"
    assert parsed.inputs[1].relation.describe() == "grouped(dim=0, head_groups=2)"
    with pytest.raises(InputError, match=r"inputs\[0\]\.head_groups.*positive integer"):
        parse_relations(_rel(head_groups=0), "r.yaml")
    with pytest.raises(InputError, match=r"inputs\[0\]\.head_groups.*not padded with blocks"):
        parse_relations(_rel(blocks=[4, 4], width=[2, 2]), "r.yaml")
    bad = _rel()
    del bad["inputs"][1]["head_groups"]
    with pytest.raises(InputError, match=r"inputs\[1\]\.head_groups.*grouped relation needs"):
        parse_relations(bad, "r.yaml")


def test_witness_gives_each_rank_its_group_piece() -> None:
    """6 query heads in 2 groups of 3 padded to 4 at TP 4 (2 per rank): rank 1 holds head 2 and
    a zero head, rank 2 heads 3 and 4; the 2 KV heads replicated: rank r holds floor(r/2)."""
    from shardproof.engine.witness.inputs import group_pieces

    q = np.arange(6 * 2).reshape(6, 2) + 1
    pieces = group_pieces(q, 0, 4, 2, 2, "q")
    assert [p[:, 0].tolist() for p in pieces] == [[1, 3], [5, 0], [7, 9], [11, 0]]
    kv = np.arange(2 * 2).reshape(2, 2)
    assert [p[:, 0].tolist() for p in group_pieces(kv, 0, 4, 2, None, "k")] == [[0], [0], [2], [2]]
    with pytest.raises(ValueError, match="do not divide"):
        group_pieces(kv, 0, 4, 3, None, "k")


def test_torchdist_replicated_kv_verifies_and_its_twins_diverge_at_their_lines(tmp_path: Any) -> None:
    """6 query / 2 KV heads at TP 4 (2 query heads per rank) and TP 8 (one) verified; the query
    heads padded at the tail against replicated KV (CONVERT_TO_MHA's q with
    REPLICATE_TO_TP_DEGREE's KV) diverges at the scores, the replicated KV heads' values added
    before the all-reduce at that line, each with a confirmed witness."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("torch_xla") is None:
        pytest.skip("needs the frontend extra")
    from bug_sites import bug_sites

    from shardproof.engine.frontend.runner import run_models

    root = Path(__file__).parents[1]
    names = ["gqa_replicated_kv_tp4", "gqa_replicated_kv_tp8", "bug_gqa_kv_tail", "bug_gqa_kv_sum"]
    rows = {m["name"]: m for m in run_models(root / "examples" / "torchdist" / ".shardproof.yml", tmp_path, names)["models"]}
    for name in names[:2]:
        assert rows[name]["status"] == "verified", (rows[name]["build"]["error"], rows[name].get("result", {}).get("reason"))
    relations = (tmp_path / "gqa_replicated_kv_tp4" / "relations.yaml").read_text()
    assert "relation: grouped, dim: 0, head_groups: 2}  # k_proj.weight: f32[8,16] -> f32[4,16]" in relations
    assert "relation: padded, dim: 0, width: 8, head_groups: 2}  # q_proj.weight: f32[24,16] -> f32[8,16]" in relations
    sites = bug_sites([root / "examples" / "torchdist" / "padded_qkv.py"], root)
    for variant in ("kv_tail", "kv_sum"):
        bug = rows[f"bug_gqa_{variant}"]
        assert bug["status"] == "diverged" and bug["result"]["witness"]["status"] == "confirmed"
        src = bug["result"]["divergences"][0]["source"]
        assert (src["file"], src["line"]) == sites[variant]
