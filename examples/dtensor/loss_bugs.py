"""Regressions patched into DTensor's loss_parallel cross entropy, in the distributed build only.

``apply(variant)`` replaces the nll_loss forward that ``loss_parallel()`` runs on logits sharded
over the vocabulary with this file's own spelling of it, with one line changed (marked
``# BUG-SITE: <variant>``), the way a fork of torch.distributed.tensor would regress. Only the
plain case is replaced (reduction='mean', no class weights); every other call goes to PyTorch's.

The correct computation, for log-probabilities x' (rank r holds vocabulary block
[r·w, r·w + w)) and labels t identical on every rank:
  safe = t where t != ignore_index else 0;  s' = safe - r·w;  m' = (s' < 0) | (s' >= w);
  pick' = x'[i, s'] where not m', 0 where m';  q = all-reduce(add, pick');
  loss = sum_i(-q[i] where t[i] != ignore_index) / count(t != ignore_index).

``label_offset_next_shard``: the labels are shifted by the next rank's offset ((r + 1)·w), so
    each rank picks from its own block the log-probabilities of the next block's labels.
``picks_not_reduced``: the all-reduce of the picks is dropped (a "redundant collective"
    removed): each rank's loss sums only the labels of its own block.
``local_count``: the mean divides by the number of labels in this rank's block instead of all
    kept labels.
``ignore_not_masked``: the ignored labels' losses are not zeroed (each adds the
    log-probability of class 0, where the safe label points).
``mean_over_all_tokens``: the mean divides by the number of tokens, ignored ones included.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor.parallel import loss as dt_loss

VARIANTS = ("label_offset_next_shard", "picks_not_reduced", "local_count", "ignore_not_masked", "mean_over_all_tokens")
_MEAN = 1  # torch's Reduction.MEAN


def _forward(variant: str) -> Any:
    original = dt_loss._nll_loss_forward

    def nll_loss_forward(x: torch.Tensor, target: torch.Tensor, weight: Any, local_weight: Any, reduction: int,
                         ignore_index: int, input_shape: torch.Size, channel_dim: int, mesh: Any, mesh_dim: int) -> Any:
        if weight is not None or reduction != _MEAN or x.dim() != 2:
            return original(x, target, weight, local_weight, reduction, ignore_index, input_shape, channel_dim, mesh, mesh_dim)
        c, r = mesh.size(mesh_dim), mesh.get_local_rank(mesh_dim)
        w = input_shape[1] // c
        kept = target != ignore_index
        safe = torch.where(kept, target, 0).unsqueeze(1)
        local = safe - r * w
        if variant == "label_offset_next_shard":
            local = safe - (r + 1) * w  # BUG-SITE: label_offset_next_shard
        outside = (local < 0) | (local >= w)
        pick = torch.where(outside, 0.0, x.gather(1, torch.where(outside, 0, local)))
        if variant != "picks_not_reduced":
            pick = funcol.all_reduce(pick, "sum", (mesh, mesh_dim))  # BUG-SITE: picks_not_reduced
        loss = torch.where(kept, -pick.squeeze(1), 0.0)
        if variant == "ignore_not_masked":
            loss = -pick.squeeze(1)  # BUG-SITE: ignore_not_masked
        total = kept.sum().to(x)
        if variant == "local_count":
            total = (kept & ~outside.squeeze(1)).sum().to(x)  # BUG-SITE: local_count
        if variant == "mean_over_all_tokens":
            total = torch.ones_like(loss).sum()  # BUG-SITE: mean_over_all_tokens
        return loss.sum() / total, total

    return nll_loss_forward


def apply(variant: str | None) -> None:
    if variant in VARIANTS:
        dt_loss._nll_loss_forward = _forward(variant)


def titan_llama3(ctx: Any) -> Any:
    """torchtitan's Llama 3 with loss_parallel (titan_models.llama3), with the variant's
    regression patched in before each rank's build."""
    import titan_models

    model = titan_models.llama3(ctx)
    build = model.distributed

    def distributed(rank: Any) -> Any:
        apply(ctx.variant)
        return build(rank)

    model.distributed = distributed
    return model
