"""A small JSON Schema validator for the subset ``shardproof.schema.json`` uses.

The schema file is the published contract (editors and ``check-jsonschema`` read it); this
validator exists so that checking a config needs no extra dependency and every error can name
the key path and say what was expected in plain words (the schema's ``x-expected`` hints).

Supported keywords: ``$ref`` (local), ``type``, ``const``, ``enum``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``minItems``, ``minimum``,
``exclusiveMinimum``, ``pattern``, ``oneOf``. Anything else in the schema is ignored, as JSON
Schema ignores unknown keywords.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

Path = tuple[str | int, ...]

_TYPE_NAMES = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "nothing",
}


@dataclass(frozen=True)
class SchemaError:
    path: Path
    message: str


def key_text(path: Path) -> str:
    """``models[3].size.hidden`` for ``("models", 3, "size", "hidden")``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


@cache
def config_schema() -> dict[str, Any]:
    text = resources.files("shardproof.engine.frontend").joinpath("shardproof.schema.json").read_text()
    return json.loads(text)


def validate(value: Any, schema: dict[str, Any] | None = None) -> list[SchemaError]:
    """All errors of ``value`` against ``schema`` (the config schema by default), in key order."""
    root = schema if schema is not None else config_schema()
    return _check(value, root, root, ())


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "null":
        return value is None
    raise ValueError(f"unknown JSON Schema type {name!r}")


def _expected(schema: dict[str, Any]) -> str:
    if "x-expected" in schema:
        return str(schema["x-expected"])
    if "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    if "const" in schema:
        return f"{schema['const']!r}"
    types = schema.get("type")
    if isinstance(types, str):
        return _TYPE_NAMES.get(types, types)
    if isinstance(types, list):
        return " or ".join(_TYPE_NAMES.get(t, t) for t in types)
    return "a valid value"


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref is supported, not {ref!r}")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        # Sibling keywords of $ref (descriptions, hints) refine the referenced schema.
        merged = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**target, **merged}
    return schema


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: Path) -> list[SchemaError]:
    schema = _resolve(schema, root)

    def fail(message: str) -> list[SchemaError]:
        return [SchemaError(path, message)]

    if "oneOf" in schema:
        return _one_of(value, schema, root, path)
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(value, t) for t in names):
            return fail(f"expected {_expected(schema)}, got {_show(value)}")
    if "const" in schema and value != schema["const"]:
        return fail(f"expected {_expected(schema)}, got {_show(value)}")
    if "enum" in schema and value not in schema["enum"]:
        return fail(f"expected {_expected(schema)}, got {_show(value)}")
    errors: list[SchemaError] = []
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return fail(f"expected {_expected(schema)}, got {_show(value)}")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return fail(f"expected {_expected(schema)}, got {_show(value)}")
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        return fail(f"expected {_expected(schema)}, got {_show(value)}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            return fail(f"expected at least {schema['minItems']} item(s), got {len(value)}")
        if "items" in schema:
            for index, item in enumerate(value):
                errors += _check(item, schema["items"], root, (*path, index))
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        # Unknown keys first: a misspelt key also makes a required one look missing, and the
        # misspelling is the message that helps.
        if extra is False:
            for key in value:
                if key not in properties:
                    known = ", ".join(sorted(properties))
                    close = difflib.get_close_matches(str(key), list(properties), n=1)
                    hint = f"did you mean '{close[0]}'? " if close else ""
                    errors.append(SchemaError((*path, key), f"unknown key; {hint}expected one of {known}"))
        for key in schema.get("required", []):
            if key not in value:
                errors.append(SchemaError(path, f"missing required key '{key}' ({_expected(_resolve(properties.get(key, {}), root))})"))
        for key, item in value.items():
            if key in properties:
                errors += _check(item, properties[key], root, (*path, key))
            elif isinstance(extra, dict):
                errors += _check(item, extra, root, (*path, key))
    return errors


def _one_of(value: Any, schema: dict[str, Any], root: dict[str, Any], path: Path) -> list[SchemaError]:
    """Exactly one branch must accept ``value``.

    When no branch does, a branch that failed only below ``path`` (its type and required keys
    matched, so it is clearly the one meant) gives the more precise errors; otherwise the
    hint says what the alternatives are.
    """
    outcomes = [_check(value, branch, root, path) for branch in schema["oneOf"]]
    passing = [o for o in outcomes if not o]
    if len(passing) == 1:
        return []
    if passing:
        return [SchemaError(path, f"ambiguous value {_show(value)}: expected {_expected(schema)}")]
    deeper = [o for o in outcomes if all(len(e.path) > len(path) for e in o)]
    if len(deeper) == 1:
        return deeper[0]
    return [SchemaError(path, f"expected {_expected(schema)}, got {_show(value)}")]
