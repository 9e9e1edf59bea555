"""rules/a2adup.egg (all-to-all of a duplicate) reads only tables other families already write:
``alltoalldim`` (engine/analysis/laws/core.py: an array all-to-all along one dim over the sharding
groups in order) and ``sliceblock`` (graph.py: a literal slice taking one block of n along one
dim). It adds no table of its own."""

from __future__ import annotations

TABLES: tuple[str, ...] = ()
