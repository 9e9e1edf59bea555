"""Entry points of examples/dtensor/.shardproof.yml: loss_parallel with ignored labels.

A causal LM's training loss as transformers writes it (``ForCausalLMLoss``): the labels shifted
one token to the left and the last position padded with ``ignore_index`` (-100), so the cross
entropy under ``loss_parallel()`` drops those positions and averages over the kept ones. The
decoder is models.decoder's (vocab-parallel embedding, blocks, the LM head's logits sharded
over the vocabulary); the regressions of loss_bugs.py apply to the distributed build.
"""

from __future__ import annotations

from typing import Any

import loss_bugs
import models
import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100


class ShiftedLabels(nn.Module):
    """Runs ``inner(tokens, labels)`` on the labels of the next token (the last one ignored)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        return self.inner(tokens, shifted)


def decoder_shifted_labels(ctx: Any) -> Any:
    """models.decoder with ``loss``, its labels shifted as transformers' causal-LM loss does."""
    model = models.decoder(ctx)
    build = model.distributed

    def distributed(rank: Any) -> nn.Module:
        loss_bugs.apply(ctx.variant)
        return ShiftedLabels(build(rank))

    model.baseline = ShiftedLabels(model.baseline)
    model.distributed = distributed
    return model
