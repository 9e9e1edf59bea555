"""What to report on, read from the GitHub Actions event.

In ``pull_request`` runs ``GITHUB_SHA`` is a merge commit GitHub made; reviews, statuses and
check runs must name the pull request's head commit, which the event carries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardproof.engine.errors import InputError

PR_EVENTS = ("pull_request", "pull_request_target")
EVENTS = (*PR_EVENTS, "workflow_run", "push")
ZERO_SHA = "0" * 40


@dataclass
class Target:
    event_name: str
    repo: str  # owner/name receiving the review and status (the base repository)
    sha: str  # commit reported on: the PR head, or the pushed commit
    pr: int | None = None
    head_repo: str | None = None
    head_ref: str | None = None  # "owner:branch", to find a fork's pull request
    fork: bool = False
    may_run_models: bool = True  # False where the pull request's code must not run (write token)
    note: str = ""

    @property
    def is_pr(self) -> bool:
        return self.event_name != "push"


def load_event(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise InputError(str(path), "", f"cannot read the event file: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise InputError(str(path), f"{e.lineno}:{e.colno}", f"the event file is not JSON: {e.msg}") from e
    if not isinstance(data, dict):
        raise InputError(str(path), "", "the event file must hold a JSON object")
    return data


def guess_name(payload: dict[str, Any]) -> str:
    if "pull_request" in payload:
        return "pull_request"
    if "workflow_run" in payload:
        return "workflow_run"
    if "after" in payload and "ref" in payload:
        return "push"
    raise InputError("event", "", "cannot tell the event kind; pass --event-name")


def _repo_name(obj: Any) -> str | None:
    return str(obj["full_name"]) if isinstance(obj, dict) and obj.get("full_name") else None


def read_target(name: str, payload: dict[str, Any], repo_env: str | None = None, sha_env: str | None = None, pr_event: dict[str, Any] | None = None) -> Target:
    """The repository, commit and pull request to report on.

    ``pr_event`` is, for ``workflow_run``, the ``pull_request`` event the untrusted workflow saved
    as an artifact: only its number is used, and the caller checks that the pull request's head
    really is the commit the trusted ``workflow_run`` payload names.
    """
    if name not in EVENTS:
        raise InputError("event", "", f"unsupported event {name!r}: shardproof reports on {', '.join(EVENTS)}")
    repo = _repo_name(payload.get("repository")) or repo_env
    if name in PR_EVENTS:
        pr = payload.get("pull_request")
        if not isinstance(pr, dict):
            raise InputError("event", "pull_request", f"a {name} event without its pull_request object")
        try:
            sha = str(pr["head"]["sha"])
            number = int(pr.get("number") or payload["number"])
        except (KeyError, TypeError, ValueError) as e:
            raise InputError("event", "pull_request.head.sha", f"missing {e}") from e
        repo = repo or _repo_name((pr.get("base") or {}).get("repo"))
        head_repo = _repo_name((pr.get("head") or {}).get("repo"))
        # A deleted fork leaves head.repo null: still a fork.
        fork = head_repo != repo
        t = Target(name, _need(repo), sha, number, head_repo, None, fork)
        if name == "pull_request_target" and fork:
            # The token can write here: running the fork's code with it is a "pwn request".
            t.may_run_models = False
            t.note = "pull_request_target on a fork: the models are not run with a write token; pass --result from a pull_request run"
        return t
    if name == "push":
        sha = str(payload.get("after") or sha_env or "")
        if not sha:
            raise InputError("event", "after", "a push event without the pushed commit")
        return Target(name, _need(repo), sha)
    wr = payload.get("workflow_run")
    if not isinstance(wr, dict) or not wr.get("head_sha"):
        raise InputError("event", "workflow_run.head_sha", "a workflow_run event without its head commit")
    head_repo = _repo_name(wr.get("head_repository"))
    owner = ((wr.get("head_repository") or {}).get("owner") or {}).get("login")
    head_ref = f"{owner}:{wr.get('head_branch')}" if owner and wr.get("head_branch") else None
    number: int | None = None
    note = ""
    if pr_event is not None:
        try:
            number = int((pr_event.get("pull_request") or {}).get("number") or pr_event["number"])
            note = "pull request number from the saved pull_request event"
        except (KeyError, TypeError, ValueError):
            number = None
    if number is None:
        prs = wr.get("pull_requests") or []  # empty for fork pull requests
        if prs and isinstance(prs[0], dict) and prs[0].get("number"):
            number = int(prs[0]["number"])
            note = "pull request number from workflow_run.pull_requests"
    t = Target(name, _need(repo), str(wr["head_sha"]), number, head_repo, head_ref, head_repo != repo, may_run_models=False, note=note)
    return t


def _need(repo: str | None) -> str:
    if not repo:
        raise InputError("event", "repository.full_name", "cannot tell the repository; set GITHUB_REPOSITORY or pass --repo")
    return repo
