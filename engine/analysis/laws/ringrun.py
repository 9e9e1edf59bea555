"""rules/ringrun.egg (a ring all-reduce forwarding its running sum) reads only tables other
families already write: ``cpshift`` (a collective-permute that is the cyclic shift of every
sharding group) and the ``rsum`` facts of rules/permute.egg. It adds no table of its own."""

from __future__ import annotations

TABLES: tuple[str, ...] = ()
