"""Every text the bot writes, rendered from the jinja2 templates in ``templates/``, within size.

GitHub rejects bodies over its limits (65,536 characters for comments and reviews, 65,535 for a
check run's summary and text, 140 for a status description), so each body is rendered at
decreasing levels of detail until it fits; the last resort cuts it at a line and says where the
full report is. Hidden markers sit at the top of a body, so cutting never loses them.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from .findings import Finding, Frame, Placement, Run, resolve_artifact

COMMENT_LIMIT = 65_536
CHECK_LIMIT = 65_535
STATUS_DESCRIPTION_LIMIT = 140
ANNOTATION_TITLE_LIMIT = 255
ANNOTATION_MESSAGE_LIMIT = 64_000
STEP_SUMMARY_LIMIT = 1_000_000  # GitHub's cap is 1 MiB per step
MAX_PICTURES = 60  # trace.html draws the first findings; result.json keeps every one

MARK_SUMMARY = "<!-- shardproof:summary context={context} -->"
MARK_REVIEW = "<!-- shardproof:review"
MARK_FINDING = "<!-- shardproof:finding"
MARK_RESOLVED = "<!-- shardproof:resolved"

_NAME = re.compile(r"(%[\w.\-]+)")
# Only what can start markup inside a line (the texts never begin a line); "_" only at a word
# edge, since GitHub never reads snake_case as emphasis.
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


@dataclass(frozen=True)
class Detail:
    """How much a body may say; bodies are rendered at decreasing detail until they fit."""

    trace_steps: int | None = 40  # steps per relation-trace table (None: all)
    items: int | None = None  # findings listed in full (None: all)
    blocks: bool = True  # full blocks (operands, bijection, trace) for findings in a body


LEVELS = (
    Detail(40, None, True),
    Detail(12, None, True),
    Detail(0, None, True),
    Detail(0, None, False),
    Detail(0, 100, False),
    Detail(0, 30, False),
    Detail(0, 10, False),
)


@dataclass
class Ctx:
    """Where the report is published: links, names, settings."""

    repo: str | None = None
    sha: str | None = None
    server_url: str = "https://github.com"
    run_url: str | None = None
    context: str = "shardproof"
    filter_mode: str = "added"
    fail_on: str = "diverged"
    state: str = ""
    report_dir: str = "shardproof-report"
    notes: list[str] = field(default_factory=list)

    @property
    def sha7(self) -> str:
        return (self.sha or "")[:7]

    def blob(self, frame: Frame | None) -> str | None:
        if frame is None or not self.repo or not self.sha:
            return None
        path = urllib.parse.quote(frame.path)
        return f"{self.server_url.rstrip('/')}/{self.repo}/blob/{self.sha}/{path}#L{frame.line}"


# ---------------------------------------------------------------------------------------------
# Filters. Text that comes from the user's code (paths, function names) or from a result file
# is escaped, so it can neither break the layout nor forge the bot's hidden markers or mention
# people.


def md(text: Any) -> str:
    s = str(text if text is not None else "")
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return s.replace("<", "&lt;").replace("@", "&#64;").replace("\r", " ").replace("\n", " ")


def code(text: Any, cell: bool = False) -> str:
    s = str(text if text is not None else "")
    if "`" not in s and "\n" not in s and "\r" not in s:  # the common case, kept cheap
        return f"`{s.replace('|', chr(92) + '|')}`" if cell else f"`{s}`"
    s = s.replace("\r", " ").replace("\n", " ")
    run = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (run + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    out = f"{fence}{pad}{s}{pad}{fence}"
    return out.replace("|", "\\|") if cell else out


def fenced(text: Any, indent: int = 0, lang: str = "text") -> str:
    """A fenced block that the text cannot close early."""
    s = str(text if text is not None else "").rstrip("\n")
    run = max((len(m) for m in re.findall(r"`{3,}", s)), default=2)
    fence = "`" * (run + 1)
    pad = " " * indent
    return "\n".join(pad + line if line else line for line in [f"{fence}{lang}", *s.split("\n"), fence])


def snippet_block(st: Any, line: int | None) -> str:
    """The code around the reported line, numbered, the line itself marked."""
    width = len(str(max(n for n, _ in st.snippet)))
    rows = [f"{'>' if n == line else ' '} {n:>{width}}  {text}".rstrip() for n, text in st.snippet]
    return fenced("\n".join(rows), lang=st.language if st.language != "text" else "text")


def deleted_block(lines: Sequence[tuple[int, str]]) -> str:
    """Removed lines as the diff shows them, with their old line numbers."""
    width = len(str(max((n for n, _ in lines), default=0)))
    return fenced("\n".join(f"- {n:>{width}}  {text}".rstrip() for n, text in lines), lang="diff")


def suggestion_block(new_line: str) -> str:
    """GitHub's suggested change: the block replaces the commented line with its content."""
    run = max((len(m) for m in re.findall(r"`{3,}", new_line)), default=2)
    fence = "`" * (run + 1)
    return f"{fence}suggestion\n{new_line}\n{fence}"


