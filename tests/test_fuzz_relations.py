"""Fuzzing the relations file (as YAML text and as parsed data) and whole pairs through
``verify()``: a RelationSpec / a verdict, or an InputError that names a key or a line:column
inside the text; never another exception, never a hang. Seeded and bounded; the million-input
run is ``python bench/fuzz.py``. Open engine bugs are pinned as strict xfails at the end (see
``tests/mutation/fuzzing.py``, KNOWN)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation import fuzzing
from mutation.campaign import load_corpus

from shardproof.engine.errors import InputError
from shardproof.engine.relations import load_relations, parse_relations

TEXTS = fuzzing.relations_seeds()
DATA = [yaml.safe_load(t) for t in TEXTS]
CORPUS = load_corpus()
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# YAML-like data: what yaml.safe_load can return, plus keys of mixed types.
_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12) | st.sampled_from(["duplicate", "sharded", "partial", "rank", "token", "add", "max", "groups", "inputs", "outputs", "dim", "blocks"])
_data = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=12) | st.sampled_from(["groups", "inputs", "outputs", "baseline", "distributed", "relation", "dim", "blocks", "op", "custom_calls", "target", "keeps"]), kids, max_size=5), max_leaves=30)


def _assert_clean(out: fuzzing.Outcome, again: Any = None) -> None:
    if out.status == "slow" and again is not None:  # only a repeat counts on a loaded machine
        out = again()
    assert out.status in ("ok", "error", "known"), f"{out.status} {out.key}: {out.detail} ({out.seconds:.2f}s)"


@FUZZ
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=2000))
def test_arbitrary_yaml_text(text: str) -> None:
    _assert_clean(fuzzing.relations_text_target(text), lambda: fuzzing.relations_text_target(text))


@FUZZ
@given(st.sampled_from(TEXTS), st.integers(0, 2**32))
def test_mutated_relations_text(text: str, seed: int) -> None:
    mutated = fuzzing.mutate_text(random.Random(seed), text).replace("\ud800", "?")
    _assert_clean(fuzzing.relations_text_target(mutated), lambda: fuzzing.relations_text_target(mutated))


@FUZZ
@given(_data)
def test_arbitrary_data(data: Any) -> None:
    _assert_clean(fuzzing.relations_data_target(data))


@FUZZ
@given(st.sampled_from(DATA), st.integers(0, 2**32))
def test_mutated_relations_data(data: dict[str, Any], seed: int) -> None:
    rng = random.Random(seed)
    _assert_clean(fuzzing.relations_data_target(fuzzing.mutate_relations(rng, data)))
    _assert_clean(fuzzing.relations_data_target(fuzzing.perturb_relations(rng, data)))


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), st.integers(0, 2**32), st.sampled_from(["hlo", "relations", "both"]))
def test_verify_end_to_end(pair: Any, seed: int, what: str) -> None:
    """Mutated but parseable distributed HLO and/or well-typed but wrong relations: a verdict or
    an InputError, never another exception."""
    from shardproof.engine.hlo.parser import parse_hlo

    rng = random.Random(seed)
    dist, rel = pair.distributed, pair.relations
    if what in ("hlo", "both"):
        for _ in range(20):
            cand = fuzzing.mutate_hlo(rng, dist)
            try:
                parse_hlo(cand)
            except InputError:
                continue
            dist = cand
            break
    if what in ("relations", "both"):
        rel = fuzzing.perturb_relations(rng, rel)
    _assert_clean(fuzzing.verify_target(pair.baseline, dist, rel))


def test_errors_name_the_key(tmp_path: Path) -> None:
    bad = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    with pytest.raises(InputError) as e:
        parse_relations(bad, "r.yaml")
    assert e.value.where == "inputs[0].dim"
    p = tmp_path / "r.yaml"
    p.write_text("groups: [[0, 1]\ninputs: []\n")
    with pytest.raises(InputError) as e:
        load_relations(p)
    assert e.value.where.split(":")[0] in ("2", "3")


# -- open engine bugs (reported to the lead) ------------------------------------------------------

OUT = [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]


def test_blocks_not_a_list() -> None:
    with pytest.raises(InputError):
        parse_relations({"groups": [[0, 1]], "inputs": [], "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0, "blocks": 5}]})


def test_custom_calls_not_a_list() -> None:
    with pytest.raises(InputError):
        parse_relations({"groups": [[0, 1]], "inputs": [], "outputs": OUT, "custom_calls": 5})


def test_keys_of_mixed_types() -> None:
    with pytest.raises(InputError):
        parse_relations({1: 2, "x": 3})


def test_invalid_yaml_date(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("groups: [[0, 1]]\ninputs: []\noutputs: [{baseline: 0, distributed: 0, relation: duplicate}]\ndescription: 2001-13-45\n")
    with pytest.raises(InputError):
        load_relations(p)


def test_deeply_nested_yaml_does_not_kill_the_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = tmp_path / "r.yaml"
    p.write_text("groups: " + "[" * 40000 + "]" * 40000 + "\n")
    code = "import sys\nfrom shardproof.engine.errors import InputError\nfrom shardproof.engine.relations import load_relations\ntry:\n    load_relations(sys.argv[1])\nexcept InputError:\n    pass\n"
    run = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, timeout=60)
    assert run.returncode == 0, f"exit code {run.returncode}: {run.stderr[-300:]!r}"


def test_relations_file_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_bytes(b"groups: [[0, 1]]\ndescription: caf\xe9\n")
    with pytest.raises(InputError):
        load_relations(p)


def _load_error(tmp_path: Path, text: str) -> InputError:
    """The InputError that loading ``text`` as a relations file must raise."""
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_relations(p)
    return e.value


def test_an_empty_tagged_int_is_a_located_error(tmp_path: Path) -> None:
    # Found by bench/fuzz.py (atheris): PyYAML's int constructor indexes the empty string.
    e = _load_error(tmp_path, "# a comment\n!!int ")
    assert e.where == "2:1" and "cannot read '' as int" in str(e)


def test_a_broadcast_keeping_the_rank_is_not_read_as_a_repeat() -> None:
    # Found by bench/fuzz.py (mutated pairs through verify): a broadcast that adds no dim (one
    # the normalizer keeps, e.g. for its layout) made the repeat_interleave table index past
    # the result's dims.
    from shardproof.engine.analysis.laws.slicing import _repeat_broadcast
    from shardproof.engine.hlo.parser import parse_hlo

    hlo = """HloModule m, entry_computation_layout={(f32[2,3]{1,0})->f32[2,3]{0,1}}

