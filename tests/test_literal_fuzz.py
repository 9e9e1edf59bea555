"""The literal fuzzer (bench/literal_fuzz.py) on a seeded sample: extreme values put into the
scalar constants of the test suites' HLO pairs give a verdict or a located bad-input error, never
an internal error. The full run is ``python bench/literal_fuzz.py``; the regressions at the end
pin the crashes it found."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import literal_fuzz  # a script of bench/, not a package

SAMPLE = 60


def test_the_fuzzer_sees_every_suite() -> None:
    names = {p.name.split("/")[0] for p in literal_fuzz.pairs()}
    assert {"pairs", "gaps", "soundness_regressions", "hlo_handwritten"} <= names, names
    kinds = {c.dtype for c in literal_fuzz.cases(literal_fuzz.pairs()[:40])}
    assert {"f32", "s32", "s64", "pred"} <= kinds


def test_seeded_sample_has_no_internal_error(tmp_path: Path) -> None:
    todo = literal_fuzz.select(list(literal_fuzz.cases(literal_fuzz.pairs())), SAMPLE, seed=2026)
    assert len(todo) == SAMPLE
    errors = [(c.label(), err) for c in todo if (err := literal_fuzz.run_case(c, tmp_path, seconds=20)) is not None]
    assert not errors, errors[:3]


def _case(pair: str, side: str, old: str, new: str, dtype: str) -> literal_fuzz.Case:
    (p,) = [x for x in literal_fuzz.pairs() if x.name == pair]
    text = p.text(side)
    offsets = tuple(m.start(2) for m in literal_fuzz._SCALAR.finditer(text) if m.group(1) == dtype and m.group(2) == old)
    assert offsets, (pair, old)
    return literal_fuzz.Case(p, side, offsets, old, new, dtype)


@pytest.mark.parametrize(
    ("pair", "side", "old", "new", "dtype"),
    [
        # int64 max read through a double became 2^63: the fact load died on litint.N.tsv
        ("pairs/greedy_argmax_gather_tp4", "distributed", "9223372036854775807", "9223372036854775807", "s64"),
        # int64 max: inrange-lit computed v + 1 in a rule head, which aborts the run
        ("pairs/vocab_embedding_tp4", "distributed", "32", "9223372036854775807", "s64"),
        ("pairs/greedy_argmax_tp4", "distributed", "9223372036854775807", "-9223372036854775808", "s64"),
        # beyond s64: a located bad-input error, not a crash
        ("pairs/greedy_argmax_tp4", "distributed", "9223372036854775807", "18446744073709551615", "s64"),
        ("pairs/softmax_sharded_tp4", "distributed", "-3.40282347e+38", "nan(0x7fc00001)", "f32"),
        ("pairs/t5_relative_bias_tp4", "baseline", "8", "1e-45", "f32"),
    ],
)
def test_found_crashes_stay_fixed(tmp_path: Path, pair: str, side: str, old: str, new: str, dtype: str) -> None:
    assert literal_fuzz.run_case(_case(pair, side, old, new, dtype), tmp_path) is None
