"""``shardproof github``: run the models, then report on the pull request — parse, filter, report.

Order of a run, and why:

1. read the event (the PR's head commit, never the merge commit);
2. set the commit status to ``pending`` — it is also the probe for a read-only token;
3. run the models through the runner seam (or read a result file);
4. write ``shardproof-report/`` (result.json, report.sarif, trace.html, review.md, summary.md);
5. on a pull request: read the changed files and the bot's earlier comments, place each finding,
   post one review with what is new, mark vanished findings resolved, update the sticky summary;
6. create the check run, then the final commit status — always, in a ``finally``;
7. step outputs and the job summary; exit with the gate's verdict.

With ``shard: k/n`` the run stops after step 4: it builds and verifies its part of the models,
writes the partial result and never talks to GitHub. ``mode: merge`` reads the partial results
instead of running models (step 3) and reports on them as one run (``shards.py``).
"""

from __future__ import annotations

import json
import re
import traceback
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardproof.engine.errors import InputError

from . import render
from .actions import Console, append_step_summary, write_file, write_outputs
from .diff import FILTER_MODES, DiffIndex
from .event import Target, guess_name, load_event, read_target
from .findings import (
    BLOCKING,
    FAIL_ON,
    Finding,
    Placement,
    Run,
    collect,
    gate,
    load_run,
    move_all_to_body,
    place,
)
from .github_api import Api, GitHubError, PermissionDenied, RetryPolicy, Unprocessable
from .portable import portable_doc
from .runner import Runner, RunnerError
from .secrets import Redactor, guard_loggers
from .shards import make_partial, parse_shard, pick

REVIEW_EVENTS = ("REQUEST_CHANGES", "COMMENT")
MODES = ("check", "merge")
SANDBOX_MODES = ("auto", "docker", "subprocess")
ANNOTATIONS_PER_REQUEST = 50
MAX_ANNOTATIONS = 1000
MAX_PR_FILES = 3000  # GitHub lists at most this many files of a pull request
EXIT_BAD_INPUT = 3
EXIT_ERROR = 4  # the bot stopped, or the verdict could not be recorded on GitHub
DECIDED = ("verified", "diverged", "rank-specific", "unproven")  # models whose absence of a finding means it is resolved

_FINDING = re.compile(r"<!-- shardproof:finding fp=([0-9a-f,]*) models=(\S*) -->")
_REVIEW = re.compile(r"<!-- shardproof:review nonce=(\w+) fps=([0-9a-f,]*) -->")
_CONTEXT = re.compile(r"^[\w./ -]{1,100}$")


