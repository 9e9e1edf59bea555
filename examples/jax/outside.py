"""JAX programs in the spellings of codebases other than this one (issue 25, an outside user's
corpus): MaxText-style decoder pieces under logical axis rules, praxis-style einsum sharding,
flax nnx, shard_map collectives in their other spellings (``psum_scatter``, untiled
``all_gather``, ``all_to_all`` on inner axes, ``pmean``, ``pmax``), 2-D meshes with collectives
over one axis, ``lax.scan`` over layers, GShard-style top-2 MoE dispatch through one-hot
einsums, vocab-parallel cross entropy with ``log_softmax`` + ``take_along_axis``, and rotary
embeddings whose positions come from ``axis_index`` under sequence parallelism.

Each correct model is written the way such code writes it; a bug twin differs only on the line
marked ``# BUG-SITE: <variant>``.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax import shard_map
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel

# MaxText-like logical axis rules: activations and weights carry logical names, the rules map
# them onto a ('data', 'model') mesh.
MT_RULES = (
    ("activation_batch", "data"), ("activation_length", None), ("activation_embed", None),
    ("activation_mlp", "model"), ("activation_heads", "model"), ("activation_kv", None),
    ("embed", None), ("mlp", "model"), ("heads", "model"), ("kv", None), ("vocab", "model"),
)
INIT = nn.initializers.lecun_normal()


def _f32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


class MtMlp(nn.Module):
    """A MaxText-style gated MLP: wi_0 / wi_1 (embed x mlp), silu gate, wo (mlp x embed), the
    hidden activation constrained to ('activation_batch', 'activation_length', 'activation_mlp')."""

    ffn: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        def dense(n: int, axes: tuple[str, str], name: str, y: Any) -> Any:
            return nn.DenseGeneral(n, use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, axes), name=name)(y)

        gate = nn.silu(dense(self.ffn, ("embed", "mlp"), "wi_0", x))
        up = dense(self.ffn, ("embed", "mlp"), "wi_1", x)
        h = nn.with_logical_constraint(gate * up, ("activation_batch", "activation_length", "activation_mlp"))
        out = dense(x.shape[-1], ("mlp", "embed"), "wo", h)
        return nn.with_logical_constraint(out, ("activation_batch", "activation_length", "activation_embed"))


def maxtext_mlp(ctx: JaxContext) -> JaxModel:
    """MaxText's gated MLP block, DP 2 x TP 2 under GSPMD (jit + logical constraints)."""
    b, s, d, f = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 64)
    mesh = ctx.mesh({"data": 2, "model": 2})
    module = MtMlp(f)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, d))
    x = JaxInput("x", (b, s, d), spec=("activation_batch", None, None))
    bug = ctx.variant

    def dist(v: Any, xs: Any) -> Any:
        y = module.apply(v, xs)
        if bug == "mt_mlp_doubled":
            y = y + jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", None, None)))  # BUG-SITE: mt_mlp_doubled
        return y

    return JaxModel(module.apply, dist, mesh, [variables, x], outputs=[("activation_batch", None, None)], rules=MT_RULES, group_axes=("model",), gspmd=True,
                    description="MaxText-style gated MLP (logical constraints), DP 2 x TP 2, GSPMD")


class MtAttention(nn.Module):
    """MaxText-style attention: kernels declared with their logical axes as MaxText's own
    DenseGeneral does (``self.param`` of shape (embed, heads, kv), contracted by einsum), the
    projections constrained to ('activation_batch', 'activation_length', 'activation_heads',
    'activation_kv'), the out kernel (heads, kv, embed) contracting both."""

    heads: int
    head_dim: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        d = x.shape[-1]

        def proj(name: str) -> Any:
            w = self.param(name, nn.with_logical_partitioning(INIT, ("embed", "heads", "kv")), (d, self.heads, self.head_dim))
            y = jnp.einsum("btd,dnh->btnh", x, w)
            return nn.with_logical_constraint(y, ("activation_batch", "activation_length", "activation_heads", "activation_kv"))

        q, k, v = proj("query"), proj("key"), proj("value")
        scores = jnp.einsum("btnh,bsnh->bnts", q / math.sqrt(self.head_dim), k)
        p = jax.nn.softmax(scores.astype(jnp.float32), axis=-1)
        o = jnp.einsum("bnts,bsnh->btnh", p, v)
        wo = self.param("out", nn.with_logical_partitioning(INIT, ("heads", "kv", "embed")), (self.heads, self.head_dim, d))
        return jnp.einsum("btnh,nhd->btd", o, wo)


def maxtext_attention(ctx: JaxContext) -> JaxModel:
    """MaxText-style attention, heads over 'model' (TP 4), GSPMD."""
    b, s, h, hd = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 4), ctx.knob("head_dim", 8)
    mesh = ctx.mesh({"data": 1, "model": 4})
    module = MtAttention(h, hd)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, h * hd))
    x = JaxInput("x", (b, s, h * hd), spec=("activation_batch", None, None))
    return JaxModel(module.apply, module.apply, mesh, [variables, x], rules=MT_RULES, group_axes=("model",), gspmd=True,
                    description="MaxText-style attention (DenseGeneral to heads x kv), TP 4, GSPMD")


def praxis_ffn(ctx: JaxContext) -> JaxModel:
    """A praxis/paxml-style feed-forward: einsums with explicit weight and activation shardings
    (``with_sharding_constraint`` on the 'BTD' / 'BTF' activations), weights 'DF' split on F."""
    b, t, d, f = ctx.knob("batch", 4), ctx.knob("seq", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64)
    mesh = ctx.mesh({"data": 2, "model": 2})
    bug = ctx.variant

    def ffn(x: Any, w_in: Any, w_out: Any) -> Any:
        h = jax.nn.relu(jnp.einsum("btd,df->btf", x, w_in))
        return jnp.einsum("btf,fd->btd", h, w_out)

    def dist(x: Any, w_in: Any, w_out: Any) -> Any:
        h = jnp.einsum("btd,df->btf", x, w_in)
        h = jax.lax.with_sharding_constraint(jax.nn.relu(h), NamedSharding(mesh, P("data", None, "model")))
        y = jnp.einsum("btf,fd->btd", h, w_out)
        if bug == "praxis_relu_after":
            y = jax.nn.relu(y)  # BUG-SITE: praxis_relu_after
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("data", None, None)))

    return JaxModel(ffn, dist, mesh, [JaxInput("x", (b, t, d), spec=("data", None, None)), JaxInput("w_in", (d, f), spec=(None, "model")),
                                      JaxInput("w_out", (f, d), spec=("model", None))],
                    outputs=[("data", None, None)], group_axes=("model",), gspmd=True, description="praxis-style einsum FFN, DP 2 x TP 2, GSPMD")


