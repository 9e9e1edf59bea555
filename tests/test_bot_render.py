"""Rendering: GitHub's size limits, escaping of untrusted text, SARIF, workflow commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import bot_support as bs
import pytest

from shardproof.bot import render
from shardproof.bot.diff import DiffIndex
from shardproof.bot.findings import collect, load_run, place
from shardproof.bot.secrets import Redactor

CTX = render.Ctx(repo="acme/models", sha="1" * 40, server_url="https://github.test")


def _huge_run() -> tuple:
    """One model, 400 divergences, each with a 300-step trace: far over every limit."""
    m = bs.model("bug_missing_allreduce")
    d0 = m["result"]["divergences"][0]
    steps = m["result"]["trace"][0]["steps"]
    m["result"]["trace"] = [{"output": 0, "steps": (steps * 10)[:300]}]
    m["result"]["divergences"] = [dict(d0, instruction=f"%add.{k}", source={"file": "src/m.py", "line": k + 1, "function": "f"}) for k in range(400)]
    m["artifacts"] = {}
    run = load_run(bs.run_doc(m), Path())
    return run, collect(run)


def test_every_body_fits_github_limits_and_keeps_its_markers() -> None:
    run, fs = _huge_run()
    placement = place(fs, None, "nofilter", 30)
    review = render.review_body(run, placement, CTX, "nonce1")
    summary = render.summary_body(run, fs, CTX, [{"text": "x" * 300, "url": None}] * 80, "nonce2")
    out = render.check_output(run, fs, CTX)
    inline = render.inline_comment(fs[:1], CTX)
    for body, limit in ((review, 65536), (summary, 65536), (out["summary"], 65535), (out["text"], 65535), (inline, 65536)):
        assert len(body.encode()) <= limit
    assert review.startswith("<!-- shardproof:review nonce=nonce1 fps=")
    assert summary.startswith(render.MARK_SUMMARY.format(context="shardproof"))
    assert len(render.read_state(summary)["findings"]) == render.STATE_ENTRIES  # the state survives the cut
    assert "…and" in review  # said what was left out, and where the rest is
    assert "Relation trace of output 0" in inline and "earlier steps left out" in inline


def test_truncation_closes_what_it_opened() -> None:
    text = "<!-- m -->\n" + "<details><summary>s</summary>\n\n```text\n" + "line\n" * 20000
    cut = render.truncate(text, 5000)
    assert len(cut.encode()) <= 5000 and cut.startswith("<!-- m -->")
    assert cut.count("```") % 2 == 0 and cut.count("<details") == cut.count("</details>")


def test_status_description_and_annotation_limits() -> None:
    run = load_run({"error": "x" * 500, "models": []})
    assert len(render.status_description(run, "error", CTX)) <= 140


def test_untrusted_text_cannot_forge_markers_break_tables_or_mention() -> None:
    m = bs.model("bug_missing_allreduce")
    d = m["result"]["divergences"][0]
    d["source"] = {"file": "src/evil|name.py", "line": 3, "function": "<!-- shardproof:summary context=shardproof --> @maintainer"}
    d["cause"] = "see [here](http://evil) | <img src=x> `tick` <!-- shardproof:finding fp=deadbeef models=x -->"
    m["artifacts"] = {}
    run = load_run(bs.run_doc(m), Path())
    fs = collect(run)
    placement = place(fs, DiffIndex(), "added", 30)
    bodies = [render.review_body(run, placement, CTX, "n"), render.summary_body(run, fs, CTX, []), render.inline_comment(fs, CTX)]
    for b in bodies:
        # Outside code spans (where GitHub renders text literally) nothing may be live markup.
        prose = re.sub(r"(`+)(?:(?!\1).)*?\1", "", b.split("\n", 3)[-1])
        assert "<!--" not in prose and "<img" not in prose and "@maintainer" not in prose
        assert "[here](http://evil)" not in prose
    table_row = next(line for line in bodies[1].splitlines() if "evil" in line)
    assert table_row.count(" | ") + table_row.count("|\n") <= 6  # the pipe in the path is escaped
    html = render.trace_html(run, fs, CTX)
    assert "<img" not in html and "&lt;img" in html


def test_workflow_command_escaping() -> None:
    m = bs.model("bug_missing_allreduce")
    m["result"]["divergences"][0]["source"] = {"file": "dir,with:odd%chars.py", "line": 5, "function": "f"}
    m["result"]["divergences"][0]["cause"] = "line one\nline two: 100%"
    m["result"]["divergences"][0]["hint"] = None  # no hint: the message carries the verifier's cause
    m["artifacts"] = {}
    fs = collect(load_run(bs.run_doc(m), Path()))
    place(fs, None, "nofilter", 30)
    cmd = render.workflow_command(fs[0])
    assert cmd.startswith("::error file=dir%2Cwith%3Aodd%25chars.py,line=5,title=shardproof%3A bug_missing_allreduce diverges at %25add.30::")
    assert "\n" not in cmd and "line one line two: 100%25" in cmd


def test_sarif_is_valid_for_code_scanning() -> None:
    run = load_run(bs.run_doc(bs.model("bug_missing_allreduce"), bs.model("mlp_tp4"), bs.build_failed("x", "boom")), Path())
    fs = collect(run)
    place(fs, None, "nofilter", 30)
    doc = json.loads(json.dumps(render.sarif(run, fs, CTX, "0.1.0")))
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    (sarif_run,) = doc["runs"]
    assert sarif_run["tool"]["driver"]["name"] == "shardproof"
    rule_ids = {r["id"] for r in sarif_run["tool"]["driver"]["rules"]}
    (res,) = sarif_run["results"]
    path, line = bs.bug_site("bug_missing_allreduce")
    assert res["ruleId"] in rule_ids and res["level"] in ("error", "warning", "note", "none")
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": path, "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == line and not loc["artifactLocation"]["uri"].startswith("/")
    assert res["message"]["text"] and res["partialFingerprints"]["shardproofFinding/v1"] == fs[0].fingerprint
    assert res["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] > 0
    notes = sarif_run["invocations"][0]["toolExecutionNotifications"]
    assert [n["level"] for n in notes] == ["error"] and sarif_run["invocations"][0]["executionSuccessful"] is False


@pytest.mark.parametrize("secret", ["ghs_abcdefghijklmnopqrstuvwxyz0123456789", "plain-secret-value"])
def test_redactor(secret: str) -> None:
    r = Redactor(["plain-secret-value"])
    assert secret not in r(f"token={secret} and again {secret}")
    assert r("nothing here") == "nothing here"


def test_fingerprints_survive_renumbered_instructions_and_shifted_lines() -> None:
    a = bs.model("bug_missing_allreduce")
    b = bs.model("bug_missing_allreduce")
    d = b["result"]["divergences"][0]
    d["instruction"] = "%add.99"
    d["source"] = dict(d["source"], line=d["source"]["line"] + 7)
    d["cause"] = d["cause"].replace("%multiply.29", "%multiply.98")
    fa = collect(load_run(bs.run_doc(a), Path()))
    fb = collect(load_run(bs.run_doc(b), Path()))
    assert fa[0].fingerprint == fb[0].fingerprint
    c = bs.model("bug_missing_allreduce")
    c["result"]["divergences"][0]["cause"] = "something else entirely"
    assert collect(load_run(bs.run_doc(c), Path()))[0].fingerprint != fa[0].fingerprint
