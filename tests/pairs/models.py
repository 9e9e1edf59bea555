"""Megatron-style tensor/sequence-parallel blocks, each written twice: as the single-device
baseline (whole tensors) and as what one rank of a group of ``c`` runs (its shards, with
collectives). ``generate.py`` traces both with torch-xla into the HLO test pairs;
``check_eager.py`` runs both in plain torch, simulating the ranks with threads.

The distributed functions receive their collectives through a :class:`Collectives` value so the
same code serves both. For tracing, its fields are torch-xla's own functions, never a wrapper of
ours: the frame that creates a collective is then the model line itself, which is what the HLO
metadata and the source map must name.

Bug variants are flags (``bug="<pair name>"``) of the correct functions. Each one's site, the line
whose HLO instruction is the first distributed instruction that cannot be related to the
baseline although its operands can, carries a trailing ``# BUG-SITE: <pair name>`` comment that
``generate.py`` reads into ``expect.yaml``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

SUM = "sum"  # the reduce-type names of torch_xla.core.xla_model (REDUCE_SUM, REDUCE_MAX)
MAX = "max"

Groups = list[list[int]]


@dataclass(frozen=True)
class Collectives:
    """The collective calls a distributed function makes, with torch-xla's signatures.

    ``spmd_all_reduce(reduce_type, t, scale, groups)`` and ``spmd_reduce_scatter(reduce_type, t,
    scale, scatter_dim, shard_count, groups)`` are the token-free ``_XLAC._xla_spmd_*`` ops;
    ``all_gather(t, dim, groups=..., pin_layout=False)``, ``all_reduce(reduce_type, t, groups=...)``
    and ``all_to_all(t, split_dim, concat_dim, count, groups=..., pin_layout=False)`` are xm's.
    """
    spmd_all_reduce: Callable[..., Tensor]
    spmd_reduce_scatter: Callable[..., Tensor]
    all_gather: Callable[..., Tensor]
    all_reduce: Callable[..., Tensor]
    all_to_all: Callable[..., Tensor] | None = None  # xm.all_to_all (torch-xla's token threaded)


# Module-path scopes ("layers.3") for layered models. generate.py installs torch-xla's scope
# pusher (the op_name then carries the path the verifier cuts layers by); eager runs keep this.
_scope_factory: list[Callable[[str], object]] = []


def set_scope_factory(factory: Callable[[str], object]) -> None:
    _scope_factory[:] = [factory]


def layer_scope(name: str) -> object:
    """Hold the returned value while the layer's ops are created; drop it to leave the scope."""
    return _scope_factory[0](name) if _scope_factory else None


@dataclass(frozen=True)
class Group:
    """The rank group the distributed program runs in."""

    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def replica_groups(self) -> Groups:
        return [list(self.ranks)]


# ---------------------------------------------------------------------------------------------
# Pieces both sides share. They hold no bug site: a helper's line would be the innermost frame.


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def activation(h: Tensor, kind: str) -> Tensor:
    return F.gelu(h) if kind == "gelu" else F.silu(h)


def head_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale) v over the leading (batch/head) dimensions."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# ---------------------------------------------------------------------------------------------
# Column -> row parallel MLP with a residual: Megatron's ParallelMLP.


def mlp_baseline(
    x: Tensor, w_up: Tensor, b_up: Tensor, w_down: Tensor, b_down: Tensor, *, act: str
) -> tuple[Tensor, ...]:
    h = activation(F.linear(x, w_up, b_up), act)
    y = F.linear(h, w_down)
    out = x + y
    return (out + b_down,)


