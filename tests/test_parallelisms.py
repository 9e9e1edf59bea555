"""Parallelisms production code uses, and the relations they need (issue 15).

Custom-calls declared in the relations file (``keeps: all``, ``keeps: [duplicate, sharded]``
with ``reduces``), and all-to-all re-sharding (rules/alltoall.egg). Each law is checked on
hand-written HLO pairs in more than one spelling, correct and buggy: the verdict comes from the
real rules (egglog), and XLA's CPU runtime (tests/oracle.py) confirms that the correct pairs are
equal and the buggy ones are not. Custom-call targets of other backends cannot run on the CPU, so
the oracle runs the same pairs with each call spelled out as what it is declared to compute.
"""

from __future__ import annotations

import pytest

from shardproof.engine.analysis.verify import verify
from shardproof.engine.errors import InputError
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

C = 4
GROUPS = "{{0,1,2,3}}"


def _verdict(baseline: str, distributed: str, relations: dict) -> tuple[str, str]:
    result = verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "distributed.hlo"))
    return result.verdict, result.reason


def _oracle_equal(baseline: str, distributed: str, relations: dict, seeds: tuple[int, ...] = (0, 1)) -> bool:
    oracle = pytest.importorskip("oracle")
    return all(oracle.run_pair(baseline, distributed, relations, seed=s).equal for s in seeds)


# ---- custom-calls ----------------------------------------------------------------------------

ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}
"""


def _norm(rows: int, spelled: bool) -> str:
    """Row-wise RMS norm of x (rows x 16) times w, as the Neuron custom-call or spelled out."""
    if not spelled:
        return f"""  %n = f32[{rows},16]{{1,0}} custom-call(f32[{rows},16]{{1,0}} %t, f32[16]{{0}} %w), custom_call_target="AwsNeuronRmsNorm", backend_config="eps=0"
"""
    return f"""  %sq = f32[{rows},16]{{1,0}} multiply(f32[{rows},16]{{1,0}} %t, f32[{rows},16]{{1,0}} %t)
  %zero = f32[] constant(0)
  %ss = f32[{rows}]{{0}} reduce(f32[{rows},16]{{1,0}} %sq, f32[] %zero), dimensions={{1}}, to_apply=%add
  %inv = f32[] constant(0.0625)
  %invb = f32[{rows}]{{0}} broadcast(f32[] %inv), dimensions={{}}
  %ms = f32[{rows}]{{0}} multiply(f32[{rows}]{{0}} %ss, f32[{rows}]{{0}} %invb)
  %r = f32[{rows}]{{0}} rsqrt(f32[{rows}]{{0}} %ms)
  %rb = f32[{rows},16]{{1,0}} broadcast(f32[{rows}]{{0}} %r), dimensions={{0}}
  %y = f32[{rows},16]{{1,0}} multiply(f32[{rows},16]{{1,0}} %t, f32[{rows},16]{{1,0}} %rb)
  %wb = f32[{rows},16]{{1,0}} broadcast(f32[16]{{0}} %w), dimensions={{1}}
  %n = f32[{rows},16]{{1,0}} multiply(f32[{rows},16]{{1,0}} %y, f32[{rows},16]{{1,0}} %wb)
"""


def _transfer(rows: int, spelled: bool) -> str:
    if spelled:  # the identity: a copy
        return f"  %t = f32[{rows},16]{{1,0}} copy(f32[{rows},16]{{1,0}} %x)\n"
    return f'  %t = f32[{rows},16]{{1,0}} custom-call(f32[{rows},16]{{1,0}} %x), custom_call_target="AwsNeuronTransferWithStaticRing"\n'


def _norm_pair(spelled: bool, gather_dim: int = 0) -> tuple[str, str]:
    """Baseline: exp(norm(transfer(x)) * w) on 8 rows; distributed: the same on the rank's 2
    rows, then all-gather along ``gather_dim`` (0 is right; 1 is the bug)."""
    baseline = f"""HloModule base

