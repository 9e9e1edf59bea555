"""GPipe pipelines over torch.distributed point-to-point calls, one rank per stage.

The baseline is a residual MLP (``layers`` blocks and a head) on one device. Stage ``k`` of
``pp`` holds blocks ``k*L/pp .. (k+1)*L/pp - 1`` under the baseline's names (``layers.<i>``), and
runs the GPipe forward over ``microbatches`` microbatches: stage 0 splits the batch, every other
stage receives each microbatch's activation from rank ``k-1``, and all but the last send their
result to rank ``k+1``; the last stage applies the head and concatenates the microbatches (or
returns the loss averaged over them). ``transport`` picks the calls the stages use: blocking
``send``/``recv``, ``isend``/``irecv``, or ``batch_isend_irecv`` with ``P2POp``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from shardproof.engine.frontend.declare import BuildContext, Input, Model
from shardproof.engine.frontend.pipeline import Pipeline


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Mlp(nn.Module):
    """The single-device model."""

    def __init__(self, hidden: int, layers: int, loss: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, hidden)
        self.loss = loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        y = self.head(x)
        return (y * y).mean() if self.loss else y


def stage_layers(rank: int, pp: int, layers: int, variant: str) -> list[int]:
    per = layers // pp
    first, last = rank * per, (rank + 1) * per
    if variant == "drop_layer" and rank == 1:
        first += 1  # BUG-SITE: drop_layer (stage 1 starts one block late: block per is run by no stage)
    if variant == "repeat_layer" and rank == 1:
        first -= 1  # BUG-SITE: repeat_layer (stage 1 starts one block early: block per-1 runs twice)
    return list(range(first, last))


class Stage(nn.Module):
    """What rank ``rank`` runs: its blocks (and on the last stage the head), GPipe forward."""

    def __init__(self, hidden: int, layers: int, rank: int, pp: int, microbatches: int, loss: bool, transport: str, variant: str) -> None:
        super().__init__()
        self.rank, self.pp, self.m, self.loss, self.transport, self.variant = rank, pp, microbatches, loss, transport, variant
        self.scale_grads = False  # TrainStage: divide the accumulated gradients by M instead of each loss
        self.own = stage_layers(rank, pp, layers, variant)
        self.layers = nn.ModuleDict({str(i): Block(hidden) for i in self.own})
        if rank == pp - 1:
            self.head = nn.Linear(hidden, hidden)

    def receive(self, like: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(like.shape, dtype=like.dtype, device=like.device)
        src = self.rank - 1
        if self.transport == "send_recv":
            dist.recv(buf, src=src)
        elif self.transport == "isend_irecv":
            dist.irecv(buf, src=src).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, src)]):
                work.wait()
        return buf

    def send(self, h: torch.Tensor) -> None:
        dst = self.rank + 1
        if self.variant == "wrong_peer" and self.rank == 0:
            dst = self.pp - 1  # BUG-SITE: wrong_peer (stage 0 sends to the last rank, skipping the middle stages)
        if self.transport == "send_recv":
            dist.send(h, dst=dst)
        elif self.transport == "isend_irecv":
            dist.isend(h, dst=dst).wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, h, dst)]):
                work.wait()

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        chunks = x.chunk(self.m)
        if self.variant == "deadlock":
            # A start-up handshake written receive-first on every stage: each waits for the other.
            flag = torch.zeros((), device=x.device)
            peer = 1 - self.rank if self.pp == 2 else (self.rank + 1) % self.pp
            dist.recv(flag, src=peer)  # BUG-SITE: deadlock
            dist.send(flag, dst=peer)
        results = []
        total: torch.Tensor | None = None
        for mb in range(self.m):
            if self.rank == 0:
                h = chunks[mb]
                if self.variant == "microbatch_order":
                    h = chunks[(mb + 1) % self.m]  # BUG-SITE: microbatch_order (stage 0 feeds microbatch mb+1 in slot mb)
            else:
                h = self.receive(chunks[mb])
            for i in self.own:
                h = self.layers[str(i)](h)
            if self.rank < self.pp - 1:
                self.send(h)
                continue
            y = self.head(h)
            if not self.loss:
                results.append(y)
                continue
            # Megatron's schedules scale each microbatch's loss by 1/M and accumulate the sum.
            loss = (y * y).mean()
            if self.variant != "loss_not_scaled":
                loss = loss / self.m  # the missing line is BUG-SITE: loss_not_scaled
            total = loss if total is None else total + loss
        if self.rank < self.pp - 1:
            return None
        return total if self.loss else torch.cat(results)


def gpipe(ctx: BuildContext) -> Pipeline:
    hidden, layers = ctx.knob("hidden", 16), ctx.knob("layers", 4)
    pp, m, batch = ctx.knob("pp", 2), ctx.knob("microbatches", 2), ctx.knob("batch", 8)
    loss, transport = bool(ctx.knob("loss", False)), str(ctx.knob("transport", "send_recv"))
    variant = ctx.variant or ""
    return Pipeline(
        baseline=Mlp(hidden, layers, loss),
        stage=lambda rank: Stage(hidden, layers, rank, pp, m, loss, transport, variant),
        stages=pp,
        inputs=[Input("x", (batch, hidden))],
    )


class TrainMlp(Mlp):
    """The single-device training step: loss (mean over the whole batch) and every parameter's
    gradient, in the baseline's parameter order, then the loss."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__(hidden, layers, loss=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        params = [p for _, p in self.named_parameters()]
        loss = super().forward(x)
        return (*torch.autograd.grad(loss, params), loss)


