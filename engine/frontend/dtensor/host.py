"""Hosting DTensor code in a per-rank build (``rank: int``), unchanged.

Two contexts, both no-ops for code that never touches DTensor:

``declaring(world, groups)`` wraps the entry point and ``distributed(rank)``:
- a "cuda" ``DeviceMesh`` builds without a GPU: DeviceMesh sets the CUDA device of the
  process (``torch.cuda.set_device``), which initializes CUDA, impossible in a forked build
  child; the CUDA device is reported as set already, so the mesh never asks for it;
- a mesh of more ranks than the model's world is a declaration error on ``tp``/``groups``,
  not torch's RuntimeError from inside the user's code; so is an "xla" mesh (DTensor would
  hand the module to torch-xla's SPMD partitioner);
- a ``parallelize_module`` plan key that resolves to no submodule (torch only warns and
  parallelizes nothing there, so the model would be checked with that layer unsharded) is a
  declaration error on ``entry``.

``Hosting(module)`` wraps one trace of a module whose parameters are DTensors:
- each DTensor parameter becomes a placeholder of its *local* shape (what the rank holds),
  wrapped back into a DTensor with the parameter's mesh and placements (``from_local``), so
  the traced program reads exactly the rank's shard: a placeholder of the global shape is
  neither what the rank holds nor something ``from_local`` can move;
- every ``DeviceMesh`` reads as an "xla" mesh while the trace runs: DTensor moves local
  tensors to the mesh's device type (``from_local``, ``distribute_tensor``), and a move of a
  placeholder to the CPU aborts the process; the meshes were built as "cpu"/"cuda" meshes, so
  ``parallelize_module`` never took torch-xla's SPMD path;
- DTensor runs each op's local computation inside its ``__torch_dispatch__``, where torch has
  excluded the Functionalize key; torch-xla's tensors are functional wrappers whose kernels
  then assert (``aten.t``: "composite op functionalization fallback"). The local computation
  runs with the key restored, as for any XLA tensor;
- DTensor outputs become their local tensors (their placements give the output relations),
  and ``AsyncCollectiveTensor`` outputs are waited for;
- a ``DTensor.from_local`` of one of the program's inputs (the styles' input hooks) is checked
  against the input's declaration, or, with no plan and no ``shard=`` written, gives its
  relation (``traced_inputs``).
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .placements import Placed, PlacementError, input_relation
from .plan_frames import recording

_PLAN_KEY_WARNING = "Parallelize plan key"


class InputDerived(Exception):
    """Input ``name``, declared without a relation (and no plan written), is sharded along
    ``dim`` by the ``DTensor.from_local`` that first reads it: the rank is traced again with its
    piece as the input (``traced_inputs``)."""

    def __init__(self, name: str, dim: int) -> None:
        super().__init__(f"input {name!r} is sharded along dim {dim} by its placement")
        self.name = name
        self.dim = dim


@dataclass(frozen=True)
class _Expected:
    """What the declaration says of the inputs while one rank is traced."""

    specs: dict[str, Any]  # name -> declare.Input
    derive: bool
    groups: tuple[tuple[int, ...], ...]


_expected: list[_Expected] = []


def traced_inputs(specs: Sequence[Any], derive: bool, groups: Sequence[Sequence[int]], trace: Callable[[list[Any]], Any]) -> tuple[list[Any], Any]:
    """``trace(specs)`` with every ``DTensor.from_local`` of an input checked against its
    declaration (``Input(shard=...)``); with ``derive`` an input declared without ``shard``
    takes its relation from the placement instead (one more trace per input found sharded:
    its per-rank shape is only known then). Returns the specs as traced and the trace."""
    current = list(specs)
    for _ in range(len(current) + 1):
        _expected.append(_Expected({s.name: s for s in current}, derive, tuple(tuple(g) for g in groups)))
        try:
            return current, trace(current)
        except InputDerived as e:
            current = [replace(s, shard=e.dim) if s.name == e.name else s for s in current]
        finally:
            _expected.pop()
    raise AssertionError("an input was derived twice")


def _dtensor_class() -> Any:
    """DTensor's class if DTensor was imported by anyone, else None (nothing to host)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(tensor: Any) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def _declaration_error(message: str, key: str) -> Exception:
    from ..build import DeclarationError

    return DeclarationError(message, key)


