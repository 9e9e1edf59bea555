"""A stateful fake of the GitHub REST endpoints the bot uses, served over real HTTP.

It keeps pull requests, their files, reviews, review comments, issue comments, commit statuses
and check runs, and enforces what GitHub enforces and the bot must respect: a review whose inline
comment is not on a line of the diff is rejected whole (422); bodies over 65,536 characters,
status descriptions over 140, more than 50 annotations per request are rejected; a read-only
token gets 403 on every write; requesting changes on one's own pull request is refused.

Faults are injected per request (method + path pattern, optionally a pattern over the request
body): a 5xx before or after applying the write, a 429 or secondary rate limit with
``Retry-After``, a response slower than the client's timeout (after applying the write — the case
that would duplicate without reconciliation), a connection reset (a TCP RST before or after
applying the write, or halfway through the response body), or a 422 for one request body (say,
the review carrying one particular inline comment).
Every request is logged (method, path, query, headers, body) for assertions and for the contract
replay against Prism.

The commentable-line check here is written independently of ``shardproof.bot.diff`` on purpose:
the fake must not share the bot's bugs.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

BOT_LOGIN = "github-actions[bot]"


FAULT_KINDS = (
    "500", "502", "503",  # a server error, the write not applied
    "500-after",  # the write applied, then a 500
    "429", "403-secondary",  # rate limits, with Retry-After
    "slow-before", "slow-after",  # slower than the client's timeout; the write not / applied
    "reset-before", "reset-after",  # TCP RST instead of a response; the write not / applied
    "reset-mid-body",  # the write applied, the response cut off by an RST halfway through its body
    "422",  # refused as invalid (GitHub refuses a review whole when one comment's anchor is bad)
    "drop-field",  # answered, but the JSON object lacks the field ``field`` (an unexpected shape)
)  # fmt: skip


@dataclass
class Fault:
    method: str  # "GET", "POST", ...; "*" for any
    path: str  # regex, matched against the path
    kind: str  # one of FAULT_KINDS
    retry_after: str | None = None
    times: int = 1
    seconds: float = 1.6  # for slow-*: longer than the bot's 1 s timeout in tests
    body: str | None = None  # regex over the raw request body: only requests it matches
    skip: int = 0  # let this many matching requests through before the fault starts
    fired: int = 0  # how many requests it hit
    field: str = ""  # for drop-field: the top-level key removed from the answer

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}")


@dataclass
class Logged:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    status: int = 0  # stays 0 when the connection was reset instead of answered
    fault: str | None = None  # the kind of fault injected into this request


def reset_connection(sock: socket.socket) -> None:
    """Abort a TCP connection with an RST, as a crashing proxy or load balancer does.

    With ``SO_LINGER`` of 0, closing a socket sends RST instead of FIN. The descriptor still
    belongs to werkzeug's request handler (which reads, writes and closes it afterwards), so it
    is not closed but replaced: ``dup2`` puts the end of a socket pair whose peer is gone in its
    place. That drops the last reference to the TCP socket (the RST goes out now) and leaves
    werkzeug a descriptor on which reads see EOF and writes fail with EPIPE, which it treats as
    a dropped connection, quietly. Closing the descriptor instead could hand its number to
    another thread's new connection while werkzeug still uses it.
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    dead, peer = socket.socketpair()
    peer.close()
    try:
        os.dup2(dead.fileno(), sock.fileno())
    finally:
        dead.close()


@dataclass
class PR:
    number: int
    head_sha: str
    base_repo: str
    head_repo: str | None
    head_ref: str = "feature"
    author: str = "contributor"
    files: list[dict[str, Any]] = field(default_factory=list)


def commentable_lines(patch: str | None) -> set[int]:
    """New-side lines shown by a patch (where GitHub accepts a RIGHT-side comment)."""
    lines: set[int] = set()
    if not patch:
        return lines
    new = 0
    for raw in patch.split("\n"):
        header = re.match(r"@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", raw)
        if header:
            new = int(header.group(1))
        elif raw.startswith("+") or raw.startswith(" "):
            lines.add(new)
            new += 1
    return lines


def deleted_lines(patch: str | None) -> set[int]:
    """Old-side lines a patch removes (where GitHub accepts a LEFT-side comment)."""
    lines: set[int] = set()
    old = 0
    for raw in (patch or "").split("\n"):
        header = re.match(r"@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", raw)
        if header:
            old = int(header.group(1))
        elif raw.startswith("-"):
            lines.add(old)
            old += 1
        elif raw.startswith(" "):
            old += 1
    return lines