def group_by_line(findings: Sequence[Finding]) -> list[tuple[Finding, int]]:
    """One entry per (model, source line), with how many more findings share it: a line where
    the rules stopped at three instructions reads once."""
    out: list[tuple[Finding, int]] = []
    seen: dict[tuple[str, str], int] = {}
    for f in findings:
        key = (f.model, str(f.source or f.instruction))
        if key in seen:
            first, more = out[seen[key]]
            out[seen[key]] = (first, more + 1)
        else:
            seen[key] = len(out)
            out.append((f, 0))
    return out


def diff_block(old: str, new: str) -> str:
    return fenced(f"-{old}\n+{new}", lang="diff")


def prose(text: Any, cell: bool = False) -> str:
    """Plain words with the instruction names set as code."""
    parts = _NAME.split(str(text if text is not None else ""))
    return "".join(code(p, cell) if k % 2 else md(p) for k, p in enumerate(parts))


def html_inline(text: Any) -> Markup:
    """The story's markdown (code spans, bold) as HTML for trace.html; everything else escaped."""
    out = []
    for k, part in enumerate(re.split(r"(`+ ?[^`]+? ?`+)", str(text or ""))):
        if k % 2:
            out.append(f"<code>{escape(part.strip('`').strip())}</code>")
        else:
            out.append(re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", str(escape(part))))
    return Markup("".join(out))


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def seconds(v: Any) -> str:
    if v is None:
        return "–"
    v = float(v)
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.1f} s"


VERDICT_MARK = {
    "verified": "✅ verified",
    "diverged": "❌ diverged",
    "rank-specific": "❌ rank-specific",
    "unsupported": "⚠️ unsupported",
    "inconclusive": "⚠️ inconclusive",
    "unproven": "🔶 unproven",
    "build-failed": "💥 build failed",
    "bad-input": "⛔ configuration error",
    "error": "💥 internal error",
}


@cache
def environment() -> jinja2.Environment:
    root = resources.files("shardproof.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root)),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2", "html", "svg"), default_for_string=False, default=False),
        # Result files from older or newer engines may lack optional fields: render what is there.
        undefined=jinja2.Undefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(html_inline=html_inline, md=md, code=code, prose=prose, fenced=fenced, snippet_block=snippet_block, suggestion_block=suggestion_block, plural=plural, seconds=seconds, verdict=lambda s: VERDICT_MARK.get(s, s), tojson_compact=lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True))
    env.globals.update(VERDICT_MARK=VERDICT_MARK, code=code, md=md, prose=prose, snippet_block=snippet_block, suggestion_block=suggestion_block, deleted_block=deleted_block, diff_block=diff_block, group_by_line=group_by_line, why_text=lambda f: message("why", f.why, f.why_arg))
    return env


def _render(name: str, **kw: Any) -> str:
    return environment().get_template(name).render(**kw)


def message(name: str, *args: Any) -> str:
    """A short text from templates/messages.j2 (one macro per message), whitespace-collapsed."""
    macro = getattr(environment().get_template("messages.j2").module, name)
    return " ".join(str(macro(*args)).split())


