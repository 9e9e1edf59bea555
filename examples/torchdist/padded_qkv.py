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
from typing import Any

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


# ---- GQA with KV heads replicated to the degree (GQA.REPLICATE_TO_TP_DEGREE) ----------------
#
# neuronx-distributed-inference's default strategy when the degree c is a multiple of the KV
# head count K (``determine_sharding_strategy``): ``get_shardable_head_counts`` pads the query
# heads to a multiple of c and makes the KV heads c, one per rank; the checkpoint hook
# ``replicate_kv`` repeats each KV head c/K times (``repeat_interleave``), so rank r holds KV
# head floor(r·K/c), and ``maybe_pad_interleaved`` pads the query heads *within each KV group*
# (group g's Q/K heads, then (Q_pad - Q)/K zero heads), so the c/K ranks of group g split the
# group's padded heads and every query head meets its own KV head. The output projection's
# columns are padded the same way (zeros). Plan: q_proj ``padded`` within K ``head_groups``,
# k_proj / v_proj ``head_groups`` (grouped: each rank its group's block), o_proj rowwise padded
# within the groups. Variants:
#
# - ``kv_tail`` (bug): the query heads padded at the tail (CONVERT_TO_MHA's q layout) while the
#   KV heads are replicated per rank (REPLICATE_TO_TP_DEGREE's): with 6 query heads over 2 KV
#   heads at TP 4, rank 1 holds query heads 2 and 3 but only KV head 0, so head 3 attends with
#   the wrong keys;
# - ``kv_sum`` (bug): each rank adds its KV head's mean value to its partial output before the
#   all-reduce (a residual through v meant once per KV head): the replicated KV heads are
#   summed c/K times.


def repeat_kv(t: torch.Tensor, n: int) -> torch.Tensor:
    """(b, kv, s, hd) -> (b, kv·n, s, hd), each KV head n times in a row (Llama's repeat_kv,
    as neuronx-distributed-inference's attention base expands K/V for its query heads)."""
    b, kv, s, hd = t.shape
    return t[:, :, None, :, :].expand(b, kv, n, s, hd).reshape(b, kv * n, s, hd)


class ReplicatedKVAttention(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, tp: int, variant: str | None = None, bias: bool = False) -> None:
        super().__init__()
        self.hd, self.tp, self.variant = head_dim, tp, variant
        if tp == 1:
            self.q_local, self.kv_local = heads, kv_heads
        else:
            assert tp % kv_heads == 0, "REPLICATE_TO_TP_DEGREE needs the degree to be a multiple of the KV heads"
            self.q_local, self.kv_local = padded_heads(heads, tp) // tp, 1
        # q/k/v biases (Qwen2's) are laid out as their weights: replicate_kv and
        # maybe_pad_interleaved treat them alike.
        self.q_proj = torch.nn.Linear(hidden, self.q_local * head_dim, bias=bias)
        self.k_proj = torch.nn.Linear(hidden, self.kv_local * head_dim, bias=bias)
        self.v_proj = torch.nn.Linear(hidden, self.kv_local * head_dim, bias=bias)
        self.o_proj = torch.nn.Linear(self.q_local * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd, w, kv = self.hd, self.q_local, self.kv_local
        q = self.q_proj(x).view(b, s, w, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, kv, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, kv, hd).transpose(1, 2)
        # Every local query head reads the KV head of its group: the rank's one head (its query
        # heads were padded within that group), the baseline's head h // (heads / kv).
        k, v = repeat_kv(k, w // kv), repeat_kv(v, w // kv)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(hd)  # BUG-SITE: kv_tail
        probs = torch.softmax(scores.float(), dim=-1).type_as(q)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, w * hd)
        out = self.o_proj(ctx)
        if self.variant == "kv_sum":
            out = out + v.mean(dim=1)[:, :, :1].expand(b, s, out.shape[-1])  # BUG-SITE: kv_sum
        if self.tp > 1:
            dist.all_reduce(out)
        return out


def replicated_kv(ctx: BuildContext) -> Model:
    hidden, heads, kv_heads, head_dim = ctx.knob("hidden", 16), ctx.knob("heads", 6), ctx.knob("kv_heads", 2), ctx.knob("head_dim", 4)
    bias = ctx.knob("bias", False)
    baseline = ReplicatedKVAttention(hidden, heads, kv_heads, head_dim, 1, ctx.variant, bias)

    def distributed(rank: int) -> ReplicatedKVAttention:
        return ReplicatedKVAttention(hidden, heads, kv_heads, head_dim, ctx.tp, ctx.variant, bias)

    q_layout: dict[str, Any] = {"style": "colwise", "padded": True} if ctx.variant == "kv_tail" else {"style": "colwise", "padded": True, "head_groups": kv_heads}
    o_layout: dict[str, Any] = {"style": "rowwise", "padded": True} if ctx.variant == "kv_tail" else {"style": "rowwise", "padded": True, "head_groups": kv_heads}
    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, 4, hidden))],
        plan={"q_proj": q_layout, "k_proj": {"style": "colwise", "head_groups": kv_heads}, "v_proj": {"style": "colwise", "head_groups": kv_heads}, "o_proj": o_layout},
    )
