"""Reductions over microbatch blocks (rules/microbatch.egg, mbp / mbacc): hand-written pairs,
no torch. The baseline reduces a whole batch; the distributed program cuts it into n literal
blocks, reduces each and sums the blocks' results. Verified only when the blocks are one
partition, each counted once and scaled by the same total; every bug twin is diverged with a
confirmed witness (the pair's outputs really differ in XLA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.relations import load_relations

RELATIONS = """groups: [[0]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {baseline: 1, distributed: 1, relation: duplicate}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
  - {baseline: 1, distributed: 1, relation: duplicate}
"""

SUM = """%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(f32[] %a, f32[] %b)
}
"""

# Baseline: the loss mean(x*x) over the batch of 8 and the weight gradient x^T g.
BASE = f"""HloModule mb_base

{SUM}
ENTRY %main (x: f32[8,4], g: f32[8,4]) -> (f32[], f32[4,4]) {{
  %x = f32[8,4] parameter(0)
  %g = f32[8,4] parameter(1)
  %sq = f32[8,4] multiply(f32[8,4] %x, f32[8,4] %x)
  %zero = f32[] constant(0)
  %s = f32[] reduce(f32[8,4] %sq, f32[] %zero), dimensions={{0,1}}, to_apply=%sum
  %n = f32[] constant(32)
  %loss = f32[] divide(f32[] %s, f32[] %n)
  %xt = f32[4,8] transpose(f32[8,4] %x), dimensions={{1,0}}
  %gw = f32[4,4] dot(f32[4,8] %xt, f32[8,4] %g), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %out = (f32[], f32[4,4]) tuple(f32[] %loss, f32[4,4] %gw)
}}
"""


def _block(e: int, name: str, src: str, rows: bool = True) -> str:
    lo, hi = 4 * e, 4 * e + 4
    sl = f"[{lo}:{hi}], [0:4]" if rows else f"[0:8], [{lo // 2}:{hi // 2}]"
    shape = "f32[4,4]" if rows else "f32[8,2]"
    return f"  %{name} = {shape} slice(f32[8,4] %{src}), slice={{{sl}}}\n"


def _mb_loss(e: int, m: int, per: int = 16, rows: bool = True) -> str:
    shape = "f32[4,4]" if rows else "f32[8,2]"
    return (_block(e, f"x{e}", "x", rows)
            + f"  %sq{e} = {shape} multiply({shape} %x{e}, {shape} %x{e})\n"
            + f"  %red{e} = f32[] reduce({shape} %sq{e}, f32[] %zero), dimensions={{0,1}}, to_apply=%sum\n"
            + f"  %n{e} = f32[] constant({per})\n  %mean{e} = f32[] divide(f32[] %red{e}, f32[] %n{e})\n"
            + f"  %m{e} = f32[] constant({m})\n  %l{e} = f32[] divide(f32[] %mean{e}, f32[] %m{e})\n")


def _mb_grad(e: int) -> str:
    return (_block(e, f"gx{e}", "x") + _block(e, f"gg{e}", "g")
            + f"  %gxt{e} = f32[4,4] transpose(f32[4,4] %gx{e}), dimensions={{1,0}}\n"
            + f"  %gw{e} = f32[4,4] dot(f32[4,4] %gxt{e}, f32[4,4] %gg{e}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n")


def _dist(loss_body: str, loss: str, grad_body: str, grad: str) -> str:
    return f"""HloModule mb_dist

