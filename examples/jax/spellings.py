"""JAX spellings outside users write (issue 25, item 3), each a correct model and its bug twin.

Each distributed program is written per device in ``shard_map`` as the JAX documentation and
common JAX code write it; a bug variant differs from the correct model only on the line marked
``# BUG-SITE: <variant>``.

- ``collective_matmul_minus``: the shard_map tutorial's all-gather collective matmul: x blocks go
  to the next rank, the update lands at rows ``((idx - i) % c) * chunk`` (a fori_loop);
- ``collective_matmul_plus1``: x blocks go to the previous rank; after step i's permute the rank
  holds block (idx + i + 1) mod c and writes it at ``((idx + i + 1) % c) * chunk``, its own last;
- ``ring_running_sum``: a ring all-reduce that forwards its running sum (rank r adds what rank
  r - 1 has summed so far) instead of the block it received;
- ``ulysses_untiled``: Ulysses attention with ``all_to_all(..., tiled=False)`` (the split axis
  becomes a new leading axis, reshaped away by hand);
- ``moe_argmax_routing``: top-1 MoE routing with a vmapped ``jnp.argmax`` (JAX's NaN-first
  combine), experts tensor-parallel;
- ``ring_attention``: ring attention (context parallelism): queries stay, key/value blocks pass to
  the next rank, an online softmax (running max, rescaled denominator and numerator) folds each;
- ``ring_attention_causal`` / ``_finfo`` / ``_bias``: the same with a causal mask built from
  ``lax.axis_index`` positions, masked scores -inf / ``finfo.min`` / the mask added as a bias.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel


def _matmul(x: Any, w: Any) -> Any:
    return x @ w


def collective_matmul_minus(ctx: JaxContext) -> JaxModel:
    """All-gather collective matmul (the shard_map tutorial's form): rank idx holds x block idx;
    at step i it holds block (idx - i) mod c and writes its product there."""
    m, k, n, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("out", 16), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(lhs: Any, rhs: Any) -> Any:
        size = jax.lax.psum(1, "tp")
        idx = jax.lax.axis_index("tp")
        chunk = lhs.shape[0]

        def step(i: Any, carry: Any) -> Any:
            accum, lhs = carry
            update = lhs @ rhs
            lhs = jax.lax.ppermute(lhs, "tp", perm=[(j, (j + 1) % size) for j in range(size)])
            return jax.lax.dynamic_update_slice(accum, update, ((((idx + i) % size) if bug == "cm_minus_sign" else ((idx - i) % size)) * chunk, 0)), lhs  # BUG-SITE: cm_minus_sign

        accum = jnp.zeros((chunk * size, rhs.shape[1]), lhs.dtype)
        accum, lhs = jax.lax.fori_loop(0, size - 1, step, (accum, lhs), unroll=True)
        i = size - 1
        return jax.lax.dynamic_update_slice(accum, lhs @ rhs, (((idx - i) % size) * chunk, 0))

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")), out_specs=P(None, "tp"), check_vma=False)
    return JaxModel(_matmul, dist, mesh, [JaxInput("x", (m, k), spec=("tp", None)), JaxInput("w", (k, n), spec=(None, "tp"))],
                    outputs=[(None, "tp")], description=f"collective matmul, (idx - i) % c, fori_loop, {c} ranks")


def collective_matmul_plus1(ctx: JaxContext) -> JaxModel:
    """All-gather collective matmul with x blocks passed to the previous rank: after step i's
    permute the rank holds block (idx + i + 1) mod c; its own block's product is written last."""
    m, k, n, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("out", 16), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def per_device(lhs: Any, rhs: Any) -> Any:
        idx = jax.lax.axis_index("tp")
        chunk = lhs.shape[0]
        own = lhs @ rhs
        accum = jnp.zeros((chunk * c, rhs.shape[1]), lhs.dtype)
        for i in range(c - 1):
            lhs = jax.lax.ppermute(lhs, "tp", perm=[(j, (j - 1) % c) for j in range(c)])
            accum = jax.lax.dynamic_update_slice(accum, lhs @ rhs, ((((idx + i) % c) if bug == "cm_plus1_dropped" else ((idx + i + 1) % c)) * chunk, 0))  # BUG-SITE: cm_plus1_dropped
        return jax.lax.dynamic_update_slice(accum, own, (idx * chunk, 0))

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")), out_specs=P(None, "tp"), check_vma=False)
    return JaxModel(_matmul, dist, mesh, [JaxInput("x", (m, k), spec=("tp", None)), JaxInput("w", (k, n), spec=(None, "tp"))],
                    outputs=[(None, "tp")], description=f"collective matmul, (idx + i + 1) % c, {c} ranks")


def ring_running_sum(ctx: JaxContext) -> JaxModel:
    """A ring all-reduce forwarding its running sum: after step k rank r holds the parts of ranks
    r, r - 1, ..., r - k, and sends that sum on; rank r ends with the parts of all ranks once only
    when each step adds the received sum to the rank's own part, not to its running sum."""
    rows, d, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def per_device(x: Any) -> Any:
        part = x.sum(axis=0)
        acc = part
        for _ in range(c - 1):
            got = jax.lax.ppermute(acc, "tp", [(i, (i + 1) % c) for i in range(c)])
            acc = (acc + got) if bug == "running_sum_doubled" else (part + got)  # BUG-SITE: running_sum_doubled
        return acc

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (rows, d), spec=("tp", None))], description=f"ring all-reduce forwarding its running sum, {c} ranks")


