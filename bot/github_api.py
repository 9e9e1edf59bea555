"""The GitHub REST calls the bot makes (through PyGithub), with retries that never duplicate.

Every call runs under one policy: 5xx, 429, secondary rate limits and network errors are retried
with exponential backoff, honouring ``Retry-After`` and the rate-limit reset. PyGithub's own
retry is switched off so there is exactly one policy to reason about.

Writes that create something (a review, a comment, a status, a check run, annotations) are not
idempotent: a request that timed out or failed with a 5xx may still have been applied. Before
repeating one, the bot looks for what it would have created — every created object carries a
per-run nonce (hidden in a body, or a check run's ``external_id``) — and stops if it is there.
"""

from __future__ import annotations

import email.utils
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
from github import Auth, Github, GithubException
from github.CommitStatus import CommitStatus
from github.PaginatedList import PaginatedList

from .secrets import Redactor

T = TypeVar("T")


@dataclass
class RetryPolicy:
    attempts: int = 6
    base: float = 1.0  # first backoff, doubled per attempt
    cap: float = 32.0  # longest backoff without a server hint
    max_wait: float = 300.0  # longest wait a Retry-After or rate-limit reset may ask for
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    clock: Callable[[], float] = time.time

    def backoff(self, attempt: int) -> float:
        # Half fixed, half random: spread retries of parallel jobs without making waits tiny.
        d = min(self.cap, self.base * 2**attempt)
        return d / 2 + d / 2 * self.jitter()


class GitHubError(Exception):
    """A GitHub call that failed for good, in words a user can act on."""

    def __init__(self, action: str, status: int | None, detail: str, hint: str = "") -> None:
        super().__init__(action, status, detail, hint)
        self.action, self.status, self.detail, self.hint = action, status, detail, hint

    def __str__(self) -> str:
        what = f"HTTP {self.status}" if self.status else "no response"
        text = f"GitHub: could not {self.action} ({what}: {self.detail})"
        return f"{text}. {self.hint}" if self.hint else text


class PermissionDenied(GitHubError):
    """The token may not do this (a fork's read-only token, or missing ``permissions:``)."""


class Unprocessable(GitHubError):
    """HTTP 422: GitHub understood the request and refused its content."""


@dataclass
class _Transient:
    wait: float | None  # what the server asked for
    maybe_applied: bool  # the request may have taken effect before failing
    detail: str


def _headers(e: GithubException) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (e.headers or {}).items()}


def _message(e: GithubException) -> str:
    data = e.data if isinstance(e.data, dict) else {}
    msg = str(data.get("message") or e.message or "").strip()
    errors = data.get("errors")
    if isinstance(errors, list) and errors:
        parts = [str(x.get("message") or x.get("code") or x) if isinstance(x, dict) else str(x) for x in errors]
        msg = f"{msg}: {'; '.join(parts)}" if msg else "; ".join(parts)
    return msg or "no message"


