"""The ``shardproof`` command line. Subcommands follow the data flow; ``check`` never imports torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import InputError

EXIT = {"verified": 0, "diverged": 1, "unsupported": 2, "inconclusive": 2}
EXIT_BAD_INPUT = 3


def _check(args: argparse.Namespace) -> int:
    import time

    from .analysis.check import check_files
    from .analysis.verify import Budget
    from .relations import load_relations
    from .sourcemap import SourceMap

    t = time.perf_counter()
    spec = load_relations(args.relations)
    sm = SourceMap.load(args.sourcemap) if args.sourcemap else None
    inputs_seconds = time.perf_counter() - t
    budget = Budget(args.max_iterations, args.timeout, max_nodes=args.max_nodes, partition=not args.no_partition, layer_pattern=args.layer_pattern, progress=True, fold=not args.no_fold)
    result = check_files(spec, args.baseline, args.distributed, sm, budget)
    result.timings = {"relations": inputs_seconds, **result.timings}
    doc = result.to_json()
    doc["inputs"] = {"baseline": str(args.baseline), "distributed": str(args.distributed), "relations": str(args.relations)}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{result.verdict}: {result.reason}")
    for d in result.divergences:
        src = d["source"]
        where = f"{src['file']}:{src['line']}" if src["file"] else "<no source>"
        print(f"{where}  {d['instruction']}  {d['cause']}")
    for u in result.unsupported:
        print(f"{u['side']}:{u['line']}  %{u['instruction']}  {u['reason']}")
    if args.timings:
        for k, v in result.timings.items():
            print(f"  {k:10s} {v * 1000:8.1f} ms", file=sys.stderr)
    return EXIT[result.verdict]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardproof", description="Prove distributed HLO equivalent to its single-device baseline, or pinpoint where it diverges.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="verify one baseline/distributed HLO pair")
    c.add_argument("baseline", type=Path)
    c.add_argument("distributed", type=Path)
    c.add_argument("--relations", required=True, type=Path, help="relations YAML (groups, inputs, outputs)")
    c.add_argument("--sourcemap", type=Path, help="JSON: instruction name -> source frames")
    c.add_argument("--json", type=Path, help="write the full result (verdict, divergences, trace) here")
    c.add_argument("--max-iterations", type=int, default=400, help="rewrite iteration budget (default 400)")
    c.add_argument("--timeout", type=float, default=120.0, help="saturation time budget in seconds")
    c.add_argument("--max-nodes", type=int, default=2_000_000, help="e-graph size budget in rows (e-nodes plus relation tuples) per e-graph; bounds memory (default 2000000, 0.6-2 GB)")
    c.add_argument("--timings", action="store_true", help="print a time breakdown to stderr")
    c.add_argument("--no-partition", action="store_true", help="one e-graph for the whole pair instead of one per layer")
    c.add_argument("--no-fold", action="store_true", help="parse every layer instead of folding layers that repeat an earlier one (same verdicts; slower)")
    c.add_argument("--layer-pattern", help="regex whose group 1 is the layer number in op_name (default: layers.N, layers_N, blocks.N, h.N)")
    c.set_defaults(func=_check)
    # Later stages of the flow register their own subcommands (build/run: front end;
    # report/github: the bot). Each module exposes register(subparsers); imports stay light.
    import importlib

    for module in ("shardproof.engine.frontend.commands", "shardproof.bot.commands"):
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_BAD_INPUT if e.code not in (0, None) else 0
    try:
        return int(args.func(args))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
