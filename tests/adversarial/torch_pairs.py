"""Adversarial pairs written with torch and traced with torch-xla (``generate.py`` runs this file
in a subprocess of its own, so torch-xla and the oracle's jax never share a process).

Each pair is a baseline function on whole tensors and a distributed function that one rank of a
group of ``C`` runs. They are written the way other codebases write these layers (Megatron-LM,
torch-xla's own examples, Hugging Face), deliberately *not* the way ``examples/tplm`` writes
them. Names starting ``c_`` are correct programs, ``b_`` carry one subtle bug; the description
says which form or which bug.

    python tests/adversarial/torch_pairs.py --out DIR [names...]

writes ``DIR/<name>/{baseline.hlo, distributed.hlo, relations.yaml, pair.yaml}`` and, for pairs
whose text elides literals, ``baseline.full.hlo`` / ``distributed.full.hlo`` (what the oracle
runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

C = 4  # ranks per group
S, H, F, V = 8, 16, 32, 32  # sequence, hidden, MLP and vocabulary sizes
NH = 4  # attention heads (one per rank); head size H // NH
HD = H // NH


@dataclass(frozen=True)
class In:
    """One input: its whole shape and how the ranks hold it."""

    name: str
    shape: tuple[int, ...]
    relation: str = "duplicate"  # duplicate | sharded | rank
    dim: int | None = None
    dtype: str = "float32"
    int_range: tuple[int, int] | None = None
    blocks: tuple[int, ...] | None = None

    def local_shape(self) -> tuple[int, ...]:
        if self.relation != "sharded":
            return self.shape
        assert self.dim is not None
        shape = list(self.shape)
        shape[self.dim] //= C
        return tuple(shape)


@dataclass(frozen=True)
class TorchPair:
    name: str
    description: str
    inputs: tuple[In, ...]
    outputs: tuple[tuple[str, int | None], ...]  # (relation, dim) per output
    baseline: Callable[..., Any]
    distributed: Callable[..., Any]
    elide: bool = False  # write the text with torch-xla's elided literals ({...})
    groups: list[list[int]] = field(default_factory=lambda: [list(range(C))])

    @property
    def kind(self) -> str:
        return "bug" if self.name.startswith("b_") else "correct"


# ---------------------------------------------------------------------------------------------
# Collectives: torch-xla's own entry points (bound in main, after torch_xla is imported).

_X: dict[str, Any] = {}
GROUP = [list(range(C))]


def all_reduce(t: Any, groups: list[list[int]] = GROUP, op: str = "sum") -> Any:
    return _X["spmd_all_reduce"](op, t, 1.0, groups)


def reduce_scatter(t: Any, dim: int, groups: list[list[int]] = GROUP) -> Any:
    return _X["spmd_reduce_scatter"]("sum", t, 1.0, dim, len(groups[0]), groups)


def all_gather(t: Any, dim: int, groups: list[list[int]] = GROUP) -> Any:
    return _X["xm"].all_gather(t, dim, groups=groups, pin_layout=False)


# ---------------------------------------------------------------------------------------------
# Torch helpers (imported lazily so that importing this module is cheap).


def _t() -> Any:
    import torch

    return torch


def _f() -> Any:
    import torch.nn.functional as F

    return F


def rms_norm(x: Any, w: Any, eps: float = 1e-6) -> Any:
    torch = _t()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# --- row-parallel linear (Megatron RowParallelLinear) and its bias -----------------------------


def row_base(x: Any, w: Any, b: Any | None = None) -> tuple[Any, ...]:
    return (_f().linear(x, w, b),)


def row_inputs(bias: bool = False) -> tuple[In, ...]:
    ins = (In("x", (S, H), "sharded", 1), In("w", (H, H), "sharded", 1))
    return (*ins, In("b", (H,))) if bias else ins


def c_ar_reordered_groups(x: Any, w: Any) -> tuple[Any, ...]:
    return (all_reduce(_f().linear(x, w), [[0, 2, 1, 3]]),)


def b_ar_strided_groups(x: Any, w: Any) -> tuple[Any, ...]:
    # two sums of two ranks each, [[0, 2], [1, 3]]: type-checks, reduces half the terms
    return (all_reduce(_f().linear(x, w), [[0, 2], [1, 3]]),)


def c_bias_div_c_before_ar(x: Any, w: Any, b: Any) -> tuple[Any, ...]:
    return (all_reduce(_f().linear(x, w) + b / C),)


def b_bias_in_linear_before_ar(x: Any, w: Any, b: Any) -> tuple[Any, ...]:
    # every rank adds the bias inside F.linear, then the sum counts it C times
    return (all_reduce(_f().linear(x, w, b)),)


def c_bias_rank0_guard(x: Any, w: Any, b: Any, rank: Any) -> tuple[Any, ...]:
    torch = _t()
    guard = (rank == 0).to(torch.float32)
    return (all_reduce(_f().linear(x, w) + b * guard),)


def b_bias_guard_le1(x: Any, w: Any, b: Any, rank: Any) -> tuple[Any, ...]:
    torch = _t()
    guard = (rank <= 1).to(torch.float32)  # two ranks add the bias
    return (all_reduce(_f().linear(x, w) + b * guard),)


def c_scale_before_ar(x: Any, w: Any) -> tuple[Any, ...]:
    return (all_reduce(_f().linear(x, w) * 0.125),)


def scale_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w) * 0.125,)


def b_scale_one_rank(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    torch = _t()
    s = torch.where(rank == 3, 0.126, 0.125)  # the last rank's constant is off
    return (all_reduce(_f().linear(x, w) * s),)


def act_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().gelu(_f().linear(x, w)),)


def b_fp16_activation_roundtrip(x: Any, w: Any) -> tuple[Any, ...]:
    torch = _t()
    y = all_reduce(_f().linear(x, w)).to(torch.float16).to(torch.float32)  # an fp16 hop
    return (_f().gelu(y),)


def b_bf16_partial_ar(x: Any, w: Any) -> tuple[Any, ...]:
    torch = _t()
    partial = _f().linear(x, w).to(torch.bfloat16)  # the sum runs in bf16
    return (all_reduce(partial).to(torch.float32),)


# --- column-parallel with a division chain ----------------------------------------------------


def div_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w) / (3.0 * 7.0),)


def c_div_chain(x: Any, w: Any) -> tuple[Any, ...]:
    return ((_f().linear(x, w) / 3.0) / 7.0,)


def b_div_precedence(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w) / 3.0 * 7.0,)  # x / a * b read as x / (a * b)


# --- gathered weights --------------------------------------------------------------------------


def gw_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w),)


def c_allgather_transposed_shard(x: Any, w: Any) -> tuple[Any, ...]:
    wt = all_gather(w.t(), 1)  # (H, F): the transposed shards side by side
    return (x @ wt,)


def b_gathered_weight_untransposed(x: Any, w: Any) -> tuple[Any, ...]:
    full = all_gather(w, 0)  # (H, H) == w, then used as if it were w^T
    return (x @ full,)


# --- vocab-parallel embedding, Megatron's VocabParallelEmbedding -------------------------------


def emb_base(ids: Any, table: Any) -> tuple[Any, ...]:
    return (_f().embedding(ids, table),)


def _vocab_embedding(ids: Any, table: Any, rank: Any, shift: int = 0, gt: bool = False) -> Any:
    per = table.shape[0]
    start = rank * per + shift
    end = start + per
    mask = (ids < start) | ((ids > end) if gt else (ids >= end))
    masked = (ids - start).masked_fill(mask, 0)
    out = _f().embedding(masked, table)
    out = out.masked_fill(mask.unsqueeze(-1), 0.0)
    return all_reduce(out)


def c_megatron_vocab_mask(ids: Any, table: Any, rank: Any) -> tuple[Any, ...]:
    return (_vocab_embedding(ids, table, rank),)


def b_vocab_mask_gt_end(ids: Any, table: Any, rank: Any) -> tuple[Any, ...]:
    return (_vocab_embedding(ids, table, rank, gt=True),)


def b_vocab_start_off_by_one(ids: Any, table: Any, rank: Any) -> tuple[Any, ...]:
    return (_vocab_embedding(ids, table, rank, shift=1),)


# --- gather then chunk then concat --------------------------------------------------------------


def tanh_base(x: Any) -> tuple[Any, ...]:
    return (_t().tanh(x),)


def c_gather_chunk_concat(x: Any) -> tuple[Any, ...]:
    torch = _t()
    g = all_gather(x, 0)  # (C*S, H/C): gathered along the wrong dim first
    return (torch.tanh(torch.cat(g.chunk(C, 0), dim=1)),)


def b_gather_chunk_concat_reversed(x: Any) -> tuple[Any, ...]:
    torch = _t()
    g = all_gather(x, 0)
    return (torch.tanh(torch.cat(list(reversed(g.chunk(C, 0))), dim=1)),)


# --- sequence parallel: reduce-scatter + all-gather --------------------------------------------

SQ = 16  # square (S == H) sequence-parallel block: a wrong scatter dim still type-checks


def sp_base(x: Any, nw: Any, w_up: Any, w_down: Any) -> tuple[Any, ...]:
    F = _f()
    return (x + F.linear(F.gelu(F.linear(rms_norm(x, nw), w_up)), w_down),)


def _sp(x: Any, nw: Any, w_up: Any, w_down: Any, scatter_dim: int) -> Any:
    F = _f()
    h = all_gather(rms_norm(x, nw), 0)
    y = reduce_scatter(F.linear(F.gelu(F.linear(h, w_up)), w_down), scatter_dim)
    return all_gather(x + y.reshape(x.shape), 0)  # the reshape is a no-op for the right dim


def c_sp_rs_ag(x: Any, nw: Any, w_up: Any, w_down: Any) -> tuple[Any, ...]:
    return (_sp(x, nw, w_up, w_down, 0),)


def b_sp_rs_wrong_dim(x: Any, nw: Any, w_up: Any, w_down: Any) -> tuple[Any, ...]:
    return (_sp(x, nw, w_up, w_down, 1),)


# --- pointwise vs reshape ---------------------------------------------------------------------


def pr_base(x: Any) -> tuple[Any, ...]:
    return (_f().gelu(x).reshape(S, 4, H // 4),)


def c_pointwise_after_reshape(x: Any) -> tuple[Any, ...]:
    return (_f().gelu(x.reshape(S // C, 4, H // 4)),)


def b_reshape_transposed_layout(x: Any) -> tuple[Any, ...]:
    return (_f().gelu(x.reshape(S // C, H // 4, 4).transpose(1, 2)),)


# --- cumsum ------------------------------------------------------------------------------------


def cs_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_t().cumsum(_f().linear(x, w), 1),)


def c_cumsum_nonsharded_dim(x: Any, w: Any) -> tuple[Any, ...]:
    return (_t().cumsum(_f().linear(x, w), 1),)


def cs0_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_t().cumsum(_f().linear(x, w), 0),)


def b_cumsum_sharded_dim_local(x: Any, w: Any) -> tuple[Any, ...]:
    return (_t().cumsum(_f().linear(x, w), 0),)  # no carry from the ranks before


def _cumsum_carry(x: Any, w: Any, rank: Any, inclusive: bool) -> tuple[Any, ...]:
    torch = _t()
    y = _f().linear(x, w)
    totals = all_gather(y.sum(0, keepdim=True), 0)  # (C, H): rank k's column totals at row k
    k = torch.arange(C, device=y.device)
    before = (k <= rank) if inclusive else (k < rank)
    return (y.cumsum(0) + (totals * before.unsqueeze(1).to(y.dtype)).sum(0),)


def flip0_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w).flip(0),)


def _mirror_rows(x: Any, w: Any, rank: Any, flip: bool) -> tuple[Any, ...]:
    torch = _t()
    g = all_gather(_f().linear(x, w), 0)  # (S, H) on every rank
    n = S // C
    rows = (C - 1 - rank.to(torch.int64)) * n + torch.arange(n, device=g.device)
    block = g.index_select(0, rows)  # block c-1-r of the rows
    return (block.flip(0) if flip else block,)


def c_reverse_sharded_dim_mirror_rows(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _mirror_rows(x, w, rank, True)  # reverse of the rows sharded along 0


def b_reverse_sharded_dim_mirror_no_flip(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _mirror_rows(x, w, rank, False)  # the mirrored block, not reversed within


def c_cumsum_sharded_dim_carry(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _cumsum_carry(x, w, rank, False)  # local cumsum + totals of the ranks before


def b_cumsum_sharded_dim_inclusive_carry(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _cumsum_carry(x, w, rank, True)  # also adds the rank's own total


# --- one-hot rank selects -------------------------------------------------------------------------


def sel_base(x: Any) -> tuple[Any, ...]:
    return (x * 2.0,)


def _onehot(x: Any, rank: Any, shift: int) -> Any:
    torch = _t()
    w = H // C
    out = torch.zeros(S, w, dtype=x.dtype, device=x.device)
    for j in range(C):
        hit = (rank == (j + shift) % C).to(x.dtype)
        out = out + hit * x[:, j * w : (j + 1) * w]
    return out * 2.0


def c_onehot_rank_select(x: Any, rank: Any) -> tuple[Any, ...]:
    return (_onehot(x, rank, 0),)


def b_onehot_rotated(x: Any, rank: Any) -> tuple[Any, ...]:
    return (_onehot(x, rank, 1),)


# --- log-softmax over a vocab-sharded dim ------------------------------------------------------


def lsm_base(x: Any) -> tuple[Any, ...]:
    return (_t().log_softmax(x, dim=-1),)


def _log_softmax(x: Any, reduce_sum: bool) -> Any:
    torch = _t()
    m = all_reduce(x.max(dim=-1, keepdim=True)[0], op="max")
    s = torch.exp(x - m).sum(dim=-1, keepdim=True)
    if reduce_sum:
        s = all_reduce(s)
    return x - m - torch.log(s)


def c_log_softmax_vocab(x: Any) -> tuple[Any, ...]:
    return (_log_softmax(x, True),)


def b_log_softmax_local_sum(x: Any) -> tuple[Any, ...]:
    return (_log_softmax(x, False),)


def hot_softmax_base(x: Any) -> tuple[Any, ...]:
    return (_t().softmax(x * 50.0, dim=-1),)  # temperature 0.02: logits up to ~200


def b_softmax_no_max_subtraction(x: Any) -> tuple[Any, ...]:
    torch = _t()
    e = torch.exp(x * 50.0)  # no max subtracted: exp overflows to inf in f32 for logits > 88
    return (e / all_reduce(e.sum(dim=-1, keepdim=True)),)


def c_softmax_max_subtracted(x: Any) -> tuple[Any, ...]:
    torch = _t()
    z = x * 50.0
    e = torch.exp(z - all_reduce(z.amax(dim=-1, keepdim=True), op="max"))
    return (e / all_reduce(e.sum(dim=-1, keepdim=True)),)


# --- LayerNorm over a hidden-sharded dim --------------------------------------------------------


def ln_base(x: Any, g: Any) -> tuple[Any, ...]:
    return (_f().layer_norm(x, (H,), g, None, 1e-5),)


def _layer_norm(x: Any, g: Any, var_reduced: bool) -> Any:
    torch = _t()
    mean = all_reduce(x.sum(-1, keepdim=True)) / H
    d = x - mean
    sq = (d * d).sum(-1, keepdim=True)
    var = all_reduce(sq) / H if var_reduced else sq / (H // C)
    return d * torch.rsqrt(var + 1e-5) * g


def c_layernorm_hidden_sharded(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm(x, g, True),)


def b_layernorm_local_var(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm(x, g, False),)


# --- attention --------------------------------------------------------------------------------


def _attn(q: Any, k: Any, v: Any, scale: float) -> Any:
    torch = _t()
    return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * scale, -1), v)


def mqa_base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    F = _f()
    q = F.linear(x, wq).reshape(S, NH, HD).transpose(0, 1)  # (NH, S, HD)
    k = F.linear(x, wk)[None]  # one KV head shared by all query heads
    v = F.linear(x, wv)[None]
    ctx = _attn(q, k, v, 1.0 / math.sqrt(HD)).transpose(0, 1).reshape(S, H)
    return (F.linear(ctx, wo),)


def _mqa(x: Any, wq: Any, wk: Any, wv: Any, wo: Any, double: bool) -> Any:
    F = _f()
    nl = NH // C
    scale = 1.0 / math.sqrt(HD)
    q = F.linear(x, wq).reshape(S, nl, HD).transpose(0, 1)
    if double:
        q = q * scale  # pre-scaled queries, and the scores are scaled again below
    k = F.linear(x, wk)[None]
    v = F.linear(x, wv)[None]
    ctx = _attn(q, k, v, scale).transpose(0, 1).reshape(S, nl * HD)
    return all_reduce(F.linear(ctx, wo))


def c_mqa_replicated_kv(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    return (_mqa(x, wq, wk, wv, wo, False),)


def b_mqa_double_scale(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    return (_mqa(x, wq, wk, wv, wo, True),)


B = 2


def bh_base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    F = _f()
    q = F.linear(x, wq).reshape(B, S, NH, HD).transpose(1, 2)  # (B, NH, S, HD)
    k = F.linear(x, wk).reshape(B, S, NH, HD).transpose(1, 2)
    v = F.linear(x, wv).reshape(B, S, NH, HD).transpose(1, 2)
    ctx = _attn(q, k, v, HD**-0.5).transpose(1, 2).reshape(B, S, H)
    return (F.linear(ctx, wo),)


def _merged_bh(x: Any, wq: Any, wk: Any, wv: Any, wo: Any, swap: bool) -> Any:
    torch, F = _t(), _f()
    nl = NH // C * 2  # two heads per rank here: NH2 heads
    hd = HD // 2

    def split(t: Any) -> Any:  # (B, S, nl*hd) -> (B*nl, S, hd), batch and heads merged
        return t.reshape(B, S, nl, hd).permute(0, 2, 1, 3).reshape(B * nl, S, hd)

    q, k, v = split(F.linear(x, wq)), split(F.linear(x, wk)), split(F.linear(x, wv))
    p = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * hd**-0.5, -1)
    ctx = torch.bmm(p, v)
    if swap:
        ctx = ctx.reshape(nl, B, S, hd).permute(1, 2, 0, 3)  # un-merged as (heads, batch)
    else:
        ctx = ctx.reshape(B, nl, S, hd).permute(0, 2, 1, 3)
    return all_reduce(F.linear(ctx.reshape(B, S, nl * hd), wo))


def bh2_base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    F = _f()
    nh, hd = NH * 2, HD // 2
    q = F.linear(x, wq).reshape(B, S, nh, hd).transpose(1, 2)
    k = F.linear(x, wk).reshape(B, S, nh, hd).transpose(1, 2)
    v = F.linear(x, wv).reshape(B, S, nh, hd).transpose(1, 2)
    ctx = _attn(q, k, v, hd**-0.5).transpose(1, 2).reshape(B, S, H)
    return (F.linear(ctx, wo),)


def c_sdpa_merged_batch_heads(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    return (_merged_bh(x, wq, wk, wv, wo, False),)


def b_sdpa_unmerge_swapped(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> tuple[Any, ...]:
    return (_merged_bh(x, wq, wk, wv, wo, True),)


# --- GQA: KV projections replicated, each rank picks its KV head by rank // 2 -----------------

NKV = 2


def gqa_base(x: Any, wq: Any, wkv: Any, wo: Any) -> tuple[Any, ...]:
    F = _f()
    q = F.linear(x, wq).reshape(S, NH, HD).transpose(0, 1)
    kv = F.linear(x, wkv).reshape(S, 2, NKV, HD)
    k = kv[:, 0].transpose(0, 1).repeat_interleave(NH // NKV, 0)
    v = kv[:, 1].transpose(0, 1).repeat_interleave(NH // NKV, 0)
    ctx = _attn(q, k, v, HD**-0.5).transpose(0, 1).reshape(S, H)
    return (F.linear(ctx, wo),)


def gqa_tile_base(x: Any, wq: Any, wkv: Any, wo: Any) -> tuple[Any, ...]:
    """KV heads tiled ([kv0, kv1, kv0, kv1], .repeat) instead of interleaved: head h uses h % 2."""
    F = _f()
    q = F.linear(x, wq).reshape(S, NH, HD).transpose(0, 1)
    kv = F.linear(x, wkv).reshape(S, 2, NKV, HD)
    k = kv[:, 0].transpose(0, 1).repeat(NH // NKV, 1, 1)
    v = kv[:, 1].transpose(0, 1).repeat(NH // NKV, 1, 1)
    ctx = _attn(q, k, v, HD**-0.5).transpose(0, 1).reshape(S, H)
    return (F.linear(ctx, wo),)


def _gqa(x: Any, wq: Any, wkv: Any, wo: Any, rank: Any, modulo: bool) -> Any:
    F = _f()
    q = F.linear(x, wq).reshape(S, 1, HD).transpose(0, 1)  # this rank's one query head
    kv = F.linear(x, wkv).reshape(S, 2, NKV, HD)  # every KV head, replicated
    head = rank % NKV if modulo else rank // (C // NKV)
    k = kv[:, 0].index_select(1, head.reshape(1)).transpose(0, 1)
    v = kv[:, 1].index_select(1, head.reshape(1)).transpose(0, 1)
    ctx = _attn(q, k, v, HD**-0.5).transpose(0, 1).reshape(S, HD)
    return all_reduce(F.linear(ctx, wo))


def c_gqa_kv_rank_div(x: Any, wq: Any, wkv: Any, wo: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa(x, wq, wkv, wo, rank, False),)


def b_gqa_kv_rank_mod(x: Any, wq: Any, wkv: Any, wo: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa(x, wq, wkv, wo, rank, True),)


# --- MoE top-1, experts sharded over the ranks ---------------------------------------------------

E, T = 8, 8  # experts, tokens
EL = E // C


def _expert(x: Any, w1: Any, w2: Any) -> Any:
    F = _f()
    return F.linear(F.silu(F.linear(x, w1)), w2)


def moe_base(x: Any, router: Any, w1: Any, w2: Any) -> tuple[Any, ...]:
    torch = _t()
    probs = torch.softmax(x @ router.t(), -1)
    gate, idx = probs.max(-1)
    out = torch.zeros_like(x)
    for e in range(E):
        sel = (idx == e).to(x.dtype) * gate
        out = out + sel[:, None] * _expert(x, w1[e], w2[e])
    return (out,)


def _moe(x: Any, router: Any, w1: Any, w2: Any, rank: Any, shift: int) -> Any:
    torch = _t()
    probs = torch.softmax(x @ router.t(), -1)
    gate, idx = probs.max(-1)
    out = torch.zeros_like(x)
    for e in range(EL):
        sel = (idx == rank * EL + e + shift).to(x.dtype) * gate
        out = out + sel[:, None] * _expert(x, w1[e], w2[e])
    return all_reduce(out)


def c_moe_top1_local_experts(x: Any, router: Any, w1: Any, w2: Any, rank: Any) -> tuple[Any, ...]:
    return (_moe(x, router, w1, w2, rank, 0),)


def b_moe_expert_offset(x: Any, router: Any, w1: Any, w2: Any, rank: Any) -> tuple[Any, ...]:
    return (_moe(x, router, w1, w2, rank, 1),)


# --- mean over a sharded dim -----------------------------------------------------------------


def mean_base(x: Any) -> tuple[Any, ...]:
    return (x.mean(0),)


def c_mean_of_means(x: Any) -> tuple[Any, ...]:
    return (all_reduce(x.mean(0)) / C,)


def b_mean_of_means_undivided(x: Any) -> tuple[Any, ...]:
    return (all_reduce(x.mean(0)),)


# --- Megatron's vocab-parallel cross entropy ----------------------------------------------------


def ce_base(logits: Any, target: Any) -> tuple[Any, ...]:
    return (_f().cross_entropy(logits, target.long(), reduction="none"),)


def _ce(logits: Any, target: Any, rank: Any, mask_predicted: bool) -> Any:
    torch = _t()
    logits_max = all_reduce(logits.max(dim=-1)[0], op="max")
    logits = logits - logits_max.unsqueeze(-1)
    per = logits.shape[-1]
    start = rank * per
    end = start + per
    mask = (target < start) | (target >= end)
    masked_target = (target - start).masked_fill(mask, 0)
    predicted = torch.gather(logits, 1, masked_target.long().unsqueeze(-1)).squeeze(-1)
    if mask_predicted:
        predicted = predicted.masked_fill(mask, 0.0)
    predicted = all_reduce(predicted)
    sum_exp = all_reduce(torch.exp(logits).sum(dim=-1))
    return torch.log(sum_exp) - predicted


def c_megatron_cross_entropy(logits: Any, target: Any, rank: Any) -> tuple[Any, ...]:
    return (_ce(logits, target, rank, True),)


def b_ce_predicted_unmasked(logits: Any, target: Any, rank: Any) -> tuple[Any, ...]:
    return (_ce(logits, target, rank, False),)


# --- rotary positions under sequence parallelism --------------------------------------------------


def _rotary(x: Any, pos: Any) -> Any:
    torch = _t()
    half = H // 2
    inv = 1.0 / (10000.0 ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = pos.to(torch.float32)[:, None] * inv[None, :]
    x1, x2 = x[:, :half], x[:, half:]
    cos, sin = torch.cos(ang), torch.sin(ang)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_base(x: Any) -> tuple[Any, ...]:
    torch = _t()
    return (_rotary(x, torch.arange(S, device=x.device)),)


def c_rotary_sp_positions(x: Any, rank: Any) -> tuple[Any, ...]:
    torch = _t()
    sl = S // C
    return (_rotary(x, rank * sl + torch.arange(sl, device=x.device)),)


def b_rotary_sp_no_offset(x: Any, rank: Any) -> tuple[Any, ...]:
    torch = _t()
    return (_rotary(x, torch.arange(S // C, device=x.device)),)  # every rank restarts at 0


# --- SwiGLU with a fused gate/up weight --------------------------------------------------------


def swiglu_base(x: Any, w_gu: Any, w_down: Any) -> tuple[Any, ...]:
    F = _f()
    g, u = F.linear(x, w_gu).chunk(2, -1)
    return (F.linear(F.silu(g) * u, w_down),)


def c_swiglu_fused_blocks(x: Any, w_gu: Any, w_down: Any) -> tuple[Any, ...]:
    F = _f()
    g, u = F.linear(x, w_gu).chunk(2, -1)
    return (all_reduce(F.linear(F.silu(g) * u, w_down)),)


def b_swiglu_gate_up_swapped(x: Any, w_gu: Any, w_down: Any) -> tuple[Any, ...]:
    F = _f()
    u, g = F.linear(x, w_gu).chunk(2, -1)
    return (all_reduce(F.linear(F.silu(g) * u, w_down)),)


# --- split along the first dim after an all-reduce (Megatron's _split_along_first_dim) --------


def split_base(x: Any, w: Any) -> tuple[Any, ...]:
    return (_f().linear(x, w),)


def _split(x: Any, w: Any, rank: Any, reverse: bool) -> Any:
    full = all_reduce(_f().linear(x, w))
    sl = S // C
    start = ((C - 1 - rank) if reverse else rank) * sl
    return _dyn_rows(full, start, sl)


def _dyn_rows(full: Any, start: Any, n: Any) -> Any:
    torch = _t()
    idx = start + torch.arange(n, device=full.device)
    return full.index_select(0, idx)


def c_allreduce_then_rank_rows(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return (_split(x, w, rank, False),)


def b_rank_rows_reversed(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return (_split(x, w, rank, True),)


# --- a stack of identical layers (the verifier folds repeated layers) ---------------------------

LAYERS = 6


def _scope(name: str) -> object:
    """Hold the result while the layer's ops are created: their op_name carries the path."""
    return _X["scope"](name)


