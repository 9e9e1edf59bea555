"""Build time and peak RSS of production-shaped declarations with placeholder weights.

    python bench/build_llama.py [--models 405b_tp8,405b_tp32,...] [--verify] [--out DIR]

Each model is examples/tplm's Llama (or Mixtral) at real sizes, declared like the examples and
built by the same front end (one worker process, a forked child per model): the modules are
constructed on the meta device and every weight is a placeholder, so nothing the size of a
weight is ever allocated. Prints, per model, the build time, the child's peak resident memory
(which includes the ~0.5 GB of the imported torch/torch-xla it shares with the worker), the HLO
sizes and instruction counts; ``--verify`` also runs the verifier.

Llama-3.1-405B: 126 layers, hidden 16384, 128 heads, 8 KV heads, FFN 53248, vocab 128256.
At TP 32 there are fewer KV heads than ranks; the per-rank program then keeps the KV projection
whole and picks its KV head by rank (Megatron's KV-head replication), a build-only shape: its
relations (a rank-selected head of a replicated weight) are beyond the verifier's rules today.
Mixtral at EP 8 has one expert per rank, and a batch of 1 gives the decoders unit dims: both
meet open verifier gaps (tests/gaps/one_expert_per_rank, one_head_per_rank_batch1).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardproof.engine.frontend.runner import run_models  # noqa: E402

# The published configurations (size knobs of tplm.models:llama); bench/scale.py uses them too.
LLAMA_8B = {"vocab": 128256, "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn": 14336}
LLAMA_70B = {"vocab": 128256, "hidden": 8192, "layers": 80, "heads": 64, "kv_heads": 8, "ffn": 28672}
LLAMA_405B = {"vocab": 128256, "hidden": 16384, "layers": 126, "heads": 128, "kv_heads": 8, "ffn": 53248}
MIXTRAL_8X7B = {"vocab": 32000, "hidden": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ffn": 14336, "experts": 8, "top_k": 2}
MIXTRAL_8X22B = {"vocab": 32768, "hidden": 6144, "layers": 56, "heads": 48, "kv_heads": 8, "ffn": 16384, "experts": 8, "top_k": 2}
SHAPES: dict[str, tuple[int, dict[str, object]]] = {
    "llama3.1_405b_tp8": (8, LLAMA_405B),
    "llama3.1_405b_tp32": (32, LLAMA_405B),
    "llama3.1_8b_tp8": (8, LLAMA_8B),
    "llama3.1_70b_tp8": (8, LLAMA_70B),
    "mixtral_8x7b_ep8": (8, MIXTRAL_8X7B),
    "mixtral_8x22b_ep8": (8, MIXTRAL_8X22B),
}


def tplm_config(models: list[dict[str, Any]], timeout: float) -> str:
    """A .shardproof.yml for examples/tplm models (``models``: name, entry, tp, size, ...)."""
    config = {
        "version": 1,
        "root": str(ROOT),
        "python_path": [str(ROOT / "examples")],
        "hide_frames": ["examples/tplm/parallel.py"],
        "defaults": {"timeout": timeout, "memory_mb": 20000},
        "models": models,
    }
    return yaml.safe_dump(config, sort_keys=False)


def config_text(names: list[str], timeout: float, seq: int, batch: int) -> str:
    models = []
    for name in names:
        tp, size = SHAPES[name]
        models.append({"name": name, "entry": "tplm.models:llama", "tp": tp, "size": {**size, "seq": seq, "batch": batch}})
    return tplm_config(models, timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama3.1_405b_tp8,llama3.1_405b_tp32", help=f"comma-separated, of: {', '.join(SHAPES)}; 'all' for every one")
    parser.add_argument("--verify", action="store_true", help="also run the verifier on each pair")
    parser.add_argument("--timeout", type=float, default=600.0, help="build time cap per model, seconds")
    parser.add_argument("--seq", type=int, default=8, help="sequence length of the example input (the graph barely depends on it)")
    parser.add_argument("--batch", type=int, default=2, help="batch size of the example input")
    parser.add_argument("--out", type=Path, help="keep the artifacts here (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args(argv)
    names = list(SHAPES) if args.models == "all" else [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(SHAPES)}")

    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / ".shardproof.yml"
        config.write_text(config_text(names, args.timeout, args.seq, args.batch))
        out = args.out or Path(tmp) / "out"
        started = time.perf_counter()
        doc = run_models(config, out, verify=args.verify)
        rows = []
        print(f"{'model':<22} {'TP':>3} {'layers':>6} {'build':>8} {'peak RSS':>10} {'baseline HLO':>13} {'per-rank HLO':>13}  {'verdict' if args.verify else ''}")
        for entry in doc["models"]:
            tp, size = SHAPES[entry["name"]]
            build = entry["build"]
            summary = json.loads((out / entry["name"] / "build.json").read_text()).get("summary", {}) if (out / entry["name"] / "build.json").exists() else {}
            sizes = summary.get("hlo_bytes", {})
            row = {
                "model": entry["name"], "tp": tp, "layers": size["layers"], "build_seconds": build["seconds"],
                "peak_rss_mb": build["peak_rss_mb"], "hlo_bytes": sizes, "status": entry["status"], "error": build["error"],
                "trace_seconds": summary.get("timings", {}),
            }  # fmt: skip
            rows.append(row)
            mb = {k: f"{v / 1e6:.1f} MB" for k, v in sizes.items()}
            check = entry["seconds"] - build["seconds"]
            row["check_seconds"] = round(check, 2)
            verdict = f"{entry['status']} in {check:.1f}s" if args.verify else ("" if entry["status"] == "built" else entry["status"])
            print(f"{entry['name']:<22} {tp:>3} {size['layers']:>6} {build['seconds']:>7.1f}s {build['peak_rss_mb']:>7.0f} MiB {mb.get('baseline', '-'):>13} {mb.get('distributed', '-'):>13}  {verdict}")
            if build["error"]:
                print("    " + build["error"].splitlines()[0])
        print(f"worker import {doc['worker_import_seconds']:.1f}s (once per run), total {time.perf_counter() - started:.1f}s")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["status"] in ("built", "verified") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
