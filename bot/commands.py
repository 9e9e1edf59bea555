"""The bot's subcommands: ``shardproof github`` (the action's entry point) and ``shardproof report``.

Settings come from flags first, then the action's inputs (``INPUT_<NAME>``, hyphens kept, as
GitHub passes them to Docker actions), then GitHub's own variables. The token is only ever read
from the environment: a token on the command line would end up in process lists and logs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from shardproof.engine.errors import InputError

if TYPE_CHECKING:  # the bot (PyGithub, jinja2) loads only when a bot subcommand runs
    from collections.abc import Callable

    from .app import Settings
    from .runner import Runner

EXIT_BAD_INPUT = 3


def _input(name: str, default: str | None = None) -> str | None:
    v = os.environ.get(f"INPUT_{name.upper()}")
    return v.strip() if v is not None and v.strip() else default


def _list(text: str | None) -> list[str] | None:
    items = [x for x in re.split(r"[,\s]+", text or "") if x]
    return items or None


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    g = sub.add_parser("github", help="run the models and report on a pull request: review, summary comment, commit status, check run", description="The GitHub Action's entry point; also runs locally with a token in the environment and an event file.")
    g.add_argument("--event", type=Path, help="event payload JSON (default: $GITHUB_EVENT_PATH)")
    g.add_argument("--event-name", help="pull_request, pull_request_target, workflow_run or push (default: $GITHUB_EVENT_NAME, else guessed from the payload)")
    g.add_argument("--pr-event", type=Path, help="workflow_run split: the pull_request event saved by the unprivileged run (only its number is used)")
    g.add_argument("--repo", help="owner/name (default: from the event, else $GITHUB_REPOSITORY)")
    g.add_argument("--token-env", default=None, help="environment variable holding the token (default: INPUT_GITHUB-TOKEN, GITHUB_TOKEN, GH_TOKEN)")
    g.add_argument("--api-url", help="REST API root (default: $GITHUB_API_URL or https://api.github.com)")
    g.add_argument("--server-url", help="web root for links (default: $GITHUB_SERVER_URL or https://github.com)")
    g.add_argument("--config", type=Path, help="models configuration (default: input config, else .shardproof.yml)")
    g.add_argument("--models", help="comma-separated model names to run (default: all declared)")
    g.add_argument("--result", type=Path, help="report on this result.json instead of running the models (workflow_run split)")
    g.add_argument("--out", type=Path, help="report directory (default: shardproof-report)")
    g.add_argument("--filter-mode", choices=("added", "diff_context", "file", "nofilter"), help="which findings get inline comments and annotations (default: added)")
    g.add_argument("--review-event", choices=("REQUEST_CHANGES", "COMMENT"), help="the review's event (default: REQUEST_CHANGES)")
    g.add_argument("--fail-on", choices=("diverged", "unsupported", "unproven", "never"), help="status failure and exit non-zero on: diverged (also build and internal errors; default), unsupported (also unsupported/inconclusive models), unproven (every model not verified, including unproven ones the witness found numerically equal), never")
    g.add_argument("--max-comments", type=int, help="inline comments per review (default 30)")
    g.add_argument("--context", help="commit status context and check run name (default: shardproof)")
    g.add_argument("--http-timeout", type=float, default=30.0, help="seconds per GitHub request (default 30)")
    g.add_argument("--shard", help="k/n: build and verify the k-th of n parts of the models and write a partial result; no GitHub writes (matrix jobs)")
    g.add_argument("--mode", choices=("check", "merge"), help="check (default): run the models; merge: report on the partial results under --partials as one run")
    g.add_argument("--partials", type=Path, help="merge: folder holding the shards' downloaded report folders (default: shardproof-partials)")
    g.add_argument("--sandbox", choices=("auto", "docker", "subprocess"), help="where model builds run: docker (a sibling container per model; error without a Docker socket), subprocess, or auto (default: docker when the socket is there)")
    g.add_argument("--sandbox-image", help="image for sandbox containers (default: the image of the container the bot runs in)")
    g.add_argument("--sandbox-cpus", type=float, help="CPUs per sandbox container (default: all)")
    g.set_defaults(func=_github)

    r = sub.add_parser("report", help="render the review body, summary, SARIF and trace.html from a result.json (no GitHub access)")
    r.add_argument("--result", type=Path, required=True, help="result.json written by `shardproof run` (or `shardproof check --json`)")
    r.add_argument("--out", type=Path, default=Path("shardproof-report"), help="directory to write into (default: shardproof-report)")
    r.add_argument("--repo", help="owner/name, for links")
    r.add_argument("--sha", help="commit, for links")
    r.add_argument("--server-url", default="https://github.com")
    r.add_argument("--context", default="shardproof")
    r.add_argument("--fail-on", choices=("diverged", "unsupported", "unproven", "never"), default="diverged")
    r.set_defaults(func=_report)


def settings_from(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Settings:
    from .app import Settings

    env = env if env is not None else os.environ
    names = [args.token_env] if args.token_env else ["INPUT_GITHUB-TOKEN", "GITHUB_TOKEN", "GH_TOKEN"]
    token = next((env[n] for n in names if env.get(n)), None)
    server = (args.server_url or env.get("GITHUB_SERVER_URL") or "https://github.com").rstrip("/")
    run_url = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}" if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY") else None
    event = args.event or (Path(env["GITHUB_EVENT_PATH"]) if env.get("GITHUB_EVENT_PATH") else None)
    pr_event = args.pr_event or (Path(v) if (v := _input("pr-event")) else None)
    result = args.result or (Path(v) if (v := _input("result")) else None)
    try:
        max_comments = int(args.max_comments if args.max_comments is not None else _input("max-comments", "30") or 30)
        interval = float(env.get("SHARDPROOF_WRITE_INTERVAL", "1.0"))
    except ValueError as e:
        raise InputError("settings", "max-comments", f"not a number: {e}") from e
    try:
        cpus_text = _input("sandbox-cpus")
        cpus = args.sandbox_cpus if args.sandbox_cpus is not None else (float(cpus_text) if cpus_text else None)
    except ValueError as e:
        raise InputError("settings", "sandbox-cpus", f"not a number: {e}") from e
    return Settings(
        event_path=event,
        event_name=args.event_name or env.get("GITHUB_EVENT_NAME") or None,
        pr_event_path=pr_event,
        repo=args.repo or env.get("GITHUB_REPOSITORY") or None,
        sha=env.get("GITHUB_SHA") or None,
        token=token,
        api_url=(args.api_url or env.get("GITHUB_API_URL") or "https://api.github.com").rstrip("/"),
        server_url=server,
        run_url=run_url,
        config=args.config or Path(_input("config", ".shardproof.yml") or ".shardproof.yml"),
        models=_list(args.models) or _list(_input("models")),
        result=result,
        out=args.out or Path(_input("out", "shardproof-report") or "shardproof-report"),
        filter_mode=args.filter_mode or _input("filter-mode", "added") or "added",
        review_event=(args.review_event or _input("review-event", "REQUEST_CHANGES") or "REQUEST_CHANGES").upper(),
        fail_on=args.fail_on or _input("fail-on", "diverged") or "diverged",
        max_comments=max_comments,
        context=args.context or _input("context", "shardproof") or "shardproof",
        timeout=args.http_timeout,
        write_interval=interval,
        workspace=env.get("GITHUB_WORKSPACE") or os.getcwd(),
        output_file=env.get("GITHUB_OUTPUT") or None,
        step_summary_file=env.get("GITHUB_STEP_SUMMARY") or None,
        mode=args.mode or _input("mode", "check") or "check",
        shard=args.shard or _input("shard"),
        partials=args.partials or Path(_input("partials", "shardproof-partials") or "shardproof-partials"),
        sandbox=args.sandbox or _input("sandbox", "auto") or "auto",
        sandbox_image=args.sandbox_image or _input("sandbox-image"),
        sandbox_cpus=cpus,
    )


def make_runner(s: Settings, log: Callable[[str], None] | None = None) -> Runner:
    """The runner for these settings: a result file, the shards' partial results, or the models
    built in sandbox containers — or in subprocesses, saying why, where Docker is not there."""
    from .runner import FrontendRunner, ResultFileRunner
    from .sandbox import SandboxRunner, SandboxUnavailable, connect
    from .shards import MergeRunner

    if s.result:
        return ResultFileRunner(s.result)
    if s.mode == "merge":
        return MergeRunner(s.partials)
    secrets = [s.token or "", *s.extra_secrets]
    if s.sandbox == "subprocess":
        return FrontendRunner("sandbox: subprocess was chosen", secrets)
    try:
        sandbox = connect(Path(s.workspace or os.getcwd()), s.sandbox_image, s.sandbox_cpus)
    except SandboxUnavailable as e:
        if s.sandbox == "docker":
            return _Refusing(f"sandbox: docker, but {e}")
        return FrontendRunner(str(e), secrets)
    if log is not None:
        log(f"model builds run in {sandbox.describe()}")
    return SandboxRunner(sandbox, log)


class _Refusing:
    """A runner that cannot run: the bot reports the reason as the run's error (status error)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, object]:
        from .runner import RunnerError

        raise RunnerError(self.reason)


