"""Minimal models whose correct distributed version the verifier does not prove yet (or, for
``vocab_embedding_frontier_noise``, whose divergence it does not localize). Each is a gap of
the verifier, found while writing examples/tplm, reduced to the few ops that show it; see the
README.md in each folder. ``generate.py`` rebuilds the pairs with the front end.

Collectives are torch-xla's token-free ops, called directly, so no wrapper sits between the
model line and the op.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla
from torch import Tensor

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def _all_reduce(x: Tensor, groups: list[list[int]]) -> Tensor:
    return torch_xla._XLAC._xla_spmd_all_reduce("sum", x, 1.0, groups)


def _masked_lookup(ids: Tensor, table: Tensor, rank: Tensor | None) -> Tensor:
    """Megatron's VocabParallelEmbedding lookup (rank None: the whole table)."""
    if rank is None:
        return F.embedding(ids, table)
    width = table.shape[0]
    local = ids - rank * width
    outside = (local < 0) | (local >= width)
    rows = F.embedding(local.masked_fill(outside, 0), table)
    return rows.masked_fill(outside.unsqueeze(-1), 0.0)


def vocab_embedding_int64_ids(ctx: BuildContext) -> Model:
    """Vocab-parallel embedding of int64 ids: torch-xla converts the masked ids to u32 before
    the gather, and the vocab-parallel rule wants the masked select as the gather's index."""

    def program(rank: Tensor | None) -> object:
        def f(ids: Tensor, table: Tensor) -> Tensor:
            rows = _masked_lookup(ids, table, rank)
            return rows if rank is None else _all_reduce(rows, ctx.groups)

        return f

    return Model(
        baseline=program(None),
        distributed=program,
        inputs=[Input("ids", (8,), "int64", int_range=(0, 128)), Input("table", (128, 32), shard=0)],
    )