def deep_base(x: Any, **w: Any) -> tuple[Any, ...]:
    F = _f()
    for k in range(LAYERS):
        scope = _scope(f"model.layers.{k}")
        x = x + F.linear(F.gelu(F.linear(x, w[f"up{k}"])), w[f"down{k}"])
        del scope
    return (x,)


def _deep(x: Any, w: dict[str, Any], up_of: Callable[[int], int]) -> Any:
    F = _f()
    for k in range(LAYERS):
        scope = _scope(f"model.layers.{k}")
        x = x + all_reduce(F.linear(F.gelu(F.linear(x, w[f"up{up_of(k)}"])), w[f"down{k}"]))
        del scope
    return x


def c_deep_layers(x: Any, **w: Any) -> tuple[Any, ...]:
    return (_deep(x, w, lambda k: k),)


def b_deep_up_weights_swapped(x: Any, **w: Any) -> tuple[Any, ...]:
    # layers 3 and 4 load each other's up-projection (a layer-index mix-up at load time); every
    # layer's text is the same, so the fold sees six identical blocks
    return (_deep(x, w, lambda k: {3: 4, 4: 3}.get(k, k)),)


def b_deep_layers_swapped(x: Any, **w: Any) -> tuple[Any, ...]:
    # layers 2 and 3 run in the other order (their weights swapped as a whole)
    F = _f()
    order = [0, 1, 3, 2, 4, 5]
    for k in range(LAYERS):
        scope = _scope(f"model.layers.{k}")
        j = order[k]
        x = x + all_reduce(F.linear(F.gelu(F.linear(x, w[f"up{j}"])), w[f"down{j}"]))
        del scope
    return (x,)


