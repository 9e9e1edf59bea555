"""The bot against a stateful fake GitHub over real HTTP: placement, dedup, sticky summary,
resolution, fork mode, retries and faults, the status gate, secrets and error messages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import bot_scenarios as sc
import bot_support as bs
from fake_github import FakeGitHub

from shardproof.bot.render import MARK_SUMMARY


def _final_status(fake: FakeGitHub, sha: str = sc.HEAD) -> dict:
    return [s for s in fake.statuses if s["sha"] == sha and s["context"] == "shardproof"][-1]


def test_bug_gets_an_inline_comment_on_its_exact_changed_line(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.bug_on_changed_line(fake, tmp_path)
    path, line = bs.bug_site("bug_missing_allreduce")
    assert o.code == 1
    [review] = fake.reviews
    assert review["state"] == "CHANGES_REQUESTED" and review["commit_id"] == sc.HEAD
    [c] = fake.review_comments
    assert (c["path"], c["line"], c["side"]) == (path, line, "RIGHT")
    body = c["body"]
    assert "`bug_missing_allreduce`" in body and "`%add.30`" in body
    assert "partial sum over ranks" in body and "all-reduce" in body  # the cause, in words
    assert "**Should match in the baseline:** `%add.30 = f32[8,32] add`" in body
    assert "<details><summary>Relation trace of output 0" in body
    assert "`partition/dot-contract-sharded`" in body  # the trace names the rules
    # The verified model is in the tables, not in a comment.
    assert "`mlp_tp4` | ✅ verified" in review["body"]
    # Gate: pending first, failure at the end, on the head commit (not a merge commit).
    states = [(s["sha"], s["state"]) for s in fake.statuses]
    assert states == [(sc.HEAD, "pending"), (sc.HEAD, "failure")]
    assert _final_status(fake)["target_url"] == fake.check_runs[0]["html_url"]
    [check] = fake.check_runs
    assert check["conclusion"] == "failure" and check["head_sha"] == sc.HEAD
    assert [(a["path"], a["start_line"]) for a in fake.annotations[check["id"]]] == [(path, line)]
    assert "Relation trace of output 0" in check["output"]["text"]
    [summary] = fake.issue_comments
    assert summary["body"].startswith(MARK_SUMMARY.format(context="shardproof"))
    # Files and step outputs.
    assert {"result.json", "report.sarif", "trace.html", "review.md", "summary.md"} <= set(o.files)
    assert json.loads(o.files["result.json"])["models"][1]["name"] == "bug_missing_allreduce"
    assert o.outputs["verdict"] == "diverged" and o.outputs["state"] == "failure"
    assert o.outputs["trace-html"].endswith("shardproof-report/trace.html")
    assert "## shardproof:" in Path(o.settings.step_summary_file or "").read_text()


def test_findings_outside_the_diff_go_to_the_body_with_links(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.out_of_diff(fake, tmp_path)
    path, line = bs.bug_site("bug_wrong_groups")
    assert fake.review_comments == []
    [review] = fake.reviews
    link = f"https://github.test/acme/models/blob/{sc.HEAD}/{path}#L{line}"
    assert f"[`{path}:{line}`]({link})" in review["body"]
    assert "Not inline: its line is in a file this pull request does not change." in review["body"]
    assert "replica groups" in review["body"]
    assert o.code == 1


def test_a_second_run_updates_the_summary_and_duplicates_nothing(fake: FakeGitHub, tmp_path: Path) -> None:
    first, second = sc.rerun(fake, tmp_path)
    assert first.code == second.code == 1
    assert len(fake.reviews) == 1
    assert len(fake.review_comments) == 1  # the changed-line bug; the other one is in the body
    [summary] = fake.issue_comments
    assert summary.get("edits") == 1
    assert "no new findings" in second.err
    # Re-run statuses: one pending and one final per run, nothing more.
    assert [s["state"] for s in fake.statuses] == ["pending", "failure", "pending", "failure"]


def test_a_fixed_pull_request_resolves_its_findings(fake: FakeGitHub, tmp_path: Path) -> None:
    first, second = sc.fixed(fake, tmp_path)
    assert first.code == 1 and second.code == 0
    [c] = fake.review_comments
    assert c["body"].startswith("<!-- shardproof:resolved sha=" + sc.HEAD2)
    assert "**Resolved:**" in c["body"] and "partial sum over ranks" in c["body"]  # kept, struck
    [review] = fake.reviews
    assert review["state"] == "DISMISSED"  # the request for changes no longer stands
    [summary] = fake.issue_comments
    assert "### Resolved since the last run (1)" in summary["body"]
    assert "all 2 models verified" in summary["body"]
    assert _final_status(fake, sc.HEAD2)["state"] == "success"
    assert [s["state"] for s in fake.statuses if s["sha"] == sc.HEAD] == ["pending", "failure"]


def test_a_divergence_that_turns_unproven_is_resolved_and_the_request_dismissed(fake: FakeGitHub, tmp_path: Path) -> None:
    first, second = sc.turned_unproven(fake, tmp_path)
    assert first.code == 1 and second.code == 0, second.out + second.err
    old, new = fake.reviews
    assert old["state"] == "DISMISSED"  # nothing blocking is left
    assert new["state"] == "COMMENTED" and "### Not proven (1)" in new["body"]  # a note, not a request
    [c] = fake.review_comments
    assert "**Resolved as a bug:**" in c["body"] and "partial sum over ranks" in c["body"]
    assert _final_status(fake, sc.HEAD2)["state"] == "success"
    assert second.outputs["verdict"] == "unproven" and second.outputs["state"] == "success"


def test_a_fork_pull_request_degrades_to_annotations_and_keeps_the_verdict(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.fork(fake, tmp_path)
    path, line = bs.bug_site("bug_missing_allreduce")
    assert o.code == 1  # the gate's verdict, even without a status
    writes = [r for r in fake.log if r.method != "GET"]
    assert [(r.method, r.status) for r in writes] == [("POST", 403)]  # one probe, then no writes
    assert fake.reviews == fake.issue_comments == fake.statuses == fake.check_runs == []
    assert [line for line in o.out.splitlines() if "read-only" in line] == [o.out.splitlines()[0]]  # said once
    assert f"::error file={path},line={line},title=shardproof%3A bug_missing_allreduce diverges at %25add.30::" in o.out
    summary = Path(o.settings.step_summary_file or "").read_text()
    assert "read-only" in summary and "partial sum over ranks" in summary
    assert o.outputs["degraded"] == "true"
    assert (Path(o.settings.out) / "trace.html").exists()


def test_injected_500_429_and_timeouts_lose_and_duplicate_nothing(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.faults(fake, tmp_path)
    assert o.code == 1
    assert all(f.times == 0 for f in fake.faults)  # every fault fired
    assert len(fake.reviews) == 1 and len(fake.review_comments) == 1
    assert len(fake.issue_comments) == 1
    assert len(fake.check_runs) == 1
    assert [s["state"] for s in fake.statuses] == ["pending", "failure"]
    assert 1.0 in o.sleeps and 2.0 in o.sleeps  # Retry-After honoured (429, secondary limit)
    assert o.err.count("had gone through; not repeating it") == 3  # status, review, summary


def test_a_refused_anchor_falls_back_to_the_body_without_losing_findings(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.refused_anchor(fake, tmp_path)
    [review] = fake.reviews
    assert fake.review_comments == []
    assert "GitHub did not accept the inline comments" in review["body"]
    assert "partial sum over ranks" in review["body"] and "`%add.30`" in review["body"]
    assert "GitHub refused the inline comments" in o.out
    posts = fake.requests("POST", r"/reviews$")
    assert [r.status for r in posts] == [422, 200]


def test_own_pull_request_gets_a_comment_review(fake: FakeGitHub, tmp_path: Path) -> None:
    sc.own_pr(fake, tmp_path)
    [review] = fake.reviews
    assert review["state"] == "COMMENTED" and len(fake.review_comments) == 1


def test_the_status_is_set_even_when_the_build_crashes(fake: FakeGitHub, tmp_path: Path) -> None:
    crashed, failed = sc.build_crash(fake, tmp_path)
    assert crashed.code == 4 and failed.code == 1  # a crash of ours exits 4 (internal error)
    finals = [s for s in fake.statuses if s["state"] != "pending"]
    assert [s["state"] for s in finals] == ["error", "error"]
    assert "not in this pull request" in finals[0]["description"] and "RuntimeError: worker died" in finals[0]["description"]
    assert finals[1]["description"] == "error: 1 of 2 model builds failed"
    assert "flash_attn" in fake.issue_comments[0]["body"]  # the reason reaches the summary


def test_secrets_never_reach_logs_comments_statuses_or_files(fake: FakeGitHub, tmp_path: Path) -> None:
    outcomes = sc.build_crash(fake, tmp_path)
    secret = fake.token
    assert any(r.headers.get("Authorization") == f"token {secret}" for r in fake.log)  # it was used
    texts = [json.dumps(r.body) for r in fake.log if r.body is not None]
    for o in outcomes:
        texts += [o.out, o.err, *o.files.values(), Path(o.settings.step_summary_file or "").read_text()]
    for t in texts:
        assert secret not in t
        assert "ghp_xxxx" not in t
    assert any("***" in t for t in texts)


def test_push_sets_the_status_only(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.push(fake, tmp_path)
    assert o.code == 1
    assert {(r.method, re.sub(r"[0-9a-f]{40}", "SHA", r.path)) for r in fake.log} == {("POST", "/repos/acme/models/statuses/SHA")}
    assert [s["state"] for s in fake.statuses] == ["pending", "failure"]


def test_workflow_run_split_posts_on_the_verified_head_only(fake: FakeGitHub, tmp_path: Path) -> None:
    by_number, by_branch, forged = sc.workflow_run(fake, tmp_path)
    assert [r["pr"] for r in fake.reviews] == [9]  # the second run found nothing new to say
    assert len(fake.review_comments) == 1
    assert fake.requests("GET", r"/pulls$")  # the fork's pull request was found by its branch
    assert "is at 3333333, not at the verified 1111111" in forged.err
    assert not [r for r in fake.log if r.method == "POST" and "/pulls/3/" in r.path]
    assert by_number.code == by_branch.code == forged.code == 1


def test_a_pull_request_that_moved_on_gets_the_status_only(fake: FakeGitHub, tmp_path: Path) -> None:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, sc.HEAD2, [{"filename": path, "status": "modified", "patch": sc.patch_adding(path, line)}])
    o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("bug_missing_allreduce")))  # the event names HEAD
    assert fake.reviews == fake.issue_comments == []
    assert [(s["sha"], s["state"]) for s in fake.statuses] == [(sc.HEAD, "pending"), (sc.HEAD, "failure")]
    assert "moved on to 2222222" in o.err and o.code == 1


def test_pull_request_target_on_a_fork_never_runs_the_models(fake: FakeGitHub, tmp_path: Path) -> None:
    fake.add_pr(7, sc.HEAD, [], head_repo="outsider/models")
    runner = sc.DocRunner(bs.run_doc(bs.model("mlp_tp4")))
    o = sc.run_bot(fake, tmp_path, event=sc.pr_event(head_repo="outsider/models"), event_name="pull_request_target", runner=runner)
    assert runner.calls == 0
    assert _final_status(fake)["state"] == "error"
    assert "pull_request_target" in _final_status(fake)["description"]
    assert o.code == 1


def test_caps_pagination_and_annotation_batches(fake: FakeGitHub, tmp_path: Path) -> None:
    [o] = sc.many(fake, tmp_path)
    assert len(fake.requests("GET", r"/pulls/7/files")) == 2  # 130 files: two pages
    assert len(fake.review_comments) == 30
    [review] = fake.reviews
    assert "over the limit of 30 inline comments per review" in review["body"]
    assert review["body"].count("Not inline:") + review["body"].count("<sub>(") == 90
    [check] = fake.check_runs
    assert len(fake.annotations[check["id"]]) == 120  # 50 + 50 + 20
    assert [len(r.body["output"].get("annotations", [])) for r in fake.requests("PATCH", r"/check-runs/")] == [50, 20]
    assert o.code == 1


def test_unknown_token_is_a_clear_error_and_exit_4(fake: FakeGitHub, tmp_path: Path) -> None:
    fake.add_pr(7, sc.HEAD, [])
    o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("mlp_tp4")), token="ghs_wrongtoken0123456789abcdefghijklmnop")
    assert o.code == 4
    assert "The token was rejected" in o.out and "HTTP 401" in o.out
    assert "ghs_wrong" not in o.out + o.err
    assert (Path(o.settings.out) / "result.json").exists()  # the verdict is still kept


def test_a_lasting_outage_gives_up_with_a_clear_error(fake: FakeGitHub, tmp_path: Path) -> None:
    fake.add_pr(7, sc.HEAD, [])
    fake.fault("POST", r"/statuses/", "502", times=100)
    o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("mlp_tp4")))
    assert o.code == 4
    assert "gave up after 5 attempts" in o.out
    assert len(fake.requests("POST", r"/statuses/")) == 10  # pending and final, 5 tries each


def test_missing_permission_names_the_permission(fake: FakeGitHub, tmp_path: Path) -> None:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, sc.HEAD, [{"filename": path, "status": "modified", "patch": sc.patch_adding(path, line)}])
    orig = fake._create_review
    fake._create_review = lambda pr, body: fake._error(403, "Resource not accessible by integration")  # type: ignore[method-assign]
    o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("bug_missing_allreduce")))
    fake._create_review = orig  # type: ignore[method-assign]
    assert "pull-requests: write" in o.out
    assert "No review was posted" in fake.issue_comments[0]["body"]
    assert _final_status(fake)["state"] == "failure"  # the gate is unaffected


def test_an_unknown_repository_is_a_clear_error(fake: FakeGitHub, tmp_path: Path) -> None:
    o = sc.run_bot(fake, tmp_path, bs.run_doc(bs.model("mlp_tp4")), event=sc.pr_event(repo="acme/elsewhere"))
    assert o.code == 4
    assert "HTTP 404" in o.out and "acme/elsewhere" in o.out and "cannot see it" in o.out
