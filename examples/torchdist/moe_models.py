"""A mixture of experts written the way DeepSpeed's ``MOELayer`` runs one: top-1 gating with a
capacity, a dense dispatch (``einsum("sec,sm->ecm")``), an ``all_to_all_single`` over the
expert-parallel group, the rank's local experts held in an ``nn.ModuleList`` (each takes its
chunk of the received tokens), the all-to-all back and the combine (``einsum("sec,ecm->sm")``).

The baseline is the same module with every expert local (an expert-parallel group of one): its
list holds all E experts; rank r's holds E/P, and its local expert j is the baseline's expert
r*E/P + j. The plan says so with ``"expert_list"``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shardproof.engine.frontend.declare import BuildContext, Input, Model


class Expert(torch.nn.Module):
    def __init__(self, dim: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, ffn)
        self.fc2 = torch.nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
    """``F.one_hot`` as a compare with the class ids. torch-xla lowers ``F.one_hot`` to a
    scatter that overwrites, whose result the rules do not read (overwrites at repeated indices
    are unordered in XLA); this form computes the same and lowers to a compare."""
    return (index.unsqueeze(-1) == torch.arange(classes, device=index.device)).long()


class TopOneGate(torch.nn.Module):
    """Top-1 gating: each token goes to its best expert while the expert has room (its first
    ``capacity`` tokens in order); the combine weights carry the gate value."""

    def __init__(self, dim: int, experts: int, capacity: int) -> None:
        super().__init__()
        self.wg = torch.nn.Linear(dim, experts, bias=False)
        self.experts = experts
        self.capacity = capacity

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gates = F.softmax(self.wg(tokens).float(), dim=1)
        mask = one_hot(torch.argmax(gates, dim=1), self.experts)
        locations = torch.cumsum(mask, dim=0) - 1
        mask = mask * torch.lt(locations, self.capacity)
        slot = torch.sum(locations * mask, dim=1)
        combine = torch.einsum("se,sc->sec", gates * mask, one_hot(slot, self.capacity).float())
        return combine, combine.bool()


def all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    """DeepSpeed's ``_AllToAll``: equal pieces of dim 0 exchanged over the group."""
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


class MoE(torch.nn.Module):
    def __init__(self, dim: int, ffn: int, experts: int, capacity: int, ep_size: int, group: Any, variant: str | None = None) -> None:
        super().__init__()
        self.variant = variant
        self.gate = TopOneGate(dim, experts, capacity)
        self.local = experts // ep_size
        self.ep_size = ep_size
        self.group = group
        self.experts = torch.nn.ModuleList(Expert(dim, ffn) for _ in range(self.local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        tokens = x.reshape(-1, d)
        combine, dispatch = self.gate(tokens)
        dispatched = torch.einsum("sec,sm->ecm", dispatch.type_as(x), tokens)
        dispatched = all_to_all(dispatched, self.group)
        # [ranks, local experts, capacity, d]: each local expert takes its chunk
        chunks = dispatched.reshape(self.ep_size, self.local, -1, d).chunk(self.local, dim=1)
        experts = list(self.experts)
        if self.variant == "experts_reversed":
            experts.reverse()  # each chunk goes to another local expert
        outs = [expert(chunk) for chunk, expert in zip(chunks, experts, strict=True)]  # BUG-SITE: experts_reversed
        if self.variant == "chunks_reversed":
            outs.reverse()  # the experts' outputs joined in the wrong order
        out = torch.cat(outs, dim=1)  # BUG-SITE: chunks_reversed
        out = all_to_all(out.reshape(self.ep_size * self.local, -1, d), self.group)
        return torch.einsum("sec,ecm->sm", combine.type_as(x), out).reshape(x.shape)


def expert_groups(ep_size: int) -> Any:
    """The expert-parallel groups DeepSpeed makes (consecutive ranks), this rank's one."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for start in range(0, world, ep_size):
        group = dist.new_group(list(range(start, start + ep_size)))
        if start <= rank < start + ep_size:
            mine = group
    return mine


def moe(ctx: BuildContext) -> Model:
    dim, ffn, experts = ctx.knob("dim", 16), ctx.knob("ffn", 32), ctx.knob("experts", 8)
    tokens = ctx.knob("tokens", 8)
    capacity = ctx.knob("capacity", 4)
    baseline = MoE(dim, ffn, experts, capacity, 1, expert_groups(1))

    def distributed(rank: int) -> MoE:
        return MoE(dim, ffn, experts, capacity, ctx.tp, expert_groups(ctx.tp), ctx.variant)

    return Model(
        baseline=baseline,
        distributed=distributed,
        inputs=[Input("x", (2, tokens // 2, dim))],
        plan={"experts": "expert_list"},
    )

