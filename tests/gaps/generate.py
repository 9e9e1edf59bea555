"""Rebuild the verifier-gap pairs with the front end: ``python tests/gaps/generate.py [names]``.

Each model of ``tests/gaps/.shardproof.yml`` becomes ``tests/gaps/<name>/`` with
``baseline.hlo``, ``distributed.hlo``, ``relations.yaml`` and ``sourcemap.json`` (the README.md
in each folder is written by hand).
"""

from __future__ import annotations

import sys
from pathlib import Path

from shardproof.engine.frontend.runner import run_models

HERE = Path(__file__).resolve().parent
KEEP = {"baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json", "README.md"}


def main(argv: list[str]) -> int:
    doc = run_models(HERE / ".shardproof.yml", HERE, argv or None, verify=False)
    (HERE / "result.json").unlink(missing_ok=True)
    for log in HERE.glob("worker-*.log"):
        log.unlink()
    failed = [m["name"] for m in doc["models"] if m["status"] != "built"]
    for model in doc["models"]:
        for path in (HERE / model["name"]).iterdir():
            if path.name not in KEEP:
                path.unlink()
        print(f"{model['name']}: {model['status']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