{SUM}
ENTRY %main (x: f32[8,4], g: f32[8,4]) -> (f32[], f32[4,4]) {{
  %x = f32[8,4] parameter(0)
  %g = f32[8,4] parameter(1)
  %zero = f32[] constant(0)
{loss_body}{grad_body}  ROOT %out = (f32[], f32[4,4]) tuple(f32[] %{loss}, f32[4,4] %{grad})
}}
"""


CORRECT = _dist(_mb_loss(0, 2) + _mb_loss(1, 2) + "  %total = f32[] add(f32[] %l0, f32[] %l1)\n", "total",
                # gradients accumulated in reverse microbatch order, as GPipe's backward runs
                _mb_grad(1) + _mb_grad(0) + "  %acc = f32[4,4] add(f32[4,4] %gw1, f32[4,4] %gw0)\n", "acc")


def _check(tmp_path: Path, dist: str) -> Any:
    (tmp_path / "b.hlo").write_text(BASE)
    (tmp_path / "d.hlo").write_text(dist)
    (tmp_path / "r.yaml").write_text(RELATIONS)
    return check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo")


def test_loss_averaged_and_gradients_accumulated_over_microbatches_verified(tmp_path: Path) -> None:
    res = _check(tmp_path, CORRECT)
    assert res.verdict == "verified", res.reason


BUGS = {
    # the microbatch losses summed, not divided by M
    "loss_not_scaled": CORRECT.replace("%l0 = f32[] divide(f32[] %mean0, f32[] %m0)", "%l0 = f32[] copy(f32[] %mean0)")
                              .replace("%l1 = f32[] divide(f32[] %mean1, f32[] %m1)", "%l1 = f32[] copy(f32[] %mean1)"),
    # the loss divided by M twice (once per microbatch, once more after the sum)
    "loss_scaled_twice": CORRECT.replace("tuple(f32[] %total", "tuple(f32[] %total2").replace(
        "  %total = f32[] add(f32[] %l0, f32[] %l1)\n", "  %total = f32[] add(f32[] %l0, f32[] %l1)\n  %two = f32[] constant(2)\n  %total2 = f32[] divide(f32[] %total, f32[] %two)\n"),
    # the gradient of microbatch 0 overwrites the sum instead of adding to it
    "grad_overwritten": CORRECT.replace("f32[4,4] %acc)", "f32[4,4] %gw0)"),
    # microbatch 0 counted twice, microbatch 1 never
    "block_twice": CORRECT.replace("%acc = f32[4,4] add(f32[4,4] %gw1, f32[4,4] %gw0)", "%acc = f32[4,4] add(f32[4,4] %gw0, f32[4,4] %gw0)"),
    # block 0 cut by rows, block 1 by columns: both blocks of the batch, not one partition
    "rows_and_columns": _dist(_mb_loss(0, 2) + _mb_loss(1, 2, rows=False) + "  %total = f32[] add(f32[] %l0, f32[] %l1)\n", "total",
                              _mb_grad(1) + _mb_grad(0) + "  %acc = f32[4,4] add(f32[4,4] %gw1, f32[4,4] %gw0)\n", "acc"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_bug_twins_diverged_with_a_confirmed_witness(tmp_path: Path, bug: str) -> None:
    assert BUGS[bug] != CORRECT
    res = _check(tmp_path, BUGS[bug])
    assert res.verdict == "diverged", (bug, res.verdict, res.reason)
    assert res.witness and res.witness.get("status") == "confirmed", res.witness


def _stacked(first: int, second: int, per_m: int = 1, mean: bool = True) -> str:
    """torch.stack(losses).mean(): each microbatch's loss a plain mean of its block (divided by
    per_m), stacked along a new dim 0, summed over it and divided by the count."""
    tail = (f"  %st0 = f32[1] reshape(f32[] %l{first})\n  %st1 = f32[1] reshape(f32[] %l{second})\n"
            "  %stk = f32[2] concatenate(f32[1] %st0, f32[1] %st1), dimensions={0}\n"
            "  %ssum = f32[] reduce(f32[2] %stk, f32[] %zero), dimensions={0}, to_apply=%sum\n")
    if mean:
        tail += "  %cnt = f32[] constant(2)\n  %smean = f32[] divide(f32[] %ssum, f32[] %cnt)\n"
    return _dist(_mb_loss(0, per_m) + _mb_loss(1, per_m) + tail, "smean" if mean else "ssum",
                 _mb_grad(1) + _mb_grad(0) + "  %acc = f32[4,4] add(f32[4,4] %gw1, f32[4,4] %gw0)\n", "acc")


def test_stacked_microbatch_losses_mean_verified(tmp_path: Path) -> None:
    # torch.distributed.pipelining with scale_grads=True: plain means per microbatch, the loss
    # torch.stack(losses).mean() (rules/microbatch.egg, mbstack-*).
    res = _check(tmp_path, _stacked(0, 1))
    assert res.verdict == "verified", res.reason


STACK_BUGS = {
    "stacked_block_twice": _stacked(0, 0),  # microbatch 0's loss stacked twice, 1 never
    "stacked_not_averaged": _stacked(0, 1, mean=False),  # summed, not divided by the count
    "stacked_divided_twice": _stacked(0, 1, per_m=2),  # divided by M per microbatch and again
}


@pytest.mark.parametrize("bug", sorted(STACK_BUGS))
def test_stacked_loss_bug_twins_diverged(tmp_path: Path, bug: str) -> None:
    res = _check(tmp_path, STACK_BUGS[bug])
    assert res.verdict == "diverged", (bug, res.verdict, res.reason)
    assert res.witness and res.witness.get("status") == "confirmed", res.witness
