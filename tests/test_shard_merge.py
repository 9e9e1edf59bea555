"""Scale-out: three ``shard: k/n`` jobs plus a ``mode: merge`` job report exactly what one
unsharded run reports — the same review with the same inline comments, the same summary, the
same commit status and check run. Real front end on models of examples/, the fake GitHub over
real HTTP, the shards' report folders "downloaded" as a matrix's artifacts would be."""

from __future__ import annotations

import difflib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import pytest
from bug_sites import bug_sites
from fake_github import FakeGitHub

from shardproof.bot.runner import FrontendRunner
from shardproof.bot.shards import MergeRunner, parse_shard, pick

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / ".shardproof.yml"
# Two correct models and three bugs in two files: every shard of three gets work.
MODELS = ["llama_tp4", "decode_tp4", "bug_missing_attn_allreduce", "bug_redundant_mlp_allreduce", "bug_decode_local_max"]
SITES = bug_sites(sorted((ROOT / "examples" / "tplm").glob("*.py")), ROOT)
BUGS = {m: SITES[m.removeprefix("bug_")] for m in MODELS if m.startswith("bug_")}


def _pr_files() -> list[dict[str, Any]]:
    by_file: dict[str, list[int]] = {}
    for path, line in BUGS.values():
        by_file.setdefault(path, []).append(line)
    files = []
    for path, lines in sorted(by_file.items()):
        hunks = [sc.patch_adding(path, line, context=2) for line in sorted(lines)]
        files.append({"filename": path, "status": "modified", "patch": "\n".join(hunks)})
    return files


@dataclass
class Observed:
    code: int
    reviews: list[dict[str, Any]]
    comments: list[tuple[str, int, str]]
    summaries: list[str]
    statuses: list[tuple[str, str]]
    checks: list[dict[str, Any]]
    outputs: dict[str, str]
    requests: int


_TIME = re.compile(r"\b\d+(?:\.\d+)? (?:s|ms)\b")
_NONCE = re.compile(r"(nonce[= ])\w+")


def _same(text: str) -> str:
    """Times and per-run nonces differ between any two runs; everything else must not."""
    return _NONCE.sub(r"\1N", _TIME.sub("T", text))


def _observe(fake: FakeGitHub, outcome: sc.Outcome) -> Observed:
    return Observed(
        outcome.code,
        [{"state": r["state"], "body": _same(r["body"])} for r in fake.reviews],
        [(c["path"], c["line"], _same(c["body"])) for c in fake.review_comments],
        [_same(c["body"]) for c in fake.issue_comments],
        [(s["state"], s["description"]) for s in fake.statuses],
        [{"conclusion": c["conclusion"], "title": c["output"]["title"], "summary": _same(c["output"]["summary"]), "text": _same(c["output"].get("text") or "")} for c in fake.check_runs],
        outcome.outputs,
        len(fake.log),
    )


def _fake() -> FakeGitHub:
    fake = FakeGitHub().start()
    fake.add_pr(7, sc.HEAD, _pr_files())
    return fake


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("shards")
    fakes: list[FakeGitHub] = []
    try:
        whole_fake = _fake()
        fakes.append(whole_fake)
        whole = sc.run_bot(whole_fake, tmp / "whole", runner=FrontendRunner(), config=CONFIG, models=MODELS)

        shard_fake = _fake()
        fakes.append(shard_fake)
        partials = tmp / "partials"
        shard_outcomes = []
        for k in (1, 2, 3):
            # A shard job needs no token and writes nothing to GitHub.
            o = sc.run_bot(shard_fake, tmp / f"job{k}", runner=FrontendRunner(), token=None, config=CONFIG, models=MODELS, shard=f"{k}/3")
            shard_outcomes.append(o)
            # actions/download-artifact puts each artifact in a folder named after it.
            shutil.copytree(o.settings.out, partials / f"shardproof-shard-{k}")
        merge_fake = _fake()
        fakes.append(merge_fake)
        merged = sc.run_bot(merge_fake, tmp / "merge", runner=MergeRunner(partials), mode="merge", partials=partials)
        return {
            "tmp": tmp,
            "partials": partials,
            "whole": (_observe(whole_fake, whole), whole),
            "shards": (shard_fake, shard_outcomes),
            "merged": (_observe(merge_fake, merged), merged),
        }
    finally:
        for f in fakes:
            f.stop()
            assert f.errors == []


