"""Pipeline-parallel models: one program per stage, joined by point-to-point transfers.

An entry point returns :class:`Pipeline` instead of ``Model``; ``build.py`` traces each stage
with the stage's ``torch.distributed`` send/recv calls recorded as transfer edges, writes
``stage<k>.hlo`` and ``pipeline.yaml``, and composes them (``engine/pipeline/compose.py``)
into the ``distributed.hlo`` the verifier checks against the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    """

    baseline: Any
    stage: Callable[[int], Any]
    stages: int
    inputs: Sequence[Input]
    outputs: Sequence[Any] | None = None
