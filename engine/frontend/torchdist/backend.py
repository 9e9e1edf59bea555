"""A ``torch.distributed`` process-group backend that lowers collectives to XLA collectives.

Registered as ``shardproof``. Each collective of a traced rank becomes one token-free XLA
collective whose replica groups are the group's own global ranks; the lifting step
(``lift.py``) merges the groups of all ranks into the partition every rank's program names.
No data moves: a build traces lazy tensors and never executes them.

Covered: ``all_reduce``, ``all_gather_into_tensor`` / ``_all_gather_base``, ``all_gather``,
``reduce_scatter_tensor`` / ``_reduce_scatter_base``, ``all_to_all_single``, ``broadcast`` (only
from a group of one), ``barrier``, and the functional collectives (``torch.distributed.
_functional_collectives``), which reach the same methods through the group.
"""

from __future__ import annotations

import sys
from typing import Any

NAME = "shardproof"

_OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "PRODUCT": "mul", "BAND": "and", "BOR": "or", "AVG": "sum"}


def _work(result: Any) -> Any:
    import torch

    future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _op(reduce_op: Any) -> tuple[str, bool]:
    """(XLA reduction, whether to divide by the group size afterwards) of a c10d ReduceOp."""
    import torch.distributed as dist

    for name, xla in _OPS.items():
        if reduce_op == getattr(dist.ReduceOp, name):
            return xla, name == "AVG"
    raise NotImplementedError(f"torch.distributed reduce op {reduce_op} has no XLA lowering here")


def _all_reduce(x: Any, ranks: list[int], reduce_op: Any) -> Any:
    import torch_xla

    op, mean = _op(reduce_op)
    out = torch_xla._XLAC._xla_spmd_all_reduce(op, x, 1.0, [ranks])
    return out / len(ranks) if mean else out


def _all_gather(x: Any, dim: int, ranks: list[int]) -> Any:
    import torch_xla

    return torch_xla._XLAC._xla_all_gather(x, dim, len(ranks), [ranks], False, None, None)


def _reduce_scatter(x: Any, dim: int, ranks: list[int], reduce_op: Any) -> Any:
    import torch_xla

    op, mean = _op(reduce_op)
    out = torch_xla._XLAC._xla_spmd_reduce_scatter(op, x, 1.0, dim, len(ranks), [ranks])
    return out / len(ranks) if mean else out


def _all_to_all(x: Any, ranks: list[int]) -> Any:
    """Piece j along dim 0 goes to the group's j-th rank; received pieces concatenate on dim 0.

    torch-xla's all-to-all carries a token; the build gives it the fresh (zero) token, which
    the relations declare as ``token`` (see ``build._unchained_tokens``).
    """
    import torch_xla.core.xla_model as xm

    from .. import capture

    capture.reset_collective_token()
    return xm.all_to_all(x, 0, 0, len(ranks), groups=[ranks], pin_layout=False)


def _make_group_class() -> type:
    from torch._C._distributed_c10d import ProcessGroup

    class XlaCollectives(ProcessGroup):  # type: ignore[misc]
        """One group: its global ranks and this rank's place in it."""

        def __init__(self, rank: int, size: int, ranks: list[int]) -> None:
            super().__init__(rank, size)
            self.ranks = list(ranks)

        def getBackendName(self) -> str:
            return NAME

        def _set_group_name(self, name: str) -> None:
            self._group_name = name

        @property
        def group_name(self) -> str:
            return self._group_name

        def allreduce(self, tensors: list[Any], opts: Any) -> Any:
            for t in tensors:
                t.copy_(_all_reduce(t, self.ranks, opts.reduceOp))
            return _work(tensors)

        def allreduce_coalesced(self, tensors: list[Any], opts: Any) -> Any:
            return self.allreduce(tensors, opts)

        def _allgather_base(self, output: Any, input_: Any, opts: Any = None) -> Any:
            output.copy_(_all_gather(input_, 0, self.ranks).reshape(output.shape))
            return _work([output])

        def allgather_into_tensor_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
            for out, inp in zip(outputs, inputs, strict=True):
                self._allgather_base(out, inp, opts)
            return _work(outputs)

        def allgather(self, output_lists: list[list[Any]], inputs: list[Any], opts: Any = None) -> Any:
            for outputs, inp in zip(output_lists, inputs, strict=True):
                gathered = _all_gather(inp.unsqueeze(0), 0, self.ranks)
                for i, out in enumerate(outputs):
                    out.copy_(gathered[i])
            return _work([t for sub in output_lists for t in sub])

        def _reduce_scatter_base(self, output: Any, input_: Any, opts: Any) -> Any:
            output.copy_(_reduce_scatter(input_, 0, self.ranks, opts.reduceOp).reshape(output.shape))
            return _work([output])

        def reduce_scatter_tensor_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any) -> Any:
            for out, inp in zip(outputs, inputs, strict=True):
                self._reduce_scatter_base(out, inp, opts)
            return _work(outputs)

        def reduce_scatter(self, outputs: list[Any], input_lists: list[list[Any]], opts: Any) -> Any:
            import torch

            for out, pieces in zip(outputs, input_lists, strict=True):
                stacked = torch.cat([p.unsqueeze(0) for p in pieces], 0)
                out.copy_(_reduce_scatter(stacked, 0, self.ranks, opts.reduceOp).reshape(out.shape))
            return _work(outputs)

        def alltoall_base(self, output: Any, input_: Any, output_split_sizes: list[int], input_split_sizes: list[int], opts: Any = None) -> Any:
            if output_split_sizes or input_split_sizes:
                equal = input_.shape[0] // len(self.ranks)
                if any(s != equal for s in [*output_split_sizes, *input_split_sizes]):
                    raise NotImplementedError("all_to_all_single with unequal splits has no XLA lowering here")
            output.copy_(_all_to_all(input_, self.ranks).reshape(output.shape))
            return _work([output])

        def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
            import torch

            stacked = torch.cat([t.unsqueeze(0) for t in inputs], 0)
            exchanged = _all_to_all(stacked, self.ranks)
            for i, out in enumerate(outputs):
                out.copy_(exchanged[i])
            return _work(outputs)

        def broadcast(self, tensors: list[Any], opts: Any) -> Any:
            if len(self.ranks) != 1:
                raise NotImplementedError("broadcast over more than one rank has no lowering here (a build traces no data)")
            return _work(tensors)

        def barrier(self, opts: Any = None) -> Any:
            return _work([])

    return XlaCollectives


_GROUP_CLASS: type | None = None


def _create(options: Any, _backend_options: Any) -> Any:
    global _GROUP_CLASS
    if _GROUP_CLASS is None:
        _GROUP_CLASS = _make_group_class()
    return _GROUP_CLASS(options.group_rank, options.group_size, list(options.global_ranks_in_group))


def register() -> None:
    """Make ``shardproof`` a torch.distributed backend (idempotent)."""
    import torch.distributed as dist

    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "xla", "cuda", "meta"])


def start(rank: int, world_size: int) -> None:
    """``torch.distributed`` for ``rank`` of ``world_size``, with this backend and no peers."""
    import torch.distributed as dist

    register()
    # torch-xla's own backend replaces dist.new_group by a version that rejects the keywords
    # Megatron passes (use_local_synchronization, group_desc); this backend needs torch's own.
    xla_backend = sys.modules.get("torch_xla.distributed.xla_backend")
    if xla_backend is not None and hasattr(xla_backend, "_orig_new_group_fn"):
        dist.new_group = xla_backend._orig_new_group_fn
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(NAME, store=dist.HashStore(), rank=rank, world_size=world_size)
