"""A Llama-style decoder: grouped-query attention with rotary embeddings (optional per-head
q/k RMSNorm), RMSNorm, SwiGLU or a Mixtral-style mixture of experts, tensor parallel over heads
and FFN features, optionally sequence parallel, with a vocab-parallel embedding and LM head.

Activations use Megatron's ``(s, b, h)`` layout; token ids and logits are batch-first ``(b, s)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    rotary_tables,
)
from .moe import MoE
from .parallel import Parallel, all_reduce_sum, gather_sequence


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 256
    hidden: int = 64
    layers: int = 2
    heads: int = 8
    kv_heads: int = 4
    ffn: int = 128
    seq: int = 16
    batch: int = 2
    rope_theta: float = 500000.0
    eps: float = 1e-5
    qk_norm: bool = False
    fused: bool = True  # Megatron-style fused [q | k | v] and [gate | up]; False: Meta-Llama's separate projections
    # Fewer KV heads than ranks: every rank keeps the whole KV projection and uses the KV head
    # its query heads share. Set for the baseline too, so both have the same parameters.
    replicate_kv: bool = False
    experts: int = 0  # > 0: a mixture of experts replaces the MLP (Mixtral)
    top_k: int = 2
    bug_layer: int = -1  # >= 0: the per-rank build's bug variant reaches this decoder layer only

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Attention(nn.Module):
    """Heads split over the ranks. With fewer KV heads than ranks (Llama-3.1-405B at TP 32),
    every rank keeps all KV projections and picks the KV head its query heads share."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        self.cfg, self.ps = cfg, ps
        hd = cfg.head_dim
        self.n_local = ps.shard(cfg.heads, "attention heads")
        self.replicated_kv = cfg.replicate_kv
        if self.replicated_kv:
            self.kv_local = 1 if ps.tp > 1 else cfg.kv_heads
            self.q = ColumnParallelLinear(cfg.hidden, cfg.heads * hd, ps)
            self.kv = nn.Linear(cfg.hidden, 2 * cfg.kv_heads * hd, bias=False)
        else:
            self.kv_local = ps.shard(cfg.kv_heads, "KV heads")
            if cfg.fused:
                # Fused [q | k | v] rows, each block split by heads: plan {blocks: [q, kv, kv]}.
                self.qkv = ColumnParallelLinear(cfg.hidden, (cfg.heads + 2 * cfg.kv_heads) * hd, ps)
            else:
                self.q = ColumnParallelLinear(cfg.hidden, cfg.heads * hd, ps)
                self.k = ColumnParallelLinear(cfg.hidden, cfg.kv_heads * hd, ps)
                self.v = ColumnParallelLinear(cfg.hidden, cfg.kv_heads * hd, ps)
        self.out = RowParallelLinear(cfg.heads * hd, cfg.hidden, ps, reduce=not ps.has("missing_attn_allreduce"))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.eps)
            self.k_norm = RMSNorm(hd, cfg.eps)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hd, ps = self.cfg.head_dim, self.ps
        if self.replicated_kv:
            q = self.q(x)
            s, b = q.shape[:2]
            kv = F.linear(x if not ps.sequence_parallel else gather_sequence(x, ps), self.kv.weight)
            kv = kv.reshape(s, b, 2, self.cfg.kv_heads, hd)
            if ps.tp > 1:
                group = torch.div(ps.rank * self.n_local, self.cfg.heads // self.cfg.kv_heads, rounding_mode="floor")
                kv = torch.index_select(kv, 3, group.reshape(1))
            k, v = kv[:, :, 0], kv[:, :, 1]
            return q.reshape(s, b, self.n_local, hd), k, v
        if self.cfg.fused:
            qkv = self.qkv(x)  # (s, b, [q | k | v] of this rank's heads)
            qw, kvw = self.n_local * hd, self.kv_local * hd
            k_at = qkv.shape[-1] // 3 if ps.has("qkv_slice_offset") else qw
            q = qkv[..., :qw]
            k = qkv[..., k_at : k_at + kvw]  # BUG-SITE: qkv_slice_offset
            v = qkv[..., qw + kvw :]
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        s, b = q.shape[:2]
        if ps.has("head_split_axis"):
            q = q.reshape(s, b, hd, self.n_local).transpose(2, 3)  # BUG-SITE: head_split_axis
        else:
            q = q.reshape(s, b, self.n_local, hd)
        return q, k.reshape(s, b, self.kv_local, hd), v.reshape(s, b, self.kv_local, hd)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        cfg, ps = self.cfg, self.ps
        hd, half = cfg.head_dim, cfg.head_dim // 2
        q, k, v = self._project(x)
        s, b = q.shape[:2]
        norm_late = ps.has("qk_norm_after_rope")
        if cfg.qk_norm and not norm_late:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.reshape(s, 1, 1, hd), sin.reshape(s, 1, 1, hd)
        if ps.has("rotary_precision"):
            # The rank applies the rotary embedding under bf16 autocast; the baseline in f32.
            q, k, cos, sin = q.bfloat16(), k.bfloat16(), cos.bfloat16(), sin.bfloat16()  # BUG-SITE: rotary_precision
        q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin  # BUG-SITE: qk_norm_after_rope
        k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
        q, k = q.to(x.dtype), k.to(x.dtype)
        if cfg.qk_norm and norm_late:
            q, k = self.q_norm(q), self.k_norm(k)
        # Query heads grouped by the KV head they share (Llama's repeat_kv without the copy):
        # q (b, groups, rep, s, hd) against k, v (b, groups, s, hd).
        rep = self.n_local // self.kv_local
        q = q.permute(1, 2, 0, 3).reshape(b, self.kv_local, rep, s, hd)
        k, v = k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)
        scale = 1.0 / math.sqrt(hd)
        if ps.has("attn_scale_one_rank"):
            scale = torch.where(ps.rank == ps.tp - 1, 1.0 / math.sqrt(half), scale)  # BUG-SITE: attn_scale_one_rank
        scores = torch.einsum("bgrsd,bgtd->bgrst", q, k) * scale
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        ctx = torch.einsum("bgrst,bgtd->bgrsd", torch.softmax(scores, dim=-1), v)
        ctx = ctx.permute(3, 0, 1, 2, 4).reshape(s, b, self.n_local * hd)
        return self.out(ctx)


