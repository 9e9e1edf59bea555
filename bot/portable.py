"""result.json as a person can share it: no path of the machine that ran the check.

The verifier writes the relation trace's ``source`` as it read the source map: absolute paths
where the producer recorded them (JAX records every frame's absolute file; on a runner, its
workspace), ``<no source: ...>`` sentences where no line exists, and a witness command naming
the report folder's absolute path. The report keeps the same facts in a form that reads the same
from any machine: repository-relative paths, a library file by its path inside the library,
``–`` with the reason where there is no line, and commands relative to the workspace.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from shardproof.engine.portable import NO_LINE
from shardproof.engine.portable import portable_source as engine_source

from .explain import portable_command
from .findings import repo_path

_AT = re.compile(r"^(?P<path>.+?):(?P<line>\d+)(?P<rest>(?: .*)?)$")
# Names the engine already made portable (engine/portable.py): kept as they are.
_ENGINE_NAMES = ("<site-packages>/", "<stdlib>/", "<external>/")
_LIBRARY = re.compile(r"^.*?/(?:site-packages|dist-packages)/")


def portable_file(file: str, repository_root: str, workspace: str | None) -> str | None:
    """A source file as the report names it; None when it names no file (``<frozen runpy>``)."""
    if file.startswith(_ENGINE_NAMES):
        return file
    if not file or file.startswith("<"):
        return None
    p = repo_path(file, repository_root, workspace)
    if p is not None:
        return p
    if file.startswith("/"):
        # A library's file: its path inside the installed packages reads the same everywhere.
        lib = _LIBRARY.sub("", file)
        return lib if lib != file else Path(file).name
    return file


def portable_source(text: str, repository_root: str, workspace: str | None) -> tuple[str, str | None]:
    """A trace step's ``source`` string: (``path:line`` or ``–``, the reason there is no line)."""
    if text.startswith("<no source"):
        return engine_source(text, repository_root)
    m = _AT.match(text)
    if m is None:
        return text, None
    p = portable_file(m["path"], repository_root, workspace)
    if p is None:
        return NO_LINE, f"{m['path']} is no file of the repository"
    return f"{p}:{m['line']}{m['rest']}", None


def _source_dict(src: Any, repository_root: str, workspace: str | None) -> None:
    if not isinstance(src, dict) or not isinstance(src.get("file"), str) or not src["file"]:
        return
    p = portable_file(src["file"], repository_root, workspace)
    if p is None:
        src["why"] = f"{src['file']} is no file of the repository"
        src["file"] = ""
    else:
        src["file"] = p


def _artifact(path: str, ws: Path, base: Path | None) -> str:
    """An artifact's absolute path relative to the workspace, else to result.json's folder
    (where the bot resolves artifacts first); any other path is left as it is."""
    if not path.startswith("/"):
        return path
    p = Path(path)
    for root in (ws, base):
        if root is not None and p.is_relative_to(root):
            return p.relative_to(root).as_posix()
    return path


def portable_doc(doc: dict[str, Any], workspace: str | None, base: Path | None = None) -> dict[str, Any]:
    """A copy of the result document with every source, artifact and command made portable
    (``base``: the folder result.json is written to)."""
    out = copy.deepcopy(doc)
    root = str(out.get("repository_root") or ".")
    if root.startswith("/") and workspace and Path(root).resolve() == Path(workspace).resolve():
        root = "."
    elif root.startswith("/") and workspace:
        root = repo_path(root, ".", workspace) or root
    out["repository_root"] = root
    ws = Path(workspace or ".").resolve()
    base = base.resolve() if base is not None else None
    for model in out.get("models") or []:
        if isinstance(model, dict):
            if isinstance(model.get("artifacts"), dict):
                model["artifacts"] = {k: _artifact(v, ws, base) if isinstance(v, str) else v for k, v in model["artifacts"].items()}
            if isinstance(model.get("log"), str):
                model["log"] = _artifact(model["log"], ws, base)
        res = model.get("result") if isinstance(model, dict) else None
        if not isinstance(res, dict):
            continue
        for t in res.get("trace") or []:
            for step in t.get("steps") or [] if isinstance(t, dict) else []:
                if isinstance(step, dict) and isinstance(step.get("source"), str):
                    step["source"], why = portable_source(step["source"], root, workspace)
                    if why:
                        step["no_source"] = why
        for d in res.get("divergences") or []:
            if not isinstance(d, dict):
                continue
            _source_dict(d.get("source"), root, workspace)
            for o in d.get("operands") or []:
                if isinstance(o, dict):
                    _source_dict(o.get("source"), root, workspace)
                    if isinstance(o.get("origin"), dict):
                        _source_dict(o["origin"].get("source"), root, workspace)
        w = res.get("witness")
        if isinstance(w, dict) and isinstance(w.get("command"), str):
            w["command"] = portable_command(w["command"], ws)
    return out
