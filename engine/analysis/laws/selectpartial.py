"""rules/selectpartial.egg (a partial sum masked against zero by a replicated predicate) reads
only tables other families already write (``selectop``, ``zero``). It adds no table of its own."""

from __future__ import annotations

TABLES: tuple[str, ...] = ()
