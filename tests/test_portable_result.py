"""The engine's own result.json (``shardproof run``) names no path of the machine that ran it:
relation-trace and divergence sources are repository-relative, a library file is
``<site-packages>/...``, and a step without a line is ``–`` with a ``no_source`` reason."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.frontend.runner import run_models
from shardproof.engine.portable import NO_LINE, portable_result, portable_source

ROOT = Path(__file__).parents[1]
# path:line, optionally "(in the backward of)"; the path relative or a <site-packages>/ name.
_PORTABLE = re.compile(r"^(?:<(?:site-packages|stdlib|external)>/)?[^/<][^:]*:\d+(?: \(in the backward of\))?$")


def test_sources_are_named_for_any_machine(tmp_path: Path) -> None:
    root = str(tmp_path / "repo")
    assert portable_source(f"{root}/models/m.py:41", root) == ("models/m.py:41", None)
    assert portable_source(f"{root}/.venv/lib/python3.11/site-packages/flax/linen/linear.py:260 (in the backward of)", root) == (
        "<site-packages>/flax/linen/linear.py:260 (in the backward of)", None)
    assert portable_source("/usr/lib/python3/dist-packages/jax/_src/api.py:9", root) == ("<site-packages>/jax/_src/api.py:9", None)
    assert portable_source("/elsewhere/tool.py:3", root) == ("<external>/tool.py:3", None)
    # An editable checkout in the src layout keeps its package path, never the machine's folders.
    assert portable_source("/opt/someone/lib-checkout/src/libpkg/hlo.py:9", root) == ("<external>/libpkg/hlo.py:9", None)
    assert portable_source("<no source: a parameter of the entry computation>", root) == (NO_LINE, "a parameter of the entry computation")
    assert portable_source("<no source>", root)[0] == NO_LINE
    assert portable_source("<frozen runpy>:88", root)[0] == NO_LINE
    assert portable_source("models/m.py:41", root) == ("models/m.py:41", None)  # already the front end's name
    doc = {"trace": [{"output": 0, "steps": [{"source": "<no source: why>"}]}],
           "divergences": [{"source": {"file": f"{root}/m.py", "line": 2, "function": "f"}, "operands": [{"source": {"file": "<frozen x>", "line": 1}}]}]}
    out = portable_result(doc, root)
    assert out["trace"][0]["steps"][0] == {"source": NO_LINE, "no_source": "why"}
    assert out["divergences"][0]["source"]["file"] == "m.py"
    assert out["divergences"][0]["operands"][0]["source"]["file"] == "" and out["divergences"][0]["operands"][0]["source"]["why"]
    assert doc["trace"][0]["steps"][0]["source"] == "<no source: why>"  # a copy: the input is unchanged


def _check_portable(out: Path, doc: dict[str, Any]) -> int:
    text = (out / "result.json").read_text()
    # The only absolute paths left name the output folder the caller chose outside the repository
    # (artifacts and log, which the bot makes relative to result.json's folder).
    leaks = [line for line in text.splitlines() if '"/' in line and f'"{out}/' not in line]
    assert leaks == [], leaks[:5]
    assert "<no source" not in text
    steps = [s for m in doc["models"] for t in (m.get("result") or {}).get("trace") or [] for s in t["steps"]]
    for s in steps:
        if s["source"] == NO_LINE:
            assert s["no_source"], s
        else:
            assert _PORTABLE.match(s["source"]), s
            assert "<no source" not in s["source"]
    return len(steps)


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="needs jax")
def test_a_jax_run_writes_no_machine_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # JAX records every frame's absolute file in the HLO metadata; the unrolled scan's
    # instructions have no source map entry, so their trace steps fell back to it (434 paths).
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    doc = run_models(ROOT / "examples/jax/.shardproof.yml", tmp_path, ["scan_32_missing_psum"])
    assert [m["status"] for m in doc["models"]] == ["diverged"], doc
    assert _check_portable(tmp_path, doc) > 0
    assert '"source": "examples/jax/models.py:' in (tmp_path / "result.json").read_text()


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch_xla", "fairscale")), reason="needs the frontend and fairscale extras")
def test_a_torch_run_writes_no_machine_path(tmp_path: Path) -> None:
    doc = run_models(ROOT / "examples/torchdist/.shardproof.yml", tmp_path, ["bug_fairscale_missing_reduce"])
    assert [m["status"] for m in doc["models"]] == ["diverged"], doc
    assert _check_portable(tmp_path, doc) > 0
