"""Pipeline scale: a PP 8 x TP 8 pipeline of 405B-wide MLP blocks, composed and verified,
next to the same blocks tensor-parallel without a pipeline.

    python bench/pipeline_scale.py [--layers 128] [--runs 3]

The model is examples/pipeline/gpipe.py's residual MLP (Megatron-style column/row-parallel
blocks with an all-reduce) at Llama-3.1-405B's width (hidden 16384, FFN 53248), ``--layers``
blocks (128 by default: 16 per stage), batch 4, placeholder weights. It is NOT the 405B decoder
(no attention, no embedding): what it measures is what the pipeline adds — tracing 8 stage
programs, matching their transfers, composing them — and whether the composed program still
folds its repeated layers. Phase 1 builds both pairs once (``run_models``: torch-xla imported
once); phase 2 checks each ``--runs`` times in fresh ``shardproof check`` processes and prints
the medians of wall and CPU time, the verdict, and the ratio pipeline / TP only (the issue's
target: within 2x).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
version: 1
root: {root}
python_path: [{examples}]
defaults:
  timeout: 1200
  memory_mb: 6144
  size: {{hidden: 16384, ffn: 53248, layers: {layers}, batch: 4}}
models:
  - name: pp8_tp8
    entry: gpipe:gpipe_tp
    tp: 8
    size: {{pp: 8}}
  - name: tp8
    entry: gpipe:tp_only
    tp: 8
"""


def check(folder: Path) -> tuple[float, float, str]:
    """One ``shardproof check`` process: wall time, its CPU time (children's rusage delta), verdict."""
    cmd = [sys.executable, "-m", "shardproof.engine.cli", "check", str(folder / "baseline.hlo"), str(folder / "distributed.hlo"), "--relations", str(folder / "relations.yaml"), "--sourcemap", str(folder / "sourcemap.json")]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, (out.splitlines() or ["?"])[0].split(":")[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from shardproof.engine.frontend.runner import run_models

    work = Path(tempfile.mkdtemp(prefix="pipeline_scale"))
    config = work / ".shardproof.yml"
    config.write_text(CONFIG.format(root=json.dumps(str(ROOT)), examples=json.dumps(str(ROOT / "examples" / "pipeline")), layers=args.layers))
    t = time.perf_counter()
    summary = run_models(config, work / "out", verify=False)
    print(f"phase 1: built both pairs in {time.perf_counter() - t:.1f} s")
    for m in summary["models"]:
        print(f"  {m['name']}: build {m['build'].get('seconds', '?')} s, status {m['status']}" + (f" ({m['build'].get('error')})" if m["build"].get("error") else ""))
    rows = {}
    for name in ("pp8_tp8", "tp8"):
        runs = [check(work / "out" / name) for _ in range(args.runs)]
        rows[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), ",".join(sorted({r[2] for r in runs})))
    print(f"\n{'pair':10s} {'verdict':10s} {'total':>8s} {'cpu':>8s}   ({args.layers} blocks, hidden 16384, FFN 53248, medians of {args.runs})")
    for name, (wall, cpu, verdict) in rows.items():
        print(f"{name:10s} {verdict:10s} {wall:7.2f}s {cpu:7.2f}s")
    ratio = rows["pp8_tp8"][0] / rows["tp8"][0]
    print(f"time(PP 8 x TP 8) / time(TP 8) = {ratio:.2f} (target <= 2): {'ok' if ratio <= 2 else 'FAIL'}")
    return 0 if ratio <= 2 and all(v == "verified" for _, _, v in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