def _github(args: argparse.Namespace) -> int:
    from .app import Bot

    # GitHub starts the container in the workspace; do not rely on it (nor on the image's
    # WORKDIR): relative paths of the inputs are relative to the workspace.
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if os.environ.get("GITHUB_ACTIONS") == "true" and workspace and Path(workspace).is_dir():
        os.chdir(workspace)
    try:
        s = settings_from(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bot = Bot(s, _Refusing("not started"))
    bot.runner = make_runner(s, bot.console.info)
    return bot.run()


def _report(args: argparse.Namespace) -> int:
    from . import render
    from .actions import write_file
    from .findings import collect, gate, load_run, place
    from .runner import ResultFileRunner, RunnerError

    try:
        doc = ResultFileRunner(args.result).run(Path(), args.out, None)
    except RunnerError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    run = load_run(doc, args.result.parent)
    findings = collect(run)
    state, _ = gate(run, args.fail_on)
    ctx = render.Ctx(repo=args.repo, sha=args.sha, server_url=args.server_url.rstrip("/"), context=args.context, fail_on=args.fail_on, state=state, report_dir=args.out.as_posix())
    placement = place(findings, None, "nofilter", 0)
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("shardproof")
    except PackageNotFoundError:
        ver = "0"
    out = args.out
    if args.result.resolve() != (out / "result.json").resolve():
        write_file(out / "result.json", json.dumps(doc, indent=2) + "\n")
    write_file(out / "review.md", render.review_body(run, placement, ctx, "report"))
    write_file(out / "summary.md", render.summary_body(run, findings, ctx, []))
    out_check = render.check_output(run, findings, ctx)
    write_file(out / "check.md", f"# {out_check['title']}\n\n{out_check['summary']}\n\n{out_check['text']}")
    write_file(out / "report.sarif", json.dumps(render.sarif(run, findings, ctx, ver), indent=2) + "\n")
    write_file(out / "trace.html", render.trace_html(run, findings, ctx))
    print(f"{run.overall()}: {render.headline(run)}")
    for name in ("review.md", "summary.md", "check.md", "report.sarif", "trace.html"):
        print(f"  {(out / name).as_posix()}")
    return 0
