"""Collectives over groups of one device are their operand (hlo.normalize), and an
``unsupported`` pair the witness finds different is ``diverged`` (analysis.witnessing).

Megatron calls ``torch.distributed.all_reduce`` unguarded, so a degree-1 baseline holds an
all-reduce over a group of one: exactly the identity, whatever the reducer. A collective whose
reducer has no rules (``subtract``) leaves the pair unsupported; when XLA's CPU runtime executes
the pair and finds the outputs different, that is evidence and the verdict says ``diverged``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import Result
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import load_relations

_REDUCERS = {
    "add": "  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n",
    "subtract": "  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] subtract(a, b)\n",
}


def _module(body: str, reducer: str = "add", params: str = "f32[8,4]") -> str:
    return (f"HloModule m\n\nred {{\n{_REDUCERS[reducer]}}}\n\n"
            f"ENTRY e {{\n  x = {params}{{1,0}} parameter(0)\n{body}}}\n")


def _opcodes(text: str) -> list[str]:
    return [i.opcode for i in normalize(parse_hlo(text, "t.hlo")).entry.instructions]


# One collective of each kind, f32[8,4] -> f32[8,4] over the groups {groups}.
_ONE = {
    "all-reduce": "  c = f32[8,4]{{1,0}} all-reduce(x), replica_groups={groups}, to_apply=red\n",
    "all-gather": "  c = f32[8,4]{{1,0}} all-gather(x), replica_groups={groups}, dimensions={{0}}\n",
    "reduce-scatter": "  c = f32[8,4]{{1,0}} reduce-scatter(x), replica_groups={groups}, dimensions={{0}}, to_apply=red\n",
    "all-to-all": "  c = f32[8,4]{{1,0}} all-to-all(x), replica_groups={groups}, dimensions={{0}}\n",
}


@pytest.mark.parametrize("opcode", sorted(_ONE))
@pytest.mark.parametrize("reducer", ["add", "subtract"])
def test_a_collective_over_groups_of_one_is_its_operand(opcode: str, reducer: str) -> None:
    for groups in ("{{0}}", "[1,1]<=[1]"):
        text = _module(_ONE[opcode].format(groups=groups) + "  ROOT y = f32[8,4]{1,0} tanh(c)\n", reducer)
        assert _opcodes(text) == ["parameter", "tanh"], (groups, _opcodes(text))
    # A group of two devices, no groups at all (one group of every device), or one-member groups
    # in a program of several devices (almost always a wrong group, reported at its own line) stay.
    for groups in ("{{0,1},{2,3}}", "{{0},{1,2},{3}}", "{}", "{{0},{1},{2},{3}}", "[4,1]<=[4]"):
        text = _module(_ONE[opcode].format(groups=groups) + "  ROOT y = f32[8,4]{1,0} tanh(c)\n", reducer)
        assert opcode in _opcodes(text), groups


def test_the_root_collective_and_an_integer_one_go_too() -> None:
    text = ("HloModule m\n\nred {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT r = s32[] subtract(a, b)\n}\n\n"
            "ENTRY e {\n  x = s32[4]{0} parameter(0)\n  ROOT c = s32[4]{0} all-reduce(x), replica_groups={{0}}, to_apply=red\n}\n")
    entry = normalize(parse_hlo(text, "t.hlo")).entry
    assert [(i.opcode, i.is_root) for i in entry.instructions] == [("parameter", True)]


def _pair(tmp_path: Path, base: str, dist: str, rel: str) -> Path:
    for name, text in (("baseline.hlo", base), ("distributed.hlo", dist), ("relations.yaml", rel)):
        (tmp_path / name).write_text(text)
    return tmp_path


def _check(d: Path, mode: str = "auto") -> Result:
    return check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", None, witness=mode)


_DUP = "groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"


def test_a_degree_one_baseline_with_an_unguarded_all_reduce_verifies(tmp_path: Path) -> None:
    base = _module("  c = f32[8,4]{1,0} all-reduce(x), replica_groups={{0}}, to_apply=red\n  ROOT y = f32[8,4]{1,0} tanh(c)\n", "subtract")
    dist = _module("  ROOT y = f32[8,4]{1,0} tanh(x)\n")
    r = _check(_pair(tmp_path, base, dist, _DUP), "never")
    assert r.verdict == "verified", r.reason


# A 1-wide convolution (no rules: unsupported) over input features sharded across the ranks:
# each rank's convolution is a partial sum, which the all-reduce adds up. The mutant drops it.
_CONV_BASE = ("HloModule b\n\nENTRY e {\n  x = f32[2,8,4]{2,1,0} parameter(0)\n  w = f32[1,4,3]{2,1,0} parameter(1)\n"
              "  ROOT y = f32[2,8,3]{2,1,0} convolution(x, w), window={size=1}, dim_labels=b0f_0io->b0f\n}\n")
_CONV_DIST = ("HloModule d\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n\n"
              "ENTRY e {\n  x = f32[2,8,1]{2,1,0} parameter(0)\n  w = f32[1,1,3]{2,1,0} parameter(1)\n"
              "  p = f32[2,8,3]{2,1,0} convolution(x, w), window={size=1}, dim_labels=b0f_0io->b0f\n"
              "  ROOT y = f32[2,8,3]{2,1,0} all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=add\n}\n")
_CONV_BUG = _CONV_DIST.replace("all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=add", "tanh(p)").replace(
    "dim_labels=b0f_0io->b0f\n", 'dim_labels=b0f_0io->b0f, metadata={op_type="aten__convolution" source_file="model.py" source_line=7}\n')
_CONV_REL = ("groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 2}\n"
             "  - {baseline: 1, distributed: 1, relation: sharded, dim: 1}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n")


def test_an_unsupported_pair_the_witness_finds_different_is_diverged(tmp_path: Path) -> None:
    d = _pair(tmp_path, _CONV_BASE, _CONV_BUG, _CONV_REL)
    alone = _check(d, "never")
    assert alone.verdict == "unsupported", alone.reason
    r = _check(d)
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness
    # Named where the rules stopped: the distributed program's unsupported instruction.
    assert "the rules stopped at the unsupported distributed instruction %p (convolution" in r.reason, r.reason
    assert "opcode 'convolution' has no rules; confirmed numerically: output 0" in r.reason, r.reason
    stop = r.divergences[0]
    assert (stop["instruction"], stop["opcode"], stop["kind"], stop["outputs"], stop["hlo_line"]) == ("%p", "convolution", "divergence", [0], 12), stop
    assert (stop["source"]["file"], stop["source"]["line"]) == ("model.py", 7), stop
    assert {u["instruction"] for u in r.unsupported} == {"y", "p"}


def test_an_unsupported_pair_found_equal_stays_unsupported(tmp_path: Path) -> None:
    r = _check(_pair(tmp_path, _CONV_BASE, _CONV_DIST, _CONV_REL))
    assert r.verdict == "unsupported", r.reason
    assert r.witness is not None and r.witness["status"] == "equal" and "numerically equal on" in r.reason
    assert r.divergences == []


# Sum over a sharded dim: each rank reduces its rows, the all-reduce sums the ranks' partial sums.
_SUM_BASE = ("HloModule b\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n\n"
             "ENTRY e {\n  x = f32[8,4]{1,0} parameter(0)\n  z = f32[] constant(0)\n  ROOT s = f32[4]{0} reduce(x, z), dimensions={0}, to_apply=add\n}\n")
_SUM_DIST = ("HloModule d\n\nadd {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] add(a, b)\n}\n\n"
             "red {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  ROOT r = f32[] REDUCER(a, b)\n}\n\n"
             "ENTRY e {\n  x = f32[2,4]{1,0} parameter(0)\n  z = f32[] constant(0)\n  p = f32[4]{0} reduce(x, z), dimensions={0}, to_apply=add\n"
             "  ROOT s = f32[4]{0} all-reduce(p), replica_groups={{0,1,2,3}}, to_apply=red\n}\n")
_SHARDED = "groups: [[0, 1, 2, 3]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"


def test_a_subtract_reducer_the_witness_cannot_execute_stays_unsupported(tmp_path: Path) -> None:
    """An all-reduce over several devices with a ``subtract`` reducer has no rules, and XLA's
    CPU runtime refuses it (a non-associative reducer has no defined order of combining), so
    there is no evidence either way: it stays ``unsupported``, naming the all-reduce."""
    r = _check(_pair(tmp_path, _SUM_BASE, _SUM_DIST.replace("REDUCER", "subtract"), _SHARDED))
    assert r.verdict == "unsupported", r.reason
    assert r.reason.startswith("distributed %s (all-reduce): all-reduce with a reducer that is not a plain"), r.reason
    assert r.witness is not None and r.witness["status"] == "error", r.witness
    assert r.divergences == []
    # The mutant's original (an add reducer) verifies: the reducer is what the rules lack.
    _pair(tmp_path, _SUM_BASE, _SUM_DIST.replace("REDUCER", "add"), _SHARDED)
    assert _check(tmp_path).verdict == "verified"
