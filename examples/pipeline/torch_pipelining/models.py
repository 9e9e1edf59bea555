"""Pipelines written with torch.distributed.pipelining, as its tutorials and torchtitan write them.

Each rank builds its stage and a schedule and calls ``schedule.step``: the first rank with the
batch, the last with the target (and a list collecting each microbatch's loss), the others
with nothing. The schedule chunks the batch, runs the stage module once per microbatch and
moves activations (and, training, their gradients) with ``batch_isend_irecv``. shardproof
records those transfers per rank and composes the ranks' programs.

Two ways to cut the model, both torch's own:
- ``pipeline(model, mb_args, split_spec)`` traces the model and splits it at the named
  submodule (``SplitPoint.BEGINNING``); ``pipe.build_stage(rank, device)`` is the rank's stage;
- the manual way (torchtitan): each rank keeps a copy of the model with the layers of other
  stages deleted (``layers`` is an ``nn.ModuleDict`` so names stay the baseline's) and wraps it
  in ``PipelineStage(module, stage_index, num_stages, device)``.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    SplitPoint,
    pipeline,
)

from shardproof.engine.frontend.declare import BuildContext, Input
from shardproof.engine.frontend.pipeline import Pipeline
from shardproof.engine.frontend.pipeline.program import rank_program


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    """The model: ``layers`` residual blocks and a head. ``layers`` is a ModuleDict keyed by the
    layer number, so a stage that deletes other stages' layers keeps the baseline's names."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block(hidden) for i in range(layers)})
        self.head: nn.Module | None = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x) if self.head is not None else x


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


class TrainNet(Net):
    """The single-device training step: every parameter's gradient and the loss of the whole
    batch. The gradients come in the order the ranks hold the parameters (``order``: layer
    numbers, the head as -1; by default the model's order, which is stage order)."""

    def __init__(self, hidden: int, layers: int, order: list[int] | None = None) -> None:
        super().__init__(hidden, layers)
        self.order = order if order is not None else [*range(layers), -1]

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        loss = mse(super().forward(x), target)
        owners = [self.head if i == -1 else self.layers[str(i)] for i in self.order]
        assert owners[0] is not None
        return (*torch.autograd.grad(loss, [p for owner in owners for p in owner.parameters()]), loss)


# --- forward: pipeline() + ScheduleGPipe ------------------------------------------------------


