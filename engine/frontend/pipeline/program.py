"""A rank's program built from the stage modules it holds, for schedules that run modules.

``torch.distributed.pipelining`` and Megatron's schedules do not call one module with the
inputs: a schedule object calls the stage module(s) a rank holds, once per microbatch, and
sends and receives in between. :class:`RankProgram` makes that a program the front end can
trace: its parameters and buffers are those of the given modules under their own names (the
baseline's names, as ``pipeline()`` keeps them and as a stage cut from the model with its
layers deleted keeps them), so the tracer's placeholders replace exactly the weights the
schedule's modules read; its forward is the user's function that runs the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def rank_program(modules: Sequence[Any], run: Callable[..., Any], rename: Callable[[str], str] | None = None) -> Any:
    """An ``nn.Module`` whose state is ``modules``' (named as in each module) and whose forward
    is ``run``. Several modules (the virtual stages of an interleaved schedule) may hold
    different parts of one tree (``layers.0`` and ``layers.4``); a name held by two modules is
    an error: the ranks' weights would be ambiguous. ``rename`` maps a stage module's submodule
    path to the baseline's, for libraries that number a stage's layers from 0 (Megatron's
    TransformerBlock holds ``decoder.layers.0`` on every stage; its global number is the
    stage's layer offset plus that)."""
    import torch.nn as nn

    class RankProgram(nn.Module):
        def forward(self, *args: Any) -> Any:
            return run(*args)

    root = RankProgram()
    owners: dict[str, Any] = {}
    for module in modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"rank_program: expected nn.Module stage modules, got {type(module).__name__}")
        state = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        for name, _ in state:
            local = name.rpartition(".")[0]
            owner = module.get_submodule(local) if local else module
            path = rename(local) if rename is not None and local else local
            if owners.get(path, owner) is not owner:
                raise ValueError(f"rank_program: {name!r} is held by two stage modules of this rank")
            owners[path] = owner
    if "" in owners:
        # functional_call swaps a weight on the module that holds it; a top-level weight would
        # be swapped on this wrapper, not on the stage module the schedule calls.
        raise ValueError("rank_program: a stage module holds a parameter or buffer at its top level; keep weights in submodules")
    # The tree: each owner module (one holding a parameter or buffer itself) is placed at its
    # path, shallow paths first; the paths above it are plain containers. An owner below
    # another owner's path is then reached through that owner's own children.
    for path in sorted(owners, key=lambda p: p.count(".")):
        node = root
        parts = path.split(".")
        for i, part in enumerate(parts):
            child = node._modules.get(part)
            if i == len(parts) - 1:
                if child is None:
                    node._modules[part] = owners[path]
                elif child is not owners[path]:
                    raise ValueError(f"rank_program: two stage modules of this rank hold {path!r}")
                break
            if child is None:
                child = node._modules[part] = nn.Module()
            node = child
    return root
