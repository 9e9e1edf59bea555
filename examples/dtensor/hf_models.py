"""Entry points of examples/dtensor/.shardproof.yml: Hugging Face transformers' tensor parallelism.

Each model is a transformers causal LM built from a small config (no download), distributed
the way ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))`` does before it
loads weights: ``prepare_distribute_model`` (the device mesh) and ``maybe_distribute_model``
(the model's ``base_model_tp_plan`` applied on DTensor). transformers is unmodified.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.distributed import DistributedConfig

from shardproof.engine.frontend.declare import BuildContext, Input, Model

_FAMILIES: dict[str, tuple[Any, Any]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
}


class Logits(nn.Module):
    """The model's logits for ``input_ids`` (the causal LM's output without its cache)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Any) -> Any:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def causal_lm(ctx: BuildContext) -> Model:
    family = ctx.knob("family", "llama")
    vocab, dim, ffn = ctx.knob("vocab", 64), ctx.knob("dim", 32), ctx.knob("ffn", 64)
    heads, kv_heads, layers = ctx.knob("heads", 8), ctx.knob("kv_heads", 4), ctx.knob("layers", 2)
    config_class, model_class = _FAMILIES[family]
    # Mixtral's experts as batched matmuls over the routed experts' weights (transformers'
    # "batched_mm"): the default implementations sort or nonzero the routing, a data-dependent
    # shape no traced program holds.
    extra: dict[str, Any] = {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"} if family == "mixtral" else {}
    config = config_class(
        vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
        tie_word_embeddings=False, attn_implementation="eager", **extra,
    )

    def distributed(rank: int) -> nn.Module:
        distributed_config, _, mesh = model_class.prepare_distribute_model(DistributedConfig(tp_size=ctx.tp))
        return Logits(model_class.maybe_distribute_model(model_class(config), distributed_config, mesh))

    return Model(
        baseline=Logits(model_class(config)),
        distributed=distributed,
        inputs=[Input("input_ids", (2, 8), "int64", int_range=(0, vocab))],
    )
