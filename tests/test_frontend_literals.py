"""Constants in full: the front end writes every literal of the HLO text with its values.

torch-xla's text printer elides a constant of more than 10 elements as ``{...}``, which made
``x * cos(arange(0, 16) * 0.1)`` and ``x * cos(arange(1, 17) * 0.1)`` one program to the
verifier (tests/soundness_regressions/elided_constants_differ). The front end rewrites each
elided literal from the lowering's JSON; these tests hold that text to XLA's own printing of
large constants (jaxlib), and run the repro as a declared model (real torch-xla builds).
"""

from __future__ import annotations

import base64
import math
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bug_sites import bug_sites

from shardproof.engine.frontend.capture import literal_text
from shardproof.engine.frontend.runner import run_models

ROOT = Path(__file__).parents[1]
PROJECT = ROOT / "tests" / "frontend_project"
CONFIG = PROJECT / ".shardproof.yml"


def _xla_print(dtype: str, dims: list[int], literal: str) -> str:
    """The literal as XLA prints it back with large constants, after parsing ``literal``."""
    hlo = pytest.importorskip("jaxlib._hlo")
    text = f"HloModule m\nENTRY e {{\n  ROOT c = {dtype}[{','.join(map(str, dims))}] constant({literal})\n}}\n"
    options = hlo.HloPrintOptions()
    options.print_large_constants = True
    out = hlo.hlo_module_from_text(text).to_string(options)
    return out[out.index("constant(") + len("constant(") : out.rindex(")")]


def _floats() -> list[float]:
    rng = random.Random(12)
    fixed = [0.0, 1.0, -1.0, 0.1, 10.0, 1e-3, 65504.0, 1e-7, 3.4e38, 1e-40, 1e-45, math.inf, -math.inf, 123456789.0, 1 / 3, 2.5e-5]
    return fixed + [rng.gauss(0, 10) * 10 ** rng.randint(-8, 8) for _ in range(48)]


def _json_float(v: float) -> Any:
    """A float as protobuf's JSON writes it (non-finite values as strings)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def _proto_json(dtype: str, values: list[Any]) -> dict[str, Any]:
    """A LiteralProto as JSON: the field and encoding per element type, as torch-xla's
    ``hlo_json`` gives them (lists for 32/64-bit types, base64 bytes for the narrow ones)."""
    np = pytest.importorskip("numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    narrow = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "s8": np.int8, "u8": np.uint8, "s16": np.int16, "u16": np.uint16}
    if dtype in narrow:
        with np.errstate(over="ignore"):
            data = np.array(values, dtype=narrow[dtype]).tobytes()
        return {f"{dtype}s": base64.b64encode(data).decode()}
    if dtype == "f32":
        return {"f32s": [_json_float(float(np.float32(v))) for v in values]}
    if dtype == "f64":
        return {"f64s": [_json_float(v) for v in values]}
    if dtype in ("s64", "u64"):
        return {f"{dtype}s": [str(v) for v in values]}
    if dtype == "pred":
        return {"preds": values}
    return {f"{dtype}s": values}


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        ("f32", _floats()), ("f64", _floats()), ("bf16", _floats()), ("f16", _floats()),
        ("s8", [-128, 127, 0, -1, 5, 6, 7, 8, 9, 10, 11, 12]),
        ("u8", [0, 255, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        ("s16", [-32768, 32767, 0, -1, 4, 5, 6, 7, 8, 9, 10, 11]),
        ("s32", [-(2**31), 2**31 - 1, 0, -1, 4, 5, 6, 7, 8, 9, 10, 11]),
        ("u32", [0, 2**32 - 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        ("s64", [-(2**63), 2**63 - 1, 0, -1, 4, 5, 6, 7, 8, 9, 10, 11]),
        ("u64", [0, 2**64 - 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]),
        ("pred", [True, False, True, True, False, False, True, False, True, True, False, True]),
    ],
)  # fmt: skip
def test_literal_text_is_what_xla_prints(dtype: str, values: list[Any]) -> None:
    dims = [2, len(values) // 2]
    text = literal_text(_proto_json(dtype, values), dtype, dims)
    assert text is not None and "..." not in text
    # XLA parses the text and prints it back identically: the values are exact and the form
    # is XLA's own.
    assert _xla_print(dtype, dims, text) == text


def test_negative_zero_and_nan_keep_their_meaning() -> None:
    text = literal_text({"f32s": [-0.0, "NaN", 0.0, 2.0]}, "f32", [4])
    assert text == "{-0.0, nan, 0, 2}"
    # "-0" would be XLA's integer 0 (+0); "-0.0" is negative zero, printed back as -0.
    assert _xla_print("f32", [4], text) == "{-0, nan, 0, 2}"


def test_what_cannot_be_written_stays_elided() -> None:
    assert literal_text({"f32s": [1.0, 2.0]}, "f32", [3]) is None  # wrong element count
    assert literal_text({"c64s": [1.0, 2.0]}, "c64", [1, 1]) is None  # a type read not at all


_CAPTURE_SCRIPT = r"""
import json, re, sys
from shardproof.engine.frontend import capture
capture.configure_environment()
import torch, torch_xla
from jax._src.lib import xla_client
capture.keep_scalars_constant()
dev = torch_xla.device()
outs = [(torch.arange(24, dtype=dt, device=dev) - 3).reshape(2, 3, 4) * 3
        for dt in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                   torch.int32, torch.int16, torch.int8, torch.uint8)]
