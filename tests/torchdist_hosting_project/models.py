"""Test models of tests/test_torchdist_hosting.py: int-rank builds the front end must host or
report precisely (a rank that never returns)."""

from __future__ import annotations

import time

import torch

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def wait_for_peers(rank: int) -> None:
    """Stands in for a rendezvous no peer ever joins: rank 1 never returns."""
    if rank == 1:
        time.sleep(3600)


def hung(ctx: BuildContext) -> Model:
    def distributed(rank: int) -> torch.nn.Module:
        wait_for_peers(rank)
        return torch.nn.Linear(4, 4)

    return Model(baseline=torch.nn.Linear(4, 4), distributed=distributed, inputs=[Input("x", (2, 4))])
