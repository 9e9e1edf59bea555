"""The bot on a user repository with real git diffs, real builds (torch-xla in subprocess
workers) and a recording fake GitHub that checks every request against GitHub's REST
description (tests/bot_rest_contract.py).

Scenarios (tests/bot_user_repo.py): the canonical bug (the all-reduce dropped on its own line:
the inline comment goes on that changed line under the default filter), the fix push (the
request for changes is dismissed while another model stays ``unproven``), the all-reduce line
deleted outright (a LEFT-side comment on the removed line), a typo'd key and a typo'd entry in
``.shardproof.yml`` (configuration errors: status failure, located), and an answer of GitHub
lacking a field (the verdict survives in the outputs and the step summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import bot_rest_contract as contract
import bot_scenarios as sc
import bot_user_repo as user
import pytest
from fake_github import FakeGitHub

from shardproof.bot.runner import FrontendRunner


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    path = tmp_path_factory.mktemp("user") / "repo"
    return path, user.make(path)


def _fake() -> FakeGitHub:
    fake = FakeGitHub()
    fake.validate = contract.description().check
    return fake.start()


def _run(fake: FakeGitHub, repo: Path, tmp: Path, head: str, base: str, models: list[str] | None = None, **kw: Any) -> sc.Outcome:
    user.checkout(repo, head)
    files = user.files(repo, base, head)
    if 7 in fake.pulls:
        fake.pulls[7].head_sha, fake.pulls[7].files = head, files
    else:
        fake.add_pr(7, head, files)
    return sc.run_bot(fake, tmp, event=sc.pr_event(head=head), runner=FrontendRunner(), workspace=str(repo), config=repo / ".shardproof.yml", models=models, **kw)


def test_removed_collective_is_commented_on_its_line_and_the_fix_dismisses_with_an_unproven_model_beside(repo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, shas = repo
    fake = _fake()
    try:
        bug = _run(fake, path, tmp_path / "bug", shas["bug"], shas["base"])
        print("\n".join(["bug PR:", *user.calls(fake)]))
        assert bug.code == 1, bug.out + bug.err
        [review] = fake.reviews
        assert review["state"] == "CHANGES_REQUESTED"
        [comment] = fake.review_comments
        # The changed line, not `return x + out` (line 24, context) where the programs first differ.
        assert (comment["path"], comment["line"], comment["side"]) == ("mlp.py", user.BUG_LINE, "RIGHT")
        assert "the distributed program diverges because of this line" in comment["body"]
        assert "this pull request changes this line" in comment["body"] and "mlp.py:24" in comment["body"]
        assert "marked inline on the changed line that causes it" in review["body"]
        assert "Not on a changed line" not in review["body"]
        # The other model is unproven: not proven, in the body, never a change request.
        assert "### Not proven (2)" in review["body"] and "not proven: `scaled`" in review["body"]
        assert fake.statuses[-1]["state"] == "failure"

        mark = len(fake.log)
        fix = _run(fake, path, tmp_path / "fix", shas["fix"], shas["base"])
        print("\n".join(["fix push:", *user.calls(fake, mark)]))
        assert fix.code == 0, fix.out + fix.err
        [dismissal] = fake.requests("PUT", r"/reviews/\d+/dismissals$")
        assert dismissal.path.endswith(f"/pulls/7/reviews/{review['id']}/dismissals")
        assert fake.reviews[0]["state"] == "DISMISSED"
        assert "Resolved" in fake.review_comments[0]["body"]
        assert fake.statuses[-1]["state"] == "success" and fake.statuses[-1]["sha"] == shas["fix"]
        assert fix.outputs["verdict"] == "unproven" and fix.outputs["state"] == "success"
    finally:
        fake.stop()
    assert fake.errors == [] and fake.violations == [], fake.violations
    print(f"{len(fake.log)} requests, {len(fake.violations)} violations of GitHub's REST description")


def test_a_deleted_all_reduce_line_is_commented_on_the_left_side(repo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, shas = repo
    fake = _fake()
    try:
        run = _run(fake, path, tmp_path / "deleted", shas["deleted"], shas["two_lines"], models=["block"])
        print("\n".join(["deleted line:", *user.calls(fake)]))
    finally:
        fake.stop()
    assert run.code == 1, run.out + run.err
    [comment] = fake.review_comments
    assert (comment["path"], comment["line"], comment["side"]) == ("mlp.py", user.BUG_LINE + 1, "LEFT")
    assert "**Removed here:**" in comment["body"] and "out = all_reduce(out, self.groups)" in comment["body"]
    assert fake.errors == [] and fake.violations == [], fake.violations


def test_a_typod_key_is_a_configuration_error_at_its_line(repo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, shas = repo
    fake = _fake()
    try:
        run = _run(fake, path, tmp_path / "typo_key", shas["typo_key"], shas["base"])
        print("\n".join(["typo'd key:", *user.calls(fake)]))
    finally:
        fake.stop()
    line = next(n for n, t in enumerate((path / ".shardproof.yml").read_text().splitlines(), 1) if "expcet" in t)
    assert run.code == 1, run.out + run.err
    final = fake.statuses[-1]
    assert final["state"] == "failure" and final["description"].startswith("configuration error"), final
    [check] = fake.check_runs
    assert check["output"]["title"] == "configuration error in .shardproof.yml"
    [note] = fake.annotations[check["id"]]
    assert (note["path"], note["start_line"], note["annotation_level"]) == (".shardproof.yml", line, "failure")
    assert "expcet" in note["message"] and "did you mean 'expect'" in note["message"]
    [comment] = fake.review_comments  # the line is in the diff: an inline comment on it
    assert (comment["path"], comment["line"], comment["side"]) == (".shardproof.yml", line, "RIGHT")
    assert "configuration error" in comment["body"]
    [summary] = fake.issue_comments
    heading = next(t for t in summary["body"].splitlines() if t.startswith("## "))
    assert len(heading) < 120 and "configuration error" in heading, heading
    assert f".shardproof.yml:{line}" in summary["body"]
    assert run.outputs["verdict"] == "bad-input" and run.outputs["state"] == "failure"
    assert fake.errors == [] and fake.violations == [], fake.violations


def test_a_typod_entry_is_bad_input(repo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, shas = repo
    fake = _fake()
    try:
        run = _run(fake, path, tmp_path / "typo_entry", shas["typo_entry"], shas["base"], models=["block"])
        print("\n".join(["typo'd entry:", *user.calls(fake)]))
    finally:
        fake.stop()
    assert run.code == 1, run.out + run.err
    assert fake.statuses[-1]["state"] == "failure" and run.outputs["verdict"] == "bad-input"
    [check] = fake.check_runs
    assert check["output"]["title"].startswith("configuration error")
    line = next(n for n, t in enumerate((path / ".shardproof.yml").read_text().splitlines(), 1) if "mpl:block" in t)
    [note] = fake.annotations[check["id"]]
    assert (note["path"], note["start_line"]) == (".shardproof.yml", line) and "mpl" in note["message"]
    [comment] = fake.review_comments
    assert (comment["path"], comment["line"], comment["side"]) == (".shardproof.yml", line, "RIGHT")
    assert fake.errors == [] and fake.violations == [], fake.violations


def test_a_github_answer_lacking_a_field_keeps_the_verdict(repo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    path, shas = repo
    fake = _fake()
    fake.fault("GET", r"/pulls/7$", "drop-field", field="head", times=5)
    try:
        run = _run(fake, path, tmp_path / "shape", shas["bug"], shas["base"], models=["block"])
    finally:
        fake.stop()
    assert "unexpected shape" in run.err and "AttributeError" in run.err, run.err
    # The verdict is in the outputs and the job summary, and the commit status is still set.
    assert run.outputs["verdict"] == "diverged" and run.outputs["state"] == "failure"
    assert "diverge" in Path(run.settings.step_summary_file or "").read_text()
    assert fake.statuses[-1]["state"] == "failure"
    assert run.code == 1, run.out + run.err
