"""The adversarial suite (tests/adversarial/): correct programs written the way other codebases
write them and subtly wrong ones, each labelled by the numeric oracle.

- every pair is complete, names no machine path, and its kind agrees with its label;
- the oracle, re-run on a fixed sample, still gives each sampled pair its label;
- the verifier verifies no bug (a soundness hole) and calls no correct pair ``diverged``
  (a false alarm): ``python tests/adversarial/score.py`` prints the same table.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent / "adversarial"
PAIRS = HERE / "pairs"
sys.path.insert(0, str(HERE))

import generate  # noqa: E402  (tests/adversarial/generate.py, a script)
import score  # noqa: E402

NAMES = score.pair_names()
# Every fourth pair in name order, plus every pair whose text elides literals: the oracle runs
# take ~1 s each, the whole suite's labels are checked by generate.py.
SAMPLE = sorted({n for i, n in enumerate(NAMES) if i % 4 == 0} | {n for n in NAMES if (PAIRS / n / "baseline.full.hlo").exists()})
_MACHINE_PATH = re.compile(r"(/tmp/|/home/|/root/|/work/|/Users/)")


def test_the_suite_has_enough_pairs_of_each_kind_and_producer() -> None:
    labels = [score.label(n) for n in NAMES]
    assert sum(lab["kind"] == "correct" for lab in labels) >= 30
    assert sum(lab["kind"] == "bug" for lab in labels) >= 30
    assert {lab["producer"] for lab in labels} == {"torch-xla", "jax", "jax-compiled", "hlo"}


@pytest.mark.parametrize("name", NAMES)
def test_pair_files_and_label(name: str) -> None:
    folder = PAIRS / name
    for file in ("baseline.hlo", "distributed.hlo", "relations.yaml", "label.yaml"):
        text = (folder / file).read_text()
        assert not _MACHINE_PATH.search(text), f"{name}/{file} names a path of this machine"
    lab = score.label(name)
    assert lab["kind"] == ("bug" if name.startswith("b_") else "correct")
    assert lab["oracle"] == ("different" if lab["kind"] == "bug" else "equal"), "the oracle label contradicts the pair's kind"
    assert lab["seeds"] and isinstance(lab["description"], str) and lab["description"]


@pytest.mark.parametrize("name", SAMPLE)
def test_the_oracle_still_gives_the_label(name: str) -> None:
    pytest.importorskip("jax")
    lab = score.label(name)
    runs = [generate.run_oracle(PAIRS / name, seed) for seed in lab["seeds"]]
    got = "equal" if all(r.equal for r in runs) else "different"
    assert got == lab["oracle"], "\n".join(r.summary() for r in runs)


def test_elided_literals_are_really_elided_and_the_oracle_runs_the_full_programs() -> None:
    elided = [n for n in NAMES if (PAIRS / n / "baseline.full.hlo").exists()]
    assert elided
    for name in elided:
        assert "{...}" in (PAIRS / name / "distributed.hlo").read_text()
        assert "{...}" not in (PAIRS / name / "distributed.full.hlo").read_text()
        assert yaml.safe_load((PAIRS / name / "label.yaml").read_text())["oracle_files"] == ["baseline.full.hlo", "distributed.full.hlo"]


def test_split_large_literals_keeps_the_values() -> None:
    text = "ENTRY %m () -> s32[12,1] {\n  ROOT %c = s32[12,1] constant({ {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11} })\n}\n"
    out = generate.split_large_literals(text)
    assert "%c.part0 = s32[10,1] constant({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}})" in out
    assert "%c.part1 = s32[2,1] constant({{10}, {11}})" in out
    assert "ROOT %c = s32[12,1] concatenate(%c.part0, %c.part1), dimensions={0}" in out


def test_compiled_jax_pairs_are_compiled_and_their_oracle_runs_the_lowered_twin() -> None:
    compiled = [n for n in NAMES if score.label(n)["producer"] == "jax-compiled"]
    assert compiled
    for name in compiled:
        assert "fusion" in (PAIRS / name / "distributed.hlo").read_text() or "is_scheduled=true" in (PAIRS / name / "distributed.hlo").read_text()
        twin = PAIRS / name.replace("_jaxc_", "_jax_", 1)
        assert (PAIRS / name / "distributed.oracle.hlo").read_text() == (twin / "distributed.hlo").read_text()
        assert score.label(name)["oracle_files"] == ["baseline.oracle.hlo", "distributed.oracle.hlo"]


@pytest.fixture(scope="module")
def rows() -> list[score.Row]:
    return list(score.run_all(NAMES))


def test_no_bug_is_verified(rows: list[score.Row]) -> None:
    holes = [f"{r.name}: {r.reason}" for r in rows if r.kind == "bug" and r.verdict == "verified"]
    assert not holes, "soundness holes (see /tests/adversarial/README.md):\n" + "\n".join(holes)


def test_no_correct_pair_is_diverged(rows: list[score.Row]) -> None:
    alarms = [f"{r.name}: {r.reason}" for r in rows if r.kind == "correct" and r.verdict == "diverged"]
    assert not alarms, "false alarms:\n" + "\n".join(alarms)


def test_the_checker_never_crashes(rows: list[score.Row]) -> None:
    crashed = [f"{r.name}: {r.verdict}: {r.reason}" for r in rows if r.verdict in ("error", "crash")]
    assert not crashed, "\n".join(crashed)
