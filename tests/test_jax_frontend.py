"""The JAX front end: relations derived from meshes and specs, the configuration's errors, and
the examples/jax table built by real JAX and checked as declared (verified pairs numerically
equal on XLA's CPU runtime, diverged ones confirmed by the witness at a line of the model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from shardproof.engine.errors import InputError
from shardproof.engine.frontend.config import load_config
from shardproof.engine.frontend.jax.build import groups_of, relation_of

ROOT = Path(__file__).resolve().parent.parent


def _mesh(**axes: int) -> SimpleNamespace:
    shape = tuple(axes.values())
    return SimpleNamespace(axis_names=tuple(axes), shape=dict(axes), devices=np.zeros(shape))


def test_groups_follow_the_group_axes() -> None:
    mesh = _mesh(dp=2, tp=4)
    assert groups_of(mesh, ("tp",)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups_of(mesh, ("dp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups_of(mesh, ("dp", "tp")) == [list(range(8))]
    assert groups_of(mesh, ("tp", "dp")) == [[0, 4, 1, 5, 2, 6, 3, 7]]


def test_relations_from_specs() -> None:
    mesh = _mesh(dp=2, tp=4)
    assert relation_of((None, "tp"), (8, 16), mesh, ("tp",), "w") == ({"relation": "sharded", "dim": 1}, (8, 16))
    # Split over the data-parallel axis: the baseline receives one group's rows.
    assert relation_of(("dp", None), (8, 16), mesh, ("tp",), "x") == ({"relation": "duplicate"}, (4, 16))
    assert relation_of(("dp", "tp"), (8, 16), mesh, ("tp",), "y") == ({"relation": "sharded", "dim": 1}, (4, 16))
    assert relation_of((), (8, 16), mesh, ("tp",), "z") == ({"relation": "duplicate"}, (8, 16))
    with pytest.raises(ValueError, match="must split it together"):
        relation_of((("tp", "dp"), None), (8, 16), mesh, ("tp",), "bad")
    with pytest.raises(ValueError, match="two dims"):
        relation_of(("tp", "tp"), (8, 16), mesh, ("tp",), "bad")
    with pytest.raises(ValueError, match="does not divide"):
        relation_of(("dp", None), (3, 16), mesh, ("tp",), "bad")
    with pytest.raises(ValueError, match="does not divide over axis tp"):
        relation_of((None, "tp"), (8, 6), mesh, ("tp",), "bad")


@pytest.mark.parametrize(("text", "key"), [
    ("version: 1\nframework: jax\nmodels: [{name: a, entry: 'm:f', tp: 4}]\n", "models[0].tp"),
    ("version: 1\nframework: jax\nmodels: [{name: a, entry: 'm:f'}, {name: a, entry: 'm:g'}]\n", "models[1].name"),
    ("version: 1\nframework: jax\nmodels: [{name: a, entry: 'm:f', expect: passes}]\n", "models[0].expect"),
    ("version: 1\nframework: jax\nmodels: [{name: a, entry: 'mf'}]\n", "models[0]"),
])
def test_bad_configuration_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    p = tmp_path / ".shardproof.yml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_config(p)
    assert key in str(e.value)


def _bug_site(path: str, variant: str) -> int:
    for n, text in enumerate((ROOT / path).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# BUG-SITE: {variant}"):
            return n
    raise LookupError(variant)


def test_output_shapes_are_one_groups() -> None:
    """A baseline output is one group's: a DP x TP layer with batch 2 over 'data' 2 has a
    baseline output of batch 1, which is not divided again (it was refused: "dim 0 of (1, 8,
    32) does not divide over axis 'data' (2)")."""
    mesh = _mesh(data=2, model=2)
    assert relation_of(("data", None, None), (1, 8, 32), mesh, ("model",), "out", per_group=True) == ({"relation": "duplicate"}, (1, 8, 32))
    assert relation_of(("data", None, "model"), (1, 8, 32), mesh, ("model",), "out", per_group=True) == ({"relation": "sharded", "dim": 2}, (1, 8, 32))
    # The input of the same layer: the baseline receives the group's half of the batch.
    assert relation_of(("data", None, None), (2, 8, 32), mesh, ("model",), "x") == ({"relation": "duplicate"}, (1, 8, 32))


def test_fsdp_weights_are_one_baseline_weight() -> None:
    """Model state split over a non-group axis (FSDP) is one baseline weight, related through
    its all-gather over that axis (gathered); data split so is the group's part."""
    mesh = _mesh(data=2, model=2)
    rel, shape = relation_of(("data", "model"), (32, 128), mesh, ("model",), "w", state=True)
    assert shape == (32, 128)
    assert rel == {"relation": "sharded", "dim": 1, "gathered": {"dim": 0, "groups": [[0, 2], [1, 3]]}}
    assert relation_of(("data", None), (32, 128), mesh, ("model",), "w", state=True)[0] == {"relation": "duplicate", "gathered": {"dim": 0, "groups": [[0, 2], [1, 3]]}}
    assert relation_of(("data", "model"), (32, 128), mesh, ("model",), "x") == ({"relation": "sharded", "dim": 1}, (16, 128))
    with pytest.raises(ValueError, match="FSDP gathers one dim"):
        relation_of(("data", "data"), (32, 128), _mesh(data=2, model=2, pp=1), ("model",), "w", state=True)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        relation_of(("fsdp", None), (32, 128), mesh, ("model",), "w", state=True)


