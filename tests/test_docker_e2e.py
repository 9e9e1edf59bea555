"""End to end in real Docker: the action's image built from the repository's Dockerfile (on a
locally debootstrapped base), run the way GitHub runs a Docker action on a checkout of
examples/ with a pull_request event, against the fake GitHub over real HTTP. The models are
built in sandbox containers the action starts through the mounted Docker socket.

The daemon, the base image and the image build are shared by the session (conftest.py); the
daemon is started and stopped by pid by tests/docker_support.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import docker_support as ds
import pytest
from bug_sites import bug_sites
from fake_github import FakeGitHub

ROOT = Path(__file__).resolve().parents[1]
SITES = bug_sites(sorted((ROOT / "examples" / "tplm").glob("*.py")), ROOT)
BUG = "bug_missing_attn_allreduce"
BUG_FILE, BUG_LINE = SITES[BUG.removeprefix("bug_")]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What actions/checkout leaves in the workspace: the repository's examples/, a git tree."""
    ws = tmp_path_factory.mktemp("checkout") / "repo"
    shutil.copytree(ROOT / "examples", ws / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    return ws


def _run(daemon: ds.Daemon, image: str, checkout: Path, tmp: Path, files: list[dict[str, Any]], models: str) -> tuple[ds.ActionRun, FakeGitHub, Path]:
    ws = tmp / "workspace"
    shutil.copytree(checkout, ws, symlinks=True)
    fake = FakeGitHub().start()
    fake.add_pr(7, sc.HEAD, files)
    github = {"GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_REPOSITORY": fake.repo, "GITHUB_EVENT_NAME": "pull_request", "GITHUB_SHA": "f" * 40}
    try:
        run = ds.run_action(daemon, image, ws, tmp / "runner", sc.pr_event(), {"config": "examples/.shardproof.yml", "models": models}, github, fake.token)
    finally:
        fake.stop()
    assert fake.errors == []
    print(f"action container: {run.seconds:.1f} s; timings so far: {daemon.timings}")
    return run, fake, ws


def test_bug_pr_gets_its_inline_comment_and_a_failure_status(docker_daemon: ds.Daemon, action_image: str, checkout: Path, tmp_path: Path) -> None:
    files = [{"filename": BUG_FILE, "status": "modified", "patch": sc.patch_adding(BUG_FILE, BUG_LINE)}]
    run, fake, ws = _run(docker_daemon, action_image, checkout, tmp_path, files, f"llama_tp4,{BUG}")
    assert "model builds run in sandbox containers" in run.logs, run.logs[-3000:]
    assert run.code == 1, run.logs[-3000:]

    [review] = fake.reviews
    assert review["state"] == "CHANGES_REQUESTED" and review["commit_id"] == sc.HEAD
    [comment] = fake.review_comments
    assert (comment["path"], comment["line"], comment["side"]) == (BUG_FILE, BUG_LINE, "RIGHT")
    assert "reduction" in comment["body"] and "all-reduce" in comment["body"]
    final = fake.statuses[-1]
    assert (final["state"], final["sha"], final["context"]) == ("failure", sc.HEAD, "shardproof")
    assert [s["state"] for s in fake.statuses] == ["pending", "failure"]
    assert len(fake.issue_comments) == 1 and fake.check_runs[0]["conclusion"] == "failure"

    # The files and step outputs a workflow uploads or reads.
    assert run.outputs["verdict"] == "diverged" and run.outputs["state"] == "failure"
    report = ws / run.outputs["report-dir"]
    trace = ws / run.outputs["trace"]
    assert trace == report / "trace.html" and "<svg" in trace.read_text()
    assert json.loads((ws / run.outputs["sarif"]).read_text())["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == BUG_FILE
    doc = json.loads((report / "result.json").read_text())
    assert {m["name"]: m["status"] for m in doc["models"]} == {"llama_tp4": "verified", BUG: "diverged"}
    bug = next(m for m in doc["models"] if m["name"] == BUG)
    assert bug["result"]["trace"], "the relation trace is in result.json"
    for name in ("baseline", "distributed", "relations", "sourcemap"):
        assert (ws / bug["artifacts"][name]).is_file()
    assert "diverge" in run.step_summary
    assert fake.token not in run.logs
    assert ds.leftover_sandboxes(docker_daemon) == []


def test_correct_pr_gets_a_success_status(docker_daemon: ds.Daemon, action_image: str, checkout: Path, tmp_path: Path) -> None:
    path = "examples/tplm/decode.py"
    files = [{"filename": path, "status": "modified", "patch": sc.patch_adding(path, 20)}]
    run, fake, ws = _run(docker_daemon, action_image, checkout, tmp_path, files, "llama_tp4,decode_tp4")
    assert run.code == 0, run.logs[-3000:]
    final = fake.statuses[-1]
    assert (final["state"], final["sha"]) == ("success", sc.HEAD)
    assert fake.review_comments == [] and not any(r["state"] == "CHANGES_REQUESTED" for r in fake.reviews)
    assert fake.check_runs[0]["conclusion"] == "success"
    assert run.outputs["verdict"] == "verified" and run.outputs["state"] == "success"
    for key in ("trace", "sarif", "result-json"):
        assert (ws / run.outputs[key]).is_file(), key
    assert ds.leftover_sandboxes(docker_daemon) == []