class NnxAttention(nnx.Module):
    """flax nnx attention with nnx.with_partitioning on the projections (heads over 'model')."""

    def __init__(self, d: int, heads: int, hd: int, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        self.heads, self.hd = heads, hd
        self.qkv = nnx.Linear(d, 3 * heads * hd, use_bias=False, kernel_init=nnx.with_partitioning(init, ("embed", "heads")), rngs=rngs)
        self.out = nnx.Linear(heads * hd, d, use_bias=False, kernel_init=nnx.with_partitioning(init, ("heads", "embed")), rngs=rngs)

    def __call__(self, x: Any) -> Any:
        b, s, _ = x.shape
        qkv = self.qkv(x).reshape(b, s, self.heads, 3, self.hd)  # interleaved per head: shardable by heads
        q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]
        p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.hd), axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, -1))


def _call(model: Any, x: Any) -> Any:
    return model(x)


def nnx_attention(ctx: JaxContext) -> JaxModel:
    """An nnx attention (fused qkv interleaved per head), TP 4, GSPMD."""
    b, s, h, hd = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 4), ctx.knob("head_dim", 8)
    mesh = ctx.mesh({"data": 1, "model": 4})
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: NnxAttention(h * hd, h, hd, nnx.Rngs(0)))
    x = JaxInput("x", (b, s, h * hd), spec=("batch", None, None))
    return JaxModel(_call, _call, mesh, [model, x], rules=(("batch", "data"), ("heads", "model"), ("embed", None)), group_axes=("model",), gspmd=True,
                    description="flax nnx attention, qkv fused per head, TP 4, GSPMD")


def _mlp(x: Any, w1: Any, w2: Any) -> Any:
    return jax.nn.gelu(x @ w1) @ w2


def sp_mlp_untiled(ctx: JaxContext) -> JaxModel:
    """Sequence parallelism on a [batch, seq, hidden] activation: untiled ``all_gather(axis=1)``
    (a new axis, merged by a reshape), the MLP, ``psum_scatter(scatter_dimension=1, tiled=True)``."""
    b, s, d, f, c = ctx.knob("batch", 2), ctx.knob("seq", 16), ctx.knob("hidden", 16), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        full = jax.lax.all_gather(x, "tp", axis=1)  # [b, c, s/c, d]
        full = full.reshape(b, s, d)
        y = jax.nn.gelu(full @ w1) @ w2
        return jax.lax.psum_scatter(y, "tp", scatter_dimension=2 if bug == "scatter_hidden" else 1, tiled=True).reshape(b, s // c, d)  # BUG-SITE: scatter_hidden

    spec = (None, "tp", None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec), P(None, "tp"), P("tp", None)), out_specs=P(*spec), check_vma=False)
    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (b, s, d), spec=spec), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    outputs=[spec], description=f"SP MLP, untiled all_gather(axis=1) + psum_scatter(dim 1), TP {c}")