def tracer_gpipe(ctx: BuildContext) -> Pipeline:
    """Forward with the tracer front end: ``pipeline()`` splits at ``layers.<per>`` etc."""
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 4), ctx.knob("pp", 2)
    m, batch = ctx.knob("microbatches", 2), ctx.knob("batch", 8)
    per = layers // pp
    split_spec = {f"layers.{k * per}": SplitPoint.BEGINNING for k in range(1, pp)}

    def stage(rank: int) -> nn.Module:
        model = Net(hidden, layers)
        pipe = pipeline(model, mb_args=(torch.empty(batch // m, hidden),), split_spec=split_spec)
        stage_module = pipe.get_stage_module(rank)

        def run(x: torch.Tensor) -> torch.Tensor | None:
            schedule = ScheduleGPipe(pipe.build_stage(rank, x.device), n_microbatches=m)
            return schedule.step(x) if rank == 0 else schedule.step()

        return rank_program([stage_module], run)

    return Pipeline(baseline=Net(hidden, layers), stage=stage, stages=pp, inputs=[Input("x", (batch, hidden))])


# --- training: manual stages (torchtitan's way) + Schedule1F1B / ScheduleGPipe / interleaved --


def stage_layers(stage: int, stages: int, layers: int, variant: str) -> list[int]:
    """The layers stage ``stage`` of ``stages`` keeps, as torchtitan computes a split."""
    per = layers // stages
    first, last = stage * per, (stage + 1) * per
    if variant == "drop_layer" and stage == 1:
        first += 1  # BUG-SITE: drop_layer (stage 1 starts one layer late: layer `per` runs on no stage)
    if variant == "repeat_layer" and stage == 1:
        first -= 1  # BUG-SITE: repeat_layer (stage 1 starts one layer early: layer `per`-1 runs twice)
    return list(range(first, last))


def stage_module(hidden: int, layers: int, stage: int, stages: int, variant: str) -> Net:
    """The model with the layers of other stages deleted; the head stays on the last stage."""
    model = Net(hidden, layers)
    keep = {str(i) for i in stage_layers(stage, stages, layers, variant)}
    for name in list(model.layers):
        if name not in keep:
            del model.layers[name]
    if stage != stages - 1:
        model.head = None
    return model


SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def manual_train(ctx: BuildContext) -> Pipeline:
    """A training step: each rank one stage (``schedule``: gpipe or 1f1b), MSE loss per
    microbatch. ``scaling: grads`` (torch's default): the schedule divides the accumulated
    gradients by M (``scale_grads``); ``scaling: loss`` (torchtitan's way): each microbatch's
    loss is divided by M (``rescale_accumulated_loss``) and ``scale_grads=False``."""
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 4), ctx.knob("pp", 2)
    m, batch, kind = ctx.knob("microbatches", 2), ctx.knob("batch", 8), str(ctx.knob("schedule", "1f1b"))
    by_loss = str(ctx.knob("scaling", "grads")) == "loss"
    variant = ctx.variant or ""

    def rescaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = mse(output, target)
        if variant == "loss_not_scaled":
            return loss  # BUG-SITE: loss_not_scaled (the microbatch loss is not divided by M)
        return loss / m

    def stage(rank: int) -> nn.Module:
        module = stage_module(hidden, layers, rank, pp, variant)

        def run(x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
            pipeline_stage = PipelineStage(module, rank, pp, x.device)
            scale = not by_loss and variant != "grads_not_scaled"  # BUG-SITE: grads_not_scaled (mean loss per microbatch, gradients summed over microbatches)
            schedule = SCHEDULES[kind](pipeline_stage, n_microbatches=m, loss_fn=rescaled if by_loss else mse, scale_grads=scale)
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(x)
            elif rank == pp - 1:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
            grads = tuple(p.grad for p in module.parameters())
            if not losses:
                return grads
            return (*grads, sum(losses[1:], losses[0]) if by_loss else torch.stack(losses).mean())

        return rank_program([module], run)

    return Pipeline(baseline=TrainNet(hidden, layers), stage=stage, stages=pp, inputs=[Input("x", (batch, hidden)), Input("target", (batch, hidden))])


def manual_gpipe(ctx: BuildContext) -> Pipeline:
    """Forward with manual stages (torchtitan's split) and ScheduleGPipe, no loss."""
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 4), ctx.knob("pp", 2)
    m, batch = ctx.knob("microbatches", 2), ctx.knob("batch", 8)
    variant = ctx.variant or ""

    def stage(rank: int) -> nn.Module:
        module = stage_module(hidden, layers, rank, pp, variant)

        def run(x: torch.Tensor) -> torch.Tensor | None:
            shapes: dict[str, torch.Tensor] = {}
            microbatches = m
            if variant == "whole_batch_input_args" and rank == pp - 1:
                # BUG-SITE: whole_batch_input_args (the stage's input declared at the whole batch's shape, not a microbatch's)
                shapes = {"input_args": torch.empty(batch, hidden, device="meta"), "output_args": torch.empty(batch, hidden, device="meta")}
            if variant == "microbatches_disagree" and rank == pp - 1:
                microbatches = 2 * m  # BUG-SITE: microbatches_disagree (the last rank cuts the batch into twice as many microbatches)
            schedule = ScheduleGPipe(PipelineStage(module, rank, pp, x.device, **shapes), n_microbatches=microbatches)
            return schedule.step(x) if rank == 0 else schedule.step()

        return rank_program([module], run)

    return Pipeline(baseline=Net(hidden, layers), stage=stage, stages=pp, inputs=[Input("x", (batch, hidden))])


def interleaved_train(ctx: BuildContext) -> Pipeline:
    """A training step with ScheduleInterleaved1F1B: ``virtual`` stages per rank, rank r holding
    stages r, r + pp, ... (Megatron's and torchtitan's loop placement)."""
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 8), ctx.knob("pp", 2)
    m, batch, virtual = ctx.knob("microbatches", 4), ctx.knob("batch", 8), ctx.knob("virtual", 2)
    variant = ctx.variant or ""
    stages = pp * virtual
    per = layers // stages
    order = [i for r in range(pp) for s in range(r, stages, pp) for i in range(s * per, (s + 1) * per)] + [-1]

    def stage(rank: int) -> nn.Module:
        modules = [stage_module(hidden, layers, s, stages, variant) for s in range(rank, stages, pp)]

        def run(x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
            held = [PipelineStage(module, s, stages, x.device) for module, s in zip(modules, range(rank, stages, pp), strict=True)]
            # torchtitan's way: each microbatch's loss divided by M, gradients summed as they are.
            schedule = ScheduleInterleaved1F1B(held, n_microbatches=m, loss_fn=lambda out, target: mse(out, target) / m, scale_grads=False)
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(x)
            elif rank == pp - 1:
                schedule.step(target=target, losses=losses)
            else:
                schedule.step()
            grads = tuple(p.grad for module in modules for p in module.parameters())
            return (*grads, sum(losses[1:], losses[0])) if losses else grads

        return rank_program(modules, run)

    return Pipeline(baseline=TrainNet(hidden, layers, order), stage=stage, stages=pp, inputs=[Input("x", (batch, hidden)), Input("target", (batch, hidden))])
