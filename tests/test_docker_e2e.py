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


# ---------------------------------------------------------------------------------------------
# The user repository of tests/bot_user_repo.py, as GitHub's runner runs the action on it: a
# real git checkout at each pull request head, the image's default inputs (sandbox auto: the
# model builds run in sibling containers), and a recording fake GitHub that checks every request
# against GitHub's REST description.


def _user_run(daemon: ds.Daemon, image: str, fake: FakeGitHub, repo: Path, tmp: Path, number: int, head: str, base: str, inputs: dict[str, str] | None = None) -> ds.ActionRun:
    import bot_user_repo as user

    ws = tmp / f"workspace-{head[:7]}"
    shutil.copytree(repo, ws, symlinks=True)
    user.checkout(ws, head)
    files = user.files(ws, base, head)
    if number in fake.pulls:
        fake.pulls[number].head_sha, fake.pulls[number].files = head, files
    else:
        fake.add_pr(number, head, files)
    github = {"GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_REPOSITORY": fake.repo, "GITHUB_EVENT_NAME": "pull_request", "GITHUB_SHA": "f" * 40}
    run = ds.run_action(daemon, image, ws, tmp / f"runner-{head[:7]}", sc.pr_event(number=number, head=head), inputs or {}, github, fake.token)
    print(f"action container on {head[:7]}: exit {run.code}, {run.seconds:.1f} s")
    return run


def test_user_repository_bug_fix_unproven_and_configuration_errors(docker_daemon: ds.Daemon, action_image: str, tmp_path: Path) -> None:
    import bot_rest_contract as contract
    import bot_user_repo as user

    print("\n".join(ds.image_layers(docker_daemon, action_image)))
    repo = tmp_path / "user"
    shas = user.make(repo)
    fake = FakeGitHub()
    fake.validate = contract.description().check
    fake.start()
    try:
        # 1. The bug: the all-reduce dropped on its own line. Default inputs (filter-mode added).
        bug = _user_run(docker_daemon, action_image, fake, repo, tmp_path, 7, shas["bug"], shas["base"])
        print("\n".join(["bug PR:", *user.calls(fake)]))
        assert bug.code == 1, bug.logs[-3000:]
        assert "model builds run in sandbox containers" in bug.logs, bug.logs[-3000:]
        [review] = fake.reviews
        [comment] = fake.review_comments
        assert review["state"] == "CHANGES_REQUESTED"
        assert (comment["path"], comment["line"], comment["side"]) == ("mlp.py", user.BUG_LINE, "RIGHT")
        assert "marked inline on the changed line that causes it" in review["body"] and "not proven: `scaled`" in review["body"]
        assert bug.outputs["verdict"] == "diverged" and fake.statuses[-1]["state"] == "failure"

        # 2. The fix push: the request for changes is dismissed although `scaled` stays unproven.
        mark = len(fake.log)
        fix = _user_run(docker_daemon, action_image, fake, repo, tmp_path, 7, shas["fix"], shas["base"])
        print("\n".join(["fix push:", *user.calls(fake, mark)]))
        assert fix.code == 0, fix.logs[-3000:]
        [dismissal] = fake.requests("PUT", r"/reviews/\d+/dismissals$")
        assert dismissal.path.endswith(f"/pulls/7/reviews/{review['id']}/dismissals") and fake.reviews[0]["state"] == "DISMISSED"
        assert (fake.statuses[-1]["state"], fake.statuses[-1]["sha"]) == ("success", shas["fix"])
        assert fix.outputs["verdict"] == "unproven" and fix.outputs["state"] == "success"

        # 3. A typo'd key: a configuration error at its line, not an error of shardproof.
        mark = len(fake.log)
        key = _user_run(docker_daemon, action_image, fake, repo, tmp_path, 8, shas["typo_key"], shas["base"])
        print("\n".join(["typo'd key:", *user.calls(fake, mark)]))
        line = next(n for n, t in enumerate((tmp_path / f"workspace-{shas['typo_key'][:7]}" / ".shardproof.yml").read_text().splitlines(), 1) if "expcet" in t)
        assert key.code == 1, key.logs[-3000:]
        final = fake.statuses[-1]
        assert (final["state"], final["sha"]) == ("failure", shas["typo_key"]) and final["description"].startswith("configuration error")
        check = fake.check_runs[-1]
        assert check["output"]["title"] == "configuration error in .shardproof.yml"
        [note] = fake.annotations[check["id"]]
        assert (note["path"], note["start_line"], note["annotation_level"]) == (".shardproof.yml", line, "failure")
        assert [(c["path"], c["line"]) for c in fake.review_comments if c["pr"] == 8] == [(".shardproof.yml", line)]

        # 4. A typo'd entry: bad-input under the Docker sandbox, as under subprocess.
        mark = len(fake.log)
        entry = _user_run(docker_daemon, action_image, fake, repo, tmp_path, 9, shas["typo_entry"], shas["base"], {"models": "block"})
        print("\n".join(["typo'd entry:", *user.calls(fake, mark)]))
        assert entry.code == 1, entry.logs[-3000:]
        assert entry.outputs["verdict"] == "bad-input" and fake.statuses[-1]["state"] == "failure"
        check = fake.check_runs[-1]
        assert check["output"]["title"].startswith("configuration error")
        [note] = fake.annotations[check["id"]]
        assert note["path"] == ".shardproof.yml" and "mpl" in note["message"]
    finally:
        fake.stop()
    assert fake.errors == [] and fake.violations == [], fake.violations
    print(f"{len(fake.log)} requests, {len(fake.violations)} violations of GitHub's REST description")
    assert fake.token not in bug.logs + fix.logs + key.logs + entry.logs
    assert ds.leftover_sandboxes(docker_daemon) == []
