"""Entry points of examples/dtensor/.shardproof.yml: torchtitan's Llama 3, unmodified.

torchtitan 0.2.0 (the newest release that runs on torch 2.9) parallelizes its Llama 3
``Transformer`` with ``apply_tp`` - the tensor + sequence parallel plan of ``parallelize_llama``,
``loss_parallel`` included when asked - on a 1-D "tp" mesh. The baseline is the same
``Transformer``, unparallelized. Its RoPE is complex (``view_as_complex`` / ``polar``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel
from torchtitan.models.llama3 import Transformer, TransformerModelArgs
from torchtitan.models.llama3.infra.parallelize import apply_tp

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class TitanLoss(nn.Module):
    """torchtitan's training loss of the model: token cross entropy of the logits (under
    ``loss_parallel()`` when the logits stay sharded over the vocabulary)."""

    def __init__(self, model: Transformer, parallel_loss: bool) -> None:
        super().__init__()
        self.model = model
        self.parallel_loss = parallel_loss

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> Any:
        logits = self.model(tokens)
        if self.parallel_loss:
            with loss_parallel():
                return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def llama3(ctx: BuildContext) -> Model:
    vocab, dim, layers = ctx.knob("vocab", 64), ctx.knob("dim", 64), ctx.knob("layers", 2)
    heads, kv_heads, seq = ctx.knob("heads", 8), ctx.knob("kv_heads", 4), ctx.knob("seq", 8)
    with_loss = ctx.knob("loss", False)
    args = TransformerModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, vocab_size=vocab, multiple_of=32, max_seq_len=seq)

    def distributed(rank: int) -> nn.Module:
        model = Transformer(args)
        apply_tp(model, init_device_mesh("cpu", (ctx.tp,), mesh_dim_names=("tp",)), loss_parallel=with_loss, enable_float8_tensorwise_tp=False)
        return TitanLoss(model, True) if with_loss else model

    inputs = [Input("tokens", (2, seq), "int64", int_range=(0, vocab))]
    if with_loss:
        inputs.append(Input("labels", (2, seq), "int64", int_range=(0, vocab)))
    return Model(baseline=TitanLoss(Transformer(args), False) if with_loss else Transformer(args), distributed=distributed, inputs=inputs)
