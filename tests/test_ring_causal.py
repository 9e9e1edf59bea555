"""Causal ring attention (issue 25): the mask each rank builds per ring step from its positions
is the baseline mask's 2-D block (query block r, key block (r - k) mod c), evaluated exactly on
every rank (rules/rankint.egg: rkrot2); the masked scores' -inf meets the online softmax only
with a running max that is finite in every row (rules/ringmask.egg guarding rules/ring.egg's
pexp): the diagonal block, seen at step 0, keeps a key in every query row.

Real JAX (shard_map, ppermute, lax.axis_index on 4 virtual CPU devices) through `shardproof run`,
and generated HLO pairs (tests/laws/families.py: ringmask) judged by XLA's CPU runtime."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from laws.families import Program, ringmask
from laws.run import judge

ROOT = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "shardproof"


def _site(variant: str) -> int:
    return next(n for n, text in enumerate((ROOT / "examples/jax/spellings.py").read_text().splitlines(), 1)
                if text.rstrip().endswith(f"# BUG-SITE: {variant}"))


def test_jax_causal_ring_attention_verified_and_its_bugs_at_their_lines(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    out = tmp_path / "report"
    models = ("jax_ring_attention_causal,jax_ring_attention_causal_finfo,jax_ring_attention_causal_bias,"
              "jax_ring_attention_causal_gt,jax_ring_attention_causal_offset")
    p = subprocess.run([str(CLI), "run", "--config", str(ROOT / "examples/jax/.shardproof.yml"), "--models", models, "--out", str(out)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads((out / "result.json").read_text())["models"]}
    for name in ("jax_ring_attention_causal", "jax_ring_attention_causal_finfo", "jax_ring_attention_causal_bias"):
        assert rows[name]["status"] == "verified", rows[name]
        trace = json.dumps(rows[name]["result"].get("trace"))
        assert "rankint/per-rank-2d-block" in trace  # each step's mask: a 2-D block of the baseline's
        assert "ring/online-softmax-covers-all-blocks" in trace
    for name, variant in (("jax_ring_attention_causal_gt", "ring_causal_gt"), ("jax_ring_attention_causal_offset", "ring_causal_offset")):
        bug = rows[name]
        assert bug["status"] == "diverged", bug
        assert bug["result"]["witness"]["status"] == "confirmed", bug["result"]["witness"]
        assert bug["result"]["divergences"][0]["source"] == {"file": "examples/jax/spellings.py", "line": _site(variant),
                                                              "function": "_ring_attention_causal.<locals>.per_device"}, bug["result"]["divergences"][0]


def _draw(*want: str) -> Program:
    """The first generated causal ring (tests/laws/families.py: ringmask) whose description
    holds every string in ``want`` (seeds in order: the same program on every run)."""
    for seed in range(2000):
        p = ringmask(random.Random(seed))
        if all(w in p.form for w in want):
            return p
    raise AssertionError(f"no draw with {want}")


def test_ring_started_off_the_diagonal_is_never_verified() -> None:
    # The keys sent on before the first step: rank 0 first meets key block c - 1, which its
    # queries all precede, so its running max starts at -inf and exp(-inf - (-inf)) is NaN. Every
    # block and mask still matches the baseline's; only the liveness guard stops the proof
    # (without rules/ring.egg's rlive premise this pair was verified).
    pytest.importorskip("jax")

    p = _draw("fill -inf", "4 steps", "defect sendfirst", "[[0, 1, 2, 3]]")
    j = judge(p)
    assert j.equal is False and j.verdict != "verified", (j.verdict, j.detail)
    # With a finite fill the same ring is correct (exp(fill - fill) = 1 terms are rescaled by
    # exp(fill - m) = 0 once the diagonal block arrives): verified and equal.
    q = _draw("fill -1e+09", "4 steps", "defect sendfirst", "[[0, 1, 2, 3]]")
    jq = judge(q)
    assert jq.equal is True and jq.verdict == "verified", (jq.verdict, jq.detail)


@pytest.mark.parametrize("fill", ["bf16(lowest)", "2*lowest"])
def test_a_fill_computed_to_minus_inf_is_no_finite_fill(fill: str) -> None:
    # f32's lowest rounded to bf16 and back, or doubled, is -inf on every input: the scores are
    # not finite (ringmask.py bounds literal-only arithmetic exactly), so a ring starting off the
    # diagonal (NaN on rank 0) is not verified. The correct ring is not proven either: a masking
    # fill must be a literal (finite or -inf, rlow), and a computed one is not followed (a gap,
    # never a wrong proof): equal in XLA, unproven.
    pytest.importorskip("jax")
    bad = judge(_draw(f"fill {fill}", "defect sendfirst"))
    assert bad.equal is False and bad.verdict != "verified", (bad.verdict, bad.detail)
    ok = judge(_draw(f"fill {fill}", "defect none", "keep", "4 steps"))
    assert ok.equal is True and ok.verdict != "verified", (ok.verdict, ok.detail)


def test_a_plus_inf_fill_is_not_a_masking_fill() -> None:
    # select(m, s, +inf): a row's max over a masked block is +inf, not the max of its kept
    # scores, so the liveness law does not apply (rlow: the fill is never +inf or NaN).
    pytest.importorskip("jax")
    p = _draw("fill -inf", "keep", "defect none", "4 steps", "[[0, 1, 2, 3]]")
    ok = judge(p)
    assert ok.verdict == "verified", (ok.verdict, ok.detail)
    fill = re.compile(r"(%s?\d*f = f32\[\] constant\()-inf\)")
    assert len(fill.findall(p.distributed)) == 4 and len(fill.findall(p.baseline)) == 1
    plus = Program(p.family, p.form + ", fill +inf", fill.sub(r"\1inf)", p.baseline), fill.sub(r"\1inf)", p.distributed), p.relations)
    assert judge(plus).verdict != "verified"


def _log_mask(text: str) -> str:
    """The bias form's mask * fill replaced by log((1 - mask) + 0 * scores): 0 where a key is
    kept, -inf where masked, on every input - though it reads the scores."""
    def rep(m: re.Match[str]) -> str:
        pre, t = m.group(1), f"f32[{m.group(2)}]"
        return (f"  %{pre}one = {t} broadcast(f32[] %{pre}f1c), dimensions={{}}\n  %{pre}kq = {t} subtract({t} %{pre}one, {t} %{pre}cv)\n"
                f"  %{pre}zb = {t} broadcast(f32[] %{pre}f0c), dimensions={{}}\n  %{pre}zs = {t} multiply({t} %{pre}sc, {t} %{pre}zb)\n"
                f"  %{pre}ar = {t} add({t} %{pre}kq, {t} %{pre}zs)\n  %{pre}bi = {t} log({t} %{pre}ar)")
    text = re.sub(r"  %(\w*)bi = f32\[([\d,]+)\] multiply\(f32\[[\d,]+\] %\1cv, f32\[[\d,]+\] %\1fb\)", rep, text)
    return re.sub(r"(  %(\w*)f = f32\[\] constant\([^)]*\)\n)", lambda m: m.group(1) + f"  %{m.group(2)}f1c = f32[] constant(1)\n  %{m.group(2)}f0c = f32[] constant(0)\n", text)


def test_an_input_dependent_value_that_is_minus_inf_on_every_input_is_not_finite() -> None:
    # log((1 - mask) + 0 * s) reads the scores yet is -inf wherever the mask drops a key, on every
    # input: with it as the bias, a ring started off the diagonal is NaN on rank 0. Its blocks
    # all relate; only the finiteness of the scores was wrong (it was verified before log, sqrt,
    # exp, division by a non-literal ... were taken as possibly non-finite).
    pytest.importorskip("jax")
    p = _draw("bias", "fill -1e+09", "defect sendfirst", "4 steps")
    q = Program(p.family, p.form + ", log mask", _log_mask(p.baseline), _log_mask(p.distributed), p.relations)
    assert q.distributed.count(" log(") == 4 and q.baseline.count(" log(") == 1
    j = judge(q)
    assert j.equal is False and j.verdict != "verified", (j.verdict, j.detail)


def test_mask_added_as_a_bias_verifies() -> None:
    # scores + f32(keys after the query) * finfo.min (the ringattention package's form): the
    # bias's blocks meet the scores' blocks pointwise; finite, so no liveness is needed.
    pytest.importorskip("jax")
    j = judge(_draw("bias", "fill -3.40282347e+38", "defect none", "4 steps"))
    assert j.equal is True and j.verdict == "verified", (j.verdict, j.detail)
    g = judge(_draw("bias", "fill -3.40282347e+38", "defect gt"))
    assert g.equal is False and g.verdict != "verified", (g.verdict, g.detail)


@pytest.mark.parametrize("defect", ["gt", "offset", "axis", "ahead"])
def test_mask_defects_never_verify(defect: str) -> None:
    # `>` for `>=`, key positions one block off, the mask on the wrong axis (k >= q), the mask of
    # step j + 1 at step j (keys and mask out of step): each differs in XLA, none is verified.
    pytest.importorskip("jax")
    j = judge(_draw("fill -inf", f"defect {defect}", "[[0, 1, 2, 3]]"))
    assert j.equal is False and j.verdict != "verified", (j.verdict, j.detail)


@pytest.mark.parametrize("want", [("s64", "pymod"), ("s8", "rem"), ("u32",)])
def test_correct_masks_in_every_position_type_verify(want: tuple[str, ...]) -> None:
    # torch's positions are s64 (remainder evaluated exactly in 64 bits), narrow s8 and u32 too.
    pytest.importorskip("jax")
    j = judge(_draw(*want, "defect none", "4 steps", "fill -inf"))
    assert j.equal is True and j.verdict == "verified", (j.verdict, j.detail, j.program.form)
