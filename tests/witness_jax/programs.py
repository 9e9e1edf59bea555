"""JAX programs whose per-device execution the witness must reproduce (tests/test_witness_vs_jax.py).

Each program is a jitted function over a mesh of the 4 virtual CPU devices, with its global
inputs. JAX runs it (the truth: every device's output); the per-device module XLA writes after
SPMD partitioning is what the witness executes, on the same per-device inputs.

The corpus covers the group forms XLA prints: mesh lists (Shardy, the default; a device order
``device_ids=(...)`` inside ``lax.scan``; several meshes in one module), iota lists
``[2,2]<=[2,2]T(1,0)`` (Shardy off: ``jax_use_shardy_partitioner=False``) and, through the
test's rewrite of every list into ``{{...}}``, explicit groups; the collectives psum,
all_gather, psum_scatter, ppermute, all_to_all, pmax, pmin under ``shard_map`` on a 1-D mesh of
4 and on DP x TP 2x2 meshes (both axis orders); GSPMD programs (``in_shardings``) and flax
linen and nnx models with logical partitioning (linen's rules; nnx's logical names resolved by
the same rules) and with mesh-axis metadata.

Nothing here imports jax at module level: the test collects the names without starting jax.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Program:
    name: str
    build: Callable[[np.random.Generator], tuple[Any, tuple[Any, ...]]]  # -> (jitted, global args)
    shardy: bool = True  # False: jax_use_shardy_partitioner off while lowering (iota groups)


PROGRAMS: list[Program] = []


def program(name: str, shardy: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        PROGRAMS.append(Program(name, fn, shardy))
        return fn

    return wrap


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _jax() -> Any:
    import jax

    return jax


def mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    jax = _jax()
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def smap(fn: Callable[..., Any], m: Any, in_specs: tuple[Any, ...], out_specs: Any) -> Any:
    jax = _jax()
    # check_vma off: an all_gather's result is replicated over its axis, which JAX's
    # replication check does not infer.
    return jax.jit(jax.shard_map(fn, mesh=m, in_specs=in_specs, out_specs=out_specs, check_vma=False))


def gspmd(fn: Callable[..., Any], m: Any, in_specs: tuple[Any, ...], out_specs: Any) -> Any:
    jax = _jax()
    from jax.sharding import NamedSharding

    def ns(spec: Any) -> Any:
        return NamedSharding(m, spec)

    outs = jax.tree_util.tree_map(ns, out_specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    return jax.jit(fn, in_shardings=tuple(jax.tree_util.tree_map(ns, s, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)) for s in in_specs), out_shardings=outs)


def P(*a: Any) -> Any:
    from jax.sharding import PartitionSpec

    return PartitionSpec(*a)


# ---------------------------------------------------------------------------------------------
# shard_map on a 1-D mesh of 4
# ---------------------------------------------------------------------------------------------


@program("smap_psum_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    return smap(lambda x: _jax().lax.psum(x * 2.0, "i"), m, (P("i"),), P()), (f32(rng, 8, 3),)


@program("smap_all_gather_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    return smap(lambda x: _jax().lax.all_gather(x + 1.0, "i", axis=1, tiled=True), m, (P(None, "i"),), P()), (f32(rng, 3, 8),)


@program("smap_psum_scatter_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    return smap(lambda x: _jax().lax.psum_scatter(x, "i", scatter_dimension=0, tiled=True), m, (P(),), P("i")), (f32(rng, 8, 2),)


@program("smap_ppermute_ring_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    perm = [(j, (j + 1) % 4) for j in range(4)]
    return smap(lambda x: _jax().lax.ppermute(x, "i", perm) * 3.0, m, (P("i"),), P("i")), (f32(rng, 8, 2),)


@program("smap_all_to_all_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    return smap(lambda x: _jax().lax.all_to_all(x, "i", 1, 0, tiled=True), m, (P("i"),), P("i")), (f32(rng, 8, 8),)


@program("smap_pmax_pmin_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    lax = _jax().lax
    return smap(lambda x: lax.pmax(x, "i") - lax.pmin(x, "i"), m, (P("i"),), P()), (f32(rng, 8, 3),)


@program("smap_psum_int32_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    x = rng.integers(-50, 50, size=(8, 4)).astype(np.int32)
    return smap(lambda x: _jax().lax.psum(x * 3, "i"), m, (P("i"),), P()), (x,)


@program("smap_axis_index_1d")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("i",))
    lax = _jax().lax

    def body(x: Any) -> Any:
        r = lax.axis_index("i").astype(x.dtype)
        return lax.psum(x * (r + 1.0), "i")

    return smap(body, m, (P("i"),), P()), (f32(rng, 8, 2),)


# ---------------------------------------------------------------------------------------------
# shard_map on DP x TP 2x2 meshes (both axis orders)
# ---------------------------------------------------------------------------------------------


def _dp_tp(order: str) -> Any:
    return mesh((2, 2), ("dp", "tp") if order == "dp_tp" else ("tp", "dp"))


for _order in ("dp_tp", "tp_dp"):

    @program(f"smap_psum_tp_{_order}")
    def _(rng: np.random.Generator, o: str = _order) -> Any:
        return smap(lambda x: _jax().lax.psum(x, "tp"), _dp_tp(o), (P("dp", "tp"),), P("dp")), (f32(rng, 4, 6),)

    @program(f"smap_psum_dp_{_order}")
    def _(rng: np.random.Generator, o: str = _order) -> Any:
        return smap(lambda x: _jax().lax.psum(x, "dp"), _dp_tp(o), (P("dp", "tp"),), P(None, "tp")), (f32(rng, 4, 6),)

    @program(f"smap_all_gather_tp_{_order}")
    def _(rng: np.random.Generator, o: str = _order) -> Any:
        return smap(lambda x: _jax().lax.all_gather(x, "tp", axis=1, tiled=True), _dp_tp(o), (P("dp", "tp"),), P("dp")), (f32(rng, 4, 8),)

    @program(f"smap_ppermute_dp_{_order}")
    def _(rng: np.random.Generator, o: str = _order) -> Any:
        return smap(lambda x: _jax().lax.ppermute(x, "dp", [(0, 1), (1, 0)]), _dp_tp(o), (P("dp", "tp"),), P("dp", "tp")), (f32(rng, 4, 6),)


@program("smap_all_gather_dp")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.all_gather(x, "dp", axis=0, tiled=True), _dp_tp("dp_tp"), (P("dp", "tp"),), P(None, "tp")), (f32(rng, 4, 6),)


@program("smap_psum_scatter_tp")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.psum_scatter(x, "tp", scatter_dimension=1, tiled=True), _dp_tp("dp_tp"), (P("dp"),), P("dp", "tp")), (f32(rng, 4, 8),)


@program("smap_ppermute_tp")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.ppermute(x, "tp", [(0, 1), (1, 0)]) + x, _dp_tp("dp_tp"), (P("dp", "tp"),), P("dp", "tp")), (f32(rng, 4, 6),)


@program("smap_all_to_all_tp")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.all_to_all(x, "tp", 0, 1, tiled=True), _dp_tp("dp_tp"), (P(None, ("dp", "tp")),), P("tp", "dp")), (f32(rng, 4, 8),)


@program("smap_pmax_dp")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.pmax(x, "dp"), _dp_tp("tp_dp"), (P("dp", "tp"),), P(None, "tp")), (f32(rng, 4, 6),)


@program("smap_psum_both_axes")
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.psum(x, ("dp", "tp")), _dp_tp("dp_tp"), (P("dp", "tp"),), P()), (f32(rng, 4, 6),)


@program("smap_megatron_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    jax = _jax()

    def body(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")

    return smap(body, _dp_tp("dp_tp"), (P("dp"), P(None, "tp"), P("tp")), P("dp")), (f32(rng, 4, 8), f32(rng, 8, 16), f32(rng, 16, 8))


@program("smap_rank_offset_vocab_dp_tp")
def _(rng: np.random.Generator) -> Any:
    """Vocab-parallel lookup: each tp rank owns a block of rows, masks ids outside it, psum."""
    jax = _jax()
    jnp = jax.numpy

    def body(ids: Any, table: Any) -> Any:
        rows = table.shape[0]
        start = jax.lax.axis_index("tp") * rows
        local = ids - start
        inside = (local >= 0) & (local < rows)
        got = jnp.take(table, jnp.clip(local, 0, rows - 1), axis=0)
        return jax.lax.psum(jnp.where(inside[..., None], got, 0.0), "tp")

    ids = rng.integers(0, 16, size=(4, 5)).astype(np.int32)
    return smap(body, _dp_tp("dp_tp"), (P("dp"), P("tp")), P("dp")), (ids, f32(rng, 16, 3))


@program("smap_psum_bf16_tp")
def _(rng: np.random.Generator) -> Any:
    jnp = _jax().numpy
    x = f32(rng, 4, 8)
    return smap(lambda x: _jax().lax.psum(x.astype(jnp.bfloat16) * 2, "tp"), _dp_tp("dp_tp"), (P("dp", "tp"),), P("dp")), (x,)


# ---------------------------------------------------------------------------------------------
# GSPMD (the partitioner writes the collectives)
# ---------------------------------------------------------------------------------------------


def _mlp(x: Any, w1: Any, w2: Any) -> Any:
    jax = _jax()
    return jax.nn.gelu(x @ w1) @ w2


@program("gspmd_mlp_tp4")
def _(rng: np.random.Generator) -> Any:
    m = mesh((4,), ("tp",))
    return gspmd(_mlp, m, (P(), P(None, "tp"), P("tp")), P()), (f32(rng, 4, 8), f32(rng, 8, 16), f32(rng, 16, 8))


@program("gspmd_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    m = _dp_tp("dp_tp")
    return gspmd(_mlp, m, (P("dp"), P(None, "tp"), P("tp")), P("dp")), (f32(rng, 4, 8), f32(rng, 8, 16), f32(rng, 16, 8))


@program("gspmd_vocab_embed_log_softmax")
def _(rng: np.random.Generator) -> Any:
    """Two meshes in one module: the gather's and the softmax's (the importer merged them)."""
    jax = _jax()
    jnp = jax.numpy
    m = mesh((2, 2), ("axis_0", "axis_1"))

    def f(table: Any, ids: Any) -> Any:
        x = jnp.take(table, ids, axis=0)
        lp = jax.nn.log_softmax(x @ table.T)
        return -jnp.mean(jnp.take_along_axis(lp, ids[..., None], -1))

    ids = ((np.arange(16).reshape(2, 8) * 7) % 64).astype(np.int32)
    return gspmd(f, m, (P("axis_0", None), P()), P()), (f32(rng, 64, 16), ids)


@program("gspmd_scan_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    """A collective inside lax.scan: mesh groups with a device order."""
    jax = _jax()
    jnp = jax.numpy
    m = _dp_tp("dp_tp")

    def f(x: Any, w1: Any, w2: Any) -> Any:
        def body(h: Any, w: Any) -> Any:
            return h + jax.nn.gelu(h @ w[0]) @ w[1] * 0.1, None

        h, _ = jax.lax.scan(body, x, (w1, w2))
        return jnp.sum(h, axis=-1)

    return gspmd(f, m, (P("dp"), P(None, None, "tp"), P(None, "tp")), P("dp")), (f32(rng, 4, 8), f32(rng, 3, 8, 16), f32(rng, 3, 16, 8))


@program("gspmd_attention_heads_tp")
def _(rng: np.random.Generator) -> Any:
    jax = _jax()
    jnp = jax.numpy
    m = _dp_tp("dp_tp")

    def f(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
        q, k, v = (jnp.einsum("bsd,dhe->bhse", x, w) for w in (wq, wk, wv))
        a = jax.nn.softmax(jnp.einsum("bhse,bhte->bhst", q, k) / 2.0, axis=-1)
        o = jnp.einsum("bhst,bhte->bhse", a, v)
        return jnp.einsum("bhse,hed->bsd", o, wo)

    w = [f32(rng, 8, 4, 2) for _ in range(3)]
    return gspmd(f, m, (P("dp"), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp")), P("dp")), (f32(rng, 2, 5, 8), *w, f32(rng, 4, 2, 8))


@program("gspmd_layernorm_sharded_hidden")
def _(rng: np.random.Generator) -> Any:
    jnp = _jax().numpy
    m = mesh((4,), ("tp",))

    def f(x: Any, g: Any) -> Any:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g

    return gspmd(f, m, (P(None, "tp"), P("tp")), P(None, "tp")), (f32(rng, 6, 16), f32(rng, 16))


@program("gspmd_argmax_cumsum_sharded")
def _(rng: np.random.Generator) -> Any:
    jnp = _jax().numpy
    m = mesh((4,), ("tp",))

    def f(x: Any) -> Any:
        return jnp.argmax(x, axis=-1), jnp.cumsum(x, axis=-1)

    return gspmd(f, m, (P(None, "tp"),), (P(), P(None, "tp"))), (f32(rng, 5, 16),)


@program("gspmd_transposed_mesh_sum")
def _(rng: np.random.Generator) -> Any:
    """Sharded over both axes of a (tp, dp) mesh and reduced over each in turn."""
    jnp = _jax().numpy
    m = _dp_tp("tp_dp")

    def f(x: Any) -> Any:
        return jnp.sum(x, axis=0), jnp.max(x, axis=1)

    return gspmd(f, m, (P("dp", "tp"),), (P("tp"), P("dp"))), (f32(rng, 4, 8),)


# ---------------------------------------------------------------------------------------------
# Shardy off: iota replica groups
# ---------------------------------------------------------------------------------------------


@program("iota_smap_psum_tp", shardy=False)
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.psum(x, "tp"), _dp_tp("dp_tp"), (P("dp", "tp"),), P("dp")), (f32(rng, 4, 6),)


@program("iota_smap_psum_dp", shardy=False)
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.psum(x, "dp"), _dp_tp("dp_tp"), (P("dp", "tp"),), P(None, "tp")), (f32(rng, 4, 6),)


@program("iota_smap_all_gather_dp_tp_dp", shardy=False)
def _(rng: np.random.Generator) -> Any:
    return smap(lambda x: _jax().lax.all_gather(x, "dp", axis=0, tiled=True), _dp_tp("tp_dp"), (P("dp", "tp"),), P(None, "tp")), (f32(rng, 4, 6),)


@program("iota_gspmd_mlp_dp_tp", shardy=False)
def _(rng: np.random.Generator) -> Any:
    return gspmd(_mlp, _dp_tp("dp_tp"), (P("dp"), P(None, "tp"), P("tp")), P("dp")), (f32(rng, 4, 8), f32(rng, 8, 16), f32(rng, 16, 8))


@program("iota_gspmd_vocab_embed", shardy=False)
def _(rng: np.random.Generator) -> Any:
    jnp = _jax().numpy
    m = mesh((2, 2), ("a", "b"))

    def f(table: Any, ids: Any) -> Any:
        return jnp.sum(jnp.take(table, ids, axis=0) ** 2, axis=-1)

    ids = rng.integers(0, 32, size=(4, 6)).astype(np.int32)
    return gspmd(f, m, (P("b", None), P("a")), P("a")), (f32(rng, 32, 4), ids)


# ---------------------------------------------------------------------------------------------
# flax linen and nnx
# ---------------------------------------------------------------------------------------------


def _linen_rules() -> Any:
    return (("batch", "dp"), ("vocab", "tp"), ("mlp", "tp"), ("heads", "tp"), ("embed", None), ("layers", None))


def _linen_apply(module: Any, m: Any, rules: Any, example: Any, rng_seed: int) -> Any:
    """Params initialised by flax, partitioned by the logical rules; (jitted apply, args)."""
    jax = _jax()
    import flax.linen as nn
    from jax.sharding import NamedSharding

    abstract = jax.eval_shape(module.init, jax.random.PRNGKey(rng_seed), example)
    with nn.logical_axis_rules(rules):
        specs = nn.logical_to_mesh(nn.get_partition_spec(abstract))
    params = nn.meta.unbox(module.init(jax.random.PRNGKey(rng_seed), example))
    shard = jax.tree_util.tree_map(lambda s: NamedSharding(m, s), specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
    return params, shard


@program("flax_linen_embed_vocab_4x1")
def _(rng: np.random.Generator) -> Any:
    """The issue's example: nn.Embed sharded over the vocabulary on a 4x1 mesh."""
    jax = _jax()
    jnp = jax.numpy
    import flax.linen as nn
    from jax.sharding import NamedSharding

    m = mesh((4, 1), ("axis_0", "axis_1"))

    class M(nn.Module):
        @nn.compact
        def __call__(self, ids: Any) -> Any:
            emb = nn.Embed(64, 8, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")))
            x = emb(ids)
            return -jnp.mean(jax.nn.log_softmax(emb.attend(x)))

    ids = rng.integers(0, 64, size=(2, 4)).astype(np.int32)
    params, shard = _linen_apply(M(), m, (("vocab", "axis_0"), ("embed", None)), ids, 0)
    jf = jax.jit(lambda p, i: M().apply(p, i), in_shardings=(shard, NamedSharding(m, P())), out_shardings=NamedSharding(m, P()))
    return jf, (params, ids)


@program("flax_linen_scanned_decoder_dp_tp")
def _(rng: np.random.Generator) -> Any:
    """A vocab-sharded LM with an nn.scan decoder: a mesh with a device order and two meshes."""
    jax = _jax()
    jnp = jax.numpy
    import flax.linen as nn
    from jax.sharding import NamedSharding

    m = _dp_tp("dp_tp")
    d = 16

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, _: Any) -> Any:
            h = nn.LayerNorm()(x)
            h = nn.Dense(4 * d, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))(h)
            h = nn.Dense(d, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")))(nn.gelu(h))
            return x + h, None

    class LM(nn.Module):
        @nn.compact
        def __call__(self, ids: Any) -> Any:
            emb = nn.Embed(64, d, embedding_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")))
            x = emb(ids)
            x, _ = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=3, metadata_params={nn.PARTITION_NAME: "layers"})()(x, None)
            lp = jax.nn.log_softmax(emb.attend(x))
            return -jnp.mean(jnp.take_along_axis(lp, ids[..., None], -1), axis=(1, 2))

    ids = rng.integers(0, 64, size=(2, 8)).astype(np.int32)
    params, shard = _linen_apply(LM(), m, _linen_rules(), ids, 1)
    jf = jax.jit(lambda p, i: LM().apply(p, i), in_shardings=(shard, NamedSharding(m, P("dp"))), out_shardings=NamedSharding(m, P("dp")))
    return jf, (params, ids)


@program("flax_linen_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    jax = _jax()
    import flax.linen as nn
    from jax.sharding import NamedSharding

    m = _dp_tp("tp_dp")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            h = nn.Dense(32, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                         bias_init=nn.with_logical_partitioning(nn.initializers.normal(1.0), ("mlp",)))(x)
            return nn.Dense(8, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed")))(nn.relu(h))

    x = f32(rng, 4, 8)
    params, shard = _linen_apply(MLP(), m, _linen_rules(), x, 2)
    jf = jax.jit(lambda p, x: MLP().apply(p, x), in_shardings=(shard, NamedSharding(m, P("dp"))), out_shardings=NamedSharding(m, P("dp")))
    return jf, (params, x)


@program("flax_nnx_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    jax = _jax()
    from flax import nnx
    from jax.sharding import NamedSharding

    m = _dp_tp("dp_tp")

    class MLP(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(8, 32, kernel_init=nnx.with_partitioning(init, (None, "tp")), bias_init=nnx.with_partitioning(nnx.initializers.normal(1.0), ("tp",)), rngs=rngs)
            self.down = nnx.Linear(32, 8, kernel_init=nnx.with_partitioning(init, ("tp", None)), rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.down(nnx.gelu(self.up(x)))

    with jax.set_mesh(m):  # nnx shards a variable with partitioning metadata as it is made
        model = MLP(nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    specs = nnx.get_partition_spec(state)
    shard = jax.tree_util.tree_map(lambda s: NamedSharding(m, s), specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))

    def f(state: Any, x: Any) -> Any:
        return nnx.merge(graphdef, state)(x)

    x = f32(rng, 4, 8)
    return jax.jit(f, in_shardings=(shard, NamedSharding(m, P("dp"))), out_shardings=NamedSharding(m, P("dp"))), (state, x)


@program("flax_nnx_embed_vocab_tp4")
def _(rng: np.random.Generator) -> Any:
    jax = _jax()
    jnp = jax.numpy
    from flax import nnx
    from jax.sharding import NamedSharding

    m = mesh((4,), ("tp",))

    class Tok(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.embed = nnx.Embed(32, 8, embedding_init=nnx.with_partitioning(nnx.initializers.normal(1.0), ("tp", None)), rngs=rngs)

        def __call__(self, ids: Any) -> Any:
            x = self.embed(ids)
            return jax.nn.logsumexp(self.embed.attend(x), axis=-1) + jnp.sum(x, axis=-1)

    with jax.set_mesh(m):
        model = Tok(nnx.Rngs(4))
    graphdef, state = nnx.split(model)
    specs = nnx.get_partition_spec(state)
    shard = jax.tree_util.tree_map(lambda s: NamedSharding(m, s), specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))

    def f(state: Any, ids: Any) -> Any:
        return nnx.merge(graphdef, state)(ids)

    ids = rng.integers(0, 32, size=(3, 5)).astype(np.int32)
    return jax.jit(f, in_shardings=(shard, NamedSharding(m, P())), out_shardings=NamedSharding(m, P())), (state, ids)


@program("flax_nnx_logical_mlp_dp_tp")
def _(rng: np.random.Generator) -> Any:
    """nnx with logical partitioning: logical axis names on the kernels, resolved to the mesh
    by linen's logical_axis_rules while the model is made."""
    jax = _jax()
    import flax.linen as nn
    from flax import nnx
    from jax.sharding import NamedSharding

    m = mesh((2, 2), ("data", "model"))

    class MLP(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(8, 32, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
            self.down = nnx.Linear(32, 8, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.down(nnx.relu(self.up(x)))

    with jax.set_mesh(m), nn.logical_axis_rules((("embed", None), ("mlp", "model"), ("batch", "data"))):
        model = MLP(nnx.Rngs(5))
    graphdef, state = nnx.split(model)
    shard = jax.tree_util.tree_map(lambda a: a.sharding, state)

    def f(state: Any, x: Any) -> Any:
        return nnx.merge(graphdef, state)(x)

    x = f32(rng, 4, 8)
    return jax.jit(f, in_shardings=(shard, NamedSharding(m, P("data"))), out_shardings=NamedSharding(m, P("data"))), (state, x)
