"""Numeric localization under the relation an instruction's value really has (tests/localize_blocked/).

A megatron-core layer with grouped-query attention views q as (s, b, heads, hd) -> (s, b·heads, hd):
on each rank the merged dim holds its heads of batch entry 0, then of batch entry 1 — sharded in
blocks (one per batch entry), not plain. A probe there compared under the shape's guess
``sharded(dim=1)`` "differs" (a reviewer saw max rel err 505 on the correct model); under the
blocked relation it holds. The wrong-plan model (SwiGLU's fused fc1 sharded as plain colwise) is
reported at the glu activation in mlp.py, as with plain attention, never in the attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.facts import related
from shardproof.engine.analysis.localize import _baseline_counterpart
from shardproof.engine.analysis.witnessing import probe_relations, relations_doc
from shardproof.engine.relations import load_relations

CONFIG = Path(__file__).parent / "localize_blocked" / ".shardproof.yml"
HEADS = 8  # gqa_layer's default: 8 query heads, 4 KV groups, TP 4, batch 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    pytest.importorskip("megatron.core", reason="pip install -e '.[megatron]'")
    from shardproof.engine.frontend.runner import run_models

    out = tmp_path_factory.mktemp("localize_blocked")
    return run_models(CONFIG, out), out


def _result(run: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    m = next(m for m in run[0]["models"] if m["name"] == name)
    assert m["result"] is not None, m
    return m["result"]


def _glu_line() -> int:
    """The line of megatron's glu() applying the activation (SwiGLU's silu on the gate half)."""
    import megatron.core.transformer.mlp as mlp

    lines = Path(mlp.__file__).read_text().splitlines()
    return next(i + 1 for i, ln in enumerate(lines) if "self.config.activation_func(x_glu)" in ln)


@pytest.mark.parametrize("name", ["gqa_wrong_plan", "mha_wrong_plan"])
def test_the_wrong_fc1_plan_is_reported_at_the_glu_activation(run: tuple[dict[str, Any], Path], name: str) -> None:
    r = _result(run, name)
    assert r["verdict"] == "diverged"
    assert r["witness"]["status"] == "confirmed"
    first = r["divergences"][0]
    assert first["source"]["file"].endswith("megatron/core/transformer/mlp.py"), first["source"]
    assert first["source"]["line"] == _glu_line()
    assert first["kind"] == "divergence"
    # Nothing in the attention (proven, or at most a rule gap that holds numerically).
    for d in r["divergences"]:
        if "dot_product_attention.py" in str(d["source"].get("file")):
            assert d["kind"] == "rule-gap" and (d["numeric"] is None or d["numeric"]["holds"]), d


def test_the_correct_gqa_layer_is_never_called_different(run: tuple[dict[str, Any], Path]) -> None:
    r = _result(run, "gqa_glu_blocks")
    assert r["verdict"] in ("verified", "unproven"), r["reason"]
    # A rule gap may remain, but no numeric check may claim a difference on a correct model.
    assert all(d["numeric"] is None or d["numeric"]["holds"] for d in r["divergences"]), r["divergences"]


def _merged_view(run: tuple[dict[str, Any], Path], name: str) -> tuple[Any, Any, Path, str, str]:
    """The checked pair (rules only) and the attention's q view merging (b, heads) into one dim."""
    folder = run[1] / name
    spec = load_relations(folder / "relations.yaml")
    result = check_files(spec, folder / "baseline.hlo", folder / "distributed.hlo", witness="never")
    g, facts = result.context
    for n in g.nodes:
        if n.side != "distributed" or n.ins.opcode != "reshape" or tuple(n.ins.shape.dims) != (4, 2 * HEADS // spec.c, 8):
            continue
        b = _baseline_counterpart(g, facts, n)
        if b is not None and f"f32[4,{2 * HEADS},8]" in b:
            return result, spec, folder, n.ins.name, b.split()[0].lstrip("%")
    raise AssertionError("no (s, b·heads, hd) view of q in the distributed program")


def test_a_merged_batch_heads_view_is_compared_under_its_blocked_sharding(run: tuple[dict[str, Any], Path]) -> None:
    from shardproof.engine.witness.pair import Probe, WitnessOptions, witness

    result, spec, folder, name, bname = _merged_view(run, "gqa_glu_blocks")
    cands, unknown = probe_relations(result, spec, name, bname)
    assert unknown == ""
    # Batch entry 0's 8 heads, then batch entry 1's: each rank holds 2 of each block.
    assert cands == [{"relation": "sharded", "dim": 1, "blocks": [HEADS, HEADS]}]
    texts = [(folder / f).read_text() for f in ("baseline.hlo", "distributed.hlo")]
    opts = WitnessOptions(seeds=(0,), memory_mb=float("inf"))
    report = witness(*texts, relations_doc(spec), opts, [Probe(name, bname, relations=cands), Probe(name, bname)])
    blocked, guessed = report.probes
    assert blocked.holds is True, blocked.detail
    # The shapes' guess (plain sharded along dim 1) reads the wrong elements: the check the
    # witness made before, and why it may only compare under a relation it has derived.
    assert guessed.holds is False and "sharded(dim=1)" in guessed.detail, guessed.detail


def test_an_op_on_blocked_operands_is_not_checked_under_a_guess(run: tuple[dict[str, Any], Path]) -> None:
    result, spec, _folder, name, _bname = _merged_view(run, "gqa_glu_blocks")
    g, facts = result.context
    n = g.node("distributed", name)
    # The attention scores: a batched dot over the blocked (b·heads) dim.
    users = [u for u in g.nodes if u.side == "distributed" and u.ins.opcode == "dot" and any(n.gid in g.nodes[o].operands or o == n.gid for o in u.operands)]
    assert users
    b = _baseline_counterpart(g, facts, users[0])
    assert b is not None
    cands, unknown = probe_relations(result, spec, users[0].ins.name, b.split()[0].lstrip("%"))
    # Either derived exactly, or refused with the reason: never the shapes' plain guess ([]).
    assert (cands and "blocks" in cands[0]) or unknown, (cands, unknown)


@pytest.mark.parametrize("name", ["gqa_wrong_plan", "embedding_detour"])
def test_localization_stops_at_proven_instructions(run: tuple[dict[str, Any], Path], name: str) -> None:
    """Every frontier entry reaches a failing output through unproven instructions only: an
    unrelated ancestor of an instruction the rules did prove is no cause and is not listed."""
    folder = run[1] / name
    spec = load_relations(folder / "relations.yaml")
    result = check_files(spec, folder / "baseline.hlo", folder / "distributed.hlo", witness="never")
    g, facts = result.context
    assert result.verdict == "diverged" and result.divergences
    outs = [g.node("distributed", o["distributed"].lstrip("%")).gid for o in result.outputs if not o["ok"]]
    reach: set[int] = set()
    stack = list(outs)
    while stack:
        x = stack.pop()
        if x in reach:
            continue
        reach.add(x)
        if not related(facts, x):
            stack.extend(g.nodes[x].operands)
    for d in result.divergences:
        assert g.node("distributed", d["instruction"].lstrip("%")).gid in reach, d["instruction"]


def _marked_line(tag: str) -> int:
    lines = (CONFIG.parent / "detour.py").read_text().splitlines()
    return next(i + 1 for i, ln in enumerate(lines) if ln.rstrip().endswith(f"# {tag}"))


def test_an_unrelated_value_a_proven_instruction_discards_is_not_blamed(run: tuple[dict[str, Any], Path]) -> None:
    """The sort feeds only a select the rules prove equal to its other operand: the search for
    the frontier stops at that proven select, so the real bug (the reshape) is the finding,
    not the sort (which the search through every ancestor listed instead)."""
    r = _result(run, "embedding_detour")
    assert r["verdict"] == "diverged" and r["witness"]["status"] == "confirmed"
    lines = [(Path(d["source"]["file"]).name, d["source"]["line"]) for d in r["divergences"]]
    assert lines[0] == ("detour.py", _marked_line("BUG-SITE")), lines
    assert ("detour.py", _marked_line("DETOUR")) not in lines, lines
