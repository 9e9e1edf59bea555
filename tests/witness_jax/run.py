"""Run the programs of programs.py with JAX on 4 virtual CPU devices and write, per program, what
the witness needs to execute it and what JAX computed (the truth).

Usage: ``python tests/witness_jax/run.py OUT_DIR [NAME ...]`` (a fresh process: ``XLA_FLAGS``
must be set before jax starts). Writes ``OUT_DIR/manifest.json`` and per program
``OUT_DIR/<name>/``: ``distributed.hlo`` (the per-device module after SPMD partitioning),
``compiled.hlo`` (``compile().as_text()``), ``args.npz`` (``d<partition>_<k>``: the k-th flat
argument on the device that runs partition p) and ``truth.npz`` (``d<partition>_<k>``: the k-th
output leaf JAX returned on that device). A program JAX itself cannot run is recorded with
its error (the test fails on it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

DEVICES = 4


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    wanted = set(argv[1:])
    dump = Path(tempfile.mkdtemp(prefix="witness_jax_dump"))
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES} --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import jax
    import numpy as np
    from programs import PROGRAMS

    assert len(jax.devices()) == DEVICES, jax.devices()
    manifest: dict[str, dict[str, str]] = {}
    for k, prog in enumerate(PROGRAMS):
        if wanted and prog.name not in wanted:
            continue
        folder = out / prog.name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            rng = np.random.default_rng(1000 + k)
            jax.config.update("jax_use_shardy_partitioner", prog.shardy)
            try:
                jitted, args = prog.build(rng)
                before = set(dump.iterdir())
                compiled = jitted.lower(*args).compile()
            finally:
                jax.config.update("jax_use_shardy_partitioner", True)
            after = [p for p in set(dump.iterdir()) - before if "after_spmd-partitioning" in p.name]
            if len(after) != 1:
                raise RuntimeError(f"expected one module after SPMD partitioning, got {[p.name for p in after]}")
            (folder / "distributed.hlo").write_text(after[0].read_text())
            (folder / "compiled.hlo").write_text(compiled.as_text())
            in_sh = jax.tree_util.tree_leaves(compiled.input_shardings[0])
            # Partition p runs on the p-th device of the executable's assignment.
            order = [d.id for d in in_sh[0]._device_assignment]
            flat_args = jax.tree_util.tree_leaves(args)
            if len(flat_args) != len(in_sh):
                raise RuntimeError(f"{len(flat_args)} argument leaves for {len(in_sh)} input shardings")
            saved: dict[str, np.ndarray] = {}
            for i, (a, sh) in enumerate(zip(flat_args, in_sh, strict=True)):
                placed = jax.device_put(a, sh)
                by_dev = {s.device.id: np.asarray(s.data) for s in placed.addressable_shards}
                for p, dev in enumerate(order):
                    saved[f"d{p}_{i}"] = by_dev[dev]
            np.savez(folder / "args.npz", **saved)
            outs = jax.tree_util.tree_leaves(compiled(*args))
            truth: dict[str, np.ndarray] = {}
            for i, o in enumerate(outs):
                by_dev = {s.device.id: np.asarray(s.data) for s in o.addressable_shards}
                for p, dev in enumerate(order):
                    truth[f"d{p}_{i}"] = by_dev[dev]
            np.savez(folder / "truth.npz", **truth)
            # npz keeps ml_dtypes (bfloat16) as raw void bytes: the names say how to view them.
            manifest[prog.name] = {"status": "ok", "args": str(len(flat_args)), "outputs": str(len(outs)),
                                   "arg_dtypes": ",".join(str(saved[f"d0_{i}"].dtype) for i in range(len(flat_args))),
                                   "out_dtypes": ",".join(str(truth[f"d0_{i}"].dtype) for i in range(len(outs)))}
        except Exception:
            manifest[prog.name] = {"status": "error", "error": traceback.format_exc()[-3000:]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
