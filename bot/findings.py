"""From a run's result document to findings, and from findings to where they are reported.

The bot does no analysis: a finding is one divergence the verifier reported, with the source
frames it names. This module decides only *where* each one is shown — as an inline comment on a
changed line, as a line annotation, or in the review body — following a reviewdog-style filter.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .diff import FILTER_MODES, DiffIndex

# error: the verifier crashed; bad-input: the model's .shardproof.yml entry is wrong (runner exit 3)
# rank-specific: an int-rank model whose ranks' programs differ other than by rank arithmetic
# (frontend/torchdist/lift.py): a finding as blocking as a divergence.
STATUSES = ("verified", "diverged", "rank-specific", "unproven", "unsupported", "inconclusive", "build-failed", "bad-input", "error")
BLOCKING = ("diverged", "rank-specific")  # verdicts whose findings request changes
# What fails the gate, from the least to the most strict: diverged (a divergence, a bad-input
# configuration, or an error);
# unsupported (also a model the rules cannot decide: unsupported / inconclusive); unproven (every
# model not verified, including those the witness found numerically equal); never.
FAIL_ON = ("diverged", "unsupported", "unproven", "never")
UNDECIDED = ("unsupported", "inconclusive")


@dataclass(frozen=True)
class Frame:
    path: str  # repository-relative, posix
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


# "<path>:<line>: <message>" (engine/frontend/build.py DeclarationError, located by the config).
_CONFIG_AT = re.compile(r"^(?P<path>[^\s:][^:]*):(?P<line>\d+): (?P<message>.*)$")


@dataclass
class Model:
    """One declared model of the run, as the front end reported it."""

    name: str
    status: str
    seconds: float | None = None
    build: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    rank_specific: list[dict[str, Any]] = field(default_factory=list)  # the runner's lift findings

    @property
    def outputs_ok(self) -> tuple[int, int]:
        outs = (self.result or {}).get("outputs") or []
        return sum(1 for o in outs if o.get("ok")), len(outs)

    @property
    def config_error(self) -> tuple[Frame | None, str]:
        """Where a ``bad-input`` model's configuration is wrong and why: the runner writes
        ``<config>:<line>: <message>`` as the first line of its build error."""
        text = str(self.build.get("error") or "")
        first, _, rest = text.partition("\n")
        m = _CONFIG_AT.match(first)
        if m is None:
            return None, text.strip() or "the model's configuration entry is wrong"
        message = (m["message"] + ("\n" + rest if rest.strip() else "")).strip()
        return Frame(m["path"], int(m["line"])), message

    @property
    def reason(self) -> str:
        if self.status == "bad-input":
            return str(self.build.get("error") or "the model's configuration entry is wrong")
        if self.status == "build-failed":
            return str(self.build.get("error") or "the model could not be built")
        if self.status == "error" and self.error is not None:
            e = self.error
            where = " ".join(x for x in (str(e.get("phase") or ""), str(e.get("where") or "")) if x)
            return (f"{where}: " if where else "") + str(e.get("message") or "internal error")
        return str((self.result or {}).get("reason") or "")

    @property
    def error(self) -> dict[str, Any] | None:
        e = (self.result or {}).get("error")
        return e if isinstance(e, dict) else None

    @property
    def witness(self) -> dict[str, Any] | None:
        w = (self.result or {}).get("witness")
        return w if isinstance(w, dict) else None


@dataclass
class Finding:
    model: str
    divergence: dict[str, Any]
    frames: list[Frame]  # innermost first; empty when the source is unknown or outside the repo
    traces: list[dict[str, Any]]  # the result's trace entries for the outputs this feeds
    expected: dict[int, dict[str, Any]]  # output index -> the result's outputs[] entry
    bijections: list[dict[str, Any]]
    fingerprint: str = ""
    witness: dict[str, Any] | None = None  # the model's numeric witness (result["witness"])
    bijections_all: list[dict[str, Any]] = field(default_factory=list)  # every bijection of the model
    status: str = ""  # the model's verdict
    story: Any = None  # explain.Story: the finding in the author's words (set by collect)
    anchor: Frame | None = None  # where an inline comment goes (a commentable line)
    annotate: Frame | None = None  # where a line annotation goes (passes the filter)
    placement: str = "body"  # inline | body
    why: str = ""  # why it is where it is: a code that templates/messages.j2 puts in words
    why_arg: str = ""
    comment_url: str | None = None  # an existing inline comment carrying it
    # Lines that may have caused it besides ``frames`` (the frontier's): the cause operand's
    # producing call and its callers, then the relation trace's lines, most causal first.
    causes: list[Frame] = field(default_factory=list)
    trace_lines: list[Frame] = field(default_factory=list)
    side: str = "RIGHT"  # LEFT: the anchor is a removed line (old-side number)
    deleted: list[tuple[int, str]] = field(default_factory=list)  # removed lines quoted at the anchor
    on_change: bool = False  # the anchor is a line this pull request changed (added or removed)
    config: bool = False  # a configuration error of .shardproof.yml, not a divergence

    @property
    def source(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    @property
    def instruction(self) -> str:
        return str(self.divergence.get("instruction", ""))

    @property
    def cause(self) -> str:
        return str(self.divergence.get("cause", ""))

    @property
    def is_gap(self) -> bool:
        """Where the rules stopped but the values agree numerically (an unproven model), not a
        divergence: reported as a note, never as a failing line."""
        kind = self.divergence.get("kind")
        return kind == "rule-gap" if kind else self.status == "unproven"

    @property
    def verdict_class(self) -> str:
        """What kind of claim the finding makes; part of its fingerprint, so a divergence that
        turns into a rule gap (or back) is a new finding and the old one is resolved."""
        return "config" if self.config else "gap" if self.is_gap else "rank-specific" if self.divergence.get("kind") == "rank-specific" else "divergence"


@dataclass
class Run:
    """A whole run: the models and where their files live."""

    models: list[Model]
    config: str = ""
    repository_root: str = "."
    base_dir: Path = field(default_factory=Path)  # directory of result.json; artifacts resolve here
    error: str | None = None  # the runner itself failed
    # The configuration could not be read ("<file>:<line>: <message>" each): the pull request's
    # .shardproof.yml is to blame, not shardproof; no model ran.
    config_errors: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        c = dict.fromkeys(STATUSES, 0)
        for m in self.models:
            c[m.status] = c.get(m.status, 0) + 1
        return c

    def overall(self) -> str:
        """The run in one word: error beats bad-input beats diverged beats unsupported beats
        verified. A model whose verifier crashed (status ``error``) is an error of the tool, never
        a pass; a ``bad-input`` model is the configuration's fault, so the pull request's."""
        c = self.counts
        if self.config_errors and not self.error:
            return "bad-input"
        if self.error or c["build-failed"] or c["error"]:
            return "error"
        if c["bad-input"]:
            return "bad-input"
        if c["rank-specific"]:
            return "rank-specific"
        if c["diverged"]:
            return "diverged"
        if c["unsupported"] or c["inconclusive"]:
            return "unsupported"
        # Unproven after unsupported: an unproven model was at least executed and found equal.
        if c["unproven"]:
            return "unproven"
        return "verified" if self.models else "error"


def load_run(doc: dict[str, Any], base_dir: Path | None = None) -> Run:
    """Read the runner's result document; a bare ``shardproof check --json`` result also works."""
    if "models" not in doc and "verdict" in doc:
        name = Path(str((doc.get("inputs") or {}).get("distributed", "model"))).parent.name or "model"
        doc = {"version": 1, "config": "", "models": [{"name": name, "status": doc["verdict"], "result": doc, "artifacts": dict(doc.get("inputs") or {})}]}
    models = []
    for m in doc.get("models") or []:
        status = str(m.get("status") or (m.get("result") or {}).get("verdict") or "build-failed")
        if status not in STATUSES:
            status = "build-failed" if m.get("result") is None else str(m["result"].get("verdict"))
        ranks = [x for x in m.get("rank_specific") or [] if isinstance(x, dict)]
        models.append(Model(str(m.get("name", "?")), status, m.get("seconds"), dict(m.get("build") or {}), m.get("result"), {str(k): str(v) for k, v in (m.get("artifacts") or {}).items() if v is not None}, ranks))
    return Run(models, str(doc.get("config", "")), str(doc.get("repository_root", ".")), base_dir or Path(), doc.get("error"), [str(x) for x in doc.get("config_errors") or []])


