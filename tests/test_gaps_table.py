"""bench/gaps.py names real programs: every ``<source>:<model>`` of its table is a model of that
example configuration with the role the table gives it (a correct form declares no bug, a twin
declares ``diverged``), and every ``pair:<name>`` is a stored pair of that kind. The checks
themselves are the bench's (they build models); this keeps its table from naming what is gone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

from shardproof.engine.frontend.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _gaps_module():  # bench/ is not a package
    spec = importlib.util.spec_from_file_location("bench_gaps", ROOT / "bench/gaps.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gaps"] = module
    spec.loader.exec_module(module)
    return module


def test_every_program_of_the_gap_table_exists_in_its_role() -> None:
    gaps = _gaps_module()
    expects = {source: {m.name: m.expect for m in load_config(path).models} for source, path in gaps.CONFIGS.items()}
    problems = []
    for gap in gaps.GAPS:
        assert gap.correct, gap.name
        for role, refs in (("correct", gap.correct), ("twin", gap.twins)):
            for ref in refs:
                source, name = ref.split(":", 1)
                if source == "pair":
                    label = gaps.PAIRS / name / "label.yaml"
                    kind = yaml.safe_load(label.read_text())["kind"] if label.is_file() else None
                    if kind != ("correct" if role == "correct" else "bug"):
                        problems.append(f"{gap.name}: {ref} is {kind}, the table calls it {role}")
                    continue
                if name not in expects.get(source, {}):
                    problems.append(f"{gap.name}: {ref} is not a model of {source}")
                    continue
                declared = expects[source][name] or "verified"
                if (role == "twin") != (declared == "diverged"):
                    problems.append(f"{gap.name}: {ref} declares {declared}, the table calls it {role}")
    assert not problems, problems