{ADD if spelled else ""}
ENTRY %main (x: f32[8,16], w: f32[16]) -> f32[8,16] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %w = f32[16]{{0}} parameter(1)
{_transfer(8, spelled)}{_norm(8, spelled)}  ROOT %e = f32[8,16]{{1,0}} exponential(f32[8,16]{{1,0}} %n)
}}
"""
    gathered = "f32[8,16]" if gather_dim == 0 else "f32[2,64]"
    tail = "" if gather_dim == 0 else "  %back = f32[8,16]{1,0} reshape(f32[2,64]{1,0} %g)\n"
    root = "%g" if gather_dim == 0 else "%back"
    distributed = f"""HloModule dist

{ADD if spelled else ""}
ENTRY %main (x: f32[2,16], w: f32[16]) -> f32[8,16] {{
  %x = f32[2,16]{{1,0}} parameter(0)
  %w = f32[16]{{0}} parameter(1)
{_transfer(2, spelled)}{_norm(2, spelled)}  %e = f32[2,16]{{1,0}} exponential(f32[2,16]{{1,0}} %n)
  %g = {gathered}{{1,0}} all-gather(f32[2,16]{{1,0}} %e), dimensions={{{gather_dim}}}, replica_groups={GROUPS}
{tail}  ROOT %out = f32[8,16]{{1,0}} copy(f32[8,16]{{1,0}} {root})
}}
"""
    return baseline, distributed


def _cc_relations(norm: dict | None = None) -> dict:
    return {
        "groups": [[0, 1, 2, 3]],
        "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}, {"baseline": 1, "distributed": 1, "relation": "duplicate"}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
        "custom_calls": [{"target": "AwsNeuronTransferWithStaticRing", "keeps": "all"}, norm or {"target": "AwsNeuronRmsNorm", "keeps": ["duplicate", "sharded"], "reduces": [1]}],
    }


def test_declared_custom_calls_verify_and_their_spelled_out_form_is_equal() -> None:
    rel = _cc_relations()
    assert _verdict(*_norm_pair(spelled=False), rel)[0] == "verified"
    # The law the declaration states, checked where XLA can run it: the same program with the
    # calls spelled out is equal on the CPU, and the rules prove that spelling too.
    spelled = _norm_pair(spelled=True)
    assert _verdict(*spelled, rel)[0] == "verified"
    assert _oracle_equal(*spelled, rel)


def test_gathering_row_blocks_along_the_wrong_dim_is_not_verified() -> None:
    rel = _cc_relations()
    assert _verdict(*_norm_pair(spelled=False, gather_dim=1), rel)[0] != "verified"
    spelled = _norm_pair(spelled=True, gather_dim=1)
    assert _verdict(*spelled, rel)[0] == "diverged"
    assert not _oracle_equal(*spelled, rel)


def test_a_call_that_reduces_the_sharded_dim_keeps_no_sharding() -> None:
    # Declared to reduce dim 0 (the rows the ranks hold): a block of rows is no longer the
    # call on the block, so nothing may be derived past the norm.
    rel = _cc_relations({"target": "AwsNeuronRmsNorm", "keeps": ["duplicate", "sharded"], "reduces": [0, 1]})
    assert _verdict(*_norm_pair(spelled=False), rel)[0] != "verified"


def test_an_undeclared_identity_keeps_the_pair_unproven_not_verified() -> None:
    rel = _cc_relations()
    rel["custom_calls"] = rel["custom_calls"][1:]
    verdict, reason = _verdict(*_norm_pair(spelled=False), rel)
    assert verdict != "verified"
    assert "AwsNeuronTransferWithStaticRing" in reason or verdict in ("unsupported", "inconclusive", "unproven")


def test_identity_declared_for_a_call_that_changes_the_type_is_refused() -> None:
    def prog(rows: int, tail: str) -> str:
        return f"""HloModule m