def ulysses_untiled(ctx: JaxContext) -> JaxModel:
    """Ulysses sequence parallelism with untiled all_to_all: the heads are split into a new
    leading axis of c groups, exchanged, and the received sequence blocks merged by a reshape."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 8), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        def to_heads(t: Any) -> Any:  # [s/c, h, hd] -> [s, h/c, hd]
            g = t.reshape(s // c, c, h // c, hd).transpose(1, 0, 2, 3)  # [c, s/c, h/c, hd]
            return jax.lax.all_to_all(g, "sp", split_axis=0, concat_axis=0).reshape(s, h // c, hd)

        def to_seq(t: Any) -> Any:  # [s, h/c, hd] -> [s/c, h, hd]
            g = t.reshape(s // c, c, h // c, hd).transpose(1, 0, 2, 3) if bug == "untiled_seq_interleaved" else t.reshape(c, s // c, h // c, hd)  # BUG-SITE: untiled_seq_interleaved
            got = jax.lax.all_to_all(g, "sp", split_axis=0, concat_axis=0)  # [c (head group), s/c, h/c, hd]
            return got.transpose(1, 0, 2, 3).reshape(s // c, h, hd)

        return to_seq(attn(to_heads(q), to_heads(k), to_heads(v)))

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"Ulysses attention with untiled all_to_all, SP {c}")


def moe_argmax_routing(ctx: JaxContext) -> JaxModel:
    """Top-1 MoE routing with a vmapped jnp.argmax over the router logits (JAX's NaN-first
    combine in a tuple-shaped reduce per token), experts tensor-parallel: every rank routes all
    tokens, runs its columns of every expert on the tokens routed there, and the psum combines."""
    t, d, e, f, c = ctx.knob("tokens", 8), ctx.knob("hidden", 16), ctx.knob("experts", 4), ctx.knob("ffn", 32), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def experts(x: Any, choice: Any, w1: Any, w2: Any) -> Any:
        y = jnp.zeros((x.shape[0], w2.shape[2]), x.dtype)
        for j in range(e):
            y = y + jnp.where((choice == j)[:, None], jnp.tanh(x @ w1[j]) @ w2[j], 0.0)
        return y

    def moe(x: Any, wr: Any, w1: Any, w2: Any) -> Any:
        return experts(x, jax.vmap(jnp.argmax)(x @ wr), w1, w2)

    def per_device(x: Any, wr: Any, w1: Any, w2: Any) -> Any:
        choice = jax.vmap(jnp.argmin if bug == "routing_argmin" else jnp.argmax)(x @ wr)  # BUG-SITE: routing_argmin
        return jax.lax.psum(experts(x, choice, w1, w2), "tp")

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(), P(), P(None, None, "tp"), P(None, "tp", None)), out_specs=P(), check_vma=False)
    return JaxModel(moe, dist, mesh, [JaxInput("x", (t, d)), JaxInput("wr", (d, e)), JaxInput("w1", (e, d, f), spec=(None, None, "tp")), JaxInput("w2", (e, f, d), spec=(None, "tp", None))],
                    description=f"top-1 MoE, vmapped argmax routing, {e} experts tensor-parallel over TP {c}")


def ring_attention(ctx: JaxContext) -> JaxModel:
    """Ring attention (context parallelism) in shard_map: queries stay, key/value blocks go to the
    next rank each step, an online softmax (running max, denominator, numerator) folds each block."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 2), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        p = jax.nn.softmax(jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        nxt = [(j, (j + 1) % c) for j in range(c)]
        m = den = acc = None
        for step in range(c):
            if step:
                k, v = jax.lax.ppermute(k, "sp", nxt), jax.lax.ppermute(v, "sp", nxt)
            scores = jnp.einsum("qhd,khd->hqk", q, k) / (hd if bug == "ring_scale_by_d" else math.sqrt(hd))  # BUG-SITE: ring_scale_by_d
            bmax = scores.max(axis=-1, keepdims=True)
            if m is None:
                m = bmax
                p = jnp.exp(scores - m)
                den, acc = p.sum(axis=-1, keepdims=True), jnp.einsum("hqk,khd->hqd", p, v)
                continue
            m_new = jnp.maximum(m, bmax)
            scale = jnp.exp(m - m_new)
            p = jnp.exp(scores - m_new)
            den = den * scale + p.sum(axis=-1, keepdims=True)
            acc = acc * scale + jnp.einsum("hqk,khd->hqd", p, v)
            m = m_new
        return (acc / den).transpose(1, 0, 2)

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"ring attention in shard_map, SP {c}")


