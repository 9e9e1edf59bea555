"""Patch hunks → commentable lines, the filter modes, and where findings are placed."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardproof.bot.diff import DiffIndex, FileDiff, PatchError, file_diff, parse_patch
from shardproof.bot.findings import Finding, Frame, gate, load_run, place, repo_path


def _hunks_only(old: list[str], new: list[str], n: int) -> str:
    lines = list(difflib.unified_diff(old, new, lineterm="", n=n))
    return "\n".join(lines[2:])  # GitHub's patch field: hunks without the ---/+++ header


def test_a_simple_hunk() -> None:
    patch = "@@ -10,4 +10,5 @@ def f():\n a\n-b\n+B\n+C\n c\n d"
    added, context, hunks = parse_patch(patch)
    assert added == {11, 12}
    assert context == {10, 13, 14}
    assert hunks == ((10, 14),)


def test_counts_default_to_one_and_no_newline_markers_are_skipped() -> None:
    added, context, _ = parse_patch("@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n\\ No newline at end of file")
    assert (added, context) == ({1}, set())


def test_several_hunks_and_a_pure_deletion() -> None:
    patch = "@@ -1,2 +1,1 @@\n a\n-b\n@@ -20,3 +19,0 @@\n-x\n-y\n-z\n@@ -40,0 +39,2 @@\n+p\n+q"
    added, context, hunks = parse_patch(patch)
    assert added == {39, 40} and context == {1}
    assert hunks == ((1, 1), (19, 18), (39, 40))


@pytest.mark.parametrize("patch", [
    "no header\n+x",
    "@@ -1,1 +1,1 @@\n+a\n+b",  # more added lines than declared
    "@@ -1,2 +1,2 @@\n a",  # hunk shorter than its header
    "@@ -1,1 +1,1 @@\n?x",
])  # fmt: skip
def test_malformed_patches_are_refused(patch: str) -> None:
    with pytest.raises(PatchError):
        parse_patch(patch)


def test_renamed_removed_binary_and_broken_files() -> None:
    index = DiffIndex.from_entries([
        {"filename": "new/name.py", "previous_filename": "old/name.py", "status": "renamed", "patch": "@@ -1,1 +1,2 @@\n x\n+y"},
        {"filename": "gone.py", "status": "removed", "patch": "@@ -1,1 +0,0 @@\n-x"},
        {"filename": "weights.bin", "status": "modified"},
        {"filename": "broken.py", "status": "modified", "patch": "garbage"},
    ])  # fmt: skip
    assert index.commentable("new/name.py", 2) and index.get("new/name.py").previous_path == "old/name.py"  # type: ignore[union-attr]
    assert not index.commentable("gone.py", 1) and not index.passes("gone.py", 1, "file")
    assert index.get("weights.bin") == FileDiff("weights.bin", "modified", None, has_patch=False)
    assert index.passes("weights.bin", 5, "file") and not index.passes("weights.bin", 5, "diff_context")
    assert index.get("broken.py").has_patch is False and "broken.py" in index.problems[0]  # type: ignore[union-attr]


def test_filter_modes() -> None:
    index = DiffIndex({"a.py": file_diff({"filename": "a.py", "status": "modified", "patch": "@@ -1,3 +1,4 @@\n x\n+y\n z\n w"})})
    # line 2 added, lines 1/3/4 context, line 9 outside the hunk, b.py unchanged
    table = {(m, p, n): index.passes(p, n, m) for m in ("added", "diff_context", "file", "nofilter") for p, n in (("a.py", 2), ("a.py", 3), ("a.py", 9), ("b.py", 1))}
    assert [k for k, v in table.items() if v] == [
        ("added", "a.py", 2),
        ("diff_context", "a.py", 2), ("diff_context", "a.py", 3),
        ("file", "a.py", 2), ("file", "a.py", 3), ("file", "a.py", 9),
        ("nofilter", "a.py", 2), ("nofilter", "a.py", 3), ("nofilter", "a.py", 9), ("nofilter", "b.py", 1),
    ]  # fmt: skip


lines_st = st.lists(st.sampled_from(["a", "b", "c", "", "x = 1", "return y"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(old=lines_st, new=lines_st, n=st.integers(0, 4))
def test_hunks_agree_with_difflib(old: list[str], new: list[str], n: int) -> None:
    """Every line the parser calls added/context is that line of the new file, and the added
    ones are exactly the lines difflib inserted or replaced."""
    patch = _hunks_only(old, new, n)
    if not patch:
        return
    added, context, _ = parse_patch(patch)
    want_added = set()
    for tag, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            want_added |= set(range(j1 + 1, j2 + 1))
    assert added == want_added
    shown = [line[1:] for line in patch.splitlines() if line[:1] in " +"]
    assert [new[k - 1] for k in sorted(added | context)] == shown


def _finding(path: str, line: int, fp: str, outer: Frame | None = None) -> Finding:
    frames = [Frame(path, line, "f")] + ([outer] if outer else [])
    return Finding("m", {"instruction": "%x", "cause": "c", "opcode": "add"}, frames, [], {}, [], fingerprint=fp)


def test_placement_never_loses_a_finding_and_prefers_the_innermost_frame() -> None:
    index = DiffIndex({"a.py": file_diff({"filename": "a.py", "status": "modified", "patch": "@@ -1,3 +1,4 @@\n x\n+y\n z\n w"})})
    fs = [
        _finding("a.py", 2, "inline"),
        _finding("a.py", 3, "context"),  # context: inline only with diff_context
        _finding("lib.py", 7, "caller", outer=Frame("a.py", 2, "g")),  # reached through a changed call
        _finding("b.py", 1, "elsewhere"),
        Finding("m", {}, [], [], {}, [], fingerprint="nosource"),
        _finding("a.py", 2, "seen"),
    ]
    p = place(fs, index, "added", 30, existing={"seen"})
    assert [[f.fingerprint for f in g] for g in p.inline] == [["inline", "caller"]]
    assert fs[2].anchor == Frame("a.py", 2, "g")
    assert {f.fingerprint: f.why for f in p.body} == {"context": "context_only", "elsewhere": "not_in_pr", "nosource": "no_source"}
    assert [f.fingerprint for f in p.already] == ["seen"]
    p2 = place(fs, index, "diff_context", 30)
    assert [f.fingerprint for g in p2.inline for f in g] == ["inline", "caller", "seen", "context"]
    p3 = place(fs, index, "added", 0)
    assert p3.inline == [] and {f.fingerprint for f in p3.body} >= {"inline", "caller"}
    assert all((f.why, f.why_arg) == ("over_limit", "0") for f in p3.body if f.fingerprint in ("inline", "caller"))


def test_repo_paths() -> None:
    assert repo_path("tests/pairs/models.py") == "tests/pairs/models.py"
    assert repo_path("./a/../b.py", "sub") == "sub/b.py"
    assert repo_path("/ws/repo/m.py", ".", "/ws/repo") == "m.py"
    assert repo_path("/usr/lib/python3/torch/nn.py", ".", "/ws/repo") is None
    assert repo_path("../outside.py") is None
    assert repo_path("") is None


@pytest.mark.parametrize(("statuses", "fail_on", "want"), [
    (["verified"], "diverged", ("success", 0)),
    (["verified", "diverged"], "diverged", ("failure", 1)),
    (["verified", "diverged"], "never", ("failure", 0)),
    (["unsupported"], "diverged", ("success", 0)),
    (["inconclusive"], "unsupported", ("failure", 1)),
    (["build-failed", "verified"], "diverged", ("error", 1)),
    (["build-failed"], "never", ("error", 0)),
    (["bad-input", "verified"], "diverged", ("failure", 1)),  # the PR's .shardproof.yml is wrong, not shardproof
    (["bad-input"], "never", ("failure", 0)),
    (["bad-input", "error"], "diverged", ("error", 1)),  # a crash of the tool still wins
    ([], "diverged", ("error", 1)),  # nothing declared or the runner failed: never a pass
])  # fmt: skip
def test_gate(statuses: list[str], fail_on: str, want: tuple[str, int]) -> None:
    run = load_run({"models": [{"name": f"m{k}", "status": s, "result": {"verdict": s}} for k, s in enumerate(statuses)]})
    assert gate(run, fail_on) == want