ENTRY %main (x: f32[{rows},16]) -> f64[8,16] {{
  %x = f32[{rows},16]{{1,0}} parameter(0)
  %t = f64[{rows},16]{{1,0}} custom-call(f32[{rows},16]{{1,0}} %x), custom_call_target="Widen"
{tail}}}
"""

    baseline = prog(8, "  ROOT %e = f64[8,16]{1,0} exponential(f64[8,16]{1,0} %t)\n")
    distributed = prog(2, f"  %e = f64[2,16]{{1,0}} exponential(f64[2,16]{{1,0}} %t)\n  ROOT %g = f64[8,16]{{1,0}} all-gather(f64[2,16]{{1,0}} %e), dimensions={{0}}, replica_groups={GROUPS}\n")
    rel = _cc_relations({"target": "Widen", "keeps": "all"})
    rel["inputs"] = rel["inputs"][:1]
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    assert result.verdict != "verified"
    reasons = [u["reason"] for u in result.to_json()["unsupported"]]
    assert any("'Widen'" in r and "keeps: all" in r and "f64[8,16]" in r for r in reasons), reasons
    # Declared as a function that keeps row blocks instead, the same pair verifies.
    rel["custom_calls"] = [{"target": "Widen", "keeps": ["duplicate", "sharded"], "reduces": []}]
    assert _verdict(baseline, distributed, rel)[0] == "verified"


@pytest.mark.parametrize(
    ("entry", "key", "words"),
    [
        ({"target": "N", "keeps": ["sharded"], "reduces": [1]}, "custom_calls[0].keeps", ["'N'", "duplicate"]),
        ({"target": "N", "keeps": ["duplicate", "sharded"]}, "custom_calls[0].reduces", ["'N'", "reduces"]),
        ({"target": "N", "keeps": ["duplicate", "sharded"], "reduces": [-1]}, "custom_calls[0].reduces", ["'N'"]),
        ({"target": "N", "keeps": "all", "reduces": [1]}, "custom_calls[0].reduces", ["'N'", "identity"]),
        ({"target": "N", "keeps": ["duplicate"], "reduces": [1]}, "custom_calls[0].reduces", ["'N'"]),
        ({"target": "N", "keeps": ["partial"]}, "custom_calls[0].keeps", ["'N'", "'all'"]),
        ({"target": "N", "keeps": "some"}, "custom_calls[0].keeps", ["'N'"]),
        ({"target": "N", "keep": "all"}, "custom_calls[0].keep", ["'N'"]),
        ({"keeps": "all"}, "custom_calls[0]", ["target"]),
    ],
)
def test_bad_custom_call_entries_name_the_key_and_the_target(entry: dict, key: str, words: list[str]) -> None:
    rel = _cc_relations()
    rel["custom_calls"] = [entry]
    with pytest.raises(InputError) as e:
        parse_relations(rel, "r.yaml")
    assert e.value.where == key
    for w in words:
        assert w in str(e.value), str(e.value)


def test_a_target_declared_twice_is_refused() -> None:
    rel = _cc_relations()
    rel["custom_calls"].append({"target": "AwsNeuronRmsNorm", "keeps": ["duplicate"]})
    with pytest.raises(InputError, match="declared twice"):
        parse_relations(rel, "r.yaml")


# ---- all-to-all ------------------------------------------------------------------------------


def _dims(shape: tuple[int, ...]) -> str:
    return ",".join(map(str, shape))


def _layout(shape: tuple[int, ...]) -> str:
    return ",".join(map(str, reversed(range(len(shape)))))


def _t(shape: tuple[int, ...]) -> str:
    return f"f32[{_dims(shape)}]{{{_layout(shape)}}}"


def _a2a_pair(whole: tuple[int, ...], t: int, s: int, *, groups: str = GROUPS, transpose: bool = True, split_on: int | None = None) -> tuple[str, str, dict]:
    """Baseline: exp(x). Distributed: x' is block r of x along t; exp, then the array
    all-to-all along s (``split_on`` overrides the dim it splits) and XLA's own
    reshape/transpose/reshape that concatenates the received pieces along t (torch-xla's
    lowering of xm.all_to_all(split_dimension=s, concat_dimension=t)). The result is expected
    to be block r of exp(x) along s. ``transpose=False`` leaves out the transpose (the pieces
    land in the wrong order)."""
    local = list(whole)
    local[t] //= C
    local_t = tuple(local)
    out = list(whole)
    out[s] //= C
    out_t = tuple(out)
    a2a_dim = s if split_on is None else split_on
    # Split a2a_dim into (C, n/C), move the C in front of t, merge it into t.
    split = [*local[:a2a_dim], C, local[a2a_dim] // C, *local[a2a_dim + 1 :]]
    dims = list(range(len(split)))
    src_t = t if t < a2a_dim else t + 1
    rank_dim = a2a_dim
    order = [d for d in dims if d != rank_dim]
    order.insert(order.index(src_t), rank_dim)
    moved = tuple(split[d] for d in order)
    lines = [
        f"  %x = {_t(local_t)} parameter(0)",
        f"  %e = {_t(local_t)} exponential({_t(local_t)} %x)",
        f"  %a = {_t(local_t)} all-to-all({_t(local_t)} %e), replica_groups={groups}, dimensions={{{a2a_dim}}}",
        f"  %r = {_t(tuple(split))} reshape({_t(local_t)} %a)",
    ]
    if transpose:
        lines.append(f"  %p = {_t(moved)} transpose({_t(tuple(split))} %r), dimensions={{{_dims(tuple(order))}}}")
        last = ("%p", moved)
    else:
        last = ("%r", tuple(split))
    lines.append(f"  ROOT %o = {_t(out_t)} reshape({_t(last[1])} {last[0]})")
    distributed = f"HloModule dist\n\nENTRY %main (x: f32[{_dims(local_t)}]) -> f32[{_dims(out_t)}] {{\n" + "\n".join(lines) + "\n}\n"
    baseline = f"""HloModule base

