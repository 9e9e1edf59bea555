"""The bot's subcommands through ``shardproof`` itself: ``report`` offline, ``github`` configured
the way the action configures it (INPUT_* and GITHUB_* variables)."""

from __future__ import annotations

import json
from pathlib import Path

import bot_scenarios as sc
import bot_support as bs
import pytest
from fake_github import FakeGitHub

from shardproof.engine.cli import main

FIXTURE = Path(__file__).parent / "golden" / "fixture" / "result.json"




def test_report_renders_everything_from_a_result_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    assert main(["report", "--result", str(FIXTURE), "--out", str(out), "--repo", "acme/models", "--sha", "0" * 40]) == 0
    assert {p.name for p in out.iterdir()} == {"result.json", "review.md", "summary.md", "check.md", "report.sarif", "trace.html"}
    assert json.loads((out / "report.sarif").read_text())["version"] == "2.1.0"
    assert "<svg" in (out / "trace.html").read_text()
    assert capsys.readouterr().out.startswith("error: shardproof crashed on 1 of 8 models")


def test_report_refuses_a_missing_file(tmp_path: Path) -> None:
    assert main(["report", "--result", str(tmp_path / "nope.json")]) == 3


def _action_env(monkeypatch: pytest.MonkeyPatch, fake: FakeGitHub, tmp: Path, event: dict) -> None:
    (tmp / "event.json").write_text(json.dumps(event))
    for k, v in {
        "GITHUB_EVENT_PATH": str(tmp / "event.json"), "GITHUB_EVENT_NAME": "pull_request", "GITHUB_REPOSITORY": fake.repo,
        "GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_RUN_ID": "42",
        "GITHUB_SHA": "f" * 40,  # the merge commit: never the one reported on
        "INPUT_GITHUB-TOKEN": fake.token, "GITHUB_OUTPUT": str(tmp / "out.txt"), "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "GITHUB_WORKSPACE": str(bs.ROOT), "SHARDPROOF_WRITE_INTERVAL": "0",
    }.items():  # fmt: skip
        monkeypatch.setenv(k, v)


def test_github_as_the_action_runs_it(fake: FakeGitHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, sc.HEAD, [{"filename": path, "status": "modified", "patch": sc.patch_adding(path, line)}])
    result = tmp_path / "result.json"
    result.write_text(json.dumps(bs.run_doc(bs.model("bug_missing_allreduce"))))
    _action_env(monkeypatch, fake, tmp_path, sc.pr_event())
    monkeypatch.setenv("INPUT_RESULT", str(result))
    monkeypatch.setenv("INPUT_REVIEW-EVENT", "comment")
    monkeypatch.setenv("INPUT_OUT", str(tmp_path / "report"))
    assert main(["github"]) == 1
    [review] = fake.reviews
    assert review["state"] == "COMMENTED" and [(c["path"], c["line"]) for c in fake.review_comments] == [(path, line)]
    assert {s["sha"] for s in fake.statuses} == {sc.HEAD}
    assert fake.statuses[-1]["target_url"] == fake.check_runs[0]["html_url"]
    assert "result-json=" in (tmp_path / "out.txt").read_text()
    assert fake.token not in capsys.readouterr().err


def test_github_exit_policy_and_bad_settings(fake: FakeGitHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add_pr(7, sc.HEAD, [])
    result = tmp_path / "result.json"
    result.write_text(json.dumps(bs.run_doc(bs.model("bug_missing_allreduce"))))
    _action_env(monkeypatch, fake, tmp_path, sc.pr_event())
    assert main(["github", "--result", str(result), "--fail-on", "never", "--out", str(tmp_path / "r")]) == 0
    assert fake.statuses[-1]["state"] == "failure"  # the gate stays honest
    assert main(["github", "--result", str(result), "--max-comments", "500"]) == 3
    assert main(["github", "--result", str(result), "--filter-mode", "everything"]) == 3
    monkeypatch.setenv("GITHUB_EVENT_NAME", "issue_comment")
    assert main(["github", "--result", str(result)]) == 3


def test_github_without_a_configuration_reports_an_error_status(fake: FakeGitHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.add_pr(7, sc.HEAD, [])
    _action_env(monkeypatch, fake, tmp_path, sc.pr_event())
    monkeypatch.chdir(tmp_path)
    assert main(["github", "--config", str(tmp_path / "missing.yml")]) == 1
    final = fake.statuses[-1]
    assert final["state"] == "error" and "missing.yml" in final["description"]
