"""A DTensor plan bug carries its plan line (engine/frontend/dtensor/plan_frames.py).

The reported line (a divergence's first frame) is where the values differ; the line that wrote
the ParallelStyle of the module those values come from is appended as an outermost frame, so
the bot can comment on the plan line a pull request changed. One end-to-end run (a plan bug and
its correct block) and the propagation rule on a hand-written program.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from config_runs import run_template

from shardproof.engine.frontend.dtensor import plan_frames

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "examples" / "dtensor" / "models.py"

_CONFIG = """\
version: 1
root: {root}
python_path: [{dtensor}]
defaults: {{tp: 4, rank: int, timeout: 300, memory_mb: 4096}}
models:
  - name: block_tp4
    entry: models:block
  - name: bug_wrong_output_layouts
    entry: models:block
    variant: wrong_output_layouts
    expect: diverged
"""


def _line(text: str) -> int:
    return next(i for i, line in enumerate(MODELS.read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("plan_frames")
    return run_template(folder, ".shardproof.yml", _CONFIG, dtensor=ROOT / "examples" / "dtensor")


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def _frames(out: Path, name: str) -> dict[str, list[tuple[str, int]]]:
    instructions = json.loads((out / name / "sourcemap.json").read_text())["instructions"]
    return {n: [(f["file"], f["line"]) for f in e.get("frames", [])] for n, e in instructions.items()}


def test_a_wrong_output_layout_is_reported_at_its_use_with_the_plan_line_among_the_frames(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "bug_wrong_output_layouts")
    result = model["result"]
    assert model["status"] == "diverged" and result["witness"]["status"] == "confirmed", result["reason"]
    first = result["divergences"][0]
    residual = _line("return h + self.feed_forward(self.ffn_norm(h))")
    site = _line("# BUG-SITE: wrong_output_layouts")
    # The reported line is still where the partial sums meet the residual.
    assert (first["source"]["file"], first["source"]["line"]) == ("examples/dtensor/models.py", residual), first["source"]
    frames = _frames(out, "bug_wrong_output_layouts")[first["instruction"].lstrip("%")]
    assert frames[0] == ("examples/dtensor/models.py", residual)
    assert ("examples/dtensor/models.py", site) in frames, frames
    # w1's style: its values enter w2 (another module) before they reach the residual.
    w1 = _line('"feed_forward.w1": ColwiseParallel()')
    assert ("examples/dtensor/models.py", w1) not in frames, frames


def test_a_correct_plan_still_verifies_and_no_plan_line_is_reported(report: tuple[dict[str, Any], Path]) -> None:
    summary, out = report
    model = _entry(summary, "block_tp4")
    assert model["status"] == "verified", model.get("result", {}).get("reason")
    plan = range(_line("def block_plan("), _line("def mesh_1d("))
    frames = _frames(out, "block_tp4")
    # Plan lines only ever follow a frame of the forward, never stand first.
    assert all(fs[0][1] not in plan for fs in frames.values() if fs), [fs for fs in frames.values() if fs and fs[0][1] in plan]
    wq = _line('"attention.wq": ColwiseParallel()')
    assert any(("examples/dtensor/models.py", wq) in fs for fs in frames.values())


class _Program:
    def __init__(self, modules: dict[str, object]) -> None:
        self.modules = modules

    def named_modules(self) -> list[tuple[str, object]]:
        return list(self.modules.items())


_HLO = """\
ENTRY %main {
  %p0 = f32[4]{0} parameter(0)
  %a = f32[4]{0} negate(f32[4]{0} %p0), metadata={op_name="ff.w1"}
  %b = f32[4]{0} exponential(f32[4]{0} %a), metadata={op_name="ff"}
  %c = f32[4]{0} sine(f32[4]{0} %b), metadata={op_name="ff.w2"}
  %d = f32[4]{0} add(f32[4]{0} %p0, f32[4]{0} %c), metadata={op_name="x"}
  %e = f32[4]{0} cosine(f32[4]{0} %d), metadata={op_name="x"}
  ROOT %f = f32[4]{0} multiply(f32[4]{0} %d, f32[4]{0} %e)
}
"""


def test_the_plan_line_follows_the_module_s_values_on_its_call_chain_only() -> None:
    root, ff, w1, w2 = object(), object(), object(), object()
    sourcemap: dict[str, Any] = {"instructions": {
        "a": {"frames": [{"file": "m.py", "line": 20}, {"file": "m.py", "line": 30}], "module": "ff.w1"},
        "b": {"frames": [{"file": "m.py", "line": 20}, {"file": "m.py", "line": 30}], "module": "ff"},
        "c": {"frames": [{"file": "m.py", "line": 20}, {"file": "m.py", "line": 30}], "module": "ff.w2"},
        "d": {"frames": [{"file": "m.py", "line": 30}]},  # the residual add on the calling line
        "e": {"frames": [{"file": "m.py", "line": 31}]},  # the next line
        "f": {"frames": []},
    }}
    plan_frames.forget()
    try:
        for module, line in ((w1, 1), (w2, 2)):
            plan_frames._applied[id(module)] = (module, [("/repo/plan.py", line, "plan")])
        keep = lambda file: file.removeprefix("/repo/")  # noqa: E731
        gained = plan_frames.add_plan_frames(_Program({"": root, "ff": ff, "ff.w1": w1, "ff.w2": w2}), sourcemap, _HLO, keep)
    finally:
        plan_frames.forget()
    lines = {n: [f["line"] for f in e["frames"]] for n, e in sourcemap["instructions"].items()}
    assert lines == {"a": [20, 30, 1], "b": [20, 30, 1], "c": [20, 30, 2], "d": [30, 2], "e": [31], "f": []}
    assert gained == 4


def test_recording_restores_the_styles() -> None:
    style = pytest.importorskip("torch.distributed.tensor.parallel.style")
    before = {cls: (cls.__dict__.get("__init__"), cls.__dict__.get("_apply")) for cls in plan_frames._styles(style.ParallelStyle)}
    plan_frames.forget()
    try:
        with plan_frames.recording():
            made = style.RowwiseParallel()
        assert plan_frames._constructed[id(made)][0] is made
        assert plan_frames._constructed[id(made)][1][:2] == (str(Path(__file__).resolve()), _self_line("made = style.RowwiseParallel()"))
    finally:
        plan_frames.forget()
    assert {cls: (cls.__dict__.get("__init__"), cls.__dict__.get("_apply")) for cls in plan_frames._styles(style.ParallelStyle)} == before


def _self_line(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line and "_self_line" not in line)
