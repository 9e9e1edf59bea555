"""Adversarial pairs written with JAX: the baseline is ``jax.jit(f)``, the distributed program is
the body of a ``shard_map`` over a mesh of ``C`` devices (the program one rank runs), both
lowered with ``.lower(...).as_text(dialect="hlo")``. The body is cut out of JAX's module as it
is printed (its computation becomes the ENTRY; its reducers stay), nothing else is edited.

Needs ``JAX_PLATFORMS=cpu`` and ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (or
more) set before jax is imported; :func:`build` checks the device count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

C = 4
AXIS = "i"


@dataclass(frozen=True)
class JaxPair:
    name: str
    description: str
    shapes: tuple[tuple[int, ...], ...]  # whole input shapes (f32)
    in_specs: tuple[tuple[str | None, ...], ...]  # PartitionSpec entries per input
    out_spec: tuple[str | None, ...]
    baseline: Callable[..., Any]
    body: Callable[..., Any]
    dtypes: tuple[str, ...] = ()  # per input, default float32
    int_ranges: tuple[tuple[int, tuple[int, int]], ...] = ()  # (input, [lo, hi)) of int inputs

    def dtype(self, k: int) -> str:
        return self.dtypes[k] if k < len(self.dtypes) else "float32"

    @property
    def kind(self) -> str:
        return "bug" if self.name.startswith("b_") else "correct"

    def relations(self) -> str:
        lines = [f"# {self.name}: {self.description}\n", "groups: [[0, 1, 2, 3]]\n", "inputs:\n"]
        ranges = dict(self.int_ranges)
        for k, spec in enumerate(self.in_specs):
            extra = f", int_range: [{ranges[k][0]}, {ranges[k][1]}]" if k in ranges else ""
            lines.append(f"  - {{baseline: {k}, distributed: {k}, {_relation(spec)}{extra}}}\n")
        lines.append(f"outputs:\n  - {{baseline: 0, distributed: 0, {_relation(self.out_spec)}}}\n")
        return "".join(lines)


def _relation(spec: tuple[str | None, ...]) -> str:
    dims = [d for d, axis in enumerate(spec) if axis == AXIS]
    return f"relation: sharded, dim: {dims[0]}" if dims else "relation: duplicate"


def _jnp() -> Any:
    import jax.numpy as jnp

    return jnp


def _lax() -> Any:
    import jax

    return jax.lax


# --- column -> row MLP ------------------------------------------------------------------------


def mlp_base(x: Any, w1: Any, w2: Any) -> Any:
    import jax

    return jax.nn.gelu(x @ w1) @ w2


def _mlp(reduce: str) -> Callable[..., Any]:
    def body(x: Any, w1: Any, w2: Any) -> Any:
        import jax

        return getattr(_lax(), reduce)(jax.nn.gelu(x @ w1) @ w2, AXIS)

    return body


# --- sequence parallel: all-gather, MLP, psum_scatter --------------------------------------------


def sp_base(x: Any, w1: Any, w2: Any) -> Any:
    import jax

    return x + jax.nn.gelu(x @ w1) @ w2


def sp_body(x: Any, w1: Any, w2: Any) -> Any:
    import jax

    lax = _lax()
    full = lax.all_gather(x, AXIS, axis=0, tiled=True)
    y = lax.psum_scatter(jax.nn.gelu(full @ w1) @ w2, AXIS, scatter_dimension=0, tiled=True)
    return x + y


# --- RMSNorm over a hidden-sharded dim -------------------------------------------------------


def rms_base(x: Any, g: Any) -> Any:
    jnp = _jnp()
    return x * (1.0 / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)) * g


def _rms(reduced: bool) -> Callable[..., Any]:
    def body(x: Any, g: Any) -> Any:
        jnp = _jnp()
        if reduced:
            ms = _lax().psum(jnp.sum(x * x, axis=-1, keepdims=True), AXIS) / (x.shape[-1] * C)
        else:
            ms = jnp.mean(x * x, axis=-1, keepdims=True)
        return x * (1.0 / jnp.sqrt(ms + 1e-6)) * g

    return body


# --- multi-head attention by einsum, heads sharded --------------------------------------------

NH, HD = 4, 4


def _heads(x: Any, wq: Any, wk: Any, wv: Any, n: int) -> Any:
    import jax

    jnp = _jnp()
    s = x.shape[0]
    q = (x @ wq).reshape(s, n, HD)
    k = (x @ wk).reshape(s, n, HD)
    v = (x @ wv).reshape(s, n, HD)
    p = jax.nn.softmax(jnp.einsum("snd,tnd->nst", q, k) / jnp.sqrt(float(HD)), axis=-1)
    return jnp.einsum("nst,tnd->snd", p, v).reshape(s, n * HD)


def attn_base(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
    return _heads(x, wq, wk, wv, NH) @ wo


def attn_body(x: Any, wq: Any, wk: Any, wv: Any, wo: Any) -> Any:
    return _lax().psum(_heads(x, wq, wk, wv, NH // C) @ wo, AXIS)


# --- softmax over a sharded vocab -------------------------------------------------------------


def softmax_base(x: Any) -> Any:
    import jax

    return jax.nn.softmax(x, axis=-1)


def softmax_body(x: Any) -> Any:
    jnp, lax = _jnp(), _lax()
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), AXIS)
    e = jnp.exp(x - lax.stop_gradient(m))
    return e / lax.psum(jnp.sum(e, axis=-1, keepdims=True), AXIS)


# --- Ulysses: all-to-all from sequence-sharded to head-sharded and back --------------------------


def _self_attn(y: Any) -> Any:
    import jax

    jnp = _jnp()
    p = jax.nn.softmax(jnp.einsum("shd,thd->hst", y, y) * 0.5, axis=-1)
    return jnp.einsum("hst,thd->shd", p, y)


def ulysses_base(x: Any) -> Any:
    return _self_attn(x)


def _ulysses(split: int) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        lax = _lax()
        y = lax.all_to_all(x, AXIS, split, 0, tiled=True)  # (s, h/c, d): whole sequence
        out = _self_attn(y)
        return lax.all_to_all(out, AXIS, 0, split, tiled=True)

    return body


# --- ring all-reduce by collective-permute ------------------------------------------------------


def ring_base(x: Any) -> Any:
    return _jnp().sum(x, axis=0)


def _ring(shift: int) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        lax = _lax()
        acc = buf = _jnp().sum(x, axis=0)
        for _ in range(C - 1):
            buf = lax.ppermute(buf, AXIS, [(j, (j + shift) % C) for j in range(C)])
            acc = acc + buf
        return acc

    return body


# --- untiled all-gather ---------------------------------------------------------------------------


def gather_base(x: Any) -> Any:
    return _jnp().tanh(x)


def _gather(transposed: bool) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        jnp = _jnp()
        g = _lax().all_gather(x, AXIS, axis=0)  # (c, s/c, h)
        if transposed:
            g = jnp.transpose(g, (1, 0, 2))
        return jnp.tanh(g.reshape(C * x.shape[0], x.shape[1]))

    return body


# --- data-parallel loss mean ----------------------------------------------------------------------


def loss_base(x: Any, w: Any) -> Any:
    return _jnp().mean((x @ w) ** 2)


def _loss(reduce: str) -> Callable[..., Any]:
    def body(x: Any, w: Any) -> Any:
        return getattr(_lax(), reduce)(_jnp().mean((x @ w) ** 2), AXIS)

    return body


# --- more spellings: tuple psum, tiled all_gather along dim 1, 3-D einsum, LayerNorm statistics ---


def two_base(x: Any, w1: Any, w2: Any) -> Any:
    return x @ w1 + 2.0 * (x @ w2)


def two_body(x: Any, w1: Any, w2: Any) -> Any:
    a, b = _lax().psum((x @ w1, x @ w2), AXIS)  # one all-reduce of a tuple
    return a + 2.0 * b


def gather1_base(x: Any) -> Any:
    return _jnp().exp(x)


def gather1_body(x: Any) -> Any:
    return _jnp().exp(_lax().all_gather(x, AXIS, axis=1, tiled=True))


def einsum_base(x: Any, w: Any) -> Any:
    return _jnp().einsum("bsh,hf->bsf", x, w)


def einsum_body(x: Any, w: Any) -> Any:
    return _jnp().einsum("bsh,hf->bsf", x, w)


def ln_base(x: Any) -> Any:
    jnp = _jnp()
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5)


def _ln(global_var: bool) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        jnp, lax = _jnp(), _lax()
        n = x.shape[-1] * C
        mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), AXIS) / n
        if global_var:
            var = lax.psum(jnp.sum((x - mean) ** 2, axis=-1, keepdims=True), AXIS) / n
        else:  # the mean of the ranks' own variances: misses the spread of the local means
            var = lax.pmean(jnp.var(x, axis=-1, keepdims=True), AXIS)
        return (x - mean) / jnp.sqrt(var + 1e-5)

    return body


# --- the rank from lax.axis_index (partition-id in the HLO) ------------------------------------


def emb_base(ids: Any, table: Any) -> Any:
    return _jnp().take(table, ids, axis=0)


def _emb(shift: int) -> Callable[..., Any]:
    def body(ids: Any, table: Any) -> Any:
        jnp, lax = _jnp(), _lax()
        per = table.shape[0]
        start = lax.axis_index(AXIS) * per + shift
        mask = (ids < start) | (ids >= start + per)
        local = jnp.where(mask, 0, ids - start)
        rows = jnp.where(mask[:, None], 0.0, jnp.take(table, local, axis=0))
        return lax.psum(rows, AXIS)

    return body


def rope_base(x: Any) -> Any:
    jnp = _jnp()
    return _rope(x, jnp.arange(x.shape[0]))


def _rope(x: Any, pos: Any) -> Any:
    jnp = _jnp()
    half = x.shape[1] // 2
    ang = pos.astype(jnp.float32)[:, None] * (1.0 / 10000.0 ** (jnp.arange(half) / half))[None, :]
    x1, x2 = x[:, :half], x[:, half:]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], axis=-1)


def _rope_body(offset: bool) -> Callable[..., Any]:
    def body(x: Any) -> Any:
        jnp = _jnp()
        n = x.shape[0]
        start = _lax().axis_index(AXIS) * n if offset else 0
        return _rope(x, start + jnp.arange(n))

    return body


# --- a layer loop (lax.fori_loop over stacked weights: an HLO while) -----------------------------

L = 3


def loop_base(x: Any, w1: Any, w2: Any) -> Any:
    import jax

    def step(i: Any, h: Any) -> Any:
        return h + jax.nn.gelu(h @ w1[i]) @ w2[i]

    return _lax().fori_loop(0, L, step, x)


def _loop(shift: int) -> Callable[..., Any]:
    def body(x: Any, w1: Any, w2: Any) -> Any:
        import jax

        def step(i: Any, h: Any) -> Any:
            j = (i + shift) % L  # the down-projection of another layer when shift != 0
            return h + _lax().psum(jax.nn.gelu(h @ w1[i]) @ w2[j], AXIS)

        return _lax().fori_loop(0, L, step, x)

    return body


R, N = (AXIS, None), (None, None)
PAIRS: dict[str, JaxPair] = {
    p.name: p
    for p in (
        JaxPair("c_jax_mlp_psum", "shard_map column->row GELU MLP, psum", ((8, 16), (16, 32), (32, 16)), (N, (None, AXIS), R), N, mlp_base, _mlp("psum")),
        JaxPair("b_jax_mlp_pmax", "row-parallel MLP output reduced with pmax instead of psum", ((8, 16), (16, 32), (32, 16)), (N, (None, AXIS), R), N, mlp_base, _mlp("pmax")),
        JaxPair("b_jax_mlp_pmean", "row-parallel MLP output reduced with pmean instead of psum", ((8, 16), (16, 32), (32, 16)), (N, (None, AXIS), R), N, mlp_base, _mlp("pmean")),
        JaxPair("c_jax_sp_psum_scatter", "sequence parallel: all_gather(tiled), MLP, psum_scatter(tiled), residual", ((16, 16), (16, 32), (32, 16)), (R, (None, AXIS), R), R, sp_base, sp_body),
        JaxPair("c_jax_rmsnorm_hidden_psum", "RMSNorm over a hidden-sharded dim: psum of squares", ((8, 16), (16,)), ((None, AXIS), (AXIS,)), (None, AXIS), rms_base, _rms(True)),
        JaxPair("b_jax_rmsnorm_local_mean", "RMSNorm whose mean square is over the local hidden shard", ((8, 16), (16,)), ((None, AXIS), (AXIS,)), (None, AXIS), rms_base, _rms(False)),
        JaxPair("c_jax_heads_attention", "einsum multi-head attention, heads sharded, psum after the output projection", ((8, 16), (16, 16), (16, 16), (16, 16), (16, 16)), (N, (None, AXIS), (None, AXIS), (None, AXIS), R), N, attn_base, attn_body),
        JaxPair("c_jax_softmax_pmax", "softmax over a sharded vocab with pmax and psum", ((8, 32),), ((None, AXIS),), (None, AXIS), softmax_base, softmax_body),
        JaxPair("c_jax_ulysses_all_to_all", "Ulysses: all_to_all sequence->heads, attention, all_to_all back", ((16, 4, 4),), ((AXIS, None, None),), (AXIS, None, None), ulysses_base, _ulysses(1)),
        JaxPair("b_jax_ulysses_split_head_dim", "Ulysses all_to_all splits the head-size dim instead of the heads (DeepSpeed #5808 class)", ((16, 4, 4),), ((AXIS, None, None),), (AXIS, None, None), ulysses_base, _ulysses(2)),
        JaxPair("c_jax_ring_ppermute_sum", "ring all-reduce: c-1 ppermute steps by +1, accumulated", ((16, 8),), (R,), (None,), ring_base, _ring(1)),
        JaxPair("b_jax_ring_shift2", "ring all-reduce whose ppermute shifts by 2: some terms twice, some never", ((16, 8),), (R,), (None,), ring_base, _ring(2)),
        JaxPair("c_jax_all_gather_untiled", "untiled all_gather (c, s/c, h) reshaped to (s, h)", ((16, 8),), (R,), N, gather_base, _gather(False)),
        JaxPair("b_jax_all_gather_interleaved", "untiled all_gather transposed to (s/c, c, h) before the reshape: rows interleaved", ((16, 8),), (R,), N, gather_base, _gather(True)),
        JaxPair("c_jax_psum_tuple", "one psum of a tuple of two row-parallel partials", ((8, 16), (16, 8), (16, 8)), ((None, AXIS), R, R), N, two_base, two_body),
        JaxPair("c_jax_all_gather_tiled_axis1", "tiled all_gather along dim 1 of a column-sharded tensor", ((8, 16),), ((None, AXIS),), N, gather1_base, gather1_body),
        JaxPair("c_jax_einsum_3d_colwise", "einsum bsh,hf->bsf with the weight sharded on f (3-D activations)", ((2, 8, 16), (16, 32)), ((None, None, None), (None, AXIS)), (None, None, AXIS), einsum_base, einsum_body),
        JaxPair("c_jax_layernorm_hidden_psum", "LayerNorm statistics over a hidden-sharded dim: psum of sums and of squared deviations", ((8, 16),), ((None, AXIS),), (None, AXIS), ln_base, _ln(True)),
        JaxPair("b_jax_layernorm_pmean_of_vars", "LayerNorm variance as pmean of the ranks' own variances (misses the spread of local means)", ((8, 16),), ((None, AXIS),), (None, AXIS), ln_base, _ln(False)),
        JaxPair("c_jax_vocab_embedding_axis_index", "vocab-parallel embedding with the rank from lax.axis_index, Megatron's mask, psum", ((8,), (32, 16)), ((None,), R), N, emb_base, _emb(0), ("int32", "float32"), ((0, (0, 32)),)),
        JaxPair("b_jax_vocab_embedding_offset_plus1", "vocab-parallel embedding whose range starts at axis_index*8 + 1", ((8,), (32, 16)), ((None,), R), N, emb_base, _emb(1), ("int32", "float32"), ((0, (0, 32)),)),
        JaxPair("c_jax_rope_axis_index_positions", "rotary embedding of sequence-sharded rows at positions axis_index*s/c + arange", ((16, 8),), (R,), R, rope_base, _rope_body(True)),
        JaxPair("b_jax_rope_no_rank_offset", "rotary embedding of sequence-sharded rows at positions arange(s/c) on every rank", ((16, 8),), (R,), R, rope_base, _rope_body(False)),
        JaxPair("c_jax_fori_loop_layers", "3 MLP layers as lax.fori_loop over stacked weights (an HLO while), psum per layer", ((8, 16), (L, 16, 32), (L, 32, 16)), (N, (None, None, AXIS), (None, AXIS, None)), N, loop_base, _loop(0)),
        JaxPair("b_jax_fori_loop_layer_index", "the fori_loop layer i uses the down-projection of layer (i+1) % 3", ((8, 16), (L, 16, 32), (L, 32, 16)), (N, (None, None, AXIS), (None, AXIS, None)), N, loop_base, _loop(1)),
        JaxPair("c_jax_pmean_loss", "data-parallel mean loss: pmean of local means", ((16, 8), (8,)), (R, (None,)), (), loss_base, _loss("pmean")),
        JaxPair("b_jax_psum_loss", "data-parallel loss summed (psum) where the mean (pmean) was meant", ((16, 8), (8,)), (R, (None,)), (), loss_base, _loss("psum")),
    )
}


_BLOCK_RE = re.compile(r"^(ENTRY )?(\S+) \{$")


def _blocks(text: str) -> list[tuple[bool, str, str]]:
    """(is entry, name, text) of every computation of a printed module."""
    out: list[tuple[bool, str, str]] = []
    current: list[str] = []
    head: re.Match[str] | None = None
    for line in text.splitlines():
        m = _BLOCK_RE.match(line)
        if m:
            head, current = m, [line]
        elif head is not None:
            current.append(line)
            if line == "}":
                out.append((bool(head.group(1)), head.group(2), "\n".join(current) + "\n"))
                head = None
    return out


_FILE_RE = re.compile(r'^(\d+ )"([^"]*)"$')


def _portable_tables(text: str) -> str:
    """The debug tables JAX prints after the module header (FileNames, FunctionNames,
    FileLocations, StackFrames), file names made repository-relative (no machine path)."""
    from shardproof.engine.frontend.capture import portable_path

    root = Path(__file__).resolve().parents[2]
    lines = text.split("\n\n", 1)[1].splitlines() if "\n\n" in text else []
    out = []
    for line in lines:
        if _BLOCK_RE.match(line):
            break
        m = _FILE_RE.match(line)
        out.append(f'{m.group(1)}"{portable_path(m.group(2), root)}"' if m else line)
    return "\n".join(out).strip()


def per_rank_program(text: str, name: str) -> str:
    """The shard_map body of a lowered module as a module of its own (the body is the ENTRY)."""
    blocks = _blocks(text)
    bodies = [b for b in blocks if "manual_computation_body" in b[1]]
    if len(bodies) != 1:
        raise RuntimeError(f"{name}: expected one shard_map body, found {len(bodies)}")
    _, body_name, body = bodies[0]
    tables = _portable_tables(text)
    parts = [f"HloModule {name}\n"] + ([tables + "\n"] if tables else [])
    for is_entry, block_name, block in blocks:
        if not is_entry and block_name != body_name:
            parts.append(block)
    parts.append("ENTRY " + body.replace(f"{body_name} {{", "main {", 1))
    return "\n".join(parts)


def _portable_files(text: str) -> str:
    """Every FileNames entry of a printed module made repository-relative."""
    from shardproof.engine.frontend.capture import portable_path

    root = Path(__file__).resolve().parents[2]
    return "\n".join(f'{m.group(1)}"{portable_path(m.group(2), root)}"' if (m := _FILE_RE.match(line)) else line
                     for line in text.splitlines()) + "\n"


def write(pair: JaxPair, folder: Path) -> None:
    """Build the pair and write its lowered texts and relations into the new ``folder``
    (baseline.hlo, distributed.hlo, relations.yaml: what ``shardproof check`` reads)."""
    baseline, distributed, _, _ = build(pair)
    folder.mkdir()
    (folder / "baseline.hlo").write_text(baseline)
    (folder / "distributed.hlo").write_text(distributed)
    (folder / "relations.yaml").write_text(pair.relations())


def build(pair: JaxPair) -> tuple[str, str, str, str]:
    """(baseline text, distributed text) as lowered, and the same two after XLA's compilation
    (``.compile().as_text()``: SPMD-partitioned per-device program, fusions, layouts)."""
    import jax
    import numpy as np
    from jax import shard_map
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    if len(jax.devices()) < C:
        raise RuntimeError("set XLA_FLAGS=--xla_force_host_platform_device_count=4 before importing jax")
    mesh = Mesh(np.array(jax.devices()[:C]), (AXIS,))
    base_args = [jax.ShapeDtypeStruct(s, jax.numpy.dtype(pair.dtype(k))) for k, s in enumerate(pair.shapes)]
    base_text = jax.jit(pair.baseline).lower(*base_args).as_text(dialect="hlo", debug_info=True)
    header, _, rest = base_text.partition("\n\n")
    tables = _portable_tables(base_text)
    body = rest[rest.index(next(b for b in rest.splitlines() if _BLOCK_RE.match(b))):] if tables else rest
    baseline = header + "\n\n" + (tables + "\n\n" if tables else "") + body
    specs = [P(*s) for s in pair.in_specs]
    dist_args = [jax.ShapeDtypeStruct(s, jax.numpy.dtype(pair.dtype(k)), sharding=NamedSharding(mesh, p)) for k, (s, p) in enumerate(zip(pair.shapes, specs, strict=True))]
    mapped = shard_map(pair.body, mesh=mesh, in_specs=tuple(specs), out_specs=P(*pair.out_spec), check_vma=False)
    lowered = jax.jit(mapped).lower(*dist_args)
    whole = lowered.as_text(dialect="hlo", debug_info=True)
    base_compiled = _portable_files(jax.jit(pair.baseline).lower(*base_args).compile().as_text())
    dist_compiled = _portable_files(lowered.compile().as_text())
    return baseline, per_rank_program(whole, f"{pair.name}_rank"), base_compiled, dist_compiled
