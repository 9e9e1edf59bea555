"""Multi-head attention with a fused QKV projection whose heads do not divide over the ranks,
laid out as neuronx-distributed-inference lays out ``GroupQueryAttention_QKV(fused_qkv=True)``
for multi-head attention (``GQA.CONVERT_TO_MHA``): the head count is padded to a multiple of
the degree (``get_number_of_extra_heads``), q, k and v are each padded at their tail with zero
heads (``maybe_pad_tail``) and concatenated into one ``Wqkv`` that ``ColumnParallelLinear``
splits block by block, so rank r holds its heads of q, of k and of v. The forward cuts the
rank's projection with ``torch.tensor_split`` at the per-rank widths, attends per head, and the
output projection (``RowParallelLinear`` over the padded heads, zero columns) ends in an
all-reduce. The baseline is the same module at a degree of one (no padding).

The plan says how the weights are held: ``Wqkv`` is ``colwise`` padded in blocks
(``{"padded": true, "blocks": [q, k, v]}``), ``o_proj`` ``rowwise`` padded. Variants:

- ``whole_pad``: the checkpoint was padded once after the whole fused weight (q, k, v, then
  the padding) and split evenly, while the forward still cuts per block: rank 0's k is q's
  heads (the plan says ``padded`` without blocks, the layout that code made);
- ``bias_repeat`` (correct): a fused bias added after the cut, q, k and v each their block,
  the rank picking its columns of each bias block out of the whole (replicated) bias at
  rank·w + arange(w), the pick clamped to the last column past the end (padding by repeating
  it): the padded heads are non-zero, but the output projection is zero-padded;
- ``head_leak``: as ``bias_repeat`` and the output projection's columns picked the same way
  out of the whole weight: padding by repeating instead of zeros on both sides, so the padded
  heads' contexts (non-zero: the repeated bias) reach the output.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def padded_heads(heads: int, tp: int) -> int:
    """The head count padded to a multiple of the degree (neuronx's extra heads)."""
    return -(-heads // tp) * tp


class FusedQKVAttention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, tp: int, bias: bool, variant: str | None = None, rank: int = 0) -> None:
        super().__init__()
        self.tp, self.head_dim, self.variant, self.rank = tp, head_dim, variant, rank
        self.local = padded_heads(heads, tp) // tp  # heads per rank, padding included
        self.leak = variant == "head_leak"
        self.pick_bias = variant in ("head_leak", "bias_repeat")
        self.Wqkv = torch.nn.Linear(hidden, 3 * self.local * head_dim, bias=bias and not self.pick_bias)
        if self.pick_bias:
            # The whole fused bias, each rank picking its columns of each block.
            self.qkv_bias = torch.nn.Parameter(torch.empty(3 * heads * head_dim))
        if self.leak:
            self.o_full = torch.nn.Linear(heads * head_dim, hidden, bias=False)
        else:
            self.o_proj = torch.nn.Linear(self.local * head_dim, hidden, bias=False)

    def _own(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        """The rank's w·hd columns at rank·w·hd + arange(w·hd); past the end XLA's gather
        clamps to the last one (padding by repeating it)."""
        width = self.local * self.head_dim
        if self.tp == 1:
            return t
        return torch.index_select(t, dim, self.rank * width + torch.arange(width, device=t.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd, w = self.head_dim, self.local
        qkv = self.Wqkv(x)
        # The rank's [q | k | v] of its w heads each: wrong when the weight was padded as a
        # whole, not per block.
        q, k, v = torch.tensor_split(qkv, (w * hd, 2 * w * hd), dim=2)  # BUG-SITE: whole_pad
        if self.pick_bias:
            qb, kb, vb = torch.chunk(self.qkv_bias, 3)
            q, k, v = q + self._own(qb, 0), k + self._own(kb, 0), v + self._own(vb, 0)
        q = q.reshape(b, s, w, hd).transpose(1, 2)
        k = k.reshape(b, s, w, hd).transpose(1, 2)
        v = v.reshape(b, s, w, hd).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
        probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, w * hd)
        if self.leak:
            out = torch.nn.functional.linear(ctx, self._own(self.o_full.weight, 1))  # BUG-SITE: head_leak
        else:
            out = self.o_proj(ctx)
        if self.tp > 1:
            dist.all_reduce(out)
        return out


def attention(ctx: BuildContext) -> Model:
    hidden, heads, head_dim = ctx.knob("hidden", 16), ctx.knob("heads", 6), ctx.knob("head_dim", 4)
    bias = ctx.knob("bias", False)
    # The picks of the bias (and of the output projection) are the code's, at every degree.
    baseline = FusedQKVAttention(hidden, heads, head_dim, 1, bias, ctx.variant if ctx.variant in ("head_leak", "bias_repeat") else None)

    def distributed(rank: int) -> FusedQKVAttention:
        return FusedQKVAttention(hidden, heads, head_dim, ctx.tp, bias, ctx.variant, rank)

    block = heads * head_dim
    fused = {"style": "colwise", "padded": True} if ctx.variant == "whole_pad" else {"style": "colwise", "padded": True, "blocks": [block] * 3}
    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, 4, hidden))],
        plan={"Wqkv.weight" if ctx.variant in ("head_leak", "bias_repeat") else "Wqkv": fused, "o_proj": {"style": "rowwise", "padded": True}},
    )