@dataclass
class Settings:
    event_path: Path | None = None
    event_name: str | None = None
    pr_event_path: Path | None = None
    repo: str | None = None
    sha: str | None = None  # GITHUB_SHA, for push events without "after"
    token: str | None = None
    api_url: str = "https://api.github.com"
    server_url: str = "https://github.com"
    run_url: str | None = None
    config: Path = Path(".shardproof.yml")
    models: list[str] | None = None
    result: Path | None = None
    out: Path = Path("shardproof-report")
    filter_mode: str = "added"
    review_event: str = "REQUEST_CHANGES"
    fail_on: str = "diverged"
    max_comments: int = 30
    context: str = "shardproof"
    timeout: float = 30.0
    write_interval: float = 1.0
    workspace: str | None = None
    output_file: str | None = None
    step_summary_file: str | None = None
    extra_secrets: list[str] = field(default_factory=list)
    mode: str = "check"
    shard: str | None = None  # "k/n": verify that part of the models, write a partial result
    partials: Path = Path("shardproof-partials")  # merge: where the shards' results were downloaded
    sandbox: str = "auto"
    sandbox_image: str | None = None
    sandbox_cpus: float | None = None

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InputError("settings", "mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        if self.shard is not None:
            try:
                parse_shard(self.shard)
            except ValueError as e:
                raise InputError("settings", "shard", str(e)) from e
            if self.mode == "merge":
                raise InputError("settings", "shard", "a merge job combines every shard: give it no shard")
        if self.sandbox not in SANDBOX_MODES:
            raise InputError("settings", "sandbox", f"{self.sandbox!r} is not one of {', '.join(SANDBOX_MODES)}")
        if self.sandbox_cpus is not None and not self.sandbox_cpus > 0:
            raise InputError("settings", "sandbox-cpus", "must be a number > 0")
        if self.filter_mode not in FILTER_MODES:
            raise InputError("settings", "filter-mode", f"{self.filter_mode!r} is not one of {', '.join(FILTER_MODES)}")
        if self.review_event not in REVIEW_EVENTS:
            raise InputError("settings", "review-event", f"{self.review_event!r} is not one of {', '.join(REVIEW_EVENTS)}")
        if self.fail_on not in FAIL_ON:
            raise InputError("settings", "fail-on", f"{self.fail_on!r} is not one of {', '.join(FAIL_ON)}")
        if not 0 <= self.max_comments <= 100:
            raise InputError("settings", "max-comments", "must be between 0 and 100 (GitHub flags reviews with many comments as abuse)")
        if not _CONTEXT.match(self.context):
            raise InputError("settings", "context", "letters, digits, '.', '/', '-', '_' and spaces only")


@dataclass
class Existing:
    """What earlier runs left on the pull request."""

    live: dict[str, Any] = field(default_factory=dict)  # fp -> inline comment still carrying it
    comments: list[tuple[Any, list[str], list[str]]] = field(default_factory=list)  # (comment, fps, models)
    reviewed: set[str] = field(default_factory=set)  # fps named by earlier reviews
    change_requests: list[Any] = field(default_factory=list)  # our reviews still requesting changes
    summary: Any = None
    state: dict[str, Any] = field(default_factory=dict)


def blocking(run: Run, findings: list[Finding]) -> bool:
    """Whether an earlier request for changes still stands: only a divergence (or a rank-specific
    difference, or a configuration error) does. A finding that turned ``unproven`` (the rules
    stopped, the witness found the values equal) does not; a run that decided nothing (a model
    crashed or failed to build, the run failed) keeps the request, since it may still hold."""
    if run.error or run.config_errors or not run.models:
        return True
    if any(m.status in ("build-failed", "error", "bad-input", *BLOCKING) for m in run.models):
        return True
    return any(not f.is_gap for f in findings)


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"


class Bot:
    def __init__(self, settings: Settings, runner: Runner, console: Console | None = None, retry: RetryPolicy | None = None, version: str = "0.1.0") -> None:
        self.s = settings
        self.runner = runner
        self.redact = Redactor([settings.token or "", *settings.extra_secrets])
        guard_loggers(self.redact)
        self.console = console or Console(self.redact)
        self.console.redact = self.redact
        self.retry = retry or RetryPolicy()
        self.version = version
        self.nonce = uuid.uuid4().hex[:16]
        self.api: Api | None = None
        self.readonly: str | None = None  # why nothing can be written, once known
        self.broken: GitHubError | None = None  # GitHub refused us for another reason
        self.notes: list[str] = []
        self.status_set = False
        self.links: dict[str, str] = {}
        self._doc: dict[str, Any] | None = None
        self.internal = False  # running the models crashed (a bug of ours, not the PR's)

    # -- entry point ----------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.s.validate()
            target = self._target()
        except InputError as e:
            self.console.error(str(e))
            return EXIT_BAD_INPUT
        if target.event_name == "push" and set(target.sha) == {"0"}:
            self.console.info("the push deleted a branch: nothing to verify")
            return 0
        if self.s.shard is not None:
            return self._run_shard(target)
        self.console.info(f"{target.event_name} on {target.repo} at {target.sha[:12]}" + (f", pull request #{target.pr}" if target.pr else ""))
        if self.s.token:
            self.api = Api(self.s.token, target.repo, self.s.api_url, self.s.timeout, self.s.write_interval, self.retry, self.redact, self.console.info)
        else:
            self._degrade(render.message("readonly_reason", "no_token", ""))

        state, description, code = "error", render.message("crash_description", "shardproof stopped before a verdict"), EXIT_ERROR
        try:
            self._set_status(target, "pending", render.message("pending_description"), None)
            run = self._run_models(target)
            state, code = gate(run, self.s.fail_on)
            if self.internal or any(m.status == "error" for m in run.models):
                # shardproof crashed (on a model, or running them): status error (gate), and the
                # job fails with the internal-error code whatever fail-on says about findings.
                code = EXIT_ERROR
            ctx = self._ctx(target, state)
            description = render.status_description(run, state, ctx)
            self._report(target, run, ctx, state)
        except Exception as e:  # the status must still be set: say what happened
            reason = self.redact(f"{type(e).__name__}: {e}" if str(e) else f"{type(e).__name__} in {_where(e)}")
            self.console.error(f"shardproof stopped: {reason}")
            self.console.info(self.redact(traceback.format_exc()))
            state, description, code = "error", render.message("crash_description", reason), EXIT_ERROR
        finally:
            self._set_status(target, state, description[: render.STATUS_DESCRIPTION_LIMIT], self.links.get("check") or self.s.run_url or self.links.get("summary"), final=True)
        if self.broken is not None or (self.api is not None and not self.readonly and not self.status_set):
            self.console.error(f"the verdict ({state}) could not be recorded on GitHub" + (f": {self.broken}" if self.broken else ""))
            return EXIT_ERROR if code == 0 else code
        return code

    # -- steps ----------------------------------------------------------------------------------

    def _target(self) -> Target:
        if self.s.event_path is None:
            raise InputError("event", "", "no event file: set GITHUB_EVENT_PATH or pass --event")
        payload = load_event(self.s.event_path)
        name = self.s.event_name or guess_name(payload)
        pr_event = None
        if self.s.pr_event_path is not None:
            if self.s.pr_event_path.exists():
                pr_event = load_event(self.s.pr_event_path)
            else:
                # The untrusted run left no artifact: still set the status (error, no results),
                # finding the pull request the other ways a workflow_run allows.
                self.console.warning(f"no saved pull_request event at {self.s.pr_event_path}; finding the pull request from the workflow_run")
        return read_target(name, payload, self.s.repo, self.s.sha, pr_event)

    def _run_models(self, target: Target) -> Run:
        self.s.out.mkdir(parents=True, exist_ok=True)
        try:
            if not target.may_run_models and self.s.result is None and self.s.mode != "merge":
                raise RunnerError(f"{target.note}" if target.note else "this event does not run the models; pass --result")
            doc = self.runner.run(self.s.config, self.s.out, self.s.models)
            if self.s.mode == "merge" and doc.get("sha") != target.sha:
                # Partial results of another commit (an older run's artifacts) must never
                # decide this commit's status.
                raise RunnerError(f"the partial results are of commit {str(doc.get('sha'))[:12]}, this run reports on {target.sha[:12]}")
            base = self.s.result.parent if self.s.result else self.s.out
            # Sources and commands as they read on any machine (the report is shared).
            doc = portable_doc(doc, self.s.workspace or str(Path.cwd()), base)
            run = load_run(doc, base)
        except InputError as e:
            # The pull request's .shardproof.yml (or the models input) is wrong: the author's
            # error, located, not a failure of shardproof.
            located = self._located(e)
            self.console.error(f"configuration error: {located}")
            return Run([], config=str(self.s.config), config_errors=[located])
        except (RunnerError, OSError, ValueError, KeyError, TypeError) as e:
            reason = self.redact(str(e))
            self.console.error(f"the models could not be run: {reason}")
            return Run([], config=str(self.s.config), error=reason)
        except Exception as e:  # a crashing front end is a verdict of "error", not a bot crash
            self.internal = True
            reason = self.redact(f"shardproof crashed (a bug in shardproof, not in this pull request): {type(e).__name__}: {e}")
            self.console.error(f"the models could not be run: {reason}")
            self.console.info(self.redact(traceback.format_exc()))
            return Run([], config=str(self.s.config), error=reason)
        # The document goes out as data: scrub anything secret-looking from build logs.
        for m in run.models:
            if m.build.get("error"):
                m.build["error"] = self.redact(m.build["error"])
        for m in run.models:
            self.console.info(f"model {m.name}: {m.status}" + (f" ({m.reason})" if m.status != "verified" and m.reason else ""))
        notice = getattr(self.runner, "notice", None)
        if notice:  # the models ran unsandboxed: the report must say so, and why
            text = render.message("note", "no_sandbox", notice, "", "")
            self.console.warning(text)
            self.notes.append(text)
        self._doc = doc
        return run

    def _located(self, e: InputError) -> str:
        """``<file>:<line>: <message>`` with the file relative to the workspace (a line number
        first in ``where``; a key path without one stays in the message)."""
        path = self._display(Path(e.path)) if e.path and Path(e.path).is_absolute() else e.path
        line = str(e.where).split(":", 1)[0]
        if line.isdigit():
            rest = str(e.where).split(":", 1)[1] if ":" in str(e.where) else ""
            return self.redact(f"{path}:{line}: {rest + ': ' if rest and not rest.isdigit() else ''}{e.message}" + (f"\n{e.excerpt}" if e.excerpt else ""))
        return self.redact(f"{path}: {e.where + ': ' if e.where else ''}{e.message}")

    def _run_shard(self, target: Target) -> int:
        """Build and verify this shard's part of the models; write the partial result only."""
        from shardproof.engine.frontend.config import load_config

        assert self.s.shard is not None
        index, count = parse_shard(self.s.shard)
        try:
            config = load_config(self.s.config)
            declared = [m.name for m in config.select(self.s.models)]
        except InputError as e:
            self.console.error(str(e))
            return EXIT_BAD_INPUT
        mine = pick(declared, index, count)
        self.console.info(f"shard {index}/{count}: {len(mine)} of {len(declared)} model(s): {', '.join(mine) or 'none'}")
        self.s.out.mkdir(parents=True, exist_ok=True)
        if mine:
            self.s.models = mine
            run = self._run_models(target)
            doc = self._doc or {"version": 1, "config": run.config, "models": [], "error": run.error}
        else:  # more shards than models: an empty part is still a part the merge expects
            run = Run([], config=str(self.s.config))
            doc = {"version": 1, "config": str(self.s.config), "repository_root": ".", "models": []}
        partial = make_partial(doc, index, count, declared, mine, target.sha, self.s.out, config.root)
        write_file(self.s.out / "result.json", self.redact(json.dumps(partial, indent=2)) + "\n")
        ctx = self._ctx(target, gate(run, self.s.fail_on)[0])
        if mine:
            append_step_summary(self.s.step_summary_file, self.redact(render.step_summary(run, collect(run, self.s.workspace), ctx, place([], None, "nofilter", 0))))
        out = self.s.out.as_posix()
        write_outputs(self.s.output_file, {"report-dir": out, "result-json": f"{out}/result.json", "verdict": run.overall() if mine else "none", "shard": f"{index}/{count}"})
        self.console.info(f"partial result written to {out}/result.json; a merge job (mode: merge) reports it")
        # The verdict belongs to the merge job; a shard fails only when it produced no verdicts,
        # so one diverging model does not cancel the other shards of a fail-fast matrix.
        return EXIT_ERROR if run.error else 0

    def _ctx(self, target: Target, state: str) -> render.Ctx:
        return render.Ctx(repo=target.repo, sha=target.sha, server_url=self.s.server_url, run_url=self.s.run_url, context=self.s.context, filter_mode=self.s.filter_mode, fail_on=self.s.fail_on, state=state, report_dir=self._display(self.s.out), notes=self.notes)

    def _display(self, path: Path) -> str:
        """A path as the workflow sees it: relative to the workspace (never a machine path)."""
        try:
            return path.resolve().relative_to(Path(self.s.workspace or Path.cwd()).resolve()).as_posix()
        except ValueError:
            return path.name

    def _report(self, target: Target, run: Run, ctx: render.Ctx, state: str) -> None:
        findings = collect(run, self.s.workspace)
        # The verdict is known: the files, step outputs and job summary are written now, before
        # GitHub is asked anything, so no answer (or lack of one) from GitHub can lose them.
        early = place(findings, None, self.s.filter_mode, 0)
        self._write_files(run, findings, ctx, render.review_body(run, early, ctx, self.nonce), render.summary_body(run, findings, ctx, [], self.nonce))
        append_step_summary(self.s.step_summary_file, self.redact(render.step_summary(run, findings, ctx, early)))
        self._write_outputs(run, state)
        pr = self._pull(target)
        diff: DiffIndex | None = None
        existing = Existing()
        if pr is not None and self.api is not None and self.broken is None:
            try:
                entries = self.api.pull_files(pr)
                if len(entries) >= MAX_PR_FILES:
                    self._note("too_many_files", MAX_PR_FILES)
                diff = DiffIndex.from_entries(entries)
                for p in diff.problems:
                    self.console.info(f"unreadable patch, no inline comments there: {p}")
                if not self.readonly:
                    existing = self._existing(pr)
            except GitHubError as e:
                self.console.warning(f"{e}; findings go to the summary and annotations instead")
                diff = None
        placement = place(findings, diff, self.s.filter_mode, self.s.max_comments, existing.live, {fp: c.html_url for fp, c in existing.live.items()})
        review_text = render.review_body(run, placement, ctx, self.nonce)
        if pr is not None and self.api is not None and not self.readonly and self.broken is None:
            review_text = self._post_review(target, pr, run, placement, ctx, existing) or review_text
            self._resolve(pr, run, findings, ctx, existing)
        resolved = self._resolved_in_summary(run, findings, existing)
        summary = render.summary_body(run, findings, ctx, resolved, self.nonce)
        if pr is not None and self.api is not None and not self.readonly and self.broken is None:
            self._upsert_summary(pr, run, findings, ctx, resolved, existing)
        self._write_files(run, findings, ctx, review_text, summary)
        self._check_run(target, run, findings, placement, ctx, state)
        if self.readonly:
            self._annotate_locally(placement)
        self._write_outputs(run, state)

    def _write_outputs(self, run: Run, state: str) -> None:
        out = self.s.out.as_posix()
        write_outputs(self.s.output_file, {
            "report-dir": out,
            "result-json": f"{out}/result.json",
            "sarif": f"{out}/report.sarif",
            "trace-html": f"{out}/trace.html",
            "summary-md": f"{out}/summary.md",
            "review-md": f"{out}/review.md",
            "trace": f"{out}/trace.html",
            "verdict": run.overall(),
            "state": state,
            "degraded": "true" if self.readonly else "false",
        })

    def _pull(self, target: Target) -> Any:
        if not target.is_pr or self.api is None or self.broken is not None:
            return None
        try:
            number = target.pr
            if number is None and target.head_ref:
                # A fork's workflow_run carries no pull request; find it by its head branch.
                found = [p for p in self.api.find_pulls(target.head_ref) if p.head.sha == target.sha]
                number = found[0].number if found else None
            if number is None:
                self._note("no_pr")
                return None
            pr = self.api.pull(number)
        except GitHubError as e:
            self.console.warning(str(e))
            return None
        if pr.head.sha != target.sha:
            # The number may come from an untrusted artifact, or the PR moved on (a newer run
            # will report on the new head): never review a pull request at a commit other than
            # the one that was verified, nor anchor on a diff of another commit.
            key = "pr_elsewhere" if target.event_name == "workflow_run" else "pr_moved_on"
            self._note(key, pr.number, pr.head.sha[:7], target.sha[:7])
            return None
        return pr

    def _existing(self, pr: Any) -> Existing:
        assert self.api is not None
        ex = Existing()
        for c in self.api.review_comments(pr):
            m = _FINDING.match(c.body or "")
            if not m:
                continue
            fps = [x for x in m.group(1).split(",") if x]
            models = [urllib.parse.unquote(x) for x in m.group(2).split(",") if x]
            ex.comments.append((c, fps, models))
            for fp in fps:
                ex.live.setdefault(fp, c)
        for r in self.api.reviews(pr):
            m = _REVIEW.match(r.body or "")
            if m:
                ex.reviewed.update(x for x in m.group(2).split(",") if x)
                if r.state == "CHANGES_REQUESTED":
                    ex.change_requests.append(r)
        marker = render.MARK_SUMMARY.format(context=self.s.context)
        for c in self.api.issue_comments(pr):
            if (c.body or "").startswith(marker):
                ex.summary = c
                ex.state = render.read_state(c.body)
                break
        return ex

    def _post_review(self, target: Target, pr: Any, run: Run, placement: Placement, ctx: render.Ctx, existing: Existing) -> str | None:
        assert self.api is not None
        new_inline = [f for g in placement.inline for f in g]
        new_body = [f for f in placement.body if f.fingerprint not in existing.reviewed]
        if not new_inline and not new_body:
            if run.models or run.error:
                self.console.info("no new findings: no new review (the summary is updated)")
            return None
        comments = [{"path": g[0].anchor.path, "line": g[0].anchor.line, "side": g[0].side, "body": render.inline_comment(g, ctx)} for g in placement.inline if g[0].anchor]
        body = render.review_body(run, placement, ctx, self.nonce)
        event = self.s.review_event
        if not any(not f.is_gap for f in [*new_inline, *new_body]) and ctx.state == "success":
            # Only places where the rules stopped on numerically equal programs: a comment,
            # never a change request that blocks a pull request the gate lets through.
            event = "COMMENT"
        for _ in range(3):
            try:
                review = self.api.create_review(pr, target.sha, body, event, comments, self.nonce)
                self.links["review"] = review.html_url
                for f in (f for g in placement.inline for f in g):
                    f.comment_url = review.html_url
                self.console.info(f"review posted: {len(comments)} inline comment(s), {len(placement.body)} finding(s) in the body")
                return body
            except Unprocessable as e:
                if event == "REQUEST_CHANGES" and "own pull request" in e.detail.lower():
                    # GitHub forbids requesting changes on one's own pull request (local runs).
                    event = "COMMENT"
                    continue
                if comments:
                    # An anchor GitHub refused: the same findings, all in the body. Nothing is lost.
                    self.console.warning(f"GitHub refused the inline comments ({e.detail}); posting every finding in the review body")
                    placement = move_all_to_body(placement)
                    comments = []
                    body = render.review_body(run, placement, ctx, self.nonce, fallback=e.detail)
                    continue
                self.console.warning(f"{e}; the findings are in the summary comment")
                return body
            except PermissionDenied as e:
                self._note("no_review", e.detail)
                self.console.warning(str(e))
                return body
        return body

    def _resolve(self, pr: Any, run: Run, findings: list[Finding], ctx: render.Ctx, existing: Existing) -> None:
        """Strike through earlier inline comments whose findings this run no longer reports."""
        assert self.api is not None
        current = {f.fingerprint for f in findings}
        decided = {m.name for m in run.models if m.status in DECIDED}
        for comment, fps, models in existing.comments:
            if any(fp in current for fp in fps) or not models or not set(models) <= decided:
                continue
            try:
                unproven = any(m.name in models and m.status == "unproven" for m in run.models)
                self.api.edit_review_comment(comment, render.resolved_comment(comment.body, ctx, unproven))
            except GitHubError as e:
                self.console.warning(f"could not mark comment {comment.id} resolved: {e}")
        if existing.change_requests and not blocking(run, findings):
            for r in existing.change_requests:
                try:
                    self.api.dismiss_review(pr, r, render.message("dismiss_message", ctx.sha or ""))
                except GitHubError as e:
                    self._note("not_dismissed", e.detail)

    def _resolved_in_summary(self, run: Run, findings: list[Finding], existing: Existing) -> list[dict[str, Any]]:
        current = {f.fingerprint for f in findings}
        decided = {m.name for m in run.models if m.status in DECIDED}
        urls = {fp: c.html_url for c, fps, _ in existing.comments for fp in fps}
        out = []
        for item in existing.state.get("findings", []) if isinstance(existing.state.get("findings"), list) else []:
            if isinstance(item, dict) and item.get("fp") not in current and item.get("model") in decided:
                out.append({"text": str(item.get("text", "")), "url": urls.get(str(item.get("fp")))})
        return out

    def _upsert_summary(self, pr: Any, run: Run, findings: list[Finding], ctx: render.Ctx, resolved: list[dict[str, Any]], existing: Existing) -> None:
        assert self.api is not None
        try:
            if existing.summary is not None:
                body = render.summary_body(run, findings, ctx, resolved)
                try:
                    self.api.edit_issue_comment(existing.summary, body)
                    self.links["summary"] = existing.summary.html_url
                    return
                except PermissionDenied:
                    self.console.info("the earlier summary comment is not ours to edit: posting a new one")
            c = self.api.create_issue_comment(pr, render.summary_body(run, findings, ctx, resolved, self.nonce), self.nonce)
            self.links["summary"] = c.html_url
        except GitHubError as e:
            self._note("no_summary", e.detail)
            self.console.warning(str(e))

    def _check_run(self, target: Target, run: Run, findings: list[Finding], placement: Placement, ctx: render.Ctx, state: str) -> None:
        if not target.is_pr or self.api is None or self.readonly or self.broken is not None:
            return  # a push gets the commit status only
        output = render.check_output(run, findings, ctx)
        notes = [render.annotation(f, self.s.fail_on) for f in placement.annotations][:MAX_ANNOTATIONS]
        conclusion = {"success": "neutral" if run.overall() in ("unsupported", "unproven") else "success", "failure": "failure"}.get(state, "failure")
        try:
            check = self.api.create_check_run(self.s.context, target.sha, conclusion, {**output, "annotations": notes[:ANNOTATIONS_PER_REQUEST]}, self.nonce, self.s.run_url)
            self.links["check"] = check.html_url
            for start in range(ANNOTATIONS_PER_REQUEST, len(notes), ANNOTATIONS_PER_REQUEST):
                batch = notes[start : start + ANNOTATIONS_PER_REQUEST]
                self.api.add_annotations(check, output, batch, start + len(batch))
        except GitHubError as e:
            # The commit status is the gate; a check run is extra (PATs cannot create them).
            self._note("no_check_run", e.detail)
            self.console.warning(str(e))

    def _annotate_locally(self, placement: Placement) -> None:
        for f in placement.annotations[:MAX_ANNOTATIONS]:
            self.console.command(render.workflow_command(f, self.s.fail_on))

    def _write_files(self, run: Run, findings: list[Finding], ctx: render.Ctx, review: str, summary: str) -> None:
        out = self.s.out
        doc = self._doc or {"version": 1, "config": run.config, "models": [], "error": run.error}
        write_file(out / "result.json", self.redact(json.dumps(doc, indent=2)) + "\n")
        write_file(out / "report.sarif", self.redact(json.dumps(render.sarif(run, findings, ctx, self.version), indent=2)) + "\n")
        write_file(out / "trace.html", self.redact(render.trace_html(run, findings, ctx, self.s.workspace)))
        write_file(out / "review.md", self.redact(review))
        write_file(out / "summary.md", self.redact(summary))

    # -- GitHub writes that decide the mode -------------------------------------------------------

    def _set_status(self, target: Target, state: str, description: str, url: str | None, final: bool = False) -> None:
        if self.api is None or self.readonly or (self.broken is not None and not final):
            return
        try:
            self.api.create_status(target.sha, state, description, self.s.context, url)
            self.status_set = final
            if final:
                self.console.info(f"commit status {self.s.context!r}: {state} — {description}")
        except PermissionDenied as e:
            self._degrade(render.message("readonly_reason", "fork" if target.fork else "statuses", e.detail))
        except GitHubError as e:
            self.console.error(str(e))
            self.broken = e

    def _degrade(self, why: str) -> None:
        if self.readonly is None:
            self.readonly = why
            text = render.message("degraded_notice", why)
            self.notes.append(text)
            self.console.warning(text, title="shardproof: read-only mode")

    def _note(self, code: str, *args: object) -> None:
        text = render.message("note", code, *args, *([""] * (3 - len(args))))
        self.notes.append(text)
        self.console.info(text)
