"""Writes this folder's pair (and, with ``--twin DIR``, its correct twin) with JAX: a 2 x 2 CPU mesh
(dp, tp), rank groups along tp; x is split over dp (each group holds its own rows) and replicated
over tp, so on every rank it is a duplicate of its group's baseline x. The bug permutes x over
the dp axis (rank (i, j) receives group 1 - i's rows); the twin permutes it around the tp ring.

    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python tests/soundness_regressions/dp_permute_mixes_groups/generate.py [--twin DIR]

Metadata and the stack-frame table are dropped from the HLO (they name this machine's paths)."""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path


def build(axis: str, out: Path) -> None:
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from shardproof.engine.frontend.jax.build import build_one
    from shardproof.engine.frontend.jax.declare import JaxInput, JaxModel

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))

    def baseline(x: jax.Array) -> jax.Array:
        return x * 2.0

    def body(x: jax.Array) -> jax.Array:
        return jax.lax.ppermute(x, axis, perm=[(0, 1), (1, 0)]) * 2.0

    dist = jax.shard_map(body, mesh=mesh, in_specs=P("dp", None), out_specs=P("dp", None), check_vma=False)
    model = JaxModel(baseline=baseline, distributed=dist, mesh=mesh, inputs=[JaxInput("x", (8, 16), spec=("dp", None))],
                     outputs=[("dp", None)], group_axes=("tp",))
    with tempfile.TemporaryDirectory() as dump:
        build_one(model, "permute", out, Path(dump))
    for name in ("baseline.hlo", "distributed.hlo"):
        p = out / name
        text = re.sub(r", metadata=\{[^{}]*\}", "", p.read_text())
        p.write_text(re.sub(r"\nFileNames\n.*?\n\n(?=\n)", "\n", text, flags=re.S))  # the stack-frame table
    for name in ("baseline.compiled.hlo", "distributed.compiled.hlo"):
        (out / name).unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--twin", type=Path, help="also write the correct twin (a permute over tp) here")
    ns = ap.parse_args()
    build("dp", Path(__file__).parent)
    if ns.twin:
        build("tp", ns.twin)


if __name__ == "__main__":
    main()