def fit(render: Callable[[Detail], str], limit: int, levels: Sequence[Detail] = LEVELS, floor: Callable[[Detail], int] | None = None) -> str:
    """The most detailed rendering within ``limit`` (counted in UTF-8 bytes, which is never less
    than GitHub's character count). Levels shrink monotonically, so after the common case (the
    first level fits) a bisection keeps huge reports to a few renders; ``floor``, a cheap lower
    bound of a level's size, skips levels that cannot fit without rendering them."""
    if floor is not None:
        fitting = [d for d in levels if floor(d) <= limit]
        levels = fitting or levels[-1:]
    first = render(levels[0])
    if len(first.encode()) <= limit:
        return first
    lo, hi = 1, len(levels) - 1
    best: str | None = None
    last = first
    while lo <= hi:
        mid = (lo + hi) // 2
        text = render(levels[mid])
        if len(text.encode()) <= limit:
            best, hi = text, mid - 1
        else:
            last, lo = text, mid + 1
    return best if best is not None else truncate(last, limit)


def trace_floor(findings: Sequence[Finding], per_step: int = 40) -> Callable[[Detail], int]:
    """At least ``per_step`` bytes per relation-trace row a level would show."""

    def floor(d: Detail) -> int:
        listed = findings if d.items is None else findings[: d.items]
        if not d.blocks or d.trace_steps == 0:
            return 0
        rows = sum(min(len(t.get("steps") or []), d.trace_steps if d.trace_steps is not None else 1 << 30) for f in listed for t in f.traces)
        return rows * per_step

    return floor


def truncate(text: str, limit: int, note: str | None = None) -> str:
    note = note or message("truncated_note")
    tail = "\n\n" + note + "\n"
    room = limit - len(tail.encode()) - 64
    cut = text.encode()[: max(room, 0)].decode(errors="ignore")
    cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
    if cut.count("```") % 2:
        cut += "\n```"
    opened = cut.count("<details") - cut.count("</details>")
    return cut + "\n</details>" * max(opened, 0) + tail


# ---------------------------------------------------------------------------------------------
# Bodies.


def headline(run: Run) -> str:
    text = message("headline", run.counts, len(run.models), run.error or "", len(run.config_errors))
    # Verdicts that rest on a stated assumption say so in the headline too: never read as unconditional.
    assumed = [m for m in run.models if _assumed(m)]
    if assumed and not run.error:
        texts = sorted({a["text"] for m in assumed for a in _assumed(m)})
        text += f" ({len(assumed)} of {len(run.models)} assuming {'; '.join(texts)})"
    return text


def finding_marker(group: Sequence[Finding]) -> str:
    """Which findings an inline comment carries, and of which models (for dedup and resolution)."""
    fps = ",".join(f.fingerprint for f in group)
    models = ",".join(sorted({urllib.parse.quote(f.model, safe="") for f in group}))
    return f"{MARK_FINDING} fp={fps} models={models} -->"


def inline_comment(group: Sequence[Finding], ctx: Ctx) -> str:
    def r(d: Detail) -> str:
        return _render("inline.md.j2", group=group, ctx=ctx, detail=d, marker=finding_marker(group))

    return fit(r, COMMENT_LIMIT)


def review_body(run: Run, placement: Placement, ctx: Ctx, nonce: str, fallback: str | None = None) -> str:
    """The body of the one review: a short verdict, then every finding that is not inline."""
    # The marker's fingerprint list lets a re-run skip findings it already reported (bounded, so
    # it never crowds out the text).
    fps = ([f.fingerprint for g in placement.inline for f in g] + [f.fingerprint for f in placement.body])[:1000]

    def r(d: Detail) -> str:
        return _render("review.md.j2", run=run, placement=placement, ctx=ctx, detail=d, nonce=nonce, fps=fps, fallback=fallback, headline=headline(run))

    return fit(r, COMMENT_LIMIT, floor=trace_floor(placement.body))


MARK_STATE = "<!-- shardproof:state "


STATE_ENTRIES = 150  # the state must leave most of the 65,536 characters to the text


def finding_label(f: Finding) -> str:
    text = f"{f.model} {f.source or 'no source'} {f.instruction}: {f.cause}"
    return text if len(text) <= 90 else text[:89] + "…"


