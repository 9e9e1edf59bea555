"""Entry points of examples/megatron/.shardproof.yml: megatron-core layers, unmodified.

Each model is declared with ``rank: int``: the front end starts ``torch.distributed`` for one
rank at a time (its own backend, no GPUs), the entry initializes Megatron's parallel state the
way a training script does, and builds the layers. The baseline is the same Megatron code at
tensor-parallel degree 1. Bug variants monkeypatch Megatron in the distributed build only, the
way a regression in a fork of Megatron would reach only the sharded program.
"""

from __future__ import annotations

from typing import Any

import mcore_bugs as bugs
import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.model_parallel_config import ModelParallelConfig
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from megatron.core.tensor_parallel.mappings import all_to_all_sp2hp

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def parallel(tp: int, sequence_parallel: bool = False, dtype: torch.dtype = torch.float32) -> ModelParallelConfig:
    """Megatron's parallel state at degree ``tp`` over the started world, and a layer config.

    Weights are created on the CPU path (``use_cpu_initialization``) without initialization:
    the front end replaces every parameter by a placeholder anyway.
    """
    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, create_gloo_process_groups=False)
    return ModelParallelConfig(
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel and tp > 1,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=dtype,
    )


class MLP(torch.nn.Module):
    """ColumnParallelLinear -> gelu -> RowParallelLinear, in Megatron's (s, b, h) layout."""

    def __init__(self, config: ModelParallelConfig, hidden: int, ffn: int) -> None:
        super().__init__()
        sp = config.sequence_parallel
        self.fc1 = ColumnParallelLinear(hidden, ffn, config=config, init_method=_no_init, bias=True, gather_output=False)
        self.fc2 = RowParallelLinear(ffn, hidden, config=config, init_method=_no_init, bias=True, input_is_parallel=True, skip_bias_add=False)
        self.sequence_parallel = sp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.fc1(x)
        y, _ = self.fc2(F.gelu(h))
        return y


class ColumnGather(torch.nn.Module):
    """ColumnParallelLinear with ``gather_output=True``: every rank ends with the whole output."""

    def __init__(self, config: ModelParallelConfig, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc = ColumnParallelLinear(hidden, ffn, config=config, init_method=_no_init, bias=False, gather_output=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)[0]


class Embedding(torch.nn.Module):
    def __init__(self, config: ModelParallelConfig, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(vocab, hidden, init_method=_no_init, config=config)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


def _no_init(weight: torch.Tensor) -> None:
    """Megatron's init_method; never called (perform_initialization=False)."""


def _sizes(ctx: BuildContext) -> dict[str, int]:
    return {k: ctx.knob(k, d) for k, d in (("hidden", 32), ("ffn", 64), ("seq", 8), ("batch", 2), ("vocab", 64))}


def mlp(ctx: BuildContext) -> Model:
    """Column/Row parallel MLP; ``size.sequence_parallel`` shards the sequence between blocks."""
    n = _sizes(ctx)
    sp = ctx.knob("sequence_parallel", False)
    dtype = torch.bfloat16 if ctx.knob("bf16", False) else torch.float32
    baseline = MLP(parallel(1, dtype=dtype), n["hidden"], n["ffn"])

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        return MLP(parallel(ctx.tp, sp, dtype), n["hidden"], n["ffn"])

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (n["seq"], n["batch"], n["hidden"]), "bfloat16" if dtype == torch.bfloat16 else "float32", shard=0 if sp else None)],
        plan={"fc1": "colwise", "fc2": "rowwise"},
        outputs=[{"shard": 0}] if sp else ["replicate"],
    )


def column_gather(ctx: BuildContext) -> Model:
    n = _sizes(ctx)
    baseline = ColumnGather(parallel(1), n["hidden"], n["ffn"])

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        return ColumnGather(parallel(ctx.tp), n["hidden"], n["ffn"])

    return Model(baseline=baseline, distributed=distributed, inputs=[Input("x", (n["seq"], n["batch"], n["hidden"]))], plan={"fc": "colwise"})


def embedding(ctx: BuildContext) -> Model:
    n = _sizes(ctx)
    baseline = Embedding(parallel(1), n["vocab"], n["hidden"])

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        return Embedding(parallel(ctx.tp), n["vocab"], n["hidden"])

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("ids", (n["batch"], n["seq"]), "int64", int_range=(0, n["vocab"]))],
        plan={"embed.weight": {"shard": 0}},
    )


