"""The numeric witness (engine/witness) and what it does to a verdict (analysis/witnessing):
XLA's CPU runtime executes real pairs; a bug is confirmed with an element, a seed and a command,
a correct pair the rules do not prove is `unproven`, rounding noise is no witness, a pair above
the memory budget is not executed and is confirmed on its diverging instruction instead, and a
verified pair the witness finds different is a soundness error of the tool (exit 4)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from shardproof.engine import cli
from shardproof.engine.analysis import check as check_module
from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import VERIFIED, Result
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap
from shardproof.engine.witness import runtime
from shardproof.engine.witness.inputs import groups_of, make_inputs
from shardproof.engine.witness.pair import DEFAULT_SEEDS, WitnessOptions, estimate_bytes, witness

TESTS = Path(__file__).parent
PAIRS = TESTS / "pairs"
BUGS = sorted(p.name for p in PAIRS.iterdir() if p.is_dir() and p.name.startswith("bug_"))
CORRECT = sorted(p.name for p in PAIRS.iterdir() if (p / "expect.yaml").is_file() and yaml.safe_load((p / "expect.yaml").read_text())["verdict"] == "verified")


def _check(d: Path, mode: str = "auto", **options: Any) -> Result:
    sm = SourceMap.load(d / "sourcemap.json") if (d / "sourcemap.json").is_file() else None
    return check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", sm, witness=mode, witness_options=WitnessOptions(**options) if options else None)


def _texts(d: Path) -> tuple[str, str, dict[str, Any]]:
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


@pytest.mark.parametrize("name", BUGS)
def test_the_witness_confirms_every_bug_pair(name: str) -> None:
    r = _check(PAIRS / name)
    assert r.verdict == "diverged", r.reason
    w = r.witness
    assert w is not None and w["status"] == "confirmed", w
    bad = [o for o in w["outputs"] if not o["equal"]]
    assert bad, w
    o = bad[0]
    assert o["max_abs_err"] > 0 and o["index"] is not None and o["baseline_value"] != o["distributed_value"]
    assert w["seeds"] and w["command"].startswith("shardproof witness ")
    assert "confirmed numerically" in r.reason
    assert r.to_json()["witness"] == w
    # The reproducing command prints the same difference (exit 1).
    argv = shlex.split(w["command"])[1:]
    assert cli.main(argv) == 1


@pytest.mark.parametrize("name", CORRECT)
def test_correct_pairs_are_numerically_equal(name: str) -> None:
    report = witness(*_texts(PAIRS / name))
    assert report.equal, report.summary()
    assert report.trials == 3


# A correct pair no rule proves: sin(x)^2 + cos(x)^2 = 1 is a law of real numbers the rules do not
# encode (and need not), so the rules stop at the sine; the programs are equal.
GAP_BASE = """HloModule b
ENTRY e {
  x = f32[8,4]{1,0} parameter(0)
  ROOT y = f32[8,4]{1,0} exponential(x)
}
"""
GAP_DIST = """HloModule d
ENTRY e {
  x = f32[8,4]{1,0} parameter(0)
  s = f32[8,4]{1,0} sine(x)
  c = f32[8,4]{1,0} cosine(x)
  ss = f32[8,4]{1,0} multiply(s, s)
  cc = f32[8,4]{1,0} multiply(c, c)
  one = f32[8,4]{1,0} add(ss, cc)
  e = f32[8,4]{1,0} exponential(x)
  ROOT y = f32[8,4]{1,0} multiply(e, one)
}
"""
GAP_RELATIONS = "groups: [[0, 1]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"


def test_a_rule_gap_pair_is_unproven_and_names_where_the_rules_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, text in (("baseline.hlo", GAP_BASE), ("distributed.hlo", GAP_DIST), ("relations.yaml", GAP_RELATIONS)):
        (tmp_path / name).write_text(text)
    r = _check(tmp_path)
    assert r.verdict == "unproven", r.reason
    assert r.witness is not None and r.witness["status"] == "equal"
    assert "numerically equal on 3 random inputs at these shapes" in r.reason
    first = r.divergences[0]
    assert first["instruction"] == "%s" and "the rules stopped at %s (sine, HLO line 4)" in r.reason
    assert "output 0 lacks duplicate of %y" in r.reason  # the relation that was missing
    assert {d["kind"] for d in r.divergences} == {"rule-gap"}
    code = cli.main(["check", str(tmp_path / "baseline.hlo"), str(tmp_path / "distributed.hlo"), "--relations", str(tmp_path / "relations.yaml")])
    out = capsys.readouterr().out
    assert code == 2 and out.startswith("unproven: ") and "witness: equal" in out
    assert _check(tmp_path, "never").verdict == "diverged"  # the rules' answer alone


GAPS_EXPECT = {m["name"]: m.get("expect", "verified") for m in yaml.safe_load((TESTS / "gaps" / ".shardproof.yml").read_text())["models"]}


@pytest.mark.parametrize("name", sorted(n for n, e in GAPS_EXPECT.items() if e == "verified"))
def test_a_correct_gap_pair_is_never_diverged(name: str) -> None:
    """The correct pairs of tests/gaps: proven, or unproven with the witness finding them equal."""
    r = _check(TESTS / "gaps" / name)
    assert r.verdict in ("verified", "unproven"), r.reason


def test_numeric_localization_reports_the_instruction_that_really_differs_first() -> None:
    r = _check(PAIRS / "bug_missing_allreduce")
    first = r.divergences[0]
    assert first["kind"] == "divergence"
    assert first["numeric"] is not None and first["numeric"]["holds"] is False
    assert (first["source"]["file"], first["source"]["line"]) == ("tests/pairs/models.py", yaml.safe_load((PAIRS / "bug_missing_allreduce" / "expect.yaml").read_text())["bug_site"]["line"])
    for d in r.divergences:
        assert d["kind"] in ("divergence", "rule-gap")
        if d["numeric"] and d["numeric"]["holds"]:
            assert d["kind"] == "rule-gap"


def test_always_executes_a_verified_pair() -> None:
    r = _check(PAIRS / "mlp_tp4", "always")
    assert r.verdict == VERIFIED
    assert r.witness is not None and r.witness["status"] == "equal" and r.witness["trials"] == 3
    assert _check(PAIRS / "mlp_tp4").witness is None  # auto: a verified pair is not executed


def test_a_verified_pair_the_witness_finds_different_is_a_soundness_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Rules that wrongly prove a bug pair (stood in for by a verifier that always says
    verified): with --witness always the answer is an internal error, loud, never a pass."""
    monkeypatch.setattr(check_module, "_check_files", lambda *a, **k: Result(VERIFIED, reason="all 1 output(s) have their expected relation"))
    d = PAIRS / "bug_redundant_allreduce"
    args = ["check", str(d / "baseline.hlo"), str(d / "distributed.hlo"), "--relations", str(d / "relations.yaml")]
    assert cli.main(args) == 0  # auto: nothing executed, the (wrong) proof stands
    capsys.readouterr()
    assert cli.main([*args, "--witness", "always"]) == 4
    captured = capsys.readouterr()
    assert captured.out.startswith("error: SOUNDNESS ERROR") and "SOUNDNESS ERROR" in captured.err


