"""JAX test models: each correct model and its bug variants, declared for the JAX front end.

Every entry returns the single-device function, the distributed one (``shard_map`` written per
device, or a plain function split by XLA's SPMD partitioner), the mesh and the input specs;
the relations come from the specs. A bug variant differs from the correct model only on the
line marked ``# BUG-SITE: <variant>``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel


def mlp(x: Any, w1: Any, w2: Any) -> Any:
    return jax.nn.gelu(x @ w1) @ w2


def tp_mlp(ctx: JaxContext) -> JaxModel:
    """Megatron-style MLP: column-parallel up projection, row-parallel down projection, psum."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 64), ctx.knob("ffn", 256), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        y = jax.nn.gelu(x @ w1) @ w2
        if bug == "missing_psum":
            return y  # BUG-SITE: missing_psum
        y = jax.lax.psum(y, "tp")
        if bug == "duplicated_psum":
            y = jax.lax.psum(y, "tp")  # BUG-SITE: duplicated_psum
        return y

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    description=f"Megatron MLP (gelu), TP {c}, shard_map")


def gspmd_mlp(ctx: JaxContext) -> JaxModel:
    """The same MLP, written once and split by XLA's SPMD partitioner from the shardings."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 64), ctx.knob("ffn", 256), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def model(x: Any, w1: Any, w2: Any) -> Any:
        y = jax.nn.gelu(x @ w1) @ w2
        if bug == "loss_scaled_by_tp":
            y = y * c  # BUG-SITE: loss_scaled_by_tp
        return y

    return JaxModel(mlp, model, mesh, [JaxInput("x", (b, d)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    gspmd=True, description=f"Megatron MLP through GSPMD shardings (jit in_shardings/out_shardings), TP {c}")


def attention(x: Any, wq: Any, wk: Any, wv: Any, wo: Any, heads: int, hd: int, low: bool = False) -> Any:
    s = x.shape[0]
    q = (x @ wq).reshape(s, heads, hd)
    k = (x @ wk).reshape(s, heads, hd)
    v = (x @ wv).reshape(s, heads, hd)
    scores = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
    if low:
        scores = scores.astype(jnp.bfloat16).astype(jnp.float32)  # BUG-SITE: softmax_precision
    p = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("hqk,khd->qhd", p, v).reshape(s, heads * hd)
    return o @ wo


def tp_attention(ctx: JaxContext) -> JaxModel:
    """Multi-head attention with the heads sharded: q/k/v column-parallel, out row-parallel."""
    s, d, h, c = ctx.knob("seq", 8), ctx.knob("hidden", 64), ctx.knob("heads", 8), ctx.knob("tp", 4)
    hd = d // h
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
        return attention(x, wq, wk, wv, wo, h, hd)

    def per_device(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
        return jax.lax.psum(attention(x, wq, wk, wv, wo, h // c, hd, low=bug == "softmax_precision"), "tp")

    col = (None, "tp")
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(*col), P(*col), P(*col), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (s, d)), JaxInput("wq", (d, d), spec=col), JaxInput("wk", (d, d), spec=col),
                                       JaxInput("wv", (d, d), spec=col), JaxInput("wo", (d, d), spec=("tp", None))],
                    description=f"attention, {h} heads sharded over TP {c}")


def vocab_embedding(ctx: JaxContext) -> JaxModel:
    """Vocab-parallel embedding: each rank owns rows [r·w, (r+1)·w) of the table (axis_index),
    masks the ids outside them, and the psum adds the one rank that owns each id."""
    s, d, v, c = ctx.knob("seq", 8), ctx.knob("hidden", 64), ctx.knob("vocab", 256), ctx.knob("tp", 4)
    w = v // c
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(ids: Any, table: Any) -> Any:
        return jnp.take(table, ids, axis=0, mode="clip")

    def per_device(ids: Any, table: Any) -> Any:
        r = jax.lax.axis_index("tp")
        lo = ((r + 1) % c if bug == "wrong_offset" else r) * w  # BUG-SITE: wrong_offset
        local = ids - lo
        outside = (local < 0) | (local >= w)
        rows = jnp.take(table, jnp.where(outside, 0, local), axis=0, mode="clip")
        return jax.lax.psum(jnp.where(outside[:, None], 0.0, rows), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("ids", (s,), "int32", int_range=(0, v)), JaxInput("table", (v, d), spec=("tp", None))],
                    description=f"vocab-parallel embedding via axis_index, vocab {v} over TP {c}")


def sequence_parallel(ctx: JaxContext) -> JaxModel:
    """Sequence parallelism: the activations sharded along the sequence; all_gather before the
    column-parallel projection, psum_scatter after the row-parallel one."""
    s, d, f, c = ctx.knob("seq", 16), ctx.knob("hidden", 64), ctx.knob("ffn", 256), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        full = jax.lax.all_gather(x, "tp", axis=1 if bug == "wrong_gather_dim" else 0, tiled=True)  # BUG-SITE: wrong_gather_dim
        full = full.reshape(s, d)  # the gathered rows, whichever dim they were gathered along
        y = jax.nn.gelu(full @ w1) @ w2
        return jax.lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None), P(None, "tp"), P("tp", None)), out_specs=P("tp", None), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (s, d), spec=("tp", None)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    outputs=[("tp", None)], description=f"sequence-parallel MLP (all_gather / psum_scatter), TP {c}")


def dp_tp_mlp(ctx: JaxContext) -> JaxModel:
    """DP x TP on a 2-D mesh: the batch split over 'dp', the MLP over 'tp'; the rank groups are
    the 'tp' rows of the mesh."""
    b, d, f = ctx.knob("batch", 8), ctx.knob("hidden", 64), ctx.knob("ffn", 256)
    mesh = ctx.mesh({"dp": 2, "tp": 2})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "dp" if bug == "wrong_axis" else "tp")  # BUG-SITE: wrong_axis

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (b, d), spec=("dp", None)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    outputs=[("dp", None)], group_axes=("tp",), description="DP 2 x TP 2 MLP on a 2-D mesh")


def ulysses(ctx: JaxContext) -> JaxModel:
    """Ulysses sequence parallelism: all_to_all from sequence-sharded to head-sharded q/k/v,
    full-sequence attention per head, all_to_all back."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 8), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        def to_heads(t: Any) -> Any:
            return jax.lax.all_to_all(t, "sp", split_axis=1, concat_axis=0, tiled=True)

        o = attn(to_heads(q), to_heads(k), to_heads(v))
        return jax.lax.all_to_all(o, "sp", split_axis=0, concat_axis=2 if bug == "wrong_concat_axis" else 1, tiled=True).reshape(s // c, h, hd)  # BUG-SITE: wrong_concat_axis

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"Ulysses all-to-all attention, SP {c}")


