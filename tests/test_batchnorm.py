"""batch-norm-training / -grad / -inference (torch LayerNorm and BatchNorm under torch-xla) are
expanded into plain ops (engine/hlo/batchnorm.py) that compute what XLA computes: XLA's CPU
runtime runs the original and the expanded text on the same inputs. Then a sequence-parallel
LayerNorm pair verifies and a LayerNorm over a sharded hidden dim does not."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")
torch_xla = pytest.importorskip("torch_xla")

from oracle import run_hlo  # noqa: E402

from shardproof.engine.errors import HloParseError  # noqa: E402
from shardproof.engine.hlo.normalize import normalize  # noqa: E402
from shardproof.engine.hlo.parser import parse_hlo  # noqa: E402
from shardproof.engine.hlo.printer import print_hlo  # noqa: E402
from shardproof.engine.witness.compare import default_tol  # noqa: E402

BN_OP = re.compile(r"\sbatch-norm-(training|grad|inference)\(")
F = torch.nn.functional


def _hlo(outs: list) -> str:
    return torch_xla._XLAC._get_xla_tensors_hlo(outs)


def _args(text: str, seed: int, positive: bool = False) -> list[np.ndarray]:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    np_of = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "s64": np.int64}
    out = []
    params = parse_hlo(text).entry.parameters
    assert any(p.shape.rank >= 2 for p in params), "the normalised input must be a parameter"
    for p in params:
        # Offset and spread so that E[x²] - E[x]² is not trivially E[x²].
        # positive: a running variance below 0 would make both sides NaN alike and test nothing.
        v = rng.standard_normal(p.shape.dims) * 3 + 1.5
        out.append((np.abs(v) if positive else v).astype(np_of[p.shape.dtype]))
    return out


def _expanded_matches(text: str, opcode: str, positive: bool = False) -> None:
    assert re.search(rf"\s{opcode}\(", text), "torch-xla no longer emits " + opcode
    expanded = print_hlo(normalize(parse_hlo(text)))
    assert not BN_OP.search(expanded)
    for seed in (0, 1):
        args = _args(text, seed, positive)
        want, got = run_hlo(text, args), run_hlo(expanded, args)
        assert len(want) == len(got)
        for w, g in zip(want, got, strict=True):
            w64, g64 = w.astype(np.float64), g.astype(np.float64)
            assert np.isfinite(w64).all()
            scale = max(1.0, float(np.abs(w64).max()))
            assert np.abs(w64 - g64).max() <= default_tol(w.dtype) * scale, (opcode, w.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_layernorm_forward_and_backward_match_xla(dtype: str) -> None:
    dev = torch_xla.device()
    dt = getattr(torch, dtype)
    ln = torch.nn.LayerNorm(16).to(dev).to(dt)
    # Host data moved to the device become parameters (an on-device zeros would be a constant
    # input, every row 0, and any variance formula would pass).
    x = torch.randn(2, 3, 16, dtype=dt).to(dev).requires_grad_()
    y = ln(x)
    _expanded_matches(_hlo([y]), "batch-norm-training")
    (y * y).sum().backward()
    _expanded_matches(_hlo([x.grad, ln.weight.grad, ln.bias.grad]), "batch-norm-grad")


def test_f32_expansion_is_bitwise_xla() -> None:
    """f32: the expansion is XLA's own formula, so the numbers are the same bits."""
    dev = torch_xla.device()
    ln = torch.nn.LayerNorm(8).to(dev)
    y = ln(torch.randn(4, 8).to(dev))
    text = _hlo([y])
    args = _args(text, 3)
    want, got = run_hlo(text, args), run_hlo(print_hlo(normalize(parse_hlo(text))), args)
    assert all(np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def test_batchnorm_inference_matches_xla() -> None:
    dev = torch_xla.device()
    bn = torch.nn.BatchNorm1d(6).to(dev).eval()
    y = bn(torch.randn(5, 6, 3).to(dev))
    _expanded_matches(_hlo([y]), "batch-norm-inference", positive=True)


def test_bad_feature_index_is_a_located_error() -> None:
    text = """HloModule m
ENTRY e {
  x = f32[2,4] parameter(0)
  s = f32[4] parameter(1)
  o = f32[4] parameter(2)
  ROOT b = (f32[2,4], f32[4], f32[4]) batch-norm-training(x, s, o), epsilon=0.001, feature_index=2
}
"""
    with pytest.raises(HloParseError, match="feature_index=2"):
        normalize(parse_hlo(text, "bn.hlo"))


# --- pairs: LayerNorm over an unsharded dim verifies, over a sharded dim does not --------------

C = 4


def _trace(fn, shapes: list[tuple[int, ...]]) -> str:
    dev = torch_xla.device()
    # Made on the host and moved: device data become parameters (an on-device zeros is a constant).
    args = [torch.randn(s).to(dev) for s in shapes]
    return _hlo([fn(*args)])


def _check(tmp_path: Path, name: str, base: str, dist: str, relations: dict) -> tuple[int, str]:
    d = tmp_path / name
    d.mkdir()
    (d / "b.hlo").write_text(base)
    (d / "d.hlo").write_text(dist)
    (d / "r.yaml").write_text(yaml.safe_dump(relations))
    cli = [sys.executable, "-m", "shardproof.engine.cli", "check", str(d / "b.hlo"), str(d / "d.hlo"), "--relations", str(d / "r.yaml"), "--witness", "always"]
    p = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def _params(text: str) -> list[str]:
    # The relations file numbers parameters; find them by shape (each shape is distinct here).
    return [f"{p.shape.dtype}[{','.join(map(str, p.shape.dims))}]" for p in parse_hlo(text).entry.parameters]


def _relations(base: str, dist: str, shapes: dict[str, tuple[str, str, dict]], out: dict) -> dict:
    bp, dp = _params(base), _params(dist)
    inputs = [{"baseline": bp.index(b), "distributed": dp.index(d), **rel} for b, d, rel in shapes.values()]
    return {"groups": [list(range(C))], "inputs": inputs, "outputs": [{"baseline": 0, "distributed": 0, **out}]}


def test_sequence_parallel_layernorm_verifies_and_hidden_sharded_does_not(tmp_path: Path) -> None:
    def ln(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    # Sequence parallel: rows sharded, the normalised (hidden) dim whole on every rank.
    base = _trace(ln, [(16, 32), (32,), (32,)])
    dist = _trace(ln, [(16 // C, 32), (32,), (32,)])
    rel = _relations(base, dist, {
        "x": ("f32[16,32]", "f32[4,32]", {"relation": "sharded", "dim": 0}),
        "w": ("f32[32]", "f32[32]", {"relation": "duplicate"}),
    }, {"relation": "sharded", "dim": 0})
    # w and b have the same shape: relate b too (the second f32[32] parameter on each side).
    bp, dp = _params(base), _params(dist)
    rel["inputs"].append({"baseline": len(bp) - 1 - bp[::-1].index("f32[32]"), "distributed": len(dp) - 1 - dp[::-1].index("f32[32]"), "relation": "duplicate"})
    code, out = _check(tmp_path, "sp", base, dist, rel)
    assert code == 0 and "verified" in out, out

    # Bug: hidden sharded, each rank normalises its own quarter of the hidden dim.
    bug = _trace(ln, [(16, 32 // C), (32 // C,), (32 // C,)])
    bp, dp = _params(base), _params(bug)
    rel = {"groups": [list(range(C))], "inputs": [
        {"baseline": bp.index("f32[16,32]"), "distributed": dp.index("f32[16,8]"), "relation": "sharded", "dim": 1},
        {"baseline": bp.index("f32[32]"), "distributed": dp.index("f32[8]"), "relation": "sharded", "dim": 0},
        {"baseline": len(bp) - 1 - bp[::-1].index("f32[32]"), "distributed": len(dp) - 1 - dp[::-1].index("f32[8]"), "relation": "sharded", "dim": 0},
    ], "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    code, out = _check(tmp_path, "bug", base, bug, rel)
    assert code != 0 and "verified" not in out.split("\n")[0], out
    assert "diverged" in out, out
