"""A dim sharded into per-rank extents of 1 (one token per rank under sequence parallelism).

The rank's program then drops or inserts that unit dim in a reshape where the baseline keeps it
at its full extent (RMSNorm's ``mean(-1, keepdim=True)`` viewed for the broadcast: [s, b, 1] to
[s, b], one token per rank: [1, b, 1] to [1, b], which the normalizer squeezes to [b]). The law
(rules/layout.egg, unit-reshape-broadcast): a reshape that only inserts or removes unit dims
moves no element, so broadcasts of both sides that place the non-unit dims alike relate as
their operands do, the sharded dim moving to the broadcast's output dim. Real torch-xla builds
of examples/tplm at seq == TP, handwritten pairs in several dtypes, real egglog, XLA's CPU
runtime as the witness; mutants that place a dim elsewhere or break the model must not verify.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_runs import TPLM_HEAD, run_template

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.laws.core import unit_reshape_broadcasts
from shardproof.engine.relations import load_relations

ROOT = Path(__file__).parents[1]

CONFIG = TPLM_HEAD + """\
  size: {{vocab: 256, hidden: 64, layers: 2, heads: 8, kv_heads: 4, ffn: 128, seq: 4, batch: 2}}
models:
  - {{name: train_token_per_rank, entry: tplm.models:train_step, expect: verified}}
  - {{name: train_token_per_rank_batch1, entry: tplm.models:train_step, size: {{batch: 1}}, expect: verified}}
  - {{name: forward_token_per_rank, entry: tplm.models:llama, expect: verified}}
  - {{name: train_norm_grad_missing, entry: tplm.models:train_step, variant: sp_norm_grad_missing, expect: diverged}}
  - {{name: forward_norm_precision, entry: tplm.models:llama, variant: sp_norm_precision, expect: diverged}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    summary, _ = run_template(tmp_path_factory.mktemp("unit_extent"), "unit.shardproof.yml", CONFIG)
    return {m["name"]: m for m in summary["models"]}


def _result(m: dict[str, Any]) -> dict[str, Any]:
    r = m.get("result")
    return json.loads(r) if isinstance(r, str) else (r or {})


@pytest.mark.parametrize("name", ["train_token_per_rank", "train_token_per_rank_batch1", "forward_token_per_rank"])
def test_one_token_per_rank_verifies(built: dict[str, dict[str, Any]], name: str) -> None:
    m = built[name]
    assert m["status"] == "verified", _result(m).get("reason")


def test_the_train_step_needs_the_unit_reshape_law(built: dict[str, dict[str, Any]]) -> None:
    """The RMSNorm broadcast of the squeezed per-token scale is proven by this law."""
    rules = {s["rule"] for o in _result(built["train_token_per_rank"])["trace"] for s in o["steps"]}
    assert "layout/unit-reshape-broadcast" in rules


@pytest.mark.parametrize("name", ["train_norm_grad_missing", "forward_norm_precision"])
def test_bugs_at_one_token_per_rank_diverge_with_a_witness(built: dict[str, dict[str, Any]], name: str) -> None:
    m = built[name]
    r = _result(m)
    assert m["status"] == "diverged", r.get("reason")
    assert r["witness"]["status"] == "confirmed", r["witness"]


# ---- the law on handwritten pairs: the rank's block of [4, 2, 1] along dim 0 is [1, 2, 1] ----

_BASE = """HloModule b
ENTRY e {{
  x = {t}[4,2,1]{{2,1,0}} parameter(0)
  r = {t}[4,2]{{1,0}} reshape(x)
  ROOT z = {t}[4,2,3]{{2,1,0}} broadcast(r), dimensions={{0,1}}
}}
"""
# The rank's reshape drops the unit dim the baseline keeps (to [1,2]; the normalizer squeezes
# it to [2]) or every unit dim (to [2]); its broadcast puts the batch dim at ``dims``.
_DIST = """HloModule d
ENTRY e {{
  x = {t}[1,2,1]{{2,1,0}} parameter(0)
  r = {t}[{mid}]{{{layout}}} reshape(x)
  ROOT z = {t}[{out}]{{2,1,0}} broadcast(r), dimensions={{{dims}}}
}}
"""
_REL = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}


def _pair(tmp_path: Path, t: str, mid: str, out: str, dims: str, base_out: str = "4,2,3", base_dims: str = "0,1") -> Any:
    rank = mid.count(",") + 1
    layout = ",".join(str(i) for i in reversed(range(rank)))
    base = _BASE.format(t=t).replace("[4,2,3]", f"[{base_out}]").replace("dimensions={0,1}", f"dimensions={{{base_dims}}}")
    (tmp_path / "baseline.hlo").write_text(base)
    (tmp_path / "distributed.hlo").write_text(_DIST.format(t=t, mid=mid, layout=layout, out=out, dims=dims))
    (tmp_path / "relations.yaml").write_text(yaml.safe_dump(_REL))
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "s32", "pred"])
def test_a_broadcast_of_a_unit_reshape_keeps_the_sharding_in_every_dtype(tmp_path: Path, dtype: str) -> None:
    r = _pair(tmp_path, dtype, "1,2", "1,2,3", "0,1")  # the normalizer squeezes this reshape
    assert r.verdict == "verified", r.reason
    r = _pair(tmp_path, dtype, "2", "1,2,3", "1")  # the rank's program squeezes it itself
    assert r.verdict == "verified", r.reason


def test_a_broadcast_placing_the_kept_dim_elsewhere_does_not_verify(tmp_path: Path) -> None:
    """Mutant: the rank broadcasts its [2] along the last dim, the baseline its batch dim along
    dim 1: same shapes ([1,2,2] is the block of [4,2,2]), other values."""
    r = _pair(tmp_path, "f32", "2", "1,2,2", "2", base_out="4,2,2")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


def test_a_broadcast_of_the_wrong_shard_extent_does_not_verify(tmp_path: Path) -> None:
    """Mutant: the rank's block is taken as if the sharded dim kept its extent (the baseline's
    broadcast reads dim 0 at full extent into an output the rank cannot hold): no row."""
    assert unit_reshape_broadcasts((4, 2), (4, 2, 3), [0, 1], (2,), (4, 2, 3), [1], 4) == []
    assert unit_reshape_broadcasts((4, 2), (4, 2, 3), [0, 1], (2,), (1, 2, 3), [2], 4) == []
    # The law's own row: block (1, 2) of (4, 2) along 0 is the rank's (2,) with a unit dim.
    rows = unit_reshape_broadcasts((4, 2), (4, 2, 3), [0, 1], (2,), (1, 2, 3), [1], 4)
    assert [(k, k2) for _, k, k2 in rows] == [("s:0", "s:0")]
