"""A Llama decoder stack (examples/tplm's decoder layers, unchanged) pipelined over ``pp`` stages,
each stage tensor-parallel over its TP group: Megatron's PP x TP layout.

The model is the decoder stack and the final RMSNorm: activations ``(s, b, h)`` in, normalized
activations out (no embedding and no LM head: tplm's vocab-parallel embedding reads the rank,
and a stage program is one SPMD program of its TP group with no rank input). Layers are split
as Megatron does for a layer count that does not divide: the first ``layers % pp`` stages hold
one more. Rank r of stage k sends its (replicated) activation to rank r of stage k+1.

Needs ``examples/`` on the Python path (for ``tplm``): bench/scale.py's pipeline rows declare
``pipeline.llama_pp:decoder_pipeline`` and ``pipeline.llama_pp:decoder_tp``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from tplm.layers import RMSNorm, rotary_tables
from tplm.llama import DecoderLayer, LlamaConfig
from tplm.models import llama_plan
from tplm.parallel import Parallel

from shardproof.engine.frontend.declare import BuildContext, Input, Model
from shardproof.engine.frontend.pipeline import Pipeline


def stage_layers(stage: int, pp: int, layers: int) -> list[int]:
    """Megatron's split of ``layers`` over ``pp`` stages: sizes differ by at most one, the
    larger first."""
    per, extra = divmod(layers, pp)
    first = stage * per + min(stage, extra)
    return list(range(first, first + per + (1 if stage < extra else 0)))


class DecoderStack(nn.Module):
    """Decoder layers ``own`` (under the baseline's names ``layers.<i>``) and, when ``last``,
    the final norm."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel, own: list[int], last: bool) -> None:
        super().__init__()
        self.cfg, self.own = cfg, own
        self.layers = nn.ModuleDict({str(i): DecoderLayer(cfg, ps) for i in own})
        self.norm = RMSNorm(cfg.hidden, cfg.eps) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary_tables(x.shape[0], self.cfg.head_dim, self.cfg.rope_theta, x.device)
        for i in self.own:
            x = self.layers[str(i)](x, cos, sin)
        return self.norm(x) if self.norm is not None else x


class Stage(DecoderStack):
    """Stage ``stage``: receive the activation from the previous stage (stage 0 reads the
    input), run its layers, send to the next stage (the last returns the normalized output)."""

    def __init__(self, cfg: LlamaConfig, ps: Parallel, stage: int, pp: int) -> None:
        super().__init__(cfg, ps, stage_layers(stage, pp, cfg.layers), stage == pp - 1)
        self.stage, self.pp = stage, pp

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:  # type: ignore[override]
        if self.stage > 0:
            buf = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            dist.recv(buf, src=self.stage - 1)
            x = buf
        y = super().forward(x)
        if self.stage < self.pp - 1:
            dist.send(y, dst=self.stage + 1)
            return None
        return y


def _config(ctx: BuildContext) -> LlamaConfig:
    heads, kv_heads = ctx.knob("heads", 8), ctx.knob("kv_heads", 4)
    return LlamaConfig(
        vocab=ctx.knob("vocab", 256),
        hidden=ctx.knob("hidden", 64),
        layers=ctx.knob("layers", 4),
        heads=heads,
        kv_heads=kv_heads,
        ffn=ctx.knob("ffn", 128),
        seq=ctx.knob("seq", 16),
        batch=ctx.knob("batch", 2),
        fused=ctx.knob("fused", True),
    )


def _plan(cfg: LlamaConfig, tp: int) -> dict[str, object]:
    if cfg.heads % tp or cfg.kv_heads % tp:
        raise ValueError(f"heads {cfg.heads} and KV heads {cfg.kv_heads} must divide over tp {tp} (the decoder pipeline has no padded or replicated-KV layout)")
    return {"norm": "replicate", **llama_plan(cfg, tp)}


def decoder_pipeline(ctx: BuildContext) -> Pipeline:
    cfg = _config(ctx)
    pp = ctx.knob("pp", 2)
    plan = _plan(cfg, ctx.tp)
    return Pipeline(
        baseline=DecoderStack(cfg, Parallel(), list(range(cfg.layers)), True),
        stage=lambda k: Stage(cfg, Parallel(ctx.tp, None, ctx.groups), k, pp),
        stages=pp,
        inputs=[Input("x", (cfg.seq, cfg.batch, cfg.hidden))],
        plan=plan,
    )


def decoder_tp(ctx: BuildContext) -> Model:
    """The same decoder stack tensor-parallel without a pipeline: the reference time of the
    pipeline row."""
    cfg = _config(ctx)
    plan = _plan(cfg, ctx.tp)
    return Model(
        baseline=DecoderStack(cfg, Parallel(), list(range(cfg.layers)), True),
        distributed=lambda rank: DecoderStack(cfg, Parallel(ctx.tp, rank, ctx.groups), list(range(cfg.layers)), True),
        inputs=[Input("x", (cfg.seq, cfg.batch, cfg.hidden))],
        plan=plan,
    )
