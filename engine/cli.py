"""The ``shardproof`` command line. Subcommands follow the data flow; ``check`` never imports torch."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .errors import EXIT_INTERNAL, InputError, InternalError, internal, is_crash, phase
from .relations import ASSUMPTIONS

if TYPE_CHECKING:
    from .analysis.verify import Result
    from .witness.pair import WitnessOptions

EXIT = {"verified": 0, "diverged": 1, "unproven": 2, "unsupported": 2, "inconclusive": 2, "error": EXIT_INTERNAL}
EXIT_BAD_INPUT = 3
EXIT_CODES = """exit codes:
  0  verified        every output has its expected relation (proven by the rules)
  1  diverged        the programs compute different things: the rules stop at the
                     divergence and XLA's CPU runtime shows differing outputs (a pair
                     too big to execute: `unconfirmed`, the diverging instruction run alone)
  2  unproven, unsupported, inconclusive
                     no proof either way: the rules stopped but the witness found the
                     outputs equal (unproven), an op without rules, or a budget ran out
                     (`run`: also a model that failed to build; `rank-specific` is 1)
  3  bad input       a file, flag or configuration is wrong; the message says where
                     (`run`: also a model whose entry cannot be resolved or imported,
                     or returns no valid declaration: status `bad-input`)
  4  internal error  shardproof itself crashed: a bug in shardproof, not in your program"""


def _check(args: argparse.Namespace) -> int:
    inputs = {"baseline": str(args.baseline), "distributed": str(args.distributed), "relations": str(args.relations)}
    files = list(inputs.values()) + ([str(args.sourcemap)] if args.sourcemap else [])
    from .gcpause import gc_paused

    try:
        # Nearly everything a check allocates lives to its end (lines, instructions, graph
        # nodes, facts): paused once for the whole check, the collector does not walk them all
        # again as each phase that pauses it on its own ends (~90 ms of a 405B check).
        with gc_paused():
            result, lines = _check_pair(args, inputs)
    except InputError:
        raise
    except BaseException as e:  # every crash, in a phase or not (an egglog panic too): exit 4 and result.json
        if not is_crash(e):
            raise
        err = internal(e, "check")
        _record_internal(err, inputs, args.json)
        print(f"error: {err.explain(files)}", file=sys.stderr)
        return EXIT_INTERNAL
    print("\n".join(lines))
    if result.error and result.error.get("phase") == "witness":
        print(f"error: {result.error['message']}\n  this is a bug in shardproof's rules, not in your program; please report it with the files named above", file=sys.stderr)
    if args.timings:
        for k, v in result.timings.items():
            print(f"  {k:10s} {v * 1000:8.1f} ms", file=sys.stderr)
    return EXIT[result.verdict]


def _check_pair(args: argparse.Namespace, inputs: dict[str, str]) -> tuple[Result, list[str]]:
    """Verify the pair, write ``--json``: the result and the lines to print."""
    import time

    from .analysis.check import check_files, verdict_label
    from .analysis.verify import Budget
    from .portable import portable_result
    from .relations import load_relations, with_assumptions
    from .sourcemap import SourceMap

    t = time.perf_counter()
    with phase("read", str(args.relations)) as p:
        spec = with_assumptions(load_relations(args.relations), args.assume or [])
        sm = None
        if args.sourcemap:
            p.at(str(args.sourcemap))
            sm = SourceMap.load(args.sourcemap)
    inputs_seconds = time.perf_counter() - t
    budget = Budget(args.max_iterations, args.timeout, max_nodes=args.max_nodes, partition=not args.no_partition, layer_pattern=args.layer_pattern, progress=True, fold=not args.no_fold)
    with phase("verify"):
        result = check_files(spec, args.baseline, args.distributed, sm, budget, witness=args.witness, witness_options=lambda: _witness_options(args))
    result.timings = {"relations": inputs_seconds, **result.timings}
    with phase("report", str(args.json or "the terminal")):
        # Shared as it is: sources relative to the repository root (--root, else the working folder).
        doc = portable_result(result.to_json(), str(Path(args.root or ".").absolute()))
        doc["inputs"] = inputs
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
        lines = [f"{verdict_label(result.verdict, result.assumptions)}: {result.reason}"]
        for d in result.divergences:
            src = d["source"]
            where = f"{src['file']}:{src['line']}" if src["file"] else f"<no source: {src.get('why', 'unknown')}>"
            if src.get("backward"):
                where = f"in the backward of {where}" + (f" ({d['module']})" if d.get("module") else "")
            lines.append(f"{where}  {d['instruction']}  {d['cause']}")
        for u in result.unsupported:
            lines.append(f"{u['side']}:{u['line']}  %{u['instruction']}  {u['reason']}")
        if result.witness:
            wt = result.witness
            lines.append(f"witness: {wt['status']}: {wt['reason']}" + (f"\n  reproduce: {wt['command']}" if wt["status"] == "confirmed" else ""))
    return result, lines


def _witness_options(args: argparse.Namespace) -> WitnessOptions:
    """The witness's options from the flags; imported only when a witness runs (numpy)."""
    from .witness.pair import WitnessOptions

    return WitnessOptions(memory_mb=args.witness_memory_mb, max_instructions=args.witness_max_instructions)


