"""DeepSpeed's own MoE layer (deepspeed 0.19.8 from PyPI, unmodified), set up as a DeepSpeed
training script does: ``deepspeed.init_distributed()``, ``MoE(hidden, expert, num_experts,
ep_size)``, ``set_deepspeed_parallelism()``. DeepSpeed holds each rank's local experts in an
``nn.ModuleList`` (``deepspeed_moe.experts.deepspeed_experts``): the plan's ``expert_list`` says
rank r's local expert j is the baseline's expert r*E/P + j.

Random token selection (``use_rts``) draws random numbers, which the baseline and the ranks
would draw differently; it is off. The baseline is the same layer with ``ep_size=1``.
"""

from __future__ import annotations

import deepspeed
import torch
import torch.nn.functional as F
from deepspeed.moe.layer import MoE
from deepspeed.utils import groups

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class Expert(torch.nn.Module):
    def __init__(self, dim: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, ffn)
        self.fc2 = torch.nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(torch.nn.Module):
    """The MoE layer as a model uses it: its output, without the auxiliary loss and counts."""

    def __init__(self, dim: int, ffn: int, experts: int, ep_size: int) -> None:
        super().__init__()
        self.moe = MoE(dim, Expert(dim, ffn), num_experts=experts, ep_size=ep_size, k=1, min_capacity=0, use_rts=False)
        self.moe.set_deepspeed_parallelism()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x)[0]


def setup() -> None:
    """A training script's start: DeepSpeed's communication over torch.distributed, and its
    expert groups made anew for this world."""
    deepspeed.init_distributed()
    groups._EXPERT_PARALLEL_GROUP.clear()
    groups._EXPERT_DATA_PARALLEL_GROUP.clear()


def moe(ctx: BuildContext) -> Model:
    dim, ffn, experts = ctx.knob("dim", 16), ctx.knob("ffn", 32), ctx.knob("experts", 8)
    setup()
    baseline = Block(dim, ffn, experts, 1)

    def distributed(rank: int) -> Block:
        setup()
        return Block(dim, ffn, experts, ctx.tp)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, 4, dim))],
        plan={"moe.deepspeed_moe.experts.deepspeed_experts": "expert_list"},
    )