def state_marker(findings: Sequence[Finding], ctx: Ctx) -> str:
    """What the summary reported, so the next run can tell which findings disappeared (the
    first STATE_ENTRIES; inline comments carry their own fingerprints regardless)."""
    state = {"sha": ctx.sha, "findings": [{"fp": f.fingerprint, "model": f.model, "text": finding_label(f)} for f in findings[:STATE_ENTRIES]]}
    text = json.dumps(state, separators=(",", ":"), sort_keys=True)
    # Inside an HTML comment: "<" and ">" as JSON escapes, so "-->" can never close it early.
    return MARK_STATE + text.replace("<", "\\u003c").replace(">", "\\u003e") + " -->"


def read_state(body: str) -> dict[str, Any]:
    for line in body.splitlines()[:5]:
        if line.startswith(MARK_STATE) and line.endswith(" -->"):
            try:
                data = json.loads(line[len(MARK_STATE) : -4])
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def summary_body(run: Run, findings: Sequence[Finding], ctx: Ctx, resolved: Sequence[dict[str, Any]], nonce: str = "") -> str:
    marker = MARK_SUMMARY.format(context=ctx.context) + (f"\n<!-- shardproof:nonce {nonce} -->" if nonce else "")

    def r(d: Detail) -> str:
        return _render("summary.md.j2", run=run, findings=findings, ctx=ctx, detail=d, resolved=resolved, headline=headline(run), marker=marker, state_marker=state_marker(findings, ctx))

    return fit(r, COMMENT_LIMIT)


def resolved_comment(old_body: str, ctx: Ctx, unproven: bool = False) -> str:
    """An inline comment from an earlier run whose findings are gone: struck through, kept.
    ``unproven``: its model is now unproven (numerically equal), no longer a divergence."""
    # The old marker is renamed so the struck-through copy no longer counts as a live finding.
    old = old_body.replace(MARK_FINDING, "<!-- shardproof:was-finding")
    text = _render("resolved.md.j2", ctx=ctx, old=old, unproven=unproven)
    return text if len(text.encode()) <= COMMENT_LIMIT else truncate(text, COMMENT_LIMIT)


def check_output(run: Run, findings: Sequence[Finding], ctx: Ctx) -> dict[str, str]:
    title = message("check_title", run.counts, len(run.models), run.error or "", len(run.config_errors))[:ANNOTATION_TITLE_LIMIT]
    summary = fit(lambda d: _render("check_summary.md.j2", run=run, findings=findings, ctx=ctx, detail=d, headline=headline(run)), CHECK_LIMIT)
    text = fit(lambda d: _render("check_text.md.j2", run=run, findings=findings, ctx=ctx, detail=d), CHECK_LIMIT, levels=(Detail(None), Detail(200), Detail(60), Detail(20), Detail(20, 100), Detail(10, 40), Detail(0, 40), Detail(0, 15)), floor=trace_floor(findings))
    return {"title": title, "summary": summary, "text": text}


def step_summary(run: Run, findings: Sequence[Finding], ctx: Ctx, placement: Placement | None) -> str:
    return fit(lambda d: _render("step_summary.md.j2", run=run, findings=findings, ctx=ctx, detail=d, placement=placement, headline=headline(run)), STEP_SUMMARY_LIMIT, floor=trace_floor(findings))


def status_description(run: Run, state: str, ctx: Ctx) -> str:
    text = message("status_description", run.counts, len(run.models), state, run.error or "", ctx.fail_on, len(run.config_errors))
    return text if len(text) <= STATUS_DESCRIPTION_LIMIT else text[: STATUS_DESCRIPTION_LIMIT - 1] + "…"


def _module(f: Finding) -> str | None:
    return f.story.module if f.story is not None else None


def gap_level(fail_on: str) -> str:
    """How loud a rule gap is: a warning when fail-on unproven gates on it, else a note."""
    return "warning" if fail_on == "unproven" else "note"


def annotation(f: Finding, fail_on: str = "diverged") -> dict[str, Any]:
    """A check-run annotation at the finding's filtered line: failure for a divergence; for a
    rule gap (unproven, numerically equal) a notice, or a warning when fail-on is unproven."""
    assert f.annotate is not None
    level = ("warning" if gap_level(fail_on) == "warning" else "notice") if f.is_gap else "failure"
    return {
        "path": f.annotate.path,
        "start_line": f.annotate.line,
        "end_line": f.annotate.line,
        "annotation_level": level,
        "title": message("annotation_title", f.model, f.instruction, f.is_gap, _module(f), f.config)[:ANNOTATION_TITLE_LIMIT],
        "message": message("annotation_message", f)[:ANNOTATION_MESSAGE_LIMIT],
    }


