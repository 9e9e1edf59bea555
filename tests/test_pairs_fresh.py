"""The committed HLO test pairs: complete, self-consistent, portable, and re-generatable."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardproof.engine.frontend.capture import is_repository_file, portable_path

ROOT = Path(__file__).resolve().parents[1]
PAIRS_DIR = ROOT / "tests" / "pairs"
FILES = (
    "baseline.hlo",
    "distributed.hlo",
    "relations.yaml",
    "sourcemap.json",
    "baseline.sourcemap.json",
    "expect.yaml",
)
# What the verifier's tests rely on; models.PAIRS must produce at least these.
EXPECTED_PAIRS = (
    "mlp_tp2", "mlp_tp4", "mlp_tp8", "attention_tp4", "fused_qkv_tp4", "vocab_embedding_tp4",
    "sp_norm_tp4", "softmax_sharded_tp4", "layout_bijection_tp4", "bug_missing_allreduce",
    "bug_redundant_allreduce", "bug_wrong_groups", "bug_precision", "bug_axis_split",
    "bug_bsh_layout", "bug_qkv_slice", "bug_constant",
)  # fmt: skip
RELATIONS = {"duplicate", "sharded", "rank", "token"}
# An absolute path: a quote, '=', or whitespace, then /dir/... .
ABSOLUTE_PATH = re.compile(r"""(?:^|[\s"'=(])/(?:[\w.+-]+/)+[\w.+-]*""", re.MULTILINE)


def _entry_lines(hlo: str) -> list[str]:
    return hlo[hlo.index("\nENTRY ") :].splitlines()


def _parameters(hlo: str) -> dict[int, str]:
    out = {}
    for line in _entry_lines(hlo):
        match = re.search(r"%(\S+) = \S+ parameter\((\d+)\)", line)
        if match:
            out[int(match.group(2))] = match.group(1)
    return out


def _root_arity(hlo: str) -> int:
    root = next(line for line in _entry_lines(hlo) if line.lstrip().startswith("ROOT "))
    if " tuple(" not in root:
        return 1
    return root.split(" tuple(", 1)[1].count("%")


@pytest.mark.parametrize("name", EXPECTED_PAIRS)
def test_committed_pair_is_complete_and_consistent(name: str) -> None:
    folder = PAIRS_DIR / name
    for file_name in FILES:
        assert (folder / file_name).is_file(), f"{name}/{file_name} missing"
    base_hlo = (folder / "baseline.hlo").read_text()
    dist_hlo = (folder / "distributed.hlo").read_text()
    relations = yaml.safe_load((folder / "relations.yaml").read_text())
    expect = yaml.safe_load((folder / "expect.yaml").read_text())

    assert set(relations) == {"groups", "inputs", "outputs"}
    groups = relations["groups"]
    assert expect["c"] == len(groups[0])
    assert all(sorted(g) == g and len(g) == expect["c"] for g in groups)

    for entry in relations["inputs"]:
        assert entry["relation"] in RELATIONS, entry
        if entry["relation"] == "sharded":
            assert isinstance(entry["dim"], int)
    dist_related = [e["distributed"] for e in relations["inputs"]]
    base_related = [e["baseline"] for e in relations["inputs"] if "baseline" in e]
    assert len(dist_related) == len(set(dist_related))
    assert set(dist_related) == set(_parameters(dist_hlo)), "every distributed parameter related"
    assert set(base_related) == set(_parameters(base_hlo)), "every baseline parameter related"
    for entry in relations["inputs"]:
        if entry["relation"] == "rank":
            param = _parameters(dist_hlo)[entry["distributed"]]
            assert re.search(rf"%{re.escape(param)} = s32\[\] parameter", dist_hlo)

    outputs = relations["outputs"]
    assert [o["distributed"] for o in outputs] == list(range(_root_arity(dist_hlo)))
    assert [o["baseline"] for o in outputs] == list(range(_root_arity(base_hlo)))

    assert expect["verdict"] in {"verified", "diverged"}
    assert expect["verdict"] == ("diverged" if name.startswith("bug_") else "verified")
    if expect["verdict"] == "diverged":
        site = expect["bug_site"]
        lines = (ROOT / site["file"]).read_text().splitlines()
        assert lines[site["line"] - 1].rstrip().endswith(f"# BUG-SITE: {name}")

    for hlo_name, map_name in (
        ("distributed.hlo", "sourcemap.json"),
        ("baseline.hlo", "baseline.sourcemap.json"),
    ):
        hlo = (folder / hlo_name).read_text()
        sourcemap = json.loads((folder / map_name).read_text())
        assert sourcemap["version"] == 1
        with_metadata = set(re.findall(r"^\s+(?:ROOT )?%(\S+) = .*metadata=\{", hlo, re.M))
        assert set(sourcemap["instructions"]) == with_metadata
        for entry in sourcemap["instructions"].values():
            for frame in entry["frames"]:
                assert not frame["file"].startswith(("/", "<")), frame
                assert (ROOT / frame["file"]).is_file(), frame
                assert isinstance(frame["line"], int) and frame["line"] > 0


@pytest.mark.parametrize("name", EXPECTED_PAIRS)
def test_committed_pair_names_no_machine_path(name: str) -> None:
    for file_name in FILES:
        text = (PAIRS_DIR / name / file_name).read_text()
        assert not ABSOLUTE_PATH.search(text), f"{name}/{file_name}: {ABSOLUTE_PATH.search(text)}"
        assert str(ROOT) not in text
    for source_file in re.findall(
        r'source_file="([^"]*)"', (PAIRS_DIR / name / "distributed.hlo").read_text()
    ):
        assert source_file.startswith(("tests/", "<site-packages>/")), source_file


def test_committed_hlo_parses_with_xla() -> None:
    """XLA's own parser (jaxlib) accepts every committed module, rewritten paths included."""
    hlo_module = pytest.importorskip("jaxlib._hlo")
    for path in sorted(PAIRS_DIR.glob("*/*.hlo")):
        hlo_module.hlo_module_from_text(path.read_text())


def test_portable_paths() -> None:
    root = Path("/r/repo")
    assert portable_path("/r/repo/tests/pairs/models.py", root) == "tests/pairs/models.py"
    assert (
        portable_path("/r/repo/.venv/lib/python3.11/site-packages/torch/nn/functional.py", root)
        == "<site-packages>/torch/nn/functional.py"
    )
    assert portable_path("/opt/x/dist-packages/torch_xla/core/xla_model.py", root) == (
        "<site-packages>/torch_xla/core/xla_model.py"
    )
    assert portable_path("/somewhere/else/tool.py", root) == "<external>/tool.py"
    assert portable_path("<string>", root) == "<string>"
    assert is_repository_file("/r/repo/tests/pairs/models.py", root)
    assert not is_repository_file("/r/repo/.venv/lib/python3.11/site-packages/torch/x.py", root)
    assert not is_repository_file("/r/other/x.py", root)


REGENERATED = ("mlp_tp2", "bug_bsh_layout")


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="torch_xla not installed")
def test_pairs_regenerate_identically(tmp_path: Path) -> None:
    """A fresh process writes byte-identical files: the pairs are re-generatable and
    deterministic (independent of which other pairs the same process traced)."""
    result = subprocess.run(
        [sys.executable, str(PAIRS_DIR / "generate.py"), "--out", str(tmp_path), *REGENERATED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for name in REGENERATED:
        for file_name in FILES:
            fresh = (tmp_path / name / file_name).read_text()
            committed = (PAIRS_DIR / name / file_name).read_text()
            assert fresh == committed, f"{name}/{file_name} differs from a fresh generation"
