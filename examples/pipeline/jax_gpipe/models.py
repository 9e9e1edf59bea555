"""A GPipe pipeline in JAX: shard_map over a stage axis, activations passed with ppermute.

The layers' weights are stacked ``(stages, layers_per_stage, hidden, hidden)`` and split over
the ``pp`` mesh axis, so each device holds its stage's layers. Every tick each stage runs its
layers on what it holds (stage 0 takes the next microbatch), then ``ppermute`` hands the result
to the next stage; the last stage keeps microbatch ``t - (stages - 1)`` at tick ``t``. After
``M + stages - 1`` ticks the last stage's outputs are shared with a masked ``psum`` over ``pp``.
This is the loop of JAX's pipelining write-ups (and praxis' LayerwiseShardablePipelined),
written with ``jax.lax`` only.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel
from shardproof.engine.frontend.pipeline.jaxsplit import JaxPipeline


def block(x: Any, w: Any) -> Any:
    return x + jnp.tanh(x @ w)


def gpipe(ctx: JaxContext) -> JaxModel:
    stages, per, hidden = ctx.knob("pp", 4), ctx.knob("layers_per_stage", 1), ctx.knob("hidden", 16)
    m, batch = ctx.knob("microbatches", 4), ctx.knob("batch", 8)
    mesh = ctx.mesh({"pp": stages})
    bug = ctx.variant

    def base(x: Any, w: Any) -> Any:
        for s in range(stages):
            for j in range(per):
                x = block(x, w[s, j])
        return x

    def per_device(x: Any, w: Any) -> Any:
        stage = jax.lax.axis_index("pp")
        size = batch // m
        state = jnp.zeros((size, hidden), x.dtype)
        outputs = []
        forward = [(i, i + 1) for i in range(stages - 1)]
        if bug == "wrong_peer":
            forward = [(i, (i + 2) % stages) for i in range(stages)]  # BUG-SITE: wrong_peer (each stage hands its activation two stages on)
        for t in range(m + stages - 1):
            fresh = x[t * size : (t + 1) * size] if t < m else jnp.zeros_like(state)
            h = jnp.where(stage == 0, fresh, state)
            for j in range(per):
                h = block(h, w[0, j])
            if t >= stages - 1:
                outputs.append(h)
            state = jax.lax.ppermute(h, "pp", forward)
        out = jnp.concatenate(outputs)
        last = stages - 1
        if bug == "first_stage_output":
            last = 0  # BUG-SITE: first_stage_output (the outputs are taken from stage 0, not the last stage)
        return jax.lax.psum(jnp.where(stage == last, out, jnp.zeros_like(out)), "pp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P("pp")), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (batch, hidden)), JaxInput("w", (stages, per, hidden, hidden), spec=("pp", None, None, None))],
                    description=f"GPipe over {stages} stages, {m} microbatches, ppermute between stages")


def gpipe_per_rank(ctx: JaxContext) -> JaxPipeline:
    """The same pipeline, checked per rank: the shard_map is split over ``pp`` and the ranks
    composed along the ppermutes (engine/frontend/pipeline/jaxsplit.py)."""
    return JaxPipeline(gpipe(ctx), axis="pp")


def gpipe_tp(ctx: JaxContext) -> JaxPipeline:
    """PP x TP: each stage's MLP block column/row-parallel over ``tp`` (``psum`` after the down
    projection), the stages a GPipe over ``pp`` as above; split per stage, the ``tp`` collectives
    stay SPMD."""
    stages, tp, hidden, ffn = ctx.knob("pp", 2), ctx.knob("tp", 2), ctx.knob("hidden", 16), ctx.knob("ffn", 32)
    m, batch = ctx.knob("microbatches", 2), ctx.knob("batch", 8)
    mesh = ctx.mesh({"pp": stages, "tp": tp})
    bug = ctx.variant

    def mlp(x: Any, up: Any, down: Any) -> Any:
        return x + jnp.tanh(x @ up) @ down

    def base(x: Any, up: Any, down: Any) -> Any:
        for s in range(stages):
            x = mlp(x, up[s], down[s])
        return x

    def per_device(x: Any, up: Any, down: Any) -> Any:
        stage = jax.lax.axis_index("pp")
        size = batch // m
        state = jnp.zeros((size, hidden), x.dtype)
        outputs = []
        for t in range(m + stages - 1):
            fresh = x[t * size : (t + 1) * size] if t < m else jnp.zeros_like(state)
            h = jnp.where(stage == 0, fresh, state)
            y = jnp.tanh(h @ up[0]) @ down[0]
            if bug != "tp_missing_psum":
                y = jax.lax.psum(y, "tp")  # BUG-SITE: tp_missing_psum (dropped)
            h = h + y
            if t >= stages - 1:
                outputs.append(h)
            state = jax.lax.ppermute(h, "pp", [(i, i + 1) for i in range(stages - 1)])
        out = jnp.concatenate(outputs)
        return jax.lax.psum(jnp.where(stage == stages - 1, out, jnp.zeros_like(out)), "pp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P("pp", None, "tp"), P("pp", "tp", None)), out_specs=P(), check_vma=False)
    inputs = [JaxInput("x", (batch, hidden)), JaxInput("up", (stages, hidden, ffn), spec=("pp", None, "tp")), JaxInput("down", (stages, ffn, hidden), spec=("pp", "tp", None))]
    return JaxPipeline(JaxModel(base, dist, mesh, inputs, description=f"GPipe PP {stages} x TP {tp}, {m} microbatches"), axis="pp")
