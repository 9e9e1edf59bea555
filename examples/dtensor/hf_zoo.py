"""Entry points of examples/dtensor/.shardproof.yml: more transformers causal LMs with their own TP plans.

Each is a transformers causal LM (unmodified, transformers from PyPI) built from a small config,
distributed the way ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=N))``
does before loading weights: ``prepare_distribute_model`` then ``maybe_distribute_model`` (the
model's ``base_model_tp_plan`` applied on DTensor). The family is a size knob naming the
transformers class prefix (``Mistral`` -> ``MistralConfig`` / ``MistralForCausalLM``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import transformers
from transformers.distributed import DistributedConfig

from shardproof.engine.frontend.declare import BuildContext, Input, Model

# Config fields a family needs beyond the common ones, so that the small shapes divide over the
# ranks and nothing random (dropout) or data-dependent (sorting the routing) enters the program.
_EXTRA: dict[str, dict[str, Any]] = {
    "Gemma": {"head_dim": 8},
    "Gemma2": {"head_dim": 8, "sliding_window": 4},
    "Gemma3Text": {"head_dim": 8, "sliding_window": 4},
    "Qwen3": {"head_dim": 8},
    "Phi3": {"pad_token_id": 0},
    "Glm": {"pad_token_id": 0, "head_dim": 4},
    "Phi": {"pad_token_id": 0},
    "GPTNeoX": {"pad_token_id": 0},
    "Helium": {"head_dim": 4},
    "SmolLM3": {"pad_token_id": 0},
    "Qwen2Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "experts_implementation": "batched_mm"},
    "GraniteMoe": {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"},
    "Glm4": {"pad_token_id": 0, "head_dim": 4},
    "Jais2": {"pad_token_id": 0},
    "Ministral": {"head_dim": 4},
    "Qwen3Moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "experts_implementation": "batched_mm"},
    "Olmoe": {"num_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"},
    "PhiMoE": {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"},
}


class Logits(nn.Module):
    """The model's logits for ``input_ids`` (the causal LM's output without its cache)."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Any) -> Any:
        return self.lm(input_ids=input_ids, use_cache=False).logits


def _rows_seq_major(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Bug variant ``rows_seq_major``: the norm's input rows taken in (sequence, batch) order and
    viewed as (batch, sequence) - what a gather along the wrong dim hands the next layer."""
    (x,) = args
    return (x.transpose(0, 1).reshape(x.shape),)


def _blocks_rotated(tp: int) -> Any:
    """Bug variant ``gathered_blocks_rotated``: a projection's gathered output with its rank
    blocks one place out of order - rank r's columns where rank r + 1's belong."""

    def hook(module: nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        w = out.shape[-1] // tp
        return torch.cat([out[..., w:], out[..., :w]], dim=-1)

    return hook


def causal_lm(ctx: BuildContext) -> Model:
    family = ctx.knob("family", "Mistral")
    vocab, dim, ffn = ctx.knob("vocab", 64), ctx.knob("dim", 32), ctx.knob("ffn", 64)
    heads, kv_heads, layers = ctx.knob("heads", 8), ctx.knob("kv_heads", 4), ctx.knob("layers", 2)
    config_class = getattr(transformers, f"{family}Config")
    model_class = getattr(transformers, f"{family}ForCausalLM")
    config = config_class(
        vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
        tie_word_embeddings=False, attn_implementation="eager", **_EXTRA.get(family, {}),
    )

    def distributed(rank: int) -> nn.Module:
        distributed_config, _, mesh = model_class.prepare_distribute_model(DistributedConfig(tp_size=ctx.tp))
        lm = model_class.maybe_distribute_model(model_class(config), distributed_config, mesh)
        if ctx.variant == "rows_seq_major":
            lm.model.layers[layers - 1].input_layernorm.register_forward_pre_hook(_rows_seq_major)
        if ctx.variant == "gathered_blocks_rotated":
            lm.model.layers[layers - 1].self_attn.k_proj.register_forward_hook(_blocks_rotated(ctx.tp))
        return Logits(lm)

    return Model(
        baseline=Logits(model_class(config)),
        distributed=distributed,
        inputs=[Input("input_ids", (2, 8), "int64", int_range=(0, vocab))],
    )