# --- elided literal: torch-xla prints a constant of more than 10 elements as {...} -----------


def cos_table(first: int) -> Callable[..., tuple[Any, ...]]:
    def fn(x: Any) -> tuple[Any, ...]:
        torch = _t()
        t = torch.arange(first, first + 16, device=x.device, dtype=torch.float32)
        return (x * torch.cos(t * 0.1),)

    return fn


def cos_table_dist(first: int) -> Callable[..., tuple[Any, ...]]:
    inner = cos_table(first)

    def fn(x: Any) -> tuple[Any, ...]:
        return inner(x)

    return fn


# --- production spellings of issue 25 (engineer E's gaps) ---------------------------------------


def all_to_all(t: Any, split: int, concat: int, groups: list[list[int]] = GROUP) -> Any:
    return _X["xm"].all_to_all(t, split, concat, len(groups[0]), groups=groups, pin_layout=False)


def _layer_norm_sumsq(x: Any, g: Any, reduce_s: bool) -> Any:
    """LayerNorm over a hidden-sharded dim written as XLA expands F.layer_norm (batch-norm-
    training): var = E[x^2] - E[x]^2, from the all-reduced sum and sum of squares."""
    torch = _t()
    s, sq = x.sum(-1, keepdim=True), (x * x).sum(-1, keepdim=True)
    s = all_reduce(s) if reduce_s else s
    sq = all_reduce(sq)
    mean = s / H
    var = sq / H - mean * mean
    return (x - mean) * torch.rsqrt(var + 1e-5) * g


