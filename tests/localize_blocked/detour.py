"""A layout bug behind a proven detour (torch-xla, tests/test_localize_blocked.py).

A vocab-parallel embedding (masked lookup, all-reduce), then a value computed on the distributed
side only (a sort) that a select with an all-true mask discards: the rules prove the select equal
to its kept operand, so the sort, though unrelated, is no cause. The real bug is the reshape of
the (s·b, h) rows straight to (b, s, h)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch_xla
from torch import Tensor

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def _all_reduce(x: Tensor, groups: list[list[int]]) -> Tensor:
    return torch_xla._XLAC._xla_spmd_all_reduce("sum", x, 1.0, groups)


def _lookup(ids: Tensor, table: Tensor, rank: Tensor | None) -> Tensor:
    if rank is None:
        return F.embedding(ids, table)
    width = table.shape[0]
    local = ids - rank * width
    outside = (local < 0) | (local >= width)
    rows = F.embedding(local.masked_fill(outside, 0), table)
    return rows.masked_fill(outside.unsqueeze(-1), 0.0)


def embedding_detour(ctx: BuildContext) -> Model:
    b, s, h = 2, 4, 32

    def program(rank: Tensor | None) -> object:
        def f(ids: Tensor, table: Tensor) -> Tensor:
            rows = _lookup(ids.t().reshape(s * b), table, rank)
            if rank is None:
                return rows.reshape(s, b, h).transpose(0, 1)
            rows = _all_reduce(rows, ctx.groups)
            unused = torch.sort(rows, dim=0).values  # DETOUR
            rows = torch.where(torch.ones_like(rows, dtype=torch.bool), rows, unused)
            return rows.reshape(b, s, h)  # BUG-SITE

        return f

    return Model(
        baseline=program(None),
        distributed=program,
        inputs=[Input("ids", (b, s), "int32", int_range=(0, 128)), Input("table", (128, h), shard=0)],
    )