ENTRY %main (x: f32[{_dims(whole)}]) -> f32[{_dims(whole)}] {{
  %x = {_t(whole)} parameter(0)
  ROOT %e = {_t(whole)} exponential({_t(whole)} %x)
}}
"""
    relations = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": t}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": s}],
    }
    return baseline, distributed, relations


A2A_CORRECT = [
    ((8, 8, 3), 0, 1),  # sequence blocks -> head blocks, (s, h, d)
    ((8, 8, 3), 1, 0),  # and back
    ((2, 8, 8, 3), 1, 2),  # Ulysses (b, s, h, d): split heads, concatenate the sequence
    ((2, 8, 8, 3), 2, 1),
    ((8, 2, 4, 12), 0, 3),  # dims apart, other dims between them
]


@pytest.mark.parametrize(("whole", "t", "s"), A2A_CORRECT)
def test_all_to_all_reshards_and_the_oracle_agrees(whole: tuple[int, ...], t: int, s: int) -> None:
    baseline, distributed, rel = _a2a_pair(whole, t, s)
    verdict, reason = _verdict(baseline, distributed, rel)
    assert verdict == "verified", reason
    assert _oracle_equal(baseline, distributed, rel)


def test_the_all_to_all_law_is_the_rule_that_proves_it() -> None:
    baseline, distributed, rel = _a2a_pair((8, 8, 3), 0, 1)
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    rules = {step["rule"] for t in result.trace for step in t["steps"]}
    assert "alltoall/reshards-split-dim" in rules, rules


A2A_BUGS = [
    ("groups", {"groups": "{{0,1},{2,3}}"}),  # exchanges within halves of the group only
    ("order", {"transpose": False}),  # pieces concatenated in the wrong order
    ("groups-order", {"groups": "{{1,0,2,3}}"}),  # the same ranks, in another order
]


@pytest.mark.parametrize(("what", "kw"), A2A_BUGS, ids=[b[0] for b in A2A_BUGS])
def test_a_wrong_all_to_all_is_never_verified_and_the_oracle_sees_it(what: str, kw: dict) -> None:
    baseline, distributed, rel = _a2a_pair((8, 8, 3), 0, 1, **kw)
    assert _verdict(baseline, distributed, rel)[0] != "verified"
    assert not _oracle_equal(baseline, distributed, rel)


def test_all_to_all_of_a_block_sharded_tensor_is_not_resharded() -> None:
    # A fused-block sharding (two blocks per rank) interleaves under the exchange: no rule.
    baseline, distributed, rel = _a2a_pair((8, 8, 3), 0, 1)
    rel["inputs"][0]["blocks"] = [4, 4]
    assert _verdict(baseline, distributed, rel)[0] != "verified"
    assert not _oracle_equal(baseline, distributed, rel)


# ---- collective-permute rings ----------------------------------------------------------------


def _pairs(m: int) -> str:
    return "{" + ",".join(f"{{{i},{(i + m) % C}}}" for i in range(C)) + "}"


def _ring_pair(kind: str, steps: int = C - 1, shifts: tuple[int, int] = (1, 1), acc_first: bool = True) -> tuple[str, str, dict]:
    """x (8, 16) @ w (16, 8), both sharded along the contracted 16. ``kind`` "allreduce": each
    rank's partial product goes around the ring (shift shifts[0]) and is added up; "matmul":
    the shards go around the ring (x by shifts[0], w by shifts[1]) and each step's product is
    added up. ``steps`` ring steps after the local one; ``acc_first``: acc + received (else
    received + acc)."""
    lx, lw, out = "f32[8,4]{1,0}", "f32[4,8]{1,0}", "f32[8,8]{1,0}"
    dot = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    lines = [f"  %x = {lx} parameter(0)", f"  %w = {lw} parameter(1)", f"  %p0 = {out} dot({lx} %x, {lw} %w), {dot}"]
    acc, cur, xs, ws = "%p0", "%p0", "%x", "%w"
    for i in range(1, steps + 1):
        if kind == "allreduce":
            lines.append(f"  %c{i} = {out} collective-permute({out} {cur}), channel_id={i}, source_target_pairs={_pairs(shifts[0])}")
            cur = term = f"%c{i}"
        else:
            lines.append(f"  %x{i} = {lx} collective-permute({lx} {xs}), channel_id={2 * i}, source_target_pairs={_pairs(shifts[0])}")
            lines.append(f"  %w{i} = {lw} collective-permute({lw} {ws}), channel_id={2 * i + 1}, source_target_pairs={_pairs(shifts[1])}")
            xs, ws = f"%x{i}", f"%w{i}"
            lines.append(f"  %p{i} = {out} dot({lx} {xs}, {lw} {ws}), {dot}")
            term = f"%p{i}"
        a, b = (acc, term) if acc_first else (term, acc)
        lines.append(f"  %a{i} = {out} add({out} {a}, {out} {b})")
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
    relations = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}, {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return baseline, distributed, relations


RING_CORRECT = [
    ("allreduce", {}),
    ("allreduce", {"shifts": (C - 1, C - 1)}),  # the other direction
    ("allreduce", {"acc_first": False}),
    ("matmul", {}),
    ("matmul", {"shifts": (C - 1, C - 1), "acc_first": False}),
]


@pytest.mark.parametrize(("kind", "kw"), RING_CORRECT)
def test_a_ring_that_visits_every_block_once_verifies_and_the_oracle_agrees(kind: str, kw: dict) -> None:
    baseline, distributed, rel = _ring_pair(kind, **kw)
    verdict, reason = _verdict(baseline, distributed, rel)
    assert verdict == "verified", reason
    assert _oracle_equal(baseline, distributed, rel)


RING_BUGS = [
    ("allreduce", {"steps": C - 2}),  # a ring step off by one: one block never arrives
    ("allreduce", {"steps": C}),  # one step too many: the local block counted twice
    ("allreduce", {"shifts": (2, 2)}),  # steps of 2 on a ring of 4: blocks 0, 2, 0, 2
    ("matmul", {"steps": C - 2}),
    ("matmul", {"shifts": (1, 2)}),  # x and w blocks out of step: x_(r+1) . w_(r+2)
]


@pytest.mark.parametrize(("kind", "kw"), RING_BUGS)
def test_a_ring_off_by_one_is_never_verified_and_the_oracle_sees_it(kind: str, kw: dict) -> None:
    baseline, distributed, rel = _ring_pair(kind, **kw)
    assert _verdict(baseline, distributed, rel)[0] != "verified"
    assert not _oracle_equal(baseline, distributed, rel)


def test_the_ring_law_is_the_rule_that_proves_it() -> None:
    baseline, distributed, rel = _ring_pair("matmul")
    result = verify(parse_relations(rel), parse_hlo(baseline), parse_hlo(distributed))
    rules = {step["rule"] for t in result.trace for step in t["steps"]}
    assert "permute/ring-steps-cover-all-blocks" in rules, rules


# ---- algebra written another way -----------------------------------------------------------

V = "f32[8,16]{1,0}"


def _prog(name: str, body: list[str], root: str) -> str:
    lines = "\n".join(f"  {b}" for b in body)
    return f"HloModule {name}\n\n{ADD}\nENTRY %main (x: f32[8,16]) -> f32[8,16] {{\n  %x = {V} parameter(0)\n{lines}\n  ROOT %out = {V} copy({V} {root})\n}}\n"


def _divide(name: str, src: str, by: str) -> list[str]:
    return [f"%{name}.c = f32[] constant({by})", f"%{name}.b = {V} broadcast(f32[] %{name}.c), dimensions={{}}", f"%{name} = {V} divide({V} {src}, {V} %{name}.b)"]


DUP_REL = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}


def _allreduce(src: str, groups: str = GROUPS) -> str:
    return f"%ar = {V} all-reduce({V} {src}), replica_groups={groups}, to_apply=%add"


ALGEBRA_CORRECT = {
    # the average on every rank, then all-reduce(add): the value itself
    "dup_over_c_all_reduced": (["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)"], "%e", ["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)", *_divide("q", "%e", "4"), _allreduce("%q")], "%ar"),
    # ... divided in two steps
    "dup_over_2_over_2_all_reduced": (["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)"], "%e", ["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)", *_divide("q", "%e", "2"), *_divide("q2", "%q", "2"), _allreduce("%q2")], "%ar"),
    # (x / a) / b against x / (a*b)
    "divide_twice_vs_once": (_divide("q", "%x", "6"), "%q", [*_divide("q", "%x", "2"), *_divide("q2", "%q", "3")], "%q2"),
}

ALGEBRA_BUGS = {
    "dup_over_2_all_reduced": (["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)"], "%e", ["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)", *_divide("q", "%e", "2"), _allreduce("%q")], "%ar"),
    "divide_twice_wrong_total": (_divide("q", "%x", "6"), "%q", [*_divide("q", "%x", "2"), *_divide("q2", "%q", "2")], "%q2"),
    "dup_all_reduced_over_half_the_ranks": (["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)"], "%e", ["%e = f32[8,16]{1,0} exponential(f32[8,16]{1,0} %x)", *_divide("q", "%e", "4"), _allreduce("%q", "{{0,1},{2,3}}")], "%ar"),
}


@pytest.mark.parametrize("name", sorted(ALGEBRA_CORRECT))
def test_a_law_written_another_way_verifies_and_the_oracle_agrees(name: str) -> None:
    base_body, base_root, dist_body, dist_root = ALGEBRA_CORRECT[name]
    baseline, distributed = _prog("base", base_body, base_root), _prog("dist", dist_body, dist_root)
    verdict, reason = _verdict(baseline, distributed, DUP_REL)
    assert verdict == "verified", reason
    assert _oracle_equal(baseline, distributed, DUP_REL)


@pytest.mark.parametrize("name", sorted(ALGEBRA_BUGS))
def test_a_law_written_wrong_is_not_verified_and_the_oracle_sees_it(name: str) -> None:
    base_body, base_root, dist_body, dist_root = ALGEBRA_BUGS[name]
    baseline, distributed = _prog("base", base_body, base_root), _prog("dist", dist_body, dist_root)
    assert _verdict(baseline, distributed, DUP_REL)[0] != "verified"
    assert not _oracle_equal(baseline, distributed, DUP_REL)


def test_an_all_reduce_over_reordered_groups_is_the_same_sum() -> None:
    baseline, distributed, rel = _ring_pair("allreduce", steps=0)
    for groups in ("{{3,1,0,2}}", "{{0,1,2,3}}"):
        dist = distributed.replace("  ROOT %o = f32[8,8]{1,0} copy(f32[8,8]{1,0} %p0)", f"  %s = f32[8,8]{{1,0}} all-reduce(f32[8,8]{{1,0}} %p0), replica_groups={groups}, to_apply=%add\n  ROOT %o = f32[8,8]{{1,0}} copy(f32[8,8]{{1,0}} %s)")
        dist = dist.replace("HloModule dist\n", "HloModule dist\n\n" + ADD)
        assert "all-reduce" in dist
        verdict, reason = _verdict(baseline, dist, rel)
        assert verdict == "verified", (groups, reason)
        assert _oracle_equal(baseline, dist, rel)


def _mul(name: str, src: str, by: str) -> list[str]:
    return [f"%{name}.c = f32[] constant({by})", f"%{name}.b = {V} broadcast(f32[] %{name}.c), dimensions={{}}", f"%{name} = {V} multiply({V} %{name}.b, {V} {src})"]


ALGEBRA_CORRECT["reciprocal_then_divide"] = (_divide("q", "%x", "16"), "%q", [*_mul("m", "%x", "0.25"), *_divide("q", "%m", "4")], "%q")
ALGEBRA_BUGS["rounded_reciprocal_is_not_a_quotient"] = (_divide("q", "%x", "9"), "%q", [*_mul("m", "%x", "0.3333"), *_divide("q", "%m", "3")], "%q")


def _mean_pair(local_scale: str, final: str) -> tuple[str, str, dict]:
    """mean over a sharded dim 0 of 8 rows: the local sum scaled by ``local_scale``, all-reduced,
    divided by ``final`` (right: 0.5 and 4, or 1 and 8)."""
    r = "f32[16]{0}"
    baseline = f"""HloModule base

