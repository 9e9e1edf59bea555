"""Interleaved 1F1B (Megatron's virtual pipeline stages): the model's ``layers`` residual blocks
are cut into ``pp * vp`` chunks and rank r owns chunks r, r + pp, r + 2·pp, ... (non-adjacent
stages), so an activation goes around the ranks ``vp`` times, rank pp-1 sending back to rank 0
between laps. Each rank runs Megatron's interleaved schedule over ``microbatches`` (a multiple
of ``pp``): (pp - r - 1)·2 + (vp - 1)·pp warm-up forwards, then one forward and one backward,
then the remaining backwards; the k-th forward of a rank is chunk (k // pp) mod vp of
microbatch (k // (pp·vp))·pp + k mod pp, backwards visit the chunks in reverse. Transfers are
``isend``/``irecv``. Each microbatch's loss is scaled by 1/M and every gradient accumulated.

The single-device baseline is the same training step (loss and every parameter's gradient),
returning the gradients in the order the ranks hold them (rank 0's chunks, then rank 1's, ...).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from gpipe import Block

from shardproof.engine.frontend.declare import BuildContext, Input
from shardproof.engine.frontend.pipeline import Pipeline


def chunks_of(rank: int, pp: int, vp: int, variant: str = "") -> list[int]:
    if variant == "contiguous_chunks":
        return [rank * vp + j for j in range(vp)]  # BUG-SITE: contiguous_chunks (rank r holds chunks r·vp .. r·vp + vp - 1, yet sends along the interleaved ring)
    return [rank + j * pp for j in range(vp)]


def chunk_layers(chunk: int, layers: int, pp: int, vp: int) -> list[int]:
    per = layers // (pp * vp)
    return list(range(chunk * per, (chunk + 1) * per))


def _owned(rank: int, layers: int, pp: int, vp: int, variant: str = "") -> list[int]:
    return [i for c in chunks_of(rank, pp, vp, variant) for i in chunk_layers(c, layers, pp, vp)]


class Baseline(nn.Module):
    """The single-device training step; gradients in the ranks' order, then the loss."""

    def __init__(self, hidden: int, layers: int, pp: int, vp: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden) for _ in range(layers))
        self.head = nn.Linear(hidden, hidden)
        order = [i for r in range(pp) for i in _owned(r, layers, pp, vp)]
        self.order = [f"layers.{i}.fc.{w}" for i in order for w in ("weight", "bias")]
        self.order += ["head.weight", "head.bias"]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for layer in self.layers:
            x = layer(x)
        y = self.head(x)
        loss = (y * y).mean()
        params = dict(self.named_parameters())
        return (*torch.autograd.grad(loss, [params[n] for n in self.order]), loss)


class Rank(nn.Module):
    """What rank ``rank`` runs: its chunks' blocks (the last chunk's owner also the head)."""

    def __init__(self, hidden: int, layers: int, rank: int, pp: int, vp: int, microbatches: int, variant: str) -> None:
        super().__init__()
        self.rank, self.pp, self.vp, self.m, self.variant = rank, pp, vp, microbatches, variant
        self.chunks = chunks_of(rank, pp, vp, variant)
        self.chunk_blocks = {c: chunk_layers(c, layers, pp, vp) for c in self.chunks}
        self.layers = nn.ModuleDict({str(i): Block(hidden) for c in self.chunks for i in self.chunk_blocks[c]})
        self.last_chunk = pp * vp - 1
        if self.last_chunk in self.chunks:
            self.head = nn.Linear(hidden, hidden)

    def _ids(self, k: int, backward: bool) -> tuple[int, int]:
        """(local chunk index, microbatch) of this rank's k-th forward (backward)."""
        pp, vp = self.pp, self.vp
        j = (k // pp) % vp
        return (vp - 1 - j if backward else j), (k // (pp * vp)) * pp + k % pp

    def _chunk_params(self, c: int) -> list[tuple[str, torch.Tensor]]:
        own = [(n, p) for n, p in self.named_parameters() if n.startswith("layers.") and int(n.split(".")[1]) in self.chunk_blocks[c]]
        if c == self.last_chunk:
            own += [(n, p) for n, p in self.named_parameters() if n.startswith("head.")]
        return own

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pp, rank = self.pp, self.rank
        nxt, prev = (rank + 1) % pp, (rank - 1) % pp
        mbs = x.chunk(self.m)
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        grads: dict[str, torch.Tensor] = {}
        total: torch.Tensor | None = None

        def run_forward(k: int) -> None:
            nonlocal total
            j, mb = self._ids(k, backward=False)
            c = self.chunks[j]
            if c == 0:
                h = mbs[mb]
            else:
                h = torch.empty(mbs[mb].shape, dtype=x.dtype, device=x.device)
                dist.irecv(h, src=prev).wait()  # recv_forward
                h.requires_grad_()
            inputs[(j, mb)] = h
            for i in self.chunk_blocks[c]:
                h = self.layers[str(i)](h)
            if c == self.last_chunk:
                y = self.head(h)
                h = (y * y).mean() / self.m  # each microbatch's loss / M
                total = h if total is None else total + h
            else:
                dist.isend(h, dst=nxt).wait()  # send_forward
            outputs[(j, mb)] = h

        def run_backward(k: int) -> None:
            j, mb = self._ids(k, backward=True)
            c = self.chunks[j]
            upstream = None
            if c != self.last_chunk:
                upstream = torch.empty(outputs[(j, mb)].shape, dtype=x.dtype, device=x.device)
                dist.irecv(upstream, src=nxt).wait()  # recv_backward
            named = self._chunk_params(c)
            wrt = [p for _, p in named] + ([inputs[(j, mb)]] if c > 0 else [])
            got = list(torch.autograd.grad(outputs[(j, mb)], wrt, grad_outputs=upstream))
            if c > 0:
                dist.isend(got.pop(), dst=prev).wait()  # send_backward
            for (name, _), g in zip(named, got, strict=True):
                grads[name] = g if name not in grads else grads[name] + g  # accumulated over microbatches

        n = self.m * self.vp
        warmup = min((pp - rank - 1) * 2 + (self.vp - 1) * pp, n)
        for k in range(warmup):
            run_forward(k)
        for k in range(n - warmup):
            run_forward(warmup + k)
            run_backward(k)
        for k in range(n - warmup, n):
            run_backward(k)
        out = [grads[name] for name, _ in self.named_parameters()]
        return (*out, total) if total is not None else tuple(out)


def interleaved_1f1b(ctx: BuildContext) -> Pipeline:
    hidden, layers = ctx.knob("hidden", 16), ctx.knob("layers", 8)
    pp, vp, m, batch = ctx.knob("pp", 2), ctx.knob("vp", 2), ctx.knob("microbatches", 4), ctx.knob("batch", 8)
    if layers % (pp * vp) or m % pp or batch % m:
        raise ValueError(f"interleaved 1F1B needs layers ({layers}) divisible by pp·vp ({pp * vp}), microbatches ({m}) by pp ({pp}) and batch ({batch}) by microbatches")
    variant = ctx.variant or ""
    return Pipeline(
        baseline=Baseline(hidden, layers, pp, vp),
        stage=lambda rank: Rank(hidden, layers, rank, pp, vp, m, variant),
        stages=pp,
        inputs=[Input("x", (batch, hidden))],
    )
