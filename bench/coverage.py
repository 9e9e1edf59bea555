"""Coverage on code nobody here wrote: how many CORRECT programs the rules verify, per source.

    python bench/coverage.py [--out DIR] [--sources jax,megatron,...] [--rebuild] [--json FILE]

A gate that says "not proven" on a third of correct pull requests teaches people to ignore it,
so this measures the verified fraction the way an outside user meets it (issue 25). The corpus
is every correct program of:

| source | what | from |
|---|---|---|
| ``jax``         | JAX shard_map / GSPMD / flax models                | examples/jax/.shardproof.yml |
|                 | (outside.py: MaxText / praxis / flax nnx / optax spellings, GShard MoE, psum_scatter, pmax, top_k, remat) | |
| ``megatron``    | Megatron-core layers, unmodified                    | examples/megatron/.shardproof.yml |
| ``torchdist``   | fairscale and DeepSpeed layers, unmodified           | examples/torchdist/.shardproof.yml |
| ``dtensor``     | DTensor plans, transformers' TP plans, torchtitan    | examples/dtensor/.shardproof.yml |
| ``hand:<producer>`` | production spellings written by hand, oracle-labelled correct (``c_*``) | tests/adversarial/pairs |

A model is correct when it declares no bug: its ``expect`` is absent, ``verified``, ``unproven``
or ``unsupported`` (bug variants expect ``diverged`` or ``rank-specific`` and are not counted).
Builds are cached under ``--out`` (default ``coverage-out/``): a model whose folder already holds
its built HLO pair is not rebuilt (``--rebuild`` forces it); every check runs on the current
tree, so the figures are those of the rules as they are now. Per source it prints the verified
fraction; then every correct program that is not verified, with where the rules stopped (the
frontier instruction, its opcode, the source line, the relation missing), and the stopping
causes ranked by how many programs they stop.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "jax": ROOT / "examples/jax/.shardproof.yml",
    "megatron": ROOT / "examples/megatron/.shardproof.yml",
    "torchdist": ROOT / "examples/torchdist/.shardproof.yml",
    "dtensor": ROOT / "examples/dtensor/.shardproof.yml",
}
PAIRS = ROOT / "tests/adversarial/pairs"
BUG_EXPECTS = {"diverged", "rank-specific", "bad-input", "build-failed"}
ARTIFACTS = ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json")


@dataclass
class Row:
    source: str
    name: str
    verdict: str
    seconds: float
    stops: list[dict[str, str]] = field(default_factory=list)  # where the rules stopped


def _stops(result: dict[str, Any] | None) -> list[dict[str, str]]:
    """Where the rules stopped: the frontier instructions (unproven/diverged) or the unsupported
    ops, each with its source line and the cause in the verdict's own words."""
    if not result:
        return []
    out = []
    for d in result.get("divergences") or []:
        src = d.get("source") or {}
        where = src.get("file") and f"{src.get('file')}:{src.get('line')}" if isinstance(src, dict) else str(src)
        out.append({"instruction": str(d.get("instruction", "?")), "opcode": str(d.get("opcode", "?")), "where": str(where or "-"), "cause": " ".join(str(d.get("cause", "")).split())})
    for u in result.get("unsupported") or []:
        out.append({"instruction": str(u.get("instruction", "?")), "opcode": str(u.get("opcode", "?")), "where": f"line {u.get('line')}", "cause": " ".join(str(u.get("reason", "")).split())})
    if not out and result.get("verdict") != "verified":
        out.append({"instruction": "-", "opcode": "-", "where": "-", "cause": " ".join(str(result.get("reason", "")).split())})
    return out


def _cause_class(stop: dict[str, str]) -> str:
    """The stopping cause without its instance names: numbers and %names folded so that one
    missing law counted over many programs is one line."""
    cause = re.sub(r"%[\w.\-]+", "%x", stop["cause"])
    cause = re.sub(r"\b\d+\b", "N", cause)
    return f"{stop['opcode']}: {cause[:150]}"


def correct_models(config_path: Path) -> list[Any]:
    from shardproof.engine.frontend.config import load_config

    config = load_config(config_path)
    return [m for m in config.models if (m.expect or "verified") not in BUG_EXPECTS]


