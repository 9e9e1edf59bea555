"""Build isolation: a broken entry point, a build that raises, crashes, sleeps past its time cap
or grows past its memory cap each become a clear ``build-failed`` result, never a pass, and the
other models still run. Real torch-xla, real subprocesses (tests/frontend_project/)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bug_sites import bug_sites

from shardproof.engine.frontend.runner import exit_code, run_models

ROOT = Path(__file__).parents[1]
PROJECT = ROOT / "tests" / "frontend_project"
CONFIG = PROJECT / ".shardproof.yml"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("isolation")
    return run_models(CONFIG, out), out


def entry(report: tuple[dict[str, Any], Path], name: str) -> dict[str, Any]:
    return next(m for m in report[0]["models"] if m["name"] == name)


@pytest.mark.parametrize(
    ("name", "first_line"),
    [
        ("broken_entry", "tests/frontend_project/.shardproof.yml:7: models[2].entry: cannot import 'no_such_module' for entry 'no_such_module:mlp': ModuleNotFoundError"),
        ("missing_function", "tests/frontend_project/.shardproof.yml:8: models[3].entry: module 'models' has no function 'no_such_function'"),
        ("raises", "RuntimeError: the model's constructor failed on purpose"),
        ("sleeps", "build exceeded its time cap of 3 s and was killed"),
        ("crashes", "build crashed (signal 11 (SIGSEGV)) before reporting"),
        ("hog", "build exceeded its memory cap of 900 MiB"),
        ("wrong_plan", "tests/frontend_project/.shardproof.yml:13: models[8].entry: plan['up']: 'up.weight' is rowwise (sharded along dim 1 over 2 ranks)"),
        ("typo_knob", "tests/frontend_project/.shardproof.yml:14: models[9].size.hiden: size knob(s) hiden are never read by models:mlp"),
        ("not_a_model", "tests/frontend_project/.shardproof.yml:15: models[10].entry: the entry point must return shardproof.engine.frontend.declare.Model, got dict"),
    ],
)
def test_each_failure_is_a_clear_build_failed_result(report: tuple[dict[str, Any], Path], name: str, first_line: str) -> None:
    model = entry(report, name)
    # An entry or declaration the config gets wrong is bad input (exit 3), located at its line;
    # an exception, a crash or a cap of the model's own code is build-failed (exit 2).
    assert model["status"] == ("bad-input" if ".shardproof.yml:" in first_line else "build-failed")
    assert "result" not in model
    assert model["build"]["error"].splitlines()[0].startswith(first_line), model["build"]["error"]


def test_failures_carry_where_the_build_was(report: tuple[dict[str, Any], Path]) -> None:
    assert 'File "tests/frontend_project/models.py", line 50, in raises' in entry(report, "raises")["build"]["error"]
    # The child's Python stack at the SIGTERM (caps) or the fault, dumped by faulthandler.
    for name, function in (("sleeps", "sleeps"), ("hog", "allocates"), ("crashes", "crashes")):
        error = entry(report, name)["build"]["error"]
        assert re.search(rf'tests/frontend_project/models\.py", line \d+ in {function}', error), (name, error)


def test_caps_are_enforced_promptly(report: tuple[dict[str, Any], Path]) -> None:
    assert entry(report, "sleeps")["build"]["seconds"] < 3 + 5
    assert entry(report, "hog")["build"]["peak_rss_mb"] > 900


def test_the_other_models_still_run(report: tuple[dict[str, Any], Path]) -> None:
    sites = bug_sites([PROJECT / "models.py"], ROOT)
    assert entry(report, "good")["status"] == "verified"
    assert entry(report, "good_tp4")["status"] == "verified"  # declared after every failure
    bug = entry(report, "bug")
    assert bug["status"] == "diverged"
    first = bug["result"]["divergences"][0]["source"]
    assert (first["file"], first["line"]) == sites["missing_allreduce"]


def test_a_build_failure_is_never_a_pass(report: tuple[dict[str, Any], Path]) -> None:
    assert exit_code(report[0]) == 3  # bad entries among the failures: bad input wins
    only_failures = {**report[0], "models": [entry(report, "raises")]}
    assert exit_code(only_failures) == 2
    only_bad_input = {**report[0], "models": [entry(report, "not_a_model")]}
    assert exit_code(only_bad_input) == 3


def test_what_a_failed_build_leaves(report: tuple[dict[str, Any], Path]) -> None:
    _, out = report
    wrong = entry(report, "wrong_plan")
    # Both programs were traced (the user can read them); no relations, so nothing was checked.
    assert wrong["artifacts"]["baseline"] and wrong["artifacts"]["distributed"]
    assert wrong["artifacts"]["relations"] is None
    assert entry(report, "broken_entry")["artifacts"] == {"baseline": None, "distributed": None, "relations": None, "sourcemap": None}
    assert (out / "sleeps" / "build.log").read_text().count("most recent call first") >= 1


def test_builds_are_deterministic(report: tuple[dict[str, Any], Path]) -> None:
    _, out = report
    # good and good_tp4 come from different children of one worker; each child starts clean.
    a = (out / "good" / "baseline.hlo").read_text()
    b = (out / "good_tp4" / "baseline.hlo").read_text()
    assert a == b


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardproof.engine.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_cli_run_prints_a_table_and_exits_3_on_a_bad_entry(tmp_path: Path) -> None:
    proc = _cli("run", "--config", str(CONFIG), "--models", "broken_entry,good,bug", "--out", str(tmp_path), "--json", str(tmp_path / "copy.json"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["model", "verdict", "expected", "layers", "time", "first", "divergence"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert rows["broken_entry"].split()[1] == "bad-input" and "models[2].entry: cannot import" in rows["broken_entry"]
    assert rows["good"].split()[1:3] == ["verified", "yes"]
    # The first divergence's line, then what the numeric witness made of it (a real bug: confirmed).
    assert rows["bug"].split()[1:3] == ["diverged", "yes"] and rows["bug"].endswith("tests/frontend_project/models.py:29  [witness confirmed]")
    assert "[witness" not in rows["good"]  # a verified model is not executed (witness: auto)
    assert "3 model(s): 1 bad-input, 1 diverged, 1 verified; 2 as expected; NOT as expected: broken_entry" in proc.stdout
    doc = json.loads((tmp_path / "result.json").read_text())
    assert json.loads((tmp_path / "copy.json").read_text()) == doc
    assert doc["config"] == "tests/frontend_project/.shardproof.yml"


def test_cli_build_writes_the_four_artifacts(tmp_path: Path) -> None:
    proc = _cli("build", "--config", str(CONFIG), "--models", "raises,good", "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("good: built in ")  # config order
    assert "\nraises: build-failed in " in proc.stdout
    for name in ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json"):
        assert (tmp_path / "good" / name).is_file()
