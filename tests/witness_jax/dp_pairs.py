"""DP x TP pairs written with JAX ``shard_map`` on a 2x2 mesh (``dp``, ``tp``): the baseline is
one data-parallel group's computation (``jax.jit`` of the single-device function on the group's
part of the batch), the distributed program is the per-device module XLA writes after SPMD
partitioning. The rank groups are the ``tp`` rows ``[[0, 1], [2, 3]]``; the batch input is
``duplicate`` within a group and ``per_group_data`` (each group holds its own part of the
global batch), the weights are sharded over ``tp`` and the same in both groups.

Usage: ``python tests/witness_jax/dp_pairs.py OUT_DIR`` writes ``OUT_DIR/<name>/`` with
``baseline.hlo``, ``distributed.hlo`` and ``relations.yaml`` (a fresh process: ``XLA_FLAGS``
is set before jax starts).

- ``mlp``: correct (column -> row MLP, psum over tp);
- ``b_ppermute_over_dp``: the batch rows are exchanged between the DP groups (a ppermute over
  ``dp``) before the MLP: each group computes the other group's rows;
- ``amax_scale``: each row scaled by its largest magnitude (an fp8-style amax scale), the row's
  features sharded over ``tp`` and the amax a pmax over ``tp``;
- ``b_pmax_over_dp``: the same with the pmax over ``dp`` and ``tp``: a row's scale is the
  larger of its own and the other DP group's row (with the same data in every group the extra
  axis is invisible).

And on a 1-D mesh of 4 (``tp``), for the witness's edge inputs (engine.witness.inputs):

- ``vocab_embed``: a vocab-parallel embedding (each rank owns ``V/4`` rows, masks ids outside
  them, psum);
- ``b_vocab_mask_off_by_one``: the mask is ``local > w`` for ``local >= w``: the first id of
  the next rank's block (64, 128, 192 of 256) also takes this rank's last row. Random ids
  rarely hit those three values; the edge inputs hold them.

And one GSPMD pair (``jax.jit`` with ``in_shardings``), correct:

- ``gspmd_embed_log_softmax``: a vocab-sharded table (over ``axis_0`` of a 2x2 mesh) gathered
  by ids and multiplied back for a log-softmax loss. XLA writes two meshes into the module (the
  gather's ``mesh['axis_0'=2,'axis_1'=1,'axis_2'=2]`` and the softmax's
  ``mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2]``); the rank groups are the ``axis_0``
  columns ``[[0, 2], [1, 3]]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

B, D, F = 4, 8, 16  # one group's batch, hidden, ffn

RELATIONS_MLP = """groups: [[0, 1], [2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate, per_group_data: true}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 1}
  - {baseline: 2, distributed: 2, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""

RELATIONS_VOCAB = """groups: [[0, 1, 2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: duplicate, int_range: [0, 256]}
  - {baseline: 1, distributed: 1, relation: sharded, dim: 0}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""

RELATIONS_GSPMD_EMBED = """groups: [[0, 2], [1, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 0}
  - {baseline: 1, distributed: 1, relation: duplicate, int_range: [0, 64]}
outputs:
  - {baseline: 0, distributed: 0, relation: duplicate}
"""

RELATIONS_SHARDED = """groups: [[0, 1], [2, 3]]
inputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1, per_group_data: true}
outputs:
  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}
