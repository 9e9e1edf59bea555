"""A megatron-core TransformerLayer (local spec, RMSNorm, SwiGLU) with grouped-query attention,
for numeric localization (tests/test_localize_blocked.py)."""

from __future__ import annotations

from typing import Any

import torch
from megatron.core import parallel_state

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def _parallel(tp: int) -> None:
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)


class Layer(torch.nn.Module):
    def __init__(self, tp: int, n: dict[str, int]) -> None:
        super().__init__()
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.spec_utils import build_module
        from megatron.core.transformer.transformer_config import TransformerConfig

        _parallel(tp)
        cfg = TransformerConfig(
            num_layers=1, hidden_size=n["hidden"], ffn_hidden_size=n["ffn"], num_attention_heads=n["heads"],
            num_query_groups=n["groups"], gated_linear_unit=True, activation_func=torch.nn.functional.silu,
            add_bias_linear=False, tensor_model_parallel_size=tp, normalization="RMSNorm",
            use_cpu_initialization=True, perform_initialization=False, attention_dropout=0.0, hidden_dropout=0.0,
            bias_dropout_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
            apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        )
        self.layer = build_module(get_gpt_layer_local_spec(normalization="RMSNorm"), config=cfg, layer_number=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, attention_mask=None)[0]


def gqa_layer(ctx: BuildContext) -> Model:
    """``size.groups``: KV heads (8 = one per query head); ``size.glu_blocks``: shard fc1 as the
    two blocks [gate; up] it is (else plain colwise, the bug)."""
    n = {"hidden": ctx.knob("hidden", 64), "ffn": ctx.knob("ffn", 96), "heads": ctx.knob("heads", 8), "groups": ctx.knob("groups", 4)}
    baseline = Layer(1, n)

    def distributed(rank: int) -> Any:
        return Layer(ctx.tp, n)

    fc1: Any = {"style": "colwise", "blocks": [n["ffn"], n["ffn"]]} if ctx.knob("glu_blocks", False) else "colwise"
    plan = {"*.self_attention.linear_qkv": "colwise", "*.self_attention.linear_proj": "rowwise", "*.mlp.linear_fc1": fc1, "*.mlp.linear_fc2": "rowwise"}
    return Model(baseline=baseline, distributed=distributed, inputs=[Input("x", (4, 2, n["hidden"]))], plan=plan)