def test_three_shards_and_a_merge_report_what_one_run_reports(runs: dict[str, Any]) -> None:
    whole, whole_outcome = runs["whole"]
    merged, merged_outcome = runs["merged"]
    assert whole.code == merged.code == 1
    assert whole.statuses[-1][0] == merged.statuses[-1][0] == "failure"
    assert merged.statuses == whole.statuses
    assert len(merged.reviews) == len(whole.reviews) == 1
    assert merged.reviews == whole.reviews
    for (a, b) in zip(merged.comments, whole.comments, strict=True):
        assert a[:2] == b[:2]
        assert a[2] == b[2], "\n".join(difflib.unified_diff(b[2].splitlines(), a[2].splitlines(), lineterm=""))
    assert sorted((p, n) for p, n, _ in merged.comments) == sorted(BUGS.values())  # each bug inline, on its line
    assert merged.summaries == whole.summaries and len(merged.summaries) == 1
    assert merged.checks == whole.checks
    assert {k: v for k, v in merged.outputs.items() if k not in ("report-dir", "result-json", "sarif", "trace", "trace-html", "summary-md", "review-md")} == {k: v for k, v in whole.outputs.items() if k not in ("report-dir", "result-json", "sarif", "trace", "trace-html", "summary-md", "review-md")}
    # The merged report folder is complete: the trace of every divergence, SARIF, the artifacts.
    files = merged_outcome.files
    assert _same(files["review.md"]) == _same(whole_outcome.files["review.md"])
    assert json.loads(files["report.sarif"])["runs"][0]["results"] == json.loads(whole_outcome.files["report.sarif"])["runs"][0]["results"]
    assert files["trace.html"].count("<svg") == whole_outcome.files["trace.html"].count("<svg") >= len(BUGS)
    doc = json.loads(files["result.json"])
    assert [m["name"] for m in doc["models"]] == MODELS  # declaration order, not shard order
    for m in doc["models"]:
        for path in m["artifacts"].values():
            assert (merged_outcome.settings.out / path).is_file(), path


def test_shards_split_deterministically_and_never_write_to_github(runs: dict[str, Any]) -> None:
    fake, outcomes = runs["shards"]
    assert fake.log == []  # no token, no request: a shard can be the unprivileged half
    ran: list[str] = []
    for k, o in enumerate(outcomes, 1):
        partial = json.loads((o.settings.out / "result.json").read_text())
        assert partial["shard"]["index"] == k and partial["shard"]["count"] == 3 and partial["shard"]["sha"] == sc.HEAD
        assert partial["shard"]["models"] == pick(MODELS, k, 3) == [m["name"] for m in partial["models"]]
        ran += partial["shard"]["models"]
        # A diverging model does not fail the shard (a fail-fast matrix would cancel the others).
        assert o.code == 0
        assert o.outputs["shard"] == f"{k}/3"
    assert sorted(ran) == sorted(MODELS)


def _merge_again(runs: dict[str, Any], name: str, partials: Path) -> tuple[Observed, sc.Outcome]:
    fake = _fake()
    try:
        o = sc.run_bot(fake, runs["tmp"] / name, runner=MergeRunner(partials), mode="merge", partials=partials)
        return _observe(fake, o), o
    finally:
        fake.stop()


def test_a_missing_shard_is_an_error_never_a_pass(runs: dict[str, Any]) -> None:
    partials = runs["tmp"] / "partials-missing"
    shutil.copytree(runs["partials"], partials)
    shutil.rmtree(partials / "shardproof-shard-2")  # its job was cancelled: no artifact
    seen, outcome = _merge_again(runs, "merge-missing", partials)
    assert seen.statuses[-1][0] == "error" and outcome.code == 1
    doc = json.loads(outcome.files["result.json"])
    lost = {m["name"]: m for m in doc["models"] if m["status"] == "build-failed"}
    assert sorted(lost) == sorted(pick(MODELS, 2, 3))
    assert all("shard 2/3 reported no result" in m["build"]["error"] for m in lost.values())
    assert "shard 2/3 reported no result" in seen.summaries[0]


