"""One training step of a sequence-parallel decoder stack: forward, loss, backward, gradient
all-reduce of the replicated norm weights, SGD update.

Under sequence parallelism each rank normalizes only its own tokens, so the gradient of a norm
weight on one rank is a partial sum over the group's tokens and must be all-reduced (Megatron's
``allreduce_sequence_parallel_grads``); tensor-parallel weights see all tokens after the
sequence all-gather and need no reduction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from torch import Tensor

from .layers import RMSNorm
from .llama import DecoderLayer, LlamaConfig
from .parallel import Parallel, all_reduce_sum, reduce_from_region


class DecoderStack(nn.Module):
    """Decoder layers and the final norm on (s, b, h) hidden states (no embedding or head)."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg, ps) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


def sequence_parallel_params(names: Sequence[str]) -> list[bool]:
    """Which parameters are replicated norm weights whose gradients are partial under SP."""
    return [name.endswith("norm.weight") for name in names]


OPTIMIZERS = ("sgd", "adamw")


class TrainStep(nn.Module):
    """(x, target) hidden states, sequence-sharded -> (loss, updated parameters...).

    ``micro_batches`` > 1 accumulates the gradients of that many micro-batches (the batch dim
    split evenly) before the update; ``optimizer`` is SGD or the first AdamW step (zero moment
    estimates, bias-corrected, decoupled weight decay).
    """

    def __init__(self, cfg: LlamaConfig, ps: Parallel, lr: float = 0.01, optimizer: str = "sgd", micro_batches: int = 1) -> None:
        super().__init__()
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
        if micro_batches < 1 or cfg.batch % micro_batches:
            raise ValueError(f"micro_batches {micro_batches} does not divide the batch ({cfg.batch})")
        self.ps, self.lr, self.optimizer, self.micro_batches = ps, lr, optimizer, micro_batches
        self.model = DecoderStack(cfg, ps)

    def adamw(self, p: Tensor, g: Tensor, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, wd: float = 0.01) -> Tensor:
        m = (1 - b1) * g  # the moments start at zero
        v = (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1), v / (1 - b2)
        return p - self.lr * (m_hat / (v_hat.sqrt() + eps) + wd * p)

    def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        from .layers import rotary_tables

        ps, cfg = self.ps, self.model.cfg
        seq = x.shape[0] * ps.tp
        cos, sin = rotary_tables(seq, cfg.head_dim, cfg.rope_theta, x.device)
        names, params = zip(*self.model.named_parameters(), strict=True)
        pieces = zip(x.chunk(self.micro_batches, 1), target.chunk(self.micro_batches, 1), strict=True) if self.micro_batches > 1 else [(x, target)]
        loss: Tensor | None = None
        grads: list[Tensor] = []
        for xs, ts in pieces:
            out = self.model(xs, cos, sin)
            part = reduce_from_region(((out - ts) ** 2).sum(), ps)  # this rank's tokens, summed over ranks
            got = torch.autograd.grad(part, params)
            loss = part if loss is None else loss + part
            grads = list(got) if not grads else [a + b for a, b in zip(grads, got, strict=True)]
        assert loss is not None
        for i, partial in enumerate(sequence_parallel_params(names)):
            if partial and not ps.has("sp_norm_grad_missing"):
                # Strided groups, as if half the ranks were another data-parallel replica.
                groups = [ps.groups[0][0::2], ps.groups[0][1::2]] if ps.has("sp_norm_grad_wrong_group") else None
                grads[i] = all_reduce_sum(grads[i], ps, groups)  # BUG-SITE: sp_norm_grad_wrong_group
                if ps.has("sp_norm_grad_twice"):
                    grads[i] = all_reduce_sum(grads[i], ps)  # BUG-SITE: sp_norm_grad_twice
        if self.optimizer == "adamw":
            return (loss, *(self.adamw(p, g) for p, g in zip(params, grads, strict=True)))
        updated = [p - self.lr * g for p, g in zip(params, grads, strict=True)]  # BUG-SITE: sp_norm_grad_missing
        return (loss, *updated)


class DataParallelTrainStep(nn.Module):
    """Data parallelism: (x, target) split along the batch over the group, every parameter
    replicated. Each rank takes the mean loss of its own batch shard and differentiates it;
    the gradients are all-reduced and divided by the group size (Megatron/DDP's mean over the
    data-parallel group), then SGD updates the replicas identically."""

    def __init__(self, cfg: LlamaConfig, dp: Parallel, lr: float = 0.01) -> None:
        super().__init__()
        self.dp, self.lr = dp, lr
        self.model = DecoderStack(cfg, Parallel())

    def reduce_grad(self, grad: Tensor) -> Tensor:
        dp = self.dp
        if dp.has("dp_grad_missing"):
            return grad  # BUG-SITE: dp_grad_missing
        if dp.has("dp_grad_scaled_twice"):
            grad = grad / dp.tp  # BUG-SITE: dp_grad_scaled_twice
        return all_reduce_sum(grad, dp) / dp.tp

    def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        from .layers import rotary_tables

        cfg = self.model.cfg
        cos, sin = rotary_tables(x.shape[0], cfg.head_dim, cfg.rope_theta, x.device)
        out = self.model(x, cos, sin)
        local = ((out - target) ** 2).mean()  # this rank's batch shard
        loss = all_reduce_sum(local, self.dp) / self.dp.tp
        params = [p for _, p in self.model.named_parameters()]
        grads = torch.autograd.grad(local, params)
        updated = [p - self.lr * self.reduce_grad(g) for p, g in zip(params, grads, strict=True)]
        return (loss, *updated)
