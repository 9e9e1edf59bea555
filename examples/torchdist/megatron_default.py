"""megatron-core set up the way its own training scripts do: ``initialize_model_parallel(tp)``
with every default, so gloo copies of the data-parallel groups are made too
(``create_gloo_process_groups=True``), and Megatron initializes the weights itself.

The front end has no peers to rendezvous with; every group, gloo or not, is a group of its own
backend over the same ranks (frontend/torchdist/backend.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def setup(tp: int) -> ModelParallelConfig:
    """What a Megatron training script does before it builds a model."""
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tp)
    return ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)


class MLP(torch.nn.Module):
    def __init__(self, config: ModelParallelConfig, hidden: int, ffn: int) -> None:
        super().__init__()
        init = torch.nn.init.xavier_normal_
        self.fc1 = ColumnParallelLinear(hidden, ffn, config=config, init_method=init, bias=True, gather_output=False)
        self.fc2 = RowParallelLinear(ffn, hidden, config=config, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.fc1(x)
        y, _ = self.fc2(F.gelu(h))
        return y


def mlp(ctx: BuildContext) -> Model:
    hidden, ffn = ctx.knob("hidden", 32), ctx.knob("ffn", 64)
    baseline = MLP(setup(1), hidden, ffn)

    def distributed(rank: int) -> MLP:
        return MLP(setup(ctx.tp), hidden, ffn)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (8, 2, hidden))],
        plan={"fc1": "colwise", "fc2": "rowwise"},
    )
