"""The sandbox: a pull request's model code that tries to read the token, open a network
connection and write into the workspace fails at each, and its verdict is still reported.

``tests/sandbox_project/hostile.py`` probes the job before it builds a correct MLP (or its bug)
and fails its own build if any probe got through, printing one ``PROBE`` line per attempt into
the build log. The same model built without a sandbox (the subprocess path) escapes — the
control that shows the probes are real. Real Docker (tests/docker_support.py), the action's
real image, the fake GitHub over real HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import docker_support as ds
import pytest
from fake_github import FakeGitHub

from shardproof.bot import sandbox as sandbox_mod
from shardproof.bot.app import Settings
from shardproof.bot.commands import make_runner
from shardproof.bot.runner import FrontendRunner, scrubbed_environ
from shardproof.bot.sandbox import SandboxRunner, connect, host_path, own_container_ids

PROJECT = Path(__file__).parent / "sandbox_project"
BUG_LINE = next(n for n, line in enumerate((PROJECT / "hostile.py").read_text().splitlines(), 1) if "BUG-SITE: missing_allreduce" in line)


def _workspace(tmp: Path, port: int) -> Path:
    ws = tmp / "ws"
    shutil.copytree(PROJECT, ws, ignore=shutil.ignore_patterns("__pycache__"))
    config = ws / ".shardproof.yml"
    config.write_text(config.read_text().replace("port: 9}", f"port: {port}}}"))
    return ws


def _snapshot(ws: Path) -> dict[str, bytes]:
    return {p.relative_to(ws).as_posix(): p.read_bytes() for p in sorted(ws.rglob("*")) if p.is_file() and "shardproof-report" not in p.parts and "__pycache__" not in p.parts}


def _probes(log: str) -> dict[str, str]:
    return {line.split(": ", 1)[0].removeprefix("PROBE "): line.split(": ", 1)[1] for line in log.splitlines() if line.startswith("PROBE ") and ": " in line}


def _model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in doc["models"] if m["name"] == name)


# -- without Docker ---------------------------------------------------------------------------


def test_the_bot_finds_its_own_container_and_the_workspace_on_the_host() -> None:
    cid = "a" * 64
    other = "b" * 64
    mountinfo = "\n".join([
        f"1201 1180 0:52 /var/lib/docker/containers/{other}/mounts/shm /var/lib/docker/containers/{other}/mounts/shm rw - tmpfs shm rw",
        f"1190 1180 252:1 /var/lib/docker/containers/{cid}/resolv.conf /etc/resolv.conf rw - ext4 /dev/vda rw",
        f"1191 1180 252:1 /var/lib/docker/containers/{cid}/hostname /etc/hostname rw - ext4 /dev/vda rw",
    ])  # fmt: skip
    # Host networking: the hostname is the host's; the mount table still names the container.
    assert own_container_ids(mountinfo, "runner-vm") == [cid]
    assert own_container_ids("", "0123456789ab") == ["0123456789ab"]
    mounts = [
        {"Type": "bind", "Source": "/home/runner/work/repo/repo", "Destination": "/github/workspace"},
        {"Type": "bind", "Source": "/home/runner/work/_temp/_github_home", "Destination": "/github/home"},
        {"Type": "bind", "Source": "/srv/cache", "Destination": "/github/workspace/.cache"},
    ]
    assert host_path(mounts, Path("/github/workspace")) == "/home/runner/work/repo/repo"
    assert host_path(mounts, Path("/github/workspace/sub")) == "/home/runner/work/repo/repo/sub"
    assert host_path(mounts, Path("/github/workspace/.cache/x")) == "/srv/cache/x"
    assert host_path(mounts, Path("/elsewhere")) is None


def test_subprocess_builds_do_not_inherit_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_one")
    monkeypatch.setenv("INPUT_GITHUB-TOKEN", "ghs_two")
    monkeypatch.setenv("ACTIONS_RUNTIME_TOKEN", "runtime")
    monkeypatch.setenv("MY_SETTING", "ghs_three")  # a secret under an innocent name
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with scrubbed_environ(["ghs_three"]) as removed:
        assert {"GITHUB_TOKEN", "INPUT_GITHUB-TOKEN", "ACTIONS_RUNTIME_TOKEN", "MY_SETTING"} <= set(removed)
        assert not any(v.startswith("ghs_") for v in os.environ.values())
        assert os.environ["PJRT_DEVICE"] == "CPU"
    assert os.environ["GITHUB_TOKEN"] == "ghs_one" and os.environ["MY_SETTING"] == "ghs_three"


def test_without_docker_the_builds_run_in_subprocesses_says_so_and_the_probes_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: without a sandbox the hostile model reaches the network and the workspace
    (the token alone is kept out of its environment), so its build fails and says why."""
    fake = FakeGitHub().start()
    try:
        ws = _workspace(tmp_path, fake.server.port)
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
        monkeypatch.setenv("GITHUB_TOKEN", fake.token)
        s = Settings(config=ws / ".shardproof.yml", models=["hostile"], token=fake.token, workspace=str(ws))
        runner = make_runner(s)
        assert isinstance(runner, FrontendRunner) and "no-docker.sock" in (runner.notice or "")
        fake.add_pr(7, sc.HEAD, [])
        o = sc.run_bot(fake, tmp_path / "run", runner=runner, config=ws / ".shardproof.yml", models=["hostile"], workspace=str(ws))
        assert "not in sandbox containers" in o.files["summary.md"] and "no-docker.sock" in o.files["summary.md"]
        entry = _model(json.loads(o.files["result.json"]), "hostile")
        assert entry["status"] == "build-failed"
        error = entry["build"]["error"]
        assert "sandbox escape" in error and f"connected to 127.0.0.1:{fake.server.port}" in error and "wrote pwned.txt" in error
        assert "token:" not in error  # scrubbed from the workers' environment
        assert fake.requests(path="/pwned")  # the model really phoned the fake GitHub
        assert (ws / "pwned.txt").exists()
        assert fake.statuses[-1]["state"] == "error"
    finally:
        fake.stop()


