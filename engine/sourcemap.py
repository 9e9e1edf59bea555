"""Where an instruction came from in the user's code: the source map, or HLO metadata."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import InputError
from .ir import Instruction

_FRAME_RES = (
    re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>\S+))?'),
    re.compile(r"(?P<file>[^\s:()]+\.py):(?P<line>\d+)(?:\s*\(?(?P<fn>[\w.<>]+)\)?)?"),
)
_LIBRARY_MARKERS = ("site-packages", "dist-packages", "<site-packages>", "/lib/python", "torch_xla/", "torch/")


@dataclass(frozen=True)
class Source:
    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.file else "<unknown>"


class SourceMap:
    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.instructions: dict[str, Any] = (data or {}).get("instructions", {})

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
        return cls(data)

    def source(self, ins: Instruction) -> Source:
        entry = self.instructions.get(ins.name)
        if isinstance(entry, dict):
            frames = entry.get("frames") or []
            if frames and isinstance(frames[0], dict):
                f = frames[0]
                return Source(str(f.get("file", "")), int(f.get("line", 0)), str(f.get("function", "")))
        return from_metadata(ins)

    def op_name(self, ins: Instruction) -> str:
        return self.op_name_of(ins.name, ins.metadata.op_name)

    def op_name_of(self, name: str, metadata_op_name: str) -> str:
        """The module path of an instruction: the source map's, else its metadata's."""
        entry = self.instructions.get(name)
        if isinstance(entry, dict) and entry.get("op_name"):
            return str(entry["op_name"])
        return metadata_op_name


def from_metadata(ins: Instruction) -> Source:
    """Metadata's file:line; when source_file holds a whole stack (Neuron), the innermost frame
    outside installed libraries."""
    md = ins.metadata
    text = md.source_file
    if "\n" in text or 'File "' in text:
        frames = []
        for rx in _FRAME_RES:
            frames = [(m.group("file"), int(m.group("line")), m.group("fn") or "") for m in rx.finditer(text)]
            if frames:
                break
        user = [f for f in frames if not any(mark in f[0] for mark in _LIBRARY_MARKERS)]
        pick = (user or frames)
        if pick:
            # Python prints stacks outermost first: the innermost user frame is the last.
            f = pick[-1]
            return Source(f[0], f[1], f[2])
    return Source(text, md.source_line)
