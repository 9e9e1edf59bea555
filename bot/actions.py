"""The GitHub Actions side of a run: log lines, workflow commands, step outputs, job summary."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import TextIO

from .secrets import Redactor


class Console:
    """Everything the bot prints goes through here, masked."""

    def __init__(self, redact: Redactor, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.redact = redact
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def info(self, msg: str) -> None:
        print(self.redact(f"shardproof: {msg}"), file=self.err, flush=True)

    def warning(self, msg: str, title: str = "shardproof") -> None:
        # A workflow command, so it shows on the run page; readable in a terminal too.
        print(self.redact(f"::warning title={_prop(title)}::{_data(msg)}"), file=self.out, flush=True)

    def error(self, msg: str, title: str = "shardproof") -> None:
        print(self.redact(f"::error title={_prop(title)}::{_data(msg)}"), file=self.out, flush=True)

    def command(self, line: str) -> None:
        print(self.redact(line), file=self.out, flush=True)


def _data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")


def write_outputs(path: str | None, values: dict[str, str]) -> None:
    """Append ``name=value`` pairs to ``GITHUB_OUTPUT`` (heredoc form for multi-line values)."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        for k, v in values.items():
            if "\n" in v:
                delim = f"shardproof_{uuid.uuid4().hex}"
                f.write(f"{k}<<{delim}\n{v}\n{delim}\n")
            else:
                f.write(f"{k}={v}\n")


def append_step_summary(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