outs.append(torch.arange(0, 12, device=dev) % 3 == 0)
outs.append(torch.arange(0, 30, device=dev, dtype=torch.float32) * 1e-3 - 7)
captured = capture.capture(outs, sys.argv[1])
ctx = torch_xla._XLAC.lowering.LoweringContext("IrToHlo")
ctx.build(outs)
full = xla_client.XlaComputation(ctx.hlo()).as_hlo_text(print_large_constants=True)
elided = torch_xla._XLAC._get_xla_tensors_hlo(outs)
mine = dict(re.findall(r"%(constant\.\d+) = \S+ constant\((.*?)\)(?:, metadata|$)", captured.hlo_text, re.M))
xla = dict(re.findall(r" (constant\.\d+) = \S+ constant\((.*?)\)$", full, re.M))
print(json.dumps({"mine": mine, "xla": xla, "elided_before": elided.count("{...}")}))
"""


def test_captured_text_holds_every_constant_as_xla_prints_it(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    pytest.importorskip("jax")
    proc = subprocess.run([sys.executable, "-c", _CAPTURE_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["elided_before"] >= 10  # torch-xla's own text elides them: the case is real
    assert got["mine"] == got["xla"]
    assert not any("..." in v for v in got["mine"].values())


@pytest.fixture(scope="module")
def cosine(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    pytest.importorskip("torch_xla")
    out = tmp_path_factory.mktemp("literals")
    return run_models(CONFIG, out, ["cosine", "cosine_shifted"]), out


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def test_the_arange_table_is_written_in_full(cosine: tuple[dict[str, Any], Path]) -> None:
    _, out = cosine
    base = (out / "cosine_shifted" / "baseline.hlo").read_text()
    dist = (out / "cosine_shifted" / "distributed.hlo").read_text()
    assert "{...}" not in base and "{...}" not in dist
    assert re.search(r"s64\[16\]\{0\} constant\(\{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15\}\)", base)
    assert re.search(r"s64\[16\]\{0\} constant\(\{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16\}\)", dist)


def test_a_different_table_is_not_verified(cosine: tuple[dict[str, Any], Path]) -> None:
    report, _ = cosine
    assert _entry(report, "cosine")["status"] == "verified"
    shifted = _entry(report, "cosine_shifted")
    assert shifted["status"] != "verified", shifted
    if shifted["status"] == "diverged":  # pinpointed at the arange's line
        first = shifted["result"]["divergences"][0]["source"]
        assert (first["file"], first["line"]) == bug_sites([PROJECT / "models.py"], ROOT)["shifted_arange"]