def workflow_command(f: Finding, fail_on: str = "diverged") -> str:
    """``::error file=,line=,title=::message`` with the runner's escaping (data vs properties);
    ``::notice`` (``::warning`` under fail-on unproven) for a rule gap."""
    assert f.annotate is not None

    def data(s: str) -> str:
        return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    def prop(s: str) -> str:
        return data(s).replace(":", "%3A").replace(",", "%2C")

    title = message("annotation_title", f.model, f.instruction, f.is_gap, _module(f), f.config)
    kind = ("warning" if fail_on == "unproven" else "notice") if f.is_gap else "error"
    return f"::{kind} file={prop(f.annotate.path)},line={f.annotate.line},title={prop(title)}::{data(message('annotation_message', f))}"


# ---------------------------------------------------------------------------------------------
# SARIF 2.1.0 for code scanning.


def _assumed(m: Any) -> list[dict[str, Any]]:
    """The assumptions a model's verdict rests on (result.json ``assumptions``)."""
    return list((getattr(m, "result", None) or {}).get("assumptions") or [])


def sarif(run: Run, findings: Sequence[Finding], ctx: Ctx, version: str) -> dict[str, Any]:
    results = []
    for f in findings:
        loc = f.annotate or f.source
        if loc is None:
            continue  # code scanning needs a location; the summary still lists it
        res: dict[str, Any] = {
            "ruleId": "shardproof/configuration" if f.config else "shardproof/unproven" if f.is_gap else "shardproof/divergence",
            # A rule gap on a numerically equal program is not an error of the pull request.
            "level": gap_level(ctx.fail_on) if f.is_gap else "error",
            "message": {"text": message("sarif_message", f)},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": loc.path, "uriBaseId": "%SRCROOT%"}, "region": {"startLine": loc.line}}}],
            "partialFingerprints": {"shardproofFinding/v1": f.fingerprint},
            "properties": {"model": f.model, "module": _module(f), "instruction": f.instruction, "opcode": f.divergence.get("opcode"), "baselineCounterpart": f.divergence.get("baseline_counterpart"), "witness": (f.witness or {}).get("status")},
        }
        if len(f.frames) > 1:
            res["relatedLocations"] = [{"id": k, "physicalLocation": {"artifactLocation": {"uri": fr.path, "uriBaseId": "%SRCROOT%"}, "region": {"startLine": fr.line}}, "message": {"text": message("sarif_frame", fr)}} for k, fr in enumerate(f.frames[1:], 1)]
        results.append(res)
    notes = [{"level": "error" if m.status in ("build-failed", "bad-input", "error") else "warning", "message": {"text": f"{m.name}: {m.status}: {m.reason}" + (" (a failure of shardproof, not of the code under review)" if m.status == "error" else " (a configuration error in .shardproof.yml)" if m.status == "bad-input" else "")}} for m in run.models if m.status in ("build-failed", "bad-input", "unsupported", "inconclusive", "error")]
    # A verdict reached under a stated assumption (result.json "assumptions") says so here too.
    notes += [{"level": "note", "message": {"text": f"{m.name}: {m.status} (assuming {'; '.join(a['text'] for a in _assumed(m))})"}} for m in run.models if _assumed(m)]
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "shardproof",
                "version": version,
                "informationUri": "https://github.com/shardproof/shardproof",
                "rules": [{
                    "id": "shardproof/divergence",
                    "name": "DistributedDivergence",
                    "shortDescription": {"text": message("sarif_rule_short")},
                    "fullDescription": {"text": message("sarif_rule_full")},
                    "defaultConfiguration": {"level": "error"},
                    "properties": {"tags": ["correctness", "distributed"]},
                }, {
                    "id": "shardproof/unproven",
                    "name": "UnprovenNumericallyEqual",
                    "shortDescription": {"text": message("sarif_gap_short")},
                    "fullDescription": {"text": message("sarif_gap_full")},
                    "defaultConfiguration": {"level": "note"},
                    "properties": {"tags": ["correctness", "distributed", "rule-gap"]},
                }, {
                    "id": "shardproof/configuration",
                    "name": "ConfigurationError",
                    "shortDescription": {"text": "A line of .shardproof.yml cannot be used as written."},
                    "fullDescription": {"text": "The models configuration names a key, an entry point or a value shardproof cannot use; no verdict was reached for the models it declares."},
                    "defaultConfiguration": {"level": "error"},
                    "properties": {"tags": ["configuration"]},
                }],
            }},
            "results": results,
            "invocations": [{"executionSuccessful": run.overall() != "error", "toolExecutionNotifications": notes}],
            "properties": {"models": [{"name": m.name, "status": m.status, **({"assumptions": [a["text"] for a in _assumed(m)]} if _assumed(m) else {})} for m in run.models]},
        }],
    }


