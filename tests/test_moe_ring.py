"""All-to-all MoE, the tuple all-to-all, and ring attention (issue 15, scope 1 and 2).

- tplm's expert-parallel MoE with an all-to-all dispatcher and combiner (examples/tplm/moe.py,
  ``AllToAllMoE``), built with torch-xla: verified by the all-to-all re-sharding law
  (rules/alltoall.egg); round-robin expert ownership against contiguous weights is diverged at
  its BUG-SITE with a confirmed witness.
- The tuple all-to-all XLA:CPU writes for every array all-to-all (``jax.jit(...).compile()``):
  hlo/normalize.py reads it as one array all-to-all. Pairs produced by real JAX on 4 virtual CPU
  devices: Ulysses re-sharding verified, DeepSpeed #5808 (batch split) diverged; XLA's own
  runtime agrees, and runs the normalized program to the same numbers.
- Ring attention (examples/tplm/ring.py, ``RingAttention``): K/V blocks around the ring by
  collective-permute, online softmax over the steps: verified by rules/ring.egg (the score block
  of query block r and key block r + k, the running max as a loop reduce with maximum, the
  online-softmax rescaling); its off-by-one ring is diverged at its BUG-SITE with a confirmed
  witness, and mutants of the real program (a rescale dropped or inverted, a key block's terms
  dropped) are never verified and the oracle finds them unequal.
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
from bug_sites import bug_sites
from config_runs import TPLM_HEAD, run_template

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.printer import print_hlo
from shardproof.engine.relations import parse_relations

ROOT = Path(__file__).parents[1]
SITES = bug_sites(sorted((ROOT / "examples" / "tplm").glob("*.py")), ROOT)
N = 4

CONFIG = TPLM_HEAD + """\
  size: {{hidden: 32, ffn: 64, heads: 4, seq: 8, batch: 2, experts: 8, top_k: 2}}
