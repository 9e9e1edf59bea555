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
    # Heads that do not divide over the ranks (Mixtral-8x22B's 48 at TP 32), as Neuron lays them
    # out: query heads padded to a multiple of the degree (zero weights), the KV projection
    # replicated, and each rank picks the KV head of each of its query heads. pad_ffn: the FFN
    # features padded likewise. Set for the baseline too, so both have the same parameters.
    pad_heads: bool = False
    pad_ffn: bool = False
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
        self.padded_heads = cfg.pad_heads
        self.n_local = ps.padded(cfg.heads) if cfg.pad_heads else ps.shard(cfg.heads, "attention heads")
        self.replicated_kv = cfg.replicate_kv and not cfg.pad_heads
        if self.padded_heads:
            # Every query head of the rank gets its own KV head (rep 1); ranks past the last
            # real head hold only padding.
            self.kv_local = self.n_local
            self.q = ColumnParallelLinear(cfg.hidden, cfg.heads * hd, ps, pad_unit=hd)
            self.kv = nn.Linear(cfg.hidden, 2 * cfg.kv_heads * hd, bias=False)
        elif self.replicated_kv:
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
        self.out = RowParallelLinear(cfg.heads * hd, cfg.hidden, ps, reduce=not ps.has("missing_attn_allreduce"), pad_unit=hd if cfg.pad_heads else 0)
        if cfg.pad_heads and ps.has("padded_head_leak"):
            # The rank pads its output projection by repeating the last head's columns instead
            # of zeros: its whole weight replicated, its columns picked by position.
            self.out = nn.Linear(cfg.heads * hd, cfg.hidden, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.eps)
            self.k_norm = RMSNorm(hd, cfg.eps)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hd, ps = self.cfg.head_dim, self.ps
        if self.padded_heads:
            return self._project_padded(x)
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

    def _project_padded(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q of the rank's w query heads (padding past the last head), and the KV head of each:
        the replicated KV heads expanded to one per query head (Llama's repeat_kv), of which
        the rank takes rows r·w .. r·w + w - 1 (past the last head the gather clamps to it:
        those heads' values meet zero output weights)."""
        cfg, ps, hd = self.cfg, self.ps, self.cfg.head_dim
        q = self.q(x)
        s, b = q.shape[:2]
        kv = F.linear(x if not ps.sequence_parallel else gather_sequence(x, ps), self.kv.weight)
        kv = kv.reshape(s, b, 2, cfg.kv_heads, hd)
        group = cfg.heads // cfg.kv_heads
        if ps.has("padded_kv_index"):
            kv = kv.repeat(1, 1, 1, group, 1)  # BUG-SITE: padded_kv_index
        else:
            kv = kv.repeat_interleave(group, dim=3)  # query head h uses KV head h // group
        if ps.tp > 1:
            heads = ps.rank * self.n_local + torch.arange(self.n_local, device=x.device)
            kv = torch.index_select(kv, 3, heads)
        return q.reshape(s, b, self.n_local, hd), kv[:, :, 0], kv[:, :, 1]

    def _out_padded_leak(self, ctx: Tensor) -> Tensor:
        ps, width = self.ps, ctx.shape[-1]
        # Columns past the last head clamp to it, so the padded heads add the last head's
        # projection of their (nonzero) contexts.
        cols = torch.index_select(self.out.weight, 1, ps.rank * width + torch.arange(width, device=ctx.device))
        return all_reduce_sum(F.linear(ctx, cols), ps)  # BUG-SITE: padded_head_leak

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
        if cfg.pad_heads and ps.has("padded_head_leak"):
            return self._out_padded_leak(ctx)
        return self.out(ctx)


class MLP(nn.Module):
    """SwiGLU; fused: one column-parallel [gate | up] projection (plan blocks [ffn, ffn])."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        # Padded FFN features (they do not divide over the ranks): separate gate and up, each
        # padded with zero rows, down with zero columns; silu(0)·0 = 0 on the padding.
        self.ps, self.fused = ps, cfg.fused and not cfg.pad_ffn
        unit = 1 if cfg.pad_ffn else 0
        if self.fused:
            self.gate_up = ColumnParallelLinear(cfg.hidden, 2 * cfg.ffn, ps)
        else:
            self.gate = ColumnParallelLinear(cfg.hidden, cfg.ffn, ps, pad_unit=unit)
            self.up = ColumnParallelLinear(cfg.hidden, cfg.ffn, ps, pad_unit=unit)
        self.down = RowParallelLinear(cfg.ffn, cfg.hidden, ps, pad_unit=unit)

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