def _record_internal(e: InternalError, inputs: dict[str, str], json_path: Path | None) -> None:
    """``--json`` still gets a result: verdict ``error`` with the phase, place and message."""
    if not json_path:
        return
    try:
        from .analysis.verify import ERROR, Result

        doc = Result(ERROR, reason=str(e), error=e.to_json()).to_json()
    except Exception:  # the crash may be that very module (a half-edited file): its fields by hand
        doc = {"verdict": "error", "reason": str(e), "outputs": [], "divergences": [], "unsupported": [], "trace": [], "bijections": [], "stats": {}, "timings": {}, "error": e.to_json(), "witness": None, "assumptions": []}
    doc["inputs"] = inputs
    try:
        Path(json_path).write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as oe:
        print(f"error: cannot write {json_path}: {oe.strerror or oe}", file=sys.stderr)


def _witness(args: argparse.Namespace) -> int:
    """Print the comparison of a pair on XLA's CPU runtime; exit 0 equal, 1 different."""
    from .analysis.check import executable_text, read_hlo
    from .analysis.witnessing import relations_doc
    from .relations import load_relations, with_assumptions
    from .witness.pair import DEFAULT_SEEDS, WitnessOptions, witness

    spec = with_assumptions(load_relations(args.relations), args.assume or [])
    texts = [read_hlo(args.baseline), read_hlo(args.distributed)]
    names = _assumed_names(texts, args) if "elided-constants" in spec.assume else []
    texts = [executable_text(t, names) for t in texts]
    options = WitnessOptions(seeds=tuple(args.seed or DEFAULT_SEEDS), memory_mb=args.memory_mb, max_instructions=1 << 62, recheck_f64=not args.no_recheck, stop_at_first_difference=False)
    try:
        report = witness(*texts, relations_doc(spec), options)
    except Exception as e:  # XLA refusing the text, or the memory budget: say so, no verdict
        print(f"error: the witness could not execute the pair: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.equal else 1


def _compose(args: argparse.Namespace) -> int:
    """Compose a pipeline artifact: every transfer matched, the schedule run, then one program
    (engine/pipeline/compose.py); a pipeline that cannot run is bad input naming both ends."""
    from .pipeline.compose import compose_folder

    composed = compose_folder(args.folder)
    out = args.out or args.folder / "distributed.hlo"
    out.write_text(composed.text)
    (out.parent / "sourcemap.json").write_text(json.dumps(composed.sourcemap, indent=1) + "\n")
    st = composed.stats
    print(f"composed {st['stages']} stages along {st['edges']} transfers into {out} ({st['instructions']} instructions)")
    return 0


def _assumed_names(texts: list[str], args: argparse.Namespace) -> list[str]:
    """The elided constants ``check`` assumes equal in this pair (filled alike for execution)."""
    from .analysis.check import _parse
    from .hlo.literals import assume_elided_equal

    base, dist = _parse(texts[0], str(args.baseline)), _parse(texts[1], str(args.distributed))
    return [p.name for p in assume_elided_equal(base, dist)[0]]


def build_parser(extensions: bool = True) -> argparse.ArgumentParser:
    """The whole command line; without ``extensions``, only the subcommands of this module."""
    p = argparse.ArgumentParser(prog="shardproof", description="Prove distributed HLO equivalent to its single-device baseline, or pinpoint where it diverges.", epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="verify one baseline/distributed HLO pair", epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("baseline", type=Path)
    c.add_argument("distributed", type=Path)
    c.add_argument("--relations", required=True, type=Path, help="relations YAML (groups, inputs, outputs)")
    c.add_argument("--sourcemap", type=Path, help="JSON: instruction name -> source frames")
    c.add_argument("--json", type=Path, help="write the full result (verdict, divergences, trace) here")
    c.add_argument("--root", type=Path, help="repository root: --json names source files relative to it (default: the working folder)")
    c.add_argument("--max-iterations", type=int, default=400, help="rewrite iteration budget (default 400)")
    c.add_argument("--timeout", type=float, default=120.0, help="saturation time budget in seconds")
    c.add_argument("--max-nodes", type=int, default=2_000_000, help="e-graph size budget in rows (e-nodes plus relation tuples) per e-graph; bounds memory (default 2000000, 0.6-2 GB)")
    c.add_argument("--timings", action="store_true", help="print a time breakdown to stderr")
    c.add_argument("--no-partition", action="store_true", help="one e-graph for the whole pair instead of one per layer")
    c.add_argument("--no-fold", action="store_true", help="parse every layer instead of folding layers that repeat an earlier one (same verdicts; slower)")
    c.add_argument("--layer-pattern", help="regex whose group 1 is the layer number in op_name (default: layers.N, layers_N, blocks.N, h.N)")
    c.add_argument("--witness", choices=("auto", "always", "never"), default="auto", help="numeric witness (XLA's CPU runtime executes both programs): auto = on outcomes that are not verified (default), always = verified pairs too (a difference is a soundness error, exit 4), never")
    c.add_argument("--witness-memory-mb", type=float, default=2048.0, help="the witness executes nothing whose estimated memory (all ranks) exceeds this (default 2048)")
    c.add_argument("--witness-max-instructions", type=int, default=6000, help="nor a pair with more instructions than this (compile time; default 6000); above either, only the diverging instructions are executed")
    c.add_argument("--assume", action="append", choices=ASSUMPTIONS, help="state an assumption the verdict then rests on (and names): elided-constants = an elided constant ({...}) of the distributed program equals the baseline's of the same name, shape and type (repeatable; also `assume:` in the relations file)")
    c.set_defaults(func=_check)
    w = sub.add_parser("witness", help="execute a pair on XLA's CPU runtime and compare its outputs (the reproducing command of a witness)")
    w.add_argument("baseline", type=Path)
    w.add_argument("distributed", type=Path)
    w.add_argument("--relations", required=True, type=Path, help="relations YAML (groups, inputs, outputs)")
    w.add_argument("--seed", type=int, action="append", help="random-input seed (repeatable; default 0, 1, 1000; a seed >= 1000 draws edge inputs)")
    w.add_argument("--memory-mb", type=float, default=float("inf"), help="refuse pairs estimated above this (default: no limit)")
    w.add_argument("--no-recheck", action="store_true", help="do not recheck differences in f64")
    w.add_argument("--assume", action="append", choices=ASSUMPTIONS, help="elided-constants: fill each elided constant and its namesake in the other program with the same values")
    w.set_defaults(func=_witness)
    pc = sub.add_parser("compose", help="compose a pipeline's stage programs (stage<k>.hlo, pipeline.yaml) into distributed.hlo and sourcemap.json")
    pc.add_argument("folder", type=Path, help="the pipeline model's build folder (holds pipeline.yaml)")
    pc.add_argument("--out", type=Path, help="write the composed program here (default FOLDER/distributed.hlo; its source map beside it as sourcemap.json)")
    pc.set_defaults(func=_compose)
    # Later stages of the flow register their own subcommands (build/run: front end;
    # report/github: the bot). Each module exposes register(subparsers); imports stay light.
    import importlib

    for module in ("shardproof.engine.frontend.commands", "shardproof.bot.commands") if extensions else ():
        try:
            importlib.import_module(module).register(sub)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
    return p


# Subcommands that need none of the later stages: their parse skips importing the front end's
# and the bot's command modules (configuration, schema, runner: ~60 ms of every check).
OWN_COMMANDS = ("check", "witness", "compose")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(extensions=not (argv and argv[0] in OWN_COMMANDS))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return EXIT_BAD_INPUT if e.code not in (0, None) else 0
    try:
        return int(args.func(args))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BaseException as e:  # a crash outside any phase is still ours, never a verdict (exit 1)
        if not is_crash(e):
            raise
        print(f"error: {internal(e, args.command).explain()}", file=sys.stderr)
        return EXIT_INTERNAL


def _exit_now(code: int) -> NoReturn:
    """End a ``check`` process without the interpreter's teardown, which frees the millions of
    objects of a large pair one by one and collects them once more (60-120 ms of a 405B check),
    all of it memory the operating system takes back at once. What must run still runs: the
    atexit handlers (temporary folders, the witness worker) and the flush of stdout/stderr."""
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:  # not CPython: the ordinary exit
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing to flush to
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["check"]:
        # One check per process and nothing after it: the collector is never needed (a 405B
        # check leaves ~4000 objects in cycles; the witness runs in a process of its own).
        gc.disable()
        _exit_now(main())
    sys.exit(main())
