"""YAML text read with PyYAML's pure-Python safe loader, every failure a located YAML error.

The pure-Python loader, not libyaml's C one: the C loader crashes the process on deeply nested
input (found by fuzzing). Shared by the relations file and ``.shardproof.yml``.
"""

from __future__ import annotations

from typing import Any

import yaml


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
