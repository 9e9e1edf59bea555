"""Numeric sanity check of the pairs in plain torch on CPU: ``python tests/pairs/check_eager.py``.

The baseline runs on whole random inputs; the distributed function runs once per rank, each in
its own thread, on that rank's shards, with collectives simulated by exchanging tensors between
the threads. Correct pairs must match the baseline; bug pairs must not.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models

RTOL, ATOL = 1e-4, 1e-5
# A bug must move some output by far more than float noise, or the pair would not be a bug.
BUG_MARGIN = 1e-3


class _Exchange:
    """Lets ``world`` threads swap one tensor each, collective by collective."""

    def __init__(self, world: int) -> None:
        self.barrier = threading.Barrier(world)
        self.slots: list[Tensor | None] = [None] * world

    def swap(self, rank: int, tensor: Tensor) -> list[Tensor]:
        self.slots[rank] = tensor
        self.barrier.wait()
        snapshot = [t for t in self.slots if t is not None]
        # A second barrier: nobody may post the next collective's tensor before all have read.
        self.barrier.wait()
        return snapshot


def _members(rank: int, world: int, groups: Sequence[Sequence[int]] | None) -> list[int]:
    if not groups:
        return list(range(world))
    for group in groups:
        if rank in group:
            return list(group)
    raise ValueError(f"rank {rank} is in none of the replica groups {groups}")


def _reduce(reduce_type: str, tensors: list[Tensor]) -> Tensor:
    stacked = torch.stack(tensors)
    if reduce_type == models.SUM:
        return stacked.sum(0)
    if reduce_type == models.MAX:
        return stacked.amax(0)
    if reduce_type == models.MIN:
        return stacked.amin(0)
    raise ValueError(f"unsupported reduce type {reduce_type!r}")


def eager_collectives(rank: int, world: int, exchange: _Exchange) -> models.Collectives:
    """Rank ``rank``'s collectives, with torch-xla's signatures."""

    def group_of(tensor: Tensor, groups: Sequence[Sequence[int]] | None) -> list[Tensor]:
        everyone = exchange.swap(rank, tensor)
        return [everyone[m] for m in _members(rank, world, groups)]

    def spmd_all_reduce(reduce_type: str, t: Tensor, scale: float, groups: models.Groups) -> Tensor:
        reduced = _reduce(reduce_type, group_of(t, groups))
        return reduced if scale == 1.0 else reduced * scale  # keeps integer types integers

    def spmd_reduce_scatter(
        reduce_type: str, t: Tensor, scale: float, dim: int, count: int, groups: models.Groups
    ) -> Tensor:
        members = _members(rank, world, groups)
        reduced = _reduce(reduce_type, group_of(t, groups)) * scale
        return reduced.chunk(count, dim=dim)[members.index(rank)]

    def all_gather(
        t: Tensor, dim: int = 0, groups: models.Groups | None = None, pin_layout: bool = True
    ) -> Tensor:
        return torch.cat(group_of(t, groups), dim=dim)

    def all_reduce(
        reduce_type: str,
        t: Tensor,
        scale: float = 1.0,
        groups: models.Groups | None = None,
        pin_layout: bool = True,
    ) -> Tensor:
        return _reduce(reduce_type, group_of(t, groups)) * scale

    def all_to_all(
        t: Tensor,
        split_dimension: int,
        concat_dimension: int,
        split_count: int,
        groups: models.Groups | None = None,
        pin_layout: bool = True,
    ) -> Tensor:
        members = _members(rank, world, groups)
        mine = members.index(rank)
        return torch.cat([x.chunk(split_count, dim=split_dimension)[mine] for x in group_of(t, groups)], dim=concat_dimension)

    return models.Collectives(spmd_all_reduce, spmd_reduce_scatter, all_gather, all_reduce, all_to_all)


def run_ranks(pair: models.Pair, whole: dict[str, Tensor]) -> list[tuple[Tensor, ...]]:
    """Every rank's outputs, the ranks running concurrently so collectives can meet."""
    c = pair.c
    exchange = _Exchange(c)
    results: list[tuple[Tensor, ...] | None] = [None] * c
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        local = {s.name: s.shard(whole[s.name], rank, c) for s in pair.inputs if s.name in whole}
        for spec in pair.inputs:
            if spec.relation == "rank":
                local[spec.name] = torch.tensor(rank, dtype=spec.dtype)
        try:
            results[rank] = pair.run_distributed(eager_collectives(rank, c, exchange), local)
        except BaseException as error:  # surfaced below; the abort frees the other threads
            errors.append(error)
            exchange.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(c)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


@dataclass(frozen=True)
class Outcome:
    name: str
    expected: str
    max_error: float  # largest |distributed - baseline| over all outputs and ranks
    matches: bool

    @property
    def ok(self) -> bool:
        if self.expected == "verified":
            return self.matches
        return not self.matches and self.max_error > BUG_MARGIN


def check_pair(pair: models.Pair, seed: int = 0) -> Outcome:
    whole = models.sample_inputs(pair, seed)
    expected = pair.run_baseline(whole)
    per_rank = run_ranks(pair, whole)
    matches, max_error = True, 0.0
    for index, spec in enumerate(pair.outputs):
        want = expected[index]
        if spec.relation == "sharded":
            candidates = [torch.cat([outs[index] for outs in per_rank], dim=spec.dim)]
        else:
            candidates = [outs[index] for outs in per_rank]
        for got in candidates:
            if got.shape != want.shape:
                return Outcome(pair.name, pair.verdict, float("inf"), False)
            max_error = max(max_error, float((got - want).abs().max()))
            matches = matches and torch.allclose(got, want, rtol=RTOL, atol=ATOL)
    return Outcome(pair.name, pair.verdict, max_error, matches)


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(models.PAIRS)
    failed = 0
    for name in names:
        outcome = check_pair(models.PAIRS[name])
        status = "ok" if outcome.ok else "FAIL"
        failed += not outcome.ok
        print(
            f"{status:4} {name:24} expect {outcome.expected:9} max |diff| {outcome.max_error:.3g}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