def fused_block_reshape(ctx: BuildContext) -> Model:
    """A fused [q | k | v] column-parallel weight (each block sharded) applied with F.linear to
    a (s, b, h) input: torch-xla flattens to 2-D, multiplies, and reshapes back, and block
    sharding is not carried through that reshape although it leaves the sharded dim whole."""
    q, kv = 32, 16

    def program(c: int) -> object:
        def f(x: Tensor, w: Tensor) -> Tensor:
            qkv = F.linear(x, w)
            return qkv[..., : q // c]

        return f

    return Model(
        baseline=program(1),
        distributed=lambda rank: program(ctx.tp),
        inputs=[Input("x", (8, 2, 32)), Input("w", (q + 2 * kv, 32), shard=0, blocks=(q, kv, kv))],
        outputs=[{"shard": 2}],
    )


def one_head_per_rank(ctx: BuildContext) -> Model:
    """Rotary-style multiply of (s, b, heads, hd) keys by a (s, 1, 1, hd) table when each rank
    holds exactly one head: the per-rank head dim has extent 1, and the table's broadcast into
    it is not recognised as a broadcast into the sharded axis (two heads per rank verify)."""

    def f(k: Tensor) -> Tensor:
        s, _, _, hd = k.shape
        angles = torch.arange(s, device=k.device, dtype=torch.float32)[:, None] * torch.arange(hd, device=k.device, dtype=torch.float32)
        return k * angles.cos().reshape(s, 1, 1, hd)

    batch = ctx.knob("batch", 2)
    return Model(
        baseline=f,
        distributed=lambda rank: f,
        inputs=[Input("k", (8, batch, ctx.tp, 4), shard=2)],
        outputs=[{"shard": 2}],
    )


def fused_block_concat(ctx: BuildContext) -> Model:
    """Concatenating the per-block shards of a fused [q | k | v] output along the sharded dim
    gives the fused tensor sharded block-wise (what the backward of a fused split computes)."""
    q, kv = 32, 16

    def program(c: int) -> object:
        def f(x: Tensor, w: Tensor) -> Tensor:
            qkv = x @ w.t()
            a, b, d = qkv.split([q // c, kv // c, kv // c], dim=-1)
            return torch.cat((a * 2.0, b * 3.0, d * 4.0), dim=-1)

        return f

    return Model(
        baseline=program(1),
        distributed=lambda rank: program(ctx.tp),
        inputs=[Input("x", (8, 32)), Input("w", (q + 2 * kv, 32), shard=0, blocks=(q, kv, kv))],
        outputs=[{"shard": 1, "blocks": [q, kv, kv]}],
    )


def vocab_embedding_frontier_noise(ctx: BuildContext) -> Model:
    """A BSH layout bug after a vocab-parallel embedding: the rows (s·b, h) are reshaped straight
    to (b, s, h). The verdict is diverged, but the frontier lists the embedding's masked gather
    and mask broadcast (intermediates of the proven vocab-parallel pattern) and the reshape,
    the real divergence, is not reported."""
    b, s, h = 2, 4, 32

    def program(rank: Tensor | None, bug: bool) -> object:
        def f(ids: Tensor, table: Tensor) -> Tensor:
            rows = _masked_lookup(ids.t().reshape(s * b), table, rank)
            if rank is not None:
                rows = _all_reduce(rows, ctx.groups)
            if bug:
                return rows.reshape(b, s, h)  # BUG-SITE: vocab_embedding_frontier_noise
            return rows.reshape(s, b, h).transpose(0, 1)

        return f

    return Model(
        baseline=program(None, False),
        distributed=lambda rank: program(rank, True),
        inputs=[Input("ids", (b, s), "int32", int_range=(0, 128)), Input("table", (128, h), shard=0)],
    )


def fused_block_pad(ctx: BuildContext) -> Model:
    """Padding each block's shard of a fused [q | k | v] tensor back to the fused width and adding
    the three: what autograd computes for the gradient of ``qkv[..., a:b]`` slices (slice
    backward is a pad), so every training step of a fused QKV model whose q, k, v are sliced
    by indexing meets it."""
    q, kv = 32, 16

    def program(c: int) -> object:
        qw, kw = q // c, kv // c
        width = qw + 2 * kw

        def f(x: Tensor, w: Tensor) -> Tensor:
            qkv = x @ w.t()
            a, b, d = qkv[:, :qw] * 2.0, qkv[:, qw : qw + kw] * 3.0, qkv[:, qw + kw :] * 4.0
            return F.pad(a, (0, width - qw)) + F.pad(b, (qw, kw)) + F.pad(d, (qw + kw, 0))

        return f

    return Model(
        baseline=program(1),
        distributed=lambda rank: program(ctx.tp),
        inputs=[Input("x", (8, 32)), Input("w", (q + 2 * kv, 32), shard=0, blocks=(q, kv, kv))],
        outputs=[{"shard": 1, "blocks": [q, kv, kv]}],
    )


def one_expert_per_rank(ctx: BuildContext) -> Model:
    """Top-1 mask of router logits split over the experts with one expert per rank: the baseline
    compares (T, E) logits with the row maximum broadcast from (T, 1); on a rank the logits are
    (T, 1) already, so torch-xla compares with the (T, 1) maximum directly, with no broadcast
    for the broadcast-into-the-sharded-axis law to act on."""

    def program(rank: Tensor | None) -> object:
        def f(logits: Tensor) -> Tensor:
            top = logits.amax(dim=-1, keepdim=True)
            if rank is not None:
                top = torch_xla._XLAC._xla_spmd_all_reduce("max", top, 1.0, ctx.groups)
            return logits.masked_fill(logits < top, 0.0)

        return f

    return Model(
        baseline=program(None),
        distributed=program,
        inputs=[Input("logits", (16, ctx.tp), shard=1)],
        outputs=[{"shard": 1}],
    )


def kv_heads_fewer_than_ranks(ctx: BuildContext) -> Model:
    """Grouped-query attention with fewer KV heads than ranks (Llama-3.1-405B at TP 32): every
    rank holds the whole (replicated) keys and picks the KV head its query head shares, head
    ``r // (c / kv_heads)``: a rank-dependent index that is not affine in the rank."""
    heads, kv = ctx.tp, ctx.tp // 2

    def program(rank: Tensor | None) -> object:
        def f(q: Tensor, k: Tensor) -> Tensor:
            if rank is None:
                k = k.repeat_interleave(heads // kv, dim=1)  # (s, heads, hd): head h uses KV head h // 2
            else:
                group = torch.div(rank, heads // kv, rounding_mode="floor")
                k = torch.index_select(k, 1, group.reshape(1))  # (s, 1, hd)
            return (q * k).sum(dim=-1)

        return f

    return Model(
        baseline=program(None),
        distributed=program,
        inputs=[Input("q", (8, heads, 4), shard=1), Input("k", (8, kv, 4))],
        outputs=[{"shard": 1}],
    )


def dp_batch_rows(ctx: BuildContext) -> Model:
    """Data parallelism on a two-layer MLP: the (s, b, h) input split along the batch, so the
    rank's (s, b/c, h) flattens to rows that are every b-th block of b/c rows of the baseline's
    (s·b, h); each rank differentiates the MEAN loss of its own shard (autograd seeds it with
    1/(n/c), the baseline with 1/n), the seed travels through the activation's backward, and each
    weight gradient, a dot over those rows, is summed over the group and divided by c (DDP's
    average)."""
    seq, batch, hidden, ffn = 4, 8, 16, 32

    class Step(torch.nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.c = c
            self.up = torch.nn.Parameter(torch.empty(ffn, hidden))
            self.down = torch.nn.Parameter(torch.empty(hidden, ffn))

        def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
            y = F.linear(F.silu(F.linear(x, self.up)), self.down)
            local = ((y - target) ** 2).mean()
            grads = torch.autograd.grad(local, [self.up, self.down])
            return tuple(_all_reduce(g, [list(range(self.c))]) / self.c if self.c > 1 else g for g in grads)

    return Model(
        baseline=Step(1),
        distributed=lambda rank: Step(ctx.tp),
        inputs=[Input("x", (seq, batch, hidden), shard=1), Input("target", (seq, batch, hidden), shard=1)],
        plan={"up": "replicate", "down": "replicate"},
        outputs=["replicate", "replicate"],
    )
