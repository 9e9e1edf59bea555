"""Semantic mutation testing, seeded sample: single-point mutants of every correct pair (test
pairs, examples, hand-written pairs), judged by the numeric oracle and by the verifier. No mutant
the oracle finds numerically different may be verified, and the verifier never crashes. The
10,000-mutant campaign is ``python bench/mutants.py --count 10000 --seed 0``.

Also: every minimal reproduction under ``tests/soundness_regressions/`` (a mutant that once
slipped through) must not be verified."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mutation.campaign import Outcome, Pool, format_report, generate, load_corpus, summarize
from mutation.mutate import KINDS

from shardproof.engine.analysis.verify import verify
from shardproof.engine.errors import InputError
from shardproof.engine.hlo.parser import parse_hlo_file
from shardproof.engine.relations import load_relations

SAMPLE = 150
REGRESSIONS = Path(__file__).parent / "soundness_regressions"


@pytest.fixture(scope="module")
def sample() -> dict:
    pytest.importorskip("jax")
    corpus = load_corpus()
    mutants = generate(corpus, SAMPLE, seed=20261122)
    pool = Pool(corpus, workers=2, timeout=120, verify_seconds=30)
    results = dict(pool.map(mutants))
    outcomes = [Outcome(m, results[i]) for i, m in enumerate(mutants)]
    summary = summarize(outcomes)
    print(format_report(summary))
    return {"mutants": mutants, "outcomes": outcomes, "summary": summary}


def test_no_numerically_different_mutant_is_verified(sample: dict) -> None:
    # Mutants hitting an open, reproduced bug (tests/soundness_regressions) are listed in the
    # report as known; anything else different-but-verified is a new soundness bug.
    bugs = sample["summary"]["new_soundness_bugs"]
    assert not bugs, "\n".join(f"{o.mutant.pair} {o.mutant.kind} %{o.mutant.instruction}: {o.mutant.detail}" for o in bugs)


def test_the_verifier_never_crashes_or_hangs(sample: dict) -> None:
    bad = sample["summary"]["crashes"]
    assert not bad, "\n".join(f"{o.mutant.pair} {o.mutant.kind}: {o.mutant.detail} -> {o.result.get('reason', '')[-400:]}" for o in bad)


def test_the_sample_is_meaningful(sample: dict) -> None:
    t = sample["summary"]["total"]
    assert len(sample["mutants"]) == SAMPLE
    assert len({m.kind for m in sample["mutants"]}) >= len(KINDS) - 3  # most kinds are drawn
    assert t["malformed"] <= SAMPLE * 0.1  # mutants are meant to be well-typed
    assert t["different"] >= SAMPLE * 0.5  # and mostly real changes the oracle sees
    # Numerically different mutants are rejected with a located divergence most of the time.
    assert t["different/diverged"] >= t["different"] * 0.8


def _regressions() -> list[object]:
    """One param per reproduction; a known open bug (``xfail:`` in its expect.yaml) is a strict
    xfail, so the fix shows up as XPASS and the marker gets dropped."""
    out: list[object] = []
    for d in sorted(REGRESSIONS.glob("*")) if REGRESSIONS.is_dir() else []:
        if not (d / "distributed.hlo").is_file():
            continue
        meta = yaml.safe_load((d / "expect.yaml").read_text()) if (d / "expect.yaml").is_file() else {}
        marks = [pytest.mark.xfail(strict=True, reason=meta["xfail"])] if meta.get("xfail") else []
        out.append(pytest.param(d, marks=marks, id=d.name))
    return out


@pytest.mark.parametrize("case", _regressions())
def test_soundness_regression_is_not_verified(case: Path) -> None:
    meta = yaml.safe_load((case / "expect.yaml").read_text()) if (case / "expect.yaml").is_file() else {}
    if (meta or {}).get("verdict") == "bad-input":
        # A hole closed by rejecting contradictory relations: a located error, never a verdict.
        with pytest.raises(InputError, match=r"relations\.yaml:"):
            verify(load_relations(case / "relations.yaml"), parse_hlo_file(case / "baseline.hlo"), parse_hlo_file(case / "distributed.hlo"))
        return
    result = verify(load_relations(case / "relations.yaml"), parse_hlo_file(case / "baseline.hlo"), parse_hlo_file(case / "distributed.hlo"))
    assert result.verdict != "verified", result.reason


@pytest.mark.parametrize("case", [p.values[0] for p in _regressions()], ids=lambda d: d.name)
def test_soundness_regression_differs_numerically(case: Path) -> None:
    # The reproduction stays meaningful only while the programs really differ. A pair whose
    # texts cannot be executed meaningfully (elided constants) says why in ``numeric:``.
    meta = yaml.safe_load((case / "expect.yaml").read_text()) if (case / "expect.yaml").is_file() else {}
    if meta.get("numeric"):
        pytest.skip(str(meta["numeric"]))
    oracle = pytest.importorskip("oracle")
    relations = yaml.safe_load((case / "relations.yaml").read_text())
    base, dist = (case / "baseline.hlo").read_text(), (case / "distributed.hlo").read_text()
    assert not all(oracle.run_pair(base, dist, relations, seed=s).equal for s in range(5))