def _bf16_scores(q: Any, k: Any, form: str) -> Any:
    """f32 attention scores of bf16 queries and keys, in the three forms mixed-precision JAX code
    writes them: a bf16 dot accumulated into f32 (``preferred_element_type``), the operands
    widened first (the ``ringattention`` package's ``float32_logits``), or a bf16 dot widened
    after (its result rounded to bf16 once, element by element, as in the baseline)."""
    f32 = jnp.float32
    if form == "preferred":
        return jnp.einsum("qhd,khd->hqk", q, k, preferred_element_type=f32)
    if form == "f32_logits":
        return jnp.einsum("qhd,khd->hqk", q.astype(f32), k.astype(f32))
    return jnp.einsum("qhd,khd->hqk", q, k).astype(f32)


def _ring_attention_bf16(ctx: JaxContext, form: str) -> JaxModel:
    """Ring attention in bf16 as mixed-precision JAX code writes it: q, k, v in bf16, f32 scores
    (``_bf16_scores``), the running max, denominator and numerator in f32 (v enters its dot
    widened, exactly: jnp promotes it against the f32 weights), the output cast to bf16 once, at
    the end (the ``ringattention`` package's forward). The baseline is plain softmax attention in
    the same precision: f32 scores, f32 softmax and dot with v, one cast to bf16. Both round to
    bf16 at the same points only, so the ring equals it in the real-number model of `verified`;
    code that rounds per block (probabilities cast to bf16 before their dot with v, as flash
    attention kernels do) is not equal to any single-device softmax and is not this model."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 2), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant
    f32 = jnp.float32

    def attn(q: Any, k: Any, v: Any) -> Any:
        if form == "bf16_max":
            p = jax.nn.softmax((jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)).astype(f32), axis=-1)
        else:
            p = jax.nn.softmax(_bf16_scores(q, k, form) / math.sqrt(hd), axis=-1)
        return jnp.einsum("hqk,khd->qhd", p, v).astype(q.dtype)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        nxt = [(j, (j + 1) % c) for j in range(c)]
        m = den = acc = None
        # The type the exp terms enter their dot with v in (a no-op cast when f32).
        weights = jnp.bfloat16 if bug == "ring_bf16_probs_cast" else f32  # BUG-SITE: ring_bf16_probs_cast
        for step in range(c):
            if step:
                k, v = jax.lax.ppermute(k, "sp", nxt), jax.lax.ppermute(v, "sp", nxt)
            if form == "bf16_max":  # the block max taken on the bf16 scores, then widened
                low = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
                scores, bmax = low.astype(f32), low.max(axis=-1, keepdims=True).astype(f32)
            else:
                scores = _bf16_scores(q, k, form) / math.sqrt(hd)
                bmax = scores.max(axis=-1, keepdims=True)
            if m is None:
                m = bmax
                p = jnp.exp(scores - m)
                den, acc = p.sum(axis=-1, keepdims=True), jnp.einsum("hqk,khd->hqd", p.astype(weights), v, preferred_element_type=f32)
                continue
            m_new = jnp.maximum(m, bmax)
            scale = jnp.exp(m - m_new)
            p = jnp.exp(scores - m_new)
            den = (den * scale + p.sum(axis=-1, keepdims=True)).astype(jnp.bfloat16 if bug == "ring_bf16_denominator" else f32)  # BUG-SITE: ring_bf16_denominator
            acc = (acc if bug == "ring_bf16_no_rescale" else acc * scale) + jnp.einsum("hqk,khd->hqd", p.astype(weights), v, preferred_element_type=f32)  # BUG-SITE: ring_bf16_no_rescale
            m = m_new
        return (acc / den).transpose(1, 0, 2).astype(q.dtype)

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), "bfloat16", spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"ring attention in bf16 ({form} f32 scores, f32 statistics), shard_map, SP {c}")


def ring_attention_bf16(ctx: JaxContext) -> JaxModel:
    """Ring attention in bf16, scores accumulated into f32 by ``preferred_element_type``."""
    return _ring_attention_bf16(ctx, "preferred")


def ring_attention_bf16_f32_logits(ctx: JaxContext) -> JaxModel:
    """Ring attention in bf16, queries and keys widened to f32 before the scores."""
    return _ring_attention_bf16(ctx, "f32_logits")


def ring_attention_bf16_scores_upcast(ctx: JaxContext) -> JaxModel:
    """Ring attention in bf16, the scores a bf16 dot widened to f32 after."""
    return _ring_attention_bf16(ctx, "upcast")


def _ring_attention_causal(ctx: JaxContext, fill: float, bias: bool = False) -> JaxModel:
    """Causal ring attention (context parallelism) in shard_map: rank r keeps query block r and at
    step k holds key/value block (r - k) mod c; the causal mask compares absolute positions built
    from ``lax.axis_index`` (queries r*b + iota, keys ((r - k) mod c)*b + iota), masked scores get
    ``fill`` (-inf, or flax's finfo(dtype).min), and the online softmax starts from the diagonal
    block (step 0), which keeps a key in every query row, so the running max is finite from the
    first step on."""
    s, h, hd, c = ctx.knob("seq", 16), ctx.knob("heads", 2), ctx.knob("head_dim", 8), ctx.knob("tp", 4)
    mesh = ctx.mesh({"sp": c})
    bug = ctx.variant

    def attn(q: Any, k: Any, v: Any) -> Any:
        pos = jnp.arange(s)
        scores = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        if bias:  # ringattention's form: the float mask of the keys after the query, times fill
            scores = scores + (pos[:, None] < pos[None, :]).astype(scores.dtype) * fill
        else:
            scores = jnp.where(pos[:, None] >= pos[None, :], scores, fill)
        return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1), v)

    def per_device(q: Any, k: Any, v: Any) -> Any:
        b = q.shape[0]
        idx = jax.lax.axis_index("sp")
        q_pos = idx * b + jnp.arange(b)
        nxt = [(j, (j + 1) % c) for j in range(c)]
        m = den = acc = None
        for step in range(c):
            if step:
                k, v = jax.lax.ppermute(k, "sp", nxt), jax.lax.ppermute(v, "sp", nxt)
            k_pos = ((idx - step) % c) * b + jnp.arange(b)
            if bug == "ring_causal_offset":
                k_pos = k_pos + b  # BUG-SITE: ring_causal_offset
            scores = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
            keep = (q_pos[:, None] > k_pos[None, :]) if bug == "ring_causal_gt" else (q_pos[:, None] >= k_pos[None, :])  # BUG-SITE: ring_causal_gt
            scores = (scores + (~keep).astype(scores.dtype) * fill) if bias else jnp.where(keep, scores, fill)
            bmax = scores.max(axis=-1, keepdims=True)
            if m is None:
                m = bmax
                p = jnp.exp(scores - m)
                den, acc = p.sum(axis=-1, keepdims=True), jnp.einsum("hqk,khd->hqd", p, v)
                continue
            m_new = jnp.maximum(m, bmax)
            scale = jnp.exp(m - m_new)
            p = jnp.exp(scores - m_new)
            den = den * scale + p.sum(axis=-1, keepdims=True)
            acc = acc * scale + jnp.einsum("hqk,khd->hqd", p, v)
            m = m_new
        return (acc / den).transpose(1, 0, 2)

    spec = ("sp", None, None)
    dist = shard_map(per_device, mesh=mesh, in_specs=(P(*spec),) * 3, out_specs=P(*spec), check_vma=False)
    return JaxModel(attn, dist, mesh, [JaxInput(n, (s, h, hd), spec=spec) for n in ("q", "k", "v")], outputs=[spec],
                    description=f"causal ring attention in shard_map, masked scores {fill}, SP {c}")


def ring_attention_causal(ctx: JaxContext) -> JaxModel:
    """Causal ring attention, masked scores -inf (``jnp.where(q_pos >= k_pos, s, -jnp.inf)``)."""
    return _ring_attention_causal(ctx, -jnp.inf)


def ring_attention_causal_finfo(ctx: JaxContext) -> JaxModel:
    """Causal ring attention, masked scores ``jnp.finfo(dtype).min`` (flax's big negative)."""
    return _ring_attention_causal(ctx, float(jnp.finfo(jnp.float32).min))


def ring_attention_causal_bias(ctx: JaxContext) -> JaxModel:
    """Causal ring attention with the mask added as a bias: ``scores + mask * finfo.min`` (the
    float mask of the keys after the query, as the ringattention package writes it)."""
    return _ring_attention_causal(ctx, float(jnp.finfo(jnp.float32).min), bias=True)


def ring_attention_bf16_max(ctx: JaxContext) -> JaxModel:
    """Ring attention in bf16, scores scaled in bf16, each block's max taken in bf16, widened."""
    return _ring_attention_bf16(ctx, "bf16_max")


def ring_allreduce_roll(ctx: JaxContext) -> JaxModel:
    """A ring all-reduce on the chunks as a (c, w) array, rolled by the rank with ``jnp.roll`` so
    that the chunk a rank sends at step k is always row k (row k of ``mine`` is chunk
    (r + k) mod c); the ring turns towards the previous rank. After c - 1 steps row c - 1 is
    reduced; it is passed round again, and the gathered rows, stacked, are rolled back."""
    rows, d, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    w = d // c
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant
    back = [(i, (i - 1) % c) for i in range(c)]

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def per_device(x: Any) -> Any:
        r = jax.lax.axis_index("tp")
        mine = jnp.roll(x.sum(axis=0).reshape(c, w), -r, axis=0)
        for k in range(c - 1):  # reduce-scatter: rank r + 1's row k is chunk (r + 1 + k) mod c
            mine = mine.at[k + 1].add(jax.lax.ppermute(mine[k], "tp", back))
        out = [mine[c - 1]]  # chunk (r - 1) mod c, summed over every rank
        for _ in range(c - 1):
            out.append(jax.lax.ppermute(out[-1], "tp", back))
        full = jnp.stack(out)  # row i: chunk (r - 1 + i) mod c
        return jnp.roll(full, r if bug == "roll_back_off_by_one" else r - 1, axis=0).reshape(d)  # BUG-SITE: roll_back_off_by_one

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (rows, d), spec=("tp", None))], description=f"ring all-reduce with jnp.roll chunk rows, {c} ranks")