class TrainStage(Stage):
    """One rank's GPipe training step: all forwards (activations sent to rank k+1), then all
    backwards in reverse microbatch order (the gradient of each received activation sent back
    to rank k-1); each microbatch's loss scaled by 1/M and the gradients accumulated over the
    microbatches. Returns this stage's parameter gradients (the last stage: then the loss)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        params = [p for _, p in self.named_parameters()]
        chunks = x.chunk(self.m)
        inputs, outputs = [], []
        total: torch.Tensor | None = None
        for mb in range(self.m):
            h = chunks[mb] if self.rank == 0 else self.receive(chunks[mb]).requires_grad_()
            if self.variant == "stale_activation" and self.rank > 0 and mb > 0:
                h = inputs[mb - 1]  # BUG-SITE: stale_activation (the stage computes on the previous microbatch's received activation)
            inputs.append(h)
            for i in self.own:
                h = self.layers[str(i)](h)
            if self.rank < self.pp - 1:
                self.send(h)
            else:
                y = self.head(h)
                h = (y * y).mean()
                if not self.scale_grads:
                    h = h / self.m  # Megatron's schedules: each microbatch's loss / M
                total = h if total is None else total + h
            outputs.append(h)
        grads: list[torch.Tensor] | None = None
        for mb in reversed(range(self.m)):
            upstream = None
            if self.rank < self.pp - 1:
                upstream = torch.empty(outputs[mb].shape, dtype=outputs[mb].dtype, device=x.device)
                dist.recv(upstream, src=self.rank + 1)
            wrt = params + ([inputs[mb]] if self.rank > 0 else [])
            got = list(torch.autograd.grad(outputs[mb], wrt, grad_outputs=upstream))
            if self.rank > 0:
                dist.send(got.pop(), dst=self.rank - 1)
            if grads is None or self.variant == "grad_overwritten":
                grads = got  # BUG-SITE: grad_overwritten (each microbatch's gradient replaces the sum so far)
            else:
                grads = [a + b for a, b in zip(grads, got, strict=True)]
        assert grads is not None
        if self.scale_grads:
            # torch.distributed.pipelining's default (scale_grads=True): the microbatch losses are
            # plain means, the accumulated gradients (and the summed loss) divided by M at the end.
            grads = [g / self.m for g in grads]
            total = total / self.m if total is not None else None
        return (*grads, total) if total is not None else tuple(grads)


def gpipe_train(ctx: BuildContext) -> Pipeline:
    hidden, layers = ctx.knob("hidden", 16), ctx.knob("layers", 4)
    pp, m, batch = ctx.knob("pp", 2), ctx.knob("microbatches", 1), ctx.knob("batch", 8)
    scale_grads = bool(ctx.knob("scale_grads", False))
    variant = ctx.variant or ""

    def stage(rank: int) -> TrainStage:
        st = TrainStage(hidden, layers, rank, pp, m, True, "send_recv", variant)
        st.scale_grads = scale_grads
        return st

    return Pipeline(
        baseline=TrainMlp(hidden, layers),
        stage=stage,
        stages=pp,
        inputs=[Input("x", (batch, hidden))],
    )


class TpBlock(nn.Module):
    """A Megatron-style MLP block over the stage's tensor-parallel group: ``up`` split along its
    output features (column-parallel), ``down`` along its input features (row-parallel), the
    partial sums all-reduced over the group. At ``tp`` 1 it is the single-device block."""

    def __init__(self, hidden: int, ffn: int, tp: int, groups: list[list[int]], variant: str = "") -> None:
        super().__init__()
        self.tp, self.groups, self.variant = tp, groups, variant
        self.up = nn.Linear(hidden, ffn // tp)
        self.down = nn.Linear(ffn // tp, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.down(torch.tanh(self.up(x)))
        if self.tp > 1 and self.variant != "tp_missing_allreduce":
            import torch_xla.core.xla_model as xm

            y = xm.all_reduce(xm.REDUCE_SUM, y, groups=self.groups)  # BUG-SITE: tp_missing_allreduce (dropped)
        return x + y


class TpMlp(nn.Module):
    def __init__(self, hidden: int, ffn: int, layers: int, tp: int = 1, groups: list[list[int]] | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TpBlock(hidden, ffn, tp, groups or [[0]]) for _ in range(layers))
        self.head = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class TpStage(Stage):
    """Stage ``rank`` of a PP x TP pipeline: its blocks tensor-parallel over its TP group."""

    def __init__(self, hidden: int, ffn: int, layers: int, rank: int, pp: int, tp: int, groups: list[list[int]], variant: str, microbatches: int = 1) -> None:
        super().__init__(hidden, layers, rank, pp, microbatches, False, "send_recv", variant)
        self.layers = nn.ModuleDict({str(i): TpBlock(hidden, ffn, tp, groups, variant) for i in self.own})


def gpipe_tp(ctx: BuildContext) -> Pipeline:
    hidden, ffn, layers = ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("layers", 4)
    pp, batch, m = ctx.knob("pp", 2), ctx.knob("batch", 8), ctx.knob("microbatches", 1)
    variant = ctx.variant or ""
    return Pipeline(
        baseline=TpMlp(hidden, ffn, layers),
        stage=lambda rank: TpStage(hidden, ffn, layers, rank, pp, ctx.tp, ctx.groups, variant, m),
        stages=pp,
        inputs=[Input("x", (batch, hidden))],
        plan={"layers.*.up": "colwise", "layers.*.down": "rowwise"},
    )


def tp_only(ctx: BuildContext) -> Model:
    """The same MLP blocks tensor-parallel without a pipeline: the reference time of a pipeline
    row in bench/pipeline_scale.py."""
    hidden, ffn, layers, batch = ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("layers", 4), ctx.knob("batch", 8)
    return Model(
        baseline=TpMlp(hidden, ffn, layers),
        distributed=lambda rank: TpMlp(hidden, ffn, layers, ctx.tp, ctx.groups),
        inputs=[Input("x", (batch, hidden))],
        plan={"layers.*.up": "colwise", "layers.*.down": "rowwise"},
    )


class OneFOneBStage(TrainStage):
    """The training step in 1F1B order (PipeDream-flush, Megatron's default schedule): stage k
    runs min(pp-k-1, M) warm-up forwards, then alternates one forward and one backward, then
    drains the remaining backwards. Where a forward's send meets a backward's receive, both go
    in one ``batch_isend_irecv`` (Megatron's ``send_forward_recv_backward``); the ``1f1b_blocking``
    variant issues them as a blocking send then a blocking receive instead."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        params = [p for _, p in self.named_parameters()]
        chunks = x.chunk(self.m)
        last = self.rank == self.pp - 1
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        total: torch.Tensor | None = None
        grads: list[torch.Tensor] | None = None

        def run_forward(mb: int) -> None:
            nonlocal total
            h = chunks[mb] if self.rank == 0 else self.receive(chunks[mb]).requires_grad_()
            inputs[mb] = h
            for i in self.own:
                h = self.layers[str(i)](h)
            if last:
                y = self.head(h)
                h = (y * y).mean() / self.m
                total = h if total is None else total + h
            outputs[mb] = h

        def run_backward(mb: int, upstream: torch.Tensor | None) -> None:
            nonlocal grads
            wrt = params + ([inputs[mb]] if self.rank > 0 else [])
            got = list(torch.autograd.grad(outputs[mb], wrt, grad_outputs=upstream))
            if self.rank > 0:
                dist.send(got.pop(), dst=self.rank - 1)  # send_backward
            grads = got if grads is None else [a + b for a, b in zip(grads, got, strict=True)]

        def grad_buffer(mb: int) -> torch.Tensor:
            return torch.empty(outputs[mb].shape, dtype=outputs[mb].dtype, device=x.device)

        warmup = min(self.pp - self.rank - 1, self.m)
        fwd = bwd = 0
        for _ in range(warmup):
            run_forward(fwd)
            dist.send(outputs[fwd], dst=self.rank + 1)
            fwd += 1
        while fwd < self.m:
            run_forward(fwd)
            fwd += 1
            if last:
                run_backward(bwd, None)
            else:
                upstream = grad_buffer(bwd)
                if self.variant == "1f1b_blocking":
                    dist.send(outputs[fwd - 1], dst=self.rank + 1)  # BUG-SITE: 1f1b_blocking
                    dist.recv(upstream, src=self.rank + 1)
                else:
                    ops = [dist.P2POp(dist.isend, outputs[fwd - 1], self.rank + 1), dist.P2POp(dist.irecv, upstream, self.rank + 1)]
                    for work in dist.batch_isend_irecv(ops):
                        work.wait()
                run_backward(bwd, upstream)
            bwd += 1
        while bwd < self.m:
            upstream = grad_buffer(bwd)
            dist.recv(upstream, src=self.rank + 1)
            run_backward(bwd, upstream)
            bwd += 1
        assert grads is not None
        return (*grads, total) if total is not None else tuple(grads)


def one_f_one_b(ctx: BuildContext) -> Pipeline:
    hidden, layers = ctx.knob("hidden", 16), ctx.knob("layers", 4)
    pp, m, batch = ctx.knob("pp", 2), ctx.knob("microbatches", 4), ctx.knob("batch", 8)
    variant = ctx.variant or ""
    return Pipeline(
        baseline=TrainMlp(hidden, layers),
        stage=lambda rank: OneFOneBStage(hidden, layers, rank, pp, m, True, "send_recv", variant),
        stages=pp,
        inputs=[Input("x", (batch, hidden))],
    )