"""


def main(out: Path) -> int:
    dump = Path(tempfile.mkdtemp(prefix="dp_pairs_dump"))
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=4 --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))
    f32 = jnp.float32

    def mlp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.nn.gelu(x @ w1) @ w2

    def mlp_tp(x: Any, w1: Any, w2: Any) -> Any:
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")

    def mlp_mixed(x: Any, w1: Any, w2: Any) -> Any:
        x = jax.lax.ppermute(x, "dp", [(0, 1), (1, 0)])  # BUG: rows of the other DP group
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")

    def amax_scale(x: Any) -> Any:
        return x / jnp.max(jnp.abs(x), axis=-1, keepdims=True)

    def amax_scale_tp(axes: Any) -> Any:
        def body(x: Any) -> Any:
            return x / jax.lax.pmax(jnp.max(jnp.abs(x), axis=-1, keepdims=True), axes)

        return body

    def embed(ids: Any, table: Any) -> Any:
        return jnp.take(table, ids, axis=0)

    def vocab_parallel(off_by_one: bool) -> Any:
        def body(ids: Any, table: Any) -> Any:
            w = table.shape[0]
            local = ids - jax.lax.axis_index("tp") * w
            outside = (local < 0) | ((local > w) if off_by_one else (local >= w))  # BUG (off_by_one): > for >=
            rows = jnp.take(table, jnp.clip(local, 0, w - 1), axis=0)
            return jax.lax.psum(jnp.where(outside[:, None], 0.0, rows), "tp")

        return body

    mesh4 = Mesh(np.array(jax.devices()[:4]), ("tp",))
    mlp_args = ((B, D), (D, F), (F, D))
    pairs = {
        "mlp": (mlp, mlp_tp, mlp_args, (P("dp"), P(None, "tp"), P("tp")), P("dp"), RELATIONS_MLP),
        "b_ppermute_over_dp": (mlp, mlp_mixed, mlp_args, (P("dp"), P(None, "tp"), P("tp")), P("dp"), RELATIONS_MLP),
        "amax_scale": (amax_scale, amax_scale_tp("tp"), ((B, F),), (P("dp", "tp"),), P("dp", "tp"), RELATIONS_SHARDED),
        "b_pmax_over_dp": (amax_scale, amax_scale_tp(("dp", "tp")), ((B, F),), (P("dp", "tp"),), P("dp", "tp"), RELATIONS_SHARDED),
    }
    vocab = {
        "vocab_embed": vocab_parallel(False),
        "b_vocab_mask_off_by_one": vocab_parallel(True),
    }
    for name, body in vocab.items():
        folder = out / name
        folder.mkdir(parents=True)
        args = (jax.ShapeDtypeStruct((6,), jnp.int32), jax.ShapeDtypeStruct((256, D), f32))
        base = jax.jit(embed).lower(*args).as_text(dialect="hlo")
        mapped = jax.jit(jax.shard_map(body, mesh=mesh4, in_specs=(P(), P("tp")), out_specs=P(), check_vma=False))
        before = set(dump.iterdir())
        mapped.lower(*args).compile()
        after = [p for p in set(dump.iterdir()) - before if "after_spmd-partitioning" in p.name]
        assert len(after) == 1, after
        (folder / "baseline.hlo").write_text(_portable(base))
        (folder / "distributed.hlo").write_text(_portable(after[0].read_text()))
        (folder / "relations.yaml").write_text(RELATIONS_VOCAB)
    def embed_loss(table: Any, ids: Any) -> Any:
        lp = jax.nn.log_softmax(jnp.take(table, ids, axis=0) @ table.T)
        return -jnp.mean(jnp.take_along_axis(lp, ids[..., None], -1))

    from jax.sharding import NamedSharding

    mesh22 = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("axis_0", "axis_1"))
    folder = out / "gspmd_embed_log_softmax"
    folder.mkdir(parents=True)
    args = (jax.ShapeDtypeStruct((64, D), f32), jax.ShapeDtypeStruct((2, 8), jnp.int32))
    (folder / "baseline.hlo").write_text(_portable(jax.jit(embed_loss).lower(*args).as_text(dialect="hlo")))
    jitted = jax.jit(embed_loss, in_shardings=(NamedSharding(mesh22, P("axis_0", None)), NamedSharding(mesh22, P())), out_shardings=NamedSharding(mesh22, P()))
    before = set(dump.iterdir())
    jitted.lower(*args).compile()
    after = [p for p in set(dump.iterdir()) - before if "after_spmd-partitioning" in p.name]
    assert len(after) == 1, after
    (folder / "distributed.hlo").write_text(_portable(after[0].read_text()))
    (folder / "relations.yaml").write_text(RELATIONS_GSPMD_EMBED)
    for name, (base_fn, body, shapes, in_specs, out_spec, relations) in pairs.items():
        folder = out / name
        folder.mkdir(parents=True)
        base = jax.jit(base_fn).lower(*(jax.ShapeDtypeStruct(s, f32) for s in shapes)).as_text(dialect="hlo")
        # The distributed program's global batch holds both groups' parts.
        glob = [jax.ShapeDtypeStruct((s[0] * 2, *s[1:]) if k == 0 else s, f32) for k, s in enumerate(shapes)]
        mapped = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False))
        before = set(dump.iterdir())
        mapped.lower(*glob).compile()
        after = [p for p in set(dump.iterdir()) - before if "after_spmd-partitioning" in p.name]
        assert len(after) == 1, after
        (folder / "baseline.hlo").write_text(_portable(base))
        (folder / "distributed.hlo").write_text(_portable(after[0].read_text()))
        (folder / "relations.yaml").write_text(relations)
    return 0


def _portable(text: str) -> str:
    """No path of this machine in the texts (the FileNames table names this file)."""
    here = str(Path(__file__).resolve())
    return text.replace(here, "tests/witness_jax/dp_pairs.py")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
