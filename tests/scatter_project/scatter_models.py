"""Models whose backward is an HLO scatter, declared for shardproof's front end
(tests/test_scatter.py builds them with torch-xla).

``embedding_grad``: the gradient of an embedding table under vocabulary parallelism (Megatron's
VocabParallelEmbedding): rank r owns rows [r·w, (r+1)·w), looks up only the ids in its block
(the others masked to row 0 and zeroed) and differentiates; the table's gradient is an index_add
(scatter-add) of the incoming gradient, and rank r's is block r of the whole table's.

``index_add``: index_add of partial (or identical) updates into zeros.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from tplm.parallel import Parallel, reduce_from_region

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class EmbeddingGrad(nn.Module):
    """(ids, g) -> d/d(table) of sum(lookup(ids) * g)."""

    def __init__(self, rows: int, hidden: int, rank: Any = None) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.empty(rows, hidden))
        self.rank = rank

    def forward(self, ids: Tensor, g: Tensor) -> Tensor:
        if self.rank is None:
            out = F.embedding(ids, self.table)
        else:
            width = self.table.shape[0]
            local = ids - self.rank * width
            outside = (local < 0) | (local >= width)
            local = local.masked_fill(outside, 0)
            out = F.embedding(local, self.table).masked_fill(outside.unsqueeze(-1), 0.0)
        (grad,) = torch.autograd.grad((out * g).sum(), [self.table])
        return grad


def embedding_grad(ctx: BuildContext) -> Model:
    vocab, hidden, tokens = ctx.knob("vocab", 32), ctx.knob("hidden", 8), ctx.knob("tokens", 12)
    return Model(
        baseline=EmbeddingGrad(vocab, hidden),
        distributed=lambda rank: EmbeddingGrad(vocab // ctx.tp, hidden, rank),
        inputs=[Input("ids", (tokens,), "int64", int_range=(0, vocab)), Input("g", (tokens, hidden))],
        plan={"table": {"shard": 0}},
        outputs=[{"shard": 0}],
        description="embedding table gradient under vocabulary parallelism (index_add)",
    )


class IndexAdd(nn.Module):
    """(x, w, ids) -> zeros(rows, h).index_add(0, ids, x @ w): rows gathered by index (the
    backward of a row lookup). With ``mode="partial"`` the ranks split the contraction (x along
    1, w along 0), index_add their partial products and all-reduce the result; with
    ``mode="dup"`` every rank computes the whole product and no collective runs."""

    def __init__(self, rows: int, ps: Parallel, mode: str) -> None:
        super().__init__()
        self.rows, self.ps, self.mode = rows, ps, mode

    def forward(self, x: Tensor, w: Tensor, ids: Tensor) -> Tensor:
        y = x @ w
        z = torch.zeros(self.rows, y.shape[1], dtype=y.dtype, device=y.device).index_add(0, ids, y)
        return reduce_from_region(z, self.ps) if self.mode == "partial" else z


def index_add(ctx: BuildContext) -> Model:
    rows, n, k, h = ctx.knob("rows", 16), ctx.knob("tokens", 12), ctx.knob("inner", 8), ctx.knob("hidden", 8)
    mode = ctx.knob("mode", "partial")
    if mode not in ("partial", "dup"):
        raise ValueError(f"mode {mode!r}: expected partial or dup")
    shard = mode == "partial"
    return Model(
        baseline=IndexAdd(rows, Parallel(), mode),
        distributed=lambda rank: IndexAdd(rows, Parallel(ctx.tp, rank, ctx.groups), mode),
        inputs=[
            Input("x", (n, k), shard=1 if shard else None),
            Input("w", (k, h), shard=0 if shard else None),
            Input("ids", (n,), "int64", int_range=(0, rows)),
        ],
        description=f"index_add of {'partial' if shard else 'identical'} updates into zeros",
    )
