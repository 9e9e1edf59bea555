"""Trace-time shims: real CUDA-minded code builds on CPU through torch-xla, unchanged.

- ``device="cuda"``, ``device=torch.cuda.current_device()`` (an int) and ``.cuda()`` put the
  tensor on the XLA device (inside ``__init__``, under the meta device, on meta);
- ``x[mask] = v`` with a boolean mask becomes ``x.masked_fill_(mask, v)``: torch-xla's
  index_put with a boolean mask has a data-dependent shape and crashes the lowering;
- a CPU tensor moved to the XLA device inside forward becomes a constant of the program, not
  a parameter nobody declared;
- Megatron's CUDA RNG tracker is set up (its states live on the CPU here);
- DeepSpeed's communication backend starts without its shared-memory CPU kernel.

Everything is undone when the context exits.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any


def _is_cuda(device: Any) -> bool:
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        return True
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _constant(tensor: Any, device: Any) -> Any:
    """``tensor`` (CPU, concrete) rebuilt on ``device`` from its values, so that it lowers to a
    constant: torch-xla uploads a CPU tensor as device data, i.e. an HLO parameter."""
    import torch

    if tensor.device.type == "meta":
        raise RuntimeError("a meta tensor was moved to the XLA device inside forward: its values are unknown at build time")
    flat = tensor.detach().reshape(-1).tolist()
    if not flat:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    # Python numbers are constants (capture.keep_scalars_constant); a stack of them is a literal
    # the lowering folds into one constant per distinct value, which XLA's printer keeps.
    values = torch.stack([torch.tensor(v, dtype=tensor.dtype, device=device) for v in flat]) if len(flat) <= 4096 else None
    if values is None:
        raise RuntimeError(f"a CPU tensor of {tensor.numel()} elements moved to the XLA device inside forward is too large to become a constant")
    return values.reshape(tensor.shape)


def _bool_mask(key: Any, dims: int) -> Any:
    """The boolean tensor of ``x[mask]`` or ``x[mask, :, ...]`` / ``x[mask, ...]``, else None."""
    import torch

    if isinstance(key, torch.Tensor):
        return key if key.dtype == torch.bool else None
    if isinstance(key, tuple) and key and isinstance(key[0], torch.Tensor) and key[0].dtype == torch.bool:
        rest = key[1:]
        if all(k is Ellipsis or (isinstance(k, slice) and k == slice(None)) for k in rest):
            return key[0]
    return None


def _has_bool_index(key: Any) -> bool:
    import torch

    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, torch.Tensor) and k.dtype == torch.bool for k in parts)


def _mode_class() -> type:
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaToXla(TorchFunctionMode):
        def __init__(self, device: Any, meta: bool) -> None:
            super().__init__()
            self.device = device
            self.meta = meta

        def target(self) -> Any:
            return torch.device("meta") if self.meta else self.device

        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs and _is_cuda(kwargs["device"]):
                kwargs["device"] = self.target()
            if func is torch.Tensor.cuda:
                return self._move(args[0])
            if func is torch.Tensor.to:
                moved = self._to(args, kwargs)
                if moved is not None:
                    return moved
            if func is torch.Tensor.__setitem__ and len(args) == 3:
                target, key, value = args
                mask = _bool_mask(key, target.dim())
                if mask is not None:
                    if mask.shape != target.shape[: mask.dim()]:
                        raise RuntimeError(f"x[mask] = v with a boolean mask of shape {list(mask.shape)} over a tensor of shape {list(target.shape)}: only a mask of the leading dims becomes masked_fill")
                    full = mask.reshape(*mask.shape, *([1] * (target.dim() - mask.dim())))
                    with torch._C.DisableTorchFunction():
                        target.masked_fill_(full, value)
                    return None
                if _has_bool_index(key):
                    raise RuntimeError("x[...] = v indexed by a boolean tensor in a form other than x[mask] or x[mask, :]: torch-xla cannot lower it")
            if func is torch.Tensor.__getitem__ and len(args) == 2 and _has_bool_index(args[1]):
                raise RuntimeError("x[mask] with a boolean mask has a data-dependent shape; a traced program cannot hold it (use torch.where or masked_fill)")
            return func(*args, **kwargs)

        def _move(self, tensor: Any) -> Any:
            target = self.target()
            if tensor.device.type == "cpu" and target.type == "xla":
                return _constant(tensor, target)
            with torch._C.DisableTorchFunction():
                return tensor.to(target)

        def _to(self, args: Any, kwargs: dict[str, Any]) -> Any:
            tensor, rest = args[0], list(args[1:])
            device = kwargs.get("device")
            if rest and (isinstance(rest[0], (str, int, torch.device)) and not isinstance(rest[0], bool)):
                device = rest[0]
                if _is_cuda(device):
                    rest[0] = self.target()
                    device = rest[0]
            if device is None:
                return None
            device = torch.device(device) if isinstance(device, str) else device
            if isinstance(device, torch.device) and device.type == "xla" and tensor.device.type == "cpu":
                out = _constant(tensor, device)
                dtype = kwargs.get("dtype") or next((a for a in rest[1:] if isinstance(a, torch.dtype)), None)
                return out.to(dtype) if dtype is not None else out
            with torch._C.DisableTorchFunction():
                return tensor.to(*rest, **kwargs)

    return CudaToXla


@contextmanager
def cuda_as_xla(meta: bool = False) -> Iterator[None]:
    """Run CUDA-minded code on the XLA device (``meta``: on the meta device, for ``__init__``)."""
    import torch
    import torch_xla

    device = torch_xla.device()
    with ExitStack() as stack:
        saved = {name: getattr(torch.cuda, name) for name in ("current_device", "is_available", "device_count", "synchronize", "current_stream", "get_device_capability")}
        torch.cuda.current_device = lambda: 0  # an int: the mode maps it to the XLA device
        torch.cuda.device_count = lambda: 1
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.get_device_capability = lambda *a, **k: (8, 0)
        stack.callback(lambda: [setattr(torch.cuda, k, v) for k, v in saved.items()])
        stack.enter_context(_mode_class()(device, meta))
        yield


def setup_megatron_rng(seed: int = 1234) -> None:
    """Megatron's tensor-parallel RNG tracker, with the CUDA generator's state kept on the CPU.

    ``model_parallel_cuda_manual_seed`` and ``get_cuda_rng_tracker().fork()`` read and set CUDA
    RNG states; in a forked build child CUDA cannot even be initialized. A build traces no
    random numbers that matter (dropout is off in the declared configs; weights are
    placeholders), so the states are the CPU generator's and setting one is a no-op.
    """
    import torch

    try:
        from megatron.core.tensor_parallel import random as mrandom
    except ImportError:
        return
    cpu_state = lambda *a, **k: torch.get_rng_state()  # noqa: E731
    mrandom._get_cuda_rng_state = cpu_state
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    torch.cuda.get_rng_state = cpu_state
    torch.cuda.manual_seed = lambda *a, **k: None
    tracker = mrandom.get_cuda_rng_tracker()
    tracker.reset()
    for offset, name in enumerate((mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME, mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, mrandom._DATA_PARALLEL_RNG_TRACKER_NAME)):
        tracker.add(name, seed + 2718 + offset)


def host_deepspeed() -> None:
    """``deepspeed.init_distributed()`` over the started ``torch.distributed``, without the
    shared-memory kernel DeepSpeed's CPU accelerator JIT-compiles for it (~85 s with a C++
    compiler, a failure without one). The kernel moves data between processes of one host; a
    build moves none: every collective is an XLA collective of the traced program. Patched only
    when DeepSpeed is already imported (the entry's module imports it)."""
    module = sys.modules.get("deepspeed.comm.torch")
    if module is not None and hasattr(module, "build_shm_op"):
        module.build_shm_op = lambda: None
