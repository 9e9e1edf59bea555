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


class CosineScale(nn.Module):
    """x * cos(arange(first, first + 16) * 0.1): torch-xla folds the arange into a 16-element
    constant, which its text printer elides as ``{...}`` (more than 10 elements)."""

    def __init__(self, first: int) -> None:
        super().__init__()
        self.first = first

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.cos(torch.arange(self.first, self.first + 16, device=x.device) * 0.1)  # BUG-SITE: shifted_arange


def cosine_scale(ctx: BuildContext) -> Model:
    # The baseline starts the arange at 0, the variant at 1: two different 16-element constants.
    first = 1 if ctx.variant == "shifted_arange" else 0
    return Model(
        baseline=CosineScale(0),
        distributed=lambda rank: CosineScale(first),
        inputs=[Input("x", (4, 16))],
    )