models:
  - {{name: moe_a2a, entry: tplm.models:moe_alltoall, expect: verified}}
  - {{name: moe_a2a_dp2, entry: tplm.models:moe_alltoall, groups: [[0, 1], [2, 3]], size: {{top_k: 1}}, expect: verified}}
  - {{name: moe_a2a_owner, entry: tplm.models:moe_alltoall, variant: moe_a2a_expert_owner, expect: diverged}}
  - {{name: ring_attn, entry: tplm.models:ring_attention, expect: verified}}
  - {{name: ring_attn_off_by_one, entry: tplm.models:ring_attention, variant: ring_attn_step_off_by_one, expect: diverged}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run_template(tmp_path_factory.mktemp("moe_ring"), "moe_ring.shardproof.yml", CONFIG)


def model(built: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    entry = next(m for m in built[0]["models"] if m["name"] == name)
    assert entry["build"]["error"] is None, entry["build"]["error"]
    return entry


def _rules(entry: dict[str, Any]) -> set[str]:
    return {step["rule"] for t in entry["result"]["trace"] for step in t["steps"]}


# ---- the all-to-all MoE (torch-xla) -----------------------------------------------------------


@pytest.mark.parametrize("name", ["moe_a2a", "moe_a2a_dp2"])
def test_all_to_all_moe_is_verified_by_the_resharding_law(built: tuple[dict[str, Any], Path], name: str) -> None:
    entry = model(built, name)
    assert entry["status"] == "verified", entry["result"]["reason"]
    assert "alltoall/reshards-split-dim" in _rules(entry)
    d = built[1] / name
    # Dispatch and combine are real all-to-alls in the program one rank runs; none in the baseline.
    assert len(re.findall(r" all-to-all\(", (d / "distributed.hlo").read_text())) == 2
    assert " all-to-all(" not in (d / "baseline.hlo").read_text()


def test_wrong_expert_owner_is_diverged_at_its_line_with_a_witness(built: tuple[dict[str, Any], Path]) -> None:
    entry = model(built, "moe_a2a_owner")
    assert entry["status"] == "diverged", entry["result"]["reason"]
    assert entry["result"]["witness"]["status"] == "confirmed"
    first = entry["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == SITES["moe_a2a_expert_owner"]


@pytest.mark.parametrize(("name", "equal"), [("moe_a2a", True), ("moe_a2a_dp2", True), ("moe_a2a_owner", False), ("ring_attn", True), ("ring_attn_off_by_one", False)])
def test_the_oracle_agrees(built: tuple[dict[str, Any], Path], name: str, equal: bool) -> None:
    oracle = pytest.importorskip("oracle")
    d = built[1] / name
    rel = yaml.safe_load((d / "relations.yaml").read_text())
    assert oracle.run_pair((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), rel, seed=1).equal == equal


# ---- ring attention (torch-xla) ---------------------------------------------------------------


def test_ring_attention_is_verified_by_the_online_softmax_law(built: tuple[dict[str, Any], Path]) -> None:
    entry = model(built, "ring_attn")
    assert entry["status"] == "verified", entry["result"]["reason"]
    rules = _rules(entry)
    assert {"ring/online-softmax-covers-all-blocks", "ring/loop-reduce-covers-all-blocks"} <= rules, rules
    # The ring is real: c - 1 shifts of K and of V.
    text = (built[1] / "ring_attn" / "distributed.hlo").read_text()
    assert len(re.findall(r" collective-permute\(", text)) == 2 * (N - 1)


def test_ring_attention_off_by_one_is_diverged_at_its_line_with_a_witness(built: tuple[dict[str, Any], Path]) -> None:
    entry = model(built, "ring_attn_off_by_one")
    assert entry["status"] == "diverged", entry["result"]["reason"]
    assert entry["result"]["witness"]["status"] == "confirmed"
    first = entry["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == SITES["ring_attn_step_off_by_one"]


def _drop_den_rescale(text: str) -> str:
    """The denominator not rescaled at the first step that raises the max: denom * scale ->
    denom (a keepdim multiply by an exponential, as copy of its other operand)."""
    return re.sub(r"(%\S+ = (f32\[\d+,\d+,\d+,1\]\S*) )multiply\((\S+ %\S+), \S+ %exponential\.\d+\)", r"\1copy(\3)", text, count=1)


def _drop_acc_rescale(text: str) -> str:
    """The numerator not rescaled: acc * bcast(scale) -> acc."""
    scales = re.findall(r"(%broadcast\.\d+) = f32\[\d+,\d+,\d+,\d+\]\S* broadcast\(f32\[\d+,\d+,\d+\]\S* %reshape\.\d+\), dimensions=\{0,1,2\}", text)
    for s in scales:
        new = re.sub(r"(%\S+ = (\S+) )multiply\((\S+ %\S+), \S+ " + re.escape(s) + r"\)", r"\1copy(\3)", text, count=1)
        if new != text:
            return new
    return text


def _invert_rescale(text: str) -> str:
    """exp(m_new - m_old) instead of exp(m_old - m_new) at the first step."""
    return re.sub(r"(%\S+ = f32\[\d+,\d+,\d+,1\]\S* subtract\()(\S+ %\S+), (\S+ %\S+)\)", r"\1\3, \2)", text, count=1)


def _block_max_rescale(text: str) -> str:
    """Wrong max: the first rescale uses the new key block's max instead of the running max,
    exp(m_old - block_max) (the max's second operand is the block max, ring.py's m.maximum)."""
    mx = re.search(r"= f32\[\d+,\d+,\d+,1\]\S* maximum\(\S+ %\S+, (\S+ %\S+)\)", text)
    assert mx is not None
    return re.sub(r"(%\S+ = f32\[\d+,\d+,\d+,1\]\S* subtract\(\S+ %\S+, )\S+ %\S+\)", lambda m: m.group(1) + mx.group(1) + ")", text, count=1)


def _drop_last_den_term(text: str) -> str:
    """The last key block's terms missing from the denominator only: the last keepdim add of
    the running denominator keeps its rescaled part."""
    adds = list(re.finditer(r"(%\S+ = (f32\[\d+,\d+,\d+,1\]\S*) )add\((\S+ %\S+), (\S+ %\S+)\)", text))
    m = adds[-1]
    return text[: m.start()] + f"{m.group(1)}copy({m.group(3)})" + text[m.end() :]


@pytest.mark.parametrize("mutate", [_drop_den_rescale, _drop_acc_rescale, _invert_rescale, _block_max_rescale, _drop_last_den_term])
def test_ring_attention_mutants_are_never_verified(built: tuple[dict[str, Any], Path], mutate: Any) -> None:
    d = built[1] / "ring_attn"
    baseline, distributed = (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text()
    bad = mutate(distributed)
    assert bad != distributed, mutate.__name__
    rel = yaml.safe_load((d / "relations.yaml").read_text())
    result = verify(parse_relations(rel), parse_hlo(baseline, "baseline.hlo"), parse_hlo(bad, "distributed.hlo"))
    assert result.verdict != "verified", mutate.__name__
    oracle = pytest.importorskip("oracle")
    assert not oracle.run_pair(baseline, bad, rel, seed=1).equal, mutate.__name__


# ---- the tuple all-to-all (JAX) -------------------------------------------------------------


def _produce(out: Path) -> None:  # runs in a subprocess: python tests/test_moe_ring.py OUT
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={N}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import shard_map
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    x = jnp.ones((8, 2, 8, 3))  # (seq, batch, heads, head_dim)

    def attn_in(x: Any) -> Any:
        return jnp.exp(x)

    def ulysses(x: Any) -> Any:  # sequence blocks -> head blocks
        return jax.lax.all_to_all(jnp.exp(x), "x", 2, 0, tiled=True)

    def ulysses_5808(x: Any) -> Any:  # DeepSpeed #5808: the split falls on batch*heads
        s, b, h, d = x.shape
        y = jax.lax.all_to_all(jnp.exp(x).reshape(s, b * h, d), "x", 1, 0, tiled=True)
        return y.reshape(s * N, b, h // N, d)

    (out / "base.hlo").write_text(jax.jit(attn_in).lower(x).compile().as_text())
    for name, fn in (("a2a", ulysses), ("a2a_5808", ulysses_5808)):
        g = jax.jit(shard_map(fn, mesh=mesh, in_specs=(P("x"),), out_specs=P(None, None, "x"), check_vma=False))
        (out / f"{name}.hlo").write_text(g.lower(x).compile().as_text())


JAX_REL = {"groups": [list(range(N))], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 2}]}


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("jax_a2a")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, __file__, str(out)], check=True, env=env, timeout=600)
    return out


def test_jax_writes_the_tuple_form(produced: Path) -> None:
    """What this file claims to cover: XLA:CPU's tuple all-to-all, one operand per device, no
    split dimension (a jaxlib that writes something else must fail here, not test less)."""
    for name in ("a2a", "a2a_5808"):
        (line,) = [ln for ln in (produced / f"{name}.hlo").read_text().splitlines() if " all-to-all(" in ln]
        assert line.split("=", 1)[1].strip().startswith("(") and "dimensions=" not in line, line
        assert line.count("%") == 1 + N, line


@pytest.mark.parametrize(("dist", "verdict"), [("a2a", "verified"), ("a2a_5808", "diverged")])
def test_jax_tuple_all_to_all_verdict_and_oracle(produced: Path, dist: str, verdict: str) -> None:
    base, text = (produced / "base.hlo").read_text(), (produced / f"{dist}.hlo").read_text()
    result = verify(parse_relations(JAX_REL), parse_hlo(base, "base.hlo"), parse_hlo(text, f"{dist}.hlo"))
    assert result.verdict == verdict, result.reason
    if verdict == "verified":
        assert "alltoall/reshards-split-dim" in {s["rule"] for t in result.trace for s in t["steps"]}
    oracle = pytest.importorskip("oracle")
    assert oracle.run_pair(oracle.fusions_as_calls(base), oracle.fusions_as_calls(text), JAX_REL, seed=0).equal == (verdict == "verified")


@pytest.mark.parametrize("dist", ["a2a", "a2a_5808"])
def test_normalized_tuple_all_to_all_computes_what_xla_computes(produced: Path, dist: str) -> None:
    """The array all-to-all the normalizer writes, printed back to HLO and run by XLA, gives
    the numbers the original tuple form gives (equal to the baseline exactly when it was)."""
    oracle = pytest.importorskip("oracle")
    base, text = (produced / "base.hlo").read_text(), (produced / f"{dist}.hlo").read_text()
    norm = normalize(parse_hlo(text, f"{dist}.hlo"))
    ops = [i.opcode for i in norm.entry.instructions]
    assert ops.count("all-to-all") == 1 and not any(i.shape.is_tuple for i in norm.entry.instructions if i.opcode == "all-to-all")
    printed = print_hlo(norm)
    original = oracle.run_pair(oracle.fusions_as_calls(base), oracle.fusions_as_calls(text), JAX_REL, seed=2)
    rewritten = oracle.run_pair(oracle.fusions_as_calls(base), printed, JAX_REL, seed=2)
    assert rewritten.equal == original.equal == (dist == "a2a")


# ---- the tuple all-to-all (hand-written: operands that are not XLA's own split) ------------------


def _stacked_pair(groups: str = "{{0,1,2,3}}", order: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[str, str, dict]:
    """Rank r holds rows 4r..4r+3 of x (16 x 3) and sends exp of its row i to device i as its
    own operand (a reshape of a row, not a slice of one array): device j receives row j of every
    rank, i.e. rows j, 4 + j, 8 + j, 12 + j of x: block j of x viewed (4, 4, 3) transposed to
    (4, 4, 3) and flattened. ``order`` permutes the received elements (a bug unless identity)."""
    lines = ["  %x = f32[4,3]{1,0} parameter(0)", "  %e = f32[4,3]{1,0} exponential(f32[4,3]{1,0} %x)"]
    for i in range(N):
        lines += [f"  %sl{i} = f32[1,3]{{1,0}} slice(f32[4,3]{{1,0}} %e), slice={{[{i}:{i + 1}], [0:3]}}",
                  f"  %rw{i} = f32[3]{{0}} reshape(f32[1,3]{{1,0}} %sl{i})"]
    tup = ", ".join(["f32[3]{0}"] * N)
    lines.append(f"  %a = ({tup}) all-to-all({', '.join(f'f32[3]{{0}} %rw{i}' for i in range(N))}), replica_groups={groups}")
    for i in range(N):
        lines += [f"  %ge{i} = f32[3]{{0}} get-tuple-element(({tup}) %a), index={order[i]}",
                  f"  %un{i} = f32[1,3]{{1,0}} reshape(f32[3]{{0}} %ge{i})"]
    lines.append(f"  ROOT %o = f32[4,3]{{1,0}} concatenate({', '.join(f'f32[1,3]{{1,0}} %un{i}' for i in range(N))}), dimensions={{0}}")
    distributed = "HloModule dist\n\nENTRY %main (x: f32[4,3]) -> f32[4,3] {\n" + "\n".join(lines) + "\n}\n"
    baseline = """HloModule base

ENTRY %main (x: f32[16,3]) -> f32[16,3] {
  %x = f32[16,3]{1,0} parameter(0)
  %e = f32[16,3]{1,0} exponential(f32[16,3]{1,0} %x)
  %v = f32[4,4,3]{2,1,0} reshape(f32[16,3]{1,0} %e)
  %t = f32[4,4,3]{2,1,0} transpose(f32[4,4,3]{2,1,0} %v), dimensions={1,0,2}
  ROOT %o = f32[16,3]{1,0} reshape(f32[4,4,3]{2,1,0} %t)
}
"""
    rel = {"groups": [list(range(N))], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    return baseline, distributed, rel


@pytest.mark.parametrize(("kw", "equal"), [({}, True), ({"order": (1, 0, 2, 3)}, False), ({"groups": "{{0,1,2,3},{4,5,6,7}}"}, True)])
def test_stacked_tuple_all_to_all_is_the_array_form(kw: dict, equal: bool) -> None:
    """Operands that are not pieces of one array are stacked along a new dim: XLA runs the
    normalized program to the numbers of the original, and a wrong element order is never
    verified."""
    oracle = pytest.importorskip("oracle")
    baseline, distributed, rel = _stacked_pair(**kw)
    if "groups" in kw:  # 8 devices in two groups: the same exchange inside each
        rel = dict(rel, groups=[[0, 1, 2, 3], [4, 5, 6, 7]])
    norm = normalize(parse_hlo(distributed, "distributed.hlo"))
    assert [i.opcode for i in norm.entry.instructions].count("all-to-all") == 1
    assert oracle.run_pair(baseline, distributed, rel, seed=0).equal == equal
    assert oracle.run_pair(baseline, print_hlo(norm), rel, seed=0).equal == equal
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    if not equal:
        assert result.verdict != "verified", result.reason


def test_tuple_all_to_all_that_is_not_xla_form_is_left_alone() -> None:
    """Four operands over groups of two, or several operands with a split dimension (which
    XLA refuses: 'AllToAll must have a single operand when the split dimension is specified'),
    are not XLA's tuple form: kept as they are (unsupported), never rewritten."""
    _, distributed, _ = _stacked_pair()
    for bad in (distributed.replace("replica_groups={{0,1,2,3}}", "replica_groups={{0,1},{2,3}}"),
                distributed.replace("replica_groups={{0,1,2,3}}", "replica_groups={{0,1,2,3}}, dimensions={0}")):
        assert bad != distributed
        norm = normalize(parse_hlo(bad, "distributed.hlo"))
        assert any(i.opcode == "all-to-all" and i.shape.is_tuple for i in norm.entry.instructions)


# ---- rings of laid-out shards (rules/permute.egg, lrot) -----------------------------------------


def _pairs(m: int) -> str:
    return "{" + ",".join(f"{{{i},{(i + m) % N}}}" for i in range(N)) + "}"


def _laid_out_ring(steps: int = N - 1, shifts: tuple[int, int] = (1, 1)) -> tuple[str, str, dict]:
    """x (8, 16) @ w (16, 8), both sharded along the contracted 16, as a ring matmul whose
    shards travel in another layout than the one they are used in: x transposed, w flattened,
    each laid back out before its step's dot (ring attention sends K/V in the projection's
    layout and splits heads after each step)."""
    lx, lw, out, tx, fw = "f32[8,4]{1,0}", "f32[4,8]{1,0}", "f32[8,8]{1,0}", "f32[4,8]{1,0}", "f32[32]{0}"
    dot = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    lines = [f"  %x = {lx} parameter(0)", f"  %w = {lw} parameter(1)", f"  %p0 = {out} dot({lx} %x, {lw} %w), {dot}",
             f"  %xt0 = {tx} transpose({lx} %x), dimensions={{1,0}}", f"  %wf0 = {fw} reshape({lw} %w)"]
    acc = "%p0"
    for i in range(1, steps + 1):
        lines += [f"  %xt{i} = {tx} collective-permute({tx} %xt{i - 1}), channel_id={2 * i}, source_target_pairs={_pairs(shifts[0])}",
                  f"  %wf{i} = {fw} collective-permute({fw} %wf{i - 1}), channel_id={2 * i + 1}, source_target_pairs={_pairs(shifts[1])}",
                  f"  %xs{i} = {lx} transpose({tx} %xt{i}), dimensions={{1,0}}",
                  f"  %ws{i} = {lw} reshape({fw} %wf{i})",
                  f"  %p{i} = {out} dot({lx} %xs{i}, {lw} %ws{i}), {dot}",
                  f"  %a{i} = {out} add({out} {acc}, {out} %p{i})"]
        acc = f"%a{i}"
    lines.append(f"  ROOT %o = {out} copy({out} {acc})")
    distributed = "HloModule dist\n\nENTRY %main (x: f32[8,4], w: f32[4,8]) -> f32[8,8] {\n" + "\n".join(lines) + "\n}\n"
    baseline = f"""HloModule base

ENTRY %main (x: f32[8,16], w: f32[16,8]) -> f32[8,8] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %w = f32[16,8]{{1,0}} parameter(1)
  ROOT %d = {out} dot(f32[8,16]{{1,0}} %x, f32[16,8]{{1,0}} %w), {dot}
}}
"""
    rel = {"groups": [list(range(N))],
           "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}, {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return baseline, distributed, rel


LAID_OUT_RINGS = [
    ({}, True),
    ({"shifts": (N - 1, N - 1)}, True),  # the other direction
    ({"steps": N - 2}, False),  # off by one: one block never arrives
    ({"steps": N}, False),  # one step too many: the local block counted twice
    ({"shifts": (1, 2)}, False),  # x and w blocks out of step
]


@pytest.mark.parametrize(("kw", "equal"), LAID_OUT_RINGS)
def test_a_ring_of_laid_out_shards_is_proven_by_the_ring_law(kw: dict, equal: bool) -> None:
    baseline, distributed, rel = _laid_out_ring(**kw)
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    assert (result.verdict == "verified") == equal, result.reason
    if equal:
        rules = {s["rule"] for t in result.trace for s in t["steps"]}
        assert "permute/ring-steps-cover-all-blocks" in rules, rules
    oracle = pytest.importorskip("oracle")
    assert oracle.run_pair(baseline, distributed, rel, seed=0).equal == equal



# ---- loop reduce of a 2-D blocked score over the ring (rules/ring.egg) ----------------------------

_RED = {"max": ("maximum", "-3.40282347e+38"), "add": ("add", "0"), "min": ("minimum", "3.40282347e+38")}


def _ring_rowreduce(op: str = "max", combine: str | None = None, steps: int = N, red_dim: int = 1, pointwise: str = "",
                    keepdim: bool = False, qshift: bool = False) -> tuple[str, str, dict]:
    """Row op-reduce (max: the running max of ring attention) of the scores q @ k^T, queries
    sharded along the sequence, key blocks passed around the ring; each step reduces one key
    block and combines it into the running value. Baseline: the reduce of the whole scores."""
    body, init = _RED[op]
    combine = combine or body
    comp = f"%red (a: f32[], b: f32[]) -> f32[] {{\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %o = f32[] {body}(f32[] %a, f32[] %b)\n}}\n\n"
    dot = "lhs_contracting_dims={1}, rhs_contracting_dims={1}"

    def step(i: int, q: str, k: str, n: int, s: int) -> list[str]:
        sh, rs = f"f32[{n},{n}]{{1,0}}", f"f32[{n}]{{0}}"
        out = [f"  %sc{i} = {sh} dot(f32[{n},4]{{1,0}} {q}, f32[{n},4]{{1,0}} {k}), {dot}"]
        src = f"%sc{i}"
        if pointwise:
            out.append(f"  %ex{i} = {sh} {pointwise}({sh} %sc{i})")
            src = f"%ex{i}"
        out.append(f"  %mx{i} = {rs} reduce({sh} {src}, f32[] %init), dimensions={{{red_dim}}}, to_apply=%red")
        if keepdim:
            out.append(f"  %rs{i} = f32[{n},1]{{1,0}} reshape({rs} %mx{i})")
        return out

    rs = "f32[2,1]{1,0}" if keepdim else "f32[2]{0}"
    name = "%rs" if keepdim else "%mx"
    lines = ["  %qb0 = f32[2,4]{1,0} parameter(0)", "  %kb0 = f32[2,4]{1,0} parameter(1)", f"  %init = f32[] constant({init})", *step(0, "%qb0", "%kb0", 2, 0)]
    acc = f"{name}0"
    for i in range(1, steps):
        lines.append(f"  %kb{i} = f32[2,4]{{1,0}} collective-permute(f32[2,4]{{1,0}} %kb{i - 1}), channel_id={2 * i}, source_target_pairs={_pairs(1)}")
        q = "%qb0"
        if qshift:
            lines.append(f"  %qb{i} = f32[2,4]{{1,0}} collective-permute(f32[2,4]{{1,0}} %qb{i - 1}), channel_id={2 * i + 1}, source_target_pairs={_pairs(1)}")
            q = f"%qb{i}"
        lines += step(i, q, f"%kb{i}", 2, i)
        lines.append(f"  %cb{i} = {rs} {combine}({rs} {acc}, {rs} {name}{i})")
        acc = f"%cb{i}"
    lines.append(f"  ROOT %out = {rs} copy({rs} {acc})")
    distributed = f"HloModule dist\n\n{comp}ENTRY %main (q: f32[2,4], k: f32[2,4]) -> {rs.split('{')[0]} {{\n" + "\n".join(lines) + "\n}\n"
    brs = "f32[8,1]" if keepdim else "f32[8]"
    blines = ["  %qb0 = f32[8,4]{1,0} parameter(0)", "  %kb0 = f32[8,4]{1,0} parameter(1)", f"  %init = f32[] constant({init})", *step(0, "%qb0", "%kb0", 8, 0)]
    blines.append(f"  ROOT %out = {brs} copy({brs} {name}0)")
    baseline = f"HloModule base\n\n{comp}ENTRY %main (q: f32[8,4], k: f32[8,4]) -> {brs} {{\n" + "\n".join(blines) + "\n}\n"
    rel = {"groups": [list(range(N))],
           "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}, {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    return baseline, distributed, rel


RING_ROWREDUCES = [
    ({}, True),  # the running max of ring attention's scores
    ({"pointwise": "exponential", "keepdim": True}, True),  # through a pointwise map and a keepdim reshape
    ({"op": "min"}, True),
    ({"op": "add"}, True),  # a ring sum of score rows
    ({"steps": N + 1}, True),  # max is idempotent: a key block seen twice changes nothing
    ({"steps": N - 1}, False),  # off by one: one key block never arrives
    ({"op": "add", "steps": N + 1}, False),  # a sum counts the repeated block twice
    ({"combine": "add"}, False),  # block maxima summed instead of maxed
    ({"combine": "minimum"}, False),  # wrong combine
    ({"red_dim": 0}, False),  # reduced over the query blocks instead of the key blocks
    ({"qshift": True}, False),  # queries travel too: the rank reduces another query block
    ({"pointwise": "negate"}, True),
]


@pytest.mark.parametrize(("kw", "equal"), RING_ROWREDUCES)
def test_ring_loop_reduce_of_two_dimensional_blocks(kw: dict, equal: bool) -> None:
    baseline, distributed, rel = _ring_rowreduce(**kw)
    oracle = pytest.importorskip("oracle")
    assert oracle.run_pair(baseline, distributed, rel, seed=0).equal == equal
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    assert (result.verdict == "verified") == equal, result.reason
    if equal:
        rules = {s["rule"] for t in result.trace for s in t["steps"]}
        assert "ring/loop-reduce-covers-all-blocks" in rules, rules


if __name__ == "__main__":
    _produce(Path(sys.argv[1]))
