"""Contract: every request the bot makes in the behaviour scenarios is accepted by Prism serving
GitHub's official REST description (npm ``@octokit/openapi``), and the bot copes with the
responses GitHub documents.

Prism and the description are installed by ``make install`` under ``.tools/``; without them this
module fails (it never skips). Prism takes ~40 s to load the 13 MB description, so it starts
once per module, in the background, while the scenarios run against the stateful fake.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bot_scenarios as sc
import bot_support as bs
import pytest
from fake_github import FakeGitHub, Logged

ROOT = Path(__file__).resolve().parent.parent
PRISM = ROOT / ".tools" / "node_modules" / ".bin" / "prism"
SPEC = ROOT / ".tools" / "node_modules" / "@octokit" / "openapi" / "generated" / "api.github.com.json"
READY_SECONDS = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec_for(url: str, out: Path) -> Path:
    """GitHub's description with its server URL pointing at Prism (PyGithub refuses URLs of
    another host) and without Link headers (Prism would invent pagination links)."""
    spec = json.loads(SPEC.read_text().replace("https://api.github.com", url))
    for item in spec["paths"].values():
        for op in item.values():
            if isinstance(op, dict):
                for resp in op.get("responses", {}).values():
                    if isinstance(resp, dict):
                        resp.get("headers", {}).pop("Link", None)
    for resp in spec.get("components", {}).get("responses", {}).values():
        resp.get("headers", {}).pop("Link", None)
    out.write_text(json.dumps(spec))
    return out


@dataclass
class Prism:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prism, dict[str, list[Logged]]]]:
    if not PRISM.exists() or not SPEC.exists():
        pytest.fail("Prism or GitHub's REST description is missing: run `make install` (npm install --prefix .tools @stoplight/prism-cli@5 @octokit/openapi)")
    tmp = tmp_path_factory.mktemp("prism")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "prism.log"
    with log.open("wb") as f:
        proc = subprocess.Popen([str(PRISM), "mock", str(_spec_for(url, tmp / "spec.json")), "-h", "127.0.0.1", "-p", str(port)], stdout=f, stderr=subprocess.STDOUT)
    try:
        logs: dict[str, list[Logged]] = {}
        for name, scenario in sc.SCENARIOS.items():  # while Prism loads
            fake = FakeGitHub().start()
            try:
                scenario(fake, tmp / name)
            finally:
                fake.stop()
            logs[name] = fake.log
        deadline = time.monotonic() + READY_SECONDS
        while "Prism is listening" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prism did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield Prism(url, proc, log), logs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _send(prism: Prism, r: Logged) -> tuple[int, list[dict]]:
    headers = {k: v for k, v in r.headers.items() if k.lower() in ("authorization", "accept", "content-type", "user-agent")}
    data = json.dumps(r.body).encode() if r.body is not None else None
    req = urllib.request.Request(f"{prism.url}{r.path}" + (f"?{r.query}" if r.query else ""), data=data, method=r.method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.headers.get("sl-violations")
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.headers.get("sl-violations")
    violations = [v for v in json.loads(raw or "[]") if v.get("location", [""])[0] == "request" and v.get("severity") == "Error"]
    return status, violations


@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_every_request_is_valid_against_githubs_description(recorded: tuple[Prism, dict[str, list[Logged]]], name: str) -> None:
    prism, logs = recorded
    requests = logs[name]
    assert requests, f"{name} made no requests"
    seen: set[str] = set()
    rejected = []
    for r in requests:
        key = json.dumps([r.method, r.path, r.query, r.body], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        status, violations = _send(prism, r)
        if status in (400, 404, 405, 415, 422) or violations:
            rejected.append(f"{r.method} {r.path}?{r.query} -> {status} {violations}")
    assert rejected == [], "\n".join(rejected)


def test_the_scenarios_cover_every_endpoint_the_bot_uses(recorded: tuple[Prism, dict[str, list[Logged]]]) -> None:
    _, logs = recorded
    used = {(r.method, re.sub(r"/\d+(?=/|$)", "/{n}", re.sub(r"[0-9a-f]{40}", "{sha}", r.path))) for rs in logs.values() for r in rs}
    want = {
        ("GET", "/repos/acme/models/pulls/{n}"), ("GET", "/repos/acme/models/pulls"),
        ("GET", "/repos/acme/models/pulls/{n}/files"), ("GET", "/repos/acme/models/pulls/{n}/comments"),
        ("GET", "/repos/acme/models/pulls/{n}/reviews"), ("POST", "/repos/acme/models/pulls/{n}/reviews"),
        ("PATCH", "/repos/acme/models/pulls/comments/{n}"), ("PUT", "/repos/acme/models/pulls/{n}/reviews/{n}/dismissals"),
        ("GET", "/repos/acme/models/issues/{n}/comments"), ("POST", "/repos/acme/models/issues/{n}/comments"),
        ("PATCH", "/repos/acme/models/issues/comments/{n}"), ("POST", "/repos/acme/models/statuses/{sha}"),
        ("GET", "/repos/acme/models/commits/{sha}/statuses"), ("POST", "/repos/acme/models/check-runs"),
        ("PATCH", "/repos/acme/models/check-runs/{n}"), ("GET", "/repos/acme/models/commits/{sha}/check-runs"),
    }  # fmt: skip
    assert want <= used, want - used


def test_the_bot_copes_with_githubs_documented_responses(recorded: tuple[Prism, dict[str, list[Logged]]], tmp_path: Path) -> None:
    """The whole flow against Prism itself: PyGithub parses GitHub's own response examples."""
    prism, _ = recorded
    fake = FakeGitHub()  # only for its settings; the API is Prism
    with urllib.request.urlopen(f"{prism.url}/repos/octocat/Hello-World/pulls/1", timeout=30) as resp:
        head = json.load(resp)["head"]["sha"]  # the documented example's head commit
    doc = bs.run_doc(bs.model("bug_missing_allreduce"))
    o = sc.run_bot(fake, tmp_path, doc, event=sc.pr_event(number=1, head=head, repo="octocat/Hello-World"), api_url=prism.url, repo="octocat/Hello-World")
    assert o.code == 1, o.out + o.err
    assert "could not" not in o.out, o.out
    assert "review posted" in o.err and "commit status 'shardproof': failure" in o.err


def test_prism_does_reject_bad_requests(recorded: tuple[Prism, dict[str, list[Logged]]]) -> None:
    """The control: the check above would notice a malformed review or status."""
    prism, _ = recorded
    auth = {"Authorization": "token x", "Content-Type": "application/json"}
    bad_review = Logged("POST", "/repos/o/r/pulls/1/reviews", "", auth, {"event": "REJECT", "comments": [{"path": "a.py", "line": "12", "body": "x"}]})
    bad_status = Logged("POST", f"/repos/o/r/statuses/{'a' * 40}", "", auth, {"state": "passed", "context": "shardproof"})
    for r in (bad_review, bad_status):
        status, _ = _send(prism, r)
        assert status == 422, (r.path, status)
