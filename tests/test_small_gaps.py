"""Three small laws, on real JAX pairs built by the front end (``framework: jax``, 4 virtual CPU
devices, ``shard_map``) and checked with the numeric witness (XLA's CPU runtime):

- an integer bound spelled strictly, ``local > w - 1`` for ``local >= w`` (rules/rankpos.egg
  abovew-gt, abovew-gt-affine): the vocab-parallel mask on the shifted ids and on the raw ids
  against ``r·w + w - 1``; ``local > w`` (one row too many) stays a divergence;
- a rank offset added in float, ``r·w + arange(w, dtype=float32)`` (rules/rankpos.egg
  rpos-fadd), on a mesh whose devices are in reverse order and on a plain one; the rank
  reversed ``c - 1 - r`` is a divergence;
- a histogram of sharded ids, ``zeros.at[ids].add(1)`` then ``psum`` (rules/scatter.egg
  scatter-batch-split), int32 counts and float32 weights; without the psum, or with the ids
  replicated (each counted c times), it is a divergence pinned at the missing reduction.

Every correct model is ``verified``; every bug is ``diverged`` with the witness confirming it.
"""

from __future__ import annotations

from typing import Any

import pytest

from shardproof.engine.frontend.runner import run_models

MODELS = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax import shard_map
from jax.sharding import Mesh, PartitionSpec as P
from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel

C = 4


def vocab_mask(ctx: JaxContext) -> JaxModel:
    s, d, v = 32, 8, 32
    w = v // C
    mesh = ctx.mesh({"tp": C})
    spelling = ctx.variant

    def base(ids, table):
        return jnp.take(table, ids, axis=0)

    def per(ids, table):
        r = jax.lax.axis_index("tp")
        local = ids - r * w
        if spelling == "gt_w_minus_1":
            outside = (local < 0) | (local > w - 1)
        elif spelling == "raw_gt":
            outside = (ids < r * w) | (ids > r * w + w - 1)
        elif spelling == "bug_gt_w":
            outside = (local < 0) | (local > w)
        elif spelling == "bug_raw_gt":
            outside = (ids < r * w) | (ids > r * w + w)
        else:
            outside = (local < 0) | (local >= w)
        rows = jnp.take(table, jnp.where(outside, 0, local), axis=0, mode="clip")
        return jax.lax.psum(jnp.where(outside[:, None], 0.0, rows), "tp")

    dist = shard_map(per, mesh=mesh, in_specs=(P(), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("ids", (s,), "int32", int_range=(0, v)), JaxInput("table", (v, d), spec=("tp", None))])


def rank_offset(ctx: JaxContext) -> JaxModel:
    s, d = 16, 8
    w = s // C
    ctx.mesh_size({"sp": C})
    devices = jax.devices()[:C]
    variant = ctx.variant or ""
    mesh = Mesh(np.array(devices[::-1] if "reversed_mesh" in variant else devices), ("sp",))

    def base(x):
        return x * jnp.arange(s, dtype=jnp.float32)[:, None]

    def per(x):
        r = jax.lax.axis_index("sp")
        if "bug" in variant:
            r = C - 1 - r
        return x * (r * w + jnp.arange(w, dtype=jnp.float32))[:, None]

    dist = shard_map(per, mesh=mesh, in_specs=(P("sp", None),), out_specs=P("sp", None), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (s, d), spec=("sp", None))], outputs=[("sp", None)])