def c_layernorm_hidden_sharded_sumsq(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm_sumsq(x, g, True),)


def b_layernorm_sumsq_local_mean(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm_sumsq(x, g, False),)  # the mean from the shard's sum only


# DeepSpeed Ulysses (deepspeed/sequence/layer.py, batch first): 5-D reshape/permute around
# all_to_all_single on dim 0, attention over the whole sequence on H/c heads, and back.
UB, US, UNH, UHD = 2, 8, 8, 2  # batch, sequence, heads, head size of the Ulysses pairs


def uly_base(x: Any, wq: Any, wk: Any, wv: Any) -> tuple[Any, ...]:
    F = _f()
    q, k, v = (F.linear(x, w).reshape(UB, US, UNH, UHD).transpose(1, 2) for w in (wq, wk, wv))
    return (_attn(q, k, v, UHD**-0.5).transpose(1, 2).reshape(UB, US, H),)


def _ulysses(x: Any, wq: Any, wk: Any, wv: Any, back: tuple[int, ...]) -> Any:
    F = _f()
    sl, hl = US // C, UNH // C

    def seq_to_heads(t: Any) -> Any:  # (b, s/c, nh, hd) -> (b, s, nh/c, hd)
        t = t.reshape(UB, sl, C, hl, UHD).permute(2, 0, 1, 3, 4).contiguous()
        t = all_to_all(t, 0, 0)
        return t.permute(1, 0, 2, 3, 4).reshape(UB, US, hl, UHD)

    def heads_to_seq(t: Any) -> Any:  # (b, s, nh/c, hd) -> (b, s/c, nh, hd)
        t = t.reshape(UB, C, sl, hl, UHD).permute(1, 0, 2, 3, 4).contiguous()
        t = all_to_all(t, 0, 0)
        return t.permute(*back).reshape(UB, sl, UNH * UHD)

    q, k, v = (seq_to_heads(F.linear(x, w).reshape(UB, sl, UNH, UHD)).transpose(1, 2) for w in (wq, wk, wv))
    ctx = _attn(q, k, v, UHD**-0.5).transpose(1, 2)
    return heads_to_seq(ctx)


def c_deepspeed_ulysses_5d(x: Any, wq: Any, wk: Any, wv: Any) -> tuple[Any, ...]:
    return (_ulysses(x, wq, wk, wv, (1, 2, 0, 3, 4)),)


def b_deepspeed_ulysses_5d_post_permute(x: Any, wq: Any, wk: Any, wv: Any) -> tuple[Any, ...]:
    return (_ulysses(x, wq, wk, wv, (1, 2, 3, 0, 4)),)  # the heads interleaved (PR #5664 class)


# Sequence -> hidden all-to-all on the third dim, spelled with chunk / stack / unbind / cat.
def a2a3_base(x: Any) -> tuple[Any, ...]:
    return (_t().tanh(x),)


def _a2a_third_dim(x: Any, reverse: bool) -> Any:
    torch = _t()
    t = torch.stack(x.chunk(C, dim=2), 0)  # (c, b, s/c, h/c): block j of the hidden dim at j
    t = all_to_all(t, 0, 0)  # block j from rank j: rank j's sequence rows of my hidden block
    parts = list(t.unbind(0))
    if reverse:
        parts = parts[::-1]
    return torch.tanh(torch.cat(parts, dim=1))


def c_a2a_chunk_cat_third_dim(x: Any) -> tuple[Any, ...]:
    return (_a2a_third_dim(x, False),)


def b_a2a_chunk_cat_third_dim_reversed(x: Any) -> tuple[Any, ...]:
    return (_a2a_third_dim(x, True),)


# T5 relative-position buckets (transformers' T5Attention._relative_position_bucket) on
# sequence-parallel query rows: positions rank*s/c + arange, a log bounded by a min.
NB, MAXD = 8, 16