def a2a_seq_to_heads(ctx: JaxContext) -> JaxModel:
    """Ulysses on [batch, seq, heads, hd]: ``all_to_all(split_axis=2, concat_axis=1, tiled=True)``
    to heads-sharded, attention, and the inverse all-to-all back to sequence-sharded."""
    b, s, h, hd, c = ctx.knob("batch", 2), ctx.knob("seq", 16), ctx.knob("heads", 8), ctx.knob("head_dim", 4), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd), axis=-1)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        def to_heads(t: Any) -> Any:
            return jax.lax.all_to_all(t, "sp", split_axis=2, concat_axis=1, tiled=True)

        o = attn(to_heads(q), to_heads(k), to_heads(v))
        return jax.lax.all_to_all(o, "sp", split_axis=1, concat_axis=3 if bug == "a2a_back_axis" else 2, tiled=True).reshape(b, s // c, h, hd)  # BUG-SITE: a2a_back_axis

    spec = (None, "sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (b, s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"Ulysses on [b, s, h, d], all_to_all(split 2, concat 1), SP {c}")


def dp_pmean_grads(ctx: JaxContext) -> JaxModel:
    """Data parallelism as every JAX trainer writes it in shard_map: each rank's loss and
    gradients on its batch shard, averaged over 'data' with ``lax.pmean``."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"data": c})
    bug = ctx.variant

    def loss(w1: Any, w2: Any, x: Any, y: Any) -> Any:
        return jnp.mean((_mlp(x, w1, w2) - y) ** 2)

    def step(w1: Any, w2: Any, x: Any, y: Any) -> Any:
        return jax.value_and_grad(loss, argnums=(0, 1))(w1, w2, x, y)

    def per_device(w1: Any, w2: Any, x: Any, y: Any) -> Any:
        value, grads = step(w1, w2, x, y)
        grads = jax.lax.psum(grads, "data") if bug == "grads_psum_not_pmean" else jax.lax.pmean(grads, "data")  # BUG-SITE: grads_psum_not_pmean
        return jax.lax.pmean(value, "data"), grads

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P("data"), P("data")), out_specs=(P(), (P(), P())), check_vma=False)
    return JaxModel(step, dist, mesh, [JaxInput("w1", (d, f)), JaxInput("w2", (f, d)), JaxInput("x", (b, d), spec=("data", None)), JaxInput("y", (b, d), spec=("data", None))],
                    outputs=[(), (), ()], description=f"data parallel loss and gradients, pmean over data {c}")


def vocab_softmax_pmax(ctx: JaxContext) -> JaxModel:
    """A vocab-sharded softmax over logits [tokens, vocab]: the global max by ``lax.pmax`` (softmax
    stabilisation), the denominator by psum; the probabilities stay vocab-sharded."""
    t, d, v, c = ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"model": c})
    bug = ctx.variant

    def base(x: Any, w: Any) -> Any:
        return jax.nn.softmax(x @ w, axis=-1)

    def per_device(x: Any, w: Any) -> Any:
        logits = x @ w
        m = jax.lax.stop_gradient(jax.lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "model"))
        e = jnp.exp(logits - m)
        den = jnp.sum(e, axis=-1, keepdims=True)
        return e / (den if bug == "softmax_local_den" else jax.lax.psum(den, "model"))  # BUG-SITE: softmax_local_den

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "model")), out_specs=P(None, "model"), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (t, d)), JaxInput("w", (d, v), spec=(None, "model"))], outputs=[(None, "model")],
                    description=f"vocab-sharded softmax, pmax + psum, TP {c}")


def scan_layers_2d(ctx: JaxContext) -> JaxModel:
    """``lax.scan`` over stacked layer weights on a ('data', 'model') mesh in shard_map: the batch
    over 'data', each layer's attention-free block (RMSNorm, TP MLP) psum'd over 'model'."""
    b, d, f, n = ctx.knob("batch", 4), ctx.knob("hidden", 16), ctx.knob("ffn", 64), ctx.knob("layers", 4)
    mesh = ctx.mesh({"data": 2, "model": 2})
    bug = ctx.variant

    def norm(h: Any, g: Any) -> Any:
        return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * g

    def base(x: Any, g: Any, w1: Any, w2: Any) -> Any:
        def layer(h: Any, p: Any) -> Any:
            return h + _mlp(norm(h, p[0]), p[1], p[2]), None
        return jax.lax.scan(layer, x, (g, w1, w2))[0]

    def per_device(x: Any, g: Any, w1: Any, w2: Any) -> Any:
        def layer(h: Any, p: Any) -> Any:
            y = _mlp(norm(h, p[0]), p[1], p[2])
            return h + jax.lax.psum(y, "data" if bug == "scan_psum_data" else "model"), None  # BUG-SITE: scan_psum_data
        return jax.lax.scan(layer, x, (g, w1, w2))[0]

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("data"), P(), P(None, None, "model"), P(None, "model", None)), out_specs=P("data"), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (b, d), spec=("data", None)), JaxInput("g", (n, d)), JaxInput("w1", (n, d, f), spec=(None, None, "model")),
                                       JaxInput("w2", (n, f, d), spec=(None, "model", None))],
                    outputs=[("data", None)], group_axes=("model",), description=f"lax.scan over {n} layers, DP 2 x TP 2, shard_map")


def _top2_combine(gates: Any, idx1: Any, capacity: int) -> Any:
    """GShard top-2 gating on one group of tokens: from the gates [S, E] and each token's first
    expert idx1 [S], the combine tensor [S, E, C] (gate weight at the token's slot in its
    expert's buffer) from one-hot masks and cumsum positions."""
    e = gates.shape[1]
    mask1 = jax.nn.one_hot(idx1, e, dtype=jnp.int32)
    idx2 = jnp.argmax(gates * (1 - mask1), axis=-1)
    mask2 = jax.nn.one_hot(idx2, e, dtype=jnp.int32)
    pos1 = jnp.cumsum(mask1, axis=0) - 1
    pos2 = jnp.cumsum(mask2, axis=0) - 1 + jnp.sum(mask1, axis=0, keepdims=True)
    mask1 = mask1 * (pos1 < capacity)
    mask2 = mask2 * (pos2 < capacity)
    g1 = jnp.sum(gates * mask1, axis=-1)
    g2 = jnp.sum(gates * mask2, axis=-1)
    slot1 = jax.nn.one_hot(jnp.sum(pos1 * mask1, axis=-1), capacity)
    slot2 = jax.nn.one_hot(jnp.sum(pos2 * mask2, axis=-1), capacity)
    return g1[:, None, None] * mask1[:, :, None] * slot1[:, None, :] + g2[:, None, None] * mask2[:, :, None] * slot2[:, None, :]


def gshard_moe(ctx: JaxContext) -> JaxModel:
    """GShard/Switch-style top-2 MoE, expert parallel: tokens in G groups (one per rank), each
    group's combine tensor from one-hot einsums, ``all_to_all`` from groups to experts and back."""
    g, s, d, e, f, c = ctx.knob("groups", 4), ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("experts", 4), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    cap = ctx.knob("capacity", 4)
    mesh = ctx.mesh({"expert": c})
    bug = ctx.variant

    def experts(xe: Any, w1: Any, w2: Any) -> Any:  # [E, G, C, D]
        return jnp.einsum("egcf,efd->egcd", jax.nn.relu(jnp.einsum("egcd,edf->egcf", xe, w1)), w2)

    def moe(x: Any, wg: Any, w1: Any, w2: Any) -> Any:  # x [G, S, D]
        gates = jax.nn.softmax(x @ wg, axis=-1)  # [G, S, E]
        combine = jax.vmap(lambda g, i: _top2_combine(g, i, cap))(gates, jnp.argmax(gates, axis=-1))  # [G, S, E, C]
        dispatch = (combine > 0).astype(x.dtype)
        xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)
        return jnp.einsum("gsec,egcd->gsd", combine, experts(xe, w1, w2))

    def per_device(x: Any, wg: Any, w1: Any, w2: Any) -> Any:  # x [G/c, S, D], w [E/c, ...]
        gates = jax.nn.softmax(x @ wg, axis=-1)
        idx1 = (jnp.argmin if bug == "top1_argmin" else jnp.argmax)(gates, axis=-1)  # BUG-SITE: top1_argmin
        combine = jax.vmap(lambda g, i: _top2_combine(g, i, cap))(gates, idx1)
        dispatch = (combine > 0).astype(x.dtype)
        xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)  # [E, G/c, C, D]
        xe = jax.lax.all_to_all(xe, "expert", split_axis=0, concat_axis=1, tiled=True)  # [E/c, G, C, D]
        ye = experts(xe, w1, w2)
        ye = jax.lax.all_to_all(ye, "expert", split_axis=1, concat_axis=0, tiled=True)  # [E, G/c, C, D]
        return jnp.einsum("gsec,egcd->gsd", (dispatch if bug == "combine_by_dispatch" else combine), ye)  # BUG-SITE: combine_by_dispatch

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("expert"), P(), P("expert"), P("expert")), out_specs=P("expert"), check_vma=False)
    return JaxModel(moe, dist, mesh, [JaxInput("x", (g, s, d), spec=("expert", None, None)), JaxInput("wg", (d, e)),
                                      JaxInput("w1", (e, d, f), spec=("expert", None, None)), JaxInput("w2", (e, f, d), spec=("expert", None, None))],
                    outputs=[("expert", None, None)], description=f"GShard top-2 MoE, one-hot einsum dispatch, all_to_all, EP {c}")