def test_gathered_relations_are_checked() -> None:
    from shardproof.engine.relations import parse_relations

    base = {"groups": [[0, 1], [2, 3]], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    ok = parse_relations({**base, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1, "gathered": {"dim": 0, "groups": [[0, 2], [1, 3]]}}]})
    assert ok.inputs[0].gathered is not None and ok.inputs[0].gathered.groups == ((0, 2), (1, 3))
    # Devices of different ranks gathered together would mix two ranks' blocks.
    with pytest.raises(InputError, match=r"inputs\[0\].gathered.groups.*mixes ranks"):
        parse_relations({**base, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1, "gathered": {"dim": 0, "groups": [[0, 3], [1, 2]]}}]})
    with pytest.raises(InputError, match="cover the devices"):
        parse_relations({**base, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate", "gathered": {"dim": 0, "groups": [[0, 2]]}}]})
    with pytest.raises(InputError, match="on a duplicate or sharded input"):
        parse_relations({**base, "inputs": [{"baseline": 0, "distributed": 0, "relation": "partial", "gathered": {"dim": 0, "groups": [[0, 2], [1, 3]]}}]})


def test_flax_trees_give_their_shardings() -> None:
    """Specs come from the leaves as flax writes them: linen logical boxes through the rules
    (flax's own first-free-rule mapping), nnx variables' metadata, NamedShardings; every box
    is model state, a JaxInput is data unless marked."""
    pytest.importorskip("flax")
    import flax.linen as nn
    import jax
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardproof.engine.frontend.jax.declare import JaxInput
    from shardproof.engine.frontend.jax.trees import TreeError, flatten

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    rules = [("batch", "data"), ("embed", "data"), ("mlp", "model"), ("vocab", "model")]
    linen = {"params": {"up": {"kernel": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((4, 8), "float32"), ("embed", "mlp"))},
                        "emb": {"embedding": nn.Partitioned(jax.ShapeDtypeStruct((16, 4), "float32"), ("model", None))}}}
    sds = jax.ShapeDtypeStruct((2, 4), "float32", sharding=NamedSharding(mesh, P("data")))
    leaves, rebuild = flatten([linen, JaxInput("x", (2, 4), spec=("batch", None)), sds], mesh, rules)
    assert [(lf.name, lf.spec, lf.state) for lf in leaves] == [
        ("args[0].params.emb.embedding", ("model", None), True),
        ("args[0].params.up.kernel", ("data", "model"), True),
        ("x", ("data", None), False),
        ("args[2]", ("data",), False),
    ]
    # Rebuilt around new values, the boxes stay (flax's apply reads them as it does in init).
    args = rebuild([1, 2, 3, 4])
    assert isinstance(args[0]["params"]["up"]["kernel"], nn.LogicallyPartitioned) and args[0]["params"]["up"]["kernel"].value == 2
    assert args[1:] == (3, 4)
    # A mapping where 'embed' is taken already: flax's first free rule leaves it unsharded.
    leaves, _ = flatten([nn.LogicallyPartitioned(jax.ShapeDtypeStruct((4, 8), "float32"), ("embed", "batch"))], mesh, [("batch", "data"), ("embed", "data")])
    assert leaves[0].spec == (None, "data")
    with pytest.raises(TreeError, match="no logical axis rules"):
        flatten([JaxInput("x", (2, 4), spec=("batch", None))], mesh, None)

    class Lin(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.w = nnx.Linear(4, 8, use_bias=False, kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp")), rngs=rngs)

    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(lambda: Lin(nnx.Rngs(0)))
    leaves, rebuild = flatten([module], mesh, rules)
    assert [(lf.name, lf.shape, lf.spec, lf.state) for lf in leaves] == [("args[0].w.kernel", (4, 8), ("data", "model"), True)]
    assert isinstance(rebuild([jax.ShapeDtypeStruct((4, 8), "float32")])[0].w.kernel, nnx.Variable)
    # nnx's functional form: the State of nnx.split carries the same metadata.
    _, state = nnx.split(module)
    leaves, _ = flatten([state], mesh, rules)
    assert [(lf.name, lf.spec, lf.state) for lf in leaves] == [("args[0].w.kernel", ("data", "model"), True)]


def test_examples_jax_table_as_declared(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    # `shardproof run` hands a `framework: jax` configuration to the JAX front end.
    cli = Path(sys.executable).parent / "shardproof"
    proc = subprocess.run([str(cli), "run", "--config", str(ROOT / "examples/jax/.shardproof.yml"), "--out", str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The runner's result.json, as for torch models (what the bot reads).
    rows = json.loads((out / "result.json").read_text())["models"]
    declared = yaml.safe_load((ROOT / "examples/jax/.shardproof.yml").read_text())["models"]
    assert [r["name"] for r in rows] == [m["name"] for m in declared]
    from shardproof.engine.witness.pair import WitnessOptions, witness

    for r, m in zip(rows, declared, strict=True):
        assert r["status"] == m.get("expect", "verified"), r  # the runner's default
        d = out / r["name"]
        if r["status"] == "verified":
            # Deep float stacks (the scan) differ by rounding in f32 (psum reorders sums): the
            # witness's own judgment reruns a differing seed in f64, where they must agree.
            numeric = witness((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text()),
                              WitnessOptions(seeds=(1,), memory_mb=float("inf"), recheck_f64=True))
            assert numeric.equal, (r["name"], numeric.summary())
        if r["status"] == "diverged":
            assert r["result"]["witness"]["status"] == "confirmed", r["name"]
            source = f"examples/jax/{m['entry'].split(':')[0]}.py"
            assert r["result"]["divergences"][0]["source"]["file"] == source, r
            if source.endswith(("flax_models.py", "spellings.py")):  # at the bug's own line
                assert r["result"]["divergences"][0]["source"]["line"] == _bug_site(source, m["variant"]), r
        if m.get("variant") is None:
            # The distributed program is the per-device module after SPMD partitioning.
            assert "partition" in (d / "distributed.hlo").read_text().split("\n", 1)[0] or "_spmd" in (d / "distributed.hlo").read_text()
