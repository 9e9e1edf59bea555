"""DeepSpeed's MoE layer with top-2 gating (deepspeed from PyPI, unmodified): ``MoE(..., k=2)``
routes every token to its two best experts (``top2gating``: the second choice masked out of the
first's logits, the second expert's locations after every first choice, both capped by the
capacity), dispatches them with the same all-to-all and ModuleList experts as top-1 and sums the
two weighted outputs. Set up as examples/torchdist/deepspeed_moe.py (random token selection off:
the baseline and the ranks would draw differently). The baseline is the same layer with
``ep_size=1``; ``drop_tokens`` and the capacity factor are knobs.
"""

from __future__ import annotations

import torch
from deepspeed.moe.layer import MoE
from deepspeed_moe import Expert, setup

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class Top2Block(torch.nn.Module):
    """The top-2 MoE layer's output, without the auxiliary loss and counts."""

    def __init__(self, dim: int, ffn: int, experts: int, ep_size: int, drop_tokens: bool, capacity_factor: float) -> None:
        super().__init__()
        self.moe = MoE(dim, Expert(dim, ffn), num_experts=experts, ep_size=ep_size, k=2, min_capacity=0,
                       use_rts=False, drop_tokens=drop_tokens, capacity_factor=capacity_factor,
                       top2_2nd_expert_sampling=False)
        self.moe.set_deepspeed_parallelism()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.moe(x)[0]


def moe(ctx: BuildContext) -> Model:
    dim, ffn, experts = ctx.knob("dim", 16), ctx.knob("ffn", 32), ctx.knob("experts", 8)
    drop, factor = ctx.knob("drop_tokens", True), float(ctx.knob("capacity_factor", 1.0))
    setup()
    baseline = Top2Block(dim, ffn, experts, 1, drop, factor)

    def distributed(rank: int) -> Top2Block:
        setup()
        return Top2Block(dim, ffn, experts, ctx.tp, drop, factor)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, 4, dim))],
        plan={"moe.deepspeed_moe.experts.deepspeed_experts": "expert_list"},
    )
