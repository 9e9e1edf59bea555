"""Review r3 (outside reviewer): attacks on three laws that landed together, each a program
that differs from its baseline (XLA's execution the truth) or whose proof rests on a step the
law does not state. None is verified; these tests keep it so.

1. scatter.overwrite_slots_distinct (a MoE's routed-slot dispatch): broken routings lowered by
   torch-xla stay unsupported - a capacity mask keeping C+1 tokens per expert on a stride of C
   (two kept tokens on one slot), the dropped test taken from the uncapped one-hot's row sum
   (a dropped token lands on its expert's slot 0), the cumsum taken along the experts, the
   slot arithmetic in s8 / u8 with E*C = 320 (wrapped slots land on kept ones).
2. rules/microbatch.egg mbstack-*: losses stacked and reduced with max (diverged), or
   reduce-added from a non-zero init (never verified: the init's uses are the runtime's choice).
3. rules/dotscale.egg: the baseline contracting E's middle dim (D broadcast on {0,2}) is
   verified against the ranks' dot(E, L) / D on the same rows, and diverged when the ranks
   divide along the other dim; a precision attribute on the baseline dot is never verified.
4. b0fd466 (an unnamed backward instruction goes to the backward of its layer): the moved
   power of tanh mutated (reads another tanh of the stage, or cubes) is diverged, confirmed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from laws.families import Program
from laws.run import judge
from test_pipeline_microbatch import _check, _stacked

from shardproof.engine.analysis.scatter import read_scatter
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo


def _routing(variant: str, tokens: int = 8, experts: int = 4, capacity: int = 2) -> str:
    """Top-1 routing onto expert slots as test_scatter's, with one step broken by ``variant``."""
    torch = pytest.importorskip("torch")
    torch_xla = pytest.importorskip("torch_xla")
    from shardproof.engine.frontend.capture import keep_scalars_constant

    before = torch_xla._XLAC._get_xla_all_numbers_special_scalars()
    keep_scalars_constant()
    try:
        return _routing_text(torch, torch_xla, variant, tokens, experts, capacity)
    finally:
        torch_xla._XLAC._set_xla_all_numbers_special_scalars(before)


def _routing_text(torch: Any, torch_xla: Any, variant: str, tokens: int, experts: int, capacity: int) -> str:
    F = torch.nn.functional
    dev = torch_xla.device()
    logits = torch.randn(tokens, experts, device=dev)
    index = torch.argmax(F.softmax(logits, dim=1), dim=1)
    onehot = F.one_hot(index, num_classes=experts)
    top = torch.topk(onehot, k=capacity + 1 if variant == "capacity_plus_one" else capacity, dim=0)[1]
    mask = onehot * torch.zeros_like(onehot).scatter_(0, top, 1)
    rows = onehot if variant == "rowsum_uncapped" else mask
    expert = torch.min(index, rows.sum(dim=1) * experts - 1)
    cum = torch.cumsum(mask, dim=1 if variant == "cumsum_over_experts" else 0)
    location = torch.sum((cum - 1) * mask, dim=1)
    kept = expert * capacity + location
    if variant.startswith("slots_"):  # slot arithmetic in a narrow int: E*C = 320 wraps onto kept slots
        narrow = {"slots_s8": torch.int8, "slots_u8": torch.uint8}[variant]
        kept = (expert.to(narrow) * capacity + location.to(narrow)).long()
    slots = torch.where(expert >= 0, kept, torch.full_like(expert, experts * capacity))
    source = torch.full((experts * capacity + 1,), tokens, dtype=torch.long, device=dev)
    source.scatter_(0, slots, torch.arange(tokens, device=dev))
    out = torch.cat([logits, logits.new_zeros(1, experts)]).index_select(0, source[:-1])
    return torch_xla._XLAC._get_xla_tensors_hlo([out])


def _dispatch_form(text: str) -> object:
    module = normalize(parse_hlo(text))
    found = [i for i in module.entry.instructions if i.opcode == "scatter" and len(i.shape.dims) == 1]
    assert len(found) == 1
    return read_scatter(found[0], [module.entry[o].shape for o in found[0].operands], module)


def test_routing_control_is_read() -> None:
    form = _dispatch_form(_routing("ok"))
    assert not isinstance(form, str) and form.combiner == "overwrite", form


