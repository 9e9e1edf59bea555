"""YAML text read with PyYAML's pure-Python safe loader, every failure a located YAML error.

The pure-Python loader, not libyaml's C one: the C loader crashes the process on deeply nested
input (found by fuzzing). Shared by the relations file and ``.shardproof.yml``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import InputError

# '[' / '{' levels: PyYAML's scanner is quadratic in them, then recurses out of the stack.
MAX_NESTING = 100


class LocatedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reporting a scalar it cannot construct (``2001-13-45``, ``0x_``,
    ``!!int abc``, an empty ``!!int``) as a YAML error at its line; PyYAML lets these escape as
    ValueError, IndexError and the like."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
            what = repr(node.value)[:60] if isinstance(node, yaml.ScalarNode) else "this value"
            tag = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {what} as {tag}: {e}", node.start_mark) from e


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