def test_rounding_noise_is_no_witness() -> None:
    """(x + k y) - k y is x in real arithmetic for every k; in f32 it rounds x to the ulp of
    k y, so k = 1e7 and k = 3e6 differ far beyond the tolerance, and agree again in f64."""
    text = """HloModule m
ENTRY e {
  x = f32[8]{0} parameter(0)
  y = f32[8]{0} parameter(1)
  c = f32[] constant(K)
  cb = f32[8]{0} broadcast(c), dimensions={}
  big = f32[8]{0} multiply(y, cb)
  a = f32[8]{0} add(x, big)
  ROOT s = f32[8]{0} subtract(a, big)
}
"""
    base, dist = text.replace("K", "1e+07"), text.replace("K", "3e+06")
    rel = {"groups": [[0, 1]], "inputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in (0, 1)], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    assert not witness(base, dist, rel, WitnessOptions(recheck_f64=False)).equal
    report = witness(base, dist, rel)
    assert report.equal and report.rounding == list(DEFAULT_SEEDS), report.summary()


def test_inputs_satisfy_the_relations() -> None:
    base = "HloModule b\nENTRY e {\n  a = f32[8,6]{1,0} parameter(0)\n  b = f32[4]{0} parameter(1)\n  c = s32[5]{0} parameter(2)\n  d = f32[3]{0} parameter(3)\n  ROOT t = (f32[8,6]{1,0}, f32[4]{0}, s32[5]{0}, f32[3]{0}) tuple(a, b, c, d)\n}\n"
    dist = "HloModule d\nENTRY e {\n  a = f32[8,3]{1,0} parameter(0)\n  b = f32[4]{0} parameter(1)\n  c = s32[5]{0} parameter(2)\n  r = s32[] parameter(3)\n  d = f32[3]{0} parameter(4)\n  ROOT t = (f32[8,3]{1,0}, f32[4]{0}, s32[5]{0}, f32[3]{0}) tuple(a, b, c, d)\n}\n"
    rel = {"groups": [[0, 1]], "inputs": [
        {"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1, "blocks": [2, 4]},
        {"baseline": 1, "distributed": 1, "relation": "partial", "op": "min"},
        {"baseline": 2, "distributed": 2, "relation": "duplicate", "int_range": [100, 103]},
        {"distributed": 3, "relation": "rank"},
        {"baseline": 3, "distributed": 4, "relation": "partial"},
    ]}
    b, d = runtime.read(base), runtime.read(dist)
    bargs, dargs = make_inputs(b, d, rel, groups_of(rel), seed=5)
    a = bargs[0]
    np.testing.assert_array_equal(dargs[0][0], np.concatenate([a[:, 0:1], a[:, 2:4]], axis=1))
    np.testing.assert_array_equal(dargs[1][0], np.concatenate([a[:, 1:2], a[:, 4:6]], axis=1))
    np.testing.assert_array_equal(np.minimum(dargs[0][1], dargs[1][1]), bargs[1])
    assert bargs[2].min() >= 100 and bargs[2].max() < 103
    assert [int(x[3]) for x in dargs] == [0, 1]
    np.testing.assert_array_equal(dargs[0][4].astype(np.float64) + dargs[1][4], bargs[3])


def test_above_the_memory_budget_nothing_runs_and_the_diverging_instruction_confirms() -> None:
    d = PAIRS / "bug_missing_allreduce"
    b, di, _ = _texts(d)
    need = estimate_bytes(b, di, 4)
    # Nothing fits, not even the diverging instruction alone: no evidence, so not `diverged`.
    tiny = _check(d, memory_mb=1e-4)
    assert tiny.verdict == "unproven", tiny.reason
    assert tiny.witness is not None and tiny.witness["status"] == "skipped"
    assert "memory budget" in tiny.witness["reason"] and "not executed" in tiny.reason
    # A budget the pair exceeds but its diverging instruction fits: it differs there, at the
    # line: `diverged`, but unconfirmed (no output was compared).
    r = _check(d, memory_mb=need / 2**20 / 4)
    w = r.witness
    assert r.verdict == "diverged" and w is not None and w["status"] == "unconfirmed", w
    assert "not executed" in w["reason"] and "memory budget" in w["reason"] and "run alone differs" in w["reason"]
    seg = w["segment"]
    assert seg["instruction"] == r.divergences[0]["instruction"] and seg["source"] == "tests/pairs/models.py:135"
    assert {e["relation"] for e in seg["inputs"]} == {"duplicate", "partial"}
    assert r.divergences[0]["numeric"]["holds"] is False and r.divergences[0]["kind"] == "divergence"
    # Too many instructions to compile in time: the same path.
    r = _check(d, max_instructions=10)
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "unconfirmed" and "compile budget" in r.witness["reason"]


# A correct pair the rules do not prove: a slice of length 1 taken with stride 2 instead of 1
# (the same element either way).
_UNIT_SLICE = """HloModule m
ENTRY e {
  a = f32[6,4]{1,0} parameter(0)
  s = f32[6,1]{1,0} slice(a), slice={[0:6:1], [3:4:STRIDE]}
  ROOT y = f32[6,1]{1,0} exponential(s)
}
"""


def test_a_pair_not_executed_is_diverged_only_when_its_diverging_instruction_differs(tmp_path: Path) -> None:
    """The rules stop at a rule gap of a correct pair too big to execute: the diverging
    instruction run alone holds (or cannot be run), so there is no evidence of a bug: the
    verdict is `unproven` (exit 2), naming where the rules stopped, never a `diverged` without a
    witness (the 405B train step at one token per rank said `diverged` this way)."""
    (tmp_path / "baseline.hlo").write_text(_UNIT_SLICE.replace("STRIDE", "1"))
    (tmp_path / "distributed.hlo").write_text(_UNIT_SLICE.replace("STRIDE", "2"))
    (tmp_path / "relations.yaml").write_text(yaml.safe_dump({"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
                                                           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}))
    assert _check(tmp_path).verdict == "unproven"  # executed: every output equal
    # Too many instructions to compile; the slice alone runs and holds.
    r = _check(tmp_path, max_instructions=2)
    assert r.verdict == "unproven", r.reason
    assert "the rules stopped at %s (slice" in r.reason and "not executed" in r.reason and "compile budget" in r.reason
    assert "%s hold numerically when run alone" in r.reason
    assert r.witness is not None and r.witness["status"] == "skipped"
    assert r.divergences[0]["numeric"]["holds"] is True and {d["kind"] for d in r.divergences} == {"rule-gap"}
    # Above the memory budget, the slice alone too: nothing ran, no evidence.
    r = _check(tmp_path, memory_mb=1e-4)
    assert r.verdict == "unproven" and "could be run alone" in r.reason, r.reason
    assert {d["kind"] for d in r.divergences} == {"rule-gap"}
    argv = ["check", str(tmp_path / "baseline.hlo"), str(tmp_path / "distributed.hlo"), "--relations", str(tmp_path / "relations.yaml"), "--witness-max-instructions", "2"]
    assert cli.main(argv) == 2


def test_a_round_trip_through_f32_is_not_rounding_noise() -> None:
    """An f64 program whose ranks round through f32: the recheck keeps that written rounding
    (engine.witness.model), so the difference stands."""
    base = "HloModule b\nENTRY e {\n  x = f64[4,8]{1,0} parameter(0)\n  ROOT y = f64[4,8]{1,0} tanh(x)\n}\n"
    dist = "HloModule d\nENTRY e {\n  x = f64[4,8]{1,0} parameter(0)\n  v0 = f32[4,8]{1,0} convert(x)\n  v1 = f64[4,8]{1,0} convert(v0)\n  ROOT y = f64[4,8]{1,0} tanh(v1)\n}\n"
    rel = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    report = witness(base, dist, rel)
    assert not report.equal and report.rounding == [], report.summary()



def test_rounding_amplified_past_an_f64_to_f32_convert_is_no_witness() -> None:
    """The pair of test_rounding_noise_is_no_witness with an f64 constant converted to f32, as
    torch's masked_fill writes for its -FLT_MAX (every f32 training step has one): the recheck
    used to be skipped for any f64 -> f32 convert, so the f32 training steps verified by the
    rules were reported as SOUNDNESS ERRORs under --witness always (train_sp_tp4_separate: 0.9 %
    on one element, equal to 4e-14 in f64). The convert's rounding is kept, the rest widens."""
    text = """HloModule m
ENTRY e {
  x = f32[8]{0} parameter(0)
  y = f32[8]{0} parameter(1)
  cw = f64[] constant(K)
  c = f32[] convert(cw)
  cb = f32[8]{0} broadcast(c), dimensions={}
  big = f32[8]{0} multiply(y, cb)
  a = f32[8]{0} add(x, big)
  ROOT s = f32[8]{0} subtract(a, big)
}
"""
    base, dist = text.replace("K", "1e+07"), text.replace("K", "3e+06")
    rel = {"groups": [[0, 1]], "inputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in (0, 1)], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    assert not witness(base, dist, rel, WitnessOptions(recheck_f64=False)).equal
    report = witness(base, dist, rel)
    assert report.equal and report.rounding == list(DEFAULT_SEEDS), report.summary()


_BF16_SUM = """HloModule m

add {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT r = bf16[] add(a, b)
}

ENTRY e {
  x = bf16[ROWS,64]{1,0} parameter(0)
  zero = bf16[] constant(0)
  s = bf16[64]{0} reduce(x, zero), dimensions={0}, to_apply=add
  REDUCEROOT f32[64]{0} convert(s)
}
"""


def test_bf16_summation_noise_is_no_witness_but_a_bf16_sum_for_an_f32_one_is() -> None:
    """A bf16 sum over a sharded dim, as the baseline writes it (one bf16 reduce) and as the
    ranks do (a bf16 reduce of their rows, a bf16 all-reduce), returned in f32: the two orders
    round apart by a few bf16 ulps, far beyond the f32 tolerance, and bf16 ops stay bf16 in the
    f64 model (mixed-precision training steps: train_mixed_tp4 differed by 1.4 as written). The
    difference is within the baseline's own noise under reordered bf16 sums: rounding. A sum the
    ranks compute in bf16 where the baseline computes it in f32 stays a witness."""
    base = _BF16_SUM.replace("ROWS", "64").replace("REDUCEROOT", "ROOT y =")
    dist = _BF16_SUM.replace("ROWS", "16").replace("REDUCEROOT", "ar = bf16[64]{0} all-reduce(s), replica_groups={{0,1,2,3}}, to_apply=add\n  ROOT y =").replace("convert(s)", "convert(ar)")
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    assert not witness(base, dist, rel, WitnessOptions(recheck_f64=False)).equal
    report = witness(base, dist, rel)
    assert report.equal and report.rounding == list(DEFAULT_SEEDS), report.summary()
    d = ADVERSARIAL / "b_hlo_bf16_accumulate"
    report = witness((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text()))
    assert not report.equal and report.rounding == [], report.summary()


ADVERSARIAL = TESTS / "adversarial" / "pairs"


def _adversarial(name: str) -> Result:
    d = ADVERSARIAL / name
    return check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo")


def test_an_overflow_on_one_side_is_never_rounding_noise() -> None:
    """(x·1e30)² / (x·1e30) / 1e30 is x in real arithmetic and in f64, but overflows to inf in
    f32: the recheck would make it vanish. A value non-finite on one side only is never rounding
    (the torch pair: a softmax without the max subtracted, exp overflows, the output is NaN)."""
    base = "HloModule b\nENTRY e {\n  x = f32[8]{0} parameter(0)\n  n = f32[8]{0} negate(x)\n  ROOT y = f32[8]{0} negate(n)\n}\n"
    dist = ("HloModule d\nENTRY e {\n  x = f32[8]{0} parameter(0)\n  c = f32[] constant(1e+30)\n  cb = f32[8]{0} broadcast(c), dimensions={}\n"
            "  big = f32[8]{0} multiply(x, cb)\n  sq = f32[8]{0} multiply(big, big)\n  back = f32[8]{0} divide(sq, big)\n  ROOT z = f32[8]{0} divide(back, cb)\n}\n")
    rel = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    report = witness(base, dist, rel)
    assert not report.equal and report.rounding == [], report.summary()
    r = _adversarial("b_softmax_no_max_subtraction")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason


def test_lossy_converts_one_side_lacks_stay_different() -> None:
    """s32 ids past 2^24 through f32 and back lose their odd values; widened to f64 they would
    not. The recheck keeps the s32 -> f32 rounding as written, so the difference stands, and
    the reason never says "numerically equal"."""
    from shardproof.engine.witness.pair import convert_is_exact, lossy_converts

    assert not convert_is_exact("s32", "f32") and not convert_is_exact("f64", "f32") and not convert_is_exact("f32", "s32")
    assert convert_is_exact("f16", "f32") and convert_is_exact("s16", "f32") and convert_is_exact("u8", "s16") and not convert_is_exact("s8", "u16")
    d = ADVERSARIAL / "b_hlo_s32_ids_through_f32"
    base, dist = (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text()
    assert lossy_converts(runtime.read(dist).text) == {("s32", "f32"), ("f32", "s32")} and not lossy_converts(runtime.read(base).text)
    r = _adversarial("b_hlo_s32_ids_through_f32")
    assert r.witness is not None and r.witness["status"] == "confirmed" and r.witness.get("rounding_seeds") is None
    # The rules have none for the f32 -> s32 convert (unsupported); the witness's difference is
    # evidence, so the verdict is diverged, naming the convert where the rules stopped.
    assert r.verdict == "diverged" and "numerically equal" not in r.reason and "confirmed numerically" in r.reason, r.reason
    assert "the rules stopped at the unsupported distributed instruction" in r.reason and "(convert" in r.reason, r.reason


def test_a_compiled_jax_module_is_executed_flattened() -> None:
    """jax.jit(...).compile().as_text(): fusions, layouts and bitcasts XLA refuses (or aborts on)
    when compiling the text again. The witness executes the flattened re-printing instead."""
    from shardproof.engine.witness.flat import flat_text, looks_compiled

    # The device id stays an instruction (the analysis's flatten makes it a parameter).
    text = (ADVERSARIAL / "c_jaxc_rope_axis_index_positions" / "distributed.hlo").read_text()
    flat = flat_text(text)
    assert looks_compiled(text) and not looks_compiled(flat) and " fusion(" not in flat
    assert "partition-id()" in flat and runtime.read(flat).params == runtime.read(text).params
    runtime.compile(runtime.read(flat).text, 4)
    bug = _adversarial("b_jaxc_layernorm_pmean_of_vars")  # XLA's CPU emitter aborted on it
    assert bug.verdict == "diverged" and bug.witness is not None and bug.witness["status"] == "confirmed", bug.reason
    # A correct compiled pair, executed too when verified (witness always): flattened, equal.
    d = ADVERSARIAL / "c_jaxc_heads_attention"
    ok = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", witness="always")
    assert ok.verdict in ("verified", "unproven") and ok.witness is not None and ok.witness["status"] == "equal", ok.reason


def test_a_frontier_the_witness_cannot_execute_is_unproven_not_diverged(monkeypatch: pytest.MonkeyPatch) -> None:
    """No evidence, no `diverged`: when XLA cannot execute the pair (nor the diverging
    instruction alone), the frontier is reported as unproven with the witness's reason. A worker
    that dies is retried once on the flattened texts."""
    from shardproof.engine.witness import service

    calls: list[tuple[str, Any]] = []

    def refuse(name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((name, args[3] if name == "pair.witness" else None))
        if name == "pair.witness" and args[3].flatten == "auto":
            raise service.WitnessCrashed("XLA's CPU runtime died (exit code -6): Check failed: has_layout()")
        raise RuntimeError("JaxRuntimeError: UNIMPLEMENTED: no CPU kernel for this op")

    monkeypatch.setattr(service, "call", refuse)
    r = _check(PAIRS / "bug_missing_allreduce")
    assert r.verdict == "unproven", r.reason
    assert "the rules stopped at %" in r.reason and "the witness could not execute the pair: RuntimeError" in r.reason
    assert r.witness is not None and r.witness["status"] == "error"
    assert [c[1].flatten for c in calls if c[0] == "pair.witness"] == ["auto", "always"]


def test_the_reproducing_command_names_no_machine_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shardproof.engine.analysis.witnessing import command

    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "pair").mkdir()
    monkeypatch.chdir(tmp_path)
    paths = {"baseline": str(tmp_path / "repo" / "pair" / "b.hlo"), "distributed": "pair/d.hlo"}
    assert command(paths, str(tmp_path / "repo" / "pair" / "r.yaml"), 1) == "shardproof witness repo/pair/b.hlo pair/d.hlo --relations repo/pair/r.yaml --seed 1"
    monkeypatch.chdir(tmp_path / "repo" / "pair")  # outside the cwd: relative to the repository root
    other = str(tmp_path / "repo" / "x y" / "b.hlo")
    assert command({"baseline": other, "distributed": other}, "r.yaml", 0) == "shardproof witness 'x y/b.hlo' 'x y/b.hlo' --relations r.yaml --seed 0"


def test_an_xla_abort_kills_only_the_worker() -> None:
    """Executed as written, a compiled module makes XLA's CPU emitter abort (a fatal CHECK):
    the worker dies, the caller gets WitnessCrashed, and the next call runs in a fresh worker."""
    from shardproof.engine.witness.service import WitnessCrashed, call

    d = ADVERSARIAL / "b_jaxc_layernorm_pmean_of_vars"
    texts, rel = _texts(d)[:2], _texts(d)[2]
    with pytest.raises(WitnessCrashed, match="has_layout"):
        call("pair.witness", *texts, rel, WitnessOptions(flatten="never"))
    report = call("pair.witness", *texts, rel, WitnessOptions())
    assert not report.equal and report.seed is not None


def test_a_confirmed_difference_at_a_partially_ruled_opcode_is_diverged(tmp_path: Path) -> None:
    """The rules stop at a collective-permute (its rules are partial, so alone that is
    `inconclusive`); the pair is a bug (ranks 0/1 and 2/3 swap their blocks, a pattern that is
    no ring step) and the witness shows the
    difference: with that evidence it is `diverged`, the permute named as the divergence."""
    base = "HloModule b\nENTRY e {\n  x = f32[8,4]{1,0} parameter(0)\n  ROOT y = f32[8,4]{1,0} tanh(x)\n}\n"
    dist = ("HloModule d\nENTRY e {\n  x = f32[2,4]{1,0} parameter(0)\n"
            "  p = f32[2,4]{1,0} collective-permute(x), channel_id=1, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}\n"
            "  ROOT y = f32[2,4]{1,0} tanh(p)\n}\n")
    rel = "groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}\noutputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}\n"
    for name, text in (("baseline.hlo", base), ("distributed.hlo", dist), ("relations.yaml", rel)):
        (tmp_path / name).write_text(text)
    assert _check(tmp_path, "never").verdict == "inconclusive"  # the rules' answer alone
    r = _check(tmp_path)
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed"
    assert "confirmed numerically" in r.reason and "%p (collective-permute" in r.reason
    assert r.divergences[0]["instruction"] == "%p" and r.divergences[0]["kind"] == "divergence"
