"""rules/a2astack.egg (split, stack, all-to-all, unbind, concatenate) reads only tables other
families write: ``unitdim`` (laws/argreduce.py), ``unitdrop`` (laws/scancarry.py), ``catdim``
and ``sliceblock`` (graph.py), ``alltoalldim`` (laws/core.py), and rules/alltoall.egg's rkblock
relations. It adds no table of its own."""

from __future__ import annotations

TABLES: tuple[str, ...] = ()
