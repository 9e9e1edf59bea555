"""A ``torch.distributed`` process-group backend that lowers collectives to XLA collectives.

Registered as ``shardproof``. Each collective of a traced rank becomes one token-free XLA
collective whose replica groups are the group's own global ranks; the lifting step
(``lift.py``) merges the groups of all ranks into the partition every rank's program names.
No data moves: a build traces lazy tensors and never executes them.

Covered: ``all_reduce``, ``all_gather_into_tensor`` / ``_all_gather_base``, ``all_gather``,
``reduce_scatter_tensor`` / ``_reduce_scatter_base``, ``all_to_all_single`` (equal splits) and
``all_to_all`` (lists), ``broadcast`` (only from a group of one), ``barrier``, and the functional
``all_to_all_single`` (``_register_functional``). The all-to-all reaches the lazy graph as a call
that ``inline_collectives`` (run on every traced rank's text) turns back into the op.
torch-xla registers XLA kernels of its own for the other functional collectives
(``torch.distributed._functional_collectives.all_reduce`` etc.): those bypass this backend and
lower to its token-carrying ops.
"""

from __future__ import annotations

import re
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

    torch-xla has no token-free all-to-all (``xm.all_to_all`` threads its token through the
    op, and its builder knows no AllToAll), so the op enters the lazy graph as a user
    computation: a one-instruction HLO module, written here as an ``HloModuleProto``, that
    torch-xla lowers to ``call(x), to_apply=%shardproof_all_to_all.N``. ``inline_collectives``
    then puts the all-to-all in place of the call, with the call's number and source.
    """
    import torch_xla
    import torch_xla.core.xla_builder as xb

    if x.dim() == 0 or x.shape[0] % len(ranks):
        raise NotImplementedError(f"all_to_all over {len(ranks)} ranks of a tensor of shape {tuple(x.shape)}: dim 0 must split into equal pieces")
    proto = _all_to_all_module(_element_type(x.dtype), tuple(int(n) for n in x.shape), ranks)
    computation = xb.computation_from_module_proto(f"xla::{_A2A}", proto)
    return torch_xla._XLAC._xla_user_computation(f"xla::{_A2A}", [x], computation)[0]


def _check_equal_splits(x: Any, n: int, output_split_sizes: Any, input_split_sizes: Any) -> None:
    if output_split_sizes or input_split_sizes:
        equal = x.shape[0] // n
        if any(int(s) != equal for s in [*(output_split_sizes or []), *(input_split_sizes or [])]):
            raise NotImplementedError("all_to_all_single with unequal splits has no XLA lowering here")


_FUNCTIONAL: Any = None


def _register_functional() -> None:
    """Route ``torch.distributed._functional_collectives.all_to_all_single`` on XLA tensors to
    this backend. torch-xla registers its own XLA kernel for the op, which bypasses the
    process group (and refuses any split sizes); this one resolves the group by name and lowers
    like ``all_to_all_single``. Torch warns once that a kernel was overridden."""
    global _FUNCTIONAL
    if _FUNCTIONAL is not None:
        return
    import torch

    def all_to_all_single(input_: Any, output_split_sizes: Any, input_split_sizes: Any, group_name: str) -> Any:
        group = torch._C._distributed_c10d._resolve_process_group(group_name)
        ranks = getattr(group, "ranks", None)
        if ranks is None:
            raise NotImplementedError(f"functional all_to_all_single over group {group_name!r}, which is not a {NAME} group")
        _check_equal_splits(input_, len(ranks), output_split_sizes, input_split_sizes)
        return _all_to_all(input_, ranks)

    library = torch.library.Library("_c10d_functional", "IMPL")
    library.impl("all_to_all_single", all_to_all_single, "XLA")
    _FUNCTIONAL = library


# --- A minimal HloModuleProto writer, for the one module above --------------------------------
# Field numbers of xla/xla_data.proto and xla/service/hlo.proto (protobuf field numbers never
# change; XLA keeps reading replica_groups = 49 next to its newer collective_device_list).
_A2A = "shardproof_all_to_all"
_XLA_TYPES = {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6, "uint16": 7, "uint32": 8, "uint64": 9, "float16": 10, "float32": 11, "float64": 12, "complex64": 15, "bfloat16": 16, "complex128": 18}


def _element_type(dtype: Any) -> int:
    name = str(dtype).removeprefix("torch.")
    if name not in _XLA_TYPES:
        raise NotImplementedError(f"all_to_all of {dtype} has no XLA lowering here")
    return _XLA_TYPES[name]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field_number: int, value: int) -> bytes:
    return _varint(field_number << 3) + _varint(value)


def _bytes(field_number: int, value: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(value)) + value


def _packed(field_number: int, values: list[int]) -> bytes:
    return _bytes(field_number, b"".join(_varint(v) for v in values))


def _shape(element_type: int, dims: tuple[int, ...]) -> bytes:
    """ShapeProto: element_type 2, dimensions 3, layout 5 (minor_to_major 1, row-major),
    is_dynamic_dimension 6."""
    n = len(dims)
    return _int(2, element_type) + _packed(3, list(dims)) + _bytes(5, _packed(1, list(range(n - 1, -1, -1)))) + _packed(6, [0] * n)


def _all_to_all_module(element_type: int, dims: tuple[int, ...], ranks: list[int]) -> bytes:
    """HloModuleProto of ``ROOT all-to-all(parameter(0)), dimensions={0}, replica_groups={ranks}``.

    Ids: instructions 1 and 2, the computation 3 (XLA's builder remaps computation and
    instruction ids through one table when it embeds the module, so they must differ).
    """
    shape = _shape(element_type, dims)
    param = _bytes(1, b"x.1") + _bytes(2, b"parameter") + _bytes(3, shape) + _int(9, 0) + _int(35, 1)
    a2a = (
        _bytes(1, b"a2a.2") + _bytes(2, b"all-to-all") + _bytes(3, shape) + _packed(14, [0])
        + _int(35, 2) + _packed(36, [1]) + _bytes(49, _packed(1, list(ranks)))
    )
    program = _bytes(1, shape) + _bytes(2, shape) + _bytes(3, b"x")
    name = f"{_A2A}.3".encode()
    computation = _bytes(1, name) + _bytes(2, param) + _bytes(2, a2a) + _bytes(4, program) + _int(5, 3) + _int(6, 2)
    return _bytes(1, name) + _bytes(2, name) + _bytes(3, computation) + _bytes(4, program) + _int(5, 3) + _int(6, 3)


_CALLEE = re.compile(r"^%(" + _A2A + r"\.\d+) \(.*?\n\}\n\n?", re.M | re.S)
_ROOT = re.compile(r"ROOT %\S+ = \S+ all-to-all\(\S+ %\S+\), (.*)$", re.M)
_CALL = re.compile(r"^(\s+(?:ROOT )?)%call\.(\d+) = (\S+) call\((\S+ %\S+)\), to_apply=%(" + _A2A + r"\.\d+)(.*)$", re.M)


def inline_collectives(text: str, sourcemap: dict[str, Any]) -> str:
    """Put each collective this backend lowered as a call back in place of the call.

    ``%call.N = T call(x), to_apply=%shardproof_all_to_all.M, metadata={..}`` becomes
    ``%all-to-all.N = T all-to-all(x), <the callee's attributes>, metadata={..}``: the callee is
    that one op on its parameter, so the value is the same. The call's source (its metadata
    and its source-map entry) goes to the op, and the callee computation is dropped.
    """
    callees: dict[str, str] = {}
    for m in _CALLEE.finditer(text):
        root = _ROOT.search(m.group(0))
        if root is None:
            raise RuntimeError(f"collective computation %{m.group(1)} is not one all-to-all of its parameter")
        callees[m.group(1)] = root.group(1)
    if not callees:
        return text
    text = _CALLEE.sub("", text)
    instructions = sourcemap.get("instructions", {})
    renamed: set[str] = set()

    def op(m: re.Match[str]) -> str:
        prefix, number, shape, operand, callee, rest = m.groups()
        if callee not in callees:
            raise RuntimeError(f"%call.{number} calls %{callee}, which the module does not define")
        renamed.add(number)
        if f"call.{number}" in instructions:
            instructions[f"all-to-all.{number}"] = instructions.pop(f"call.{number}")
        return f"{prefix}%all-to-all.{number} = {shape} all-to-all({operand}), {callees[callee]}{rest}"

    text = _CALL.sub(op, text)
    if f"to_apply=%{_A2A}." in text:
        raise RuntimeError(f"a call of a {_A2A} computation has a form inline_collectives does not know")
    # The users of each call (the tuple, the next op) name it too.
    return re.sub(r"%call\.(\d+)\b", lambda m: f"%all-to-all.{m.group(1)}" if m.group(1) in renamed else m.group(0), text)


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
            _check_equal_splits(input_, len(self.ranks), output_split_sizes, input_split_sizes)
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
    # torch names no ranks for the default (world) group: it is every rank, in order.
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    return _GROUP_CLASS(options.group_rank, options.group_size, ranks)


def register() -> None:
    """Make ``shardproof`` a torch.distributed backend (idempotent)."""
    import torch.distributed as dist

    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu", "xla", "cuda", "meta"])


def start(rank: int, world_size: int) -> None:
    """``torch.distributed`` for ``rank`` of ``world_size``, with this backend and no peers."""
    import torch.distributed as dist

    register()
    _register_functional()
    # torch-xla's own backend replaces dist.new_group by a version that rejects the keywords
    # Megatron passes (use_local_synchronization, group_desc); this backend needs torch's own.
    xla_backend = sys.modules.get("torch_xla.distributed.xla_backend")
    if xla_backend is not None and hasattr(xla_backend, "_orig_new_group_fn"):
        dist.new_group = xla_backend._orig_new_group_fn
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(NAME, store=dist.HashStore(), rank=rank, world_size=world_size)