# ---------------------------------------------------------------------------------------------
# trace.html


@dataclass
class Picture:
    finding: Finding
    baseline: Any
    distributed: Any
    steps: list[dict[str, Any]]


def trace_html(run: Run, findings: Sequence[Finding], ctx: Ctx, workspace: str | None = None) -> str:
    """One self-contained page: the table of models, then per divergence the two graphs side by
    side with the frontier marked, its bijections and the relation trace of the output. Each
    node is labelled with its module path, file:line and code where a source map names them
    (the code read from ``workspace``, the checked-out repository)."""
    from .explain import Sources
    from .graphview import panels

    sources = Sources(workspace)
    pictures = []
    findings = [f for f in findings if not f.config]  # a configuration error has no programs to draw
    for f in findings[:MAX_PICTURES]:
        model = next(m for m in run.models if m.name == f.model)
        arts = {**model.artifacts}
        steps = [s for t in f.traces for s in t.get("steps", [])]
        b = _artifact(run, arts, ("baseline_hlo", "baseline"))
        d = _artifact(run, arts, ("distributed_hlo", "distributed"))
        bmap = _artifact(run, arts, ("baseline_sourcemap",))
        if bmap is None and b is not None and (b.parent / "baseline.sourcemap.json").is_file():
            bmap = b.parent / "baseline.sourcemap.json"  # the front end writes it beside the HLO
        labels = {"distributed": _labeler(run, _artifact(run, arts, ("sourcemap",)), sources, workspace), "baseline": _labeler(run, bmap, sources, workspace)}
        bp, dp = panels(b, d, f.divergence, steps, labels)
        pictures.append(Picture(f, bp, dp, steps))
    css = resources.files("shardproof.templates").joinpath("trace.css").read_text()
    return _render("trace.html.j2", run=run, pictures=pictures, ctx=ctx, css=css, headline=headline(run), omitted=max(0, len(findings) - MAX_PICTURES))


@cache
def _sourcemap(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()).get("instructions", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


def _labeler(run: Run, path: Path | None, sources: Any, workspace: str | None) -> Callable[[str], tuple[str, str]] | None:
    """Instruction name -> ("module · file:line", code on that line) from one source map."""
    if path is None:
        return None
    from .explain import call_text, strip_comment
    from .findings import repo_path

    entries = _sourcemap(path)

    def label(name: str) -> tuple[str, str]:
        entry = entries.get(name)
        if not isinstance(entry, dict):
            return "", ""
        frames = [f for f in entry.get("frames") or [] if isinstance(f, dict)]
        module = str(entry.get("module") or "")
        if not frames:
            return module, ""
        file, line = str(frames[0].get("file") or ""), int(frames[0].get("line") or 0)
        rp = repo_path(file, run.repository_root, workspace)
        where = " · ".join(x for x in (module, f"{file.rsplit('/', 1)[-1]}:{line}" if line else "") if x)
        text = (call_text(sources, rp, line) or strip_comment(sources.line(rp, line) or "")) if rp and line else ""
        return where, text

    return label


def _artifact(run: Run, arts: dict[str, str], keys: tuple[str, ...]) -> Path | None:
    for k in keys:
        if arts.get(k):
            p = resolve_artifact(run, arts[k])
            if p is not None:
                return p
    return None
