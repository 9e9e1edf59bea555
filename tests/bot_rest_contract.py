"""Check one recorded request against GitHub's official REST description (npm ``@octokit/openapi``,
installed by ``make install`` under ``.tools/``): its operation exists (method and path template),
its query parameters are declared with values of their type, and its JSON body validates against
the operation's request schema. Used by the end-to-end tests, whose recording server answers
like GitHub and keeps every violation.

The description is OpenAPI 3.0: ``nullable`` becomes a JSON-Schema ``null`` type, ``$ref`` resolve
inside the document. The check is written from the description alone, not from the bot's code.
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / ".tools" / "node_modules" / "@octokit" / "openapi" / "generated" / "api.github.com.json"


def _nullable(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _nullable(v) for k, v in node.items() if k != "nullable"}
        if node.get("nullable") is True:
            if isinstance(out.get("type"), str):
                out["type"] = [out["type"], "null"]
            elif "type" not in out:
                out = {"anyOf": [out, {"type": "null"}]}
            if isinstance(out.get("enum"), list) and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        return out
    if isinstance(node, list):
        return [_nullable(x) for x in node]
    return node


class Description:
    def __init__(self, path: Path = SPEC) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"GitHub's REST description is missing at {path.name}: run `make install`")
        self.doc = _nullable(json.loads(path.read_text()))
        self.registry = Registry().with_resource("urn:github", Resource.opaque(self.doc))  # type: ignore[call-arg]
        self.routes: list[tuple[re.Pattern[str], str, dict[str, Any]]] = []
        for template, item in self.doc["paths"].items():
            rx = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
            self.routes.append((rx, template, item))
        # Literal segments beat parameters: /pulls/comments/1 is not /pulls/{pull_number}/...
        self.routes.sort(key=lambda r: -len(re.sub(r"\{[^}]+\}", "", r[1])))

    def _resolve(self, node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node:
            node = functools.reduce(lambda n, k: n[k], node["$ref"].lstrip("#/").split("/"), self.doc)
        return node

    def check(self, method: str, path: str, query: str, body: Any) -> list[str]:
        """The violations of one request (empty when GitHub's description accepts it)."""
        found = next(((t, i, i[method.lower()]) for rx, t, i in self.routes if rx.match(path) and method.lower() in i), None)
        if found is None:
            return [f"{method} {path}: no such operation in GitHub's REST description"]
        template, item, op = found
        problems = []
        params = {}
        for p in [*item.get("parameters", []), *op.get("parameters", [])]:
            p = self._resolve(p)
            params[(p["in"], p["name"])] = p
        for name, values in urllib.parse.parse_qs(query, keep_blank_values=True).items():
            p = params.get(("query", name))
            if p is None:
                problems.append(f"{method} {template}: unknown query parameter {name!r}")
                continue
            schema = self._resolve(p.get("schema", {}))
            kind = schema.get("type")
            for v in values:
                if kind == "integer" and not v.isdigit():
                    problems.append(f"{method} {template}: query {name}={v!r} is not an integer")
                if "enum" in schema and v not in schema["enum"]:
                    problems.append(f"{method} {template}: query {name}={v!r} not one of {schema['enum']}")
        rb = self._resolve(op.get("requestBody"))
        if rb is not None:
            schema = (rb.get("content", {}).get("application/json") or {}).get("schema")
            if body is None and rb.get("required"):
                problems.append(f"{method} {template}: the request body is required")
            elif body is not None and schema is not None:
                wrapped = {"$id": "urn:request", **{k: v for k, v in schema.items()}}
                validator = jsonschema.Draft4Validator(self._anchored(wrapped), registry=self.registry)
                for e in validator.iter_errors(body):
                    where = "/".join(str(x) for x in e.absolute_path) or "(body)"
                    problems.append(f"{method} {template}: {where}: {e.message[:200]}")
        elif body not in (None, {}, ""):
            problems.append(f"{method} {template}: takes no request body")
        return problems

    def _anchored(self, node: Any) -> Any:
        """``#/components/...`` references as references into the registered description."""
        if isinstance(node, dict):
            return {k: (f"urn:github{v}" if k == "$ref" and isinstance(v, str) and v.startswith("#") else self._anchored(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [self._anchored(x) for x in node]
        return node


@functools.cache
def description() -> Description:
    return Description()
