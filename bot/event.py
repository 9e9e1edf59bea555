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
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(str(path), "", f"cannot read the event file: {e.strerror}") from e
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputError(str(path), str(line), f"the event file is not UTF-8 (byte 0x{raw[e.start]:02x})") from e
    except json.JSONDecodeError as e:
        raise InputError(str(path), f"{e.lineno}:{e.colno}", f"the event file is not JSON: {e.msg}") from e
    except RecursionError as e:
        raise InputError(str(path), "", "the event file is not usable JSON: nested too deeply") from e
    except ValueError as e:  # an integer beyond Python's digit limit for int()
        raise InputError(str(path), "", f"the event file is not usable JSON: {str(e).split(':')[0]}") from e
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
    name = obj.get("full_name") if isinstance(obj, dict) else None
    return name if isinstance(name, str) and name else None


def _obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one: a field of the wrong type is as good
    as missing (the event is GitHub's, but a hand-written or saved one may be anything)."""
    return value if isinstance(value, dict) else {}


def _sha(value: Any, field: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError("event", field, f"{what}: expected a commit SHA, got {json.dumps(value)[:60]}")
    return value


def _number(value: Any, field: str) -> int:
    """A pull request number: a positive integer (7, 7.0 and "7" all say 7)."""
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        number = int(value)
    except (TypeError, ValueError, OverflowError) as e:  # OverflowError: 1e999 is inf
        raise InputError("event", field, f"expected a pull request number, got {json.dumps(value)[:60]}") from e
    if number < 1:
        raise InputError("event", field, f"expected a pull request number, got {number}")
    return number


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
        head = _obj(pr.get("head"))
        sha = _sha(head.get("sha"), "pull_request.head.sha", f"a {name} event without its head commit")
        number = _number(pr.get("number") or payload.get("number"), "pull_request.number")
        repo = repo or _repo_name(_obj(pr.get("base")).get("repo"))
        head_repo = _repo_name(head.get("repo"))
        # A deleted fork leaves head.repo null: still a fork.
        fork = head_repo != repo
        t = Target(name, _need(repo), sha, number, head_repo, None, fork)
        if name == "pull_request_target" and fork:
            # The token can write here: running the fork's code with it is a "pwn request".
            t.may_run_models = False
            t.note = "pull_request_target on a fork: the models are not run with a write token; pass --result from a pull_request run"
        return t
    if name == "push":
        sha = _sha(payload.get("after") or sha_env, "after", "a push event without the pushed commit")
        return Target(name, _need(repo), sha)
    wr = payload.get("workflow_run")
    if not isinstance(wr, dict):
        raise InputError("event", "workflow_run", "a workflow_run event without its workflow_run object")
    sha = _sha(wr.get("head_sha"), "workflow_run.head_sha", "a workflow_run event without its head commit")
    head_repository = _obj(wr.get("head_repository"))
    head_repo = _repo_name(head_repository)
    owner, branch = _obj(head_repository.get("owner")).get("login"), wr.get("head_branch")
    head_ref = f"{owner}:{branch}" if isinstance(owner, str) and owner and isinstance(branch, str) and branch else None
    number: int | None = None
    note = ""
    if pr_event is not None:
        try:
            number = _number(_obj(pr_event.get("pull_request")).get("number") or pr_event.get("number"), "number")
            note = "pull request number from the saved pull_request event"
        except InputError:  # an unusable artifact: find the pull request the other ways
            number = None
    if number is None:
        prs = wr.get("pull_requests")  # empty for fork pull requests
        first = _obj(prs[0]) if isinstance(prs, list) and prs else {}
        if first.get("number"):
            number = _number(first["number"], "workflow_run.pull_requests[0].number")
            note = "pull request number from workflow_run.pull_requests"
    t = Target(name, _need(repo), sha, number, head_repo, head_ref, head_repo != repo, may_run_models=False, note=note)
    return t


def _need(repo: str | None) -> str:
    if not repo:
        raise InputError("event", "repository.full_name", "cannot tell the repository; set GITHUB_REPOSITORY or pass --repo")
    return repo