def mlp_distributed(
    cc: Collectives,
    group: Group,
    x: Tensor,
    w_up: Tensor,
    b_up: Tensor,
    w_down: Tensor,
    b_down: Tensor,
    *,
    act: str,
    token_allreduce: bool = False,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    h = F.linear(x, w_up, b_up)  # column-parallel: this rank's F/c hidden features
    h = F.gelu(h) if act == "gelu" else F.silu(h)
    partial = F.linear(h, w_down)  # row-parallel: one term of a sum over the ranks
    groups = group.replica_groups
    if bug == "bug_missing_allreduce":
        y = partial
    elif token_allreduce:
        y = cc.all_reduce(SUM, partial, groups=groups)
    else:
        y = cc.spmd_all_reduce(SUM, partial, 1.0, groups)
    if bug == "bug_redundant_allreduce":
        y = cc.spmd_all_reduce(SUM, y, 1.0, groups)  # BUG-SITE: bug_redundant_allreduce
    out = x + y  # BUG-SITE: bug_missing_allreduce
    return (out + b_down,)


# ---------------------------------------------------------------------------------------------
# Head-sharded self-attention on (s, h): Q/K/V column-parallel, output projection row-parallel.


def attention_baseline(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor, *, n_heads: int
) -> tuple[Tensor, ...]:
    s, h = x.shape
    hd = h // n_heads
    q = F.linear(x, wq).reshape(s, n_heads, hd).transpose(0, 1)
    k = F.linear(x, wk).reshape(s, n_heads, hd).transpose(0, 1)
    v = F.linear(x, wv).reshape(s, n_heads, hd).transpose(0, 1)
    ctx = head_attention(q, k, v, 1.0 / math.sqrt(hd))
    return (F.linear(ctx.transpose(0, 1).reshape(s, h), wo),)


def attention_distributed(
    cc: Collectives,
    group: Group,
    x: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    *,
    n_heads: int,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    s, h = x.shape
    hd = h // n_heads
    n_local = n_heads // group.size
    q = F.linear(x, wq)  # (s, n_local * hd): this rank's heads
    k = F.linear(x, wk)
    v = F.linear(x, wv)
    if bug == "bug_axis_split":
        q = q.reshape(s, hd, n_local).permute(2, 0, 1)  # BUG-SITE: bug_axis_split
    else:
        q = q.reshape(s, n_local, hd).transpose(0, 1)
    k = k.reshape(s, n_local, hd).transpose(0, 1)
    v = v.reshape(s, n_local, hd).transpose(0, 1)
    # The bug scales by the width of the rank's projection instead of the head size.
    scale = 1.0 / math.sqrt(n_local * hd if bug == "bug_constant" else hd)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # BUG-SITE: bug_constant
    ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
    partial = F.linear(ctx.transpose(0, 1).reshape(s, n_local * hd), wo)
    if bug == "bug_wrong_groups":
        out = cc.spmd_all_reduce(SUM, partial, 1.0, [[0, 1], [2, 3]])  # BUG-SITE: bug_wrong_groups
    else:
        out = cc.spmd_all_reduce(SUM, partial, 1.0, group.replica_groups)
    return (out,)


# ---------------------------------------------------------------------------------------------
# Grouped-query attention with one fused QKV weight: rows [q heads | k heads | v heads], each
# block sharded by heads, so a rank holds [its q | its k | its v].


def _gqa(q: Tensor, k: Tensor, v: Tensor, n_q: int, n_kv: int, hd: int) -> Tensor:
    """(s, n_q*hd) queries against (s, n_kv*hd) keys/values; returns (s, n_q*hd)."""
    s = q.shape[0]
    q = q.reshape(s, n_q, hd).transpose(0, 1)
    k = k.reshape(s, n_kv, hd).transpose(0, 1)
    v = v.reshape(s, n_kv, hd).transpose(0, 1)
    rep = n_q // n_kv  # Llama's repeat_kv: each kv head serves `rep` query heads
    k = k[:, None].expand(n_kv, rep, s, hd).reshape(n_q, s, hd)
    v = v[:, None].expand(n_kv, rep, s, hd).reshape(n_q, s, hd)
    ctx = head_attention(q, k, v, 1.0 / math.sqrt(hd))
    return ctx.transpose(0, 1).reshape(s, n_q * hd)


def fused_qkv_baseline(
    x: Tensor, w_qkv: Tensor, wo: Tensor, *, n_heads: int, n_kv_heads: int
) -> tuple[Tensor, ...]:
    hd = x.shape[1] // n_heads
    qkv = F.linear(x, w_qkv)
    q = qkv[:, : n_heads * hd]
    k = qkv[:, n_heads * hd : (n_heads + n_kv_heads) * hd]
    v = qkv[:, (n_heads + n_kv_heads) * hd :]
    return (F.linear(_gqa(q, k, v, n_heads, n_kv_heads, hd), wo),)


def fused_qkv_distributed(
    cc: Collectives,
    group: Group,
    x: Tensor,
    w_qkv: Tensor,
    wo: Tensor,
    *,
    n_heads: int,
    n_kv_heads: int,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    hd = x.shape[1] // n_heads
    n_local, kv_local = n_heads // group.size, n_kv_heads // group.size
    qkv = F.linear(x, w_qkv)  # (s, [q | k | v] of this rank)
    q_width, kv_width = n_local * hd, kv_local * hd
    # The bug takes k from a third of the way in, as if q, k and v had the same width (MHA).
    k_start = qkv.shape[1] // 3 if bug == "bug_qkv_slice" else q_width
    q = qkv[:, :q_width]
    k = qkv[:, k_start : k_start + kv_width]  # BUG-SITE: bug_qkv_slice
    v = qkv[:, q_width + kv_width :]
    partial = F.linear(_gqa(q, k, v, n_local, kv_local, hd), wo)
    return (cc.spmd_all_reduce(SUM, partial, 1.0, group.replica_groups),)


# ---------------------------------------------------------------------------------------------
# Vocab-parallel embedding: Megatron's VocabParallelEmbedding.


def vocab_embedding_baseline(ids: Tensor, table: Tensor) -> tuple[Tensor, ...]:
    return (F.embedding(ids, table),)


def vocab_embedding_distributed(
    cc: Collectives, group: Group, ids: Tensor, table: Tensor, rank: Tensor
) -> tuple[Tensor, ...]:
    v_local = table.shape[0]
    local = ids - rank * v_local  # ids relative to this rank's vocabulary slice
    outside = (local < 0) | (local >= v_local)
    local = local.masked_fill(outside, 0)
    rows = F.embedding(local, table)
    rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)  # other ranks own these rows
    return (cc.spmd_all_reduce(SUM, rows, 1.0, group.replica_groups),)


# ---------------------------------------------------------------------------------------------
# Sequence parallelism: RMSNorm on this rank's tokens, all-gather the sequence, column -> row
# MLP, reduce-scatter back to the rank's tokens, residual.


def sp_norm_baseline(
    x: Tensor, norm_weight: Tensor, w_up: Tensor, w_down: Tensor, *, eps: float
) -> tuple[Tensor, ...]:
    normed = rms_norm(x, norm_weight, eps)
    h = F.gelu(F.linear(normed, w_up))
    return (x + F.linear(h, w_down),)


def sp_norm_distributed(
    cc: Collectives,
    group: Group,
    x: Tensor,
    norm_weight: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    eps: float,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    normed = rms_norm(x, norm_weight, eps)  # (s/c, h): this rank's tokens
    if bug == "bug_precision":
        normed = normed.to(torch.bfloat16).to(torch.float32)  # BUG-SITE: bug_precision
    full = cc.all_gather(normed, 0, groups=group.replica_groups, pin_layout=False)
    h = F.gelu(F.linear(full, w_up))
    partial = F.linear(h, w_down)
    y = cc.spmd_reduce_scatter(SUM, partial, 1.0, 0, group.size, group.replica_groups)
    return (x + y,)


# ---------------------------------------------------------------------------------------------
# Softmax over a vocabulary-sharded last dimension (vocab-parallel logits).


def softmax_baseline(logits: Tensor) -> tuple[Tensor, ...]:
    return (torch.softmax(logits, dim=-1),)


def softmax_distributed(cc: Collectives, group: Group, logits: Tensor) -> tuple[Tensor, ...]:
    local_max = logits.amax(dim=-1, keepdim=True)
    row_max = cc.spmd_all_reduce(MAX, local_max, 1.0, group.replica_groups)
    e = torch.exp(logits - row_max)
    local_sum = e.sum(dim=-1, keepdim=True)
    total = cc.spmd_all_reduce(SUM, local_sum, 1.0, group.replica_groups)
    return (e / total,)


# ---------------------------------------------------------------------------------------------
# Attention on a (b, s, h) input. The baseline stays in (b, s, h); the distributed side works
# on token rows in (s, b) order, like transformers-neuronx and Megatron's SBH layout, and must
# turn the result back: reshape (s*b, h) -> (s, b, h), then transpose.


def bsh_attention_baseline(
    x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor, *, n_heads: int
) -> tuple[Tensor, ...]:
    b, s, h = x.shape
    hd = h // n_heads
    q = F.linear(x, wq).reshape(b, s, n_heads, hd).transpose(1, 2)
    k = F.linear(x, wk).reshape(b, s, n_heads, hd).transpose(1, 2)
    v = F.linear(x, wv).reshape(b, s, n_heads, hd).transpose(1, 2)
    ctx = head_attention(q, k, v, 1.0 / math.sqrt(hd))  # (b, n, s, hd)
    return (F.linear(ctx.transpose(1, 2).reshape(b, s, h), wo),)


def bsh_attention_distributed(
    cc: Collectives,
    group: Group,
    x: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    *,
    n_heads: int,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    b, s, h = x.shape
    hd = h // n_heads
    n_local = n_heads // group.size
    rows = x.transpose(0, 1).reshape(s * b, h)  # token rows in (s, b) order
    q = F.linear(rows, wq).reshape(s, b, n_local, hd).permute(1, 2, 0, 3)
    k = F.linear(rows, wk).reshape(s, b, n_local, hd).permute(1, 2, 0, 3)
    v = F.linear(rows, wv).reshape(s, b, n_local, hd).permute(1, 2, 0, 3)
    ctx = head_attention(q, k, v, 1.0 / math.sqrt(hd))  # (b, n_local, s, hd)
    ctx = ctx.permute(2, 0, 1, 3).reshape(s * b, n_local * hd)
    attn = cc.spmd_all_reduce(SUM, F.linear(ctx, wo), 1.0, group.replica_groups)  # (s*b, h)
    if bug == "bug_bsh_layout":
        out = attn.reshape(b, s, h)  # BUG-SITE: bug_bsh_layout
    else:
        out = attn.reshape(s, b, h).transpose(0, 1)
    return (out,)


# ---------------------------------------------------------------------------------------------
# The pairs.


# ---------------------------------------------------------------------------------------------
# A stack of identical column->row MLP blocks with residuals, each in its own "layers.k" scope:
# the verifier cuts it at layer boundaries and proves the repeated layer once.


def deep_mlp_baseline(x: Tensor, *, layers: int, **weights: Tensor) -> tuple[Tensor, ...]:
    for k in range(layers):
        scope = layer_scope(f"model.layers.{k}")
        x = x + F.linear(F.gelu(F.linear(x, weights[f"w_up_{k}"])), weights[f"w_down_{k}"])
        del scope
    return (x,)


def deep_mlp_distributed(
    cc: Collectives, group: Group, x: Tensor, *, layers: int, bug_layer: int | None = None, **weights: Tensor
) -> tuple[Tensor, ...]:
    for k in range(layers):
        scope = layer_scope(f"model.layers.{k}")
        partial = F.linear(F.gelu(F.linear(x, weights[f"w_up_{k}"])), weights[f"w_down_{k}"])
        if k == bug_layer:
            x = x + partial  # BUG-SITE: bug_deep_mlp_late_layer
        else:
            x = x + cc.spmd_all_reduce(SUM, partial, 1.0, group.replica_groups)
        del scope
    return (x,)


@dataclass(frozen=True)
class Input:
    """One input: its whole (baseline) shape and how the ranks hold it."""

    name: str
    shape: tuple[int, ...]
    relation: str = "duplicate"  # duplicate | sharded | rank
    dim: int | None = None
    blocks: tuple[int, ...] | None = None  # sharded: ``dim`` is a concat of these, each sharded
    dtype: torch.dtype = torch.float32
    int_range: tuple[int, int] | None = None  # integer inputs: values in [lo, hi)

    def local_shape(self, c: int) -> tuple[int, ...]:
        if self.relation != "sharded":
            return self.shape
        assert self.dim is not None
        shape = list(self.shape)
        shape[self.dim] //= c
        return tuple(shape)

    def shard(self, whole: Tensor, rank: int, c: int) -> Tensor:
        """What ``rank`` holds of ``whole``."""
        if self.relation == "duplicate":
            return whole
        assert self.relation == "sharded" and self.dim is not None
        blocks = self.blocks or (self.shape[self.dim],)
        pieces = torch.split(whole, list(blocks), dim=self.dim)
        return torch.cat([p.chunk(c, dim=self.dim)[rank] for p in pieces], dim=self.dim)


@dataclass(frozen=True)
class Output:
    relation: str = "duplicate"  # duplicate | sharded
    dim: int | None = None


@dataclass(frozen=True)
class Pair:
    name: str
    description: str
    c: int
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    baseline: Callable[..., tuple[Tensor, ...]]
    distributed: Callable[..., tuple[Tensor, ...]]
    options: Mapping[str, Any] = field(default_factory=dict)  # keywords of both functions
    distributed_options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "diverged" if self.name.startswith("bug_") else "verified"

    @property
    def group(self) -> Group:
        return Group(tuple(range(self.c)))

    def run_baseline(self, tensors: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        args = {i.name: tensors[i.name] for i in self.inputs if i.relation != "rank"}
        return self.baseline(**args, **self.options)

    def run_distributed(self, cc: Collectives, tensors: Mapping[str, Tensor]) -> tuple[Tensor, ...]:
        args = {i.name: tensors[i.name] for i in self.inputs}
        return self.distributed(cc, self.group, **args, **self.options, **self.distributed_options)


S, H, FFN = 8, 32, 128  # sequence, hidden and MLP sizes of the small blocks
# 12 heads of 4 over 4 ranks: 3 heads per rank. A wrong head split (s, 3*4) -> (s, 4, 3) and a
# wrong (s*b, h) -> (b, s, h) with b=3, s=8 then cannot be re-expressed as a bijection even by
# splitting axes into sub-axes, so the reshape itself is where the relation breaks.
ATT_H, HEADS, BATCH = 48, 12, 3
QKV_H, QKV_HEADS, QKV_KV_HEADS = 64, 8, 4  # fused QKV, GQA: 2 query heads per kv head
VOCAB = 128


def _mlp_inputs() -> tuple[Input, ...]:
    return (
        Input("x", (S, H)),
        Input("w_up", (FFN, H), "sharded", dim=0),
        Input("b_up", (FFN,), "sharded", dim=0),
        Input("w_down", (H, FFN), "sharded", dim=1),
        Input("b_down", (H,)),
    )


def _attention_inputs(x_shape: tuple[int, ...]) -> tuple[Input, ...]:
    return (
        Input("x", x_shape),
        Input("wq", (ATT_H, ATT_H), "sharded", dim=0),
        Input("wk", (ATT_H, ATT_H), "sharded", dim=0),
        Input("wv", (ATT_H, ATT_H), "sharded", dim=0),
        Input("wo", (ATT_H, ATT_H), "sharded", dim=1),
    )


def _mlp(name: str, c: int, act: str, description: str, **dist: Any) -> Pair:
    return Pair(
        name, description, c, _mlp_inputs(), (Output(),), mlp_baseline, mlp_distributed,
        {"act": act}, dist,
    )  # fmt: skip


DEEP_LAYERS = 8


def _deep_mlp(name: str, description: str, **dist: Any) -> Pair:
    inputs = [Input("x", (S, H))]
    for k in range(DEEP_LAYERS):
        inputs += [Input(f"w_up_{k}", (FFN, H), "sharded", dim=0), Input(f"w_down_{k}", (H, FFN), "sharded", dim=1)]
    return Pair(
        name, description, 4, tuple(inputs), (Output(),), deep_mlp_baseline, deep_mlp_distributed,
        {"layers": DEEP_LAYERS}, dist,
    )  # fmt: skip


def _attention(name: str, description: str, **dist: Any) -> Pair:
    return Pair(
        name, description, 4, _attention_inputs((S, ATT_H)), (Output(),),
        attention_baseline, attention_distributed, {"n_heads": HEADS}, dist,
    )  # fmt: skip


def _fused_qkv(name: str, description: str, **dist: Any) -> Pair:
    hd = QKV_H // QKV_HEADS
    q, kv = QKV_HEADS * hd, QKV_KV_HEADS * hd
    inputs = (
        Input("x", (S, QKV_H)),
        Input("w_qkv", (q + 2 * kv, QKV_H), "sharded", dim=0, blocks=(q, kv, kv)),
        Input("wo", (QKV_H, QKV_H), "sharded", dim=1),
    )
    return Pair(
        name, description, 4, inputs, (Output(),), fused_qkv_baseline, fused_qkv_distributed,
        {"n_heads": QKV_HEADS, "n_kv_heads": QKV_KV_HEADS}, dist,
    )  # fmt: skip


def _sp_norm(name: str, description: str, **dist: Any) -> Pair:
    inputs = (
        Input("x", (S, H), "sharded", dim=0),
        Input("norm_weight", (H,)),
        Input("w_up", (FFN, H), "sharded", dim=0),
        Input("w_down", (H, FFN), "sharded", dim=1),
    )
    return Pair(
        name, description, 4, inputs, (Output("sharded", 0),), sp_norm_baseline,
        sp_norm_distributed, {"eps": 1e-6}, dist,
    )  # fmt: skip


def _bsh_attention(name: str, description: str, **dist: Any) -> Pair:
    return Pair(
        name, description, 4, _attention_inputs((BATCH, S, ATT_H)), (Output(),),
        bsh_attention_baseline, bsh_attention_distributed, {"n_heads": HEADS}, dist,
    )  # fmt: skip


PAIRS: dict[str, Pair] = {
    p.name: p
    for p in (
        _mlp(
            "mlp_tp2",
            2,
            "gelu",
            "Column->row parallel GELU MLP with residual over 2 ranks; the all-reduce is "
            "xm.all_reduce (XLA_ALWAYS_ALLREDUCE=1), so torch-xla threads its token through it.",
            token_allreduce=True,
        ),
        _mlp("mlp_tp4", 4, "gelu", "Column->row parallel GELU MLP with residual over 4 ranks."),
        _deep_mlp(
            "deep_mlp_tp4",
            f"{DEEP_LAYERS} identical column->row MLP layers with residuals, each in a layers.k "
            "scope: the verifier cuts at layer boundaries and proves the repeated layer once.",
        ),
        _deep_mlp(
            "bug_deep_mlp_late_layer",
            f"The all-reduce of layer {DEEP_LAYERS - 2} of {DEEP_LAYERS} is missing: the bug sits "
            "deep in a stack of otherwise identical layers.",
            bug_layer=DEEP_LAYERS - 2,
        ),
        _mlp("mlp_tp8", 8, "silu", "Column->row parallel SiLU MLP with residual over 8 ranks."),
        _attention(
            "attention_tp4",
            "Head-sharded attention: Q/K/V column-parallel (3 of 12 heads per rank), softmax "
            "per head, output projection row-parallel + all-reduce.",
        ),
        _fused_qkv(
            "fused_qkv_tp4",
            "Grouped-query attention with one fused QKV weight whose row blocks [q, k, v] are "
            "each sharded by heads; the rank slices its local fused output into q, k, v.",
        ),
        Pair(
            "vocab_embedding_tp4",
            "Vocab-parallel embedding: ids shifted by rank*V/c, out-of-range ids masked, masked "
            "gather, masked rows zeroed, all-reduce.",
            4,
            (
                Input("ids", (S,), dtype=torch.int32, int_range=(0, VOCAB)),
                Input("table", (VOCAB, H), "sharded", dim=0),
                Input("rank", (), "rank", dtype=torch.int32),
            ),
            (Output(),),
            vocab_embedding_baseline,
            vocab_embedding_distributed,
        ),
        _sp_norm(
            "sp_norm_tp4",
            "Sequence parallel: RMSNorm on the rank's tokens, all-gather along the sequence, "
            "column->row MLP, reduce-scatter along the sequence, residual; output sharded on dim 0.",
        ),
        Pair(
            "softmax_sharded_tp4",
            "Softmax over logits sharded along the last dim: local max, all-reduce(max), exp, "
            "local sum, all-reduce(sum), divide; output sharded on the last dim.",
            4,
            (Input("logits", (S, 64), "sharded", dim=1),),
            (Output("sharded", 1),),
            softmax_baseline,
            softmax_distributed,
        ),
        _bsh_attention(
            "layout_bijection_tp4",
            "Head-sharded attention on (b, s, h): the baseline stays in (b, s, h), the ranks "
            "compute on (s*b, h) rows and reshape to (s, b, h) then transpose back; relating "
            "the two reshape/transpose chains needs bijection inference.",
        ),
        _mlp(
            "bug_missing_allreduce",
            4,
            "gelu",
            "Row-parallel MLP output used without its all-reduce: the residual add consumes a "
            "partial sum (Megatron-LM 5fffdfc class).",
            bug="bug_missing_allreduce",
        ),
        _mlp(
            "bug_redundant_allreduce",
            4,
            "gelu",
            "The MLP output is all-reduced a second time, multiplying it by the group size "
            "(NeMo #9344 / TransformerEngine PR #3 class).",
            bug="bug_redundant_allreduce",
        ),
        _attention(
            "bug_wrong_groups",
            "Attention output projection all-reduced over {{0,1},{2,3}} instead of the whole "
            "group of 4.",
            bug="bug_wrong_groups",
        ),
        _sp_norm(
            "bug_precision",
            "Sequence-parallel block whose normalized activations are rounded through bf16 "
            "before the all-gather, where the baseline stays f32 (DeepSpeed #2071 class).",
            bug="bug_precision",
        ),
        _attention(
            "bug_axis_split",
            "Head split of the rank's queries reshapes (s, n/c*hd) to (s, hd, n/c) instead of "
            "(s, n/c, hd) (DeepSpeed #5808 / PR #5664 class).",
            bug="bug_axis_split",
        ),
        _bsh_attention(
            "bug_bsh_layout",
            "BSH attention output reshaped from (s*b, h) straight to (b, s, h) instead of "
            "(s, b, h) then transpose (transformers-neuronx 69d039d).",
            bug="bug_bsh_layout",
        ),
        _fused_qkv(
            "bug_qkv_slice",
            "Fused QKV: the rank slices k from its local fused output at a wrong offset "
            "(a third of the width, as for equal q/k/v), straddling the q and k blocks.",
            bug="bug_qkv_slice",
        ),
        _attention(
            "bug_constant",
            "Attention scale on the ranks is 1/sqrt(width of the rank's projection) instead "
            "of 1/sqrt(head size).",
            bug="bug_constant",
        ),
    )
}


def sample_inputs(pair: Pair, seed: int = 0) -> dict[str, Tensor]:
    """Whole (baseline) inputs with fixed values; ``rank`` inputs are filled in per rank."""
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for spec in pair.inputs:
        if spec.relation == "rank":
            continue
        if spec.int_range is not None:
            lo, hi = spec.int_range
            out[spec.name] = torch.randint(lo, hi, spec.shape, generator=generator).to(spec.dtype)
        else:
            # Weights scaled by 1/sqrt(fan-in) keep activations near unit size, so softmaxes do
            # not saturate and a changed constant still shows in the outputs.
            std = spec.shape[-1] ** -0.5 if spec.name.startswith("w") else 1.0
            out[spec.name] = torch.randn(spec.shape, generator=generator, dtype=spec.dtype) * std
    return out


# ---------------------------------------------------------------------------------------------
# Greedy decoding over vocab-parallel logits (an LM head whose vocabulary is sharded, as in
# Megatron): each rank takes the argmax of its slice, moves the index into the whole vocabulary
# by its rank offset, and the ranks agree on the row's maximum; the lowest index among the
# ranks holding it wins, as torch.argmax resolves ties. int64 max marks "not mine": the min
# over the ranks never picks it while some rank holds the maximum.


def greedy_argmax_baseline(logits: Tensor) -> tuple[Tensor, ...]:
    return (torch.argmax(logits, dim=-1),)


def greedy_argmax_distributed(
    cc: Collectives,
    group: Group,
    logits: Tensor,
    rank: Tensor,
    *,
    gather: bool = False,
    bug: str | None = None,
) -> tuple[Tensor, ...]:
    v_local = logits.shape[-1]
    local_max, local_index = logits.max(dim=-1)  # this rank's best token, indexed in its slice
    # The index in the whole vocabulary: the local index plus the rank's offset r*V/c. The
    # bug keeps the index within the rank's slice, as if every rank held the whole
    # vocabulary (torch.argmax on a shard answers within that shard).
    token = local_index if bug == "bug_argmax_rank_offset" else local_index + rank * v_local
    row_max = cc.spmd_all_reduce(MAX, local_max, 1.0, group.replica_groups)
    candidate = torch.where(local_max == row_max, token, torch.iinfo(torch.int64).max)  # BUG-SITE: bug_argmax_rank_offset
    if gather:
        # The argmin over the gathered candidates: amin on int64 starts from int64 max.
        candidates = cc.all_gather(candidate.unsqueeze(-1), -1, groups=group.replica_groups, pin_layout=False)
        return (candidates.amin(dim=-1),)
    return (cc.spmd_all_reduce(MIN, candidate, 1.0, group.replica_groups),)


def _greedy_argmax(name: str, description: str, **dist: Any) -> Pair:
    inputs = (
        Input("logits", (S, VOCAB), "sharded", dim=1),
        Input("rank", (), "rank", dtype=torch.int32),
    )
    return Pair(
        name, description, 4, inputs, (Output(),), greedy_argmax_baseline,
        greedy_argmax_distributed, {}, dist,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# T5 relative attention bias with its heads sharded: the bucket of each (query, key) position
# pair is the same on every rank (integer arithmetic and a float log, converted back to int64),
# each rank looks up its heads' columns of the bias table. The log's argument is clamped to
# [1, max_distance], so the float -> int64 convert only ever sees values in [-6, 16]: a bounded
# convert, whose result is the truncated value in every program.


def t5_bucket(q_len: int, k_len: int, device: Any, n_buckets: int, max_distance: int) -> Tensor:
    context = torch.arange(q_len, device=device)[:, None]
    memory = torch.arange(k_len, device=device)[None, :]
    relative = memory - context
    half = n_buckets // 2  # bidirectional: one half of the buckets for each direction
    buckets = (relative > 0).long() * half
    relative = relative.abs()
    max_exact = half // 2
    is_small = relative < max_exact
    scaled = torch.log(relative.clamp(1, max_distance).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (half - max_exact)).long()
    large = torch.min(large, torch.full_like(large, half - 1))
    return buckets + torch.where(is_small, relative, large)


def t5_bias_baseline(table: Tensor, *, n_buckets: int, max_distance: int) -> tuple[Tensor, ...]:
    bucket = t5_bucket(S, S, table.device, n_buckets, max_distance)
    return (F.embedding(bucket, table).permute(2, 0, 1),)


def t5_bias_distributed(
    cc: Collectives, group: Group, table: Tensor, *, n_buckets: int, max_distance: int
) -> tuple[Tensor, ...]:
    bucket = t5_bucket(S, S, table.device, n_buckets, max_distance)
    return (F.embedding(bucket, table).permute(2, 0, 1),)  # this rank's heads


MIN = "min"  # torch_xla.core.xla_model.REDUCE_MIN

PAIRS.update(
    (p.name, p)
    for p in (
        _greedy_argmax(
            "greedy_argmax_tp4",
            "Greedy decoding over vocab-parallel logits: local argmax (variadic reduce) plus "
            "the rank offset, all-reduce(max) of the local maxima, the ranks holding the "
            "maximum offer their index (others int64 max), all-reduce(min): the lowest index.",
        ),
        _greedy_argmax(
            "greedy_argmax_gather_tp4",
            "Vocab-parallel greedy argmax whose ranks all-gather their candidates and take the "
            "min with amin on int64 (a reduce from int64 max, 9223372036854775807).",
            gather=True,
        ),
        _greedy_argmax(
            "bug_argmax_rank_offset",
            "Vocab-parallel greedy argmax whose local index is not moved by the rank offset "
            "r*V/c: every rank reports an index within its own slice.",
            bug="bug_argmax_rank_offset",
        ),
        Pair(
            "t5_relative_bias_tp4",
            "T5 relative attention bias, heads sharded: bucketed relative positions (a log of "
            "the clamped distance converted f32 -> int64), the rank's columns of the bias table.",
            4,
            (Input("table", (32, 8), "sharded", dim=1),),
            (Output("sharded", 0),),
            t5_bias_baseline,
            t5_bias_distributed,
            {"n_buckets": 32, "max_distance": 128},
        ),
    )
)


# ---------------------------------------------------------------------------------------------
# Ulysses sequence parallelism (DeepSpeed-Ulysses): the ranks hold sequence blocks of
# (b, s, heads, hd); an all-to-all re-shards to head blocks of the whole sequence, attention runs
# per head, and a second all-to-all re-shards back to sequence blocks. The bug is DeepSpeed #5808:
# the sequence-parallel all-to-all of a (b*s/c, ...) tensor concatenates the received blocks
# along the merged batch-sequence dim, so for batch > 1 the batch rows and the sequence blocks
# interleave (right only when b == 1).

U_BATCH, U_SEQ, U_HEADS, U_HD = 2, 8, 8, 4


def ulysses_baseline(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, ...]:
    hd = q.shape[-1]
    ctx = head_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1.0 / math.sqrt(hd))
    return (ctx.transpose(1, 2),)


def ulysses_distributed(
    cc: Collectives, group: Group, q: Tensor, k: Tensor, v: Tensor, *, bug: str | None = None
) -> tuple[Tensor, ...]:
    assert cc.all_to_all is not None
    c, groups = group.size, group.replica_groups
    b, s_local, heads, hd = q.shape
    if bug == "bug_ulysses_batch_split":
        # (b, s/c, h, d) seen as (b*s/c, h, d): the received sequence blocks land after the
        # whole batch, in rank-major order, and the view back to (b, s, h/c, d) mixes them.
        merged = [t.reshape(b * s_local, heads, hd) for t in (q, k, v)]  # BUG-SITE: bug_ulysses_batch_split
        moved = [cc.all_to_all(t, 1, 0, c, groups=groups, pin_layout=False) for t in merged]
        q, k, v = (t.reshape(b, s_local * c, heads // c, hd) for t in moved)
    else:
        # heads split over the ranks (dim 2), sequence blocks concatenated (dim 1)
        q, k, v = (cc.all_to_all(t, 2, 1, c, groups=groups, pin_layout=False) for t in (q, k, v))
    ctx = head_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 1.0 / math.sqrt(hd))
    out = cc.all_to_all(ctx.transpose(1, 2), 1, 2, c, groups=groups, pin_layout=False)  # back to sequence blocks
    return (out,)


def _ulysses(name: str, description: str, **dist: Any) -> Pair:
    shape = (U_BATCH, U_SEQ, U_HEADS, U_HD)
    inputs = tuple(Input(n, shape, "sharded", dim=1) for n in ("q", "k", "v"))
    return Pair(name, description, 4, inputs, (Output("sharded", 1),), ulysses_baseline, ulysses_distributed, {}, dist)


PAIRS.update(
    (p.name, p)
    for p in (
        _ulysses(
            "ulysses_attention_tp4",
            "Ulysses sequence-parallel attention: all-to-all from sequence blocks to head blocks, "
            "attention per head over the whole sequence, all-to-all back to sequence blocks.",
        ),
        _ulysses(
            "bug_ulysses_batch_split",
            "DeepSpeed #5808: the Ulysses all-to-all concatenates along the merged (batch x "
            "sequence) dim, so with batch > 1 batch rows and sequence blocks interleave.",
            bug="bug_ulysses_batch_split",
        ),
    )
)
