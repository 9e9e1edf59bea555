"""Drive egglog: load rule files form by form, load facts from TSV, run bounded, read back.

Why form by form: egglog's ``parse_program`` copies the text per span, so parsing a whole rule
file at once costs memory quadratic in its length. Why TSV: ``(input rel "file")`` loads a row
in about a microsecond, one command per fact costs a hundred times that.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from egglog import bindings

RULE_FILES = ("core.egg", "algebra.egg", "partition.egg", "collectives.egg", "slicing.egg", "unroll.egg", "layout.egg")


def split_forms(text: str) -> Iterator[str]:
    """Top-level s-expressions of an egglog file, skipping ``;`` comments and strings."""
    depth = 0
    start = -1
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                yield text[start : i + 1]
            if depth < 0:
                raise ValueError(f"unbalanced ')' at offset {i}")
        i += 1
    if depth:
        raise ValueError("unbalanced '(' at end of rule text")


def rule_text(name: str) -> str:
    return resources.files("shardproof.rules").joinpath(name).read_text()


@dataclass
class RunStats:
    iterations: int
    saturated: bool
    seconds: float


class Session:
    """One e-graph. Not thread-safe (egglog's EGraph cannot cross threads); make one per thread."""

    def __init__(self, rule_files: Iterable[str] = RULE_FILES) -> None:
        self.eg = bindings.EGraph()
        self._tmp = tempfile.TemporaryDirectory(prefix="shardproof-egg-")
        for name in rule_files:
            for form in split_forms(rule_text(name)):
                self.command(form)

    def close(self) -> None:
        self._tmp.cleanup()

    def command(self, form: str) -> list[object]:
        return self.eg.run_program(*self.eg.parse_program(form))

    def load(self, table: str, rows: Iterable[tuple[object, ...]]) -> int:
        rows = list(rows)
        if not rows:
            return 0
        path = Path(self._tmp.name) / f"{table}.{len(os.listdir(self._tmp.name))}.tsv"
        with path.open("w") as f:
            for row in rows:
                f.write("\t".join(_cell(v) for v in row) + "\n")
        self.command(f'(input {table} "{path}")')
        return len(rows)

    def run(self, max_iterations: int, deadline_s: float, chunk: int = 8) -> RunStats:
        """Run all rules until nothing changes, or the iteration/time budget is spent."""
        t0 = time.perf_counter()
        done = 0
        while done < max_iterations:
            step = min(chunk, max_iterations - done)
            out = self.command(f"(run {step})")
            done += step
            report = out[-1].report if out else None  # type: ignore[attr-defined]
            if report is not None and not report.updated:
                return RunStats(done, True, time.perf_counter() - t0)
            if time.perf_counter() - t0 > deadline_s:
                break
        return RunStats(done, False, time.perf_counter() - t0)

    def rows(self, names: Iterable[str]) -> dict[str, list[list[object]]]:
        """Rows of the named functions/relations, values decoded (e-classes stay opaque)."""
        frozen = self.eg.freeze().functions
        out: dict[str, list[list[object]]] = {}
        for name in names:
            fn = frozen[name]
            sorts = list(fn.input_sorts)
            table = []
            for r in fn.rows:
                vals: list[object] = []
                for v, s in zip(r.inputs, sorts, strict=True):
                    if s == "i64":
                        vals.append(self.eg.value_to_i64(v))
                    elif s == "String":
                        vals.append(self.eg.value_to_string(v))
                    else:
                        vals.append(v)
                if fn.output_sort in ("T", "TL", "i64", "String"):
                    vals.append(r.output)
                table.append(vals)
            out[name] = table
        return out


def _cell(v: object) -> str:
    s = str(v)
    if "\t" in s or "\n" in s:
        raise ValueError(f"TSV cell holds a tab or newline: {s[:80]!r}")
    return s
