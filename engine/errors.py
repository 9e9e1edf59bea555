"""Errors that reach the user as "bad input" (exit code 3), always with a location."""

from __future__ import annotations


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
