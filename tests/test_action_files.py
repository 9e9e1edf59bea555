"""The action's files: action.yml valid for GitHub's schema and wired to the bot input by input
and output by output; the Dockerfile hadolint-clean and following GitHub's rules for Docker
actions; the build context small; the example workflows valid and the same as in the README."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import bot_support as bs
import pytest
import yaml
from fake_github import FakeGitHub

from shardproof.bot.commands import settings_from

ROOT = Path(__file__).resolve().parents[1]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
WORKFLOWS = sorted((ROOT / "examples" / "workflows").glob("*.yml"))
README = (ROOT / "README.md").read_text()


def _tool(name: str) -> str:
    """A linter installed in the venv (dev extras); missing is a failure, never a skip."""
    found = Path(sys.executable).parent / name
    path = str(found) if found.exists() else shutil.which(name)
    assert path, f"{name} is not installed: `make install` (pip install -e '.[dev]') installs it"
    return path


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)


def test_hadolint_finds_nothing() -> None:
    done = _run(_tool("hadolint"), "--no-color", "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_hadolint_ignore_is_justified_in_a_comment() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    for n, line in enumerate(lines):
        for rule in re.findall(r"hadolint ignore=([\w,]+)", line):
            above = "\n".join(lines[max(0, n - 6) : n])
            for r in rule.split(","):
                assert f"{r} (" in above, f"Dockerfile:{n + 1}: ignore of {r} has no justification above it"


def test_action_yml_is_valid_for_github() -> None:
    done = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", "action.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert ACTION["runs"] == {"using": "docker", "image": "Dockerfile"}
    assert ACTION["branding"]["icon"] and ACTION["branding"]["color"]
    assert {"config", "github-token", "fail-on", "filter-mode", "review-event", "models", "shard", "mode"} <= set(ACTION["inputs"])
    assert {"verdict", "report-dir", "sarif", "trace"} <= set(ACTION["outputs"])


def test_example_workflows_are_valid_for_github() -> None:
    assert {p.name for p in WORKFLOWS} == {"shardproof.yml", "shardproof-matrix.yml", "shardproof-fork-build.yml", "shardproof-fork-report.yml"}
    done = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *[str(p.relative_to(ROOT)) for p in WORKFLOWS])
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_follows_the_rules_for_docker_actions() -> None:
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    instructions = [line.split(None, 1) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert instructions[0] == ["ARG", "BASE=python:3.11-slim"] and instructions[1] == ["FROM", "${BASE}"]
    kinds = [i[0].upper() for i in instructions]
    assert "USER" not in kinds and "WORKDIR" not in kinds  # GitHub: run as root, in the workspace
    [entry] = [i[1] for i in instructions if i[0].upper() == "ENTRYPOINT"]
    assert json.loads(entry) == ["/opt/shardproof/bin/shardproof", "github"]  # exec form
    # Pins: the versions the project is developed and tested with.
    project = (ROOT / "pyproject.toml").read_text()
    for pin in ("torch==2.9.0", "torch-xla==2.9.0"):
        assert pin in joined and pin in project
    assert "egglog==13.2.0" in joined and '"egglog==13.2.*"' in project
    assert re.search(r"strip --strip-debug .*egglog/bindings", joined) or re.search(r"egglog/bindings.*strip --strip-debug", joined)


def test_build_context_holds_only_the_package_sources() -> None:
    from docker.utils.build import exclude_paths

    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    files = exclude_paths(str(ROOT), patterns)
    tops = {f.split("/", 1)[0] for f in files} - {"Dockerfile", ".dockerignore"}  # always sent
    assert tops <= {"pyproject.toml", "README.md", "engine", "bot", "rules", "templates"}, tops
    assert {"pyproject.toml", "README.md", "engine", "bot", "rules", "templates"} <= tops
    assert not [f for f in files if "__pycache__" in f]


# Each input and the Settings field it sets: adding an input without wiring it fails here.
INPUT_VALUES: dict[str, tuple[str, str, Any]] = {
    "config": ("cfg/models.yml", "config", Path("cfg/models.yml")),
    "github-token": ("ghs_input", "token", "ghs_input"),
    "fail-on": ("never", "fail_on", "never"),
    "filter-mode": ("file", "filter_mode", "file"),
    "review-event": ("comment", "review_event", "COMMENT"),
    "models": ("a, b", "models", ["a", "b"]),
    "shard": ("2/3", "shard", "2/3"),
    "mode": ("merge", "mode", "merge"),
    "partials": ("downloaded", "partials", Path("downloaded")),
    "result": ("r/result.json", "result", Path("r/result.json")),
    "pr-event": ("r/event.json", "pr_event_path", Path("r/event.json")),
    "sandbox": ("docker", "sandbox", "docker"),
    "sandbox-cpus": ("1.5", "sandbox_cpus", 1.5),
    "max-comments": ("7", "max_comments", 7),
    "context": ("proof", "context", "proof"),
    "out": ("rep", "out", Path("rep")),
}


def test_every_input_reaches_the_bot(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(INPUT_VALUES) == set(ACTION["inputs"])
    for name, (value, _, _) in INPUT_VALUES.items():
        monkeypatch.setenv(f"INPUT_{name.upper()}", value)
    args = Namespace(**dict.fromkeys(("event", "event_name", "pr_event", "repo", "token_env", "api_url", "server_url", "config", "models", "result", "out", "filter_mode", "review_event", "fail_on", "max_comments", "context", "shard", "mode", "partials", "sandbox", "sandbox_image", "sandbox_cpus")), http_timeout=30.0)
    s = settings_from(args)
    for name, (_, field, expected) in INPUT_VALUES.items():
        assert getattr(s, field) == expected, name
    # The defaults action.yml declares are the bot's own defaults.
    for name, decl in ACTION["inputs"].items():
        monkeypatch.setenv(f"INPUT_{name.upper()}", "" if "${{" in str(decl["default"]) else str(decl["default"]))
    defaults = settings_from(args)
    from shardproof.bot.app import Settings

    plain = Settings()
    for name, (_, field, _) in INPUT_VALUES.items():
        if name not in ("github-token", "review-event"):
            assert getattr(defaults, field) == getattr(plain, field), name


def test_every_output_is_written(tmp_path: Path) -> None:
    fake = FakeGitHub().start()
    try:
        path, line = bs.bug_site("bug_missing_allreduce")
        fake.add_pr(7, sc.HEAD, [{"filename": path, "status": "modified", "patch": sc.patch_adding(path, line)}])
        o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("bug_missing_allreduce")))
    finally:
        fake.stop()
    written = set(o.outputs)
    assert set(ACTION["outputs"]) - {"shard"} <= written, set(ACTION["outputs"]) - written
    assert o.outputs["trace"].endswith("trace.html") and o.outputs["sarif"].endswith("report.sarif")


def test_readme_documents_every_input_output_and_example_workflow() -> None:
    section = README[README.index("## The GitHub Action") :]
    section = section[: section.index("\n## ", 5)]
    for name in ACTION["inputs"]:
        assert f"| `{name}` |" in section, name
    for name in ACTION["outputs"]:
        assert f"| `{name}` |" in section, name
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    for wf in WORKFLOWS:
        assert wf.read_text() in blocks, f"{wf.name} is not in the README verbatim"


RELEASE = ROOT / ".github" / "workflows" / "release.yml"


def test_release_workflow_is_valid_for_github() -> None:
    done = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(RELEASE.relative_to(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr


def test_release_workflow_rewrites_the_image_line_action_yml_has() -> None:
    """The release commit points action.yml at the pushed image by a sed on the exact line; if
    that line changed here, the rewrite would find nothing (the workflow's grep fails loudly, and
    so does this test, earlier)."""
    text = RELEASE.read_text()
    assert "^  image: Dockerfile" in text and "  image: Dockerfile\n" in (ROOT / "action.yml").read_text()
    flow = yaml.safe_load(text)
    builds = flow["jobs"]["image"]["strategy"]["matrix"]["include"]
    # Every variant it builds is one the Dockerfile's TORCH argument accepts, and the default
    # variant is the Dockerfile's default (the path the Docker tests build).
    dockerfile = (ROOT / "Dockerfile").read_text()
    default = re.search(r"^ARG TORCH=(\w+)$", dockerfile, re.M)
    assert default and {b["torch"] for b in builds} == {default.group(1), "cpu"}
    for b in builds:
        assert re.search(rf"^\s+{b['torch']}\)", dockerfile, re.M), b
    assert flow["jobs"]["action"]["needs"] == "image" and flow["jobs"]["image"]["permissions"]["packages"] == "write"
