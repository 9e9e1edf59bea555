"""Which lines of a pull request can carry a review comment, read from the API's patch hunks.

GitHub's "list pull request files" gives, per file, a ``patch`` made only of hunks (no ``---``/
``+++`` header). A review comment with ``side: RIGHT`` may sit on any line of the new file that a
hunk shows (added or context); anything else makes GitHub reject the whole review with 422. So
every anchor is checked here before a review is posted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")

FILTER_MODES = ("added", "diff_context", "file", "nofilter")


class PatchError(ValueError):
    pass


@dataclass(frozen=True)
class FileDiff:
    path: str
    status: str  # added | removed | modified | renamed | copied | changed | unchanged
    previous_path: str | None = None
    has_patch: bool = True
    added: frozenset[int] = frozenset()
    context: frozenset[int] = frozenset()
    hunks: tuple[tuple[int, int], ...] = ()  # new-side [start, end] of each hunk
    # Removed lines: (old-side line number, the new-side line it sat before, its text). A
    # LEFT-side review comment may sit on any of them.
    deleted: tuple[tuple[int, int, str], ...] = ()
    added_text: tuple[tuple[int, str], ...] = ()  # (new-side line number, text) of added lines

    def commentable(self, line: int) -> bool:
        """A RIGHT-side review comment may sit here."""
        return line in self.added or line in self.context

    def deleted_before(self, line: int) -> list[tuple[int, str]]:
        """The removed lines that sat just before new-side ``line`` (old line number, text)."""
        return [(old, text) for old, at, text in self.deleted if at == line]


def parse_patch(patch: str) -> tuple[frozenset[int], frozenset[int], tuple[tuple[int, int], ...]]:
    """New-side line numbers of added lines, of context lines, and each hunk's new-side range."""
    added, context, hunks, _, _ = parse_patch_lines(patch)
    return added, context, hunks


def parse_patch_lines(patch: str) -> tuple[frozenset[int], frozenset[int], tuple[tuple[int, int], ...], tuple[tuple[int, int, str], ...], tuple[tuple[int, str], ...]]:
    """``parse_patch`` plus the removed lines (old number, the new-side line they sat before,
    text) and the added lines' text: a finding whose cause was deleted is anchored on it."""
    added: set[int] = set()
    deleted: list[tuple[int, int, str]] = []
    added_text: list[tuple[int, str]] = []
    old_line = 0
    context: set[int] = set()
    hunks: list[tuple[int, int]] = []
    old_left = new_left = 0
    new_line = 0
    # Lines end at "\n" only, as in git: str.splitlines() also breaks at "\r", form feeds, "\x85"
    # and U+2028, which source lines may contain, and so misread the hunk after them.
    lines = patch.split("\n")
    if lines[-1] == "":
        lines.pop()  # a patch ending in a newline has no empty last line
    for n, raw in enumerate(lines, 1):
        m = HUNK.match(raw)
        if m:
            if old_left or new_left:
                raise PatchError(f"line {n}: hunk header before the previous hunk ended")
            try:
                old_left = int(m.group(2)) if m.group(2) is not None else 1
                new_left = int(m.group(4)) if m.group(4) is not None else 1
                new_line = int(m.group(3))
                old_line = int(m.group(1))
            except ValueError as e:  # more digits than int() reads (4300)
                raise PatchError(f"line {n}: a number in the hunk header is too long") from e
            if hunks and new_line <= hunks[-1][1]:
                # Hunks come in order and apart; an overlap would make a line both added and not.
                raise PatchError(f"line {n}: hunk starts at line {new_line}, inside the previous hunk")
            # An empty new side (pure deletion) is written "+N,0" and names the line before it.
            hunks.append((new_line, new_line + new_left - 1) if new_left else (new_line, new_line - 1))
            continue
        if not hunks:
            raise PatchError(f"line {n}: text before the first hunk header")
        tag = raw[:1]
        if tag == "\\":  # "\ No newline at end of file"
            continue
        if tag == "+":
            if not new_left:
                raise PatchError(f"line {n}: more added lines than the hunk header declares")
            added.add(new_line)
            added_text.append((new_line, raw[1:]))
            new_line += 1
            new_left -= 1
        elif tag == "-":
            if not old_left:
                raise PatchError(f"line {n}: more removed lines than the hunk header declares")
            # A pure deletion's hunk header "+N,0" names the line before the gap.
            deleted.append((old_line, new_line + 1 if hunks[-1][1] < hunks[-1][0] else new_line, raw[1:]))
            old_line += 1
            old_left -= 1
        elif tag in (" ", ""):  # some tools strip the space of an empty context line
            if not old_left or not new_left:
                raise PatchError(f"line {n}: more context lines than the hunk header declares")
            context.add(new_line)
            new_line += 1
            old_line += 1
            old_left -= 1
            new_left -= 1
        else:
            raise PatchError(f"line {n}: unexpected line {raw[:20]!r}")
    if old_left or new_left:
        raise PatchError("the last hunk is shorter than its header declares")
    return frozenset(added), frozenset(context), tuple(hunks), tuple(deleted), tuple(added_text)


def file_diff(entry: Mapping[str, Any]) -> FileDiff:
    """One entry of ``GET /pulls/{n}/files`` (``filename``, ``status``, ``patch``, ``previous_filename``)."""
    path = str(entry["filename"])
    status = str(entry.get("status") or "modified")
    previous = entry.get("previous_filename")
    patch = entry.get("patch")
    if status == "removed" or not patch:
        # Removed files have no new side; large or binary files come without a patch.
        return FileDiff(path, status, previous, has_patch=bool(patch))
    added, context, hunks, deleted, added_text = parse_patch_lines(str(patch))
    return FileDiff(path, status, previous, True, added, context, hunks, deleted, added_text)


@dataclass
class DiffIndex:
    files: dict[str, FileDiff] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # files whose patch could not be read

    @classmethod
    def from_entries(cls, entries: Iterable[Mapping[str, Any]]) -> DiffIndex:
        index = cls()
        for e in entries:
            try:
                fd = file_diff(e)
            except PatchError as err:
                # One unreadable patch must not cost the other files their inline comments.
                fd = FileDiff(str(e["filename"]), str(e.get("status") or "modified"), e.get("previous_filename"), has_patch=False)
                index.problems.append(f"{fd.path}: {err}")
            index.files[fd.path] = fd
        return index

    def get(self, path: str) -> FileDiff | None:
        return self.files.get(path)

    def commentable(self, path: str, line: int) -> bool:
        fd = self.files.get(path)
        return fd is not None and fd.commentable(line)

    def changed(self, path: str, line: int) -> bool:
        """An added (or edited) line of the pull request: where a cause can have been written."""
        fd = self.files.get(path)
        return fd is not None and fd.status != "removed" and line in fd.added

    def passes(self, path: str, line: int, mode: str) -> bool:
        """reviewdog-style filter: is a finding at path:line in scope for a located report?"""
        if mode == "nofilter":
            return True
        fd = self.files.get(path)
        if fd is None or fd.status == "removed":
            return False
        if mode == "file":
            return True
        if mode == "diff_context":
            return fd.commentable(line)
        if mode == "added":
            return line in fd.added
        raise ValueError(f"unknown filter mode {mode!r} (one of {', '.join(FILTER_MODES)})")