@pytest.mark.parametrize("variant", ["capacity_plus_one", "rowsum_uncapped", "cumsum_over_experts"])
def test_colliding_routings_stay_unsupported(variant: str) -> None:
    assert isinstance(_dispatch_form(_routing(variant)), str), variant


@pytest.mark.parametrize("variant", ["slots_s8", "slots_u8"])
def test_wrapping_slot_arithmetic_stays_unsupported(variant: str) -> None:
    form = _dispatch_form(_routing("ok", tokens=16, experts=80, capacity=4))
    assert not isinstance(form, str), form  # the wide control at these sizes is read
    assert isinstance(_dispatch_form(_routing(variant, tokens=16, experts=80, capacity=4)), str), variant


MAX = """%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %a, f32[] %b)
}
"""


def _stack_mutant(kind: str) -> str:
    good = _stacked(0, 1)
    head = "%ssum = f32[] reduce(f32[2] %stk, f32[] %zero), dimensions={0}, to_apply=%sum"
    assert head in good
    if kind == "init_one":
        return good.replace(head, "%one = f32[] constant(1)\n  " + head.replace("%zero)", "%one)"))
    return good.replace(head, head.replace("%sum", "%max")).replace("\nENTRY", "\n" + MAX + "\nENTRY", 1)


def test_stacked_losses_reduced_with_max_diverged(tmp_path: Path) -> None:
    # max(l0, l1) / 2 is not (l0 + l1) / 2: XLA gives 0.5 against 1.0 on all-ones inputs.
    res = _check(tmp_path, _stack_mutant("max_reducer"))
    assert res.verdict == "diverged", (res.verdict, res.reason)


def test_stacked_losses_with_a_nonzero_init_not_verified(tmp_path: Path) -> None:
    # A reduce init that is not add's identity: XLA's CPU runtime folds the reduce of the two
    # stacked scalars into their add and drops the init (it computes (l0 + l1) / 2, equal to
    # the baseline), but HLO leaves the init's count of uses to the implementation, so no
    # rule may rest on it: never verified (mbstack-sum asks for a zero init).
    res = _check(tmp_path, _stack_mutant("init_one"))
    assert res.verdict != "verified", res.reason


