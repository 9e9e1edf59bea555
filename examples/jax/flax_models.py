"""flax test models, declared as flax code has them: variables straight from ``jax.eval_shape(
model.init, ...)`` (linen) or an abstract nnx module, shardings from logical partitioning
(``nn.with_logical_partitioning``, ``nnx.with_partitioning``) and logical axis rules, no glue.

Each correct model is the flax module itself, split by XLA's SPMD partitioner from those
shardings. Its bug twins apply the same module per device inside ``shard_map`` (local weight
shapes, collectives written by hand); each differs from the correct twin (``variant:
shard_map``) only on the line marked ``# BUG-SITE: <variant>``.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from jax import shard_map
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel

# How the logical axes of these models map to a ('data', 'model') mesh: tensor parallel over
# 'model', data parallel (the batch) over 'data'. FSDP adds ('embed', 'data').
RULES = (("batch", "data"), ("mlp", "model"), ("heads", "model"), ("vocab", "model"), ("embed", None), ("layers", None), ("seq", None))
INIT = nn.initializers.lecun_normal()


def _f32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _mesh_specs(variables: Any, rules: Any) -> Any:
    """The variables' shardings as shard_map in_specs (flax's own mapping of the boxes)."""
    return nn.logical_to_mesh(nn.get_partition_spec(variables), rules)


class Mlp(nn.Module):
    """The Megatron MLP: up (embed x mlp, column-parallel), gelu, down (mlp x embed)."""

    ffn: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        h = nn.Dense(self.ffn, use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, ("embed", "mlp")), name="up")(x)
        h = nn.with_logical_constraint(nn.gelu(h), ("batch", "seq", "mlp"))
        return nn.Dense(x.shape[-1], use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, ("mlp", "embed")), name="down")(h)


def linen_mlp(ctx: JaxContext) -> JaxModel:
    """A flax linen MLP, DP x TP on a 2x2 ('data', 'model') mesh: the batch over 'data' (with
    batch 2, one sequence per group), the MLP over 'model'."""
    b, s, d, f = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 128)
    mesh = ctx.mesh({"data": 2, "model": 2})
    variables = jax.eval_shape(Mlp(f).init, jax.random.key(0), _f32(b, s, d))
    x = JaxInput("x", (b, s, d), spec=("batch", None, None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(Mlp(f).apply, Mlp(f).apply, mesh, [variables, x], outputs=[("batch", None, None)], rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen MLP (logical partitioning), batch {b} over data 2 x TP 2, GSPMD")

    def per_device(v: Any, xs: Any) -> Any:
        y = Mlp(f // 2).apply(v, xs)
        return jax.lax.psum(y, "data" if bug == "psum_over_data" else "model")  # BUG-SITE: psum_over_data

    dist = shard_map(per_device, mesh=mesh, in_specs=(_mesh_specs(variables, RULES), P("data")), out_specs=P("data"), check_vma=False)
    return JaxModel(Mlp(f).apply, dist, mesh, [variables, x], outputs=[("batch", None, None)], rules=RULES, group_axes=("model",),
                    description="the flax linen MLP applied per device in shard_map, batch over data x TP 2")


class Attention(nn.Module):
    """Multi-head self-attention, q/k/v (embed x heads·hd) column-parallel over the heads, out
    (heads·hd x embed) row-parallel."""

    heads: int
    head_dim: int
    low_precision: bool = False

    @nn.compact
    def __call__(self, x: Any) -> Any:
        b, s, _ = x.shape

        def proj(name: str) -> Any:
            y = nn.Dense(self.heads * self.head_dim, use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, ("embed", "heads")), name=name)(x)
            return y.reshape(b, s, self.heads, self.head_dim)

        q, k, v = proj("q"), proj("k"), proj("v")
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(self.head_dim)
        if self.low_precision:
            scores = scores.astype(jnp.bfloat16).astype(jnp.float32)  # BUG-SITE: softmax_bf16
        p = jax.nn.softmax(scores, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, self.heads * self.head_dim)
        return nn.Dense(x.shape[-1], use_bias=False, kernel_init=nn.with_logical_partitioning(INIT, ("heads", "embed")), name="out")(o)


def linen_attention(ctx: JaxContext) -> JaxModel:
    """flax linen attention with the heads sharded over 'model' (TP 4)."""
    b, s, h, hd = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 8), ctx.knob("head_dim", 8)
    c = 4
    mesh = ctx.mesh({"data": 1, "model": c})
    module = Attention(h, hd)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, h * hd))
    x = JaxInput("x", (b, s, h * hd), spec=("batch", None, None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(module.apply, module.apply, mesh, [variables, x], rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen attention, {h} heads over TP {c}, GSPMD")

    def per_device(v: Any, xs: Any) -> Any:
        return jax.lax.psum(Attention(h // c, hd, low_precision=bug == "softmax_bf16").apply(v, xs), "model")

    dist = shard_map(per_device, mesh=mesh, in_specs=(_mesh_specs(variables, RULES), P()), out_specs=P(), check_vma=False)
    return JaxModel(module.apply, dist, mesh, [variables, x], rules=RULES, group_axes=("model",),
                    description=f"the flax linen attention applied per device in shard_map, TP {c}")


class Embedder(nn.Module):
    vocab: int
    hidden: int

    @nn.compact
    def __call__(self, ids: Any) -> Any:
        return nn.Embed(self.vocab, self.hidden, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(), ("vocab", "embed")), name="embed")(ids)


def linen_embedding(ctx: JaxContext) -> JaxModel:
    """A flax nn.Embed with the vocabulary sharded over 'model' (vocab-parallel embedding)."""
    s, v, d = ctx.knob("seq", 8), ctx.knob("vocab", 256), ctx.knob("hidden", 32)
    c = 4
    w = v // c
    mesh = ctx.mesh({"data": 1, "model": c})
    module = Embedder(v, d)
    variables = jax.eval_shape(module.init, jax.random.key(0), jax.ShapeDtypeStruct((s,), jnp.int32))
    ids = JaxInput("ids", (s,), "int32", int_range=(0, v))
    bug = ctx.variant
    if bug is None:
        return JaxModel(module.apply, module.apply, mesh, [variables, ids], rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen nn.Embed, vocab {v} over TP {c}, GSPMD")

    def per_device(vs: Any, tok: Any) -> Any:
        lo = jax.lax.axis_index("model") * w
        local = tok - lo
        outside = (local < 0) | (local >= w)
        rows = Embedder(w, d).apply(vs, jnp.where(outside, 0, local))
        masked = jnp.where(outside[:, None], 0.0, rows)
        return jax.lax.psum(rows if bug == "rows_unmasked" else masked, "model")  # BUG-SITE: rows_unmasked

    dist = shard_map(per_device, mesh=mesh, in_specs=(_mesh_specs(variables, RULES), P()), out_specs=P(), check_vma=False)
    return JaxModel(module.apply, dist, mesh, [variables, ids], rules=RULES, group_axes=("model",),
                    description=f"the flax nn.Embed applied per device to its vocab rows in shard_map, TP {c}")


class RmsNorm(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


class Block(nn.Module):
    """A pre-norm decoder block; the carry is the residual stream (nn.scan's interface)."""

    heads: int
    head_dim: int
    ffn: int

    @nn.compact
    def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
        x = x + Attention(self.heads, self.head_dim, name="attn")(RmsNorm(name="norm1")(x))
        x = x + Mlp(self.ffn, name="mlp")(RmsNorm(name="norm2")(x))
        return x, None


class Decoder(nn.Module):
    """``layers`` blocks stacked by nn.scan: one set of weights with a leading 'layers' axis."""

    layers: int
    heads: int
    head_dim: int
    ffn: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=self.layers, metadata_params={nn.PARTITION_NAME: "layers"})
        return stack(self.heads, self.head_dim, self.ffn, name="blocks")(x, None)[0]


