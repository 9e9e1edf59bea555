"""YAML text read with PyYAML's safe loader, every failure a located YAML error.

libyaml's C loader crashes the process on deeply nested input (found by fuzzing), so it reads
only text whose nesting is bounded (see ``load``); everything else, and every text the C loader
refuses, goes to the pure-Python loader, whose errors are the ones reported. Shared by the
relations file and ``.shardproof.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import InputError

# '[' / '{' levels: PyYAML's scanner is quadratic in them, then recurses out of the stack.
MAX_NESTING = 100


class _Located:
    """Reports a scalar the loader cannot construct (``2001-13-45``, ``0x_``, ``!!int abc``, an
    empty ``!!int``) as a YAML error at its line; PyYAML lets these escape as ValueError,
    IndexError and the like."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
            what = repr(node.value)[:60] if isinstance(node, yaml.ScalarNode) else "this value"
            tag = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {what} as {tag}: {e}", node.start_mark) from e


class LocatedLoader(_Located, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader with located construction errors."""


_CLoader = getattr(yaml, "CSafeLoader", None)
LocatedCLoader = type("LocatedCLoader", (_Located, _CLoader), {}) if _CLoader else None
# Block nesting on one line is bounded by its leading run of indentation and indicators.
MAX_C_BLOCK_RUN = 200


def load(text: str) -> Any:
    """``yaml.load`` with the fast C loader when the text's nesting is bounded (flow nesting is
    checked by check_nesting first) and it holds only characters YAML allows; otherwise, or
    when the C loader refuses the text, the pure-Python loader gives the answer or the error."""
    if LocatedCLoader is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        run = max((len(line) - len(line.lstrip(" -?:")) for line in text.split("\n")), default=0)
        if run <= MAX_C_BLOCK_RUN:
            try:
                return yaml.load(text, Loader=LocatedCLoader)
            except yaml.YAMLError:
                pass
    return yaml.load(text, Loader=LocatedLoader)


def check_nesting(text: str, shown: str) -> None:
    """Refuse flow collections nested deeper than MAX_NESTING, fast and with the place (quotes
    ignored: an over-count only matters far beyond any real file)."""
    depth = 0
    for m in re.finditer(r"[\[\]{}]", text):
        if m.group() in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, m.start()) + 1
                column = m.start() - text.rfind("\n", 0, m.start())
                raise InputError(shown, f"{line}:{column}", f"not valid YAML here: nested more than {MAX_NESTING} levels deep")
        elif depth:
            depth -= 1