def _t5_bucket(rel: Any) -> Any:
    torch = _t()
    nb = NB // 2
    buckets = (rel > 0).to(torch.long) * nb
    rel = torch.abs(rel)
    max_exact = nb // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(MAXD / max_exact) * (nb - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, nb - 1))
    return buckets + torch.where(is_small, rel, large)


def t5_base(x: Any, table: Any) -> tuple[Any, ...]:
    torch = _t()
    ctx = torch.arange(S, dtype=torch.long, device=x.device)[:, None]
    mem = torch.arange(S, dtype=torch.long, device=x.device)[None, :]
    return (x + _f().embedding(_t5_bucket(mem - ctx), table)[..., 0],)


def _t5_sp(x: Any, table: Any, rank: Any, shift: int) -> Any:
    torch = _t()
    sl = S // C
    ctx = (rank.to(torch.long) * sl + shift + torch.arange(sl, dtype=torch.long, device=x.device))[:, None]
    mem = torch.arange(S, dtype=torch.long, device=x.device)[None, :]
    return x + _f().embedding(_t5_bucket(mem - ctx), table)[..., 0]


def c_t5_relative_buckets_sp(x: Any, table: Any, rank: Any) -> tuple[Any, ...]:
    return (_t5_sp(x, table, rank, 0),)


def b_t5_relative_buckets_sp_offset(x: Any, table: Any, rank: Any) -> tuple[Any, ...]:
    return (_t5_sp(x, table, rank, 1),)  # query positions one past the rank's rows


# Vocab-parallel greedy argmax: local argmax plus the rank's vocab offset built as a reshaped
# arange plus a broadcast of w*r, all-gathered values and ids, the first rank's best.
def argmax_base(x: Any) -> tuple[Any, ...]:
    return (x.argmax(-1),)


def _vocab_argmax(x: Any, rank: Any, w_off: int) -> Any:
    torch = _t()
    w = V // C
    cols = torch.arange(w, device=x.device).reshape(1, w) + (rank.to(torch.long) * w_off).reshape(1, 1)  # global ids
    m, a = x.max(-1)
    gid = cols.expand(S, w).gather(1, a[:, None])  # (S, 1)
    vals = all_gather(m[:, None], 1)  # (S, c)
    ids = all_gather(gid, 1)
    j = vals.argmax(-1, keepdim=True)
    return ids.gather(1, j)[:, 0]


