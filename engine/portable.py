"""Source locations that name no directory of the machine that ran the check.

HLO metadata carries the producer's absolute frame paths (JAX records every frame's file; on a
runner, its workspace), and an instruction without a line is described by a sentence. A result
a person shares must read the same from any machine: a repository file as its path relative to
the repository root, an installed package's file as ``<site-packages>/pkg/...``, any other file
by its name alone, and ``–`` plus the reason where no line exists. The bot's report
(bot/portable.py) applies the same names to results written elsewhere.
"""

from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath
from typing import Any

NO_LINE = "–"
_PACKAGE_DIRS = ("site-packages", "dist-packages")
# "file:line" with an optional tail such as " (in the backward of)".
_AT = re.compile(r"^(?P<path>.+?):(?P<line>\d+)(?P<rest>(?: .*)?)$")


def _package_relative(parts: tuple[str, ...]) -> str | None:
    """The part after the last site-packages/dist-packages component (a venv may sit inside the
    repository, so this is checked before "under the root")."""
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _PACKAGE_DIRS:
            return "/".join(parts[i + 1 :])
    return None


def portable_file(file: str, root: str) -> str | None:
    """``file`` as a shared result names it; None when it names no file (``<frozen runpy>``).

    ``root`` is the absolute repository root. A relative path is already the producer's portable
    name (the torch front end writes root-relative paths and ``<site-packages>/...``)."""
    if not file or (file.startswith("<") and not file.startswith(("<site-packages>/", "<stdlib>/", "<external>/"))):
        return None
    if not file.startswith("/"):
        return file
    pure = PurePosixPath(file)
    packaged = _package_relative(pure.parts)
    if packaged is not None:
        return f"<site-packages>/{packaged}"
    try:
        return pure.relative_to(PurePosixPath(root)).as_posix()
    except ValueError:
        # Outside the repository and outside installed packages: the directory is the machine's.
        # A checkout in the src layout (an editable install: .../src/pkg/mod.py) still names its
        # package path, which is the library's, not the machine's.
        parts = pure.parts
        if "src" in parts[:-1]:
            i = len(parts) - 1 - parts[::-1].index("src")
            if i < len(parts) - 1:
                return "<external>/" + "/".join(parts[i + 1 :])
        return f"<external>/{pure.name}"


def portable_source(text: str, root: str) -> tuple[str, str | None]:
    """A relation-trace step's ``source``: (``path:line`` or ``–``, why there is no line)."""
    if text.startswith("<no source"):
        why = text.removeprefix("<no source").removeprefix(":").removesuffix(">").strip()
        return NO_LINE, why or "the producer recorded none"
    m = _AT.match(text)
    if m is None:
        return text, None
    p = portable_file(m["path"], root)
    if p is None:
        return NO_LINE, f"{m['path']} is no file"
    return f"{p}:{m['line']}{m['rest']}", None


def _source_dict(src: Any, root: str) -> None:
    if not isinstance(src, dict) or not isinstance(src.get("file"), str) or not src["file"]:
        return
    p = portable_file(src["file"], root)
    if p is None:
        src["why"] = f"{src['file']} is no file"
        src["file"] = ""
    else:
        src["file"] = p


def portable_result(result: dict[str, Any], root: str) -> dict[str, Any]:
    """A copy of a check's result document (``Result.to_json()``) whose trace steps and
    divergence sources name no directory of this machine; ``root`` is the repository root."""
    out = copy.deepcopy(result)
    for t in out.get("trace") or []:
        for step in (t.get("steps") or []) if isinstance(t, dict) else []:
            if isinstance(step, dict) and isinstance(step.get("source"), str):
                step["source"], why = portable_source(step["source"], root)
                if why:
                    step["no_source"] = why
    for d in out.get("divergences") or []:
        if not isinstance(d, dict):
            continue
        _source_dict(d.get("source"), root)
        for o in d.get("operands") or []:
            if isinstance(o, dict):
                _source_dict(o.get("source"), root)
                if isinstance(o.get("origin"), dict):
                    _source_dict(o["origin"].get("source"), root)
    return out