def load_run_file(path: Path) -> Run:
    return load_run(json.loads(path.read_text()), path.parent)


def repo_path(file: str, repository_root: str = ".", workspace: str | None = None) -> str | None:
    """A source file as a repository-relative posix path, or None when it lies outside the repo."""
    if not file:
        return None
    p = file.replace("\\", "/")
    if p.startswith("/"):
        if not workspace:
            return None
        ws = workspace.replace("\\", "/").rstrip("/") + "/"
        if not p.startswith(ws):
            return None
        p = p[len(ws):]
    else:
        p = posixpath.join(repository_root.replace("\\", "/"), p)
    p = posixpath.normpath(p)
    if p.startswith("../") or p == ".." or p == ".":
        return None
    return p


def resolve_artifact(run: Run, path: str) -> Path | None:
    """Artifacts are named relative to result.json's directory or to the repository root.

    A result file may come from an untrusted workflow (the fork split), so a path that leaves
    those directories is ignored rather than read.
    """
    p = Path(path)
    for base in (run.base_dir, Path(run.repository_root), Path()):
        cand = (p if p.is_absolute() else base / p).resolve()
        if any(cand.is_relative_to(root.resolve()) for root in (run.base_dir, Path())) and cand.is_file():
            return cand
    return None


def _sourcemap_frames(run: Run, model: Model, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
    path = model.artifacts.get("sourcemap")
    if not path:
        return {}
    if path not in cache:
        resolved = resolve_artifact(run, path)
        try:
            cache[path] = json.loads(resolved.read_text()).get("instructions", {}) if resolved else {}
        except (OSError, ValueError, AttributeError):
            cache[path] = {}
    return cache[path]


_NAME = re.compile(r"%[\w.\-]+")


def _fingerprint_key(model: str, d: dict[str, Any], frame: Frame | None, verdict_class: str) -> str:
    # Instruction names renumber whenever the HLO changes, and line numbers shift with unrelated
    # edits above; neither may make a finding look new. File, function, opcode, the cause in
    # words (names elided) and the kind of claim (divergence, rule gap, ...) identify it.
    cause = _NAME.sub("%", str(d.get("cause", "")))
    where = f"{frame.path}\0{frame.function}" if frame else "\0"
    return "\0".join((model, where, str(d.get("opcode", "")), cause, verdict_class))


_AT = re.compile(r"^(?P<path>.+):(?P<line>\d+)(?: \(.*\))?$")


def _frame_of(text: str, repo: Any) -> Frame | None:
    """A relation-trace or lift ``source`` string (``path:line``) as a repository frame."""
    m = _AT.match(text or "")
    p = repo(m["path"]) if m else None
    return Frame(p, int(m["line"])) if p and m and int(m["line"]) > 0 else None


def _cause_frames(d: dict[str, Any], own: list[Frame], frames_of: Any, repo: Any) -> list[Frame]:
    """The lines that may have caused a divergence besides the frontier's own frames, most
    causal first: for a missing reduction, the call that made the unreduced operand (and its
    callers: ``out = self.fc2(h)`` is where the all-reduce was dropped); otherwise the operands'
    producing calls after the frontier (a wrong group literal, a reshape, an extra all-reduce
    are on the frontier's own line)."""
    hint = d.get("hint") if isinstance(d.get("hint"), dict) else {}
    ops = [o for o in d.get("operands") or [] if isinstance(o, dict)]
    if hint.get("kind") == "missing-reduction":
        ops.sort(key=lambda o: o.get("instruction") != hint.get("operand"))
    out: list[Frame] = []
    for o in ops:
        for info in (o.get("origin"), o):
            if not isinstance(info, dict) or info.get("opcode") in ("parameter", "constant"):
                continue  # a parameter's line is its def line: nothing there computes it
            out += [Frame(p, n) for p, n in frames_of(str(info.get("instruction") or "").lstrip("%"))]
            src = info.get("source") if isinstance(info.get("source"), dict) else {}
            p = repo(str(src.get("file") or ""))
            if p and int(src.get("line") or 0) > 0:
                out.append(Frame(p, int(src["line"]), str(src.get("function") or "")))
    known = {(f.path, f.line) for f in own}
    return [f for f in _dedup(out) if (f.path, f.line) not in known]


def collect(run: Run, workspace: str | None = None) -> list[Finding]:
    """Every divergence of every model, in a stable order, fingerprinted, told in the author's
    words (the code comes from the checked-out workspace)."""
    from .explain import Sources, tell

    findings: list[Finding] = []
    maps: dict[str, dict[str, Any]] = {}
    sources = Sources(workspace)

    def repo(file: str) -> str | None:
        return repo_path(file, run.repository_root, workspace)

    for bad in run.config_errors:
        findings.append(_config_finding(bad, repo))
    for model in run.models:
        res = model.result or {}
        traces = {t.get("output"): t for t in res.get("trace") or []}
        outputs = {o.get("index"): o for o in res.get("outputs") or []}

        def frames_of(name: str, model: Model = model) -> list[tuple[str, int]]:
            entry = _sourcemap_frames(run, model, maps).get(name)
            out = []
            for fr in (entry or {}).get("frames", []) if isinstance(entry, dict) else []:
                fp = repo(str(fr.get("file") or ""))
                if fp and int(fr.get("line") or 0) > 0:
                    out.append((fp, int(fr["line"])))
            return out

        if model.status == "bad-input":
            at, why = model.config_error
            if at is not None:
                findings.append(_config_finding(f"{at.path}:{at.line}: {why}", repo, model.name))
        divergences = [d for d in res.get("divergences") or [] if isinstance(d, dict)]
        for r in model.rank_specific:
            where = _frame_of(str(r.get("where") or ""), repo)
            divergences.append({"instruction": str(r.get("instruction") or ""), "opcode": "rank-specific", "kind": "rank-specific", "cause": str(r.get("message") or "the ranks' programs differ"),
                                "source": {"file": where.path, "line": where.line} if where else {}, "outputs": [], "ranks": r.get("ranks")})
        for d in divergences:
            frames: list[Frame] = []
            src = d.get("source") or {}
            p = repo(str(src.get("file") or ""))
            if p and int(src.get("line") or 0) > 0:
                frames.append(Frame(p, int(src["line"]), str(src.get("function") or "")))
            entry = _sourcemap_frames(run, model, maps).get(str(d.get("instruction", "")).lstrip("%"))
            for f in (entry or {}).get("frames", []) if isinstance(entry, dict) else []:
                fp = repo(str(f.get("file") or ""))
                fr = Frame(fp, int(f.get("line") or 0), str(f.get("function") or "")) if fp else None
                if fr and fr.line > 0 and all((fr.path, fr.line) != (x.path, x.line) for x in frames):
                    frames.append(fr)
            feeds = [int(i) for i in d.get("outputs") or []]
            names = {d.get("instruction")} | {o.get("instruction") for o in d.get("operands") or []}
            mine = [traces[i] for i in feeds if i in traces]
            causes = _cause_frames(d, frames, frames_of, repo)
            known = {(x.path, x.line) for x in [*frames, *causes]}
            trace_lines: list[Frame] = []
            for t in mine:
                # Nearest the frontier first: the trace runs from the inputs to the output.
                for step in reversed(t.get("steps") or []):
                    fr = _frame_of(str(step.get("source") or ""), repo)
                    if fr and (fr.path, fr.line) not in known:
                        known.add((fr.path, fr.line))
                        trace_lines.append(fr)
            findings.append(Finding(
                model=model.name,
                divergence=d,
                frames=frames,
                traces=mine,
                expected={i: outputs[i] for i in feeds if i in outputs},
                bijections=[b for b in res.get("bijections") or [] if b.get("distributed") in names],
                witness=model.witness,
                bijections_all=list(res.get("bijections") or []),
                status=model.status,
                causes=causes,
                trace_lines=trace_lines,
            ))
            f = findings[-1]
            try:
                f.story = tell(f, sources, frames_of, repo)
            except Exception:  # a finding without its story still reports its divergence (the tests require stories)
                f.story = None
    seen: dict[str, int] = {}
    for f in sorted(findings, key=lambda f: (f.model, str(f.source or ""), f.source.line if f.source else 0, f.instruction)):
        key = _fingerprint_key(f.model, f.divergence, f.source, f.verdict_class)
        k = seen[key] = seen.get(key, -1) + 1
        f.fingerprint = hashlib.sha256(f"{key}\0{k}".encode()).hexdigest()[:16]
    return findings


def _config_finding(text: str, repo: Any, model: str = "") -> Finding:
    """A located configuration error (``<file>:<line>: <message>``) as a finding on that line."""
    from .explain import Story

    first, _, rest = text.partition("\n")
    m = _CONFIG_AT.match(first)
    frame = None
    message = text.strip()
    if m is not None:
        p = repo(m["path"])
        frame = Frame(p, int(m["line"])) if p else None
        message = (m["message"] + ("\n" + rest if rest.strip() else "")).strip()
    d = {"instruction": "", "opcode": "configuration", "kind": "configuration", "cause": message, "outputs": []}
    f = Finding(model or (frame.path if frame else "configuration"), d, [frame] if frame else [], [], {}, [], status="bad-input", config=True)
    f.story = Story(cause=message, fix="correct this line of the configuration; the models were not run.")
    return f


@dataclass
class Placement:
    inline: list[list[Finding]]  # groups, one inline comment per commentable line
    body: list[Finding]  # everything that is not inline in this review
    annotations: list[Finding]  # findings with a line annotation (check run / workflow command)
    already: list[Finding]  # inline comments from an earlier run still carry these


def place(findings: Sequence[Finding], diff: DiffIndex | None, mode: str, max_inline: int, existing: Iterable[str] = (), existing_urls: dict[str, str] | None = None) -> Placement:
    """Decide where each finding is reported. Never loses one: what is not inline is in the body.

    An inline anchor must (1) pass the filter mode and (2) be a line of the diff — a review with
    any other anchor is rejected whole. Among the lines a finding knows (the frontier's frames,
    the cause operand's producing call and its callers, the relation trace's lines) the comment
    goes on the one this pull request changed: that edit is the cause. A cause that was deleted
    outright (an all-reduce line removed) gets the comment on the removed line (the diff's LEFT
    side). Only when no known line changed does a context line the filter admits carry it.
    """
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter mode {mode!r} (one of {', '.join(FILTER_MODES)})")
    existing = set(existing)
    urls = existing_urls or {}
    groups: dict[tuple[str, str, int], list[Finding]] = {}
    body: list[Finding] = []
    annotations: list[Finding] = []
    already: list[Finding] = []
    for f in findings:
        f.anchor = f.annotate = None
        f.side, f.deleted, f.on_change = "RIGHT", [], False
        f.comment_url = urls.get(f.fingerprint)
        if not f.frames:
            f.placement, f.why = "body", "no_source"
            body.append(f)
            continue
        if f.is_gap:
            # Where the rules stopped on a numerically equal program: a note in the body and a
            # notice annotation, never a change request on a line.
            f.annotate = f.frames[0] if diff is None else next((fr for fr in f.frames if diff.passes(fr.path, fr.line, mode)), None)
            if f.annotate:
                annotations.append(f)
            f.placement, f.why = "body", "gap"
            body.append(f)
            continue
        if diff is None:
            # No diff (push, or the file list could not be read): nothing is inline, and line
            # annotations fall back to the innermost frame so no finding goes unlocated.
            f.annotate = f.frames[0]
            annotations.append(f)
            f.placement, f.why = "body", "no_diff"
            body.append(f)
            continue
        core = _dedup([*f.frames, *f.causes])
        known = _dedup([*core, *f.trace_lines])
        changed = next((fr for fr in known if diff.changed(fr.path, fr.line)), None)
        if changed is not None:
            f.anchor, f.on_change = changed, True
        elif (gone := _deleted_cause(core, diff)) is not None:
            f.anchor, f.side, f.deleted, f.on_change = gone[0], "LEFT", gone[1], True
        else:
            f.anchor = next((fr for fr in f.frames if diff.passes(fr.path, fr.line, mode) and diff.commentable(fr.path, fr.line)), None)
        # The line annotation (new-side lines only) on the anchor, else the first line that passes.
        f.annotate = f.anchor if f.anchor and f.side == "RIGHT" else next((fr for fr in core if diff.passes(fr.path, fr.line, mode)), None)
        if f.annotate:
            annotations.append(f)
        if f.anchor is None:
            f.placement = "body"
            f.why = _why_not_inline(f, diff, mode)
            body.append(f)
            continue
        if f.fingerprint in existing:
            f.placement, f.why = "inline", "already"
            already.append(f)
            continue
        groups.setdefault((f.anchor.path, f.side, f.anchor.line), []).append(f)
    inline: list[list[Finding]] = []
    for key in sorted(groups):
        if len(inline) < max_inline:
            for f in groups[key]:
                f.placement, f.why = "inline", ""
            inline.append(groups[key])
        else:
            for f in groups[key]:
                f.anchor, f.side, f.deleted, f.on_change = None, "RIGHT", [], False
                f.placement, f.why, f.why_arg = "body", "over_limit", str(max_inline)
                body.append(f)
    return Placement(inline, body, annotations, already)


def _dedup(frames: Iterable[Frame]) -> list[Frame]:
    seen: set[tuple[str, int]] = set()
    out = []
    for fr in frames:
        if (fr.path, fr.line) not in seen:
            seen.add((fr.path, fr.line))
            out.append(fr)
    return out


# Calls whose removal is what a missing or wrong reduction most often is.
_COLLECTIVE = re.compile(r"all_reduce|allreduce|all_gather|reduce_scatter|all_to_all|psum|pmean|ppermute|permute|reduce_from|gather_from|scatter_to|copy_to")
SAME_BLOCK = 40  # lines: a deletion between two known lines this close is between them in one function


def _deleted_cause(core: Sequence[Frame], diff: DiffIndex) -> tuple[Frame, list[tuple[int, str]]] | None:
    """A run of removed lines that sat right after or before a known line of the finding, or
    between two of them in one block (say, between the call that made a partial sum and the line
    that uses it): (the removed line to comment on, the run quoted). A run that removed a
    collective call wins over one that did not."""
    best: tuple[int, Frame, list[tuple[int, str]]] | None = None
    for order, path in enumerate(dict.fromkeys(fr.path for fr in core)):
        fd = diff.get(path)
        if fd is None or fd.status == "removed" or not fd.deleted:
            continue
        lines = sorted({fr.line for fr in core if fr.path == path})
        runs: list[list[tuple[int, int, str]]] = []
        for old, at, text in fd.deleted:
            if runs and runs[-1][-1][0] + 1 == old and runs[-1][-1][1] == at:
                runs[-1].append((old, at, text))
            else:
                runs.append([(old, at, text)])
        for run in runs:
            at = run[0][1]
            near = (at - 1) in lines or at in lines or any(a < at <= b and b - a <= SAME_BLOCK for a in lines for b in lines)
            code = [(old, text) for old, _, text in run if text.strip() and not text.strip().startswith("#")]
            if not near or not code:
                continue
            hit = next(((old, text) for old, text in code if _COLLECTIVE.search(text)), None)
            rank = (0 if hit else 1) * 1000 + order
            if best is None or rank < best[0]:
                best = (rank, Frame(path, (hit or code[0])[0]), [(old, text) for old, _, text in run][:8])
    return (best[1], best[2]) if best else None


def _why_not_inline(f: Finding, diff: DiffIndex, mode: str) -> str:
    src = f.frames[0]
    fd = diff.get(src.path)
    if fd is None:
        return "not_in_pr"
    if fd.status == "removed":
        return "file_removed"
    if not fd.has_patch:
        return "no_patch"
    if fd.commentable(src.line) and mode == "added":
        return "context_only"
    return "outside_hunks"


def move_all_to_body(placement: Placement) -> Placement:
    """The 422 fallback: the same findings, none inline."""
    body = list(placement.body)
    for group in placement.inline:
        for f in group:
            f.placement, f.why, f.anchor = "body", "refused", None
            f.side, f.deleted, f.on_change = "RIGHT", [], False
            body.append(f)
    return Placement([], body, placement.annotations, placement.already)


def gate(run: Run, fail_on: str) -> tuple[str, int]:
    """Commit-status state and exit code.

    The state is honest whatever the exit policy: ``error`` when a model (or the runner) could not
    be built or shardproof itself failed, ``failure`` when a model diverged or its configuration
    entry is bad input (the pull request's ``.shardproof.yml`` is to blame) — or is
    unsupported/inconclusive and fail-on is ``unsupported`` or ``unproven``, or is unproven and
    fail-on is ``unproven``. An unproven model alone keeps the status success by default: the
    rules stopped, but the witness found the programs numerically equal. ``fail-on`` decides the
    exit code: diverged → 1 on divergence, bad input or error; unsupported → also on unsupported /
    inconclusive; unproven → on every model that is not verified; never → 0.
    """
    if fail_on not in FAIL_ON:
        raise ValueError(f"unknown fail-on {fail_on!r} (one of {', '.join(FAIL_ON)})")
    overall = run.overall()
    c = run.counts
    undecided = any(c[s] for s in UNDECIDED)
    if overall == "error":
        state = "error"
    elif overall in ("diverged", "rank-specific", "bad-input") or (undecided and fail_on in ("unsupported", "unproven")) or (c["unproven"] and fail_on == "unproven"):
        state = "failure"
    else:
        state = "success"
    code = 0 if fail_on == "never" or state == "success" else 1
    return state, code


def relative_posix(path: Path, start: Path) -> str:
    try:
        return PurePosixPath(path.resolve().relative_to(start.resolve())).as_posix()
    except ValueError:
        return path.as_posix()