{ADD}
ENTRY %main (x: f32[8,16]) -> f32[16] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %z = f32[] constant(0)
  %s = {r} reduce(f32[8,16]{{1,0}} %x, f32[] %z), dimensions={{0}}, to_apply=%add
  %n = f32[] constant(8)
  %nb = {r} broadcast(f32[] %n), dimensions={{}}
  ROOT %m = {r} divide({r} %s, {r} %nb)
}}
"""
    distributed = f"""HloModule dist

{ADD}
ENTRY %main (x: f32[2,16]) -> f32[16] {{
  %x = f32[2,16]{{1,0}} parameter(0)
  %z = f32[] constant(0)
  %s = {r} reduce(f32[2,16]{{1,0}} %x, f32[] %z), dimensions={{0}}, to_apply=%add
  %h = f32[] constant({local_scale})
  %hb = {r} broadcast(f32[] %h), dimensions={{}}
  %l = {r} multiply({r} %s, {r} %hb)
  %a = {r} all-reduce({r} %l), replica_groups={GROUPS}, to_apply=%add
  %c = f32[] constant({final})
  %cb = {r} broadcast(f32[] %c), dimensions={{}}
  ROOT %m = {r} divide({r} %a, {r} %cb)
}}
"""
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return baseline, distributed, rel


@pytest.mark.parametrize(("local_scale", "final", "right"), [("0.5", "4", True), ("1", "8", True), ("0.5", "8", False), ("0.25", "4", False)])
def test_a_mean_of_local_means_is_the_mean(local_scale: str, final: str, right: bool) -> None:
    baseline, distributed, rel = _mean_pair(local_scale, final)
    verdict, reason = _verdict(baseline, distributed, rel)
    assert (verdict == "verified") == right, reason
    assert _oracle_equal(baseline, distributed, rel) == right


# ---- rank selection -------------------------------------------------------------------------


def _guard_pair(compare: str, *, offset: int = 0, j: int | None = None, mul: bool = False) -> tuple[str, str, dict]:
    """Row sums of x (sharded along its columns) plus a bias b added on one rank only, then
    all-reduce(add). The rank is guarded by ``(r + offset) compare j`` (j = offset unless given;
    right for EQ with offset <= j < offset + 4), as a select or (``mul``) as float(guard) * b."""
    r8 = "f32[8]{0}"
    guard = f"""  %z = s32[] constant({offset})
  %ro = s32[] add(s32[] %r, s32[] %z)
  %j = s32[] constant({offset if j is None else j})
  %p = pred[] compare(s32[] %ro, s32[] %j), direction={compare}
