"""Pipeline-parallel models: one program per stage, joined by point-to-point transfers.

An entry point returns :class:`Pipeline` instead of ``Model``; ``build.py`` traces each stage
with the stage's ``torch.distributed`` send/recv calls recorded as transfer edges, writes
``stage<k>.hlo`` and ``pipeline.yaml``, and composes them (``engine/pipeline/compose.py``)
into the ``distributed.hlo`` the verifier checks against the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..declare import Input


@dataclass
class Pipeline:
    """The declaration of a pipeline-parallel model.

    ``baseline``: the single-device program (an ``nn.Module`` or callable of the inputs).
    ``stage``: called with the stage's rank (an int, 0..stages-1), returns what that rank runs:
    an ``nn.Module`` or callable of the same inputs, which receives its activations with
    ``dist.recv``/``dist.irecv``/``batch_isend_irecv`` and sends with ``dist.send``/``isend``.
    What it returns are results of the pipeline (the last stage's output, its loss); the
    pipeline's results are every stage's results in stage order. Its parameter and buffer
    names must be the baseline's (each stage holds some of the baseline's layers).
    ``outputs``: expected relation per result (default: all ``replicate``).
    ``plan``: with ``tp`` > 1 (pipeline x tensor parallelism), how the ranks of a stage's TP
    group hold its weights (the ``Model.plan`` vocabulary); every stage is traced as the one
    SPMD program of its group and rank r of stage k sends to rank r of its peer stage, as
    Megatron's pipeline communication does, so peers are named by stage index.
    """

    baseline: Any
    stage: Callable[[int], Any]
    stages: int
    inputs: Sequence[Input]
    outputs: Sequence[Any] | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)