def gspmd_vocab_xent(ctx: JaxContext) -> JaxModel:
    """Vocab-parallel cross entropy as JAX model code writes it under GSPMD: the LM head's vocab
    sharded over 'model', ``jax.nn.log_softmax`` then ``jnp.take_along_axis`` at the labels."""
    b, s, d, v = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def xent(x: Any, w: Any, labels: Any) -> Any:
        logp = jax.nn.log_softmax(x @ w, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    def dist(x: Any, w: Any, labels: Any) -> Any:
        logits = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data", None, "model")))
        logp = jax.nn.log_softmax(logits, axis=-1)
        if bug == "xent_labels_shifted":
            labels = (labels + 1) % v  # BUG-SITE: xent_labels_shifted
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))

    return JaxModel(xent, dist, mesh, [JaxInput("x", (b, s, d), spec=("data", None, None)), JaxInput("w", (d, v), spec=(None, "model")),
                                       JaxInput("labels", (b, s), "int32", spec=("data", None), int_range=(0, v))],
                    group_axes=("model",), gspmd=True, description="log_softmax + take_along_axis cross entropy, vocab over TP 4, GSPMD")


def shard_map_vocab_xent(ctx: JaxContext) -> JaxModel:
    """The same loss in shard_map: log-softmax of the local vocab block against the global
    log-sum-exp (pmax + psum), the label's logit picked by take_along_axis on the rank that owns it."""
    t, d, v, c = ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64), ctx.knob("tp", 4)
    w = v // c
    mesh = ctx.mesh({"model": c})
    bug = ctx.variant

    def xent(x: Any, wv: Any, labels: Any) -> Any:
        logp = jax.nn.log_softmax(x @ wv, axis=-1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]

    def per_device(x: Any, wv: Any, labels: Any) -> Any:
        logits = x @ wv
        # jax.nn.log_softmax's own order, (x - max) - log(sum(exp(x - max))), over the ranks
        shifted = logits - jax.lax.stop_gradient(jax.lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "model"))
        logp = shifted - jnp.log(jax.lax.psum(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True), "model"))
        local = labels - jax.lax.axis_index("model") * w
        mine = (local >= 0) & (local < w)
        idx = jnp.clip(local, 0, w - 1)[:, None]
        picked = jnp.take_along_axis(logp, idx, axis=-1)[:, 0] if bug == "xent_unmasked" else jnp.where(mine, jnp.take_along_axis(logp, idx, axis=-1)[:, 0], 0.0)  # BUG-SITE: xent_unmasked
        return -jax.lax.psum(picked, "model")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "model"), P()), out_specs=P(), check_vma=False)
    return JaxModel(xent, dist, mesh, [JaxInput("x", (t, d)), JaxInput("wv", (d, v), spec=(None, "model")), JaxInput("labels", (t,), "int32", int_range=(0, v))],
                    description=f"vocab-parallel log_softmax + take_along_axis (clip), pmax/psum, TP {c}")


