"""Data-parallel groups get different data (relations: ``per_group_data``).

In a DP x TP program the rank groups are the TP groups; the batch is split over the DP axis, so
each group holds its own part of it, while the baseline runs one group's part. When every group
ran against the same baseline input, a program that mixes the groups (a ppermute across the DP
axis, a max over the DP axis as well) computed the same numbers as a correct one: the witness
found it equal. With ``per_group_data`` each group gets its own part, the baseline runs once per
group, and those bugs are ``diverged`` with a confirmed witness, while their correct twins stay
``verified`` and equal under ``--witness always``. The pairs are JAX ``shard_map`` programs on a
2x2 (dp, tp) mesh (tests/witness_jax/dp_pairs.py, built in a subprocess).

Edge inputs (engine.witness.inputs, the default seeds' last): a vocab-parallel embedding whose
mask is off by one at a shard boundary is equal on random ids and diverged on the edge seed.

Mesh groups: a correct GSPMD embedding + log-softmax whose module holds two meshes is not
called different by the witness (it was, before the runtime wrote mesh groups out).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from shardproof.engine.analysis.check import check_files
from shardproof.engine.errors import InputError
from shardproof.engine.relations import load_relations
from shardproof.engine.witness import runtime
from shardproof.engine.witness.inputs import (
    EDGE_SEEDS_FROM,
    edges_of,
    make_group_inputs,
    make_inputs,
)
from shardproof.engine.witness.pair import WitnessOptions, witness

HERE = Path(__file__).resolve().parent
BUGS = ("b_ppermute_over_dp", "b_pmax_over_dp")
CORRECT = ("mlp", "amax_scale")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dp_pairs")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    proc = subprocess.run([sys.executable, str(HERE / "witness_jax" / "dp_pairs.py"), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _texts(d: Path) -> tuple[str, str, dict]:
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


def _same_data(rel: dict) -> dict:
    return {**rel, "inputs": [{k: v for k, v in e.items() if k != "per_group_data"} for e in rel["inputs"]]}


@pytest.mark.parametrize("name", BUGS)
def test_a_group_mixing_bug_shows_only_with_per_group_data(pairs: Path, name: str) -> None:
    base, dist, rel = _texts(pairs / name)
    opts = WitnessOptions(seeds=(0, 1, 2), memory_mb=float("inf"))
    # Every group on the same data: the bug computes the correct numbers.
    assert witness(base, dist, _same_data(rel), opts).equal
    report = witness(base, dist, rel, opts)
    assert not report.equal and report.seed == 0, report.summary()


@pytest.mark.parametrize("name", BUGS)
def test_group_mixing_bugs_are_diverged_with_a_confirmed_witness(pairs: Path, name: str) -> None:
    d = pairs / name
    r = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", None, witness="auto")
    assert r.verdict == "diverged", (r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


@pytest.mark.parametrize("name", CORRECT)
def test_correct_twins_stay_verified_and_equal(pairs: Path, name: str) -> None:
    d = pairs / name
    r = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", None, witness="always")
    assert r.verdict == "verified", (r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_group_inputs_differ_only_where_the_relations_say(pairs: Path) -> None:
    base_text, dist_text, rel = _texts(pairs / "mlp")
    base, dist = runtime.read(base_text), runtime.read(dist_text)
    groups = rel["groups"]
    bases, dargs = make_group_inputs(base, dist, rel, groups, seed=4)
    assert not np.array_equal(bases[0][0], bases[1][0])  # the batch: each group its own
    for k in (1, 2):  # the weights: one value for every group
        assert bases[0][k] is bases[1][k]
    for gi, g in enumerate(groups):
        for r, dev in enumerate(g):
            assert np.array_equal(dargs[dev][0], bases[gi][0])
            assert np.array_equal(dargs[dev][1], np.split(bases[gi][1], 2, axis=1)[r])
    # Without the key: one list for every group; group 0 draws what it draws with the key (the
    # other groups' values come after), so a pair without the key gets the inputs it always got.
    same_bases, _ = make_group_inputs(base, dist, _same_data(rel), groups, seed=4)
    assert all(b is same_bases[0] for b in same_bases)
    old_base, _ = make_inputs(base, dist, _same_data(rel), groups, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(old_base, bases[0], strict=True))


@pytest.mark.parametrize(("entry", "message"), [
    ("outputs:\n  - {baseline: 0, distributed: 0, relation: duplicate, per_group_data: true}", "outputs[0].per_group_data"),
    ("outputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n", "inputs[0].per_group_data"),
])
def test_per_group_data_is_checked(tmp_path: Path, entry: str, message: str) -> None:
    bad_input = "per_group_data: yes please" if "inputs[0]" in message else "per_group_data: true"
    text = f"groups: [[0, 1], [2, 3]]\ninputs:\n  - {{baseline: 0, distributed: 0, relation: duplicate, {bad_input}}}\n{entry}\n"
    (tmp_path / "r.yaml").write_text(text)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_relations(tmp_path / "r.yaml")


# ---------------------------------------------------------------------------------------------
# Edge inputs: a bug in a rare row
# ---------------------------------------------------------------------------------------------

BOUNDARY_IDS = (64, 128, 192)  # the first id of ranks 1..3's vocab blocks (256 ids over 4)


def test_an_off_by_one_at_a_vocab_shard_boundary_shows_only_on_edge_inputs(pairs: Path) -> None:
    """The mask ``local > w`` (for ``>= w``) takes the next block's first id on this rank too.
    Random ids miss those three values of 256 on every random seed tried; the edge seed puts
    them in, and the bug is diverged with a confirmed witness."""
    d = pairs / "b_vocab_mask_off_by_one"
    base_text, dist_text, rel = _texts(d)
    base, dist = runtime.read(base_text), runtime.read(dist_text)
    randoms = tuple(range(6))
    for seed in randoms:
        ids = make_inputs(base, dist, rel, rel["groups"], seed)[0][0]
        assert not set(ids.tolist()) & set(BOUNDARY_IDS), (seed, ids)
    opts = WitnessOptions(seeds=randoms, memory_mb=float("inf"))
    assert witness(base_text, dist_text, rel, opts).equal
    edge_ids = make_inputs(base, dist, rel, rel["groups"], EDGE_SEEDS_FROM)[0][0]
    assert set(BOUNDARY_IDS) <= set(edge_ids.tolist()) and all(0 <= i < 256 for i in edge_ids.tolist())
    report = witness(base_text, dist_text, rel, WitnessOptions(memory_mb=float("inf")))
    assert not report.equal and report.seed == EDGE_SEEDS_FROM, report.summary()
    r = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", None, witness="auto")
    assert r.verdict == "diverged", (r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "confirmed" and f"--seed {EDGE_SEEDS_FROM}" in r.witness["command"], r.witness


def test_the_correct_vocab_embedding_stays_equal_on_edge_inputs(pairs: Path) -> None:
    base_text, dist_text, rel = _texts(pairs / "vocab_embed")
    report = witness(base_text, dist_text, rel, WitnessOptions(memory_mb=float("inf")))
    assert report.equal and EDGE_SEEDS_FROM in report.seeds, report.summary()


def test_edge_values_come_from_blocks_ranges_and_constants(pairs: Path) -> None:
    base_text, dist_text, rel = _texts(pairs / "vocab_embed")
    edges = edges_of(runtime.read(base_text), runtime.read(dist_text), rel, 4)
    vals = edges.int_values(0, 256)
    assert vals[:6] == [63, 64, 127, 128, 191, 192]  # block boundaries first
    assert {0, 255} <= set(vals) and all(0 <= v < 256 for v in vals)
    # A float threshold the program compares with lands exactly on it.
    text = "HloModule m\n\nENTRY e {\n  x = f32[64] parameter(0)\n  t = f32[] constant(0.75)\n  b = f32[64] broadcast(t), dimensions={}\n  ROOT c = pred[64] compare(x, b), direction=GT\n}\n"
    prog = runtime.read(text)
    one = {"groups": [[0]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": []}
    x = make_inputs(prog, prog, one, [[0]], EDGE_SEEDS_FROM)[0][0]
    assert (x == np.float32(0.75)).sum() >= 4
    assert not (make_inputs(prog, prog, one, [[0]], 0)[0][0] == np.float32(0.75)).any()


# ---------------------------------------------------------------------------------------------
# A correct GSPMD model with two meshes in its module
# ---------------------------------------------------------------------------------------------


def test_a_correct_gspmd_model_with_two_meshes_is_not_diverged(pairs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """XLA's importer merged the module's two meshes (and dropped device orders): the witness
    ran the softmax's all-reduces over the gather's groups and called this correct pair
    different ('diverged', or a soundness error under --witness always). Mesh groups are now
    written out explicitly before compiling (engine.witness.runtime)."""
    d = pairs / "gspmd_embed_log_softmax"
    base_text, dist_text, rel = _texts(d)
    assert len(set(re.findall(r"replica_groups=(mesh\[[^\]]*\])", dist_text))) == 2
    r = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", None, witness="always")
    assert r.verdict in ("verified", "unproven"), (r.verdict, r.reason)
    assert r.witness is not None and r.witness["status"] == "equal", r.witness
    # The same pair through XLA's importer as the text is written: other groups, other numbers.
    monkeypatch.setattr(runtime, "explicit_mesh_groups", lambda text: text)
    runtime.read.cache_clear()
    try:
        assert not witness(base_text, dist_text, rel, WitnessOptions(seeds=(0,), memory_mb=float("inf"))).equal
    finally:
        monkeypatch.undo()
        runtime.read.cache_clear()
