"""Entry points that declare tplm's models to shardproof (see ``examples/.shardproof.yml``).

Each returns the baseline (the model at degree 1), the per-rank model for a symbolic rank, the
example inputs and the sharding plan in PyTorch's tensor-parallel vocabulary. The ``variant``
flag of a bug variant reaches only the per-rank model, the way a regression reaches only the
parallel code path of a framework.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shardproof.engine.frontend.declare import BuildContext, Input, Model

from .decode import SplitKVDecode
from .llama import Llama, LlamaConfig
from .moe import AllToAllMoE, expert_parallel
from .parallel import Parallel
from .ring import RingAttention, RingMLP
from .train import DataParallelTrainStep, TrainStep
from .ulysses import UlyssesAttention

LLAMA_BUGS = (
    "missing_attn_allreduce", "redundant_mlp_allreduce", "sp_norm_precision", "rotary_precision",
    "head_split_axis", "bsh_logits_layout", "qk_norm_after_rope", "qkv_slice_offset",
    "attn_scale_one_rank", "moe_wrong_groups", "moe_missing_allreduce", "ce_on_gathered_logits",
    "loss_scaled_by_tp", "padded_head_leak", "padded_kv_index",
)  # fmt: skip
# Bugs outside the decoder layers: ``bug_layer`` cannot confine them to one layer.
MODEL_LEVEL_BUGS = ("bsh_logits_layout", "ce_on_gathered_logits", "loss_scaled_by_tp")
DECODE_BUGS = ("decode_local_max",)
TRAIN_BUGS = ("sp_norm_grad_missing", "sp_norm_grad_twice", "sp_norm_grad_wrong_group")
DP_TRAIN_BUGS = ("dp_grad_missing", "dp_grad_scaled_twice")
ULYSSES_BUGS = ("ulysses_batch_split",)
RING_BUGS = ("ring_step_off_by_one",)
MOE_A2A_BUGS = ("moe_a2a_expert_owner",)
RING_ATTN_BUGS = ("ring_attn_step_off_by_one",)


def _variant(ctx: BuildContext, known: tuple[str, ...]) -> str | None:
    if ctx.variant is not None and ctx.variant not in known:
        raise ValueError(f"unknown variant {ctx.variant!r}; this entry point knows {', '.join(known)}")
    return ctx.variant


def _llama_config(ctx: BuildContext) -> LlamaConfig:
    kv_heads = ctx.knob("kv_heads", 4)
    heads, ffn, experts = ctx.knob("heads", 8), ctx.knob("ffn", 128), ctx.knob("experts", 0)
    return LlamaConfig(
        vocab=ctx.knob("vocab", 256),
        hidden=ctx.knob("hidden", 64),
        layers=ctx.knob("layers", 2),
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        seq=ctx.knob("seq", 16),
        batch=ctx.knob("batch", 2),
        qk_norm=ctx.knob("qk_norm", False),
        fused=ctx.knob("fused", True),
        experts=experts,
        top_k=ctx.knob("top_k", 2),
        replicate_kv=kv_heads < ctx.tp,
        # Neuron's layout when heads (or KV heads, neither dividing nor divided by the degree)
        # or FFN features do not divide over the ranks: pad them (tplm.llama).
        pad_heads=heads % ctx.tp != 0 or (kv_heads % ctx.tp != 0 and ctx.tp % kv_heads != 0),
        pad_ffn=not experts and ffn % ctx.tp != 0,
    )


def llama_plan(cfg: LlamaConfig, tp: int, prefix: str = "", bug: str | None = None) -> dict[str, Any]:
    """The sharding plan of :class:`~tplm.llama.Llama` (``prefix``: its path in a wrapper)."""
    hd = cfg.head_dim
    plan: dict[str, Any] = {
        f"{prefix}layers.*.attn.out": {"style": "rowwise", "padded": True} if cfg.pad_heads else "rowwise",
        f"{prefix}layers.*.attn_norm": "sequence_parallel",
        f"{prefix}layers.*.mlp_norm": "sequence_parallel",
    }
    if cfg.pad_heads:
        plan[f"{prefix}layers.*.attn.q"] = {"style": "colwise", "padded": True}
        plan[f"{prefix}layers.*.attn.kv"] = "replicate"
        if bug == "padded_head_leak":
            plan[f"{prefix}layers.*.attn.out"] = "replicate"
    elif cfg.replicate_kv:
        plan[f"{prefix}layers.*.attn.q"] = "colwise"
        plan[f"{prefix}layers.*.attn.kv"] = "replicate"
    elif cfg.fused:
        plan[f"{prefix}layers.*.attn.qkv"] = {"style": "colwise", "blocks": [cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd]}
    else:
        for name in ("q", "k", "v"):
            plan[f"{prefix}layers.*.attn.{name}"] = "colwise"
    if cfg.experts and expert_parallel(cfg.experts, tp):
        for name in ("router", "gate_up", "down"):
            plan[f"{prefix}layers.*.mlp.{name}"] = "expert"
    elif cfg.experts:  # tensor-parallel experts: each expert a column/row-parallel SwiGLU
        plan[f"{prefix}layers.*.mlp.router"] = "replicate"
        plan[f"{prefix}layers.*.mlp.gate_up"] = {"shard": 1, "blocks": [cfg.ffn, cfg.ffn]}
        plan[f"{prefix}layers.*.mlp.down"] = {"shard": 2}
    else:
        if cfg.pad_ffn:
            plan[f"{prefix}layers.*.mlp.gate"] = {"style": "colwise", "padded": True}
            plan[f"{prefix}layers.*.mlp.up"] = {"style": "colwise", "padded": True}
            plan[f"{prefix}layers.*.mlp.down"] = {"style": "rowwise", "padded": True}
        elif cfg.fused:
            plan[f"{prefix}layers.*.mlp.gate_up"] = {"style": "colwise", "blocks": [cfg.ffn, cfg.ffn]}
            plan[f"{prefix}layers.*.mlp.down"] = "rowwise"
        else:
            plan[f"{prefix}layers.*.mlp.gate"] = "colwise"
            plan[f"{prefix}layers.*.mlp.up"] = "colwise"
            plan[f"{prefix}layers.*.mlp.down"] = "rowwise"
    return plan


def llama(ctx: BuildContext) -> Model:
    """Llama (or, with ``experts``, Mixtral) logits; with ``loss: true`` the mean cross-entropy.

    ``bug_layer: N`` confines the bug variant to decoder layer N of the per-rank model (every
    other layer is correct): a bug deep inside a long stack, for the layer partitioning.
    """
    bug = _variant(ctx, LLAMA_BUGS)
    cfg = _llama_config(ctx)
    bug_layer = ctx.knob("bug_layer", -1)
    if bug_layer != -1:
        if not 0 <= bug_layer < cfg.layers:
            raise ValueError(f"bug_layer {bug_layer} is not a layer index (the model has {cfg.layers} layers)")
        if bug in MODEL_LEVEL_BUGS:
            raise ValueError(f"variant {bug!r} is outside the decoder layers; bug_layer cannot confine it")
        cfg = replace(cfg, bug_layer=bug_layer)
    sp = ctx.knob("sequence_parallel", False)
    loss = ctx.knob("loss", False)
    ids = ctx.knob("ids_dtype", "int64")
    inputs = [Input("tokens", (cfg.batch, cfg.seq), ids, int_range=(0, cfg.vocab))]
    if loss:
        inputs.append(Input("targets", (cfg.batch, cfg.seq), ids, int_range=(0, cfg.vocab)))
    plan = {"embed": "rowwise", "norm": "sequence_parallel", "head": "colwise", **llama_plan(cfg, ctx.tp, bug=bug)}
    return Model(
        baseline=Llama(cfg, Parallel()),
        distributed=lambda rank: Llama(cfg, Parallel(ctx.tp, rank, ctx.groups, sp, bug)),
        inputs=inputs,
        plan=plan,
        description="Llama decoder (GQA + rotary, RMSNorm, SwiGLU or MoE), vocab-parallel embedding and head",
    )


def decode(ctx: BuildContext) -> Model:
    """One split-KV decoding step over a KV cache split along the sequence across the ranks."""
    bug = _variant(ctx, DECODE_BUGS)
    hidden, heads, kv_heads = ctx.knob("hidden", 64), ctx.knob("heads", 8), ctx.knob("kv_heads", 2)
    cache, chunk, batch = ctx.knob("cache", 64), ctx.knob("chunk", 4), ctx.knob("batch", 2)
    hd = hidden // heads
    inputs = [
        Input("x", (batch, hidden)),
        Input("k_cache", (batch, kv_heads, cache, hd), shard=2),
        Input("v_cache", (batch, kv_heads, cache, hd), shard=2),
    ]
    return Model(
        baseline=SplitKVDecode(hidden, heads, kv_heads, chunk, Parallel()),
        distributed=lambda rank: SplitKVDecode(hidden, heads, kv_heads, chunk, Parallel(ctx.tp, rank, ctx.groups, bug=bug)),
        inputs=inputs,
        plan={"q": "replicate", "out": "replicate"},
        description="flash-decoding-style split-KV attention, KV cache split along the sequence",
    )


def train_step(ctx: BuildContext) -> Model:
    """Forward + backward + SGD (or AdamW) step of a sequence-parallel decoder stack, with
    optional gradient accumulation over micro-batches."""
    bug = _variant(ctx, TRAIN_BUGS)
    cfg = _llama_config(ctx)
    lr = ctx.knob("lr", 0.01)
    optimizer, micro_batches = ctx.knob("optimizer", "sgd"), ctx.knob("micro_batches", 1)
    baseline = TrainStep(cfg, Parallel(), lr, optimizer, micro_batches)
    names = [name for name, _ in baseline.named_parameters()]
    shape = (cfg.seq, cfg.batch, cfg.hidden)
    return Model(
        baseline=baseline,
        distributed=lambda rank: TrainStep(cfg, Parallel(ctx.tp, rank, ctx.groups, True, bug), lr, optimizer, micro_batches),
        inputs=[Input("x", shape, shard=0), Input("target", shape, shard=0)],
        plan=llama_plan(cfg, ctx.tp, prefix="model.") | {"model.norm": "sequence_parallel"},
        outputs=["replicate", *({"like": name} for name in names)],
        description="training step: forward, loss, backward, SP norm-gradient all-reduce, SGD update",
    )


def dp_train_step(ctx: BuildContext) -> Model:
    """Forward + backward + SGD step under data parallelism: the batch split over the group,
    gradients all-reduced and averaged over it."""
    bug = _variant(ctx, DP_TRAIN_BUGS)
    cfg = _llama_config(ctx)
    lr = ctx.knob("lr", 0.01)
    baseline = DataParallelTrainStep(cfg, Parallel(), lr)
    names = [name for name, _ in baseline.named_parameters()]
    shape = (cfg.seq, cfg.batch, cfg.hidden)
    return Model(
        baseline=baseline,
        distributed=lambda rank: DataParallelTrainStep(cfg, Parallel(ctx.tp, rank, ctx.groups, bug=bug), lr),
        inputs=[Input("x", shape, shard=1), Input("target", shape, shard=1)],
        plan={},
        outputs=["replicate", *({"like": name} for name in names)],
        description="data-parallel training step: per-rank mean loss, gradient all-reduce / DP, SGD update",
    )


def ulysses(ctx: BuildContext) -> Model:
    """Ulysses sequence-parallel self-attention: sequence-sharded activations, all-to-all to
    head blocks and back, replicated projections."""
    bug = _variant(ctx, ULYSSES_BUGS)
    hidden, heads = ctx.knob("hidden", 64), ctx.knob("heads", 8)
    batch, seq = ctx.knob("batch", 2), ctx.knob("seq", 8)
    return Model(
        baseline=UlyssesAttention(hidden, heads, Parallel()),
        distributed=lambda rank: UlyssesAttention(hidden, heads, Parallel(ctx.tp, rank, ctx.groups, bug=bug)),
        inputs=[Input("x", (seq, batch, hidden), shard=0)],
        plan={name: "replicate" for name in ("q", "k", "v", "out")},
        outputs=[{"shard": 0}],
        description="Ulysses sequence-parallel attention (all-to-all sequence <-> heads)",
    )


def ring_mlp(ctx: BuildContext) -> Model:
    """A tensor-parallel MLP whose row-parallel partial sums meet in a ring all-reduce."""
    bug = _variant(ctx, RING_BUGS)
    hidden, ffn = ctx.knob("hidden", 64), ctx.knob("ffn", 128)
    batch, seq = ctx.knob("batch", 2), ctx.knob("seq", 8)
    return Model(
        baseline=RingMLP(hidden, ffn, Parallel()),
        distributed=lambda rank: RingMLP(hidden, ffn, Parallel(ctx.tp, rank, ctx.groups, bug=bug)),
        inputs=[Input("x", (seq, batch, hidden))],
        plan={"up": "colwise", "down": "rowwise"},
        description="tensor-parallel MLP with a ring all-reduce of collective-permutes",
    )


def moe_alltoall(ctx: BuildContext) -> Model:
    """Expert-parallel MoE with an all-to-all token dispatcher and combiner over
    sequence-sharded tokens (Megatron-LM's alltoall dispatcher, DeepSpeed-MoE)."""
    bug = _variant(ctx, MOE_A2A_BUGS)
    hidden, ffn = ctx.knob("hidden", 64), ctx.knob("ffn", 128)
    experts, top_k = ctx.knob("experts", 8), ctx.knob("top_k", 2)
    batch, seq = ctx.knob("batch", 2), ctx.knob("seq", 8)
    return Model(
        baseline=AllToAllMoE(hidden, ffn, experts, top_k, Parallel()),
        distributed=lambda rank: AllToAllMoE(hidden, ffn, experts, top_k, Parallel(ctx.tp, rank, ctx.groups, bug=bug)),
        inputs=[Input("x", (seq, batch, hidden), shard=0)],
        plan={"router": "replicate", "gate_up": "expert", "down": "expert"},
        outputs=[{"shard": 0}],
        description="expert-parallel MoE, all-to-all dispatch to the experts' ranks and all-to-all combine",
    )


def ring_attention(ctx: BuildContext) -> Model:
    """Ring attention (context parallelism): sequence-sharded queries, key/value blocks passed
    around the ring by collective-permutes, online-softmax accumulation over the ring steps."""
    bug = _variant(ctx, RING_ATTN_BUGS)
    hidden, heads = ctx.knob("hidden", 64), ctx.knob("heads", 8)
    batch, seq = ctx.knob("batch", 2), ctx.knob("seq", 8)
    return Model(
        baseline=RingAttention(hidden, heads, Parallel()),
        distributed=lambda rank: RingAttention(hidden, heads, Parallel(ctx.tp, rank, ctx.groups, bug=bug)),
        inputs=[Input("x", (seq, batch, hidden), shard=0)],
        plan={name: "replicate" for name in ("q", "k", "v", "out")},
        outputs=[{"shard": 0}],
        description="ring attention: K/V blocks around the ring, online softmax over the steps",
    )