def _rope(x: Any, pos: Any) -> Any:
    """Rotary embedding (half-split form, as in MaxText / llama-jax): x [S, H, D], pos [S]."""
    half = x.shape[-1] // 2
    freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    ang = pos[:, None].astype(jnp.float32) * freq[None, :]
    sin, cos = jnp.sin(ang)[:, None, :], jnp.cos(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def sp_rope(ctx: JaxContext) -> JaxModel:
    """Rotary embeddings under sequence parallelism: each rank's positions are
    ``axis_index * s_local + arange(s_local)``; the rotated q/k stay sequence-sharded."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 2), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def base(q: Any, k: Any) -> Any:
        pos = jnp.arange(s)
        return _rope(q, pos), _rope(k, pos)

    def per_device(q: Any, k: Any) -> Any:
        n = q.shape[0]
        pos = jax.lax.axis_index("sp") * (1 if bug == "rope_rank_offset" else n) + jnp.arange(n)  # BUG-SITE: rope_rank_offset
        return _rope(q, pos), _rope(k, pos)

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec), P(*spec)), out_specs=(P(*spec), P(*spec)), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k")], outputs=[spec, spec],
                    description=f"rotary embedding, positions from axis_index, SP {c}")


# ---- a second batch: losses, embeddings and attention as library code spells them, norms and
# ---- collectives in their other forms, bf16, remat


def optax_xent(ctx: JaxContext) -> JaxModel:
    """``optax.softmax_cross_entropy_with_integer_labels`` on [batch, seq, vocab] logits whose
    vocabulary is sharded over 'model' (the LM head column-parallel), GSPMD."""
    import optax

    b, s, d, v = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def loss(x: Any, w: Any, labels: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(x @ w, labels).mean()

    def dist(x: Any, w: Any, labels: Any) -> Any:
        logits = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data", None, "model")))
        per_token = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return per_token.sum() / (b * s if bug != "xent_mean_over_batch" else b)  # BUG-SITE: xent_mean_over_batch

    return JaxModel(loss, dist, mesh, [JaxInput("x", (b, s, d), spec=("data", None, None)), JaxInput("w", (d, v), spec=(None, "model")),
                                       JaxInput("labels", (b, s), "int32", spec=("data", None), int_range=(0, v))],
                    group_axes=("model",), gspmd=True, description="optax integer-label cross entropy, vocab over TP 4, GSPMD")


def onehot_xent(ctx: JaxContext) -> JaxModel:
    """The one-hot spelling of the loss (flax's examples, ``optax.softmax_cross_entropy``):
    -sum(one_hot(labels, V) * log_softmax(logits)), vocabulary sharded, GSPMD."""
    b, s, d, v = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def loss(x: Any, w: Any, labels: Any) -> Any:
        return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, v) * jax.nn.log_softmax(x @ w, axis=-1), axis=-1))

    def dist(x: Any, w: Any, labels: Any) -> Any:
        logits = jax.lax.with_sharding_constraint(x @ w, NamedSharding(mesh, P("data", None, "model")))
        onehot = jax.nn.one_hot(labels if bug != "onehot_labels_plus1" else labels + 1, v)  # BUG-SITE: onehot_labels_plus1
        return -jnp.mean(jnp.sum(onehot * jax.nn.log_softmax(logits, axis=-1), axis=-1))

    return JaxModel(loss, dist, mesh, [JaxInput("x", (b, s, d), spec=("data", None, None)), JaxInput("w", (d, v), spec=(None, "model")),
                                       JaxInput("labels", (b, s), "int32", spec=("data", None), int_range=(0, v))],
                    group_axes=("model",), gspmd=True, description="one-hot x log_softmax cross entropy, vocab over TP 4, GSPMD")


def embed_2d(ctx: JaxContext) -> JaxModel:
    """MaxText's embedding lookup ``embedding[inputs]`` with [batch, seq] token ids and the table's
    vocabulary sharded over 'model', GSPMD."""
    b, s, v, d = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("vocab", 64), ctx.knob("hidden", 16)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def lookup(table: Any, ids: Any) -> Any:
        return jnp.asarray(table)[ids]

    def dist(table: Any, ids: Any) -> Any:
        out = jnp.asarray(table)[ids]
        if bug == "embed_scaled_twice":
            out = out * 2.0  # BUG-SITE: embed_scaled_twice
        return out

    return JaxModel(lookup, dist, mesh, [JaxInput("table", (v, d), spec=("model", None)), JaxInput("ids", (b, s), "int32", int_range=(0, v))],
                    group_axes=("model",), gspmd=True, description="embedding[ids] with [b, s] ids, vocab over TP 4, GSPMD")


class GqaAttention(nn.Module):
    """Grouped-query attention (MaxText / Llama style): kv heads fewer than q heads, each kv head
    repeated for its group with jnp.repeat, a causal mask from nn.make_causal_mask."""

    heads: int
    kv_heads: int
    head_dim: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        b, s, d = x.shape

        def proj(name: str, n: int) -> Any:
            w = self.param(name, nn.with_logical_partitioning(INIT, ("embed", "heads", "kv")), (d, n, self.head_dim))
            return jnp.einsum("btd,dnh->btnh", x, w)

        q, k, v = proj("query", self.heads), proj("key", self.kv_heads), proj("value", self.kv_heads)
        rep = self.heads // self.kv_heads
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
        scores = jnp.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(self.head_dim)
        mask = nn.make_causal_mask(jnp.ones((b, s), jnp.int32))
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        o = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, axis=-1), v)
        wo = self.param("out", nn.with_logical_partitioning(INIT, ("heads", "kv", "embed")), (self.heads, self.head_dim, d))
        return jnp.einsum("btnh,nhd->btd", o, wo)


def gqa_attention(ctx: JaxContext) -> JaxModel:
    """Causal GQA attention, 8 q heads and 4 kv heads over 'model' (TP 4), GSPMD."""
    b, s, h, kvh, hd = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 8), ctx.knob("kv_heads", 4), ctx.knob("head_dim", 8)
    mesh = ctx.mesh({"data": 1, "model": 4})
    module = GqaAttention(h, kvh, hd)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, h * hd))
    x = JaxInput("x", (b, s, h * hd), spec=("activation_batch", None, None))
    return JaxModel(module.apply, module.apply, mesh, [variables, x], rules=MT_RULES, group_axes=("model",), gspmd=True,
                    description=f"causal GQA attention ({h} q / {kvh} kv heads, jnp.repeat), TP 4, GSPMD")


def dpa_attention(ctx: JaxContext) -> JaxModel:
    """``jax.nn.dot_product_attention(q, k, v, is_causal=True)`` with the heads sharded, GSPMD."""
    b, s, h, hd = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 8), ctx.knob("head_dim", 8)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True)

    def dist(q: Any, k: Any, v: Any) -> Any:
        return jax.nn.dot_product_attention(q, k, v, is_causal=bug != "dpa_not_causal")  # BUG-SITE: dpa_not_causal

    spec = (None, None, "model", None)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (b, s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec], gspmd=True,
                    group_axes=("model",), description="jax.nn.dot_product_attention (causal), heads over TP 4, GSPMD")


def bf16_mlp(ctx: JaxContext) -> JaxModel:
    """The TP MLP in bf16 (params and activations, as mixed-precision JAX code runs it): the
    row-parallel partial sums all-reduced in bf16."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(_mlp(x, w1, w2), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (b, d), "bfloat16"), JaxInput("w1", (d, f), "bfloat16", spec=(None, "tp")),
                                       JaxInput("w2", (f, d), "bfloat16", spec=("tp", None))],
                    description=f"bf16 Megatron MLP, TP {c}, shard_map")


def rmsnorm_hidden_sharded(ctx: JaxContext) -> JaxModel:
    """RMSNorm over a hidden dim sharded across ranks: the sum of squares psum'd, divided by the
    whole width."""
    t, d, c = ctx.knob("tokens", 8), ctx.knob("hidden", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def norm(x: Any, g: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g

    def per_device(x: Any, g: Any) -> Any:
        ss = jax.lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), "tp")
        return x * jax.lax.rsqrt(ss / (d if bug != "rms_local_width" else d // c) + 1e-6) * g  # BUG-SITE: rms_local_width

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(None, "tp"), P("tp")), out_specs=P(None, "tp"), check_vma=False)
    return JaxModel(norm, dist, mesh, [JaxInput("x", (t, d), spec=(None, "tp")), JaxInput("g", (d,), spec=("tp",))], outputs=[(None, "tp")],
                    description=f"RMSNorm with the hidden dim sharded (psum of squares), TP {c}")


