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
  heads (the plan says ``padded`` without blocks, the layout that code made).
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
    def __init__(self, hidden: int, heads: int, head_dim: int, tp: int, bias: bool, variant: str | None = None) -> None:
        super().__init__()
        self.tp, self.head_dim, self.variant = tp, head_dim, variant
        self.local = padded_heads(heads, tp) // tp  # heads per rank, padding included
        self.Wqkv = torch.nn.Linear(hidden, 3 * self.local * head_dim, bias=bias)
        self.o_proj = torch.nn.Linear(self.local * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd, w = self.head_dim, self.local
        qkv = self.Wqkv(x)
        # The rank's [q | k | v] of its w heads each: wrong when the weight was padded as a
        # whole, not per block.
        q, k, v = torch.tensor_split(qkv, (w * hd, 2 * w * hd), dim=2)  # BUG-SITE: whole_pad
        q = q.reshape(b, s, w, hd).transpose(1, 2)
        k = k.reshape(b, s, w, hd).transpose(1, 2)
        v = v.reshape(b, s, w, hd).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)
        probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, w * hd)
        out = self.o_proj(ctx)
        if self.tp > 1:
            dist.all_reduce(out)
        return out


def attention(ctx: BuildContext) -> Model:
    hidden, heads, head_dim = ctx.knob("hidden", 16), ctx.knob("heads", 6), ctx.knob("head_dim", 4)
    bias = ctx.knob("bias", False)
    baseline = FusedQKVAttention(hidden, heads, head_dim, 1, bias)

    def distributed(rank: int) -> FusedQKVAttention:
        return FusedQKVAttention(hidden, heads, head_dim, ctx.tp, bias, ctx.variant)

    block = heads * head_dim
    fused = {"style": "colwise", "padded": True} if ctx.variant == "whole_pad" else {"style": "colwise", "padded": True, "blocks": [block] * 3}
    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, 4, hidden))],
        plan={"Wqkv": fused, "o_proj": {"style": "rowwise", "padded": True}},
    )
