"""One training step of a sequence-parallel decoder stack: forward, loss, backward, gradient
all-reduce of the replicated norm weights, SGD update.

Under sequence parallelism each rank normalizes only its own tokens, so the gradient of a norm
weight on one rank is a partial sum over the group's tokens and must be all-reduced (Megatron's
``allreduce_sequence_parallel_grads``); tensor-parallel weights see all tokens after the
sequence all-gather and need no reduction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch import Tensor

from .layers import RMSNorm
from .llama import DecoderLayer, LlamaConfig
from .parallel import Parallel, all_gather, all_reduce_sum, reduce_from_region, reduce_scatter

if TYPE_CHECKING:
    from shardproof.engine.frontend.declare import BuildContext, Model


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
        if cfg.replicate_kv and ps.tp > 1:
            # Fewer KV heads than ranks: every rank keeps the whole KV projection but
            # back-propagates only its own query heads (their KV head picked by index_select),
            # so the projection's gradient is a partial sum over the group.
            for i, name in enumerate(names):
                if name.endswith("attn.kv.weight"):
                    grads[i] = all_reduce_sum(grads[i], ps)
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
            return grad
        grad = all_reduce_sum(grad, dp) / dp.tp
        if dp.has("dp_grad_scaled_twice"):
            grad = grad / dp.tp  # BUG-SITE: dp_grad_scaled_twice
        return grad

    def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        from .layers import rotary_tables

        cfg = self.model.cfg
        cos, sin = rotary_tables(x.shape[0], cfg.head_dim, cfg.rope_theta, x.device)
        out = self.model(x, cos, sin)
        local = ((out - target) ** 2).mean()  # this rank's batch shard
        loss = all_reduce_sum(local, self.dp) / self.dp.tp
        params = [p for _, p in self.model.named_parameters()]
        grads = [self.reduce_grad(g) for g in torch.autograd.grad(local, params)]
        updated = [p - self.lr * g for p, g in zip(params, grads, strict=True)]  # BUG-SITE: dp_grad_missing
        return (loss, *updated)


class MixedPrecisionTrainStep(nn.Module):
    """The sequence-parallel training step in mixed precision (Megatron's bf16 recipe): bf16
    parameters run the forward and backward, the loss is multiplied by a static loss scale
    before the backward, the bf16 gradients (the SP norm gradients all-reduced in bf16, as
    Megatron reduces gradients in the parameters' dtype) are converted to f32 and divided by the
    scale, SGD updates the f32 master weights, and the updated masters are cast to bf16 for the
    next step. (x, target) are f32 and sequence-sharded; returns (masters..., params..., loss):
    the loss last, since it carries the bf16 forward's rounding (a witness comparing it at f32
    tolerances sees the two summation orders of the bf16 partial sums)."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel, lr: float = 0.01, loss_scale: float = 1024.0) -> None:
        super().__init__()
        self.ps, self.lr, self.loss_scale = ps, lr, loss_scale
        self.model = DecoderStack(cfg, ps).to(torch.bfloat16)
        self.master = DecoderStack(cfg, ps)  # the f32 master weights, laid out like the model's

    def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        from .layers import rotary_tables

        ps, cfg = self.ps, self.model.cfg
        cos, sin = rotary_tables(x.shape[0] * ps.tp, cfg.head_dim, cfg.rope_theta, x.device)
        out = self.model(x.to(torch.bfloat16), cos.to(torch.bfloat16), sin.to(torch.bfloat16))
        loss = reduce_from_region(((out.float() - target) ** 2).sum(), ps)  # f32 loss over all tokens
        names, params = zip(*self.model.named_parameters(), strict=True)
        scaled = torch.autograd.grad(loss * self.loss_scale, params)  # bf16 gradients, times the scale
        grads = []
        for g, partial in zip(scaled, sequence_parallel_params(names), strict=True):
            if partial:
                g = all_reduce_sum(g, ps)
            unscale = not (partial and ps.has("mp_unscale_missing"))
            grads.append(g.float() / self.loss_scale if unscale else g.float())
        masters = [m for _, m in self.master.named_parameters()]
        updated = [m - self.lr * g for m, g in zip(masters, grads, strict=True)]  # BUG-SITE: mp_unscale_missing
        return (*updated, *(m.to(torch.bfloat16) for m in updated), loss)


class ZeroTrainStep(nn.Module):
    """Data parallelism with the optimizer state sharded over the group (ZeRO-1/2, FSDP's
    update): every rank holds the whole parameters and its batch shard; the gradients are
    reduce-scattered along dim 0 (rank r receives block r of their sum) and divided by the
    group size, each rank updates only its block of the f32 master weights with SGD, and the
    updated blocks are all-gathered into the parameters of the next step.
    Returns (loss, parameters..., master blocks...)."""

    def __init__(self, cfg: LlamaConfig, dp: Parallel, lr: float = 0.01) -> None:
        super().__init__()
        self.dp, self.lr = dp, lr
        self.model = DecoderStack(cfg, Parallel())
        shapes = [p.shape for p in self.model.parameters()]
        self.master = nn.ParameterList(nn.Parameter(torch.empty(dp.shard(s[0], "dim 0 of a parameter"), *s[1:])) for s in shapes)

    def forward(self, x: Tensor, target: Tensor) -> tuple[Tensor, ...]:
        from .layers import rotary_tables

        dp, cfg = self.dp, self.model.cfg
        cos, sin = rotary_tables(x.shape[0], cfg.head_dim, cfg.rope_theta, x.device)
        out = self.model(x, cos, sin)
        local = ((out - target) ** 2).mean()  # this rank's batch shard
        loss = all_reduce_sum(local, dp) / dp.tp
        params = [p for _, p in self.model.named_parameters()]
        grads = torch.autograd.grad(local, params)
        # The wrong-shard variant scatters over the group listed in reverse: rank r receives
        # the gradient block of rank c-1-r but updates its own master block r.
        order = [list(reversed(g)) for g in dp.groups] if dp.has("zero_wrong_shard") else dp.groups
        shards = [reduce_scatter(g, 0, order) / dp.tp if dp.tp > 1 else g for g in grads]  # BUG-SITE: zero_wrong_shard
        blocks = [m - self.lr * g for m, g in zip(self.master, shards, strict=True)]
        updated = [all_gather(b, 0, dp.groups) if dp.tp > 1 else b for b in blocks]
        return (loss, *updated, *blocks)


def mixed_train_step(ctx: BuildContext) -> Model:
    """Entry point: :class:`MixedPrecisionTrainStep` at the sizes of ``ctx`` (tplm.models'
    knobs), tensor- and sequence-parallel over ``ctx.tp`` ranks."""
    from shardproof.engine.frontend.declare import Input, Model

    from .models import _llama_config, _variant, llama_plan

    bug = _variant(ctx, ("mp_unscale_missing",))
    cfg = _llama_config(ctx)
    lr, scale = ctx.knob("lr", 0.01), ctx.knob("loss_scale", 1024.0)
    baseline = MixedPrecisionTrainStep(cfg, Parallel(), lr, scale)
    names = [name for name, _ in baseline.named_parameters()]
    masters = [n for n in names if n.startswith("master.")]
    params = [n for n in names if n.startswith("model.")]
    shape = (cfg.seq, cfg.batch, cfg.hidden)
    plan = llama_plan(cfg, ctx.tp, prefix="model.") | llama_plan(cfg, ctx.tp, prefix="master.") | {"model.norm": "sequence_parallel", "master.norm": "sequence_parallel"}
    return Model(
        baseline=baseline,
        distributed=lambda rank: MixedPrecisionTrainStep(cfg, Parallel(ctx.tp, rank, ctx.groups, True, bug), lr, scale),
        inputs=[Input("x", shape, shard=0), Input("target", shape, shard=0)],
        plan=plan,
        outputs=[*({"like": n} for n in masters), *({"like": n} for n in params), "replicate"],
        description="mixed-precision training step: bf16 parameters, loss scaling, f32 master weights",
    )


def zero_train_step(ctx: BuildContext) -> Model:
    """Entry point: :class:`ZeroTrainStep`, data-parallel over ``ctx.tp`` ranks."""
    from shardproof.engine.frontend.declare import Input, Model

    from .models import _llama_config, _variant

    bug = _variant(ctx, ("zero_wrong_shard",))
    cfg = _llama_config(ctx)
    lr = ctx.knob("lr", 0.01)
    baseline = ZeroTrainStep(cfg, Parallel(), lr)
    names = [name for name, _ in baseline.named_parameters()]
    params = [n for n in names if n.startswith("model.")]
    masters = [n for n in names if n.startswith("master.")]
    shape = (cfg.seq, cfg.batch, cfg.hidden)
    return Model(
        baseline=baseline,
        distributed=lambda rank: ZeroTrainStep(cfg, Parallel(ctx.tp, rank, ctx.groups, bug=bug), lr),
        inputs=[Input("x", shape, shard=1), Input("target", shape, shard=1)],
        plan={"master": {"shard": 0}},
        outputs=["replicate", *({"like": n} for n in params), *({"like": n} for n in masters)],
        description="ZeRO-style data-parallel step: gradients reduce-scattered, sharded master update, parameters all-gathered",
    )