def _located(e: BaseException) -> str:
    """``KeyError: 'sha' (at PullRequest.py:123)``: the exception and the innermost frame."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {tb[-1].filename.replace(chr(92), '/').rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}" if str(e) else f"{type(e).__name__}{where}"


def _retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def classify(e: BaseException, now: float) -> _Transient | None:
    """Is this failure worth another try, and how long should we wait first?"""
    if isinstance(e, requests.exceptions.Timeout):
        return _Transient(None, True, "the request timed out")
    if isinstance(e, requests.exceptions.ConnectionError):
        return _Transient(None, True, "the connection failed")
    if isinstance(e, requests.exceptions.ChunkedEncodingError):
        # The connection broke while the response body arrived: the request was answered (a
        # write went through) but the answer is lost, exactly like a timeout after the fact.
        return _Transient(None, True, "the response was cut off")
    if not isinstance(e, GithubException):
        return None
    h = _headers(e)
    msg = _message(e)
    ra = _retry_after(h.get("retry-after"), now)
    if e.status == 429:
        return _Transient(ra, False, f"429 {msg}")
    if e.status == 403:
        if ra is not None or "secondary rate limit" in msg.lower():
            return _Transient(ra if ra is not None else 60.0, False, f"403 {msg}")
        if h.get("x-ratelimit-remaining") == "0":
            reset = h.get("x-ratelimit-reset")
            wait = max(0.0, float(reset) - now) + 1 if reset and reset.isdigit() else 60.0
            return _Transient(wait, False, f"403 {msg}")
    if 500 <= e.status < 600:
        return _Transient(ra, True, f"{e.status} {msg}")
    return None


HINTS = {
    "pull-requests": "The token needs `pull-requests: write` (add it under `permissions:` in the workflow). Fork pull requests get a read-only token: use the workflow_run split described in the README.",
    "issues": "The token needs `pull-requests: write` or `issues: write` to comment on the pull request.",
    "statuses": "The token needs `statuses: write` (add it under `permissions:` in the workflow).",
    "checks": "Check runs need a GitHub App token such as the workflow's GITHUB_TOKEN with `checks: write`; personal access tokens cannot create them.",
    "contents": "The token needs read access to the repository (`contents: read`, `pull-requests: read`).",
}


@dataclass
class Api:
    """One repository on one GitHub (or GHES / test) API endpoint."""

    token: str
    repo_name: str
    base_url: str = "https://api.github.com"
    timeout: float = 30.0
    write_interval: float = 1.0  # GitHub asks integrations to pace writes (secondary limits)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    redact: Redactor = field(default_factory=Redactor)
    log: Callable[[str], None] = lambda _msg: None
    calls: int = 0

    def __post_init__(self) -> None:
        self.redact.add(self.token)
        self.gh = Github(
            auth=Auth.Token(self.token),
            base_url=self.base_url.rstrip("/"),
            timeout=int(max(1, self.timeout)),
            retry=None,
            per_page=100,
            seconds_between_requests=None,
            seconds_between_writes=self.write_interval or None,
            lazy=True,
            user_agent="shardproof-bot",
        )
        self.repo = self.gh.get_repo(self.repo_name)

    # -- the one retry loop ---------------------------------------------------------------------

    def call(self, action: str, fn: Callable[[], T], *, permission: str = "contents", reconcile: Callable[[], T | None] | None = None) -> T:
        """Run ``fn`` under the retry policy. ``reconcile`` finds the object a lost write created."""
        last: _Transient | None = None
        # Some earlier attempt may have gone through and no successful check has ruled it out.
        # Not just the last attempt: after a timeout and a check that could not tell, a 429 on
        # the repeat does not make the timed-out write any less likely to be there.
        unsure = False
        shape_retried = False
        for attempt in range(self.retry.attempts):
            if unsure and reconcile is not None:
                found, checked = self._reconcile(action, reconcile, permission)
                if found is not None:
                    self.log(f"{action}: the earlier attempt had gone through; not repeating it")
                    return found
                unsure = not checked
            try:
                self.calls += 1
                return fn()
            except (AssertionError, AttributeError, KeyError, TypeError, ValueError) as e:
                # An answer of a shape the client library did not expect (a field missing or of
                # another type): asked once more (a proxy may have cut it), then an error that
                # names the call and where the answer broke; never a crash that loses the run.
                if shape_retried or attempt + 1 >= self.retry.attempts:
                    raise GitHubError(action, None, self.redact(f"GitHub's answer has an unexpected shape: {_located(e)}"), "The request may have gone through; the verdict is in the step outputs and the report files.") from None
                shape_retried = True
                unsure = True  # a write whose answer did not parse may have been applied
                self.log(f"{action}: GitHub's answer has an unexpected shape ({self.redact(_located(e))}); asking once more")
                continue
            except (GithubException, requests.exceptions.RequestException) as e:
                t = classify(e, self.retry.clock())
                if t is None:
                    raise self._error(action, e, permission) from None
                last = t
                unsure = unsure or t.maybe_applied
                if attempt + 1 >= self.retry.attempts:
                    break
                wait = t.wait if t.wait is not None else self.retry.backoff(attempt)
                if wait > self.retry.max_wait:
                    raise GitHubError(action, getattr(e, "status", None), self.redact(t.detail), f"GitHub asked to wait {wait:.0f} s, longer than the {self.retry.max_wait:.0f} s this run accepts; re-run the job later.") from None
                self.log(f"{action}: {self.redact(t.detail)}; retrying in {wait:.1f} s (attempt {attempt + 2} of {self.retry.attempts})")
                self.retry.sleep(wait)
        assert last is not None
        if unsure and reconcile is not None:
            found, _ = self._reconcile(action, reconcile, permission)
            if found is not None:
                return found
        raise GitHubError(action, None, self.redact(last.detail), f"gave up after {self.retry.attempts} attempts; GitHub may be having an outage.")

    def _reconcile(self, action: str, reconcile: Callable[[], T | None], permission: str) -> tuple[T | None, bool]:
        """What the lost write created, if anything, and whether GitHub could be asked at all."""
        try:
            return self.call(f"check whether '{action}' went through", reconcile, permission=permission), True
        except GitHubError as e:
            # Cannot tell: repeating the write risks a duplicate, not repeating it risks a loss.
            self.log(f"{e}; repeating '{action}'")
            return None, False

    def _error(self, action: str, e: BaseException, permission: str) -> GitHubError:
        if not isinstance(e, GithubException):
            return GitHubError(action, None, self.redact(e))
        msg = self.redact(_message(e))
        if e.status == 401:
            return GitHubError(action, 401, msg, "The token was rejected: check the github-token input (expired or revoked?).")
        if e.status == 403:
            return PermissionDenied(action, 403, msg, HINTS.get(permission, ""))
        if e.status == 404:
            return GitHubError(action, 404, msg, f"Either {self.repo_name} or the object does not exist, or the token cannot see it. {HINTS['contents']}")
        if e.status == 422:
            return Unprocessable(action, 422, msg)
        return GitHubError(action, e.status, msg)

    # -- reads ----------------------------------------------------------------------------------

    def pull(self, number: int) -> Any:
        def load() -> Any:
            pr = self.repo.get_pull(number)
            _ = pr.head.sha  # lazy object: this is the GET
            return pr

        return self.call(f"read pull request #{number}", load)

    def pull_files(self, pr: Any) -> list[dict[str, Any]]:
        def load() -> list[dict[str, Any]]:
            return [{"filename": f.filename, "status": f.status, "patch": f.patch, "previous_filename": f.previous_filename} for f in pr.get_files()]

        return self.call(f"list the files of pull request #{pr.number}", load)

    def find_pulls(self, head: str) -> list[Any]:
        return self.call(f"find the open pull request of {head}", lambda: list(self.repo.get_pulls(state="open", head=head)))

    def review_comments(self, pr: Any) -> list[Any]:
        return self.call(f"list review comments of #{pr.number}", lambda: list(pr.get_review_comments()))

    def reviews(self, pr: Any) -> list[Any]:
        return self.call(f"list reviews of #{pr.number}", lambda: list(pr.get_reviews()))

    def issue_comments(self, pr: Any) -> list[Any]:
        return self.call(f"list comments of #{pr.number}", lambda: list(pr.get_issue_comments()))

    # -- writes ---------------------------------------------------------------------------------

    def create_review(self, pr: Any, sha: str, body: str, event: str, comments: list[dict[str, Any]], nonce: str) -> Any:
        def find() -> Any:
            return next((r for r in pr.get_reviews() if nonce in (r.body or "")), None)

        body = self.redact(body)
        comments = [{**c, "body": self.redact(c["body"])} for c in comments]
        return self.call(
            f"post the review on #{pr.number}",
            lambda: pr.create_review(commit=self.repo.get_commit(sha), body=body, event=event, comments=comments),
            permission="pull-requests",
            reconcile=find,
        )

    def edit_review_comment(self, comment: Any, body: str) -> None:
        self.call(f"edit review comment {comment.id}", lambda: comment.edit(self.redact(body)), permission="pull-requests")

    def dismiss_review(self, pr: Any, review: Any, message: str) -> None:
        def dismiss() -> None:
            try:
                review.dismiss(self.redact(message))
            except GithubException as e:
                # Already dismissed (an earlier attempt went through) is what we wanted.
                if e.status == 422 and "dismiss" in _message(e).lower():
                    return
                raise

        self.call(f"dismiss review {review.id} on #{pr.number}", dismiss, permission="pull-requests")

    def create_issue_comment(self, pr: Any, body: str, nonce: str) -> Any:
        def find() -> Any:
            return next((c for c in pr.get_issue_comments() if nonce in (c.body or "")), None)

        body = self.redact(body)
        return self.call(f"comment on #{pr.number}", lambda: pr.create_issue_comment(body), permission="issues", reconcile=find)

    def edit_issue_comment(self, comment: Any, body: str) -> None:
        self.call(f"edit comment {comment.id}", lambda: comment.edit(self.redact(body)), permission="issues")

    def create_status(self, sha: str, state: str, description: str, context: str, target_url: str | None) -> Any:
        description = self.redact(description)
        commit = self.repo.get_commit(sha)

        def find() -> Any:
            # Statuses are a list per commit, newest first; the newest of a context counts. A lost
            # write shows up as the newest entry of our context, with our state and description.
            # (PyGithub's Commit.get_statuses uses the legacy /statuses/{sha} listing.)
            listing = PaginatedList(CommitStatus, self.gh.requester, f"{self.repo.url}/commits/{sha}/statuses", None)
            for s in listing:
                if s.context == context:
                    return s if s.state == state and s.description == description else None
            return None

        kwargs: dict[str, Any] = {"state": state, "description": description, "context": context}
        if target_url:
            kwargs["target_url"] = target_url
        return self.call(f"set the commit status '{context}' on {sha[:7]}", lambda: commit.create_status(**kwargs), permission="statuses", reconcile=find)

    def create_check_run(self, name: str, sha: str, conclusion: str, output: dict[str, Any], nonce: str, details_url: str | None) -> Any:
        commit = self.repo.get_commit(sha)

        def find() -> Any:
            return next((c for c in commit.get_check_runs(check_name=name) if c.external_id == nonce), None)

        output = {k: (self.redact(v) if isinstance(v, str) else v) for k, v in output.items()}
        if "annotations" in output:
            output["annotations"] = [{k: (self.redact(v) if isinstance(v, str) else v) for k, v in a.items()} for a in output["annotations"]]
        kwargs: dict[str, Any] = {"name": name, "head_sha": sha, "status": "completed", "conclusion": conclusion, "output": output, "external_id": nonce}
        if details_url:
            kwargs["details_url"] = details_url
        return self.call(f"create the check run '{name}' on {sha[:7]}", lambda: self.repo.create_check_run(**kwargs), permission="checks", reconcile=find)

    def add_annotations(self, run: Any, output: dict[str, Any], batch: list[dict[str, Any]], total_after: int) -> None:
        """Annotations append on every update, so a lost update is detected by counting them."""

        def find() -> bool | None:
            return True if len(list(run.get_annotations())) >= total_after else None

        batch = [{k: (self.redact(v) if isinstance(v, str) else v) for k, v in a.items()} for a in batch]
        out = {"title": output["title"], "summary": self.redact(output["summary"]), "annotations": batch}
        self.call(f"add annotations to check run {run.id}", lambda: run.edit(output=out), permission="checks", reconcile=find)
