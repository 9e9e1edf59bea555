"""Ring collectives as JAX users write them (issue 15, scope 2), each with mutants.

- ``ring_allreduce_bw``: the bandwidth-optimal ring all-reduce: the term is cut into c chunks; a
  reduce-scatter phase (c - 1 steps: send chunk (r - k) mod c, add the received chunk into
  chunk (r - k - 1) mod c) and an all-gather phase (c - 1 steps passing the reduced chunks),
  with dynamic-slice / dynamic-update-slice at rank-affine chunk offsets.
- ``ring_allreduce_roll``: the static-index form: the chunks as a (c, w) array, rolled by the
  rank so that the chunk a rank sends is always row 0 (what jnp.roll users write).
- ``collective_matmul``: the shard_map tutorial's all-gather collective matmul: at step k the
  rank multiplies the x block it holds, block (r + k) mod c, into output rows (r + k) mod c,
  then passes its x block to the previous rank.
- ``collective_matmul_rs``: the reduce-scatter variant: the accumulator moves, every step adds
  the rank's partial product for the block the accumulator belongs to.

Mutants (``ctx.variant``): ``wrong_chunk`` (an index off by one), ``one_step_short``,
``wrong_direction`` (the permute sends to the previous rank instead of the next, or back).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import shard_map
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel


def _perm(c: int, step: int) -> list[tuple[int, int]]:
    return [(i, (i + step) % c) for i in range(c)]


def ring_allreduce_bw(ctx: JaxContext) -> JaxModel:
    n, d, c, dt = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4), ctx.knob("dtype", "float32")
    w = d // c
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def per_device(x: Any) -> Any:
        r = jax.lax.axis_index("tp")
        buf = x.sum(axis=0)
        fwd = _perm(c, -1 if bug == "wrong_direction" else 1)
        steps = c - 2 if bug == "one_step_short" else c - 1
        for k in range(steps):  # reduce-scatter
            send = jax.lax.dynamic_slice(buf, (((r - k) % c) * w,), (w,))
            got = jax.lax.ppermute(send, "tp", fwd)
            at = ((r - k - (0 if bug == "wrong_chunk" else 1)) % c) * w
            buf = jax.lax.dynamic_update_slice(buf, jax.lax.dynamic_slice(buf, (at,), (w,)) + got, (at,))
        for k in range(c - 1):  # all-gather: chunk (r + 1) mod c is complete on rank r
            send = jax.lax.dynamic_slice(buf, (((r + 1 - k) % c) * w,), (w,))
            got = jax.lax.ppermute(send, "tp", _perm(c, 1))
            buf = jax.lax.dynamic_update_slice(buf, got, (((r - k) % c) * w,))
        return buf

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (n, d), dtype=dt, spec=("tp", None))],
                    description=f"bandwidth-optimal ring all-reduce (reduce-scatter + all-gather), {c} ranks, {dt}")


def ring_allreduce_roll(ctx: JaxContext) -> JaxModel:
    n, d, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4)
    w = d // c
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def per_device(x: Any) -> Any:
        r = jax.lax.axis_index("tp")
        chunks = x.sum(axis=0).reshape(c, w)
        # Row j of `mine` is chunk (r - j) mod c: the chunk sent at step j is always row j.
        mine = jnp.roll(chunks[::-1], r + 1, axis=0)
        fwd = _perm(c, -1 if bug == "wrong_direction" else 1)
        steps = c - 2 if bug == "one_step_short" else c - 1
        for k in range(steps):
            got = jax.lax.ppermute(mine[k], "tp", fwd)
            j = k + (0 if bug == "wrong_chunk" else 1)
            mine = mine.at[j].add(got)
        # Row c-1 = chunk (r + 1) mod c is complete; pass it around (all-gather).
        done, out = mine[c - 1], [mine[c - 1]]
        for _ in range(c - 1):
            done = jax.lax.ppermute(done, "tp", _perm(c, 1))
            out.append(done)
        # out[k] is chunk (r + 1 - k) mod c: put it in place.
        full = jnp.stack(out[::-1])  # row j: chunk (r + 1 - (c - 1 - j)) = (r + 2 + j) mod c
        return jnp.roll(full, r + 2, axis=0).reshape(d)

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (n, d), spec=("tp", None))],
                    description=f"ring all-reduce with jnp.roll chunk order, {c} ranks")


def ring_allreduce_rows(ctx: JaxContext) -> JaxModel:
    """The ring all-reduce on (c, w) chunk rows, rotated by the rank in another spelling than
    ``jnp.roll`` (knob ``form``): ``take`` (``jnp.take(chunks, (iota + r) % c, axis=0)``),
    ``getitem`` (``chunks[(iota + r) % c]``), ``index`` (c rows read by
    ``lax.dynamic_index_in_dim(chunks, (j + r) % c, 0)``, stacked), ``flat`` (the chunks kept
    as one vector, ``jnp.roll`` by ``-w * r``, blocks ``buf[k*w:(k+1)*w]``, ``.at[...].add``,
    ``jnp.concatenate``), ``static`` (a literal ``jnp.roll`` of the reversed
    rows, then the rank's rotation by ``jnp.roll``). Row k of ``mine`` is chunk (r + k) mod c; the
    ring turns towards the previous rank; the reduced rows are rotated back the same way."""
    n, d, c, form = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("tp", 4), ctx.knob("form", "take")
    w = d // c
    dp = ctx.knob("dp", 1)  # a data-parallel axis before the ring's: the ring runs within each group
    mesh = ctx.mesh({"dp": dp, "tp": c} if dp > 1 else {"tp": c})
    bug = ctx.variant
    back = _perm(c, -1)

    def rotate(a: Any, shift: Any) -> Any:  # row j of the result is row (j + shift) mod c of a
        idx = (jnp.arange(c) + shift) % c
        if form == "take":
            return jnp.take(a, idx, axis=0)
        if form == "getitem":
            return a[idx]
        if form == "index":  # c rows read at per-rank starts, stacked
            return jnp.stack([jax.lax.dynamic_index_in_dim(a, (j + shift) % c, 0, keepdims=False) for j in range(c)])
        return jnp.roll(jnp.roll(a[::-1], 1, axis=0)[::-1], -shift - 1, axis=0)  # static: reverse, roll 1, reverse

    def base(x: Any) -> Any:
        return x.sum(axis=0)

    def flat(x: Any) -> Any:  # the chunks as one vector: blocks of w rolled by multiples of w
        r = jax.lax.axis_index("tp")
        buf = jnp.roll(x.sum(axis=0), -w * r)  # block k: chunk (r + k) mod c
        for k in range(c - 1):
            got = jax.lax.ppermute(buf[k * w:(k + 1) * w], "tp", _perm(c, 1) if bug == "wrong_direction" else back)
            j = k + (0 if bug == "wrong_chunk" else 1)
            buf = buf.at[j * w:(j + 1) * w].add(got)
        out = [buf[(c - 1) * w:]]
        for _ in range(c - 1):
            out.append(jax.lax.ppermute(out[-1], "tp", back))
        return jnp.roll(jnp.concatenate(out), w * (r - 1 + (1 if bug == "off_by_one" else 0)))

    def per_device(x: Any) -> Any:
        if form == "flat":
            return flat(x)
        r = jax.lax.axis_index("tp")
        mine = rotate(x.sum(axis=0).reshape(c, w), r)
        for k in range(c - 1):
            got = jax.lax.ppermute(mine[k], "tp", _perm(c, 1) if bug == "wrong_direction" else back)
            mine = mine.at[k + (0 if bug == "wrong_chunk" else 1)].add(got)
        out = [mine[c - 1]]
        for _ in range(c - 1):
            out.append(jax.lax.ppermute(out[-1], "tp", back))
        return rotate(jnp.stack(out), 1 - r + (1 if bug == "off_by_one" else 0)).reshape(d)

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None),), out_specs=P(), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (n, d), spec=("tp", None))], group_axes=("tp",),
                    description=f"ring all-reduce, chunk rows rotated by {form}, {c} ranks" + (f", {dp} groups" if dp > 1 else ""))


def collective_matmul(ctx: JaxContext) -> JaxModel:
    m, k_, n, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("out", 16), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any, wt: Any) -> Any:
        return x @ wt

    def per_device(x: Any, wt: Any) -> Any:
        r = jax.lax.axis_index("tp")
        b = x.shape[0]
        acc = jnp.zeros((b * c, wt.shape[1]), x.dtype)
        back = _perm(c, 1 if bug == "wrong_direction" else -1)
        steps = c - 1 if bug == "one_step_short" else c
        for i in range(steps):  # rank r holds x block (r + i) mod c at step i
            at = ((r + i + (1 if bug == "wrong_chunk" else 0)) % c) * b
            acc = jax.lax.dynamic_update_slice(acc, x @ wt, (at, 0))
            if i < c - 1:
                x = jax.lax.ppermute(x, "tp", back)
        return acc

    dist = shard_map(per_device, mesh=mesh, in_specs=(P("tp", None), P(None, "tp")), out_specs=P(None, "tp"), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (m, k_), spec=("tp", None)), JaxInput("w", (k_, n), spec=(None, "tp"))],
                    outputs=[(None, "tp")], description=f"collective matmul (all-gather of x overlapped), {c} ranks")


def collective_matmul_rs(ctx: JaxContext) -> JaxModel:
    m, k_, n, c = ctx.knob("rows", 16), ctx.knob("hidden", 8), ctx.knob("out", 16), ctx.knob("tp", 4)
    mesh = ctx.mesh({"tp": c})
    bug = ctx.variant

    def base(x: Any, wt: Any) -> Any:
        return x @ wt

    def per_device(x: Any, wt: Any) -> Any:
        # x: all rows, contracting dim sharded; w: its rows. Output rows sharded.
        r = jax.lax.axis_index("tp")
        b = x.shape[0] // c
        fwd = _perm(c, -1 if bug == "wrong_direction" else 1)
        steps = c - 1 if bug == "one_step_short" else c
        acc = None
        for i in range(steps):  # the accumulator a rank holds at step i is for rows (r - i - 1) mod c
            blk = (r - i - 1 + (1 if bug == "wrong_chunk" else 0)) % c
            part = jax.lax.dynamic_slice(x, (blk * b, 0), (b, x.shape[1])) @ wt
            acc = part if acc is None else acc + part
            if i < c - 1:
                acc = jax.lax.ppermute(acc, "tp", fwd)
        return acc  # after c steps: rows (r - c) mod c = r

    dist = shard_map(per_device, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp", None), check_vma=False)
    return JaxModel(base, dist, mesh, [JaxInput("x", (m, k_), spec=(None, "tp")), JaxInput("w", (k_, n), spec=("tp", None))],
                    outputs=[("tp", None)], description=f"collective matmul, reduce-scatter form (moving accumulator), {c} ranks")
