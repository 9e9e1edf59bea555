"""The witness executes what XLA executes: differential test against JAX's own execution.

Every program of tests/witness_jax/programs.py (shard_map and GSPMD, flax linen and nnx; mesh,
mesh-with-device-order, iota and explicit group forms; psum, all_gather, psum_scatter,
ppermute, all_to_all, pmax/pmin; DP x TP 2x2 meshes) is run by JAX on 4 virtual CPU devices in
one subprocess (tests/witness_jax/run.py; ``XLA_FLAGS`` must be set before jax starts). The
witness's runtime then executes the per-device module XLA wrote after SPMD partitioning on the
same per-device inputs, and every device's every output must equal JAX's, within the
witness's own per-dtype tolerance (integers exactly). Each program is also executed

- with every replica-group list rewritten as explicit ``{{...}}`` groups (as the analysis
  reads them: hlo.parser / hlo.meshgroups), so the explicit form and our reading of the mesh
  and iota forms are checked against JAX too;
- flattened (engine.witness.flat: loops unrolled, device id as a parameter and back), the text
  the witness executes for compiled modules; and the compiled module itself
  (``compile().as_text()``), flattened, for the GSPMD and flax programs.

Before the fix, a module with two meshes or a mesh with a device order (a vocab-sharded
embedding with log_softmax, an ``nn.scan`` decoder) ran over other groups than JAX ran it over.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "witness_jax"))

from programs import PROGRAMS  # noqa: E402

from shardproof.engine.hlo.parser import parse_hlo  # noqa: E402
from shardproof.engine.hlo.printer import print_hlo  # noqa: E402
from shardproof.engine.witness import flat, runtime  # noqa: E402
from shardproof.engine.witness.compare import default_tol  # noqa: E402

NAMES = [p.name for p in PROGRAMS]
# The compiled module flattened: the GSPMD / flax programs (shard_map bodies are covered as
# written and flattened; their compiled text adds nothing the flattener reads differently).
COMPILED = [n for n in NAMES if not n.startswith(("smap_", "iota_smap_"))]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("witness_jax")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    proc = subprocess.run([sys.executable, str(HERE / "witness_jax" / "run.py"), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _case(cases: Path, name: str) -> tuple[Path, list[list[np.ndarray]], list[list[np.ndarray]]]:
    manifest = json.loads((cases / "manifest.json").read_text())
    entry = manifest[name]
    assert entry["status"] == "ok", f"JAX could not run {name}:\n{entry.get('error')}"
    folder = cases / name
    n_args, n_out = int(entry["args"]), int(entry["outputs"])
    arg_dt, out_dt = entry["arg_dtypes"].split(","), entry["out_dtypes"].split(",")
    with np.load(folder / "args.npz") as a, np.load(folder / "truth.npz") as t:
        args = [[_as(a[f"d{d}_{i}"], arg_dt[i]) for i in range(n_args)] for d in range(4)]
        truth = [[_as(t[f"d{d}_{i}"], out_dt[i]) for i in range(n_out)] for d in range(4)]
    return folder, args, truth


def _as(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` as ``dtype`` (npz returns an ml_dtypes array as raw bytes of the same size)."""
    if a.dtype.kind == "V":
        import ml_dtypes

        return a.view(getattr(ml_dtypes, dtype))
    return a


def _mismatches(got: list[list[np.ndarray]], truth: list[list[np.ndarray]]) -> list[str]:
    bad = []
    for d in range(4):
        assert len(got[d]) == len(truth[d]), f"device {d}: {len(got[d])} outputs, JAX gave {len(truth[d])}"
        for k, (g, t) in enumerate(zip(got[d], truth[d], strict=True)):
            if g.shape != t.shape or g.dtype != t.dtype:
                bad.append(f"device {d} output {k}: {g.dtype}{list(g.shape)} vs JAX {t.dtype}{list(t.shape)}")
                continue
            if t.dtype.kind in "biu":
                if not np.array_equal(g, t):
                    bad.append(f"device {d} output {k}: {int((g != t).sum())} elements differ")
                continue
            tol = default_tol(t.dtype)
            g64, t64 = g.astype(np.float64), t.astype(np.float64)
            scale = max(1.0, float(np.abs(t64).max())) if t.size else 1.0
            err = np.abs(g64 - t64) - (tol * scale + tol * np.abs(t64))
            if t.size and float(err.max()) > 0:
                i = np.unravel_index(int(np.argmax(err)), t.shape)
                bad.append(f"device {d} output {k} at {list(i)}: witness {g64[i]}, JAX {t64[i]}")
    return bad


def explicit_groups(text: str) -> str:
    """Every replica-group list written as the explicit groups the analysis reads it as."""
    module = parse_hlo(text, "<explicit>")
    for comp in module.computations.values():
        for ins in comp.instructions:
            groups = ins.parsed.get("replica_groups")
            if "replica_groups" in ins.attrs and isinstance(groups, list):
                ins.attrs["replica_groups"] = "{" + ",".join("{" + ",".join(str(x) for x in g) + "}" for g in groups) + "}"
    return print_hlo(module)


def _run(text: str, args: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    return runtime.run_distributed(text, args)


def test_corpus_is_large_and_covers_every_group_form(cases: Path) -> None:
    assert len(PROGRAMS) >= 30
    texts = [(cases / n / "distributed.hlo").read_text() for n in NAMES if (cases / n / "distributed.hlo").exists()]
    assert len(texts) == len(NAMES)
    assert any("replica_groups=mesh[" in t and "device_ids=(" in t for t in texts)
    assert any(len(set(re.findall(r"replica_groups=(mesh\[[^\]]*\])", t))) > 1 for t in texts)
    assert any("]<=[" in t and "replica_groups=[" in t for t in texts)
    for op in ("all-reduce(", "all-gather(", "reduce-scatter(", "collective-permute(", "all-to-all("):
        assert any(op in t for t in texts), op


@pytest.mark.parametrize("name", NAMES)
def test_witness_equals_jax(cases: Path, name: str) -> None:
    folder, args, truth = _case(cases, name)
    text = (folder / "distributed.hlo").read_text()
    bad = {"as written": _mismatches(_run(text, args), truth)}
    bad["explicit groups"] = _mismatches(_run(explicit_groups(text), args), truth)
    bad["flattened"] = _mismatches(_run(flat.flat_text(text), args), truth)
    if name in COMPILED:
        bad["compiled, flattened"] = _mismatches(_run(flat.executable((folder / "compiled.hlo").read_text()), args), truth)
    wrong = {k: v for k, v in bad.items() if v}
    assert not wrong, f"{name}: the witness differs from JAX: {json.dumps(wrong, indent=1)[:3000]}"
