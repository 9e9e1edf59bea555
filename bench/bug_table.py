"""The README's bug table, from a real run of examples/.shardproof.yml.

    python bench/bug_table.py [--result shardproof-report/result.json] [--out DIR]

Runs every example model (or reads a result.json a run already wrote) and prints two markdown
tables: the correct models with their verdicts, and each bug variant with its public reference
(DESIGN §7), whether it was detected (diverged), and whether the reported divergences include
the line marked ``# BUG-SITE: <variant>`` in examples/tplm.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardproof.engine.frontend.config import load_config  # noqa: E402
from shardproof.engine.frontend.runner import layers_of, run_models  # noqa: E402

CONFIG = ROOT / "examples" / ".shardproof.yml"
_SITE = re.compile(r"#\s*BUG-SITE:\s*([A-Za-z0-9_, ]+?)\s*$")


def sites() -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for path in sorted((ROOT / "examples" / "tplm").glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = _SITE.search(line)
            if match:
                for variant in match.group(1).split(","):
                    out[variant.strip()] = (path.relative_to(ROOT).as_posix(), number)
    return out


def tables(doc: dict[str, Any]) -> str:
    config = load_config(CONFIG)
    by_name = {m["name"]: m for m in doc["models"]}
    marks = sites()
    lines = ["| correct model | verdict | layers | time |", "|---|---|---|---|"]
    for model in config.models:
        if model.variant:
            continue
        entry = by_name[model.name]
        layers = layers_of(entry.get("result"))
        lines.append(f"| `{model.name}`: {model.description} | {entry['status']} | {layers if layers is not None else 'whole'} | {entry['seconds']:.1f} s |")
    lines += ["", "| bug (variant) | public reference | detected | line pinpointed |", "|---|---|---|---|"]
    for model in config.models:
        if not model.variant:
            continue
        entry = by_name[model.name]
        detected = "yes (diverged)" if entry["status"] == "diverged" else f"**no** ({entry['status']})"
        site = marks.get(model.variant)
        divergences = (entry.get("result") or {}).get("divergences", [])
        sources = [(d["source"]["file"], d["source"]["line"]) for d in divergences]
        if site and site in sources:
            rank = sources.index(site) + 1
            where = f"yes: `{site[0]}:{site[1]}`" + ("" if rank == 1 else f" (divergence {rank} of {len(sources)})")
        else:
            shown = ", ".join(f"`{f}:{n}`" for f, n in sources[:2]) or "none"
            where = f"**no**: reported {shown}; bug at `{site[0]}:{site[1]}`" if site else "no BUG-SITE"
        lines.append(f"| `{model.variant}`: {model.description} | {model.reference} | {detected} | {where} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--result", type=Path, help="a result.json of examples/.shardproof.yml (default: run it now)")
    parser.add_argument("--out", type=Path, help="where the run writes its report (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.result:
        doc = json.loads(args.result.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            doc = run_models(CONFIG, args.out or Path(tmp))
    print(tables(doc))
    total = sum(m["seconds"] for m in doc["models"])
    print(f"\n{len(doc['models'])} models, {total:.0f} s of build + check in all ({doc.get('seconds', 0):.0f} s wall clock).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