def amax_scale(ctx: JaxContext) -> JaxModel:
    """fp8-style scaling: the tensor's global absolute max by ``lax.pmax`` over the shards, the
    shard divided by amax / 448 (the scaled values stay sharded)."""
    t, d, c = ctx.knob("tokens", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def scale(x: Any) -> Any:
        return x / (jnp.max(jnp.abs(x)) / 448.0)

    def per_device(x: Any) -> Any:
        local = jnp.max(jnp.abs(x))
        return x / ((local if bug == "amax_local" else jax.lax.pmax(local, "tp")) / 448.0)  # BUG-SITE: amax_local

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P("tp", None), check_vma=False)
    return JaxModel(scale, dist, mesh, [JaxInput("x", (t, d), spec=("tp", None))], outputs=[("tp", None)], description=f"global amax scaling (pmax), TP {c}")


def fsdp_untiled_gather(ctx: JaxContext) -> JaxModel:
    """ZeRO-3 / FSDP in shard_map with an untiled ``all_gather(w, axis=0)`` ([c, rows/c, cols],
    merged by a reshape) before the matmul; the batch sharded over the same axis."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"fsdp": c})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        w1 = jax.lax.all_gather(w1, "fsdp", axis=0).reshape(d, f)
        w2g = jax.lax.all_gather(w2, "fsdp", axis=1 if bug == "gather_axis1" else 0)  # BUG-SITE: gather_axis1
        return _mlp(x, w1, w2g.reshape(f, d))

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("fsdp"), P("fsdp"), P("fsdp")), out_specs=P("fsdp"), check_vma=False)
    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (b, d), spec=("fsdp", None)), JaxInput("w1", (d, f), spec=("fsdp", None)),
                                       JaxInput("w2", (f, d), spec=("fsdp", None))],
                    outputs=[("fsdp", None)], description=f"FSDP with untiled all_gather(axis=0), {c} shards")


def psum_scatter_untiled(ctx: JaxContext) -> JaxModel:
    """The row-parallel MLP's output reduce-scattered by an untiled ``psum_scatter`` (the
    sequence split into a leading axis of c first), sequence-parallel output."""
    s, d, f, c = ctx.knob("seq", 16), ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        y = _mlp(x, w1, w2)  # [s, d] partial
        y = y.reshape(s // c, c, d).transpose(1, 0, 2) if bug == "scatter_interleaved" else y.reshape(c, s // c, d)  # BUG-SITE: scatter_interleaved
        return jax.lax.psum_scatter(y, "tp", scatter_dimension=0)

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P("tp", None), check_vma=False)
    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (s, d)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    outputs=[("tp", None)], description=f"MLP + untiled psum_scatter (scatter_dimension 0), TP {c}")


def gather_output(ctx: JaxContext) -> JaxModel:
    """A column-parallel projection whose output is gathered along the last dim
    (``all_gather(y, axis=1, tiled=True)``: Megatron's gather_output=True)."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def proj(x: Any, w: Any) -> Any:
        return jnp.tanh(x @ w)

    def per_device(x: Any, w: Any) -> Any:
        y = jnp.tanh(x @ w)
        return jax.lax.all_gather(y, "tp", axis=0 if bug == "gather_rows" else 1, tiled=True).reshape(b, f)  # BUG-SITE: gather_rows

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp")), out_specs=P(), check_vma=False)
    return JaxModel(proj, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w", (d, f), spec=(None, "tp"))], description=f"column-parallel + all_gather(axis=1), TP {c}")


class RematBlock(nn.Module):
    ffn: int

    @nn.compact
    def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
        h = nn.LayerNorm(use_bias=False, name="norm")(x)
        return x + MtMlp(self.ffn, name="mlp")(h), None


class RematDecoder(nn.Module):
    """MaxText's layer stack: nn.remat (activation checkpointing) inside nn.scan."""

    layers: int
    ffn: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        block = nn.remat(RematBlock, prevent_cse=False, policy=jax.checkpoint_policies.nothing_saveable)
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers, metadata_params={nn.PARTITION_NAME: "layers"})
        return stack(self.ffn, name="layers")(x, None)[0]


def remat_scan(ctx: JaxContext) -> JaxModel:
    """A MaxText-like remat + scan decoder of LayerNorm + gated MLP blocks, TP 4, GSPMD; the loss
    and its gradient (remat recomputes in the backward). (With the batch over 'data' too the
    loss is the mean over every group's batch: a relation of one group cannot declare it.)"""
    b, s, d, f, n = ctx.knob("batch", 2), ctx.knob("seq", 4), ctx.knob("hidden", 16), ctx.knob("ffn", 32), ctx.knob("layers", 2)
    mesh = ctx.mesh({"data": 1, "model": 4})
    module = RematDecoder(n, f)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, d))
    x = JaxInput("x", (b, s, d), spec=("activation_batch", None, None))
    rules = (*MT_RULES, ("layers", None))

    def step(v: Any, xs: Any) -> Any:
        return jax.value_and_grad(lambda p: jnp.mean(module.apply(p, xs) ** 2))(v)

    return JaxModel(step, step, mesh, [variables, x], outputs=(P(), variables), rules=rules, group_axes=("model",), gspmd=True,
                    description=f"remat + scan decoder ({n} layers) loss and gradients, TP 4, GSPMD")


# ---- a third batch: context parallelism by all-gather, top_k routing, norms and scans written
# ---- by hand over the ranks, a shard_map manual over one mesh axis only