def test_sandbox_docker_without_docker_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeGitHub().start()
    try:
        fake.add_pr(7, sc.HEAD, [])
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
        s = Settings(config=PROJECT / ".shardproof.yml", sandbox="docker", workspace=str(PROJECT))
        o = sc.run_bot(fake, tmp_path / "run", runner=make_runner(s))
        assert o.code == 1 and fake.statuses[-1]["state"] == "error" and "sandbox: docker" in fake.statuses[-1]["description"]
    finally:
        fake.stop()


def test_no_sandbox_outcome_but_a_clean_build_with_every_artifact_is_a_pass() -> None:
    from types import SimpleNamespace

    from shardproof.bot.sandbox import ARTIFACTS, _outcome

    model = SimpleNamespace(name="m")
    built = {"name": "m", "status": "built", "build": {"seconds": 1.5, "peak_rss_mb": 300.0, "error": None}}
    every = set(ARTIFACTS.values())
    assert _outcome(model, built, every, None, None, False, 4096, 0, 9.0, "").ok
    failed = {"name": "m", "status": "build-failed", "build": {"error": "x" * 100_000}}
    cases = {
        "killed": _outcome(model, built, every, None, "exceeded the cap", False, 4096, 137, 9.0, "log line"),
        "oom": _outcome(model, built, every, None, None, True, 4096, 137, 9.0, ""),
        "unreadable": _outcome(model, built, every, "its files could not be read", None, False, 4096, 0, 9.0, ""),
        "silent": _outcome(model, None, set(), None, None, False, 4096, 3, 9.0, "error: bad config"),
        "missing": _outcome(model, built, every - {"relations.yaml"}, None, None, False, 4096, 0, 9.0, ""),
        "failed": _outcome(model, failed, set(), None, None, False, 4096, 2, 9.0, ""),
        "forged": _outcome(model, {"name": "m", "status": "verified", "build": {}}, every, None, None, False, 4096, 0, 9.0, ""),
    }
    for name, outcome in cases.items():
        assert not outcome.ok and outcome.error, name
    assert "bad config" in (cases["silent"].error or "") and "relations.yaml" in (cases["missing"].error or "")
    assert len(cases["failed"].error or "") <= sandbox_mod.MAX_ERROR_CHARS


# -- in Docker ----------------------------------------------------------------------------------