class FakeGitHub:
    def __init__(self, repo: str = "acme/models", token: str = "ghs_faketoken0123456789abcdefghijklmnop", per_page_cap: int = 100) -> None:
        self.repo = repo
        self.token = token
        self.per_page_cap = per_page_cap
        self.read_only = False
        self.validate: Any = None  # (method, path, query, body) -> violations, for every request
        self.violations: list[str] = []
        self.own_pr = False  # the token's user authored the PR: REQUEST_CHANGES is refused
        # PR number -> the files GitHub checks review anchors against, when a push landed between
        # the bot reading the diff and posting its review.
        self.moved_on: dict[int, list[dict[str, Any]]] = {}
        self.pulls: dict[int, PR] = {}
        self.reviews: list[dict[str, Any]] = []
        self.review_comments: list[dict[str, Any]] = []
        self.issue_comments: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.check_runs: list[dict[str, Any]] = []
        self.annotations: dict[int, list[dict[str, Any]]] = {}
        self.faults: list[Fault] = []
        self.log: list[Logged] = []
        self.errors: list[str] = []  # bugs in the fake itself, never GitHub behaviour
        self._ids = itertools.count(1000)
        self._clock = itertools.count(1)
        self._lock = threading.RLock()
        self.server = HTTPServer(host="127.0.0.1", threaded=True)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no access log in test output

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> FakeGitHub:
        self.server.expect_request(re.compile(".*")).respond_with_handler(self._handle)
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.clear()
        if self.server.is_running():
            self.server.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    # -- set-up helpers -----------------------------------------------------------------------------

    def add_pr(self, number: int, head_sha: str, files: list[dict[str, Any]], head_repo: str | None = None, head_ref: str = "feature") -> PR:
        pr = PR(number, head_sha, self.repo, head_repo if head_repo is not None else self.repo, head_ref, files=files)
        self.pulls[number] = pr
        return pr

    def fault(self, method: str, path: str, kind: str, **kw: Any) -> Fault:
        f = Fault(method, path, kind, **kw)
        self.faults.append(f)
        return f

    def requests(self, method: str | None = None, path: str | None = None) -> list[Logged]:
        return [r for r in self.log if (method is None or r.method == method) and (path is None or re.search(path, r.path))]

    # -- HTTP -------------------------------------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        body: Any = None
        if request.data:
            try:
                body = json.loads(request.data)
            except ValueError:
                body = request.data.decode(errors="replace")
        entry = Logged(request.method, request.path, request.query_string.decode(), {k: v for k, v in request.headers.items()}, body)
        with self._lock:
            self.log.append(entry)
        if self.validate is not None:  # a recording server: each request against GitHub's description
            self.violations.extend(self.validate(entry.method, entry.path, entry.query, entry.body))
        try:
            resp = self._dispatch(request, body, entry)
        except Exception as e:  # a bug in the fake: make it loud, not a retried 500
            self.errors.append(f"{request.method} {request.path}: {type(e).__name__}: {e}")
            resp = self._json({"message": f"fake error: {e}"}, 599)
        if entry.fault not in ("reset-before", "reset-after", "reset-mid-body"):
            entry.status = resp.status_code
        return resp

    def _json(self, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(data), status=status, headers=headers or {}, content_type="application/json; charset=utf-8")

    def _error(self, status: int, message: str, errors: list[Any] | None = None, headers: dict[str, str] | None = None) -> Response:
        data: dict[str, Any] = {"message": message, "documentation_url": "https://docs.github.com/rest"}
        if errors:
            data["errors"] = errors
        return self._json(data, status, headers)

    def _take_fault(self, method: str, path: str, raw: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and f.method in (method, "*") and re.search(f.path, path) and (f.body is None or re.search(f.body, raw)):
                    if f.skip > 0:
                        f.skip -= 1
                        continue
                    f.times -= 1
                    f.fired += 1
                    return f
        return None

    def _reset(self, request: Request) -> Response:
        reset_connection(request.environ["werkzeug.socket"])
        return Response(status=500)  # never reaches the client: werkzeug's write fails quietly

    def _cut(self, request: Request, resp: Response) -> Response:
        """``resp`` with its status and headers sent, then an RST halfway through its body."""
        data = resp.get_data()
        sock = request.environ["werkzeug.socket"]

        def body() -> Iterator[bytes]:
            yield data[: len(data) // 2]
            reset_connection(sock)

        # No Content-Length: werkzeug sends the body chunked, so the client learns it was cut
        # off from the connection, as with GitHub's chunked responses.
        return Response(body(), status=resp.status_code, content_type=resp.content_type)

    def _dispatch(self, request: Request, body: Any, entry: Logged) -> Response:
        auth = request.headers.get("Authorization", "")
        if auth not in (f"token {self.token}", f"Bearer {self.token}"):
            return self._error(401, "Bad credentials")
        method, path = request.method, request.path
        fault = self._take_fault(method, path, request.get_data(as_text=True))
        if fault is not None:
            entry.fault = fault.kind
            if fault.kind in ("500", "502", "503"):
                return self._error(int(fault.kind), "Server Error", headers={"Retry-After": fault.retry_after} if fault.retry_after else None)
            if fault.kind == "reset-before":
                return self._reset(request)
            if fault.kind == "422":
                return self._error(422, "Unprocessable Entity", ["Pull request review thread line must be part of the diff"])
            if fault.kind == "429":
                return self._error(429, "Too Many Requests", headers={"Retry-After": fault.retry_after or "1"})
            if fault.kind == "403-secondary":
                return self._error(403, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", headers={"Retry-After": fault.retry_after or "2"})
            if fault.kind == "slow-before":
                time.sleep(fault.seconds)
                return self._error(504, "Gateway Timeout")
        write = method in ("POST", "PATCH", "PUT", "DELETE")
        if write and self.read_only:
            return self._error(403, "Resource not accessible by integration")
        with self._lock:
            resp = self._route(request, method, path, body)
        if fault is not None and fault.kind == "500-after":
            return self._error(500, "Server Error")
        if fault is not None and fault.kind == "slow-after":
            time.sleep(fault.seconds)
        if fault is not None and fault.kind == "reset-after":
            return self._reset(request)
        if fault is not None and fault.kind == "reset-mid-body":
            return self._cut(request, resp)
        if fault is not None and fault.kind == "drop-field":
            data = json.loads(resp.get_data())
            if isinstance(data, dict):
                data.pop(fault.field, None)
            return self._json(data, resp.status_code)
        return resp

    def _page(self, request: Request, items: list[Any]) -> Response:
        per_page = min(int(request.args.get("per_page", 30)), self.per_page_cap)
        page = int(request.args.get("page", 1))
        chunk = items[(page - 1) * per_page : page * per_page]
        last = max(1, -(-len(items) // per_page))
        links = []
        base = f"{self.url}{request.path}"
        keep = [(k, v) for k, v in request.args.items(multi=True) if k not in ("page", "per_page")]

        def link(p: int, rel: str) -> str:
            q = "&".join([f"{k}={v}" for k, v in keep] + [f"per_page={per_page}", f"page={p}"])
            return f'<{base}?{q}>; rel="{rel}"'

        if page < last:
            links += [link(page + 1, "next"), link(last, "last")]
        if page > 1:
            links += [link(1, "first"), link(page - 1, "prev")]
        return self._json(chunk, 200, {"Link": ", ".join(links)} if links else None)

    def _user(self) -> dict[str, Any]:
        return {"login": BOT_LOGIN, "id": 41898282, "type": "Bot"}

    def _pr_json(self, pr: PR) -> dict[str, Any]:
        owner = (pr.head_repo or "ghost/deleted").split("/")[0]
        head_repo = {"full_name": pr.head_repo, "owner": {"login": owner}} if pr.head_repo else None
        return {
            "number": pr.number,
            "url": f"{self.url}/repos/{self.repo}/pulls/{pr.number}",
            "html_url": f"https://github.test/{self.repo}/pull/{pr.number}",
            "issue_url": f"{self.url}/repos/{self.repo}/issues/{pr.number}",
            "state": "open",
            "user": {"login": pr.author, "id": 7, "type": "User"},
            "head": {"sha": pr.head_sha, "ref": pr.head_ref, "label": f"{owner}:{pr.head_ref}", "repo": head_repo},
            "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": pr.base_repo}},
        }

    def _route(self, request: Request, method: str, path: str, body: Any) -> Response:
        prefix = f"/repos/{self.repo}"
        if not path.startswith(prefix + "/"):
            return self._error(404, "Not Found")
        rest = path[len(prefix):]
        m = re.fullmatch(r"/pulls/(\d+)", rest)
        if m and method == "GET":
            pr = self.pulls.get(int(m.group(1)))
            return self._json(self._pr_json(pr)) if pr else self._error(404, "Not Found")
        if rest == "/pulls" and method == "GET":
            head = request.args.get("head")
            prs = [p for p in self.pulls.values() if head is None or f"{(p.head_repo or '').split('/')[0]}:{p.head_ref}" == head]
            return self._page(request, [self._pr_json(p) for p in prs])
        m = re.fullmatch(r"/pulls/(\d+)/(files|comments|reviews)", rest)
        if m:
            pr = self.pulls.get(int(m.group(1)))
            if pr is None:
                return self._error(404, "Not Found")
            kind = m.group(2)
            if method == "GET":
                if kind == "files":
                    return self._page(request, pr.files[:3000])
                if kind == "comments":
                    return self._page(request, [c for c in self.review_comments if c["pr"] == pr.number])
                return self._page(request, [r for r in self.reviews if r["pr"] == pr.number])
            if method == "POST" and kind == "reviews":
                return self._create_review(pr, body)
        m = re.fullmatch(r"/pulls/comments/(\d+)", rest)
        if m and method == "PATCH":
            return self._edit(self.review_comments, int(m.group(1)), body)
        m = re.fullmatch(r"/pulls/(\d+)/reviews/(\d+)/dismissals", rest)
        if m and method == "PUT":
            r = next((r for r in self.reviews if r["id"] == int(m.group(2))), None)
            if r is None:
                return self._error(404, "Not Found")
            if r["state"] != "CHANGES_REQUESTED":
                return self._error(422, "Can not dismiss a commented pull request review")
            r["state"] = "DISMISSED"
            return self._json(r)
        m = re.fullmatch(r"/issues/(\d+)/comments", rest)
        if m:
            number = int(m.group(1))
            if method == "GET":
                return self._page(request, [c for c in self.issue_comments if c["issue"] == number])
            if method == "POST":
                if len(body.get("body", "")) > 65536:
                    return self._error(422, "Validation Failed", [{"resource": "IssueComment", "code": "custom", "field": "body", "message": "body is too long (maximum is 65536 characters)"}])
                c = {"id": next(self._ids), "issue": number, "body": body["body"], "user": self._user(), "created": next(self._clock)}
                c["html_url"] = f"https://github.test/{self.repo}/pull/{number}#issuecomment-{c['id']}"
                c["url"] = f"{self.url}{prefix}/issues/comments/{c['id']}"
                self.issue_comments.append(c)
                return self._json(c, 201)
        m = re.fullmatch(r"/issues/comments/(\d+)", rest)
        if m and method == "PATCH":
            return self._edit(self.issue_comments, int(m.group(1)), body)
        m = re.fullmatch(r"/statuses/([0-9a-f]{40})", rest)
        if m and method == "POST":
            if body.get("state") not in ("error", "failure", "pending", "success"):
                return self._error(422, "Validation Failed", [{"field": "state", "code": "invalid"}])
            if len(body.get("description") or "") > 140:
                return self._error(422, "Validation Failed", [{"field": "description", "code": "custom", "message": "description is too long (maximum is 140 characters)"}])
            s = {"id": next(self._ids), "sha": m.group(1), "state": body["state"], "description": body.get("description"), "context": body.get("context", "default"), "target_url": body.get("target_url"), "created": next(self._clock)}
            s["url"] = f"{self.url}{prefix}/statuses/{m.group(1)}"
            self.statuses.append(s)
            return self._json(s, 201)
        m = re.fullmatch(r"/commits/([0-9a-f]{40})/statuses", rest)
        if m and method == "GET":
            return self._page(request, [s for s in reversed(self.statuses) if s["sha"] == m.group(1)])
        if rest == "/check-runs" and method == "POST":
            return self._create_check(body)
        m = re.fullmatch(r"/check-runs/(\d+)", rest)
        if m and method == "PATCH":
            run = next((c for c in self.check_runs if c["id"] == int(m.group(1))), None)
            if run is None:
                return self._error(404, "Not Found")
            err = self._check_output(body.get("output") or {})
            if err:
                return err
            out = body.get("output") or {}
            self.annotations[run["id"]].extend(out.get("annotations") or [])
            run["output"].update({k: v for k, v in out.items() if k != "annotations"})
            run["output"]["annotations_count"] = len(self.annotations[run["id"]])
            return self._json(run)
        m = re.fullmatch(r"/check-runs/(\d+)/annotations", rest)
        if m and method == "GET":
            return self._page(request, self.annotations.get(int(m.group(1)), []))
        m = re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", rest)
        if m and method == "GET":
            runs = [c for c in self.check_runs if c["head_sha"] == m.group(1) and request.args.get("check_name") in (None, c["name"])]
            return self._json({"total_count": len(runs), "check_runs": runs})
        return self._error(404, "Not Found")

    def _edit(self, items: list[dict[str, Any]], cid: int, body: Any) -> Response:
        c = next((c for c in items if c["id"] == cid), None)
        if c is None:
            return self._error(404, "Not Found")
        if len(body.get("body", "")) > 65536:
            return self._error(422, "Validation Failed", [{"field": "body", "code": "custom", "message": "body is too long (maximum is 65536 characters)"}])
        c["body"] = body["body"]
        c["edits"] = c.get("edits", 0) + 1
        return self._json(c)

    def _create_review(self, pr: PR, body: dict[str, Any]) -> Response:
        event = body.get("event")
        if event not in (None, "APPROVE", "REQUEST_CHANGES", "COMMENT"):
            return self._error(422, "Validation Failed", [{"field": "event", "code": "invalid"}])
        if event in ("REQUEST_CHANGES", "COMMENT") and not body.get("body"):
            return self._error(422, "Unprocessable Entity", ["Review body is required"])
        if event == "REQUEST_CHANGES" and self.own_pr:
            return self._error(422, "Unprocessable Entity", ["Can not request changes on your own pull request"])
        if len(body.get("body") or "") > 65536:
            return self._error(422, "Unprocessable Entity", ["Body is too long (maximum is 65536 characters)"])
        comments = body.get("comments") or []
        files = {f["filename"]: f for f in self.moved_on.get(pr.number, pr.files)}
        for c in comments:
            f = files.get(c.get("path"))
            side = c.get("side", "RIGHT")
            lines = commentable_lines(f.get("patch")) if f is not None and side == "RIGHT" else deleted_lines(f.get("patch")) if f is not None and side == "LEFT" else set()
            if not isinstance(c.get("line"), int) or c["line"] not in lines:
                return self._error(422, "Unprocessable Entity", ["Pull request review thread line must be part of the diff"])
            if len(c.get("body") or "") > 65536:
                return self._error(422, "Unprocessable Entity", ["Body is too long (maximum is 65536 characters)"])
        rid = next(self._ids)
        state = {"REQUEST_CHANGES": "CHANGES_REQUESTED", "COMMENT": "COMMENTED", "APPROVE": "APPROVED"}.get(event or "", "PENDING")
        review = {"id": rid, "pr": pr.number, "body": body.get("body", ""), "state": state, "commit_id": body.get("commit_id") or pr.head_sha, "user": self._user(),
                  "html_url": f"https://github.test/{self.repo}/pull/{pr.number}#pullrequestreview-{rid}", "pull_request_url": f"{self.url}/repos/{self.repo}/pulls/{pr.number}"}
        self.reviews.append(review)
        for c in comments:
            cid = next(self._ids)
            self.review_comments.append({"id": cid, "pr": pr.number, "pull_request_review_id": rid, "path": c["path"], "line": c["line"], "side": c.get("side", "RIGHT"), "body": c["body"],
                                         "commit_id": review["commit_id"], "user": self._user(), "url": f"{self.url}/repos/{self.repo}/pulls/comments/{cid}",
                                         "html_url": f"https://github.test/{self.repo}/pull/{pr.number}#discussion_r{cid}"})
        return self._json(review)

    def _check_output(self, out: dict[str, Any]) -> Response | None:
        for k in ("summary", "text"):
            if len(out.get(k) or "") > 65535:
                return self._error(422, "Invalid request.", [f"output.{k} is too long (maximum is 65535 characters)"])
        if len(out.get("annotations") or []) > 50:
            return self._error(422, "Invalid request.", ["Only 50 annotations are allowed per request"])
        return None

    def _create_check(self, body: dict[str, Any]) -> Response:
        if not body.get("name") or not re.fullmatch(r"[0-9a-f]{40}", body.get("head_sha", "")):
            return self._error(422, "Invalid request.", ["name and head_sha are required"])
        if body.get("status") == "completed" and body.get("conclusion") not in ("success", "failure", "neutral", "cancelled", "skipped", "timed_out", "action_required"):
            return self._error(422, "Invalid request.", ["conclusion is required when status is completed"])
        out = body.get("output") or {}
        err = self._check_output(out)
        if err:
            return err
        cid = next(self._ids)
        run = {"id": cid, "name": body["name"], "head_sha": body["head_sha"], "status": body.get("status"), "conclusion": body.get("conclusion"), "external_id": body.get("external_id"), "details_url": body.get("details_url"),
               "output": {k: v for k, v in out.items() if k != "annotations"}, "url": f"{self.url}/repos/{self.repo}/check-runs/{cid}", "html_url": f"https://github.test/{self.repo}/runs/{cid}"}
        self.check_runs.append(run)
        self.annotations[cid] = list(out.get("annotations") or [])
        run["output"]["annotations_count"] = len(self.annotations[cid])
        return self._json(run, 201)
