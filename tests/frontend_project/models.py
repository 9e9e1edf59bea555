"""Tiny declared models for the front-end tests: a column -> row parallel MLP that verifies, its
missing-all-reduce bug, and entry points that fail in every way a build can fail."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.nn as nn
import torch_xla
from torch import Tensor

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int, tp: int, groups: list[list[int]], bug: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, ffn // tp)
        self.down = nn.Linear(ffn // tp, hidden, bias=False)
        self.tp, self.groups, self.bug = tp, groups, bug

    def forward(self, x: Tensor) -> Tensor:
        y = self.down(torch.relu(self.up(x)))
        if self.tp > 1 and not self.bug:
            y = torch_xla._XLAC._xla_spmd_all_reduce("sum", y, 1.0, self.groups)
        return x + y  # BUG-SITE: missing_allreduce


def mlp(ctx: BuildContext) -> Model:
    hidden, ffn = ctx.knob("hidden", 16), ctx.knob("ffn", 32)
    bug = ctx.variant == "missing_allreduce"
    return Model(
        baseline=MLP(hidden, ffn, 1, [[0]]),
        distributed=lambda rank: MLP(hidden, ffn, ctx.tp, ctx.groups, bug),
        inputs=[Input("x", (4, hidden))],
        plan={"up": "colwise", "down": "rowwise"},
    )


def wrong_plan(ctx: BuildContext) -> Model:
    model = mlp(ctx)
    model.plan = {"up": "rowwise", "down": "rowwise"}
    return model


def raises(ctx: BuildContext) -> Model:
    raise RuntimeError("the model's constructor failed on purpose")


def sleeps(ctx: BuildContext) -> Model:
    time.sleep(600)
    raise AssertionError("unreachable")


def crashes(ctx: BuildContext) -> Model:
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable")


def allocates(ctx: BuildContext) -> Model:
    hoard = []
    for _ in range(64):
        hoard.append(bytearray(64 << 20))  # touched pages: resident memory grows by 64 MiB a step
        time.sleep(0.05)
    raise AssertionError("the memory cap was not enforced")


def not_a_model(ctx: BuildContext) -> object:
    return {"baseline": None}
