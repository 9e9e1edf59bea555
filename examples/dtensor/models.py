"""Entry points of examples/dtensor/.shardproof.yml: PyTorch-native tensor parallelism on DTensor.

Each model is written the way PyTorch's tensor-parallel tutorial and torchtitan write it: an
ordinary ``nn.Module``, a device mesh from ``init_device_mesh``, and ``parallelize_module``
with the built-in parallel styles. The baseline is the same module, unparallelized. Models are
declared ``rank: int`` (DTensor reads the rank from the process group); no plan is written:
the relations of the parameters come from their DTensor placements.

Bug variants change one line of the parallelization, each marked ``# BUG-SITE: <variant>``,
the way a wrong edit to a plan or a patched helper would. A plan's styles run as hooks around
the modules they name, so a plan bug is reported where its wrong value is first used (the
module's caller), not at the plan line.
"""

from __future__ import annotations

import math
from typing import Any

import dtensor_bugs
import loss_bugs
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_gather_tensor, all_reduce
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from shardproof.engine.frontend.declare import BuildContext, Input, Model

# ---- the modules (plain PyTorch, no parallelism in them) --------------------------------------


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool = True) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.down = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class SwiGLU(nn.Module):
    """Llama's feed-forward: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class FusedSwiGLU(nn.Module):
    """Llama's feed-forward with w1 and w3 fused into one projection, as Phi-3 and ChatGLM
    write it: the projection's output is cut in two halves, gate and up."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    """Causal grouped-query attention with rotary embeddings; heads read from the weights'
    shapes (``view(b, s, -1, head_dim)``), so the same code runs with the heads of one rank."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(b, s, -1, hd).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, hd).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, hd).transpose(1, 2)
        pos = torch.arange(s, device=x.device, dtype=torch.float32)
        freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
        angles = torch.outer(pos, freqs)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        causal = torch.ones(s, s, device=x.device, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.attention = Attention(dim, heads, kv_heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)
        self.feed_forward = SwiGLU(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, kv_heads: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


class LossModel(nn.Module):
    """A decoder and its token cross entropy; with ``parallel_loss`` the logits stay sharded
    over the vocabulary and the loss is computed under ``loss_parallel()``."""

    def __init__(self, decoder: Decoder, parallel_loss: bool) -> None:
        super().__init__()
        self.decoder = decoder
        self.parallel_loss = parallel_loss

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.decoder(tokens)
        if self.parallel_loss:
            with loss_parallel():
                return F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# ---- parallelization plans (what a user writes) ------------------------------------------------


def block_plan(sequence_parallel: bool, variant: str | None = None) -> dict[str, Any]:
    """torchtitan's per-block plan (``apply_tp``), or the plain TP one without SP."""
    sp_in = Shard(1) if sequence_parallel else Replicate()
    out = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {
        "attention": PrepareModuleInput(input_layouts=(sp_in,), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),
        "feed_forward": PrepareModuleInput(input_layouts=(sp_in,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=out),
        "feed_forward.w3": ColwiseParallel(),
    }
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    if variant == "wrong_output_layouts":
        plan["feed_forward.w2"] = RowwiseParallel(output_layouts=Partial())  # BUG-SITE: wrong_output_layouts
    return plan


def mesh_1d(ctx: BuildContext, device: str = "cpu") -> DeviceMesh:
    return init_device_mesh(device, (ctx.tp,), mesh_dim_names=("tp",))


# ---- entry points ------------------------------------------------------------------------------


def mlp(ctx: BuildContext) -> Model:
    """ColwiseParallel -> gelu -> RowwiseParallel on a 1-D mesh ("cpu" or "cuda")."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    device = ctx.knob("device", "cpu")
    # bad input: the input declared sequence-sharded while ColwiseParallel takes it replicated
    input_shard = ctx.knob("input_shard", None)

    def distributed(rank: int) -> nn.Module:
        dtensor_bugs.apply(ctx.variant)
        mesh = mesh_1d(ctx, device)
        return parallelize_module(MLP(dim, hidden), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim), shard=input_shard)])


def fused_mlp(ctx: BuildContext) -> Model:
    """The fused feed-forward, whose gate and up halves must be cut from the whole projection.
    Correct plans gather w13's output first: w2 column-parallel on the replicated product,
    gathered again, or (``split_input``, the plan transformers writes for Phi-3's gate_up_proj:
    "colwise_gather_output" / "rowwise_split_input") w2 row-parallel on its piece of the product.
    The bug variant copies Llama's plan (plain ColwiseParallel, as for w1 and w3, then
    RowwiseParallel) onto the fused projection: it builds, and each rank cuts its own shard of
    [gate; up] in two, multiplying gate rows with gate rows (or up rows with up rows)."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    split_input = ctx.knob("split_input", False)

    def distributed(rank: int) -> nn.Module:
        w2 = RowwiseParallel(input_layouts=Replicate()) if split_input else ColwiseParallel(output_layouts=Replicate())
        plan = {"w13": ColwiseParallel(output_layouts=Replicate()), "w2": w2}
        if ctx.variant == "fused_colwise":
            plan = {"w13": ColwiseParallel(), "w2": RowwiseParallel()}  # BUG-SITE: fused_colwise
        return parallelize_module(FusedSwiGLU(dim, hidden), mesh_1d(ctx), plan)

    return Model(baseline=FusedSwiGLU(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def mlp_2d(ctx: BuildContext) -> Model:
    """A (dp, tp) mesh: tensor parallel over the "tp" dim, data parallel replicas over "dp"."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    tp = ctx.tp
    dp = ctx.knob("dp", 2)

    def distributed(rank: int) -> nn.Module:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        return parallelize_module(MLP(dim, hidden), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


class ManualRowwise(nn.Module):
    """A hand-written tensor-parallel MLP on DTensor's lower-level API: weights placed with
    ``distribute_tensor``, activations wrapped with ``DTensor.from_local``, the partial sum of
    the second matmul reduced by a functional all-reduce over the mesh's "tp" dim."""

    def __init__(self, dim: int, hidden: int, mesh: DeviceMesh | None, variant: str | None) -> None:
        super().__init__()
        self.mesh = mesh
        self.variant = variant
        up, down = torch.empty(hidden, dim), torch.empty(dim, hidden)
        if mesh is not None:
            up = distribute_tensor(up, mesh, [Replicate(), Shard(0)])
            down = distribute_tensor(down, mesh, [Replicate(), Shard(1)])
        bias = torch.empty(dim)
        if mesh is not None:
            bias = distribute_tensor(bias, mesh, [Replicate(), Replicate()])
        self.up = nn.Parameter(up)
        self.down = nn.Parameter(down)
        self.bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return F.gelu(x @ self.up.t()) @ self.down.t() + self.bias
        h = F.gelu(x @ self.up.to_local().t())
        partial = h @ self.down.to_local().t()
        if self.variant == "bias_before_reduce":
            partial = partial + self.bias.to_local()  # BUG-SITE: bias_before_reduce
        out = all_reduce(partial, "sum", (self.mesh, 0 if self.variant == "wrong_mesh_dim" else 1))  # BUG-SITE: wrong_mesh_dim
        if self.variant != "bias_before_reduce":
            out = out + self.bias.to_local()
        return DTensor.from_local(out, self.mesh, [Replicate(), Replicate()]).full_tensor()


def manual_2d(ctx: BuildContext) -> Model:
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    dp = ctx.knob("dp", 2)

    def distributed(rank: int) -> nn.Module:
        mesh = init_device_mesh("cpu", (dp, ctx.tp), mesh_dim_names=("dp", "tp"))
        return ManualRowwise(dim, hidden, mesh, ctx.variant)

    return Model(baseline=ManualRowwise(dim, hidden, None, None), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


class FSDPTensorParallelMLP(nn.Module):
    """FSDP x TP on DTensor's lower-level API. Both weights are [dim, hidden] (w_in read as
    ``x @ w_in``, w_out as ``h @ w_out.T``, GPT-2's layout), distributed with two placements on a
    (dp, tp) mesh: Shard(0) over dp (FSDP: each rank stores half of its TP piece) and Shard(1)
    over tp. The forward gathers each weight over dp (redistribute to Replicate() on dp; the
    bias by a functional all-gather over mesh dim 0), computes with its TP piece, and
    all-reduces the partial sums over tp."""

    def __init__(self, dim: int, hidden: int, mesh: DeviceMesh | None, variant: str | None = None) -> None:
        super().__init__()
        self.mesh = mesh
        self.variant = variant
        w_in, w_out, bias = torch.empty(dim, hidden), torch.empty(dim, hidden), torch.empty(dim)
        if mesh is not None:
            w_in = distribute_tensor(w_in, mesh, [Shard(0), Shard(1)])
            w_out = distribute_tensor(w_out, mesh, [Shard(0), Shard(1)])
            bias = distribute_tensor(bias, mesh, [Shard(0), Replicate()])
        self.w_in = nn.Parameter(w_in)
        self.w_out = nn.Parameter(w_out)
        self.bias = nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return F.gelu(x @ self.w_in) @ self.w_out.t() + self.bias
        unsharded = [Replicate(), Shard(1)]  # FSDP's all-gather over dp, the TP piece kept
        w_in = self.w_in.redistribute(self.mesh, unsharded).to_local()
        w_out = self.w_out.redistribute(self.mesh, unsharded).to_local()
        bias = all_gather_tensor(self.bias.to_local(), 0, (self.mesh, 1 if self.variant == "gather_over_tp" else 0))  # BUG-SITE: gather_over_tp
        partial = F.gelu(x @ w_in) @ w_out.t()
        return all_reduce(partial, "sum", (self.mesh, 1)) + bias


def fsdp_tp(ctx: BuildContext) -> Model:
    """FSDP x TP: parameters sharded over both dims of a (dp, tp) mesh."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    dp = ctx.knob("dp", 2)

    def distributed(rank: int) -> nn.Module:
        return FSDPTensorParallelMLP(dim, hidden, init_device_mesh("cpu", (dp, ctx.tp), mesh_dim_names=("dp", "tp")), ctx.variant)

    return Model(baseline=FSDPTensorParallelMLP(dim, hidden, None), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def fully_sharded(ctx: BuildContext) -> Model:
    """Not hosted yet (a clear error): fully_shard (FSDP2) over the dp dim of a TP model."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        mesh = init_device_mesh("cpu", (2, ctx.tp), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(MLP(dim, hidden), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        return fully_shard(model, mesh=mesh["dp"])

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def block(ctx: BuildContext) -> Model:
    """One Llama block (GQA, RoPE, SwiGLU) with torchtitan's plan; SP when asked."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)
    heads, kv_heads = ctx.knob("heads", 8), ctx.knob("kv_heads", 4)
    sp = ctx.knob("sequence_parallel", False)

    def distributed(rank: int) -> nn.Module:
        dtensor_bugs.apply(ctx.variant)
        return parallelize_module(Block(dim, heads, kv_heads, hidden), mesh_1d(ctx), block_plan(sp, ctx.variant))

    # No shard= on the input: with SP, SequenceParallel's from_local of it on the attention norm
    # places it Shard(1), and its relation comes from there (relations.yaml shows the placement).
    return Model(
        baseline=Block(dim, heads, kv_heads, hidden),
        distributed=distributed,
        inputs=[Input("x", (2, 8, dim))],
        outputs=[{"shard": 1} if sp else "replicate"],
    )


def decoder_plan(sequence_parallel: bool, parallel_loss: bool, variant: str | None) -> dict[str, Any]:
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sequence_parallel else Replicate()),
        "norm": SequenceParallel() if sequence_parallel else PrepareModuleInput(),
        "output": ColwiseParallel(
            input_layouts=Shard(1) if sequence_parallel else Replicate(),
            output_layouts=Shard(-1) if parallel_loss else Replicate(),
            use_local_output=parallel_loss if variant == "use_local_output_flipped" else not parallel_loss,  # BUG-SITE: use_local_output_flipped
        ),
    }


def decoder(ctx: BuildContext) -> Model:
    """A whole decoder: vocab-parallel embedding (DTensor's MaskPartial), blocks with
    torchtitan's plan, the LM head; with ``loss`` the cross entropy, under ``loss_parallel``."""
    vocab, dim, hidden = ctx.knob("vocab", 64), ctx.knob("dim", 32), ctx.knob("hidden", 64)
    heads, kv_heads, layers = ctx.knob("heads", 8), ctx.knob("kv_heads", 4), ctx.knob("layers", 2)
    sp, with_loss = ctx.knob("sequence_parallel", False), ctx.knob("loss", False)
    batch, seq = 2, 8

    def make(parallel_loss: bool) -> nn.Module:
        net = Decoder(vocab, dim, heads, kv_heads, hidden, layers)
        return LossModel(net, parallel_loss) if with_loss else net

    def distributed(rank: int) -> nn.Module:
        loss_bugs.apply(ctx.variant)
        model = make(with_loss)
        net = model.decoder if with_loss else model
        mesh = mesh_1d(ctx)
        plan = decoder_plan(sp, with_loss, ctx.variant)
        if not sp:
            del plan["norm"]
        parallelize_module(net, mesh, plan)
        for layer in net.layers:
            parallelize_module(layer, mesh, block_plan(sp, ctx.variant))
        return model

    inputs = [Input("tokens", (batch, seq), "int64", int_range=(0, vocab))]
    if with_loss:
        inputs.append(Input("labels", (batch, seq), "int64", int_range=(0, vocab)))
    return Model(baseline=make(False), distributed=distributed, inputs=inputs)


class PreparedHead(nn.Module):
    """PrepareModuleOutput: the head's module hands a replicated output to its caller."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.mlp = MLP(dim, hidden)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.mlp(x))


def prepared(ctx: BuildContext) -> Model:
    """PrepareModuleInput / PrepareModuleOutput around a sequence-sharded MLP: the input
    arrives sharded along the sequence, the MLP's output leaves as a DTensor sharded along it
    and is gathered (Replicate) before the replicated projection."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        return parallelize_module(
            PreparedHead(dim, hidden),
            mesh_1d(ctx),
            {
                "mlp": PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate()),
                "mlp.up": ColwiseParallel(input_layouts=Shard(1)),
                "mlp.down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            },
        )

    return Model(baseline=PreparedHead(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim), shard=1)])


def sharded_output(ctx: BuildContext) -> Model:
    """An MLP returning a DTensor (``use_local_output=False``) sharded along the sequence: the
    output relation comes from its placements, not from the configuration."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        return parallelize_module(
            MLP(dim, hidden),
            mesh_1d(ctx),
            {"up": ColwiseParallel(), "down": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)},
        )

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def uneven(ctx: BuildContext) -> Model:
    """Bad input: an MLP whose hidden width does not divide over the mesh."""
    return mlp(ctx)


def bad_plan_key(ctx: BuildContext) -> Model:
    """Bad input: a plan entry naming a module the model does not have."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        return parallelize_module(MLP(dim, hidden), mesh_1d(ctx), {"up": ColwiseParallel(), "down_proj": RowwiseParallel()})

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def big_mesh(ctx: BuildContext) -> Model:
    """Bad input: a mesh of more ranks than the declared world."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        mesh = init_device_mesh("cpu", (2 * ctx.tp,))
        return parallelize_module(MLP(dim, hidden), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])


def xla_mesh(ctx: BuildContext) -> Model:
    """Bad input: an "xla" mesh (DTensor would hand the module to torch-xla's SPMD partitioner)."""
    dim, hidden = ctx.knob("dim", 32), ctx.knob("hidden", 64)

    def distributed(rank: int) -> nn.Module:
        return parallelize_module(MLP(dim, hidden), mesh_1d(ctx, "xla"), {"up": ColwiseParallel(), "down": RowwiseParallel()})

    return Model(baseline=MLP(dim, hidden), distributed=distributed, inputs=[Input("x", (2, 8, dim))])
