"""Pause Python's cyclic garbage collector over a phase that allocates many long-lived objects.

Reading, folding and verifying a 405B pair allocates a few million objects that all live to
the end of the check (lines, instructions, graph nodes, facts). The collector, run every 700
allocations, walks the young ones each time and, as the heap grows by a quarter, all of them:
a third of the fold's time and half the time of building a layer's rows, with nothing to
free (a whole 405B check leaves ~4000 objects in cycles). Paused, those few cycles are
collected once the phase ends. Reference counting frees everything else as usual.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # nested or concurrent phases (threads): the last one out restores the collector
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off for the block (and the function it decorates); nesting and threads
    are counted, so it is switched back on only when the last paused phase ends, and only if
    it was on before the first began."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
