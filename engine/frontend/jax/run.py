"""``python -m shardproof.engine.frontend.jax run|build [--config ...]``: the same as
``shardproof run|build``, which builds ``framework: jax`` models through the runner like torch
ones (one worker per environment, a forked child per model under its caps, ``result.json``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from ...cli import main as cli_main

    return cli_main(list(sys.argv[1:] if argv is None else argv))
