"""megatron-core's GPTModel pipelined: ``pre_process`` on the first stage (embeddings),
``post_process`` on the last (final norm, output layer), each stage's TransformerBlock building
its share of the layers (numbered from 0 on every stage, ``layer_number`` offset by Megatron),
run by ``get_forward_backward_func()`` forward-only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from shardproof.engine.frontend.declare import BuildContext, Input
from shardproof.engine.frontend.pipeline import Pipeline
from shardproof.engine.frontend.pipeline.program import rank_program
from shardproof.engine.frontend.torchdist import backend


def config(layers: int, hidden: int, heads: int, pp: int, first: int | None = None) -> TransformerConfig:
    return TransformerConfig(
        num_layers=layers, num_layers_in_first_pipeline_stage=first, hidden_size=hidden, ffn_hidden_size=2 * hidden, num_attention_heads=heads,
        pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32, use_cpu_initialization=True,
        perform_initialization=False, attention_dropout=0.0, hidden_dropout=0.0, bias_dropout_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
    )


def gpt_model(cfg: TransformerConfig, vocab: int, seq: int, pre: bool = True, post: bool = True) -> GPTModel:
    return GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab,
                    max_sequence_length=seq, pre_process=pre, post_process=post, position_embedding_type="learned_absolute",
                    share_embeddings_and_output_weights=False, parallel_output=False)


def start(pp: int) -> None:
    """Megatron's groups for a world of ``pp`` ranks. The baseline is built in a world of one
    rank on the front end's torch.distributed backend (a stage's world is started by the
    front end before ``stage(rank)`` is called)."""
    if pp == 1:
        backend.start(0, 1)
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=pp)


class Baseline(nn.Module):
    def __init__(self, model: GPTModel) -> None:
        super().__init__()
        self.gpt = model

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.gpt(ids, positions, attention_mask=None)


def forward_only(ctx: BuildContext) -> Pipeline:
    layers, hidden, heads, pp = ctx.knob("layers", 4), ctx.knob("hidden", 32), ctx.knob("heads", 4), ctx.knob("pp", 2)
    vocab, seq, batch = ctx.knob("vocab", 64), ctx.knob("seq", 8), ctx.knob("batch", 2)
    first = ctx.knob("first_stage_layers", 0) or None  # Megatron's uneven split (None: even)
    variant = ctx.variant or ""
    start(1)
    baseline = Baseline(gpt_model(config(layers, hidden, heads, 1), vocab, seq))

    def stage(rank: int) -> nn.Module:
        start(pp)
        cfg = config(layers, hidden, heads, pp, first)
        if variant == "first_stage_config_differs" and rank == 0:
            # BUG-SITE: first_stage_config_differs (rank 0 is launched with one layer on the first stage; the others split evenly)
            cfg = config(layers, hidden, heads, pp, 1)
        model = gpt_model(cfg, vocab, seq, pre=rank == 0, post=rank == pp - 1)
        offset = get_transformer_layer_offset(cfg)  # Megatron's own: where this stage's layers start

        def rename(path: str) -> str:
            # Megatron numbers a stage's layers from 0; the baseline's are global.
            return "gpt." + re.sub(r"^decoder\.layers\.(\d+)", lambda m: f"decoder.layers.{int(m.group(1)) + offset}", path)

        def run(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
            outputs: list[torch.Tensor] = []

            def forward_step(data: Iterator[tuple[torch.Tensor, torch.Tensor]], module: GPTModel) -> tuple[torch.Tensor, Any]:
                i, p = next(data)
                y = module(i, p, attention_mask=None)

                def collect(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                    outputs.append(output)
                    return output.sum(), {}

                return y, collect

            get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([(ids, positions)]), model=[model],
                                        num_microbatches=1, seq_length=seq, micro_batch_size=batch, forward_only=True)
            return outputs[0] if outputs else None

        return rank_program([model], run, rename)

    return Pipeline(
        baseline=baseline, stage=stage, stages=pp,
        inputs=[Input("ids", (batch, seq), "int64", int_range=(0, vocab)), Input("positions", (batch, seq), "int64", int_range=(0, seq))],
    )
