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
    # The checked-out repository as the bot sees it: frozen copies of the files findings quote.
    findings = collect(run, str(GOLDEN / "fixture" / "workspace"))
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
        "trace.html": render.trace_html(run, findings, ctx, str(GOLDEN / "fixture" / "workspace")),
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


def test_each_example_bug_reads_as_code_module_cause_fix_and_witness() -> None:
    """The three example bugs (missing all-reduce, BSH layout, wrong groups) in the author's
    words: the code around the line, the cause naming the operand by its own line, a fix, the
    witness; a one-line suggestion where the fix is one (layout, literal groups), none where not."""
    run = load_run_file(GOLDEN / "fixture" / "result.json")
    by_model = {f.model: f for f in collect(run, str(GOLDEN / "fixture" / "workspace"))}
    for name in ("bug_missing_allreduce", "bug_bsh_layout", "bug_wrong_groups"):
        st = by_model[name].story
        assert st is not None and not by_model[name].is_gap, name
        assert any(f"BUG-SITE: {name}" in text for _, text in st.snippet), name
        assert st.cause and st.fix and st.witness.startswith("**confirmed**"), name
        assert st.reproduce and "--witness always" in st.reproduce
    miss = by_model["bug_missing_allreduce"].story
    assert "the output of `F.linear(...)` at `models.py:" in miss.cause and "partial sum" in miss.cause
    assert "all-reduce it (sum) over the tensor-parallel group `[[0, 1, 2, 3]]`" in miss.fix and miss.suggestion is None
    bsh = by_model["bug_bsh_layout"].story
    assert bsh.suggestion is not None and bsh.suggestion.strip().startswith("out = attn.reshape(s, b, h).permute(1, 0, 2)")
    groups = by_model["bug_wrong_groups"].story
    assert groups.suggestion is not None and "[[0, 1, 2, 3]]" in groups.suggestion and "[[0, 1], [2, 3]]" in (groups.original or "")
    # The suggestion block only where the comment sits on the line it rewrites.
    assert "```suggestion" not in RENDERED["inline.md"] and "```suggestion" not in RENDERED["review.md"]
    # The unproven model: its places are notes in the body, with the witness's count.
    gaps = [f for f in by_model.values() if f.is_gap]
    assert "### Not proven (3)" in RENDERED["review.md"] and "numerically equal on 3 random inputs at these shapes" in RENDERED["review.md"]
    assert all(f.placement == "body" for f in gaps) or not gaps


def test_unproven_passes_the_gate_unless_fail_on_unproven() -> None:
    from shardproof.bot.findings import Run, gate

    run = load_run_file(GOLDEN / "fixture" / "result.json")
    unproven = Run([m for m in run.models if m.name in ("mlp_tp4", "fused_block_pad")], base_dir=run.base_dir)
    assert unproven.overall() == "unproven"
    assert gate(unproven, "diverged") == ("success", 0) and gate(unproven, "unsupported") == ("success", 0)
    assert gate(unproven, "unproven") == ("failure", 1)
    findings = collect(unproven, str(GOLDEN / "fixture" / "workspace"))
    place(findings, None, "nofilter", 30)
    for fail_on, level in (("diverged", "note"), ("unproven", "warning")):
        ctx = render.Ctx(fail_on=fail_on)
        results = render.sarif(unproven, findings, ctx, "0")["runs"][0]["results"]
        assert results and {r["level"] for r in results} == {level} and {r["ruleId"] for r in results} == {"shardproof/unproven"}
        assert {render.annotation(f, fail_on)["annotation_level"] for f in findings} == {"notice" if level == "note" else "warning"}
    errored = Run([m for m in run.models if m.name in ("mlp_tp4", "train_step_tp4")])
    assert gate(errored, "never")[0] == "error" and "not in this pull request" in render.headline(errored)