class MLP(nn.Module):
    """SwiGLU; fused: one column-parallel [gate | up] projection (plan blocks [ffn, ffn])."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        self.ps, self.fused = ps, cfg.fused
        if cfg.fused:
            self.gate_up = ColumnParallelLinear(cfg.hidden, 2 * cfg.ffn, ps)
        else:
            self.gate = ColumnParallelLinear(cfg.hidden, cfg.ffn, ps)
            self.up = ColumnParallelLinear(cfg.hidden, cfg.ffn, ps)
        self.down = RowParallelLinear(cfg.ffn, cfg.hidden, ps)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1) if self.fused else (self.gate(x), self.up(x))
        y = self.down(F.silu(gate) * up)
        if self.ps.has("redundant_mlp_allreduce"):
            y = all_reduce_sum(y, self.ps)  # BUG-SITE: redundant_mlp_allreduce
        return y


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        self.ps = ps
        self.attn_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.attn = Attention(cfg, ps)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp: nn.Module = MoE(cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k, ps) if cfg.experts else MLP(cfg, ps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        normed = self.attn_norm(x)
        if self.ps.has("sp_norm_precision"):
            normed = normed.to(torch.bfloat16).to(x.dtype)  # BUG-SITE: sp_norm_precision
        h = x + self.attn(normed, cos, sin)  # BUG-SITE: missing_attn_allreduce
        return h + self.mlp(self.mlp_norm(h))  # BUG-SITE: moe_missing_allreduce


class Llama(nn.Module):
    """Token ids (b, s) to logits (b, s, vocab), or to the mean cross-entropy given targets."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        self.cfg, self.ps = cfg, ps
        self.embed = VocabParallelEmbedding(cfg.vocab, cfg.hidden, ps)
        # With bug_layer, every other layer runs the correct code path (a regression that
        # reaches one layer, e.g. through a per-layer config).
        self.layers = nn.ModuleList(DecoderLayer(cfg, ps if cfg.bug_layer in (-1, i) else replace(ps, bug=None)) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)
        self.head = ParallelLMHead(cfg.hidden, cfg.vocab, ps)

    def forward(self, tokens: Tensor, targets: Tensor | None = None) -> Tensor:
        cfg, ps = self.cfg, self.ps
        b, s = tokens.shape
        x = self.embed(tokens.t())  # (s, b, h); (s/c, b, h) under sequence parallelism
        cos, sin = rotary_tables(s, cfg.head_dim, cfg.rope_theta, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        if ps.sequence_parallel:
            x = gather_sequence(x, ps)
        rows = x.reshape(s * b, cfg.hidden)  # token rows in (s, b) order
        if targets is not None:
            return self.head.loss(rows, targets.t().reshape(s * b))
        logits = self.head(rows)
        if ps.has("bsh_logits_layout"):
            return logits.reshape(b, s, cfg.vocab)  # BUG-SITE: bsh_logits_layout
        return logits.reshape(s, b, cfg.vocab).transpose(0, 1)
