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


# ---- engine support the outside programs needed (no law family): jax.lax.top_k, and the psum
# ---- reducer of a partially manual shard_map, copy(add(p0, p1))

_TOPK = """HloModule {name}

ENTRY %main (x: f32[4,8]) -> (f32[4,2], s32[4,2]) {{
  %x = f32[4,8] parameter(0)
  %t = (f32[4,2], s32[4,2]) topk(f32[4,8] %x), k=2, largest={largest}
  %v = f32[4,2] get-tuple-element((f32[4,2], s32[4,2]) %t), index=0
  %i = s32[4,2] get-tuple-element((f32[4,2], s32[4,2]) %t), index=1
  ROOT %o = (f32[4,2], s32[4,2]) tuple(f32[4,2] %v, s32[4,2] %i)
}}
"""
_DUP = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}, {"baseline": 1, "distributed": 1, "relation": "duplicate"}]}


def _verdict(baseline: str, distributed: str, relations: dict[str, object]) -> str:
    from shardproof.engine.analysis.verify import verify
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.relations import parse_relations

    return str(verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "distributed.hlo")).to_json()["verdict"])


def test_topk_of_a_duplicate_is_a_duplicate_and_largest_matters() -> None:
    base = _TOPK.format(name="b", largest="true")
    assert _verdict(base, _TOPK.format(name="d", largest="true"), _DUP) == "verified"
    # the smallest two are other values: never the same signature, and the witness tells them apart
    assert _verdict(base, _TOPK.format(name="d", largest="false"), _DUP) == "diverged"


_AR = """HloModule {name}

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %s = f32[] {op}(f32[] %a, f32[] %b)
  ROOT %c = f32[] copy(f32[] %s)
}}

ENTRY %main (x: f32[8,4], w: f32[4,6]) -> f32[8,6] {{
  %x = f32[8,4] parameter(0)
  %w = f32[4,6] parameter(1)
  %y = f32[8,6] dot(f32[8,4] %x, f32[4,6] %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %r = f32[8,6] all-reduce(f32[8,6] %y), channel_id=1, replica_groups={{{{0,1,2,3}}}}, use_global_device_ids=true, to_apply=%sum
}}
"""
_BASE_DOT = """HloModule b

ENTRY %main (x: f32[8,16], w: f32[16,6]) -> f32[8,6] {
  %x = f32[8,16] parameter(0)
  %w = f32[16,6] parameter(1)
  ROOT %y = f32[8,6] dot(f32[8,16] %x, f32[16,6] %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
_ROW = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1},
                                             {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}


def test_a_reducer_returning_a_copy_of_its_add_is_an_add() -> None:
    assert _verdict(_BASE_DOT, _AR.format(name="d", op="add"), _ROW) == "verified"
    # copy(maximum(a, b)) is a max, not a sum
    assert _verdict(_BASE_DOT, _AR.format(name="d", op="maximum"), _ROW) == "diverged"
