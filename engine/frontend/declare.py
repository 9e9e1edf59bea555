"""What a user writes to declare a test model: the entry point's context and its return value.

A model is declared in the user's own Python by an entry point (``module:function`` in
``.shardproof.yml``). ``shardproof build`` calls it under ``torch.device("meta")`` with a
:class:`BuildContext` and expects a :class:`Model` back::

    from shardproof.engine.frontend.declare import BuildContext, Input, Model

    def tiny_llama(ctx: BuildContext) -> Model:
        cfg = LlamaConfig(hidden=ctx.knob("hidden", 64), layers=ctx.knob("layers", 2))
        return Model(
            baseline=Llama(cfg, Parallel(tp=1)),
            distributed=lambda rank: Llama(cfg, Parallel(tp=ctx.tp, rank=rank, groups=ctx.groups)),
            inputs=[Input("tokens", (16, 2), "int64", int_range=(0, cfg.vocab))],
            plan={"layers.*.attn.qkv": {"style": "colwise", "blocks": [64, 32, 32]},
                  "layers.*.attn.out": "rowwise", "embed": "rowwise"},
        )

The front end replaces every parameter and buffer by a placeholder (a ``parameter`` of the HLO
without a buffer), so the modules never allocate weights: building them on the meta device is
what makes 405B-shaped declarations cheap. ``distributed`` is called with the rank as a symbolic
``s32[]`` tensor: the per-rank program must be the same for every rank (SPMD), with the rank
entering only as data.

Nothing here imports torch: the config checker reads these names without paying for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The sharding-plan vocabulary of PyTorch tensor-parallel plans (``parallelize_module`` and
# Hugging Face ``tp_plan``), plus ``expert`` for stacked expert weights.
STYLES = ("colwise", "rowwise", "replicate", "sequence_parallel", "expert")
DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "bool")


@dataclass(frozen=True)
class Input:
    """One positional input of both programs.

    ``shape`` is the whole (baseline) shape; with ``shard=d`` every rank receives the r-th of
    ``c`` equal pieces along ``d`` (sequence parallelism: the sequence dim), otherwise every
    rank receives all of it. ``blocks`` (with ``shard``) splits dim ``d`` into blocks of these
    sizes, each sharded on its own (a fused weight passed as an input). ``int_range`` bounds
    integer inputs (token ids in ``[0, vocab)``), which rules such as the vocab-parallel
    embedding rely on.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    shard: int | None = None
    int_range: tuple[int, int] | None = None
    blocks: tuple[int, ...] = ()


@dataclass
class Model:
    """The declaration an entry point returns.

    ``baseline``: the single-device program, an ``nn.Module`` or a callable taking the inputs.
    ``distributed``: called with the rank (an ``s32[]`` tensor), returns what one rank runs.
    ``plan``: module path or parameter path (``*`` matches one path component) to a style:
    ``"colwise"``, ``"rowwise"``, ``"replicate"``, ``"sequence_parallel"``, ``"expert"``, or a
    mapping ``{"style": "colwise", "blocks": [q, k, v]}`` for fused weights, or
    ``{"shard": dim}``. Parameters matched by no entry must have the same shape on both sides
    and are replicated.
    ``outputs``: the expected relation of each output (``"replicate"``, ``"partial"``,
    ``{"shard": dim}`` (optionally with ``"blocks"``), ``{"like": "<parameter path>"}`` for a
    parameter-shaped output such as an updated weight); default: every output replicated.
    ``.shardproof.yml`` may override it.
    """

    baseline: Any
    distributed: Callable[[Any], Any]
    inputs: Sequence[Input]
    plan: Mapping[str, Any] = field(default_factory=dict)
    outputs: Sequence[Any] | None = None
    description: str = ""


@dataclass
class BuildContext:
    """What the entry point learns from ``.shardproof.yml``.

    ``tp`` is the size of a sharding group (the tensor/sequence/expert-parallel degree) and
    ``groups`` the rank groups the collectives must use. ``variant`` is the model's ``variant:``
    flag (a bug variant's name, or None). Size knobs are read with :meth:`knob`; a knob the
    configuration sets but the entry never reads is reported, so typos do not pass silently.
    """

    name: str
    tp: int
    groups: list[list[int]]
    variant: str | None = None
    size: Mapping[str, Any] = field(default_factory=dict)
    _read: set[str] = field(default_factory=set, repr=False)

    def knob(self, key: str, default: Any) -> Any:
        """The configured value of size knob ``key``, or ``default``; the type must match."""
        self._read.add(key)
        if key not in self.size:
            return default
        value = self.size[key]
        if default is not None and not _same_kind(value, default):
            raise KnobError(key, f"expected {type(default).__name__} like {default!r}, got {value!r}")
        return value

    def unread_knobs(self) -> list[str]:
        return sorted(set(self.size) - self._read)


class KnobError(ValueError):
    """A size knob of the configuration has the wrong type (reported against ``size.<key>``)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"size.{key}: {message}")


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))