def linen_scan_decoder(ctx: JaxContext) -> JaxModel:
    """A flax decoder of nn.scan-stacked blocks (RMSNorm, attention, MLP), TP 4 over 'model'."""
    b, s, h, hd, f, n = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("heads", 8), ctx.knob("head_dim", 8), ctx.knob("ffn", 128), ctx.knob("layers", 4)
    c = 4
    mesh = ctx.mesh({"data": 1, "model": c})
    module = Decoder(n, h, hd, f)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, h * hd))
    x = JaxInput("x", (b, s, h * hd), spec=("batch", None, None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(module.apply, module.apply, mesh, [variables, x], rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen decoder, nn.scan over {n} blocks, TP {c}, GSPMD")

    class TpBlock(nn.Module):
        """The block per device: local heads and ffn, the row-parallel sums by hand."""

        @nn.compact
        def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
            a = Attention(h // c, hd, name="attn")(RmsNorm(name="norm1")(x))
            x = x + jax.lax.psum(a, "model")
            m = Mlp(f // c, name="mlp")(RmsNorm(name="norm2")(x))
            return x + (m if bug == "scan_mlp_missing_psum" else jax.lax.psum(m, "model")), None  # BUG-SITE: scan_mlp_missing_psum

    class TpDecoder(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            stack = nn.scan(TpBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=n, metadata_params={nn.PARTITION_NAME: "layers"})
            return stack(name="blocks")(x, None)[0]

    dist = shard_map(TpDecoder().apply, mesh=mesh, in_specs=(_mesh_specs(variables, RULES), P()), out_specs=P(), check_vma=False)
    return JaxModel(module.apply, dist, mesh, [variables, x], rules=RULES, group_axes=("model",),
                    description=f"the scanned flax decoder per device in shard_map, TP {c}")


class NnxMlp(nnx.Module):
    """The MLP in flax nnx, partitioned with nnx.with_partitioning (logical names)."""

    def __init__(self, hidden: int, ffn: int, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(hidden, ffn, use_bias=False, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(ffn, hidden, use_bias=False, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.down(nnx.gelu(self.up(x)))


def _call(model: Any, x: Any) -> Any:
    return model(x)


def nnx_mlp(ctx: JaxContext) -> JaxModel:
    """An nnx MLP passed as the module itself (nnx modules are pytrees), TP 4."""
    b, d, f = ctx.knob("batch", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 128)
    c = 4
    mesh = ctx.mesh({"data": 1, "model": c})
    with nnx.use_eager_sharding(False):  # abstract: no mesh needed to make it
        model = nnx.eval_shape(lambda: NnxMlp(d, f, nnx.Rngs(0)))
    x = JaxInput("x", (b, d), spec=("batch", None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(_call, _call, mesh, [model, x], rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax nnx MLP (nnx.with_partitioning), TP {c}, GSPMD")

    def per_device(m: Any, xs: Any) -> Any:
        y = jax.lax.psum(m(xs), "model")
        if bug == "nnx_double_psum":
            y = jax.lax.psum(y, "model")  # BUG-SITE: nnx_double_psum
        return y

    specs = jax.tree_util.tree_map(lambda v: P(*nn.logical_to_mesh_axes(v.get_metadata()["out_sharding"], RULES)), model, is_leaf=lambda v: isinstance(v, nnx.Variable))
    dist = shard_map(per_device, mesh=mesh, in_specs=(specs, P()), out_specs=P(), check_vma=False)
    return JaxModel(_call, dist, mesh, [model, x], rules=RULES, group_axes=("model",),
                    description=f"the nnx MLP called per device in shard_map, TP {c}")


# FSDP x TP: the weights' 'embed' dim is split over 'data' too (each data-parallel group holds
# half of every weight and gathers it whole before use), the batch over 'data', the MLP over
# 'model'.
FSDP_RULES = (("batch", "data"), ("embed", "data"), ("mlp", "model"), ("seq", None))


def linen_fsdp_tp(ctx: JaxContext) -> JaxModel:
    """The flax linen MLP with FSDP x TP on a 2x2 ('data', 'model') mesh: each weight is one
    baseline weight, split over both axes and all-gathered over 'data' inside the program."""
    b, s, d, f = ctx.knob("batch", 4), ctx.knob("seq", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 128)
    mesh = ctx.mesh({"data": 2, "model": 2})
    variables = jax.eval_shape(Mlp(f).init, jax.random.key(0), _f32(b, s, d))
    x = JaxInput("x", (b, s, d), spec=("batch", None, None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(Mlp(f).apply, Mlp(f).apply, mesh, [variables, x], outputs=[("batch", None, None)], rules=FSDP_RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen MLP, FSDP over data 2 x TP 2 (weights gathered over data), batch {b}, GSPMD")

    def per_device(v: Any, xs: Any) -> Any:
        up, down = v["params"]["up"]["kernel"], v["params"]["down"]["kernel"]
        up = jax.lax.all_gather(up, "model" if bug == "fsdp_gather_over_model" else "data", axis=0, tiled=True)  # BUG-SITE: fsdp_gather_over_model
        down = jax.lax.all_gather(down, "data", axis=1, tiled=True)
        y = Mlp(f // 2).apply({"params": {"up": {"kernel": up}, "down": {"kernel": down}}}, xs)
        return jax.lax.psum(y, "model")

    dist = shard_map(per_device, mesh=mesh, in_specs=(_mesh_specs(variables, FSDP_RULES), P("data")), out_specs=P("data"), check_vma=False)
    return JaxModel(Mlp(f).apply, dist, mesh, [variables, x], outputs=[("batch", None, None)], rules=FSDP_RULES, group_axes=("model",),
                    description="the FSDP x TP MLP per device in shard_map: all_gather over data, psum over model")


def linen_train_step(ctx: JaxContext) -> JaxModel:
    """A training step of the flax linen MLP with optax AdamW, TP 4: the parameters and the
    optimizer state (its moments boxed like the parameters by optax's tree maps) go in and come
    out sharded as declared by the logical partitioning."""
    import optax

    b, s, d, f = ctx.knob("batch", 2), ctx.knob("seq", 8), ctx.knob("hidden", 32), ctx.knob("ffn", 128)
    c = 4
    mesh = ctx.mesh({"data": 1, "model": c})
    module = Mlp(f)
    tx = optax.adamw(1e-3)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, d))
    opt_state = jax.eval_shape(tx.init, variables)
    x, y = JaxInput("x", (b, s, d), spec=("batch", None, None)), JaxInput("y", (b, s, d), spec=("batch", None, None))

    def step(v: Any, st: Any, xs: Any, ys: Any) -> Any:
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((module.apply(p, xs) - ys) ** 2))(v)
        updates, st = tx.update(grads, st, v)
        return optax.apply_updates(v, updates), st, loss

    bug = ctx.variant
    if bug is None:
        return JaxModel(step, step, mesh, [variables, opt_state, x, y], outputs=(variables, opt_state, P()), rules=RULES, group_axes=("model",), gspmd=True,
                        description=f"flax linen MLP training step (MSE, optax AdamW), TP {c}, GSPMD")

    def per_device(v: Any, st: Any, xs: Any, ys: Any) -> Any:
        def loss_fn(p: Any) -> Any:
            return jnp.mean((jax.lax.psum(Mlp(f // c).apply(p, xs), "model") - ys) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(v)
        if bug == "tp_grads_all_reduced":
            grads = jax.lax.psum(grads, "model")  # BUG-SITE: tp_grads_all_reduced
        updates, st = tx.update(grads, st, v)
        return optax.apply_updates(v, updates), st, loss

    # check_vma (JAX's default) types the psum's transpose right: the replicated cotangent
    # reaches each rank's shard once.
    specs = (_mesh_specs(variables, RULES), _mesh_specs(opt_state, RULES))
    dist = shard_map(per_device, mesh=mesh, in_specs=(*specs, P(), P()), out_specs=(*specs, P()))
    return JaxModel(step, dist, mesh, [variables, opt_state, x, y], outputs=(variables, opt_state, P()), rules=RULES, group_axes=("model",),
                    description=f"the flax training step per device in shard_map (optax AdamW), TP {c}")


def linen_fsdp_scan_decoder(ctx: JaxContext) -> JaxModel:
    """The nn.scan decoder with FSDP x TP on a 2x2 ('data', 'model') mesh: every stacked
    weight's 'embed' dim split over 'data' as well, the batch over 'data'."""
    b, s, h, hd, f, n = ctx.knob("batch", 4), ctx.knob("seq", 8), ctx.knob("heads", 4), ctx.knob("head_dim", 8), ctx.knob("ffn", 64), ctx.knob("layers", 2)
    mesh = ctx.mesh({"data": 2, "model": 2})
    module = Decoder(n, h, hd, f)
    variables = jax.eval_shape(module.init, jax.random.key(0), _f32(b, s, h * hd))
    x = JaxInput("x", (b, s, h * hd), spec=("batch", None, None))
    rules = (("batch", "data"), ("embed", "data"), ("mlp", "model"), ("heads", "model"), ("layers", None), ("seq", None))
    bug = ctx.variant
    if bug is None:
        return JaxModel(module.apply, module.apply, mesh, [variables, x], outputs=[("batch", None, None)], rules=rules, group_axes=("model",), gspmd=True,
                        description=f"flax linen decoder, nn.scan over {n} blocks, FSDP over data 2 x TP 2, GSPMD")
    specs = _mesh_specs(variables, rules)

    class TpBlock(nn.Module):
        """The block per device on whole (gathered) layer weights: local heads and ffn."""

        @nn.compact
        def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
            x = x + jax.lax.psum(Attention(h // 2, hd, name="attn")(RmsNorm(name="norm1")(x)), "model")
            return x + jax.lax.psum(Mlp(f // 2, name="mlp")(RmsNorm(name="norm2")(x)), "model"), None

    def gather(path: Any, w: Any, spec: Any) -> Any:
        """One layer's slice of a stacked weight, gathered whole over 'data' (FSDP) along the
        dim the rules put on 'data' (one less: scan took the layers dim)."""
        if "data" not in tuple(spec):
            return w
        up = "up" in jax.tree_util.keystr(path)
        return jax.lax.all_gather(w, "model" if bug == "fsdp_scan_gather_over_model" and up else "data", axis=tuple(spec).index("data") - 1, tiled=True)  # BUG-SITE: fsdp_scan_gather_over_model

    def per_device(v: Any, xs: Any) -> Any:
        def layer(carry: Any, p: Any) -> Any:
            whole = jax.tree_util.tree_map_with_path(gather, p, specs["params"]["blocks"], is_leaf=lambda t: isinstance(t, P))
            return TpBlock().apply({"params": whole}, carry, None)

        return jax.lax.scan(layer, xs, nn.meta.unbox(v["params"]["blocks"]))[0]

    dist = shard_map(per_device, mesh=mesh, in_specs=(specs, P("data")), out_specs=P("data"), check_vma=False)
    return JaxModel(module.apply, dist, mesh, [variables, x], outputs=[("batch", None, None)], rules=rules, group_axes=("model",),
                    description=f"the scanned flax decoder per device in shard_map: each layer's weights gathered over data, TP 2, {n} layers")