def test_a_suggestion_block_only_on_the_line_it_rewrites() -> None:
    """Inline on the BSH layout line: a ```suggestion with the reshape the bijection determines,
    in the author's own names; inline on the missing all-reduce: none (no one-line change)."""
    run = load_run_file(GOLDEN / "fixture" / "result.json")
    findings = [f for f in collect(run, str(GOLDEN / "fixture" / "workspace")) if f.model in ("bug_bsh_layout", "bug_missing_allreduce")]
    lines = sorted({f.source.line for f in findings if f.source})
    hunks = "\n".join(f"@@ -{n - 1},3 +{n - 1},3 @@\n a\n-old\n+new\n c" for n in lines)
    diff = DiffIndex.from_entries([{"filename": "tests/pairs/models.py", "status": "modified", "patch": hunks}])
    placement = place(findings, diff, "added", 30)
    ctx = render.Ctx(repo="acme/models", sha=SHA, server_url="https://github.com")
    bodies = {g[0].model: render.inline_comment(g, ctx) for g in placement.inline}
    assert set(bodies) == {"bug_bsh_layout", "bug_missing_allreduce"}
    assert "```suggestion\n        out = attn.reshape(s, b, h).permute(1, 0, 2)  # BUG-SITE: bug_bsh_layout\n```" in bodies["bug_bsh_layout"]
    assert "```suggestion" not in bodies["bug_missing_allreduce"]


def test_a_bad_input_model_is_a_configuration_error_at_its_line() -> None:
    """A model whose ``entry:`` the runner cannot resolve (status ``bad-input``, exit 3) is the
    pull request's configuration error: status failure, and every report names the line."""
    from shardproof.bot.findings import gate, load_run

    error = ".shardproof.yml:7: models[2].entry: cannot import 'no_such_module' for entry 'no_such_module:mlp': ModuleNotFoundError"
    run = load_run({"models": [{"name": "ok", "status": "verified", "result": {"verdict": "verified"}}, {"name": "broken_entry", "status": "bad-input", "build": {"error": error}}]})
    assert [m.status for m in run.models] == ["verified", "bad-input"] and run.overall() == "bad-input"
    assert gate(run, "diverged") == ("failure", 1)
    ctx = render.Ctx(repo="acme/models", sha=SHA, server_url="https://github.com", state="failure", fail_on="diverged")
    summary = render.summary_body(run, [], ctx, [])
    assert "**configuration error** at [`.shardproof.yml:7`](https://github.com/acme/models/blob/" + SHA + "/.shardproof.yml#L7)" in summary, summary
    assert "models[2].entry: cannot import 'no_such_module'" in summary and "could not be built" not in summary
    assert render.check_output(run, [], ctx)["title"].startswith("configuration error")
    assert render.status_description(run, "failure", ctx).startswith("configuration error")
    note = render.sarif(run, [], ctx, "0")["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert [n["level"] for n in note] == ["error"] and "configuration error" in note[0]["message"]["text"]


def test_numeric_note_shows_where_the_numeric_check_could_not_run() -> None:
    run = load_run_file(GOLDEN / "fixture" / "result.json")
    model = next(m for m in run.models if (m.result or {}).get("divergences"))
    d = model.result["divergences"][0]  # type: ignore[index]
    d["numeric"], d["numeric_note"] = None, "not checked: relation unknown (%dot.3 has no relation)"
    findings = collect(run, str(GOLDEN / "fixture" / "workspace"))
    place(findings, None, "nofilter", 30)
    text = render.check_output(run, findings, render.Ctx())["text"]
    assert "**Executed at this instruction:** not checked: relation unknown" in text, text


def test_rounding_seeds_say_how_the_witness_rechecked() -> None:
    from shardproof.bot.explain import witness_line

    line, _ = witness_line({"status": "equal", "trials": 3, "seeds": [0, 1, 2], "rounding_seeds": [1]}, [0], False)
    assert "equal up to rounding on 3 random inputs" in line and "f32 in f64 with every written rounding kept" in line
    assert "bf16/f16 sums within the baseline's own reordering noise" in line and "recomputed in f64" not in line