"""
    if mul:
        use = f"""  %pf = f32[] convert(pred[] %p)
  %pb = {r8} broadcast(f32[] %pf), dimensions={{}}
  %bb = {r8} multiply({r8} %pb, {r8} %b)
"""
    else:
        use = f"""  %pb = pred[8]{{0}} broadcast(pred[] %p), dimensions={{}}
  %zb = {r8} broadcast(f32[] %zero), dimensions={{}}
  %bb = {r8} select(pred[8]{{0}} %pb, {r8} %b, {r8} %zb)
"""
    distributed = f"""HloModule dist

{ADD}
ENTRY %main (x: f32[8,4], b: f32[8], r: s32[]) -> f32[8] {{
  %x = f32[8,4]{{1,0}} parameter(0)
  %b = {r8} parameter(1)
  %r = s32[] parameter(2)
  %zero = f32[] constant(0)
  %s = {r8} reduce(f32[8,4]{{1,0}} %x, f32[] %zero), dimensions={{1}}, to_apply=%add
{guard}{use}  %y = {r8} add({r8} %s, {r8} %bb)
  ROOT %g = {r8} all-reduce({r8} %y), replica_groups={GROUPS}, to_apply=%add
}}
"""
    baseline = f"""HloModule base

{ADD}
ENTRY %main (x: f32[8,16], b: f32[8]) -> f32[8] {{
  %x = f32[8,16]{{1,0}} parameter(0)
  %b = {r8} parameter(1)
  %zero = f32[] constant(0)
  %s = {r8} reduce(f32[8,16]{{1,0}} %x, f32[] %zero), dimensions={{1}}, to_apply=%add
  ROOT %y = {r8} add({r8} %s, {r8} %b)
}}
"""
    rel = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}, {"baseline": 1, "distributed": 1, "relation": "duplicate"}, {"distributed": 2, "relation": "rank"}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return baseline, distributed, rel


@pytest.mark.parametrize(("compare", "offset", "j", "mul", "right"), [
    ("EQ", 0, 0, False, True), ("EQ", 2, 5, False, True), ("EQ", 3, 3, True, True), ("EQ", 0, 3, True, True),
    ("LE", 0, 1, False, False),  # ranks 0 and 1 both add the bias
    ("NE", 0, 0, True, False),  # every rank but one adds it
    ("EQ", 0, 4, False, False),  # no rank is 4: the bias is never added
])  # fmt: skip
def test_a_bias_added_on_one_rank_only(compare: str, offset: int, j: int, mul: bool, right: bool) -> None:
    baseline, distributed, rel = _guard_pair(compare, offset=offset, j=j, mul=mul)
    verdict, reason = _verdict(baseline, distributed, rel)
    assert (verdict == "verified") == right, reason
    assert _oracle_equal(baseline, distributed, rel) == right


def _onehot_pair(blocks: list[int]) -> tuple[str, str, dict]:
    """Rank r's block of columns of a duplicate x (8, 16), picked as sum_j float(r == j) *
    x[:, block blocks[j]] (right when blocks[j] == j for every j)."""
    t = "f32[8,4]{1,0}"
    lines = ["  %x = f32[8,16]{1,0} parameter(0)", "  %r = s32[] parameter(1)", f"  %z = {t} broadcast(f32[] %zf), dimensions={{}}", "  %zf = f32[] constant(0)"]
    lines = [lines[0], lines[1], lines[3], lines[2]]
    acc = "%z"
    for j, blk in enumerate(blocks):
        lines += [
            f"  %j_{j} = s32[] constant({j})",
            f"  %pr_{j} = pred[] compare(s32[] %r, s32[] %j_{j}), direction=EQ",
            f"  %fl_{j} = f32[] convert(pred[] %pr_{j})",
            f"  %fb_{j} = {t} broadcast(f32[] %fl_{j}), dimensions={{}}",
            f"  %sl_{j} = {t} slice(f32[8,16]{{1,0}} %x), slice={{[0:8], [{4 * blk}:{4 * blk + 4}]}}",
            f"  %m_{j} = {t} multiply({t} %fb_{j}, {t} %sl_{j})",
            f"  %a_{j} = {t} add({t} {acc}, {t} %m_{j})",
        ]
        acc = f"%a_{j}"
    lines.append(f"  ROOT %o = {t} copy({t} {acc})")
    distributed = "HloModule dist\n\nENTRY %main (x: f32[8,16], r: s32[]) -> f32[8,4] {\n" + "\n".join(lines) + "\n}\n"
    baseline = """HloModule base

ENTRY %main (x: f32[8,16]) -> f32[8,16] {
  ROOT %x = f32[8,16]{1,0} parameter(0)
}
"""
    rel = {
        "groups": [[0, 1, 2, 3]],
        "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}, {"distributed": 1, "relation": "rank"}],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}],
    }
    return baseline, distributed, rel


@pytest.mark.parametrize(("blocks", "right"), [([0, 1, 2, 3], True), ([3, 1, 2, 0], False), ([0, 1, 2], False)])
def test_one_hot_rank_selection_of_blocks(blocks: list[int], right: bool) -> None:
    baseline, distributed, rel = _onehot_pair(blocks)
    verdict, reason = _verdict(baseline, distributed, rel)
    assert (verdict == "verified") == right, reason
    assert _oracle_equal(baseline, distributed, rel) == right