def c_vocab_argmax_offset_table(x: Any, rank: Any) -> tuple[Any, ...]:
    return (_vocab_argmax(x, rank, V // C),)


def b_vocab_argmax_offset_table_stride(x: Any, rank: Any) -> tuple[Any, ...]:
    return (_vocab_argmax(x, rank, V // C + 1),)  # the offset stride off by one


# Cumsum along the sharded sequence dim: the carry as an exclusive scan of the all-gathered
# totals, picked at the rank by index_select (no mask).
def _cumsum_scan_carry(x: Any, w: Any, rank: Any, inclusive: bool) -> tuple[Any, ...]:
    torch = _t()
    y = _f().linear(x, w)
    totals = all_gather(y.sum(0, keepdim=True), 0)  # (C, H)
    scan = totals.cumsum(0) if inclusive else totals.cumsum(0) - totals
    return (y.cumsum(0) + scan.index_select(0, rank.reshape(1).to(torch.long)),)


def c_cumsum_sharded_dim_scan_carry(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _cumsum_scan_carry(x, w, rank, False)


def b_cumsum_sharded_dim_scan_inclusive(x: Any, w: Any, rank: Any) -> tuple[Any, ...]:
    return _cumsum_scan_carry(x, w, rank, True)


# The GQA merge's backward: the gradient of repeat_interleave (KV heads shared by R query
# heads) sums the R copies; each rank holds one query head's gradient and adds it into the KV
# head it used (index_add at rank // R, or rank % NKV for tiled heads), then all-reduces.
def gqa_merge_base(dk: Any) -> tuple[Any, ...]:
    return (dk.reshape(NKV, NH // NKV, S, HD).sum(1),)


def gqa_merge_tile_base(dk: Any) -> tuple[Any, ...]:
    return (dk.reshape(NH // NKV, NKV, S, HD).sum(0),)


def _gqa_merge(dk: Any, rank: Any, modulo: bool) -> Any:
    torch = _t()
    head = (rank % NKV if modulo else rank // (C // NKV)).reshape(1).to(torch.long)
    out = torch.zeros(NKV, S, HD, dtype=dk.dtype, device=dk.device).index_add(0, head, dk)
    return all_reduce(out)


def c_gqa_merge_backward(dk: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa_merge(dk, rank, False),)


def b_gqa_merge_backward_mod(dk: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa_merge(dk, rank, True),)


def c_gqa_tiled_merge_backward(dk: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa_merge(dk, rank, True),)


def b_gqa_tiled_merge_backward_div(dk: Any, rank: Any) -> tuple[Any, ...]:
    return (_gqa_merge(dk, rank, False),)


# Token positions from a padding mask (position_ids = mask.cumsum(-1)) on sequence-parallel
# rows, in integers: the carry as the exclusive scan of the gathered row totals.
def pos_base(m: Any) -> tuple[Any, ...]:
    return (m.cumsum(0),)


def _positions_scan(m: Any, rank: Any, inclusive: bool) -> tuple[Any, ...]:
    torch = _t()
    i32 = torch.int32  # the baseline's type (torch-xla keeps int32 for an int32 cumsum)
    totals = all_gather(m.sum(0, keepdim=True, dtype=i32), 0)  # (C, B) counts of each rank's rows
    scan = totals.cumsum(0, dtype=i32) if inclusive else totals.cumsum(0, dtype=i32) - totals
    return (m.cumsum(0, dtype=i32) + scan.index_select(0, rank.reshape(1).to(torch.long)),)


def c_positions_sp_scan_carry(m: Any, rank: Any) -> tuple[Any, ...]:
    return _positions_scan(m, rank, False)


def b_positions_sp_scan_inclusive(m: Any, rank: Any) -> tuple[Any, ...]:
    return _positions_scan(m, rank, True)


def _layer_norm_fused_stats(x: Any, g: Any, swapped: bool) -> Any:
    """The two statistics all-reduced as one tensor (one collective instead of two), split back."""
    torch = _t()
    st = all_reduce(torch.cat([x.sum(-1, keepdim=True), (x * x).sum(-1, keepdim=True)], -1))
    s, sq = (st[:, 1:], st[:, :1]) if swapped else (st[:, :1], st[:, 1:])
    mean = s / H
    var = sq / H - mean * mean
    return (x - mean) * torch.rsqrt(var + 1e-5) * g


def c_layernorm_hidden_sharded_fused_stats(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm_fused_stats(x, g, False),)


def b_layernorm_fused_stats_swapped(x: Any, g: Any) -> tuple[Any, ...]:
    return (_layer_norm_fused_stats(x, g, True),)  # the packed statistics split in the wrong order


# Row-parallel outputs all-reduced as one flat bucket (DDP / Megatron grad-buffer style):
# flatten, concatenate, one all-reduce, split at the offsets, reshape back.
def bucket_base(x: Any, w1: Any, w2: Any) -> tuple[Any, ...]:
    F = _f()
    return (F.linear(x, w1), F.linear(x, w2))


def _bucket(x: Any, w1: Any, w2: Any, shift: int) -> tuple[Any, ...]:
    torch, F = _t(), _f()
    a, b = F.linear(x, w1), F.linear(x, w2)
    flat = all_reduce(torch.cat([a.reshape(-1), b.reshape(-1)]))
    n = a.numel()
    return (flat[shift : n + shift].reshape(a.shape), flat[n:].reshape(b.shape))


def c_flat_bucket_allreduce(x: Any, w1: Any, w2: Any) -> tuple[Any, ...]:
    return _bucket(x, w1, w2, 0)


def b_flat_bucket_allreduce_offset(x: Any, w1: Any, w2: Any) -> tuple[Any, ...]:
    return _bucket(x, w1, w2, 1)  # the first tensor read one element late


# ---------------------------------------------------------------------------------------------


def _pairs() -> list[TorchPair]:
    x_row = row_inputs()
    x_rowb = row_inputs(bias=True)
    rank = In("rank", (), "rank", dtype="int32")
    col = (In("x", (S, H)), In("w", (F, H), "sharded", 0))
    attn = (In("x", (S, H)), In("wq", (H, H), "sharded", 0), In("wk", (HD, H)), In("wv", (HD, H)),
            In("wo", (H, H), "sharded", 1))
    bh = (In("x", (B, S, H)), In("wq", (H, H), "sharded", 0), In("wk", (H, H), "sharded", 0),
          In("wv", (H, H), "sharded", 0), In("wo", (H, H), "sharded", 1))
    gqa = (In("x", (S, H)), In("wq", (H, H), "sharded", 0), In("wkv", (2 * NKV * HD, H)),
           In("wo", (H, H), "sharded", 1), rank)
    moe = (In("x", (T, H)), In("router", (E, H)), In("w1", (E, F, H), "sharded", 0),
           In("w2", (E, H, F), "sharded", 0), rank)
    sp = (In("x", (SQ, SQ), "sharded", 0), In("nw", (SQ,)), In("w_up", (F, SQ), "sharded", 0),
          In("w_down", (SQ, F), "sharded", 1))
    emb = (In("ids", (S,), dtype="int32", int_range=(0, V)), In("table", (V, H), "sharded", 0), rank)
    ce = (In("logits", (S, V), "sharded", 1), In("target", (S,), dtype="int32", int_range=(0, V)), rank)
    swiglu = (In("x", (S, H)), In("w_gu", (2 * F, H), "sharded", 0, blocks=(F, F)),
              In("w_down", (H, F), "sharded", 1))
    deep = (In("x", (S, H)), *[i for k in range(LAYERS) for i in (In(f"up{k}", (F, H), "sharded", 0), In(f"down{k}", (H, F), "sharded", 1))])
    dup = (("duplicate", None),)
    sh0 = (("sharded", 0),)
    sh1 = (("sharded", 1),)
    P = TorchPair
    return [
        P("c_ar_reordered_groups", "row-parallel linear all-reduced over the reordered group [[0,2,1,3]] (the same sum)", x_row, dup, row_base, c_ar_reordered_groups),
        P("b_ar_strided_groups", "row-parallel linear all-reduced over [[0,2],[1,3]]: type-checks, sums half the terms", x_row, dup, row_base, b_ar_strided_groups),
        P("c_bias_div_c_before_ar", "bias/c added on every rank before the all-reduce", x_rowb, dup, row_base, c_bias_div_c_before_ar),
        P("b_bias_in_linear_before_ar", "bias added by F.linear on every rank before the all-reduce (counted c times)", x_rowb, dup, row_base, b_bias_in_linear_before_ar),
        P("c_bias_rank0_guard", "bias multiplied by float(rank == 0) before the all-reduce", (*x_rowb, rank), dup, row_base, c_bias_rank0_guard),
        P("b_bias_guard_le1", "bias guard rank <= 1 instead of rank == 0: the bias is added twice", (*x_rowb, rank), dup, row_base, b_bias_guard_le1),
        P("c_scale_before_ar", "row-parallel partial scaled by 1/8 before the all-reduce", x_row, dup, scale_base, c_scale_before_ar),
        P("b_scale_one_rank", "the scale is 0.126 on rank 3 only (torch.where on the rank)", (*x_row, rank), dup, scale_base, b_scale_one_rank),
        P("b_fp16_activation_roundtrip", "the all-reduced activations are rounded through fp16 before the GELU", x_row, dup, act_base, b_fp16_activation_roundtrip),
        P("b_bf16_partial_ar", "the row-parallel partial is all-reduced in bf16", x_row, dup, row_base, b_bf16_partial_ar),
        P("c_div_chain", "column-parallel output divided as (y/3)/7, the baseline as y/(3*7)", col, sh1, div_base, c_div_chain),
        P("b_div_precedence", "y/3*7 where y/(3*7) was meant", col, sh1, div_base, b_div_precedence),
        P("c_allgather_transposed_shard", "the column-parallel weight gathered as its transposed shards along dim 1, then x @ W^T", (In("x", (S, H)), In("w", (F, H), "sharded", 0)), dup, gw_base, c_allgather_transposed_shard),
        P("b_gathered_weight_untransposed", "square weight gathered along dim 0 and used without its transpose", (In("x", (S, H)), In("w", (H, H), "sharded", 0)), dup, gw_base, b_gathered_weight_untransposed),
        P("c_megatron_vocab_mask", "Megatron VocabParallelEmbedding: mask (ids < start) | (ids >= end), masked_fill, all-reduce", emb, dup, emb_base, c_megatron_vocab_mask),
        P("b_vocab_mask_gt_end", "vocab mask (ids > end) instead of (ids >= end): the id at end is looked up twice", emb, dup, emb_base, b_vocab_mask_gt_end),
        P("b_vocab_start_off_by_one", "vocab range starts at rank*V/c + 1", emb, dup, emb_base, b_vocab_start_off_by_one),
        P("c_gather_chunk_concat", "all-gather along dim 0, chunk into c, concat along dim 1 (a gather along dim 1)", (In("x", (S, H), "sharded", 1),), dup, tanh_base, c_gather_chunk_concat),
        P("b_gather_chunk_concat_reversed", "gather-chunk-concat with the chunks in reverse order", (In("x", (S, H), "sharded", 1),), dup, tanh_base, b_gather_chunk_concat_reversed),
        P("c_sp_rs_ag", "sequence parallel: RMSNorm, all-gather, MLP, reduce-scatter, residual, all-gather", sp, dup, sp_base, c_sp_rs_ag),
        P("b_sp_rs_wrong_dim", "sequence parallel with the reduce-scatter along the hidden dim, reshaped back to the token shard", sp, dup, sp_base, b_sp_rs_wrong_dim),
        P("c_pointwise_after_reshape", "gelu after the reshape on the ranks, before it in the baseline", (In("x", (S, H), "sharded", 0),), sh0, pr_base, c_pointwise_after_reshape),
        P("b_reshape_transposed_layout", "reshape to (s, h/4, 4) then transpose: the same shape, a transposed layout", (In("x", (S, H), "sharded", 0),), sh0, pr_base, b_reshape_transposed_layout),
        P("c_cumsum_nonsharded_dim", "cumsum along the hidden dim of rows sharded along the sequence", (In("x", (S, H), "sharded", 0), In("w", (H, H))), sh0, cs_base, c_cumsum_nonsharded_dim),
        P("b_cumsum_sharded_dim_local", "cumsum along the sharded sequence dim without the carry of earlier ranks", (In("x", (S, H), "sharded", 0), In("w", (H, H))), sh0, cs0_base, b_cumsum_sharded_dim_local),
        P("c_reverse_sharded_dim_mirror_rows", "flip along the sharded sequence dim: all-gather, rows (c-1-r)·w + arange(w) by index_select, local flip", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, flip0_base, c_reverse_sharded_dim_mirror_rows),
        P("b_reverse_sharded_dim_mirror_no_flip", "the same without the local flip of the mirrored block", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, flip0_base, b_reverse_sharded_dim_mirror_no_flip),
        P("c_cumsum_sharded_dim_carry", "cumsum along the sharded sequence dim: local cumsum plus the all-gathered totals of ranks k < r", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, cs0_base, c_cumsum_sharded_dim_carry),
        P("b_cumsum_sharded_dim_inclusive_carry", "the same with the mask k <= r: the rank's own total added twice", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, cs0_base, b_cumsum_sharded_dim_inclusive_carry),
        P("c_onehot_rank_select", "the rank's columns selected by sum_j float(rank == j) * x[:, j-th block]", (In("x", (S, H)), rank), sh1, sel_base, c_onehot_rank_select),
        P("b_onehot_rotated", "one-hot select with rank == (j+1) % c: every rank takes its neighbour's block", (In("x", (S, H)), rank), sh1, sel_base, b_onehot_rotated),
        P("c_log_softmax_vocab", "log-softmax over a vocab-sharded dim: all-reduce(max), exp, all-reduce(sum), x - m - log s", (In("x", (S, V), "sharded", 1),), sh1, lsm_base, c_log_softmax_vocab),
        P("b_log_softmax_local_sum", "log-softmax whose sum of exponentials is not all-reduced", (In("x", (S, V), "sharded", 1),), sh1, lsm_base, b_log_softmax_local_sum),
        P("c_softmax_max_subtracted", "vocab-parallel softmax at temperature 0.02 with the all-reduced max subtracted (amax)", (In("x", (S, V), "sharded", 1),), sh1, hot_softmax_base, c_softmax_max_subtracted),
        P("b_softmax_no_max_subtraction", "vocab-parallel softmax at temperature 0.02 without the max subtraction: exp overflows in f32", (In("x", (S, V), "sharded", 1),), sh1, hot_softmax_base, b_softmax_no_max_subtraction),
        P("c_layernorm_hidden_sharded", "LayerNorm over a hidden-sharded dim (two all-reduces) against F.layer_norm", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, c_layernorm_hidden_sharded),
        P("b_layernorm_local_var", "LayerNorm whose variance comes from the local shard only", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, b_layernorm_local_var),
        P("c_mqa_replicated_kv", "multi-query attention: query heads sharded, the one KV head replicated", attn, dup, mqa_base, c_mqa_replicated_kv),
        P("b_mqa_double_scale", "queries pre-scaled by 1/sqrt(d) and the scores scaled again", attn, dup, mqa_base, b_mqa_double_scale),
        P("c_sdpa_merged_batch_heads", "attention with batch*heads merged into one bmm dim", bh, dup, bh2_base, c_sdpa_merged_batch_heads),
        P("b_sdpa_unmerge_swapped", "merged batch*heads un-merged as (heads, batch)", bh, dup, bh2_base, b_sdpa_unmerge_swapped),
        P("c_gqa_kv_rank_div", "GQA with replicated KV projections; the rank picks KV head rank // 2 by index_select", gqa, dup, gqa_base, c_gqa_kv_rank_div),
        P("c_gqa_tiled_kv_rank_mod", "GQA whose baseline tiles the KV heads (.repeat); the rank picks KV head rank % 2", gqa, dup, gqa_tile_base, b_gqa_kv_rank_mod),
        P("b_gqa_tiled_kv_rank_div", "GQA whose baseline tiles the KV heads (.repeat) while the rank picks rank // 2 (interleaved)", gqa, dup, gqa_tile_base, c_gqa_kv_rank_div),
        P("b_gqa_kv_rank_mod", "GQA KV head picked as rank % 2 instead of rank // 2", gqa, dup, gqa_base, b_gqa_kv_rank_mod),
        P("c_moe_top1_local_experts", "MoE top-1 with 2 local experts per rank, selected by idx == rank*2 + e, all-reduce", moe, dup, moe_base, c_moe_top1_local_experts),
        P("b_moe_expert_offset", "MoE global expert index rank*2 + e + 1 (off by one)", moe, dup, moe_base, b_moe_expert_offset),
        P("c_mean_of_means", "mean over a sharded dim as all-reduce(local mean) / c", (In("x", (S, H), "sharded", 0),), dup, mean_base, c_mean_of_means),
        P("b_mean_of_means_undivided", "all-reduce of local means without / c (sum vs mean)", (In("x", (S, H), "sharded", 0),), dup, mean_base, b_mean_of_means_undivided),
        P("c_megatron_cross_entropy", "Megatron vocab_parallel_cross_entropy against F.cross_entropy", ce, dup, ce_base, c_megatron_cross_entropy),
        P("b_ce_predicted_unmasked", "vocab-parallel cross entropy without predicted_logits[mask] = 0", ce, dup, ce_base, b_ce_predicted_unmasked),
        P("c_rotary_sp_positions", "rotary embedding on sequence-parallel tokens, positions rank*s/c + arange", (In("x", (S, H), "sharded", 0), rank), sh0, rope_base, c_rotary_sp_positions),
        P("b_rotary_sp_no_offset", "rotary positions restart at 0 on every rank (no rank offset)", (In("x", (S, H), "sharded", 0), rank), sh0, rope_base, b_rotary_sp_no_offset),
        P("c_swiglu_fused_blocks", "SwiGLU with a fused [gate; up] weight, each block sharded, chunk(2)", swiglu, dup, swiglu_base, c_swiglu_fused_blocks),
        P("b_swiglu_gate_up_swapped", "fused SwiGLU with gate and up swapped on the ranks", swiglu, dup, swiglu_base, b_swiglu_gate_up_swapped),
        P("c_allreduce_then_rank_rows", "all-reduce then the rank's rows by index_select(rank*s/c + arange)", (*x_row, rank), sh0, split_base, c_allreduce_then_rank_rows),
        P("b_rank_rows_reversed", "the rank's rows taken at (c-1-rank)*s/c", (*x_row, rank), sh0, split_base, b_rank_rows_reversed),
        P("c_deep_layers", f"{LAYERS} identical column->row MLP layers in model.layers.k scopes (folded)", deep, dup, deep_base, c_deep_layers),
        P("b_deep_up_weights_swapped", f"layers 3 and 4 of {LAYERS} identical layers use each other's up-projection", deep, dup, deep_base, b_deep_up_weights_swapped),
        P("b_deep_layers_swapped", f"layers 2 and 3 of {LAYERS} identical layers run in swapped order", deep, dup, deep_base, b_deep_layers_swapped),
        P("b_elided_cos_table", "x*cos(arange(1,17)*0.1) vs arange(0,16): two different constants both printed {...}", (In("x", (16,)),), dup, cos_table(0), cos_table_dist(1), elide=True),
        P("c_layernorm_hidden_sharded_sumsq", "LayerNorm over a hidden-sharded dim as XLA expands F.layer_norm: all-reduced sum and sum of squares, var = E[x^2] - E[x]^2", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, c_layernorm_hidden_sharded_sumsq),
        P("b_layernorm_sumsq_local_mean", "LayerNorm E[x^2] - E[x]^2 whose sum (the mean) is not all-reduced", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, b_layernorm_sumsq_local_mean),
        P("c_deepspeed_ulysses_5d", "DeepSpeed Ulysses: 5-D reshape/permute around all_to_all_single (sequence -> heads), attention, and back", (In("x", (UB, US, H), "sharded", 1), In("wq", (H, H)), In("wk", (H, H)), In("wv", (H, H))), sh1, uly_base, c_deepspeed_ulysses_5d),
        P("b_deepspeed_ulysses_5d_post_permute", "DeepSpeed Ulysses whose post-all-to-all permute interleaves the heads (permute(1,2,3,0,4))", (In("x", (UB, US, H), "sharded", 1), In("wq", (H, H)), In("wk", (H, H)), In("wv", (H, H))), sh1, uly_base, b_deepspeed_ulysses_5d_post_permute),
        P("c_a2a_chunk_cat_third_dim", "sequence -> hidden all-to-all on a 3-D tensor: chunk the hidden dim, stack, all_to_all dim 0, unbind, cat along the sequence", (In("x", (UB, US, H), "sharded", 1),), (("sharded", 2),), a2a3_base, c_a2a_chunk_cat_third_dim),
        P("b_a2a_chunk_cat_third_dim_reversed", "the same with the received blocks concatenated in reverse rank order", (In("x", (UB, US, H), "sharded", 1),), (("sharded", 2),), a2a3_base, b_a2a_chunk_cat_third_dim_reversed),
        P("c_t5_relative_buckets_sp", "T5 relative-position buckets (log-bucketed, min-bounded) on sequence-parallel query rows at rank*s/c + arange", (In("x", (S, S), "sharded", 0), In("table", (NB, 1)), rank), sh0, t5_base, c_t5_relative_buckets_sp),
        P("b_t5_relative_buckets_sp_offset", "T5 buckets with the query positions one past the rank's rows", (In("x", (S, S), "sharded", 0), In("table", (NB, 1)), rank), sh0, t5_base, b_t5_relative_buckets_sp_offset),
        P("c_vocab_argmax_offset_table", "vocab-parallel argmax: local argmax, global ids from arange(w).reshape + broadcast(w*r), all-gathered values and ids, the first best rank", (In("x", (S, V), "sharded", 1), rank), dup, argmax_base, c_vocab_argmax_offset_table),
        P("b_vocab_argmax_offset_table_stride", "vocab-parallel argmax whose id offset is r*(w+1)", (In("x", (S, V), "sharded", 1), rank), dup, argmax_base, b_vocab_argmax_offset_table_stride),
        P("c_cumsum_sharded_dim_scan_carry", "cumsum along the sharded sequence dim: carry = exclusive cumsum of the all-gathered totals, index_select at the rank", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, cs0_base, c_cumsum_sharded_dim_scan_carry),
        P("b_cumsum_sharded_dim_scan_inclusive", "the same with the inclusive cumsum of the totals: the rank's own total added twice", (In("x", (S, H), "sharded", 0), In("w", (H, H)), rank), sh0, cs0_base, b_cumsum_sharded_dim_scan_inclusive),
        P("c_gqa_merge_backward", "GQA merge backward: each rank's query-head gradient index_added into KV head rank // 2, all-reduced, against the sum over repeat_interleave's copies", (In("dk", (NH, S, HD), "sharded", 0), rank), dup, gqa_merge_base, c_gqa_merge_backward),
        P("b_gqa_merge_backward_mod", "GQA merge backward adding into KV head rank % 2 where the heads are interleaved", (In("dk", (NH, S, HD), "sharded", 0), rank), dup, gqa_merge_base, b_gqa_merge_backward_mod),
        P("c_gqa_tiled_merge_backward", "GQA merge backward with tiled KV heads: each rank adds into KV head rank % 2, all-reduced", (In("dk", (NH, S, HD), "sharded", 0), rank), dup, gqa_merge_tile_base, c_gqa_tiled_merge_backward),
        P("b_gqa_tiled_merge_backward_div", "GQA merge backward with tiled KV heads adding into rank // 2", (In("dk", (NH, S, HD), "sharded", 0), rank), dup, gqa_merge_tile_base, b_gqa_tiled_merge_backward_div),
        P("c_positions_sp_scan_carry", "int positions mask.cumsum(0) over sequence-parallel rows: local cumsum + exclusive scan of the gathered row totals at the rank", (In("m", (S, B), "sharded", 0, dtype="int32", int_range=(0, 2)), rank), sh0, pos_base, c_positions_sp_scan_carry),
        P("b_positions_sp_scan_inclusive", "int positions with the inclusive scan of the totals: the rank's own count added twice", (In("m", (S, B), "sharded", 0, dtype="int32", int_range=(0, 2)), rank), sh0, pos_base, b_positions_sp_scan_inclusive),
        P("c_layernorm_hidden_sharded_fused_stats", "LayerNorm over a hidden-sharded dim: sum and sum of squares all-reduced as one concatenated tensor, then split", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, c_layernorm_hidden_sharded_fused_stats),
        P("b_layernorm_fused_stats_swapped", "LayerNorm with packed statistics split in the wrong order (sum of squares taken as the sum)", (In("x", (S, H), "sharded", 1), In("g", (H,), "sharded", 0)), sh1, ln_base, b_layernorm_fused_stats_swapped),
        P("c_flat_bucket_allreduce", "two row-parallel outputs flattened into one bucket, all-reduced once, split and reshaped back", (In("x", (S, H), "sharded", 1), In("w1", (F, H), "sharded", 1), In("w2", (H, H), "sharded", 1)), (("duplicate", None), ("duplicate", None)), bucket_base, c_flat_bucket_allreduce),
        P("b_flat_bucket_allreduce_offset", "the bucket's first tensor read one element late", (In("x", (S, H), "sharded", 1), In("w1", (F, H), "sharded", 1), In("w2", (H, H), "sharded", 1)), (("duplicate", None), ("duplicate", None)), bucket_base, b_flat_bucket_allreduce_offset),
    ]


PAIRS = {p.name: p for p in _pairs()}


# ---------------------------------------------------------------------------------------------
# Tracing


_CONST_RE = re.compile(r"^(\s*(?:ROOT )?%?(\S+) = \S+ constant\()(.*?)(\)(?:, metadata=.*)?)$")


def _full_literals(text: str, proto: bytes) -> str:
    """``text`` with every elided literal ``{...}`` written in full (from the lowering's proto)."""
    from jax._src.lib import hlo as hlo_lib

    module = hlo_lib.HloModule.from_serialized_hlo_module_proto(proto)
    opts = hlo_lib.HloPrintOptions.short_parsable()
    opts.print_large_constants = True
    opts.print_metadata = False
    full: dict[str, str] = {}
    for line in module.to_string(opts).splitlines():
        m = _CONST_RE.match(line)
        if m:
            full[m.group(2)] = m.group(3)
    out = []
    for line in text.splitlines():
        m = _CONST_RE.match(line)
        if m and m.group(3) == "{...}":
            line = m.group(1) + full[m.group(2)] + m.group(4)
        out.append(line)
    return "\n".join(out) + "\n"


def _elide(text: str) -> str:
    """Literals of more than 10 elements as torch-xla prints them: ``{...}``."""
    out = []
    for line in text.splitlines():
        m = _CONST_RE.match(line)
        if m and m.group(3).count(",") >= 10:
            line = m.group(1) + "{...}" + m.group(4)
        out.append(line)
    return "\n".join(out) + "\n"


def _trace(pair: TorchPair, side: str) -> tuple[str, dict[str, int], list[int]]:
    """(text with every literal in full, parameter number per input name, token parameters)."""
    import torch
    import torch_xla

    from shardproof.engine.frontend import capture

    capture.reset_collective_token()
    tensors: dict[str, Any] = {}
    for spec in pair.inputs:
        if side == "baseline" and spec.relation == "rank":
            continue
        shape = spec.shape if side == "baseline" else spec.local_shape()
        tensors[spec.name] = capture.placeholder(shape, getattr(torch, spec.dtype))
    fn = pair.baseline if side == "baseline" else pair.distributed
    outputs = fn(**tensors)
    if len(outputs) != len(pair.outputs):
        raise RuntimeError(f"{pair.name} {side}: {len(outputs)} outputs, expected {len(pair.outputs)}")
    captured = capture.capture(list(outputs), ROOT, exclude=[])
    numbers = {}
    for name, t in tensors.items():
        try:
            numbers[name] = captured.parameter_number(t)
        except ValueError:  # an input this side never reads (the rank of a buggy program)
            if pair.kind != "bug" or side != "distributed":
                raise RuntimeError(f"{pair.name} {side}: input {name} is unused") from None
    ctx = torch_xla._XLAC.lowering.LoweringContext("IrToHlo")
    ctx.build(list(outputs))
    full = _full_literals(captured.hlo_text, ctx.hlo())
    tokens = sorted(set(captured.parameter_shapes) - set(numbers.values()))
    for n in tokens:
        if captured.parameter_shapes[n] != ("f32", ()):
            raise RuntimeError(f"{pair.name} {side}: parameter {n} is neither an input nor a token")
    return full, numbers, tokens


_SHORT = {"float32": "f32", "int32": "s32", "bfloat16": "bf16"}


def _relations(pair: TorchPair, base: dict[str, int], dist: dict[str, int], tokens: list[int]) -> str:
    lines = [f"# {pair.name}: {pair.description}\n", f"groups: {json.dumps(pair.groups)}\n", "inputs:\n"]
    for spec in pair.inputs:
        if spec.name not in dist:
            lines.append(f"  # {spec.name}: not read by the distributed program\n")
            continue
        d = dist[spec.name]
        if spec.relation == "rank":
            lines.append(f"  - {{distributed: {d}, relation: rank}}  # {spec.name}\n")
            continue
        fields = [f"baseline: {base[spec.name]}", f"distributed: {d}", f"relation: {spec.relation}"]
        if spec.relation == "sharded":
            fields.append(f"dim: {spec.dim}")
        if spec.blocks:
            fields.append(f"blocks: {json.dumps(list(spec.blocks))}")
        if spec.int_range:
            fields.append(f"int_range: {json.dumps(list(spec.int_range))}")
        shape = f"{_SHORT[spec.dtype]}{list(spec.shape)}"
        lines.append(f"  - {{{', '.join(fields)}}}  # {spec.name}: {shape}\n")
    for n in tokens:
        lines.append(f"  - {{distributed: {n}, relation: token}}  # torch-xla's collective token\n")
    lines.append("outputs:\n")
    for i, (rel, dim) in enumerate(pair.outputs):
        extra = f", dim: {dim}" if rel == "sharded" else ""
        lines.append(f"  - {{baseline: {i}, distributed: {i}, relation: {rel}{extra}}}\n")
    return "".join(lines)


def write(pair: TorchPair, out: Path) -> None:
    b_full, b_nums, b_tokens = _trace(pair, "baseline")
    d_full, d_nums, d_tokens = _trace(pair, "distributed")
    if b_tokens:
        raise RuntimeError(f"{pair.name}: the baseline has extra parameters {b_tokens}")
    files = {"relations.yaml": _relations(pair, b_nums, d_nums, d_tokens)}
    if pair.elide:
        files.update({"baseline.hlo": _elide(b_full), "distributed.hlo": _elide(d_full),
                      "baseline.full.hlo": b_full, "distributed.full.hlo": d_full})
    else:
        files.update({"baseline.hlo": b_full, "distributed.hlo": d_full})
    files["pair.yaml"] = (f"kind: {pair.kind}\nproducer: torch-xla\n"
                          f"description: {json.dumps(pair.description)}\n")
    folder = out / pair.name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.full.hlo"):
        old.unlink()
    for name, text in files.items():
        if str(ROOT) in text or "/tmp/" in text or "/home/" in text:
            raise RuntimeError(f"{pair.name}/{name} would name a path of this machine")
        (folder / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", type=Path, default=HERE / "pairs")
    ap.add_argument("--list", action="store_true", help="print the pair names and exit")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(PAIRS))
        return 0
    unknown = [n for n in args.names if n not in PAIRS]
    if unknown:
        ap.error(f"unknown pairs {unknown}")
    from shardproof.engine.frontend import capture

    os.environ["PJRT_DEVICE"] = "CPU"
    capture.configure_environment()
    import torch_xla
    import torch_xla.core.xla_model as xm

    capture.keep_scalars_constant()
    _X.update(scope=torch_xla._XLAC.profiler.scope_pusher, spmd_all_reduce=torch_xla._XLAC._xla_spmd_all_reduce,
              spmd_reduce_scatter=torch_xla._XLAC._xla_spmd_reduce_scatter, xm=xm)
    for name in args.names or list(PAIRS):
        write(PAIRS[name], args.out)
        print(f"wrote {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