def test_partials_of_another_commit_or_run_are_refused(runs: dict[str, Any]) -> None:
    stale = runs["tmp"] / "partials-stale"
    shutil.copytree(runs["partials"], stale)
    first = stale / "shardproof-shard-1" / "result.json"
    doc = json.loads(first.read_text())
    doc["shard"]["sha"] = sc.HEAD2  # an older run's artifact
    first.write_text(json.dumps(doc))
    seen, _ = _merge_again(runs, "merge-stale", stale)
    assert seen.statuses[-1][0] == "error" and "do not belong to one run" in seen.statuses[-1][1]

    for shard in (1, 2, 3):  # all three of another commit: still not this commit's verdict
        path = stale / f"shardproof-shard-{shard}" / "result.json"
        doc = json.loads(path.read_text())
        doc["shard"]["sha"] = sc.HEAD2
        path.write_text(json.dumps(doc))
    seen, _ = _merge_again(runs, "merge-other-commit", stale)
    assert seen.statuses[-1][0] == "error" and "partial results are of commit" in seen.statuses[-1][1]
    assert seen.reviews == []

    twice = runs["tmp"] / "partials-twice"
    shutil.copytree(runs["partials"], twice)
    shutil.copytree(twice / "shardproof-shard-1", twice / "shardproof-shard-1-rerun")
    seen, _ = _merge_again(runs, "merge-twice", twice)
    assert seen.statuses[-1][0] == "error" and "two results" in seen.statuses[-1][1]


def test_more_shards_than_models_and_bad_shard_settings(tmp_path: Path) -> None:
    fake = FakeGitHub().start()
    try:
        o = sc.run_bot(fake, tmp_path / "s", runner=FrontendRunner(), token=None, config=CONFIG, models=["decode_tp4"], shard="2/2")
        assert o.code == 0 and json.loads(o.files["result.json"])["shard"]["models"] == []
        bad = sc.run_bot(fake, tmp_path / "b", runner=FrontendRunner(), token=None, config=CONFIG, shard="3/2")
        assert bad.code == 3 and "shard" in bad.out
        both = sc.run_bot(fake, tmp_path / "m", runner=FrontendRunner(), token=None, config=CONFIG, shard="1/2", mode="merge")
        assert both.code == 3
    finally:
        fake.stop()
    assert parse_shard(" 2 / 3 ") == (2, 3)
    for text in ("0/3", "4/3", "2", "a/b", ""):
        with pytest.raises(ValueError):
            parse_shard(text)
    names = [f"m{i}" for i in range(10)]
    parts = [pick(names, k, 4) for k in range(1, 5)]
    assert sorted(n for part in parts for n in part) == sorted(names) and max(map(len, parts)) - min(map(len, parts)) <= 1


def _workflow_run_event(repo: str) -> dict[str, Any]:
    return {"action": "completed", "workflow_run": {"head_sha": sc.HEAD, "head_branch": "feature", "event": "pull_request", "pull_requests": [], "head_repository": {"full_name": "outsider/models", "owner": {"login": "outsider"}}}, "repository": {"full_name": repo}}


def test_fork_split_posts_the_one_shard_result_from_workflow_run(runs: dict[str, Any]) -> None:
    """examples/workflows/shardproof-fork-*.yml: a fork's pull_request run is shard 1/1 and
    uploads its report and event; the workflow_run posts it with mode: merge."""
    tmp = runs["tmp"] / "fork"
    fake = _fake()
    fake.pulls[7].head_repo = "outsider/models"
    fake.pulls[7].head_ref = "feature"
    try:
        built = sc.run_bot(fake, tmp / "build", runner=FrontendRunner(), token=None, config=CONFIG, models=MODELS[:3], shard="1/1", event=sc.pr_event(head_repo="outsider/models"))
        assert built.code == 0 and fake.log == []
        partials = tmp / "shardproof-partials"
        shutil.copytree(built.settings.out, partials / "shardproof-report")
        (partials / "shardproof-event").mkdir()
        (partials / "shardproof-event" / "event.json").write_text(json.dumps(sc.pr_event(head_repo="outsider/models")))
        event = _workflow_run_event(fake.repo)
        posted = sc.run_bot(fake, tmp / "report", event=event, event_name="workflow_run", runner=MergeRunner(partials), mode="merge", partials=partials, pr_event_path=partials / "shardproof-event" / "event.json")
        assert posted.code == 1 and fake.statuses[-1]["state"] == "failure" and fake.statuses[-1]["sha"] == sc.HEAD
        assert [(c["path"], c["line"]) for c in fake.review_comments] == [BUGS["bug_missing_attn_allreduce"]]

        # Part 1 uploaded nothing (cancelled): the status still says what happened.
        empty = tmp / "nothing"
        lost = sc.run_bot(fake, tmp / "report2", event=event, event_name="workflow_run", runner=MergeRunner(empty), mode="merge", partials=empty, pr_event_path=empty / "shardproof-event" / "event.json")
        assert lost.code == 1 and fake.statuses[-1]["state"] == "error" and "no partial results" in fake.statuses[-1]["description"]
    finally:
        fake.stop()
    assert fake.errors == []
