"""Scenarios of the bot against the fake GitHub, shared by the behaviour and the contract tests.

Each scenario drives ``shardproof.bot.app.Bot`` exactly as the action does (event file, settings,
runner seam), over real HTTP, and returns what it observed. The contract test replays every
request these scenarios made against Prism serving GitHub's REST description.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bot_support as bs
from fake_github import FakeGitHub

from shardproof.bot.actions import Console
from shardproof.bot.app import Bot, Settings
from shardproof.bot.github_api import RetryPolicy
from shardproof.bot.secrets import Redactor

HEAD = "1" * 40
HEAD2 = "2" * 40
MODELS_PY = "tests/pairs/models.py"


def patch_adding(path: str, line: int, context: int = 3) -> str:
    """A hunk in which ``line`` of the (head) file is added, with context around it."""
    lines = (bs.ROOT / path).read_text().splitlines()
    start, end = max(1, line - context), min(len(lines), line + context)
    out = [f"@@ -{start},{end - start} +{start},{end - start + 1} @@ def something():"]
    for n in range(start, end + 1):
        out.append(("+" if n == line else " ") + lines[n - 1])
    return "\n".join(out)


def pr_event(number: int = 7, head: str = HEAD, repo: str = "acme/models", head_repo: str | None = None, name: str = "pull_request") -> dict[str, Any]:
    head_repo = head_repo or repo
    return {
        "action": "synchronize",
        "number": number,
        "pull_request": {"number": number, "head": {"sha": head, "ref": "feature", "repo": {"full_name": head_repo}}, "base": {"sha": "b" * 40, "ref": "main", "repo": {"full_name": repo}}},
        "repository": {"full_name": repo},
    }


class DocRunner:
    """The runner seam, answering with a prepared result document (or raising)."""

    def __init__(self, doc: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
        self.doc, self.error, self.calls = doc, error, 0

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.doc is not None
        return json.loads(json.dumps(self.doc))


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    sleeps: list[float]
    settings: Settings
    files: dict[str, str] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, str]:
        text = Path(self.settings.output_file or "").read_text() if self.settings.output_file else ""
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def run_bot(fake: FakeGitHub, tmp: Path, doc: dict[str, Any] | None = None, event: dict[str, Any] | None = None, event_name: str = "pull_request", runner: Any = None, token: str | None = "fake", **overrides: Any) -> Outcome:
    tmp.mkdir(parents=True, exist_ok=True)
    ev = tmp / "event.json"
    ev.write_text(json.dumps(event if event is not None else pr_event()))
    sleeps: list[float] = []
    s = Settings(
        event_path=ev,
        event_name=event_name,
        repo=fake.repo,
        token=fake.token if token == "fake" else token,
        api_url=fake.url,
        server_url="https://github.test",
        run_url="https://github.test/acme/models/actions/runs/42",
        out=tmp / "shardproof-report",
        timeout=1,
        write_interval=0,
        workspace=str(bs.ROOT),
        output_file=str(tmp / "github_output"),
        step_summary_file=str(tmp / "step_summary.md"),
    )
    for k, v in overrides.items():
        setattr(s, k, v)
    out, err = io.StringIO(), io.StringIO()
    retry = RetryPolicy(attempts=5, base=0.01, cap=0.05, sleep=sleeps.append, jitter=lambda: 0.0)
    bot = Bot(s, runner or DocRunner(doc), Console(Redactor(), out, err), retry)
    code = bot.run()
    files = {p.name: p.read_text() for p in s.out.glob("*") if p.is_file()} if s.out.exists() else {}
    return Outcome(code, out.getvalue(), err.getvalue(), sleeps, s, files)


# ---------------------------------------------------------------------------------------------
# Scenarios: each sets up the fake, runs the bot (maybe twice) and returns the outcomes.

Scenario = Callable[[FakeGitHub, Path], list[Outcome]]


def bug_on_changed_line(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, HEAD, [
        {"filename": path, "status": "modified", "patch": patch_adding(path, line)},
        {"filename": "README.md", "status": "modified", "patch": "@@ -1,1 +1,2 @@\n # x\n+more"},
        {"filename": "models/attention.py", "previous_filename": "models/attn.py", "status": "renamed"},  # no patch
        {"filename": "weights/old.bin", "status": "removed"},
    ])  # fmt: skip
    doc = bs.run_doc(bs.model("mlp_tp4"), bs.model("bug_missing_allreduce"))
    return [run_bot(fake, tmp, doc)]


def out_of_diff(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    fake.add_pr(7, HEAD, [{"filename": "README.md", "status": "modified", "patch": "@@ -1,1 +1,2 @@\n # x\n+more"}])
    doc = bs.run_doc(bs.model("bug_wrong_groups"))
    return [run_bot(fake, tmp, doc)]


def rerun(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    path2, line2 = bs.bug_site("bug_wrong_groups")
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    doc = bs.run_doc(bs.model("bug_missing_allreduce"), bs.model("bug_wrong_groups"))
    assert (path2, line2) != (path, line)
    return [run_bot(fake, tmp / "a", doc), run_bot(fake, tmp / "b", doc)]


def renamed(name: str, new: str) -> dict[str, Any]:
    m = bs.model(name)
    m["name"] = new
    return m


def fixed(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    first = run_bot(fake, tmp / "a", bs.run_doc(renamed("bug_missing_allreduce", "mlp"), bs.model("attention_tp4")))
    # The author pushes the fix: a new head, the line now context-free, the model verified.
    fake.pulls[7].head_sha = HEAD2
    fake.pulls[7].files = [{"filename": path, "status": "modified", "patch": patch_adding(path, line - 1)}]
    second = run_bot(fake, tmp / "b", bs.run_doc(renamed("mlp_tp4", "mlp"), bs.model("attention_tp4")), event=pr_event(head=HEAD2))
    return [first, second]


def turned_unproven(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    """A divergence that the next push turns into a rule gap (the model is unproven: the rules
    stop at the same place, the witness finds the programs equal): no longer a change request."""
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    first = run_bot(fake, tmp / "a", bs.run_doc(renamed("bug_missing_allreduce", "mlp"), bs.model("attention_tp4")))
    gap = renamed("bug_missing_allreduce", "mlp")
    gap["status"] = gap["result"]["verdict"] = "unproven"
    for d in gap["result"]["divergences"]:
        d["kind"] = "rule-gap"
    gap["result"]["witness"] = {"status": "equal", "trials": 3, "seeds": [0, 1, 2]}
    fake.pulls[7].head_sha = HEAD2
    second = run_bot(fake, tmp / "b", bs.run_doc(gap, bs.model("attention_tp4")), event=pr_event(head=HEAD2))
    return [first, second]


def fork(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.read_only = True
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}], head_repo="outsider/models")
    doc = bs.run_doc(bs.model("bug_missing_allreduce"))
    return [run_bot(fake, tmp, doc, event=pr_event(head_repo="outsider/models"))]


def faults(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    fake.fault("GET", r"/pulls/7/files", "502")
    fake.fault("GET", r"/pulls/7/comments", "429", retry_after="1")
    fake.fault("POST", r"/pulls/7/reviews", "slow-after")  # applied, but the client timed out
    fake.fault("POST", r"/issues/7/comments", "500-after")  # applied, then a 500
    fake.fault("POST", r"/statuses/", "403-secondary", retry_after="2")
    fake.fault("POST", r"/check-runs$", "500")  # not applied
    fake.fault("POST", r"/statuses/", "500-after", times=1)
    doc = bs.run_doc(bs.model("bug_missing_allreduce"), bs.model("bug_wrong_groups"))
    return [run_bot(fake, tmp, doc)]


def refused_anchor(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    """GitHub refuses the review's anchors (say the diff changed under us): body fallback."""
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    fake.moved_on[7] = [{"filename": path, "status": "modified", "patch": patch_adding(path, line + 20)}]
    return [run_bot(fake, tmp, bs.run_doc(bs.model("bug_missing_allreduce")))]