ENTRY %main (p: f32[2,3]) -> f32[2,3] {
  %p = f32[2,3]{1,0} parameter(0)
  ROOT %b = f32[2,3]{0,1} broadcast(f32[2,3]{1,0} %p), dimensions={0,1}
}
"""
    ins = parse_hlo(hlo, "m.hlo").entry.get("b")
    assert ins is not None
    assert _repeat_broadcast("k", ins, (2, 3)) == []
    # A real repeat_interleave broadcast still gives its row: dim 0 of 2 repeated 4 times.
    rep = parse_hlo(hlo.replace("f32[2,3]{0,1} broadcast(f32[2,3]{1,0} %p), dimensions={0,1}", "f32[2,4,3]{2,1,0} broadcast(f32[2,3]{1,0} %p), dimensions={0,2}").replace("->f32[2,3]{0,1}", "->f32[2,4,3]{2,1,0}").replace(") -> f32[2,3] {", ") -> f32[2,4,3] {"), "m.hlo").entry.get("b")
    assert rep is not None
    assert _repeat_broadcast("k", rep, (2, 3)) == [("k", 0, 4, 8)]


def test_an_unknown_key_that_looks_like_a_place_is_quoted(tmp_path: Path) -> None:
    # Found by bench/fuzz.py: the key "0:0" was reported where a line:column goes.
    e = _load_error(tmp_path, "0:0:")
    assert e.where == "" and "unknown key '0:0'" in str(e)


def test_deep_flow_nesting_in_the_relations_file_is_refused_at_once(tmp_path: Path) -> None:
    e = _load_error(tmp_path, "groups: " + "[" * 5000 + "]" * 5000 + "\n")
    assert e.where == "1:109" and "nested more than 100 levels" in str(e)
