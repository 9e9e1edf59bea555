"""The Entangle table: production NeuronX (transformers-neuronx) Llama dumps, checked as they are.

nyu-systems/Entangle ships the HLO that transformers-neuronx wrote for a Llama-3 decoder (hidden
2048, 32 query heads and 8 KV heads of 64, FFN 8192, vocabulary 128256, batch 4, 64 positions)
at TP 1 (the baseline), 2, 4, 6 and 8, with 1, 2, 4 and 8 layers, plus a TP 2 one-layer pair
with a bug (``tp2_layer1.broken``: the K slice of the fused QKV output taken at offset 0, i.e.
from the queries). Its printer elided the one large constant (the rotary ``inv_freq``, f32[32])
as ``{...}``, so without the ``elided-constants`` assumption every pair is ``unsupported``;
with it, the constant of the distributed program is taken to be the baseline's of the same name.

Run:  python bench/neuron_table.py [--data DIR] [--witness-memory-mb MB] [--only tp2_layer1,...]
DIR is Entangle's ``examples/data/aws_llama`` (or ``$SHARDPROOF_ENTANGLE_DATA``). Get it with
``git clone https://github.com/nyu-systems/Entangle`` (the dumps are in the repository, ~17 MB
of HLO text among ~60 MB). Each pair is checked in a fresh ``shardproof check`` process with and
without ``--assume elided-constants``; the table prints verdict and wall time of each.

How the pairs are read (Entangle's examples/verify_aws_llama.py states the same relations as
its preconditions): every rank runs the same program (no rank input); parameters 0-5 (hidden
states, cache ids, start ids, three index scalars) are the same on every rank; then two KV
caches per layer, (positions, batch, KV heads, head dim), split over the ranks along the KV
heads; then per layer the attention RMSNorm weight (replicated), the fused QKV weight (hidden,
q | k | v) split along dim 1 per block (2048 | 512 | 512), the output projection (hidden, q)
split along its input features, the MLP RMSNorm weight (replicated) and the three MLP weights
split along the FFN dim 1; then the final RMSNorm weight and the LM head (hidden, vocab) split
along the vocabulary. Outputs: the logits (vocab, 1, batch) split along the vocabulary, and per
layer the new K and V split along the KV heads. ``AwsNeuronTransferWithStaticRing`` is declared
the identity (``keeps: all``), ``AwsNeuronRmsNorm`` a deterministic function (``keeps:
[duplicate]``: every norm here reads the replicated hidden states).
TP 6 pads the query heads to 36 (6 per rank) and the FFN to 8196 and gives each rank the KV
head of each of its query heads (KV heads repeated, not split); the relations file has no input
relation for such a head pick of a weight, so TP 6 is listed as not declarable.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HIDDEN, Q, KV = 2048, 2048, 512
TPS, LAYERS = (2, 4, 8), (1, 2, 4, 8)


def relations(tp: int, layers: int, assume: bool = False) -> dict[str, Any]:
    """The relations of the Entangle Llama pair at TP ``tp`` with ``layers`` layers."""
    dup: list[dict[str, Any]] = [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]
    # cache ids, start ids and the index scalars: positions < 64 (the gather reads one of 64).
    dup += [{"baseline": p, "distributed": p, "relation": "duplicate", "int_range": [0, 64]} for p in range(1, 6)]
    inputs = dup
    p = 6
    for _ in range(2 * layers):  # KV caches (positions, batch, KV heads, head dim)
        inputs.append({"baseline": p, "distributed": p, "relation": "sharded", "dim": 2})
        p += 1
    for _ in range(layers):
        inputs += [
            {"baseline": p, "distributed": p, "relation": "duplicate"},  # attention RMSNorm weight
            {"baseline": p + 1, "distributed": p + 1, "relation": "sharded", "dim": 1, "blocks": [Q, KV, KV]},  # fused QKV
            {"baseline": p + 2, "distributed": p + 2, "relation": "sharded", "dim": 1},  # output projection
            {"baseline": p + 3, "distributed": p + 3, "relation": "duplicate"},  # MLP RMSNorm weight
        ]
        inputs += [{"baseline": p + k, "distributed": p + k, "relation": "sharded", "dim": 1} for k in (4, 5, 6)]  # gate, up, down
        p += 7
    inputs += [{"baseline": p, "distributed": p, "relation": "duplicate"}, {"baseline": p + 1, "distributed": p + 1, "relation": "sharded", "dim": 1}]
    outputs = [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]
    outputs += [{"baseline": k, "distributed": k, "relation": "sharded", "dim": 2} for k in range(1, 1 + 2 * layers)]
    doc: dict[str, Any] = {
        "description": f"Entangle aws_llama: TP 1 vs TP {tp}, {layers} layer(s) (transformers-neuronx)",
        "groups": [list(range(tp))],
        "inputs": inputs,
        "outputs": outputs,
        "custom_calls": [
            {"target": "AwsNeuronTransferWithStaticRing", "keeps": "all"},
            {"target": "AwsNeuronRmsNorm", "keeps": ["duplicate"]},
        ],
    }
    if assume:
        doc["assume"] = ["elided-constants"]
    return doc


def _child_cpu() -> float:
    # CPU seconds of the finished child processes: on a loaded machine a truer cost than wall time.
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _check(base: Path, dist: Path, rel: Path, assume: bool, memory_mb: float, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "shardproof.engine.cli", "check", str(base), str(dist), "--relations", str(rel), "--json", str(out), "--witness-memory-mb", str(memory_mb)]
    if assume:
        cmd += ["--assume", "elided-constants"]
    t, cpu = time.perf_counter(), _child_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds, cpu = time.perf_counter() - t, _child_cpu() - cpu
    doc = json.loads(out.read_text()) if out.exists() else {"verdict": f"exit {proc.returncode}", "reason": proc.stderr.strip()[-300:]}
    return {"seconds": seconds, "cpu": cpu, "first_line": proc.stdout.splitlines()[0] if proc.stdout else proc.stderr.strip()[-200:], "doc": doc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.environ.get("SHARDPROOF_ENTANGLE_DATA"), help="Entangle's examples/data/aws_llama folder")
    ap.add_argument("--witness-memory-mb", type=float, default=6144.0, help="the broken pair executes ~3.6 GiB (all ranks)")
    ap.add_argument("--only", help="comma-separated pair folders, e.g. tp2_layer1,tp2_layer1.broken")
    ap.add_argument("--out", type=Path, help="write a run document (result.json) of the assumed checks here; render it with `shardproof report --result DIR/result.json --out DIR`")
    args = ap.parse_args()
    if not args.data or not Path(args.data).is_dir():
        print("needs Entangle's dumps: git clone https://github.com/nyu-systems/Entangle, then\n"
              "  python bench/neuron_table.py --data Entangle/examples/data/aws_llama\n"
              "(or set SHARDPROOF_ENTANGLE_DATA to that folder)", file=sys.stderr)
        return 2
    data = Path(args.data)
    pairs = [(f"tp{tp}_layer{n}", tp, n) for tp in TPS for n in LAYERS] + [("tp2_layer1.broken", 2, 1)]
    if args.only:
        keep = set(args.only.split(","))
        pairs = [p for p in pairs if p[0] in keep]
    print("| pair | layers | TP | without the assumption | time | with `--assume elided-constants` | time (cpu) |")
    print("|---|---|---|---|---|---|---|")
    worst = 0
    models: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for folder, tp, n in pairs:
            base, dist = data / f"tp1_layer{n}" / "graph.0.hlo", data / folder / "graph.0.hlo"
            rel = Path(tmp) / f"{folder}.yaml"
            rel.write_text(yaml.safe_dump(relations(tp, n), sort_keys=False))
            plain = _check(base, dist, rel, False, args.witness_memory_mb, Path(tmp) / f"{folder}.plain.json")
            assumed = _check(base, dist, rel, True, args.witness_memory_mb, Path(tmp) / f"{folder}.assumed.json")
            v0, v1 = plain["doc"]["verdict"], assumed["doc"]["verdict"]
            label = v1 + (" (assuming elided constants equal by name)" if assumed["doc"].get("assumptions") else "")
            print(f"| {folder} | {n} | {tp} | {v0} | {plain['seconds']:.1f} s | {label} | {assumed['seconds']:.1f} s ({assumed['cpu']:.1f} s) |", flush=True)
            expect = "diverged" if folder.endswith(".broken") else "verified"
            models.append({"name": f"entangle_{folder.replace('.', '_')}", "status": v1, "expect": expect, "seconds": round(assumed["seconds"], 2), "build": {"error": None}, "result": assumed["doc"], "artifacts": {}})
            if v0 != "unsupported" or v1 != expect:
                worst = 1
            if folder.endswith(".broken"):
                for d in assumed["doc"].get("divergences", []):
                    src = d.get("source") or {}
                    print(f"    finding: {src.get('file')}:{src.get('line')}  {d['instruction']}  {d['cause']}")
                w = assumed["doc"].get("witness") or {}
                print(f"    witness: {w.get('status')}: {w.get('reason')}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps({"version": 1, "config": "", "models": models}, indent=2) + "\n")
    print("tp6_layer*: not declarable: each rank holds the KV head of each of its (padded) query heads; the relations file has no input relation for a head pick of a weight")
    return worst


if __name__ == "__main__":
    sys.exit(main())