def own_pr(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.own_pr = True
    fake.add_pr(7, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    return [run_bot(fake, tmp, bs.run_doc(bs.model("bug_missing_allreduce")))]


def build_crash(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    fake.add_pr(7, HEAD, [{"filename": "README.md", "status": "modified", "patch": "@@ -1 +1 @@\n-a\n+b"}])
    secret = fake.token
    crash = DocRunner(error=RuntimeError(f"worker died: env dump GITHUB_TOKEN={secret} ghp_{'x' * 36}"))
    a = run_bot(fake, tmp / "a", runner=crash)
    failed = bs.run_doc(bs.model("mlp_tp4"), bs.build_failed("llama", f"ImportError: no module named flash_attn (token {secret})"))
    b = run_bot(fake, tmp / "b", failed)
    return [a, b]


def push(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    event = {"ref": "refs/heads/main", "before": "a" * 40, "after": HEAD, "repository": {"full_name": fake.repo}}
    return [run_bot(fake, tmp, bs.run_doc(bs.model("bug_missing_allreduce")), event=event, event_name="push")]


def workflow_run(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    """The fork-safe split: an unprivileged run saved result.json and its event; this one posts."""
    path, line = bs.bug_site("bug_missing_allreduce")
    fake.add_pr(9, HEAD, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}], head_repo="outsider/models", head_ref="fix-mlp")
    event = {"action": "completed", "workflow_run": {"head_sha": HEAD, "head_branch": "fix-mlp", "pull_requests": [], "head_repository": {"full_name": "outsider/models", "owner": {"login": "outsider"}}}, "repository": {"full_name": fake.repo}}
    result = tmp / "artifact" / "result.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps(bs.run_doc(bs.model("bug_missing_allreduce"))))
    saved = tmp / "artifact" / "event.json"
    saved.write_text(json.dumps(pr_event(number=9, head_repo="outsider/models")))
    from shardproof.bot.runner import ResultFileRunner

    by_number = run_bot(fake, tmp / "a", event=event, event_name="workflow_run", runner=ResultFileRunner(result), result=result, pr_event_path=saved)
    by_branch = run_bot(fake, tmp / "b", event=event, event_name="workflow_run", runner=ResultFileRunner(result), result=result)
    # A forged artifact naming another pull request (whose head is a different commit).
    fake.add_pr(3, "3" * 40, [{"filename": path, "status": "modified", "patch": patch_adding(path, line)}])
    saved.write_text(json.dumps(pr_event(number=3)))
    forged = run_bot(fake, tmp / "c", event=event, event_name="workflow_run", runner=ResultFileRunner(result), result=result, pr_event_path=saved)
    return [by_number, by_branch, forged]


def many(fake: FakeGitHub, tmp: Path) -> list[Outcome]:
    """45 findings on changed lines (cap 30 inline), 130 changed files (two pages), 120 annotations."""
    body = "\n".join(f"+line {n}" for n in range(1, 61))
    files = [{"filename": "src/model.py", "status": "added", "patch": f"@@ -0,0 +1,60 @@\n{body}"}]
    files += [{"filename": f"docs/page{n}.md", "status": "modified", "patch": "@@ -1 +1 @@\n-a\n+b"} for n in range(129)]
    fake.add_pr(7, HEAD, files)
    base = bs.model("bug_missing_allreduce")
    d0 = base["result"]["divergences"][0]
    divs = [dict(d0, instruction=f"%add.{n}", source={"file": "src/model.py", "line": n + 1, "function": f"block{n}"}) for n in range(45)]
    divs += [dict(d0, instruction=f"%mul.{n}", source={"file": "src/other.py", "line": n + 1, "function": f"f{n}"}) for n in range(75)]
    base["result"]["divergences"] = divs
    base["artifacts"] = {}
    base["name"] = "big"
    return [run_bot(fake, tmp, bs.run_doc(base), filter_mode="nofilter")]


SCENARIOS: dict[str, Scenario] = {
    "bug_on_changed_line": bug_on_changed_line,
    "out_of_diff": out_of_diff,
    "rerun": rerun,
    "fixed": fixed,
    "turned_unproven": turned_unproven,
    "fork": fork,
    "faults": faults,
    "refused_anchor": refused_anchor,
    "own_pr": own_pr,
    "build_crash": build_crash,
    "push": push,
    "workflow_run": workflow_run,
    "many": many,
}