def allgather_cp_attention(ctx: JaxContext) -> JaxModel:
    """Context parallelism as Llama 3 trains it: queries stay sequence-sharded, keys and values
    are all-gathered along the sequence, the causal mask compares the rank's query positions
    (``axis_index * s_local + arange``) with every key position."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 2), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"cp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        scores = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
        p = jax.nn.softmax(jnp.where(causal[None], scores, -jnp.inf), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        n = q.shape[0]
        k, v = jax.lax.all_gather(k, "cp", axis=0, tiled=True), jax.lax.all_gather(v, "cp", axis=0, tiled=True)
        scores = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        qpos = jax.lax.axis_index("cp") * n + jnp.arange(n)
        causal = (qpos[:, None] > jnp.arange(s)[None, :]) if bug == "cp_mask_strict" else (qpos[:, None] >= jnp.arange(s)[None, :])  # BUG-SITE: cp_mask_strict
        p = jax.nn.softmax(jnp.where(causal[None], scores, -jnp.inf), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    spec = ("cp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"all-gather context parallel causal attention, CP {c}")


def topk_moe(ctx: JaxContext) -> JaxModel:
    """MaxText-style dense MoE routing with ``jax.lax.top_k`` (k = 2), softmax over the chosen
    logits, the experts' weights sharded over 'model' (expert tensor parallel), GSPMD."""
    t, d, e, f = ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("experts", 4), ctx.knob("ffn", 32)
    mesh = ctx.mesh({"data": 1, "model": 4})
    bug = ctx.variant

    def experts(x: Any, vals: Any, idx: Any, w1: Any, w2: Any) -> Any:
        weights = jax.nn.softmax(vals, axis=-1)  # [T, k]
        gate = jnp.sum(jax.nn.one_hot(idx, e) * weights[..., None], axis=1)  # [T, E]
        h = jax.nn.silu(jnp.einsum("td,edf->tef", x, w1))
        return jnp.einsum("tef,efd,te->td", h, w2, gate)

    def moe(x: Any, wg: Any, w1: Any, w2: Any) -> Any:
        return experts(x, *jax.lax.top_k(x @ wg, 2), w1, w2)

    def dist(x: Any, wg: Any, w1: Any, w2: Any) -> Any:
        vals, idx = jax.lax.top_k(x @ wg, 1 if bug == "topk_1" else 2)  # BUG-SITE: topk_1
        return experts(x, vals, idx, w1, w2)

    return JaxModel(moe, dist, mesh, [JaxInput("x", (t, d)), JaxInput("wg", (d, e)), JaxInput("w1", (e, d, f), spec=(None, None, "model")),
                                      JaxInput("w2", (e, f, d), spec=(None, "model", None))],
                    group_axes=("model",), gspmd=True, description="top_k (k=2) routed dense MoE, experts' ffn over TP 4, GSPMD")


def layernorm_sharded(ctx: JaxContext) -> JaxModel:
    """LayerNorm over a hidden dim sharded across ranks, two passes as jnp.var computes it: the
    mean by a psum of sums, the variance by a psum of squared deviations."""
    t, d, c = ctx.knob("tokens", 8), ctx.knob("hidden", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def norm(x: Any, g: Any, b: Any) -> Any:
        m = jnp.mean(x, axis=-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5) * g + b

    def per_device(x: Any, g: Any, b: Any) -> Any:
        m = jax.lax.psum(jnp.sum(x, axis=-1, keepdims=True), "tp") / d
        ssd = jax.lax.psum(jnp.sum((x - m) ** 2, axis=-1, keepdims=True), "tp")
        return (x - m) * jax.lax.rsqrt(ssd / (d - 1 if bug == "ln_unbiased" else d) + 1e-5) * g + b  # BUG-SITE: ln_unbiased

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(None, "tp"), P("tp"), P("tp")), out_specs=P(None, "tp"), check_vma=False)
    return JaxModel(norm, dist, mesh, [JaxInput("x", (t, d), spec=(None, "tp")), JaxInput("g", (d,), spec=("tp",)), JaxInput("b", (d,), spec=("tp",))],
                    outputs=[(None, "tp")], description=f"two-pass LayerNorm over a sharded hidden dim, TP {c}")


def gelu_exact_mlp(ctx: JaxContext) -> JaxModel:
    """The TP MLP with the exact (erf) gelu, ``jax.nn.gelu(approximate=False)`` (BERT-style code)."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.nn.gelu(x @ w1, approximate=False) @ w2

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(mlp(x, w1, w2), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    description=f"erf-gelu MLP, TP {c}")


def minmax_normalize(ctx: JaxContext) -> JaxModel:
    """Global min-max normalization of a sharded tensor: ``lax.pmin`` and ``lax.pmax`` of the
    shards' extremes."""
    n, d, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def normalize(x: Any) -> Any:
        return (x - x.min()) / (x.max() - x.min())

    def per_device(x: Any) -> Any:
        lo, hi = jax.lax.pmin(x.min(), "tp"), jax.lax.pmax(x.max(), "tp")
        return (x - lo) / ((hi - lo) if bug != "minmax_local_hi" else (x.max() - lo))  # BUG-SITE: minmax_local_hi

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P("tp", None), check_vma=False)
    return JaxModel(normalize, dist, mesh, [JaxInput("x", (n, d), spec=("tp", None))], outputs=[("tp", None)], description=f"min-max normalization (pmin/pmax), TP {c}")


def sp_cumsum(ctx: JaxContext) -> JaxModel:
    """A prefix sum along a sequence-sharded dim: the local cumsum plus the totals of the ranks
    before (all_gather of the block totals, masked by ``arange < axis_index``)."""
    s, d, c = ctx.knob("seq", 16), ctx.knob("hidden", 4), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def base(x: Any) -> Any:
        return jnp.cumsum(x, axis=0)

    def per_device(x: Any) -> Any:
        totals = jax.lax.all_gather(x.sum(axis=0), "sp")  # [c, d]
        pos, r = jnp.arange(c)[:, None], jax.lax.axis_index("sp")
        return jnp.cumsum(x, axis=0) + jnp.sum(jnp.where((pos <= r) if bug == "cumsum_inclusive" else (pos < r), totals, 0), axis=0)  # BUG-SITE: cumsum_inclusive

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("sp", None),), out_specs=P("sp", None), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (s, d), "int32", spec=("sp", None), int_range=(-50, 50))], outputs=[("sp", None)],
                    description=f"sequence-parallel cumsum (int32), all_gather of block totals, SP {c}")


