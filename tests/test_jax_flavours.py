"""JAX as a producer: what XLA writes without special flags, straight from jaxlib (0.10).

Every pair is produced by real JAX on 4 virtual CPU devices (in a subprocess: XLA_FLAGS must be
set before jax starts) and checked twice: by the verifier on the producer's text as written (no
rewriting), and by the numeric oracle (XLA's CPU runtime). A correct pair must be verified and
numerically equal, a bug diverged and numerically different.

Flavours covered: ``compile().as_text()`` (kLoop / ``__ynn_fusion`` fusions, bitcasts, JAX's
rank ``and(partition-id, 3)``), GSPMD ``jit`` with shardings (mesh replica groups
``mesh['axis_0'=1,'axis_1'=4] {'axis_1'}``), the module XLA dumps after SPMD partitioning
(``call`` from nested jit, ``convert(remainder(divide(pid, 1), 4))`` u32->s32, the partitioner's
offset table ``dynamic-slice(constant({0,1,2,3}), partition-id)``), ``lax.scan`` (``while``)
and the global pre-partitioning program (refused with a located error).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

N = 4


def _produce(out: Path) -> None:  # runs in a subprocess: python tests/test_jax_flavours.py OUT
    dump = out / "dump"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N} --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))

    def save(name: str, text: str) -> None:
        (out / f"{name}.hlo").write_text(text)

    def compiled(f: Any, *args: Any) -> str:
        return jax.jit(f).lower(*args).compile().as_text()

    x, w1, w2 = jnp.ones((8, 16)), jnp.ones((16, 32)), jnp.ones((32, 16))

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.nn.relu(x @ w1) @ w2

    def mlp_tp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(mlp(x, w1, w2), "x")

    def mlp_tp_nopsum(x: Any, w1: Any, w2: Any) -> Any:
        return mlp(x, w1, w2)  # BUG: the row-parallel output is used without its psum

    save("mlp_base", compiled(mlp, x, w1, w2))
    for name, fn in (("mlp_sm", mlp_tp), ("mlp_sm_bug", mlp_tp_nopsum)):
        save(name, compiled(shard_map(fn, mesh=mesh, in_specs=(P(), P(None, "x"), P("x", None)), out_specs=P(), check_vma=False), x, w1, w2))

    def sharding(*spec: Any) -> NamedSharding:
        return NamedSharding(mesh, P(*spec))

    def mlp_scaled(x: Any, w1: Any, w2: Any) -> Any:
        return mlp(x, w1, w2) * N  # BUG: the output multiplied by the parallel degree

    for name, fn in (("mlp_gspmd", mlp), ("mlp_gspmd_bug", mlp_scaled)):
        g = jax.jit(fn, in_shardings=(sharding(), sharding(None, "x"), sharding("x", None)), out_shardings=sharding())
        save(name, g.lower(x, w1, w2).compile().as_text())

    def double(x: Any) -> Any:
        return jnp.where(x > 0, x, -x) * 2.0

    def row_block(x: Any) -> Any:
        i = jax.lax.axis_index("x")
        return double(jax.lax.dynamic_slice_in_dim(x, i * 2, 2, axis=0))

    def row_block_shifted(x: Any) -> Any:
        i = (jax.lax.axis_index("x") + 1) % N  # BUG: the neighbour's block
        return double(jax.lax.dynamic_slice_in_dim(x, i * 2, 2, axis=0))

    save("rows_base", compiled(double, x))
    for name, fn in (("rows_sm", row_block), ("rows_sm_bug", row_block_shifted)):
        g = jax.jit(shard_map(fn, mesh=mesh, in_specs=(P(),), out_specs=P("x"), check_vma=False))
        save(name, g.lower(x).compile().as_text())
        save(name + "_global", g.lower(x).as_text(dialect="hlo"))
        # The per-device module right after SPMD partitioning, before optimization: calls and
        # JAX's own rank arithmetic as written.
        g.lower(x).compile()
        (found,) = [p for p in dump.iterdir() if f".jit_{fn.__name__}." in p.name and "after_spmd-partitioning" in p.name]
        save(name + "_spmd", found.read_text())

    def scan_model(x: Any, w1s: Any, w2s: Any) -> Any:
        return jax.lax.scan(lambda c, w: (c + jnp.tanh(jax.nn.relu(c @ w[0]) @ w[1]), None), x, (w1s, w2s))[0]

    def scan_tp(bug: bool) -> Any:
        def f(x: Any, w1s: Any, w2s: Any) -> Any:
            def body(c: Any, w: Any) -> Any:
                y = jax.nn.relu(c @ w[0]) @ w[1]
                if not bug:
                    y = jax.lax.psum(y, "x")
                return c + jnp.tanh(y), None

            return jax.lax.scan(body, x, (w1s, w2s))[0]

        return shard_map(f, mesh=mesh, in_specs=(P(), P(None, None, "x"), P(None, "x", None)), out_specs=P(), check_vma=False)

    def heads(x: Any, wq: Any, wk: Any) -> Any:
        # einsums over split heads: XLA's optimizer writes transposes, layout-changing copies
        # and bitcasts that read them (a bitcast after a copy reads the copy's layout).
        q, k = (x @ wq).reshape(8, 4, 4), (x @ wk).reshape(8, 4, 4)
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, k).reshape(8, 16)

    hargs = (x, jnp.ones((16, 16)), jnp.ones((16, 16)))
    save("heads_compiled", compiled(heads, *hargs))
    save("heads_lowered", jax.jit(heads).lower(*hargs).as_text(dialect="hlo"))
    save("mlp_lowered", jax.jit(mlp).lower(x, w1, w2).as_text(dialect="hlo"))

    sargs = (x, jnp.ones((3, 16, 32)), jnp.ones((3, 32, 16)))
    save("scan_base", compiled(scan_model, *sargs))
    # XLA:CPU cannot re-import the optimized loop (its bitcasts keep layouts the importer
    # rejects): the oracle runs the same jit before optimization instead.
    save("scan_base_oracle", jax.jit(scan_model).lower(*sargs).as_text(dialect="hlo"))
    for name, bug in (("scan_sm", False), ("scan_sm_bug", True)):
        fn = scan_tp(bug)
        fn.__name__ = name  # type: ignore[attr-defined]
        save(name, compiled(fn, *sargs))
        (found,) = [p for p in dump.iterdir() if f".jit_{name}." in p.name and "after_spmd-partitioning" in p.name]
        save(name + "_oracle", found.read_text())

    # Head-sharded attention with ONE head per rank (XLA drops the rank's unit head dim, its
    # attention dots become plain 2-D dots where the baseline's are batched over heads), and a
    # log_softmax over a GSPMD-sharded vocab (XLA:CPU splits the baseline's 64-wide row
    # reductions into reduce-window + reduce, the rank reduces its 16 columns directly).
    def attn_core(x: Any, wq: Any, wk: Any, wv: Any, h: int, swap: bool = False) -> Any:
        q, k, v = ((x @ w).reshape(8, h, 4) for w in (wq, wk, wv))
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k) / 2.0, axis=-1)
        # swap (BUG): the probabilities read transposed (keys as queries), a 2-D dot of the
        # right shapes that pairs the wrong dims.
        return jnp.einsum("hkq,khd->qhd" if swap else "hqk,khd->qhd", p, v).reshape(8, h * 4)

    def attn_base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
        return attn_core(x, wq, wk, wv, N) @ wo

    def attn_tp(bug: bool, swap: bool = False) -> Any:
        def f(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
            o = attn_core(x, wq, wk, wv, 1, swap)
            return o @ wo if bug else jax.lax.psum(o @ wo, "x")  # ATTN-PSUM-SITE (BUG: no psum)

        col = P(None, "x")
        return shard_map(f, mesh=mesh, in_specs=(P(), col, col, col, P("x", None)), out_specs=P(), check_vma=False)

    aargs = (x, *(jnp.ones((16, 16)) for _ in range(4)))
    save("attn_base", compiled(attn_base, *aargs))
    for name, bug in (("attn_sm", False), ("attn_sm_bug", True)):
        save(name, compiled(attn_tp(bug), *aargs))
    save("attn_sm_swap", compiled(attn_tp(False, swap=True), *aargs))

    def lsm(x: Any, w: Any) -> Any:
        return jax.nn.log_softmax(x @ w, axis=-1)

    def lsm_local(x: Any, w: Any) -> Any:
        return jax.nn.log_softmax(x @ w, axis=-1)  # LSM-LOCAL (BUG: normalized over the rank's columns only)

    wv_ = jnp.ones((16, 64))
    save("lsm_base", compiled(lsm, x, wv_))
    save("lsm_lowered", jax.jit(lsm).lower(x, wv_).as_text(dialect="hlo"))
    g = jax.jit(lsm, in_shardings=(sharding(), sharding(None, "x")), out_shardings=sharding(None, "x"))
    save("lsm_gspmd", g.lower(x, wv_).compile().as_text())
    save("lsm_sm_bug", compiled(shard_map(lsm_local, mesh=mesh, in_specs=(P(), P(None, "x")), out_specs=P(None, "x"), check_vma=False), x, wv_))

    # Rotary embedding with the sequence sharded: the rank's positions are r·w + iota(w).
    # XLA:CPU writes the baseline's positions as iota s32[16, 1], converted, then bitcast to
    # [16] (rules/rankpos.egg rpos-unit-reshape); the rank's as broadcast(r·4) + iota s32[4].
    def rope(x: Any, pos: Any) -> Any:
        half = x.shape[1] // 2
        ang = pos[:, None].astype(jnp.float32) * (1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half)))[None, :]
        a, b = x[:, :half], x[:, half:]
        return jnp.concatenate([a * jnp.cos(ang) - b * jnp.sin(ang), a * jnp.sin(ang) + b * jnp.cos(ang)], axis=-1)

    def rope_sp(shift: int) -> Any:
        def f(x: Any) -> Any:
            w = x.shape[0]
            return rope(x, jax.lax.axis_index("x") * w + shift + jnp.arange(w))  # shift 1: BUG, positions off by one

        return shard_map(f, mesh=mesh, in_specs=(P("x", None),), out_specs=P("x", None), check_vma=False)

    xr = jnp.ones((16, 8))
    save("rope_base", compiled(lambda x: rope(x, jnp.arange(x.shape[0])), xr))
    save("rope_sm", compiled(rope_sp(0), xr))
    save("rope_sm_off", compiled(rope_sp(1), xr))


RELATIONS = {
    "mlp": {"groups": [list(range(N))], "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "duplicate"},
        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 1},
        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 0}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]},
    "rows": {"groups": [list(range(N))], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
             "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]},
    "scan": {"groups": [list(range(N))], "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "duplicate"},
        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 2},
        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 1}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]},
    "attn": {"groups": [list(range(N))], "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "duplicate"},
        *({"baseline": i, "distributed": i, "relation": "sharded", "dim": 1} for i in (1, 2, 3)),
        {"baseline": 4, "distributed": 4, "relation": "sharded", "dim": 0}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]},
    "lsm": {"groups": [list(range(N))], "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "duplicate"},
        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 1}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]},
    "rope": {"groups": [list(range(N))], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
             "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]},
}

PAIRS = [
    # (baseline, distributed, relations, verdict)
    ("mlp_base", "mlp_sm", "mlp", "verified"),
    ("mlp_base", "mlp_sm_bug", "mlp", "diverged"),
    ("mlp_base", "mlp_gspmd", "mlp", "verified"),
    ("mlp_base", "mlp_gspmd_bug", "mlp", "diverged"),
    ("rows_base", "rows_sm", "rows", "verified"),
    ("rows_base", "rows_sm_bug", "rows", "diverged"),
    ("rows_base", "rows_sm_spmd", "rows", "verified"),
    ("rows_base", "rows_sm_bug_spmd", "rows", "diverged"),
    ("scan_base", "scan_sm", "scan", "verified"),
    ("scan_base", "scan_sm_bug", "scan", "diverged"),
    # The loop before optimization (calls inside the body, the dump after partitioning).
    ("scan_base_oracle", "scan_sm_oracle", "scan", "verified"),
    ("scan_base_oracle", "scan_sm_bug_oracle", "scan", "diverged"),
]


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("jax")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, __file__, str(out)], check=True, env=env, timeout=600)
    for name, rel in RELATIONS.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump(rel))
    return out


def _check(produced: Path, base: str, dist: str, rel: str) -> Any:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    return check_files(load_relations(produced / f"{rel}.yaml"), produced / f"{base}.hlo", produced / f"{dist}.hlo", witness="never")


@pytest.mark.parametrize(("base", "dist", "rel", "verdict"), PAIRS)
def test_jax_pair_verdict_matches_oracle(produced: Path, base: str, dist: str, rel: str, verdict: str) -> None:
    result = _check(produced, base, dist, rel)
    assert result.verdict == verdict, result.reason
    oracle = pytest.importorskip("oracle")
    texts = [oracle.fusions_as_calls((produced / f"{n}_oracle.hlo" if (produced / f"{n}_oracle.hlo").exists() else produced / f"{n}.hlo").read_text()) for n in (base, dist)]
    numeric = oracle.run_pair(texts[0], texts[1], RELATIONS[rel], seed=0)
    assert numeric.equal == (verdict == "verified"), numeric.summary()
    if verdict == "diverged":
        # Located at the user's Python line (stack_frame_id), not at "<no source>".
        assert any((d.get("source") or {}).get("file", "").endswith("test_jax_flavours.py") for d in result.divergences), result.divergences


def test_producer_flavours_are_as_described(produced: Path) -> None:
    """The texts hold what this file claims to cover (a jaxlib upgrade that prints something
    else must fail here, not silently test less)."""
    text = {p.stem: p.read_text() for p in produced.glob("*.hlo")}
    assert "__ynn_fusion" in text["mlp_sm"] and "kind=kLoop" in text["mlp_sm"]
    assert re.search(r"replica_groups=mesh\['axis_0'=1,'axis_1'=4\] \{'axis_1'\}", text["mlp_gspmd"])
    assert re.search(r"and\(%param[\w.]*, %constant[\w.]*\)", text["rows_sm"]) and "partition-id()" in text["rows_sm"]
    assert " call(" in text["rows_sm_spmd"] and "remainder(" in text["rows_sm_spmd"] and "partition-id()" in text["rows_sm_spmd"]
    assert " while(" in text["scan_sm"] and "bitcast(" in text["scan_sm"]


def test_global_program_is_refused_with_the_flavour_to_use(produced: Path) -> None:
    from shardproof.engine.errors import InputError

    with pytest.raises(InputError) as e:
        _check(produced, "rows_base", "rows_sm_global", "rows")
    msg = str(e.value)
    assert "xla.sdy." in msg and "compile().as_text()" in msg and "after_spmd-partitioning" in msg
    assert re.search(r"rows_sm_global\.hlo:\d+:\d+", msg)


def test_scan_is_unrolled_and_iterations_proven_once(produced: Path) -> None:
    result = _check(produced, "scan_base", "scan_sm", "scan")
    assert result.verdict == "verified"
    # 3 iterations: the weight slices, one proven iteration, two reused from the layer memo.
    assert result.stats["segments_reused"] >= 2, result.stats


if __name__ == "__main__":
    _produce(Path(sys.argv[1]))


@pytest.mark.parametrize(("compiled", "reference"), [("heads_compiled", "heads_lowered"), ("mlp_base", "mlp_lowered"), ("scan_base", "scan_base_oracle"), ("lsm_base", "lsm_lowered")])
def test_flattened_compiled_program_computes_what_xla_computes(produced: Path, compiled: str, reference: str) -> None:
    """flatten() of an optimized module (fusions inlined, bitcasts as transposes and reshapes,
    copies dropped, loops unrolled), printed back to HLO and run by XLA, equals the same jit
    before optimization on random inputs, bit for bit up to float reassociation."""
    np = pytest.importorskip("numpy")
    oracle = pytest.importorskip("oracle")
    from shardproof.engine.hlo.flavours import flatten
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.hlo.printer import print_hlo

    flat = flatten(parse_hlo((produced / f"{compiled}.hlo").read_text(), f"{compiled}.hlo"))
    assert not {"fusion", "bitcast", "copy", "while", "call"} & {i.opcode for i in flat.entry.instructions}
    by = {i.name: i for i in flat.entry.instructions}
    # XLA:CPU's tree reduction (reduce of a reduce-window) is read back as the one reduce.
    assert not any(i.opcode == "reduce" and by[i.operands[0]].opcode == "reduce-window" for i in flat.entry.instructions)
    assert compiled != "lsm_base" or "reduce-window" in (produced / f"{compiled}.hlo").read_text()
    ref = (produced / f"{reference}.hlo").read_text()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.shape.dims).astype(np.float32) for p in parse_hlo(ref, "r").entry.parameters]
    want = oracle.run_hlo(ref, args)
    got = oracle.run_hlo(print_hlo(flat), args)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("base", "dist", "rel", "verdict", "site"), [
    ("attn_base", "attn_sm", "attn", "verified", None),
    ("attn_base", "attn_sm_bug", "attn", "diverged", "ATTN-PSUM-SITE"),
    ("attn_base", "attn_sm_swap", "attn", "diverged", None),
    ("lsm_base", "lsm_gspmd", "lsm", "verified", None),
    ("lsm_base", "lsm_sm_bug", "lsm", "diverged", "LSM-LOCAL"),
])
def test_compiled_text_proves_what_the_partitioned_text_proves(produced: Path, base: str, dist: str, rel: str, verdict: str, site: str | None) -> None:
    """compile().as_text() of one head per rank (unit head dim dropped: 2-D dots against the
    baseline's head-batched dots, rules/layout.egg dot2) and of a log_softmax whose baseline rows
    XLA:CPU reduces as reduce-window + reduce (hlo.flavours untree): correct = verified, bug =
    diverged with a confirming numeric witness, located at the line where the psum belongs."""
    texts = {n: (produced / f"{n}.hlo").read_text() for n in (base, dist)}
    if rel == "attn":  # the flavour under test: the rank's dots lost the head (batch) dim
        assert "lhs_batch_dims={0}" in texts[base] and "lhs_batch_dims" not in texts[dist]
    else:
        assert "reduce-window(" in texts[base] and "reduce-window(" not in texts[dist]
    result = _check(produced, base, dist, rel) if verdict == "verified" else _check_witnessed(produced, base, dist, rel)
    assert result.verdict == verdict, result.reason
    if verdict == "diverged":
        assert result.witness is not None and result.witness["status"] == "confirmed", result.witness
    if site is not None:
        line = next(i for i, text in enumerate(Path(__file__).read_text().split("\n"), 1) if site in text and "ATTN-PSUM-SITE\"" not in text and "LSM-LOCAL\"" not in text)
        assert any((d.get("source") or {}).get("line") == line for d in result.divergences), result.divergences


def _check_witnessed(produced: Path, base: str, dist: str, rel: str) -> Any:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    return check_files(load_relations(produced / f"{rel}.yaml"), produced / f"{base}.hlo", produced / f"{dist}.hlo", witness="auto")


def test_compiled_rope_positions_meet_the_baseline_iota(produced: Path) -> None:
    """compile().as_text() of sequence-parallel RoPE: the baseline's positions are iota [16, 1]
    bitcast to [16] after the convert, the rank's r·4 + iota [4] (rules/rankpos.egg
    rpos-unit-reshape). Correct = verified; positions off by one = diverged with a confirming
    numeric witness."""
    base = (produced / "rope_base.hlo").read_text()
    assert re.search(r"s32\[16,1\]\{1,0\} iota\(\), iota_dimension=0", base) and "bitcast(" in base
    assert re.search(r"s32\[4\]\{0\} add\(", (produced / "rope_sm.hlo").read_text())
    result = _check(produced, "rope_base", "rope_sm", "rope")
    assert result.verdict == "verified", result.reason
    bug = _check_witnessed(produced, "rope_base", "rope_sm_off", "rope")
    assert bug.verdict == "diverged", bug.reason
    assert bug.witness is not None and bug.witness["status"] == "confirmed", bug.witness
