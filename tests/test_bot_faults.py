"""The bot's whole pull request flow against the fake GitHub, over real HTTP, while GitHub fails:
5xx (503 included), 429 and secondary rate limits with ``Retry-After``, TCP connection resets
before, after and in the middle of a response, responses slower than the client's timeout, a
422 for the review carrying one particular inline comment, and combinations of these.

Whatever fails, every run must end the same way as without faults:
- no finding lost: every divergence of the result is in an inline comment or the review body,
  and in the summary comment;
- nothing duplicated: one review, one summary comment, one check run, each inline comment and
  annotation once, statuses exactly pending then failure;
- the commit status ends set (the gate);
- retries bounded: at most two extra requests per injected fault (the repeat, and the listing
  that checks whether a lost write went through), and never more than the retry policy of
  ``shardproof.bot.github_api`` allows for the calls made (``policy_bound``).
A lasting outage (every connection reset) must give up with a clear error, having still tried to
set the final status.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import bot_support as bs
import pytest
from fake_github import FAULT_KINDS, FakeGitHub, Logged

PATH = sc.MODELS_PY
INLINE = ("bug_missing_allreduce", "bug_wrong_groups")  # bugs on lines the pull request adds
ELSEWHERE = "bug_qkv_slice"  # a bug on a line it does not change: the review body
# tests/bot_scenarios.run_bot runs the bot with RetryPolicy(attempts=5).
ATTEMPTS = 5
# Writes Api.call reconciles (looks for what a lost attempt created) before repeating them.
RECONCILED = [("POST", r"/statuses/"), ("POST", r"/pulls/\d+/reviews$"), ("POST", r"/issues/\d+/comments$"), ("POST", r"/check-runs$"), ("PATCH", r"/check-runs/\d+$")]

# Every request of the flow, by what it does. A body pattern tells the two status writes apart.
ENDPOINTS: dict[str, tuple[str, str, str | None]] = {
    "status pending": ("POST", r"/statuses/", r'"state":\s*"pending"'),
    "status final": ("POST", r"/statuses/", r'"state":\s*"failure"'),
    "read pull request": ("GET", r"/pulls/7$", None),
    "list files": ("GET", r"/pulls/7/files$", None),
    "list review comments": ("GET", r"/pulls/7/comments$", None),
    "list reviews": ("GET", r"/pulls/7/reviews$", None),
    "list issue comments": ("GET", r"/issues/7/comments$", None),
    "post review": ("POST", r"/pulls/7/reviews$", None),
    "post summary": ("POST", r"/issues/7/comments$", None),
    "create check run": ("POST", r"/check-runs$", None),
}
# Requested only to check whether a lost write went through.
RECONCILE_READS: dict[str, tuple[str, str, str | None]] = {
    "list statuses": ("GET", r"/commits/[0-9a-f]{40}/statuses$", None),
    "list check runs": ("GET", r"/commits/[0-9a-f]{40}/check-runs$", None),
}
KINDS = [k for k in FAULT_KINDS if k != "422"]  # 422 refuses for good: its own test
SLOW = ("slow-before", "slow-after")  # each costs the client's 1 s timeout
WRITES = ("status pending", "status final", "post review", "post summary", "create check run")




def _doc() -> dict[str, Any]:
    return bs.run_doc(bs.model("mlp_tp4"), *(bs.model(n) for n in INLINE), bs.model(ELSEWHERE))


def _divergences(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["name"], d["instruction"]) for m in doc["models"] for d in (m.get("result") or {}).get("divergences", [])]


def three_findings(fake: FakeGitHub, tmp: Path, faults: list[dict[str, Any]]) -> sc.Outcome:
    """Two bugs on the lines a pull request adds (two hunks of one file: inline comments), one
    on a line it does not change (the review body), one verified model; ``faults`` armed."""
    lines = [bs.bug_site(n)[1] for n in INLINE]
    patch = "\n".join(sc.patch_adding(PATH, line) for line in lines)
    fake.add_pr(7, sc.HEAD, [
        {"filename": PATH, "status": "modified", "patch": patch},
        {"filename": "README.md", "status": "modified", "patch": "@@ -1,1 +1,2 @@\n # x\n+more"},
    ])  # fmt: skip
    for f in faults:
        fake.fault(**f)
    return sc.run_bot(fake, tmp, _doc())


def _fault(endpoint: str, kind: str, **kw: Any) -> dict[str, Any]:
    method, path, body = {**ENDPOINTS, **RECONCILE_READS}[endpoint]
    extra = {"retry_after": "1"} if kind in ("429", "403-secondary") else {}
    return {"method": method, "path": path, "kind": kind, "body": body, **extra, **kw}


@dataclass
class Baseline:
    requests: int
    review_comments: int
    annotations: int


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """The same run with nothing failing: what every faulty run must end with."""
    f = FakeGitHub().start()
    try:
        o = three_findings(f, tmp_path_factory.mktemp("baseline"), [])
        assert o.code == 1 and f.errors == []
        assert [r.status for r in f.log] == [201, 200, 200, 200, 200, 200, 200, 201, 201, 201]
        assert len(f.review_comments) == len(INLINE)
        return Baseline(len(f.log), len(f.review_comments), len(f.annotations[f.check_runs[0]["id"]]))
    finally:
        f.stop()


def _reconciled(r: Logged) -> bool:
    return any(r.method == m and re.search(p, r.path) for m, p in RECONCILED)


def policy_bound(fake: FakeGitHub) -> int:
    """The most requests Api.call may make for the logical calls of this run: each call up to
    ATTEMPTS tries; a reconciled write also up to ATTEMPTS checks of one listing page, each up
    to ATTEMPTS tries. Logical calls are counted as the distinct (method, path, body) made."""
    calls = {(r.method, r.path, json.dumps(r.body, sort_keys=True)): r for r in fake.log if not _is_check(r)}
    return sum(ATTEMPTS + ATTEMPTS * ATTEMPTS if _reconciled(r) else ATTEMPTS for r in calls.values())


def _is_check(r: Logged) -> bool:
    """A listing made only to reconcile a write (counted in the write's bound)."""
    return r.method == "GET" and bool(re.search(r"/commits/[0-9a-f]{40}/(statuses|check-runs)$", r.path))


def assert_nothing_lost_or_duplicated(fake: FakeGitHub, o: sc.Outcome, base: Baseline) -> None:
    # The gate: the run's verdict, and the final status set on the head commit.
    assert o.code == 1, o.out + o.err
    assert [(s["sha"], s["state"]) for s in fake.statuses] == [(sc.HEAD, "pending"), (sc.HEAD, "failure")]
    assert o.outputs["state"] == "failure"
    # Nothing duplicated (and nothing missing).
    assert (len(fake.reviews), len(fake.issue_comments), len(fake.check_runs)) == (1, 1, 1), o.out + o.err
    [review], [summary], [check] = fake.reviews, fake.issue_comments, fake.check_runs
    assert len(fake.review_comments) == base.review_comments
    assert Counter(c["line"] for c in fake.review_comments) == Counter(bs.bug_site(n)[1] for n in INLINE)
    assert len(fake.annotations[check["id"]]) == base.annotations
    # No finding lost: each divergence in an inline comment or the review body, and the summary.
    posted = [c["body"] for c in fake.review_comments] + [review["body"]]
    for model, instruction in _divergences(_doc()):
        assert any(f"`{model}`" in t and f"`{instruction}`" in t for t in posted), f"{model} {instruction} lost"
        assert f"`{model}`" in summary["body"] and f"`{instruction}`" in summary["body"]
    assert f"❌ diverges: `{ELSEWHERE}`" in review["body"]  # the out-of-diff one, in the body
    # Retries bounded.
    fired = sum(f.fired for f in fake.faults)
    assert len(fake.log) <= base.requests + 2 * fired, [(r.method, r.path, r.status, r.fault) for r in fake.log]
    assert len(fake.log) <= policy_bound(fake)
    assert len(o.sleeps) <= fired and all(0 <= s <= 300 for s in o.sleeps)


# -- one kind of fault, on every request of the flow ---------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_request_failing_once(fake: FakeGitHub, tmp_path: Path, baseline: Baseline, kind: str) -> None:
    # Slow faults cost the client's timeout each: on the writes and one read only.
    endpoints = [*WRITES, "list files"] if kind in SLOW else list(ENDPOINTS)
    o = three_findings(fake, tmp_path, [_fault(e, kind) for e in endpoints])
    assert [f.fired for f in fake.faults] == [1] * len(endpoints)  # each request failed once
    assert_nothing_lost_or_duplicated(fake, o, baseline)
    if kind in ("500-after", "slow-after", "reset-after", "reset-mid-body"):
        # Each write went through before its answer was lost: found, never repeated.
        assert o.err.count("had gone through; not repeating it") == len(WRITES)
        assert len(fake.requests("POST")) == len(WRITES)
    if kind in ("429", "403-secondary"):
        assert o.sleeps == [1.0] * len(endpoints)  # Retry-After honoured, nothing else waited for


@pytest.mark.parametrize("seed", range(8))
def test_mixed_faults(fake: FakeGitHub, tmp_path: Path, baseline: Baseline, seed: int) -> None:
    """A seeded mix: each request (and each listing that checks a lost write) fails with a
    random kind, once or twice in a row, or not at all."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS if k not in SLOW] + (["slow-after"] if seed % 4 == 0 else [])
    faults = [_fault(e, rng.choice(kinds), times=rng.choice((1, 1, 2))) for e in [*ENDPOINTS, *RECONCILE_READS] if rng.random() < 0.6]
    o = three_findings(fake, tmp_path, faults)
    assert_nothing_lost_or_duplicated(fake, o, baseline)


def test_all_kinds_at_once(fake: FakeGitHub, tmp_path: Path, baseline: Baseline) -> None:
    """Every request fails, each kind (but the slow ones) somewhere, in one run."""
    kinds = [k for k in KINDS if k not in SLOW]
    o = three_findings(fake, tmp_path, [_fault(e, kinds[i % len(kinds)]) for i, e in enumerate(ENDPOINTS)])
    assert [f.fired for f in fake.faults] == [1] * len(ENDPOINTS)
    assert {f.kind for f in fake.faults} == set(kinds)
    assert_nothing_lost_or_duplicated(fake, o, baseline)


# -- particular cases ---------------------------------------------------------------------------------


def test_retry_after_as_seconds_and_as_an_http_date(fake: FakeGitHub, tmp_path: Path, baseline: Baseline) -> None:
    when = formatdate(time.time() + 30, usegmt=True)
    o = three_findings(fake, tmp_path, [_fault("post review", "503", retry_after="3"), _fault("post summary", "429", retry_after=when)])
    assert_nothing_lost_or_duplicated(fake, o, baseline)
    assert o.sleeps[0] == 3.0 and 25 <= o.sleeps[1] <= 31


def test_422_for_one_inline_comment_moves_every_finding_to_the_body(fake: FakeGitHub, tmp_path: Path) -> None:
    """GitHub refuses a review whole when one comment's anchor is not in the diff."""
    line = bs.bug_site(INLINE[1])[1]
    o = three_findings(fake, tmp_path, [_fault("post review", "422", body=rf'"line":\s*{line}\b', times=100)])
    assert fake.faults[0].fired == 1  # only the review carrying that comment was refused
    assert [r.status for r in fake.requests("POST", r"/reviews$")] == [422, 200]
    [review] = fake.reviews
    assert fake.review_comments == []
    assert "GitHub did not accept the inline comments" in review["body"]
    for model, instruction in _divergences(_doc()):
        assert f"`{model}`" in review["body"] and f"`{instruction}`" in review["body"]
    [summary] = fake.issue_comments
    assert len(fake.check_runs) == 1
    assert "`%all-reduce.53`" in summary["body"]
    assert [s["state"] for s in fake.statuses] == ["pending", "failure"] and o.code == 1


def test_a_write_whose_check_could_not_tell_is_checked_again_after_a_429(fake: FakeGitHub, tmp_path: Path, baseline: Baseline) -> None:
    """The review went through (then a 500); the listing that checks for it failed 5 times (so
    the review was posted again), and that repeat met a 429. Before the next try the listing
    must be asked again: the first attempt may still be there. It used to be skipped because
    the *last* failure (the 429) could not have applied anything: a duplicate review."""
    o = three_findings(fake, tmp_path, [
        _fault("post review", "500-after"),
        _fault("list reviews", "502", times=ATTEMPTS, skip=1),  # skip the listing of earlier reviews
        _fault("post review", "429", retry_after="1"),
    ])  # fmt: skip
    assert [f.fired for f in fake.faults] == [1, ATTEMPTS, 1]
    assert_nothing_lost_or_duplicated(fake, o, baseline)
    assert "could not check whether 'post the review on #7' went through" in o.err
    assert o.err.count("had gone through; not repeating it") == 1


@pytest.mark.parametrize("endpoint", WRITES)
def test_a_response_cut_off_halfway_is_retried(fake: FakeGitHub, tmp_path: Path, baseline: Baseline, endpoint: str) -> None:
    """An RST after the headers, halfway through the body (requests' ChunkedEncodingError): the
    write went through. It used to end the run (the review, the summary or the status lost)."""
    o = three_findings(fake, tmp_path, [_fault(endpoint, "reset-mid-body")])
    assert fake.faults[0].fired == 1
    assert "the response was cut off; retrying" in o.err
    assert o.err.count("had gone through; not repeating it") == 1
    assert_nothing_lost_or_duplicated(fake, o, baseline)


def test_annotation_batches_survive_lost_answers(fake: FakeGitHub, tmp_path: Path) -> None:
    """Annotations append on every check-run update, so repeating a lost one would duplicate."""
    for kind in ("reset-after", "500-after", "reset-mid-body"):
        fake.fault("PATCH", r"/check-runs/\d+$", kind)
    [o] = sc.many(fake, tmp_path)
    assert [f.fired for f in fake.faults] == [1, 1, 0]  # two updates: both answers lost
    [check] = fake.check_runs
    assert len(fake.annotations[check["id"]]) == 120  # 50 + 50 + 20, once each
    assert len(fake.requests("PATCH", r"/check-runs/")) == 2
    assert o.err.count("add annotations to check run") >= 2 and o.code == 1
    assert [s["state"] for s in fake.statuses] == ["pending", "failure"]


def test_a_lasting_connection_reset_outage_gives_up_clearly_and_still_tries_the_status(fake: FakeGitHub, tmp_path: Path) -> None:
    fake.fault("*", r".*", "reset-before", times=10**6)
    o = three_findings(fake, tmp_path, [])
    assert o.code == 1  # the gate's verdict (failure) stands; a verified run would exit 4
    assert "GitHub: could not set the commit status 'shardproof' on 1111111 (no response: the connection failed). gave up after 5 attempts; GitHub may be having an outage." in o.out
    assert "the verdict (failure) could not be recorded on GitHub" in o.out
    # The pending status, then (after the models ran, with nothing posted) the final one: each
    # tried ATTEMPTS times, each repeat after a check (a listing, ATTEMPTS tries) that failed too.
    posts = fake.requests("POST", r"/statuses/")
    assert [p.body["state"] for p in posts] == ["pending"] * ATTEMPTS + ["failure"] * ATTEMPTS
    assert len(fake.requests("GET", r"/statuses$")) == 2 * ATTEMPTS * ATTEMPTS
    assert len(fake.log) == 2 * (ATTEMPTS + ATTEMPTS * ATTEMPTS) == policy_bound(fake)
    assert all(r.status == 0 for r in fake.log)  # no request got an answer
    assert fake.reviews == fake.issue_comments == fake.statuses == fake.check_runs == []
    assert json.loads(o.files["result.json"])["models"][1]["status"] == "diverged"  # the verdict is kept