def histogram(ctx: JaxContext) -> JaxModel:
    """Tokens per expert (int32), or the summed weight per expert (float32, variant float)."""
    e, t = 8, 32
    mesh = ctx.mesh({"dp": C})
    variant = ctx.variant or ""
    shard = () if "replicated_ids" in variant else ("dp",)
    spec = P() if "replicated_ids" in variant else P("dp")

    def done(local):
        return local if "no_psum" in variant else jax.lax.psum(local, "dp")

    if "float" in variant:
        def base(ids, g):
            return jnp.zeros((e,), jnp.float32).at[ids].add(g)

        def per(ids, g):
            return done(jnp.zeros((e,), jnp.float32).at[ids].add(g))

        dist = shard_map(per, mesh=mesh, in_specs=(spec, spec), out_specs=P(), check_vma=False)
        inputs = [JaxInput("ids", (t,), "int32", spec=shard, int_range=(0, e)), JaxInput("g", (t,), spec=shard)]
        return JaxModel(base, dist, mesh, inputs)

    def base1(ids):
        return jnp.zeros((e,), jnp.int32).at[ids].add(1)

    def per1(ids):
        return done(jnp.zeros((e,), jnp.int32).at[ids].add(1))

    dist = shard_map(per1, mesh=mesh, in_specs=(spec,), out_specs=P(), check_vma=False)
    return JaxModel(base1, dist, mesh, [JaxInput("ids", (t,), "int32", spec=shard, int_range=(0, e))])
'''

CASES = {
    "mask_ge": ("vocab_mask", None, "verified"),
    "mask_gt_w_minus_1": ("vocab_mask", "gt_w_minus_1", "verified"),
    "mask_raw_gt": ("vocab_mask", "raw_gt", "verified"),
    "mask_bug_gt_w": ("vocab_mask", "bug_gt_w", "diverged"),
    "mask_bug_raw_gt": ("vocab_mask", "bug_raw_gt", "diverged"),
    "offset": ("rank_offset", None, "verified"),
    "offset_reversed_mesh": ("rank_offset", "reversed_mesh", "verified"),
    "offset_bug": ("rank_offset", "reversed_mesh_bug", "diverged"),
    "hist": ("histogram", None, "verified"),
    "hist_float": ("histogram", "float", "verified"),
    "hist_bug_no_psum": ("histogram", "no_psum", "diverged"),
    "hist_bug_replicated_ids": ("histogram", "replicated_ids", "diverged"),
    "hist_float_bug_no_psum": ("histogram", "float_no_psum", "diverged"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("small_gaps")
    (root / "gaps.py").write_text(MODELS)
    lines = ["version: 1", "framework: jax", "python_path: ['.']", "root: .", "defaults: {devices: 4, timeout: 300}", "models:"]
    for name, (fn, variant, _) in CASES.items():
        lines.append(f"  - {{name: {name}, entry: 'gaps:{fn}'" + (f", variant: {variant}" if variant else "") + "}")
    (root / ".shardproof.yml").write_text("\n".join(lines) + "\n")
    doc = run_models(root / ".shardproof.yml", root / "out")
    return {m["name"]: m for m in doc["models"]}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[2] == "verified"])
def test_correct_models_verify(results: dict[str, dict[str, Any]], name: str) -> None:
    model = results[name]
    assert model["status"] == "verified", (model["status"], (model.get("result") or {}).get("reason"), model["build"]["error"])


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[2] == "diverged"])
def test_bugs_diverge_with_a_confirmed_witness(results: dict[str, dict[str, Any]], name: str) -> None:
    model = results[name]
    assert model["status"] == "diverged", (model["status"], (model.get("result") or {}).get("reason"), model["build"]["error"])
    assert model["result"]["witness"]["status"] == "confirmed", model["result"]["witness"]


def test_each_law_is_the_one_that_proves(results: dict[str, dict[str, Any]]) -> None:
    def rules(name: str) -> set[str]:
        return {s["rule"] for t in results[name]["result"].get("trace", []) for s in t.get("steps", [])}

    assert "scatter/indices-split-over-ranks" in rules("hist") and "scatter/indices-split-over-ranks" in rules("hist_float")
    # The histogram without its psum is pinned at the missing reduction, not at the scatter's attributes.
    first = results["hist_bug_no_psum"]["result"]["divergences"][0]
    assert "reduction over ranks" in first["cause"] and "different attributes" not in first["cause"], first["cause"]