def test_hostile_model_code_is_contained_and_its_verdicts_reported(docker_daemon: ds.Daemon, action_image: str, tmp_path: Path) -> None:
    fake = FakeGitHub().start()
    try:
        ws = _workspace(tmp_path, fake.server.port)
        before = _snapshot(ws)
        fake.add_pr(7, sc.HEAD, [{"filename": "hostile.py", "status": "modified", "patch": f"@@ -{BUG_LINE - 1},0 +{BUG_LINE},1 @@\n+" + (PROJECT / "hostile.py").read_text().splitlines()[BUG_LINE - 1]}])
        github = {"GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_REPOSITORY": fake.repo, "GITHUB_EVENT_NAME": "pull_request", "GITHUB_SHA": "f" * 40}
        run = ds.run_action(docker_daemon, action_image, ws, tmp_path / "runner", sc.pr_event(), {"models": "hostile,hostile_bug", "review-event": "COMMENT"}, github, fake.token)
        assert "model builds run in sandbox containers" in run.logs, run.logs[-3000:]

        doc = json.loads((ws / "shardproof-report" / "result.json").read_text())
        # The verdicts come back: the hostile code got nothing, so both models built normally.
        assert _model(doc, "hostile")["status"] == "verified"
        assert _model(doc, "hostile_bug")["status"] == "diverged"
        assert run.code == 1 and run.outputs["verdict"] == "diverged"
        assert fake.statuses[-1]["state"] == "failure" and fake.statuses[-1]["sha"] == sc.HEAD
        assert [(c["path"], c["line"]) for c in fake.review_comments] == [("hostile.py", BUG_LINE)]

        for name in ("hostile", "hostile_bug"):
            log = (ws / "shardproof-report" / name / "build.log").read_text()
            probes = _probes(log)
            assert probes["token"].startswith("blocked"), log
            assert probes[f"network 127.0.0.1:{fake.server.port}"].startswith("blocked ("), log
            assert probes["network dns"].startswith("blocked ("), log
            for file in ("pwned.txt", ".shardproof.yml", "hostile.py"):
                assert probes[f"write {file}"].startswith("blocked (OSError: [Errno 30] Read-only file system"), log
            assert "ESCAPED" not in log
            names = probes["environment"].split()
            assert not [n for n in names if n.startswith(("GITHUB", "INPUT_", "ACTIONS_", "GH_"))], names
        # Nothing reached the fake GitHub but the bot's own authorized requests.
        assert fake.requests(path="/pwned") == [] and all(r.status != 401 for r in fake.log)
        assert _snapshot(ws) == before
        assert ds.leftover_sandboxes(docker_daemon) == []
    finally:
        fake.stop()
    assert fake.errors == []


def test_a_build_that_fails_or_hits_a_sandbox_cap_is_build_failed(docker_daemon: ds.Daemon, action_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = _workspace(tmp_path, 9)
    config = ws / ".shardproof.yml"
    runner = SandboxRunner(connect(ws, action_image, cpus=1, base_url=docker_daemon.url))

    doc = runner.run(config, ws / "out-raises", ["raises"])
    entry = _model(doc, "raises")
    assert entry["status"] == "build-failed" and "RuntimeError: the model's constructor failed on purpose" in entry["build"]["error"]
    assert 'File "hostile.py"' in entry["build"]["error"]  # the traceback, relative to the repository

    # The container's own caps, beneath the front end's: no time to start (the model's 4 s
    # only), then no memory beyond the model's 200 MiB — torch-xla alone needs more.
    monkeypatch.setattr(sandbox_mod, "STARTUP_SECONDS", 0.0)
    entry = _model(runner.run(config, ws / "out-slow", ["slow"]), "slow")
    assert entry["status"] == "build-failed" and "wall-time cap of 4 s" in entry["build"]["error"], entry
    monkeypatch.setattr(sandbox_mod, "STARTUP_SECONDS", 300.0)
    monkeypatch.setattr(sandbox_mod, "MEMORY_HEADROOM_MB", 0)
    entry = _model(runner.run(config, ws / "out-small", ["small"]), "small")
    assert entry["status"] == "build-failed" and "the sandbox's memory cap of 200 MiB" in entry["build"]["error"], entry
    assert "result" not in entry
    assert ds.leftover_sandboxes(docker_daemon) == []
