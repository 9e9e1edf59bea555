"""Where an instruction came from in the user's code: the source map, or HLO metadata."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .ir import Instruction

# Stacks written into ``source_file`` (Neuron): Python tracebacks, or "path:line" entries that may
# be quoted, listed in brackets and followed by the function. Quotes, brackets and commas are never
# part of a path here (a stray quote once came out as the file: '/opt/.../hlo.py).
_FRAME_RES = (
    re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>\S+))?'),
    re.compile(r"""(?P<file>[^\s:()'"\[\],]+\.py):(?P<line>\d+)(?:\s+in\s+(?P<fn>[\w.<>]+)|\s*\((?P<fn2>[\w.<>]+)\))?"""),
)
_LIBRARY_MARKERS = ("site-packages", "dist-packages", "<site-packages>", "/lib/python", "torch_xla/", "torch/")

Frame = tuple[str, int, str]  # (file, line, function)


@dataclass(frozen=True)
class Source:
    file: str
    line: int
    function: str = ""
    why: str = ""  # when there is no file: why the instruction has no source
    # An instruction of the backward pass: file:line is the forward call it differentiates.
    backward: bool = False

    def __str__(self) -> str:
        if self.file:
            return f"{self.file}:{self.line}" + (" (in the backward of)" if self.backward else "")
        return f"<no source: {self.why}>" if self.why else "<no source>"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "line": self.line, "function": self.function}
        if not self.file:
            out["why"] = self.why or "unknown"
        if self.backward:
            out["backward"] = True
        return out


class SourceMap:
    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.instructions: dict[str, Any] = (data or {}).get("instructions", {})
        # Files whose frames never name an instruction (the configuration's hide_frames and the
        # front end's own files), as the HLO text names them: also skipped in HLO metadata.
        self.hidden: frozenset[str] = frozenset(str(h) for h in (data or {}).get("hidden", []) or [])

    @classmethod
    def load(cls, path: str | Path) -> SourceMap:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise InputError(str(path), "", f"cannot read source map: {e.strerror}") from e
        except json.JSONDecodeError as e:
            raise InputError(str(path), f"{e.lineno}:{e.colno}", f"not valid JSON: {e.msg}") from e
        if not isinstance(data, dict) or not isinstance(data.get("instructions", {}), dict):
            raise InputError(str(path), "instructions", "expected {\"instructions\": {name: {\"frames\": [...]}}}")
        if not isinstance(data.get("hidden", []), list):
            raise InputError(str(path), "hidden", "expected a list of file paths")
        return cls(data)

    def entry(self, ins: Instruction) -> dict[str, Any] | None:
        """The map's entry for ``ins``; a part the normalizer split off takes its original's."""
        entry = self.instructions.get(ins.name)
        if entry is None and ins.origin:
            entry = self.instructions.get(ins.origin)
        return entry if isinstance(entry, dict) else None

    def source(self, ins: Instruction) -> Source:
        entry = self.entry(ins)
        if entry is not None:
            frames = entry.get("frames") or []
            if frames and isinstance(frames[0], dict):
                f = frames[0]
                return Source(str(f.get("file", "")), int(f.get("line", 0)), str(f.get("function", "")), backward=entry.get("backward") is True)
        src = from_metadata(ins, self.hidden)
        if not src.file and entry is not None:
            # The front end saw the stack and kept no frame: e.g. an op autograd or the lowering made.
            why = "no frame of its Python stack lies in the repository outside hidden files"
            return Source("", 0, "", why + ("; " + src.why if src.why.startswith("its only") else ", and its HLO metadata records no location"))
        return src

    def op_name(self, ins: Instruction) -> str:
        name = ins.origin if ins.origin and ins.name not in self.instructions else ins.name
        return self.op_name_of(name, ins.metadata.op_name)

    def op_name_of(self, name: str, metadata_op_name: str) -> str:
        """The module path of an instruction: the source map's, else its metadata's."""
        entry = self.instructions.get(name)
        if isinstance(entry, dict) and entry.get("op_name"):
            return str(entry["op_name"])
        return metadata_op_name


def _library(file: str) -> bool:
    return any(mark in file for mark in _LIBRARY_MARKERS)


def _stack_in_text(text: str) -> list[Frame]:
    """Frames of a stack written into source_file, innermost first (Python prints outermost first)."""
    for rx in _FRAME_RES:
        frames = [(m.group("file"), int(m.group("line")), m.group("fn") or m.groupdict().get("fn2") or "") for m in rx.finditer(text)]
        if frames:
            return frames[::-1]
    return []


def from_metadata(ins: Instruction, hidden: frozenset[str] | set[str] = frozenset()) -> Source:
    """Where HLO metadata says ``ins`` came from: the innermost frame outside installed libraries
    and ``hidden`` files, of the stack that ``stack_frame_id`` names (resolved by the parser through
    the module's StackFrames tables), or of a whole stack in ``source_file`` (Neuron), else
    ``source_file:source_line``. A library frame is used when nothing better is recorded; a hidden
    one never. Without a frame, the Source says why."""
    md = ins.metadata
    text = md.source_file
    frames: list[Frame] = []
    if md.frames:
        frames = list(md.frames)
    elif text:
        if "\n" in text or 'File "' in text or ".py:" in text:
            frames = _stack_in_text(text)
        frames = frames or [(text, md.source_line, "")]
    if not frames:
        if md.stack_frame_id:
            return Source("", 0, "", f"its metadata names stack frame {md.stack_frame_id}, but the module has no StackFrames table that resolves it")
        hint = "" if md.op_name or md.op_type else " (the HLO has no metadata; for JAX print it with metadata, see README)"
        return Source("", 0, "", "neither a source map entry nor its HLO metadata records a location" + hint)
    shown = [f for f in frames if f[0] not in hidden]
    if not shown:
        return Source("", 0, "", f"its only recorded frames are in hidden files ({', '.join(sorted({f[0] for f in frames}))})")
    user = [f for f in shown if not _library(f[0])]
    f = (user or shown)[0]
    return Source(f[0], f[1], f[2])
