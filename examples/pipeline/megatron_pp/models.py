"""A pipeline written with megatron-core's schedules (``get_forward_backward_func()``).

Each rank initializes Megatron's model-parallel state with ``pipeline_model_parallel_size``,
holds its stage's layers (``set_input_tensor`` takes the activation Megatron's
``p2p_communication`` received) and runs the schedule Megatron picks for a pipeline
(``forward_backward_pipelining_without_interleaving``), forward-only or training, over
microbatches the data iterator yields. Activations are ``(seq, micro_batch, hidden)``, as
Megatron's ``tensor_shape`` says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.transformer_config import TransformerConfig

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
    """The single-device model over ``(seq, batch, hidden)``."""

    def __init__(self, hidden: int, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(i): Block(hidden) for i in range(layers)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


class StageModel(nn.Module):
    """What a Megatron pipeline rank holds: its layers, and the received activation."""

    def __init__(self, config: TransformerConfig, hidden: int, layers: list[int]) -> None:
        super().__init__()
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.layers = nn.ModuleDict({str(i): Block(hidden) for i in layers})
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, tensor: Any) -> None:
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, x: torch.Tensor | None) -> torch.Tensor:
        h = x if parallel_state.is_pipeline_first_stage() else self.input_tensor
        assert h is not None
        for layer in self.layers.values():
            h = layer(h)
        return h


def stage_layers(rank: int, pp: int, layers: int, variant: str) -> list[int]:
    per = layers // pp
    first = rank * per
    if variant == "drop_layer" and rank == 1:
        first += 1  # BUG-SITE: drop_layer (rank 1 starts one layer late)
    return list(range(first, (rank + 1) * per))


def forward_only(ctx: BuildContext) -> Pipeline:
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 4), ctx.knob("pp", 2)
    m, batch, seq = ctx.knob("microbatches", 2), ctx.knob("batch", 4), ctx.knob("seq", 2)
    variant = ctx.variant or ""

    def stage(rank: int) -> nn.Module:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp)
        config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=1, pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32)
        model = StageModel(config, hidden, stage_layers(rank, pp, layers, variant))

        def run(x: torch.Tensor) -> torch.Tensor | None:
            outputs: list[torch.Tensor] = []

            def forward_step(data: Iterator[torch.Tensor], module: StageModel) -> tuple[torch.Tensor, Any]:
                y = module(next(data))

                def collect(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                    outputs.append(output)
                    return output.sum(), {}

                return y, collect

            seq_length = seq
            if variant == "seq_length_disagrees" and rank == pp - 1:
                seq_length = 2 * seq  # BUG-SITE: seq_length_disagrees (the last rank expects activations of twice the sequence length)
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(x.chunk(m, dim=1)),
                model=[model],
                num_microbatches=m,
                seq_length=seq_length,
                micro_batch_size=batch // m,
                forward_only=True,
            )
            return torch.cat(outputs, dim=1) if outputs else None

        return rank_program([model], run)

    return Pipeline(baseline=Net(hidden, layers), stage=stage, stages=pp, inputs=[Input("x", (seq, batch, hidden))])


class TrainNet(Net):
    """The single-device training step: every parameter's gradient (model order, which is rank
    order) and the MSE loss of the whole batch."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        loss = torch.nn.functional.mse_loss(super().forward(x), target)
        return (*torch.autograd.grad(loss, list(self.parameters())), loss)


def training(ctx: BuildContext) -> Pipeline:
    """A training step through get_forward_backward_func(): Megatron's 1F1B runs each
    microbatch's forward and backward, divides each microbatch's loss by the number of
    microbatches and accumulates every parameter's ``.grad``."""
    hidden, layers, pp = ctx.knob("hidden", 16), ctx.knob("layers", 4), ctx.knob("pp", 2)
    m, batch, seq = ctx.knob("microbatches", 1), ctx.knob("batch", 4), ctx.knob("seq", 2)
    variant = ctx.variant or ""

    def stage(rank: int) -> nn.Module:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp)
        config = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=1, pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32)
        model = StageModel(config, hidden, stage_layers(rank, pp, layers, variant))

        def run(x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
            def forward_step(data: Iterator[tuple[torch.Tensor, torch.Tensor]], module: StageModel) -> tuple[torch.Tensor, Any]:
                inputs, labels = next(data)
                y = module(inputs)

                def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                    # As Megatron-LM's loss functions: the schedule divides the returned loss by
                    # the number of microbatches in place; the reported one is a copy.
                    loss = torch.nn.functional.mse_loss(output, labels)
                    return loss, {"loss": loss.detach().clone()}

                return y, loss_func

            if variant == "stale_target":
                labels = [target.chunk(m, dim=1)[0]] * m  # BUG-SITE: stale_target (every microbatch is scored against the first microbatch's targets)
            else:
                labels = list(target.chunk(m, dim=1))
            reported = get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(zip(x.chunk(m, dim=1), labels, strict=True)),
                model=[model],
                num_microbatches=m,
                seq_length=seq,
                micro_batch_size=batch // m,
                forward_only=False,
            )
            grads = tuple(p.grad for p in model.parameters())
            if not parallel_state.is_pipeline_last_stage():
                return grads
            losses = [r["loss"] for r in reported]
            return (*grads, sum(losses[1:], losses[0]) / len(losses))

        return rank_program([model], run)

    shape = (seq, batch, hidden)
    return Pipeline(baseline=TrainNet(hidden, layers), stage=stage, stages=pp, inputs=[Input("x", shape), Input("target", shape)])
