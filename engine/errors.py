"""Errors that reach the user: bad input (exit code 3), always with a location, and internal
errors (exit code 4), always with the phase and what it was working on."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import TracebackType


class InputError(Exception):
    """Bad input: names the file, the place in it (line/column or key) and what was expected."""

    def __init__(self, path: str, where: str, message: str, excerpt: str = "") -> None:
        self.path = path
        self.where = where
        self.message = message
        self.excerpt = excerpt
        text = f"{path}:{where}: {message}" if where else f"{path}: {message}"
        if excerpt:
            text += f"\n    {excerpt}"
        super().__init__(text)


class HloParseError(InputError):
    """Malformed HLO text; ``where`` is ``line:column`` and ``excerpt`` the offending line."""

    def __init__(self, path: str, line: int, column: int, message: str, line_text: str = "") -> None:
        self.line = line
        self.column = column
        caret = ""
        if line_text:
            caret = line_text.rstrip("\n") + "\n    " + " " * max(column - 1, 0) + "^"
        super().__init__(path, f"{line}:{column}", message, caret)


# --------------------------------------------------------------------------------------------
# Internal errors: a crash of the tool is never a verdict about the user's program (exit code 4).

EXIT_INTERNAL = 4
REPORT_PLEA = "this is a bug in shardproof, not in your program; please report it with the files named above"
# Names the test suite may put in SHARDPROOF_FAULT to make that phase crash (tests/test_internal_errors.py).
FAULT_ENV = "SHARDPROOF_FAULT"
PHASE_TEXT = {
    "check": "checking the pair",
    "read": "reading the input files",
    "rules": "loading the rewrite rules",
    "fold": "folding repeated layers",
    "parse": "parsing HLO",
    "normalize": "normalizing the HLO",
    "partition": "cutting the pair into layers",
    "build": "building the e-graph",
    "saturate": "running the rewrite rules",
    "localize": "localizing the divergence",
    "witness": "running the numeric witness",
    "verify": "verifying",
    "report": "writing the report",
}


# The interpreter's own control flow; every other exception is a crash. A Rust panic inside
# egglog reaches Python as pyo3's PanicException, a BaseException (not an Exception): a rule
# file egglog rejects can raise one (a rule name defined twice, input into an unknown table).
NOT_CRASHES = (KeyboardInterrupt, SystemExit, GeneratorExit)


def is_crash(e: BaseException) -> bool:
    """Whether ``e`` is a crash of the tool (or bad input), not an interrupt or an exit."""
    return not isinstance(e, NOT_CRASHES)


class InternalError(Exception):
    """A crash of shardproof itself, tagged with the phase it happened in and what that phase was
    working on (an instruction, a layer, a file). Never bad input (that is InputError)."""

    def __init__(self, phase: str, where: str, message: str) -> None:
        self.phase = phase
        self.where = where
        self.message = message
        super().__init__(f"internal error in phase {phase}" + (f" at {where}" if where else "") + f": {message}")

    def to_json(self) -> dict[str, str]:
        return {"phase": self.phase, "where": self.where, "message": self.message}

    def explain(self, files: list[str] | None = None) -> str:
        """The lines a user reads: what broke, where, the files to attach, and whose fault it is."""
        doing = PHASE_TEXT.get(self.phase, self.phase)
        lines = [f"internal error while {doing} (phase {self.phase})" + (f" at {self.where}" if self.where else "") + f": {self.message}"]
        if files:
            lines.append("  files: " + ", ".join(files))
        lines.append("  " + REPORT_PLEA)
        return "\n".join(lines)


def _describe_locals(tb: TracebackType | None) -> str:
    """The innermost HLO instruction the crashing code was handling: a local named ``ins`` (an
    Instruction) or ``node``/``n`` (a graph Node with ``.ins``), with its side when known; else
    the text position of a parser (a ``self`` with ``loc(pos)``). Read from the traceback only
    after a crash, so the hot loops pay nothing for it."""
    found = ""
    while tb is not None:
        f_locals = tb.tb_frame.f_locals
        reader = f_locals.get("self")
        if callable(getattr(reader, "loc", None)) and isinstance(getattr(reader, "pos", None), int):
            with contextlib.suppress(Exception):  # a locator must never hide the crash it describes
                found = str(reader.loc(reader.pos))  # type: ignore[union-attr]
        for key in ("ins", "instruction", "node", "n"):
            obj = f_locals.get(key)
            ins = getattr(obj, "ins", obj)
            name, opcode = getattr(ins, "name", None), getattr(ins, "opcode", None)
            if isinstance(name, str) and isinstance(opcode, str):
                side = getattr(obj, "side", None) or f_locals.get("side")
                loc = getattr(ins, "loc", None)
                found = (f"{side} " if isinstance(side, str) else "") + f"%{name} ({opcode})" + (f" at {loc}" if loc is not None else "")
                break
        tb = tb.tb_next
    return found


class Phase:
    """What a phase is working on; ``at()`` updates it cheaply inside loops."""

    def __init__(self, name: str, where: str) -> None:
        self.name = name
        self.where = where
        self.fault = os.environ.get(FAULT_ENV, "") == name

    def at(self, where: str) -> None:
        self.where = where
        if self.fault:
            self.fault = False
            raise RuntimeError(f"fault injected by {FAULT_ENV}={self.name}")


@contextlib.contextmanager
def phase(name: str, where: str = "", keep: tuple[type[Exception], ...] = ()) -> Iterator[Phase]:
    """Run a phase of the check; any exception but bad input leaves it as an InternalError naming
    the phase and what it was working on. The innermost phase's tag wins.

    With the environment variable SHARDPROOF_FAULT=<name>, the phase crashes on purpose (at its
    first ``at()``, else at its end), so tests can drive a crash through every phase. Exceptions
    of the types in ``keep`` are control flow the caller handles, and pass unchanged."""
    p = Phase(name, where)
    try:
        yield p
        if p.fault:
            p.at(p.where)
    except (InputError, InternalError):
        raise
    except BaseException as e:
        if isinstance(e, keep) or not is_crash(e):
            raise
        inner = _describe_locals(e.__traceback__)
        where = ", ".join(x for x in (inner, p.where) if x)
        raise InternalError(name, where, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e


def internal(e: BaseException, phase_name: str, where: str = "") -> InternalError:
    """``e`` as an InternalError: as it is when already tagged, else tagged with ``phase_name``."""
    if isinstance(e, InternalError):
        return e
    inner = _describe_locals(e.__traceback__)
    return InternalError(phase_name, ", ".join(x for x in (inner, where) if x), f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
