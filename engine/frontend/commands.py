"""``shardproof build`` and ``shardproof run``: the front end's subcommands.

Nothing here imports torch; the builds happen in worker processes (``runner.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import EXIT_INTERNAL, InputError, internal
from .config import find_config
from .runner import exit_code, layers_of, matches, run_models

EXIT_BAD_INPUT = 3
DEFAULT_OUT = Path("shardproof-report")
RUN_EXIT_CODES = """exit codes (the worst model decides; a model whose verdict is its declared expect counts as 0):
  0  every model as expected
  1  a verdict differs from the expected one (a divergence, or a bug variant that verified)
  2  a model is unproven, unsupported or inconclusive, or failed to build
  3  bad input: the configuration or a model name is wrong; the message says where
  4  internal error: shardproof crashed on a model (a bug in shardproof, not in your program)"""


def register(subparsers: Any) -> None:
    b = subparsers.add_parser("build", help="rebuild baseline/distributed HLO, relations and source map of the declared models (torch-xla, or jax with framework: jax)")
    _common(b)
    b.set_defaults(func=_build)
    r = subparsers.add_parser("run", help="build and check every declared model; print a table, write DIR/result.json", epilog=RUN_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(r)
    r.add_argument("--json", type=Path, help="also write the result document here")
    r.add_argument("--timings", action="store_true", help="print build and verification time breakdowns")
    r.set_defaults(func=_run)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="the configuration (default: .shardproof.yml here or in a parent folder)")
    p.add_argument("--models", help="comma-separated model names (default: all)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT}/)")


def _names(args: argparse.Namespace) -> list[str] | None:
    if not args.models:
        return None
    return [n.strip() for n in args.models.split(",") if n.strip()]


def _config(args: argparse.Namespace) -> Path:
    return args.config if args.config is not None else find_config()


class Table:
    """Rows printed as each model finishes, so a long run shows progress."""

    def __init__(self, width: int) -> None:
        self.width = max(width, len("model"))
        print(f"{'model':<{self.width}}  {'verdict':<13} {'expected':<9} {'layers':>6} {'time':>8}  first divergence", flush=True)

    def row(self, entry: dict[str, Any]) -> None:
        status = entry["status"]
        expect = entry.get("expect")
        mark = "" if expect is None and status == "verified" else ("yes" if matches(entry) else "NO")
        if expect is None and status != "verified":
            mark = "NO"
        layers = layers_of(entry.get("result"))
        where = ""
        result = entry.get("result")
        if entry.get("rank_specific"):  # an int-rank model whose ranks differ (torchdist/lift.py)
            where = entry["rank_specific"][0]["message"]
        elif result and result.get("divergences"):
            src = result["divergences"][0]["source"]
            where = f"{src['file']}:{src['line']}" if src.get("file") else f"<no source: {src.get('why', 'unknown')}>"
        elif result and status == "error" and result.get("error"):
            err = result["error"]
            where = f"internal error in phase {err['phase']}" + (f" at {err['where']}" if err.get("where") else "")
        elif result and status in ("unsupported", "inconclusive"):
            where = result.get("reason", "")[:80]
        elif entry["build"]["error"]:
            where = entry["build"]["error"].splitlines()[0][:100]
        if result and result.get("witness"):
            where = (where + "  " if where else "") + f"[witness {result['witness']['status']}]"
        if result and result.get("assumptions"):  # a verdict that rests on a stated assumption says so
            where = (where + "  " if where else "") + "[assuming " + "; ".join(a["text"] for a in result["assumptions"]) + "]"
        seconds = f"{entry['seconds']:.1f}s"
        print(f"{entry['name']:<{self.width}}  {status:<13} {mark:<9} {'-' if layers is None else layers:>6} {seconds:>8}  {where}", flush=True)


def _details(doc: dict[str, Any], timings: bool) -> None:
    for entry in doc["models"]:
        error = entry["build"]["error"]
        if error and "\n" in error:
            print(f"\n{entry['name']}: {entry['status']}\n  " + "\n  ".join(error.splitlines()))
        if entry["status"] == "error" and entry.get("result"):
            print(f"\n{entry['name']}: {entry['result']['reason']}", file=sys.stderr)
        for finding in entry.get("rank_specific") or []:
            print(f"\n{entry['name']}: rank-specific: {finding['message']}")
        if timings and entry["build"].get("rank_seconds"):
            print(f"  {entry['name']}: per-rank builds " + ", ".join(f"{s:.2f}s" for s in entry["build"]["rank_seconds"]))
        if timings:
            result = entry.get("result") or {}
            parts = [f"build {entry['build']['seconds']:.2f}s", f"peak RSS {entry['build']['peak_rss_mb']:.0f} MiB"]
            parts += [f"{k} {v:.2f}s" for k, v in result.get("timings", {}).items()]
            print(f"  {entry['name']}: " + ", ".join(parts), file=sys.stderr)


def _summary(doc: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for entry in doc["models"]:
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    mismatched = [e["name"] for e in doc["models"] if not matches(e)]
    text = f"{len(doc['models'])} model(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    text += f"; {len(doc['models']) - len(mismatched)} as expected"
    if mismatched:
        text += f"; NOT as expected: {', '.join(mismatched)}"
    return text + f" ({doc['seconds']:.1f}s)"


def _run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
        from .config import load_config

        names = [m.name for m in load_config(config).select(_names(args))]
        table = Table(max(len(n) for n in names))
        doc = run_models(config, args.out, _names(args), on_result=table.row)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # a crash outside a model's verification: still ours, exit 4
        print(f"error: {internal(e, 'run').explain()}", file=sys.stderr)
        return EXIT_INTERNAL
    _details(doc, args.timings)
    print(_summary(doc))
    print(f"report: {args.out / 'result.json'}")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return exit_code(doc)


def _build(args: argparse.Namespace) -> int:
    def show(entry: dict[str, Any]) -> None:
        state = entry["status"] if entry["status"] in ("built", "bad-input") else "build-failed"
        line = f"{entry['name']}: {state} in {entry['build']['seconds']:.2f}s, peak RSS {entry['build']['peak_rss_mb']:.0f} MiB"
        if entry["build"]["error"]:
            line += "\n  " + "\n  ".join(entry["build"]["error"].splitlines())
        else:
            line += f" -> {Path(entry['artifacts']['distributed']).parent}"
        print(line, flush=True)

    try:
        doc = run_models(_config(args), args.out, _names(args), verify=False, on_result=show)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if any(e["status"] == "bad-input" for e in doc["models"]):
        return EXIT_BAD_INPUT
    return 0 if all(e["status"] == "built" for e in doc["models"]) else 2
