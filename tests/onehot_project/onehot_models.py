"""A top-1 router's one-hot dispatch mask over sequence-parallel tokens (tests/test_laws_onehot.py):
``F.one_hot`` of each token's expert id (torch-xla lowers it to an overwriting scatter at
(token row, expert id)) times the softmax of the router's logits. Every rank holds a block of
the tokens and computes the mask of its own rows; the output is that block of the baseline's.
The bug variant looks the ids up in reversed token order (a wrong permutation of the rows)."""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class Router(nn.Module):
    def __init__(self, dim: int, experts: int, bug: bool = False) -> None:
        super().__init__()
        self.wg = nn.Linear(dim, experts, bias=False)
        self.experts = experts
        self.bug = bug

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        if self.bug:
            ids = ids.flip(0)  # BUG-SITE: reversed_ids
        mask = F.one_hot(ids, self.experts).to(x.dtype)
        return mask * F.softmax(self.wg(x), dim=-1)


def router(ctx: BuildContext) -> Model:
    dim, experts, tokens = ctx.knob("dim", 8), ctx.knob("experts", 4), ctx.knob("tokens", 8)
    return Model(
        baseline=Router(dim, experts),
        distributed=lambda rank: Router(dim, experts, bug=ctx.variant == "reversed_ids"),
        inputs=[Input("x", (tokens, dim), shard=0), Input("ids", (tokens,), "int64", shard=0, int_range=(0, experts))],
        outputs=[{"shard": 0}],
        description="one-hot dispatch mask of sequence-parallel tokens (F.one_hot: an overwriting scatter)",
    )
