"""The plan line of a DTensor program: where each ``ParallelStyle`` was written.

A bug in a ``parallelize_module`` plan (``RowwiseParallel(output_layouts=Partial())``) shows in
the values the styled module hands back, first where the calling line uses them (the residual
add), which is the line the verifier reports; the plan line is on no stack of that instruction.
The bot comments on the first frame of a finding that the pull request changed, so the plan
line is added as one more, outermost frame (the reported line, ``frames[0]``, never changes):

- while the user's code declares the model, each style's construction is recorded with its
  innermost frame outside torch, installed packages and the front end (``recording``), and
  each ``_apply`` of a style to a module (what ``parallelize_module`` calls per plan entry);
- after the trace (``add_plan_frames``), the style's frame is appended to every instruction
  lowered inside the styled module, and to the instructions of its calling modules that use
  the module's values on the lines that call it (its call chain: a value the calling line
  passes on to the next line, or into another module, is no longer the style's business).

Frames only locate a finding: nothing here changes what is proved.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# id(style) -> (style, (file, line, function)); id(module) -> (module, [frames of its styles]).
# The objects are kept so their ids stay theirs while a build child lives.
_constructed: dict[int, tuple[Any, tuple[str, int, str]]] = {}
_applied: dict[int, tuple[Any, list[tuple[str, int, str]]]] = {}

_FRONTEND = Path(__file__).resolve().parents[1]


def _user_frame() -> tuple[str, int, str] | None:
    """The innermost frame outside torch, installed packages and the front end."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        path = Path(name)
        library = "torch" in path.parts or "site-packages" in path.parts or "dist-packages" in path.parts
        if not name.startswith("<") and not library and not path.resolve().is_relative_to(_FRONTEND):
            return (str(path.resolve()), frame.f_lineno, frame.f_code.co_name)
        frame = frame.f_back
    return None


def _styles(base: type) -> list[type]:
    out = [base]
    for sub in base.__subclasses__():
        out += [s for s in _styles(sub) if s not in out]
    return out


@contextmanager
def recording() -> Iterator[None]:
    """While the user's code builds the model: record where each ParallelStyle is constructed
    and which modules each is applied to (a no-op when DTensor's styles were never imported)."""
    module = sys.modules.get("torch.distributed.tensor.parallel.style")
    base = getattr(module, "ParallelStyle", None) if module is not None else None
    if base is None:
        yield
        return
    saved: list[tuple[type, str, Any]] = []

    def wrap_init(original: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            # The outermost construction wins: a subclass's super().__init__() is not the plan line.
            if id(self) not in _constructed:
                frame = _user_frame()
                if frame is not None:
                    _constructed[id(self)] = (self, frame)
            original(self, *args, **kwargs)

        return init

    def wrap_apply(original: Any) -> Any:
        def apply(self: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            made = _constructed.get(id(self))
            if made is not None and made[0] is self:
                frames = _applied.setdefault(id(target), (target, []))[1]
                if made[1] not in frames:
                    frames.append(made[1])
            return original(self, target, *args, **kwargs)

        return apply

    for cls in _styles(base):
        for attr, wrap in (("__init__", wrap_init), ("_apply", wrap_apply)):
            if attr in cls.__dict__:
                saved.append((cls, attr, cls.__dict__[attr]))
                setattr(cls, attr, wrap(cls.__dict__[attr]))
    try:
        yield
    finally:
        for cls, attr, original in saved:
            setattr(cls, attr, original)


_INSTRUCTION_RE = re.compile(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_OPERAND_RE = re.compile(r"%([\w.\-]+)")


def _inside(module: str, path: str) -> bool:
    """Whether an instruction of module ``module`` runs inside module ``path`` ("" the root)."""
    return not path or module == path or module.startswith(path + ".")


def _users(hlo_text: str) -> dict[str, list[str]]:
    """Each instruction's users (operand edges, within the text's computations)."""
    users: dict[str, list[str]] = {}
    for line in hlo_text.splitlines():
        m = _INSTRUCTION_RE.match(line)
        if m is None:
            continue
        body = m.group(2).split(", metadata={", 1)[0]
        for operand in set(_OPERAND_RE.findall(body)):
            users.setdefault(operand, []).append(m.group(1))
    return users


def add_plan_frames(program: Any, sourcemap: dict[str, Any], hlo_text: str, keep: Callable[[str], str | None]) -> int:
    """Append each style's construction frame to the instructions of the module it styles and
    to their users on its call chain (see the module's docstring). ``keep(file)`` gives the
    frame's file as the source map names it, or None (not a repository file, or hidden).
    Returns how many instructions gained a frame."""
    if not _applied or not hasattr(program, "named_modules"):
        return 0
    styled: dict[str, list[dict[str, Any]]] = {}
    for name, sub in program.named_modules():
        found = _applied.get(id(sub))
        if found is None or found[0] is not sub:
            continue
        frames = [{"file": shown, "line": line, "function": fn} for file, line, fn in found[1] if (shown := keep(file)) is not None]
        if frames:
            styled[name] = frames
    if not styled:
        return 0
    entries: dict[str, Any] = sourcemap.get("instructions", {})
    users = _users(hlo_text)
    gained: set[str] = set()
    # Inner modules first: an instruction of attention.wq gains wq's style, then attention's
    # (the outermost frame last, as a stack lists it).
    for path in sorted(styled, key=lambda p: -p.count(".") - (1 if p else 0)):
        frames = styled[path]
        members = [name for name, entry in entries.items() if isinstance(entry, dict) and _inside(str(entry.get("module", "")), path)]
        # The lines on the module's call chain: every frame of its instructions.
        chain = {(f.get("file"), f.get("line")) for name in members for f in entries[name].get("frames") or [] if isinstance(f, dict)}
        reached = set(members)
        todo = list(members)
        while todo:
            for user in users.get(todo.pop(), []):
                entry = entries.get(user)
                if user in reached or not isinstance(entry, dict) or not entry.get("frames"):
                    continue
                first = entry["frames"][0]
                # Only the calling modules' code: another module the value enters (the next
                # layer of the same line) has styles of its own.
                if _inside(path, str(entry.get("module", ""))) and (first.get("file"), first.get("line")) in chain:
                    reached.add(user)
                    todo.append(user)
        for name in reached:
            entry = entries[name]
            if not entry.get("frames"):
                continue  # no user frame to report at: the plan line alone would become frames[0]
            # The capture shares frame lists between instructions: build a new one.
            entry["frames"] = list(entry["frames"]) + [f for f in frames if f not in entry["frames"]]
            gained.add(name)
    return len(gained)


def repository_files(root: Path, hidden: Sequence[str], packages: Sequence[str]) -> Callable[[str], str | None]:
    """``keep`` for ``add_plan_frames``: a file as the capture names it in the source map (a
    repository file, or one of the source ``packages``, outside ``hidden``), else None."""
    from ..capture import in_packages, is_repository_file, portable_path

    skipped = {str(Path(h).resolve()) for h in hidden}

    def keep(file: str) -> str | None:
        if file in skipped or not (is_repository_file(file, root) or in_packages(file, packages)):
            return None
        return portable_path(file, root)

    return keep


def forget() -> None:
    """Drop the records (a test builds several models in one process)."""
    _constructed.clear()
    _applied.clear()