@contextmanager
def declaring(world: int, groups: list[list[int]]) -> Iterator[None]:
    """While the entry point declares the model on one rank of ``world`` ranks."""
    import torch
    from torch.distributed import device_mesh

    key = "groups" if len(groups) > 1 else "tp"
    mesh_class = device_mesh.DeviceMesh
    original_init = mesh_class.__init__

    def init(self: Any, device_type: str, mesh: Any, *args: Any, **kwargs: Any) -> None:
        if device_type == "xla":
            # DTensor hands an "xla" mesh to torch-xla's SPMD partitioner (distribute_module):
            # the per-rank program would be the partitioner's input, not the rank's program.
            raise _declaration_error("the model builds an 'xla' device mesh, which sends DTensor to torch-xla's SPMD partitioner; build the mesh on 'cpu' or 'cuda' (the front end traces it on XLA), or declare framework: torch-xla-spmd", "entry")
        size = math.prod(tuple(torch.as_tensor(mesh).shape)) if not isinstance(mesh, torch.Tensor) else mesh.numel()
        if size > world:
            shape = tuple(torch.as_tensor(mesh).shape) if not isinstance(mesh, torch.Tensor) else tuple(mesh.shape)
            raise _declaration_error(f"the model builds a {device_type!r} device mesh of shape {shape} ({size} ranks), but its world has {world} rank(s) (declare tp/groups in .shardproof.yml to match the mesh)", key)
        original_init(self, device_type, mesh, *args, **kwargs)

    with ExitStack() as stack, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        saved = {name: getattr(torch.cuda, name) for name in ("is_initialized", "set_device")}
        # DeviceMesh only sets the device when CUDA is not initialized yet; the shims map every
        # CUDA device to the XLA device, so there is nothing to set.
        torch.cuda.is_initialized = lambda: True
        torch.cuda.set_device = lambda *a, **k: None
        stack.callback(lambda: [setattr(torch.cuda, k, v) for k, v in saved.items()])
        mesh_class.__init__ = init  # type: ignore[method-assign]
        stack.callback(setattr, mesh_class, "__init__", original_init)
        # Where each plan entry's style is written: the frame a plan bug is reported at too.
        stack.enter_context(recording())
        yield
    unresolved = [str(w.message) for w in caught if str(w.message).startswith(_PLAN_KEY_WARNING)]
    for w in caught:
        if not str(w.message).startswith(_PLAN_KEY_WARNING):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if unresolved:
        first = unresolved[0].split(" in module ")[0]
        raise _declaration_error(f"parallelize_module: {first}; the plan names a module the model does not have (nothing would be parallelized there)", "entry")


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and the front end: the module call
    whose input hook (or the user's own from_local) places an input."""
    frame = sys._getframe(2)
    here = Path(__file__).resolve().parents[1]
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        inside = "torch" in path.parts or path.resolve().is_relative_to(here)
        if not inside and not frame.f_code.co_filename.startswith("<"):
            return f"{path.name}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown line"


def text_of(tensor: Any) -> str:
    return "(" + ", ".join(repr(p) for p in tensor.placements) + ")"


def _placed(tensor: Any) -> Placed:
    return _placed_on(tensor.device_mesh, tuple(tensor.placements), tensor.dim())


def _placed_on(mesh: Any, placements: tuple[Any, ...], ndim: int) -> Placed:
    """The placements ``placements`` on ``mesh`` of a tensor of ``ndim`` dims (``Shard(-1)``
    is read as the last dim, as DTensor normalizes it)."""
    import torch.distributed as dist
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    kinds: list[tuple[str, int | None]] = []
    reduce = "sum"
    split = 1
    for p in placements:
        if isinstance(p, _StridedShard):
            # rank r holds block r of each of split_factor equal blocks of the dim (placements.py)
            kinds.append(("shard", p.dim % ndim if ndim else p.dim))
            split = int(p.split_factor)
        elif isinstance(p, Shard):
            kinds.append(("shard", p.dim % ndim if ndim else p.dim))
        elif isinstance(p, Replicate):
            kinds.append(("replicate", None))
        elif isinstance(p, Partial):
            kinds.append(("partial", None))
            reduce = str(p.reduce_op)
        else:
            raise _declaration_error(f"a DTensor is placed {p}, a placement no relation describes", "entry")
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    groups = tuple(tuple(dist.get_process_group_ranks(mesh.get_group(i))) for i in range(mesh.ndim))
    text = "(" + ", ".join(repr(p) for p in placements) + ")"
    if split > 1 and sum(1 for kind, _ in kinds if kind != "replicate") > 1:
        raise _declaration_error(f"a DTensor is placed {text}: a strided shard next to other shards (FSDP x TP) has no relation here", "entry")
    ranks = mesh.mesh
    every = tuple(tuple(tuple(int(r) for r in row) for row in ranks.movedim(i, -1).reshape(-1, ranks.shape[i]).tolist()) for i in range(mesh.ndim))
    return Placed(tuple(kinds), groups, tuple(names), text, reduce, split, every)



def _loss_targets() -> type:
    """A torch-function mode: under ``loss_parallel()``, the plain target of a cross entropy
    (or nll_loss) of DTensor logits enters as a DTensor with the placements loss_parallel's own
    handler gives it (``_cast_to_dtensor``). A plain XLA target is a functional tensor: the op
    would pass torch-xla's functionalization fallback first, which wraps the handler's outputs
    (already functional) a second time and asserts. The values are the same."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._ops._math_ops import _skip_dim, replicate_reduction_dims
    from torch.overrides import TorchFunctionMode

    losses = (F.cross_entropy, F.nll_loss)

    class LossTargets(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if func in losses and len(args) >= 2 and isinstance(args[0], DTensor) and isinstance(args[1], torch.Tensor) and not isinstance(args[1], DTensor):
                x = args[0]
                channel = 1 if x.dim() >= 2 else 0
                placements = _skip_dim(replicate_reduction_dims(x.placements, [channel]), channel)
                args = (x, DTensor.from_local(args[1], x.device_mesh, placements, run_check=False), *args[2:])
            return func(*args, **kwargs)

    return LossTargets


def _refuse_fully_shard(module: Any) -> None:
    """FSDP2 (``fully_shard``) is not hosted: its pre-forward hook copies every parameter of a
    group into one flat buffer and all-gathers that (``foreach_all_gather``, whose copy-in op
    crashes torch-xla on placeholders), so no all-gather of a parameter itself, which the
    ``gathered`` relation binds, would exist. FSDP written on DTensor (parameters distributed
    over (dp, tp) and redistributed to Replicate() on dp in the forward) is hosted."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    if kind is None or not hasattr(module, "named_modules"):
        return
    wrapped = [name or "the model" for name, sub in module.named_modules() if isinstance(sub, kind)]
    if wrapped:
        raise _declaration_error(
            f"{wrapped[0]!r} is wrapped by fully_shard (FSDP2), which is not hosted yet: its forward all-gathers one flat buffer of copied parameters "
            "(foreach_all_gather), not the parameters; write FSDP on DTensor instead (distribute_tensor(w, mesh, [Shard(0), Shard(d)]) and "
            "w.redistribute(mesh, [Replicate(), Shard(d)]) in the forward: the relation is then 'gathered' over the dp groups)",
            "entry",
        )


def _check_even(name: str, placed: Placed, full: tuple[int, ...]) -> None:
    """A shard that does not divide its dim is a declaration error before anything is traced:
    DTensor gives the ranks unequal pieces (torch.chunk), and a rank's ``from_local`` of an
    activation computed from its piece infers a global shape of c times its own extent, so the
    trace would fail (or lie) far from the cause."""
    for (kind, dim), group in zip(placed.placements, placed.groups, strict=True):
        c = len(group) * (placed.split if kind == "shard" else 1)
        if kind == "shard" and dim is not None and len(group) > 1 and 0 <= dim < len(full) and full[dim] % c:
            raise _declaration_error(
                f"parameter {name!r} is {placed.describe()}: dim {dim} of its global shape {list(full)} ({full[dim]}) "
                f"does not divide over the {len(group)} ranks of the mesh dim (DTensor would give the ranks unequal pieces)",
                "entry",
            )


class Hosting:
    """One trace of ``module``'s DTensor parameters (see the module's docstring)."""

    def __init__(self, module: Any, args: Mapping[str, Any] | None = None) -> None:
        # The tensors the program is called with, by input name: a from_local of one of them is
        # checked against the input's declaration (traced_inputs).
        self.args = dict(args or {})
        self.input_placements: dict[str, Placed] = {}
        self.dtensors: dict[str, Any] = {}
        _refuse_fully_shard(module)
        if _dtensor_class() is not None and module is not None and hasattr(module, "named_parameters"):
            state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
            self.dtensors = {name: t for name, t in state.items() if is_dtensor(t)}
        self.placements: dict[str, Placed] = {name: _placed(t) for name, t in self.dtensors.items()}
        for name, placed in self.placements.items():
            _check_even(name, placed, tuple(self.dtensors[name].shape))
        self._outputs: list[tuple[Any, Placed]] = []
        self._stack: ExitStack | None = None

    @property
    def active(self) -> bool:
        return bool(self.dtensors) or _dtensor_class() is not None

    def local_shape(self, name: str, tensor: Any) -> tuple[int, ...]:
        if name in self.dtensors:
            return tuple(int(n) for n in self.dtensors[name]._local_tensor.shape)
        return tuple(tensor.shape)

    def wrap(self, name: str, local: Any) -> Any:
        """The DTensor a traced rank reads for parameter ``name``: ``local`` on its mesh."""
        if name not in self.dtensors:
            return local
        from torch.distributed.tensor import DTensor

        original = self.dtensors[name]
        return DTensor.from_local(local, original.device_mesh, original.placements, run_check=False, shape=original.shape, stride=original.stride())

    def __enter__(self) -> Hosting:
        self._stack = ExitStack()
        if _dtensor_class() is None:
            return self
        import torch
        from torch.distributed import device_mesh
        from torch.distributed.tensor import _dispatch

        mesh_class = device_mesh.DeviceMesh

        def get_type(mesh: Any) -> str:
            return "xla"

        def set_type(mesh: Any, value: str) -> None:
            mesh.__dict__["device_type"] = value

        # A data descriptor on the class wins over the instance attribute every mesh sets.
        mesh_class.device_type = property(get_type, set_type)  # type: ignore[attr-defined]
        self._stack.callback(delattr, mesh_class, "device_type")

        functionalize = torch._C.DispatchKey.Functionalize
        original = _dispatch.OpDispatcher.dispatch

        def dispatch(dispatcher: Any, op_call: Any, args: Any, kwargs: Any) -> Any:
            excluded = torch._C._dispatch_tls_local_exclude_set()
            if not excluded.has(functionalize):
                return original(dispatcher, op_call, args, kwargs)
            with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded.remove(functionalize)):
                return original(dispatcher, op_call, args, kwargs)

        _dispatch.OpDispatcher.dispatch = dispatch  # type: ignore[method-assign]
        self._stack.callback(setattr, _dispatch.OpDispatcher, "dispatch", original)
        if self.args and _expected:
            self._check_from_local(_expected[-1])
        self._mask_writes(torch)
        self._stack.enter_context(_loss_targets()())
        return self

    def _check_from_local(self, expected: _Expected) -> None:
        """``DTensor.from_local`` of an input (the parallel styles' input hooks call it on the
        module's inputs: ``ColwiseParallel(input_layouts=...)``, ``PrepareModuleInput``,
        ``SequenceParallel``) says how the ranks hold it: checked against the declaration."""
        from torch.distributed.tensor import DTensor

        assert self._stack is not None
        saved = DTensor.__dict__["from_local"]
        original = DTensor.from_local

        def from_local(local_tensor: Any, device_mesh: Any = None, placements: Any = None, *args: Any, **kwargs: Any) -> Any:
            name = next((n for n, t in self.args.items() if t is local_tensor), None)
            if name is not None and name in expected.specs and device_mesh is not None and placements is not None:
                self._check_input(expected, name, _placed_on(device_mesh, tuple(placements), local_tensor.dim()))
            return original(local_tensor, device_mesh, placements, *args, **kwargs)

        DTensor.from_local = staticmethod(from_local)  # type: ignore[method-assign]
        self._stack.callback(setattr, DTensor, "from_local", saved)

    def _check_input(self, expected: _Expected, name: str, placed: Placed) -> None:
        spec = expected.specs[name]
        self.input_placements.setdefault(name, placed)
        try:
            dim = input_relation(name, placed, tuple(spec.shape), spec.shard, tuple(spec.blocks), expected.derive, expected.groups)
        except PlacementError as e:
            raise _declaration_error(f"{e} (DTensor.from_local at {_caller()})", "entry") from None
        if spec.shard is None and dim is not None:
            raise InputDerived(name, dim)

    def _mask_writes(self, torch: Any) -> None:
        """``x[mask] = v`` / ``x[mask, :] = v`` with a boolean mask of x's leading dims runs as
        ``x.masked_fill_(mask, v)`` (the same value). DTensor's vocab-parallel embedding
        (``_MaskPartial``) writes its masks this way inside ``__torch_dispatch__``, where no
        torch-function shim sees it; torch-xla lowers a boolean index through ``nonzero``, a
        data-dependent shape that crashes on placeholders."""
        assert self._stack is not None
        cls = torch.Tensor
        had = "__setitem__" in cls.__dict__
        original = cls.__setitem__

        def setitem(target: Any, key: Any, value: Any) -> Any:
            mask = key[0] if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], slice) and key[1] == slice(None) else key
            if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and target.device.type == "xla" and 0 < mask.dim() <= target.dim() and tuple(mask.shape) == tuple(target.shape[: mask.dim()]) and (mask is key or mask.dim() < target.dim()):
                full = mask.reshape(*mask.shape, *([1] * (target.dim() - mask.dim())))
                target.masked_fill_(full, value)
                return None
            return original(target, key, value)

        cls.__setitem__ = setitem
        self._stack.callback(setattr, cls, "__setitem__", original) if had else self._stack.callback(delattr, cls, "__setitem__")

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def unwrap(self, out: Any) -> Any:
        """``out`` with DTensors replaced by their local tensors and collectives waited for."""
        import torch

        if isinstance(out, torch.Tensor):
            cls = _dtensor_class()
            if cls is not None and isinstance(out, cls):
                placed = _placed(out)
                local = self.unwrap(out.to_local())
                self._outputs.append((local, placed))
                return local
            from torch.distributed._functional_collectives import AsyncCollectiveTensor

            if isinstance(out, AsyncCollectiveTensor):
                return out.wait()
            return out
        if isinstance(out, dict):
            return {k: self.unwrap(v) for k, v in out.items()}
        if isinstance(out, (tuple, list)):
            items = [self.unwrap(v) for v in out]
            return type(out)(items) if isinstance(out, list) or type(out) is tuple else type(out)(*items)
        return out

    def output_placements(self, tensors: list[Any]) -> list[Placed | None]:
        """The placements of each flattened output (None: not a DTensor the program returned)."""
        return [next((placed for local, placed in self._outputs if local is t), None) for t in tensors]