class SeqToHidden(torch.nn.Module):
    """Megatron's all_to_all_sp2hp: tokens sharded over the ranks in, hidden sharded out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_to_all_sp2hp(x)


def sp2hp(ctx: BuildContext) -> Model:
    """(tokens, hidden) sharded along the tokens -> sharded along the hidden dim (all-to-all)."""
    n = _sizes(ctx)
    parallel(1)

    def distributed(rank: int) -> Any:
        parallel(ctx.tp)
        return SeqToHidden()

    return Model(
        baseline=SeqToHidden(),
        distributed=distributed,
        inputs=[Input("x", (n["seq"] * n["batch"], n["hidden"]), shard=0)],
        outputs=[{"shard": 1}],
    )


class Layer(torch.nn.Module):
    """A megatron-core TransformerLayer from the local (no Transformer Engine) spec."""

    def __init__(self, tp: int, normalization: str, n: dict[str, int]) -> None:
        super().__init__()
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.spec_utils import build_module

        config = _transformer_config(tp, normalization, n)
        self.layer = build_module(get_gpt_layer_local_spec(normalization=normalization), config=config, layer_number=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, attention_mask=None)[0]


def _transformer_config(tp: int, normalization: str, n: dict[str, int]) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel(tp)
    return TransformerConfig(
        num_layers=1,
        hidden_size=n["hidden"],
        ffn_hidden_size=n["ffn"],
        num_attention_heads=n["heads"],
        # None (the default) is one KV head per query head; fewer is grouped-query attention.
        num_query_groups=n.get("num_query_groups"),
        tensor_model_parallel_size=tp,
        normalization=normalization,
        use_cpu_initialization=True,
        perform_initialization=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bias_dropout_fusion=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


LAYER_PLAN = {
    "*.self_attention.linear_qkv": "colwise",
    "*.self_attention.linear_proj": "rowwise",
    "*.mlp.linear_fc1": "colwise",
    "*.mlp.linear_fc2": "rowwise",
}


def transformer_layer(ctx: BuildContext) -> Model:
    """TransformerLayer (local spec); ``size.norm``: RMSNorm or LayerNorm; ``size.num_query_groups``:
    KV heads for grouped-query attention (default: one per query head)."""
    heads = ctx.knob("heads", 4)
    n = {**_sizes(ctx), "heads": heads, "num_query_groups": ctx.knob("num_query_groups", heads)}
    norm = ctx.knob("norm", "RMSNorm")
    baseline = Layer(1, norm, n)

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        return Layer(ctx.tp, norm, n)

    return Model(baseline=baseline, distributed=distributed, inputs=[Input("x", (n["seq"], n["batch"], n["hidden"]))], plan=LAYER_PLAN)


class TinyGPT(torch.nn.Module):
    """megatron-core's GPTModel (local spec, RoPE), logits gathered over the vocabulary."""

    def __init__(self, tp: int, n: dict[str, int]) -> None:
        super().__init__()
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.models.gpt.gpt_model import GPTModel

        config = _transformer_config(tp, "RMSNorm", n)
        self.gpt = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=n["vocab"],
            max_sequence_length=n["seq"],
            position_embedding_type="rope",
            share_embeddings_and_output_weights=False,
            parallel_output=False,  # the output layer's gather_output=True
        )

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.gpt(ids, positions, attention_mask=None)


def gpt(ctx: BuildContext) -> Model:
    n = {**_sizes(ctx), "heads": ctx.knob("heads", 4)}
    baseline = TinyGPT(1, n)

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        return TinyGPT(ctx.tp, n)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("ids", (n["batch"], n["seq"]), "int64", int_range=(0, n["vocab"])), Input("positions", (n["batch"], n["seq"]), "int64", int_range=(0, n["seq"]))],
        plan={
            **{"gpt.decoder.layers." + key: style for key, style in LAYER_PLAN.items()},
            "gpt.embedding.word_embeddings.weight": {"shard": 0},
            "gpt.output_layer": "colwise",
        },
    )


class CrossEntropy(torch.nn.Module):
    """megatron-core's vocab_parallel_cross_entropy on logits sharded along the vocab (last) dim.

    At degree 1 (the baseline) the same Megatron function runs over the whole vocabulary; the
    loss is per token, (s, b), as Megatron returns it.
    """

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Megatron subtracts the max in place into its argument (in training, the output
        # layer's fresh result); a copy keeps the program's input itself unwritten.
        return vocab_parallel_cross_entropy(logits.clone(), target)


def cross_entropy(ctx: BuildContext) -> Model:
    """Vocab-parallel cross entropy: the baseline is torch's cross entropy over the whole vocab.

    The tokens come flattened, logits (s·b, vocab) and targets (s·b,), a shape Megatron's
    function takes as it is (it views any leading dims as one).
    """
    n = _sizes(ctx)
    parallel(1)
    tokens = n["seq"] * n["batch"]
    # size {ce_3d: true}: Megatron's usual [s, b, V] logits and [s, b] targets; the baseline
    # flattens them to 2-D for F.cross_entropy and views the loss back to (s, b).
    lead: tuple[int, ...] = (n["seq"], n["batch"]) if ctx.knob("ce_3d", False) else (tokens,)

    def baseline(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        flat = F.cross_entropy(logits.reshape(tokens, n["vocab"]), target.reshape(tokens), reduction="none")
        return flat.view(lead)

    def distributed(rank: int) -> Any:
        bugs.apply(ctx.variant, rank)
        parallel(ctx.tp)
        return CrossEntropy()

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[
            Input("logits", (*lead, n["vocab"]), shard=len(lead)),
            Input("target", lead, "int64", int_range=(0, n["vocab"])),
        ],
    )