def _dotscale(base_b: str, dist_b: str, contract: int, precision: str = "") -> Program:
    """Baseline transpose(dot(L, E / broadcast(D))) contracting E's dim ``contract``, D on E's
    dims ``base_b``; ranks (groups {0,1},{2,3}, E's rows sharded) transpose(dot(E, L) / D) with D
    on the result's dims ``dist_b``."""
    t, n, h, hl = "f32", 3, 4, 2
    ls, es, ds = f"{t}[{n},{h},{n}]", f"{t}[{h},{n},{n}]", f"{t}[{h},{n}]"
    base = (f"HloModule ds_base\n\nENTRY %main (l: {ls}, e: {es}, d: {ds}) -> {t}[{n},{h},{n}] {{\n"
            f"  %l = {ls} parameter(0)\n  %e = {es} parameter(1)\n  %d = {ds} parameter(2)\n"
            f"  %b = {es} broadcast({ds} %d), dimensions={base_b}\n  %p = {es} divide({es} %e, {es} %b)\n"
            f"  %z = {t}[{h},{n},{n}] dot({ls} %l, {es} %p), lhs_batch_dims={{1}}, lhs_contracting_dims={{0}}, "
            f"rhs_batch_dims={{0}}, rhs_contracting_dims={{{contract}}}{precision}\n"
            f"  ROOT %o = {t}[{n},{h},{n}] transpose({t}[{h},{n},{n}] %z), dimensions={{2,0,1}}\n}}\n")
    ll, el, dl = f"{t}[{n},{hl},{n}]", f"{t}[{hl},{n},{n}]", f"{t}[{hl},{n}]"
    dist = (f"HloModule ds_dist\n\nENTRY %main (l: {ll}, e: {el}, d: {dl}) -> {t}[{n},{hl},{n}] {{\n"
            f"  %l = {ll} parameter(0)\n  %e = {el} parameter(1)\n  %d = {dl} parameter(2)\n"
            f"  %w = {el} dot({el} %e, {ll} %l), lhs_batch_dims={{0}}, lhs_contracting_dims={{{contract}}}, "
            "rhs_batch_dims={1}, rhs_contracting_dims={0}\n"
            f"  %b = {el} broadcast({dl} %d), dimensions={dist_b}\n  %y = {el} divide({el} %w, {el} %b)\n"
            f"  ROOT %o = {t}[{n},{hl},{n}] transpose({el} %y), dimensions={{1,0,2}}\n}}\n")
    rel = {"groups": [[0, 1], [2, 3]],
           "inputs": [{"baseline": i, "distributed": i, "relation": "sharded", "dim": d} for i, d in ((0, 1), (1, 0), (2, 0))],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    return Program("dotscale", f"contract {contract}, D {base_b} / {dist_b}", base, dist, rel)


def test_dotscale_middle_contraction_control_verified() -> None:
    pytest.importorskip("jax")
    j = judge(_dotscale("{0,2}", "{0,1}", 1))
    assert j.verdict == "verified" and j.equal is True, (j.verdict, j.detail)


def test_dotscale_rank_dividing_along_the_other_dim_diverged() -> None:
    pytest.importorskip("jax")
    j = judge(_dotscale("{0,2}", "{0,2}", 1))
    assert j.equal is False and j.verdict == "diverged", (j.verdict, j.detail)


def test_dotscale_with_a_precision_attribute_not_verified() -> None:
    pytest.importorskip("jax")
    j = judge(_dotscale("{0,1}", "{0,1}", 2, ", operand_precision={highest,default}"))
    assert j.verdict != "verified", j.verdict


def _pipeline_pair(tmp_path: Path) -> tuple[Path, Path, str]:
    """torch.distributed.pipelining's 1F1B step with scale_grads=True (examples/pipeline),
    built by the CLI: its stage-0 backward power of tanh names no module."""
    pytest.importorskip("torch_xla")
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "built"
    subprocess.run([sys.executable, "-c", "from shardproof.engine.cli import main; raise SystemExit(main())", "build", "--config", str(root / "examples/pipeline/.shardproof.yml"),
                    "--models", "torch_pipe_1f1b_train_scale_grads", "--out", str(out)], check=True, cwd=root, capture_output=True)
    folder = out / "torch_pipe_1f1b_train_scale_grads"
    return folder / "baseline.hlo", folder / "relations.yaml", (folder / "distributed.hlo").read_text()


def test_moved_backward_instruction_that_differs_diverged(tmp_path: Path) -> None:
    """The unnamed backward power is compared: the pair as built is verified; the power reading
    another tanh of the stage (a stale activation), or raising to 3, is diverged with a confirmed
    witness."""
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    base, rel, dist = _pipeline_pair(tmp_path)
    found = re.search(r"(%s0\.power\.\d+) = (f32\[[\d,]+\])\{1,0\} power\((%s0\.tanh\.\d+), (%s0\.broadcast\.\d+)\), metadata=\{[^}]*op_name=\"backward\.\d+/aten__pow\"", dist)
    assert found, "no unnamed backward power in stage 0"
    power, shape, tanh, _ = found.groups()
    other = next(t for t in re.findall(r"(%s0\.tanh\.\d+) = ", dist[: found.start()]) if t != tanh)
    three = f"  %r3.three = f32[] constant(3)\n  %r3.b3 = {shape} broadcast(%r3.three), dimensions={{}}\n"
    mutants = {
        "stale": dist.replace(f"{power} = {shape}{{1,0}} power({tanh},", f"{power} = {shape}{{1,0}} power({other},"),
        "cube": dist[: found.start()].rstrip(" ") + three + "  " + dist[found.start():].replace(found.group(4), "%r3.b3", 1),
    }
    res = check_files(load_relations(rel), base, tmp_path / "built" / "torch_pipe_1f1b_train_scale_grads" / "distributed.hlo")
    assert res.verdict == "verified", res.reason
    for name, text in mutants.items():
        assert text != dist, name
        (tmp_path / f"{name}.hlo").write_text(text)
        res = check_files(load_relations(rel), base, tmp_path / f"{name}.hlo")
        assert res.verdict == "diverged", (name, res.verdict, res.reason)
        assert res.witness and res.witness.get("status") == "confirmed", (name, res.witness)