def ring_sum(ctx: JaxContext) -> JaxModel:
    """A ring all-reduce written with ppermute: c-1 steps pass the running block to the next
    rank; every rank ends with the sum of all ranks' partial sums."""
    n, d, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def per_device(x: Any) -> Any:
        part = x.sum(axis=0)
        acc, msg = part, part
        for _ in range(c - (2 if bug == "ring_short" else 1)):  # BUG-SITE: ring_short
            msg = jax.lax.ppermute(msg, "tp", [(i, (i + 1) % c) for i in range(c)])
            acc = acc + msg
        return acc

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (n, d), spec=("tp", None))], description=f"ring all-reduce with ppermute, {c} ranks")


def scan_layers(ctx: JaxContext) -> JaxModel:
    """A stack of TP MLP blocks as lax.scan over stacked weights (how JAX model code stacks its
    layers)."""
    b, d, f, n, c = ctx.knob("batch", 8), ctx.knob("hidden", 64), ctx.knob("ffn", 256), ctx.knob("layers", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any, w1s: Any, w2s: Any) -> Any:
        return jax.lax.scan(lambda h, w: (h + jnp.tanh(mlp(h, w[0], w[1])), None), x, (w1s, w2s))[0]

    def per_device(x: Any, w1s: Any, w2s: Any) -> Any:
        def block(h: Any, w: Any) -> Any:
            y = jax.nn.gelu(h @ w[0]) @ w[1]
            if bug != "scan_missing_psum":
                y = jax.lax.psum(y, "tp")  # BUG-SITE: scan_missing_psum
            return h + jnp.tanh(y), None

        return jax.lax.scan(block, x, (w1s, w2s))[0]

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, None, "tp"), P(None, "tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w1s", (n, d, f), spec=(None, None, "tp")), JaxInput("w2s", (n, f, d), spec=(None, "tp", None))],
                    description=f"{n}-layer lax.scan of TP MLP blocks, TP {c}")


def vocab_cross_entropy(ctx: JaxContext) -> JaxModel:
    """Vocab-parallel cross-entropy (Megatron): the logits stay sharded over the vocabulary; the
    max and the sum of exponentials are reduced over the ranks, and the target's logit comes
    from the one rank whose vocab slice holds it (axis_index)."""
    s, v, c = ctx.knob("seq", 8), ctx.knob("vocab", 256), ctx.knob("tp", 4)
    w = v // c
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(logits: Any, target: Any) -> Any:
        m = logits.max(axis=-1, keepdims=True)
        lse = jnp.log(jnp.exp(logits - m).sum(axis=-1)) + m[:, 0]
        picked = jnp.take_along_axis(logits, target[:, None], axis=-1, mode="clip")[:, 0]
        return lse - picked

    def per_device(logits: Any, target: Any) -> Any:
        m = jax.lax.pmax(logits.max(axis=-1, keepdims=True), "tp")
        total = jnp.exp(logits - m).sum(axis=-1)
        if bug != "ce_missing_psum":
            total = jax.lax.psum(total, "tp")  # BUG-SITE: ce_missing_psum
        lse = jnp.log(total) + m[:, 0]
        local = target - jax.lax.axis_index("tp") * w
        if bug == "ce_offset_next_shard":
            local = target - (jax.lax.axis_index("tp") + 1) * w  # BUG-SITE: ce_offset_next_shard
        mine = (local >= 0) & (local < w)
        picked = jnp.take_along_axis(logits, jnp.where(mine, local, 0)[:, None], axis=-1, mode="clip")[:, 0]
        return lse - jax.lax.psum(jnp.where(mine, picked, 0.0), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("logits", (s, v), spec=(None, "tp")), JaxInput("target", (s,), "int32", int_range=(0, v))],
                    description=f"vocab-parallel cross-entropy via axis_index, vocab {v} over TP {c}")
