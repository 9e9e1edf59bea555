"""torch-xla SPMD test models: a Megatron-style MLP whose weights are annotated on a 1-D mesh
and split by XLA's SPMD partitioner, and a bug variant (the line marked ``# BUG-SITE``)."""

from __future__ import annotations

from typing import Any

import torch

from shardproof.engine.frontend.spmd.declare import SpmdContext, SpmdInput, SpmdModel


def mlp(x: Any, w1: Any, w2: Any) -> Any:
    return torch.nn.functional.gelu(x @ w1) @ w2


def tp_mlp(ctx: SpmdContext) -> SpmdModel:
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def distributed(x: Any, w1: Any, w2: Any) -> Any:
        y = mlp(x, w1, w2)
        if bug == "averaged_over_tp":
            y = y / c  # BUG-SITE: averaged_over_tp
        return y

    return SpmdModel(mlp, distributed, mesh, [SpmdInput("x", (b, d)), SpmdInput("w1", (d, f), spec=(None, "tp")), SpmdInput("w2", (f, d), spec=("tp", None))],
                     description=f"Megatron MLP annotated for the SPMD partitioner, TP {c}")