def partial_manual(ctx: JaxContext) -> JaxModel:
    """A shard_map manual over 'model' only (``axis_names={'model'}``), the 'data' axis left to
    the partitioner: the TP MLP inside a jit whose batch is split over 'data'."""
    b, d, f = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64)
    mesh = ctx.mesh({"data": 2, "model": 2})
    bug = ctx.variant

    def per_model(x: Any, w1: Any, w2: Any) -> Any:
        return jax.nn.gelu(x @ w1) @ w2 if bug == "manual_missing_psum" else jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "model")  # BUG-SITE: manual_missing_psum

    inner = shard_map(per_model, mesh=mesh, in_specs=(P(), P(None, "model"), P("model", None)), out_specs=P(), axis_names={"model"}, check_vma=False)

    def dist(x: Any, w1: Any, w2: Any) -> Any:
        return inner(x, w1, w2)

    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (b, d), spec=("data", None)), JaxInput("w1", (d, f), spec=(None, "model")),
                                       JaxInput("w2", (f, d), spec=("model", None))],
                    outputs=[("data", None)], group_axes=("model",), gspmd=True, description="shard_map manual over 'model' only inside jit, DP 2 x TP 2")


def shard_map_vocab_xent_lse(ctx: JaxContext) -> JaxModel:
    """shard_map_vocab_xent with the log-sum-exp added to the max first, ``logits - (m + log S)``
    (Megatron's order), against jax.nn.log_softmax's ``(x - m) - log S``: equal in real
    arithmetic, not in floats (the two roundings differ), so it stays unproven on purpose."""
    t, d, v, c = ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("vocab", 64), ctx.knob("tp", 4)
    w = v // c
    mesh = ctx.mesh({"model": c})

    def xent(x: Any, wv: Any, labels: Any) -> Any:
        return -jnp.take_along_axis(jax.nn.log_softmax(x @ wv, axis=-1), labels[:, None], axis=-1)[:, 0]

    def per_device(x: Any, wv: Any, labels: Any) -> Any:
        logits = x @ wv
        m = jax.lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "model")
        logp = logits - (m + jnp.log(jax.lax.psum(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True), "model")))
        local = labels - jax.lax.axis_index("model") * w
        mine = (local >= 0) & (local < w)
        picked = jnp.take_along_axis(logp, jnp.clip(local, 0, w - 1)[:, None], axis=-1)[:, 0]
        return -jax.lax.psum(jnp.where(mine, picked, 0.0), "model")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "model"), P()), out_specs=P(), check_vma=False)
    return JaxModel(xent, dist, mesh, [JaxInput("x", (t, d)), JaxInput("wv", (d, v), spec=(None, "model")), JaxInput("labels", (t,), "int32", int_range=(0, v))],
                    description=f"vocab-parallel cross entropy, x - (m + log S), TP {c}")


# ---- a fourth batch: a psum over two mesh axes, tied embeddings, mixed precision dots


def psum_two_axes(ctx: JaxContext) -> JaxModel:
    """2-D tensor parallelism: the MLP's ffn dim split over both mesh axes ('data', 'model'),
    the row-parallel sum ``psum(y, ('data', 'model'))`` over the whole mesh."""
    b, d, f = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64)
    mesh = ctx.mesh({"data": 2, "model": 2})
    bug = ctx.variant

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(_mlp(x, w1, w2), "model" if bug == "psum_one_axis" else ("data", "model"))  # BUG-SITE: psum_one_axis

    both = ("data", "model")
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, both), P(both, None)), out_specs=P(), check_vma=False)
    return JaxModel(_mlp, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w1", (d, f), spec=(None, both)), JaxInput("w2", (f, d), spec=(both, None))],
                    description="MLP with ffn over ('data', 'model'), psum over both axes")


class TiedLm(nn.Module):
    vocab: int
    hidden: int

    @nn.compact
    def __call__(self, ids: Any) -> Any:
        embed = nn.Embed(self.vocab, self.hidden, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(), ("vocab", "embed")), name="embed")
        h = jnp.tanh(embed(ids))
        return embed.attend(h)  # logits with the tied table: h @ E^T


def tied_embedding(ctx: JaxContext) -> JaxModel:
    """A tied-embedding LM head (flax ``nn.Embed.attend``): the lookup and the logits share one
    table whose vocabulary is sharded over 'model', GSPMD."""
    s, v, d = ctx.knob("seq", 8), ctx.knob("vocab", 64), ctx.knob("hidden", 16)
    mesh = ctx.mesh({"data": 1, "model": 4})
    module = TiedLm(v, d)
    variables = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct((s,), jnp.int32))
    ids = JaxInput("ids", (s,), "int32", int_range=(0, v))
    return JaxModel(module.apply, module.apply, mesh, [variables, ids], outputs=[(None, "vocab")], rules=(("vocab", "model"), ("embed", None)),
                    group_axes=("model",), gspmd=True, description="tied embedding lookup + attend, vocab over TP 4, GSPMD")


def mixed_precision_mlp(ctx: JaxContext) -> JaxModel:
    """bf16 weights and activations, each dot accumulated in f32 (``preferred_element_type``) and
    the row-parallel partial sums all-reduced in f32, as mixed-precision JAX code writes it."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)
        return jnp.dot(h, w2, preferred_element_type=jnp.float32)

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        h = jax.nn.gelu(jnp.dot(x, w1, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)
        y = jnp.dot(h, w2, preferred_element_type=jnp.float32)
        return jax.lax.psum(y.astype(jnp.bfloat16) if bug == "psum_in_bf16" else y, "tp")  # BUG-SITE: psum_in_bf16

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (b, d), "bfloat16"), JaxInput("w1", (d, f), "bfloat16", spec=(None, "tp")),
                                      JaxInput("w2", (f, d), "bfloat16", spec=("tp", None))],
                    description=f"bf16 MLP with f32 accumulation (preferred_element_type), TP {c}")


def highest_precision_mlp(ctx: JaxContext) -> JaxModel:
    """The TP MLP with ``precision=jax.lax.Precision.HIGHEST`` on its einsums (numerics-sensitive code)."""
    b, d, f, c = ctx.knob("batch", 8), ctx.knob("hidden", 16), ctx.knob("ffn", 64), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    hi = jax.lax.Precision.HIGHEST

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return jnp.einsum("bf,fd->bd", jax.nn.relu(jnp.einsum("bd,df->bf", x, w1, precision=hi)), w2, precision=hi)

    def per_device(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(mlp(x, w1, w2), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(mlp, dist, mesh, [JaxInput("x", (b, d)), JaxInput("w1", (d, f), spec=(None, "tp")), JaxInput("w2", (f, d), spec=("tp", None))],
                    description=f"MLP with Precision.HIGHEST einsums, TP {c}")
