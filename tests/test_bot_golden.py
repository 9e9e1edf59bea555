"""Golden renderings of the frozen fixture: review body, one inline comment, the sticky summary,
the check-run text, SARIF and trace.html. A change to a template shows up here as a diff to
read; accept it with ``SHARDPROOF_UPDATE_GOLDEN=1 python -m pytest tests/test_bot_golden.py``
(then look at the PNGs: ``python tests/render_png.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardproof.bot import render
from shardproof.bot.diff import DiffIndex
from shardproof.bot.findings import collect, load_run_file, place

GOLDEN = Path(__file__).parent / "golden"
SHA = "0123456789abcdef0123456789abcdef01234567"


def renderings() -> dict[str, str]:
    run = load_run_file(GOLDEN / "fixture" / "result.json")
    findings = collect(run)
    # The pull request adds the line of the missing all-reduce; the other bugs are elsewhere.
    src = next(f.source for f in findings if f.model == "bug_missing_allreduce")
    assert src is not None
    hunk = "\n".join([f"@@ -{src.line - 2},4 +{src.line - 2},5 @@", " a", " b", "+    out = x + y", " c", " d"])
    diff = DiffIndex.from_entries([{"filename": src.path, "status": "modified", "patch": hunk}])
    placement = place(findings, diff, "added", 30)
    ctx = render.Ctx(repo="acme/models", sha=SHA, server_url="https://github.com", run_url="https://github.com/acme/models/actions/runs/1", state="error", fail_on="diverged")
    resolved = [{"text": "attention_tp4 tests/pairs/models.py:180 %multiply.40: this multiply computes a different constant", "url": "https://github.com/acme/models/pull/7#discussion_r1"}]
    check = render.check_output(run, findings, ctx)
    return {
        "review.md": render.review_body(run, placement, ctx, "golden"),
        "inline.md": render.inline_comment(placement.inline[0], ctx),
        "summary.md": render.summary_body(run, findings, ctx, resolved),
        "check.md": f"# {check['title']}\n\n{check['summary']}\n---\n\n{check['text']}",
        "report.sarif": json.dumps(render.sarif(run, findings, ctx, "0.1.0"), indent=2) + "\n",
        "trace.html": render.trace_html(run, findings, ctx),
    }


RENDERED = renderings()


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_golden(name: str) -> None:
    path = GOLDEN / name
    if os.environ.get("SHARDPROOF_UPDATE_GOLDEN"):
        path.write_text(RENDERED[name])
    assert path.exists(), f"missing golden {path.name}: run with SHARDPROOF_UPDATE_GOLDEN=1"
    assert RENDERED[name] == path.read_text(), f"{name} changed: diff it against {path}, then update the golden"


def test_goldens_hold_no_machine_paths() -> None:
    for name, text in RENDERED.items():
        assert "/work/" not in text and "/tmp/" not in text and "/home/" not in text, name


def test_the_review_says_what_the_issue_asks_for() -> None:
    review, inline, summary = RENDERED["review.md"], RENDERED["inline.md"], RENDERED["summary.md"]
    # Inline: what diverged, the cause, the baseline counterpart, bijection, collapsible trace.
    for part in ("has no relation to the baseline", "**Cause:**", "**Should match in the baseline:**", "**Inferred bijection", "<details><summary>Relation trace of output 0"):
        assert part in inline
    # Body: the findings outside the diff with links at the head commit, the undecided models.
    assert review.count(f"/blob/{SHA}/tests/pairs/models.py#L") == 2
    assert "llama_tp8" in review and "MegaBlocksGMM" in review
    # Summary: the per-model table and the resolved finding.
    assert "| `moe_experts` | ⚠️ unsupported |" in summary and "Resolved since the last run (1)" in summary