def build_missing(source: str, config_path: Path, out: Path, rebuild: bool) -> None:
    """Build the correct models of ``config_path`` whose artifacts are not cached in ``out``."""
    from shardproof.engine.frontend.runner import run_models

    names = [m.name for m in correct_models(config_path) if rebuild or not all((out / m.name / a).is_file() for a in ARTIFACTS)]
    if not names:
        return
    print(f"[{source}] building {len(names)} model(s) into {out}", file=sys.stderr, flush=True)
    run_models(config_path, out, names, verify=False)


def check_config(source: str, config_path: Path, out: Path) -> list[Row]:
    from shardproof.engine.frontend.runner import verify_model

    rows = []
    for model in correct_models(config_path):
        folder = out / model.name
        t = time.perf_counter()
        if not all((folder / a).is_file() for a in ARTIFACTS):
            rows.append(Row(source, model.name, "build-failed", 0.0, [{"instruction": "-", "opcode": "-", "where": str(folder / "build.log"), "cause": "no HLO pair was built"}]))
            continue
        status, result, error = verify_model(model, folder)
        stops = _stops(result) or ([{"instruction": "-", "opcode": "-", "where": "-", "cause": error}] if error else [])
        rows.append(Row(source, model.name, status, time.perf_counter() - t, stops))
        print(f"  {source:10} {model.name:40} {status:12} {rows[-1].seconds:6.1f} s", file=sys.stderr, flush=True)
    return rows


def check_pairs() -> list[Row]:
    """The hand-written correct pairs of the adversarial suite, one source per producer."""
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    rows = []
    for folder in sorted(p for p in PAIRS.iterdir() if p.name.startswith("c_") and (p / "label.yaml").is_file()):
        label = yaml.safe_load((folder / "label.yaml").read_text())
        if label.get("kind") != "correct":
            continue
        source = f"hand:{label.get('producer', '?')}"
        t = time.perf_counter()
        try:
            result = check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo").to_json()
            verdict = str(result["verdict"])
        except Exception as e:  # a checker crash is a row of its own, never a pass
            result, verdict = {"verdict": "error", "reason": f"{type(e).__name__}: {e}"}, "error"
        rows.append(Row(source, folder.name, verdict, time.perf_counter() - t, _stops(result)))
        print(f"  {source:10} {folder.name:40} {verdict:12} {rows[-1].seconds:6.1f} s", file=sys.stderr, flush=True)
    return rows


def report(rows: list[Row]) -> str:
    lines = ["", "source           verified / correct   fraction"]
    by_source: dict[str, list[Row]] = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(r)
    for source, rs in by_source.items():
        v = sum(r.verdict == "verified" for r in rs)
        lines.append(f"{source:16} {v:8} / {len(rs):<8} {100.0 * v / len(rs):6.1f} %")
    v = sum(r.verdict == "verified" for r in rows)
    lines.append(f"{'total':16} {v:8} / {len(rows):<8} {100.0 * v / max(len(rows), 1):6.1f} %")
    gaps = [r for r in rows if r.verdict != "verified"]
    if gaps:
        lines += ["", "not verified (where the rules stopped first):"]
        for r in gaps:
            s = r.stops[0] if r.stops else {"instruction": "-", "opcode": "-", "where": "-", "cause": ""}
            lines.append(f"  {r.source}/{r.name}: {r.verdict}: {s['instruction']} ({s['opcode']}) at {s['where']}: {s['cause'][:160]}")
        counts = Counter(_cause_class(r.stops[0]) for r in gaps if r.stops)
        lines += ["", "top stopping causes (programs stopped):"]
        lines += [f"  {n:3}  {cause}" for cause, n in counts.most_common(12)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("coverage-out"), help="cache folder of the builds (default coverage-out/)")
    ap.add_argument("--sources", default=",".join([*CONFIGS, "hand"]), help="comma-separated: " + ", ".join([*CONFIGS, "hand"]))
    ap.add_argument("--rebuild", action="store_true", help="rebuild cached models")
    ap.add_argument("--no-build", action="store_true", help="check only what is cached (a missing build counts as build-failed)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    unknown = [s for s in sources if s not in CONFIGS and s != "hand"]
    if unknown:
        ap.error(f"unknown source(s) {', '.join(unknown)}; known: {', '.join([*CONFIGS, 'hand'])}")
    rows: list[Row] = []
    for s in sources:
        if s == "hand":
            rows += check_pairs()
            continue
        out = args.out.absolute() / s
        if not args.no_build:
            build_missing(s, CONFIGS[s], out, args.rebuild)
        rows += check_config(s, CONFIGS[s], out)
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
