"""Scale: verification time and memory of production-shaped Llama-3.1 and Mixtral pairs.

    python bench/scale.py [--runs 5] [--out DIR | --reuse DIR] [--only NAME,...] [--json FILE]

Phase 1 builds every pair once with the front end (examples/tplm declarations at the published
sizes, placeholder weights; one ``run_models`` call, so torch-xla is imported once). Phase 2
verifies each pair ``--runs`` times, each run a fresh ``shardproof check`` process (runs of
different pairs interleaved, so a change of the machine's load spreads over all of them), and
prints the medians of

- parse:  reading the relations file, source map and the two HLO texts, folding the layers that
          repeat an earlier one (hlo.fold), parsing what is left (the verifier's timings),
- verify: normalize + partition + graph build + saturate + localize (the verifier's timings;
          for a pair that is not verified folded, also the folded run before the unfolded one),
- total:  the wall time of the whole ``shardproof check`` process, start to exit (the bounds
          apply to it),
- cpu:    that process's user + system CPU time (two worker threads may make it exceed the
          wall time; unlike the wall time it barely moves with the load of other processes),
- peak RSS of that process (``ru_maxrss`` from ``wait4``),
- decoder layers proven / reused (from the memo of the layer partitioning),

next to the paper's figures (Scalify, Table ``tab:results``: TP 32 graphs of Transformers NeuronX,
verified on a 6-core laptop) and the bounds of the scale issue, each marked ok or FAIL. The exit
code is 1 when any bound or expected verdict fails (a pair that does not verify is reported with
its verdict and reason, never hidden), 0 otherwise.

Shapes: batch 2, sequence 4 by default (the graphs barely depend on them); Llama-3.1 8B/70B/405B
and Mixtral 8x7B/8x22B at TP 8 and TP 32; for the ratios also 405B at TP 2 and a 32-layer
405B-shaped model (same width); and a 405B TP 8 pair whose per-rank program lacks the attention
all-reduce in layer 117 only (``bug_layer``), which must be diverged and pinpointed there.

Training rows (``train_*``): tplm's training step (forward, loss, backward, sequence-parallel
norm-gradient all-reduce, SGD update of every parameter) at Llama-3.1-8B width with 8 and 32
layers, separate and fused QKV (seq 16, batch 2); and at 405B shape (126 layers) at TP 8 and TP
32, next to TrainVerify's 28,786 s. The build times of every pair are printed in phase 1,
separately from the verification times. ``--only train_8b_8l_tp8,train_8b_32l_tp8`` and so on.

Mixtral: tplm's model has one parallel group. When the 8 experts divide over the ranks (TP 8)
they are expert parallel (whole experts per rank, the combine an unrolled loop of adds and an
all-reduce); at TP 32 they are tensor-parallel experts (every rank holds all 8, each expert's
SwiGLU split along its ffn dim, as Megatron-LM does with expert-parallel size 1). Mixtral-8x22B
has 48 attention heads, which do not divide over 32 ranks; tplm pads them to 64 as Neuron does
(zero-padded query and output weights, the KV projection replicated and picked per query head),
and the relations file says so (``relation: padded``, rules/padded.egg).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_llama import LLAMA_8B, LLAMA_70B, LLAMA_405B, MIXTRAL_8X7B, MIXTRAL_8X22B, tplm_config  # noqa: E402

from shardproof.engine.frontend.runner import run_models  # noqa: E402

ARTIFACTS = ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json")
RSS_BOUND_MB = 2048.0
# The verifier's timings that read the inputs: the relations file and source map, the HLO
# texts, folding repeated layers in them, parsing what is left.
READING = ("relations", "read", "fold", "parse")
BUG_LAYER = 117
TRAIN = "tplm.models:train_step"
TRAIN_8B = dict(LLAMA_8B)
TRAIN_SHAPE = {"seq": 16, "batch": 2}  # the sequence is split over TP ranks (sequence parallel)
# TrainVerify (SOSP 2025): Llama-3-405B training verification on 32 vCPUs, seconds.
TRAINVERIFY_405B = 28786
# TrainVerify's pipeline-parallel plans, t_total in seconds (its artifact's final figures:
# microsoft/nnscaler, Verdict/data/4_stats_large_final.csv; the artifact guide runs them with 30
# workers on >= 32 vCPUs): (model, layers, DP, PP, TP, microbatches, seconds).
TRAINVERIFY_PP = (
    ("Llama-3-405B", 126, 64, 16, 8, 16, 28786),
    ("Llama-3-70B", 80, 16, 4, 8, 32, 8532),
    ("DeepSeek-V3-671B", 61, 32, 8, 8, 16, 32371),
)
# Pipeline rows (examples/pipeline/llama_pp.py): tplm's decoder stack and final norm at 405B
# shape, 8 stages of 16/16/16/16/16/16/15/15 layers, each stage TP 8, composed along the 7
# transfers; the same stack at TP 8 without a pipeline is its reference (target: within 2x).
PIPE = "pipeline.llama_pp:decoder_pipeline"
PIPE_TP = "pipeline.llama_pp:decoder_tp"
DECODER_405B = dict(LLAMA_405B)


@dataclass
class Pair:
    name: str
    model: str  # what the table calls it
    size: dict[str, Any]
    tp: int
    paper: float | None = None  # seconds, Scalify Table tab:results (TP 32, 6-core laptop)
    variant: str | None = None
    expect: str = "verified"
    why: str = ""  # for expect="build-failed": the error the front end must give
    entry: str = "tplm.models:llama"
    shape: dict[str, int] = field(default_factory=dict)  # seq/batch instead of the command line's


PAIRS = [
    Pair("llama3.1_8b_tp8", "Llama-3.1-8B", LLAMA_8B, 8, 48),
    Pair("llama3.1_8b_tp32", "Llama-3.1-8B", LLAMA_8B, 32, 48),
    Pair("llama3.1_70b_tp8", "Llama-3.1-70B", LLAMA_70B, 8, 100),
    Pair("llama3.1_70b_tp32", "Llama-3.1-70B", LLAMA_70B, 32, 100),
    Pair("llama3.1_405b_tp2", "Llama-3.1-405B", LLAMA_405B, 2, 157),
    Pair("llama3.1_405b_tp8", "Llama-3.1-405B", LLAMA_405B, 8, 157),
    Pair("llama3.1_405b_tp32", "Llama-3.1-405B", LLAMA_405B, 32, 157),
    # TP 6 (issue 15's Neuron example): 32 heads padded to 36, the 8 KV heads replicated and
    # picked per query head, FFN 14336 padded to 14340 (rules/padded.egg).
    Pair("llama3.1_8b_tp6", "Llama-3.1-8B, padded", LLAMA_8B, 6),
    Pair("llama3.1_405b_32l_tp8", "405B width, 32 layers", {**LLAMA_405B, "layers": 32}, 8),
    Pair("mixtral_8x7b_tp8", "Mixtral-8x7B", MIXTRAL_8X7B, 8, 112),
    Pair("mixtral_8x7b_tp32", "Mixtral-8x7B", MIXTRAL_8X7B, 32, 112),
    Pair("mixtral_8x22b_tp8", "Mixtral-8x22B", MIXTRAL_8X22B, 8, 181),
    # 48 heads over 32 ranks: padded to 64 (2 per rank, ranks 24..31 only padding), the 8 KV
    # heads replicated and picked per query head (Neuron's layout; rules/padded.egg).
    Pair("mixtral_8x22b_tp32", "Mixtral-8x22B", MIXTRAL_8X22B, 32, 181),
    Pair("llama3.1_405b_tp8_bug117", f"405B, bug in layer {BUG_LAYER}", {**LLAMA_405B, "bug_layer": BUG_LAYER}, 8, variant="missing_attn_allreduce", expect="diverged"),
    # Training steps (tplm.models:train_step: forward, loss, backward, SP norm-gradient
    # all-reduce, SGD update of every parameter) at Llama-3.1-8B width, seq 16, batch 2.
    Pair("train_8b_8l_tp8", "8B-width train step, 8 layers", {**TRAIN_8B, "layers": 8, "fused": False}, 8, entry=TRAIN, shape=TRAIN_SHAPE),
    Pair("train_8b_32l_tp8", "8B-width train step, 32 layers", {**TRAIN_8B, "layers": 32, "fused": False}, 8, entry=TRAIN, shape=TRAIN_SHAPE),
    Pair("train_8b_8l_tp8_fused", "8B-width train step, fused QKV", {**TRAIN_8B, "layers": 8, "fused": True}, 8, entry=TRAIN, shape=TRAIN_SHAPE),
    Pair("train_8b_32l_tp8_fused", "8B-width train step, fused QKV", {**TRAIN_8B, "layers": 32, "fused": True}, 8, entry=TRAIN, shape=TRAIN_SHAPE),
    # 405B shape. At TP 32 the 8 KV heads are shared by groups of 4 ranks (index_select by
    # r // 4), whose backward is an index_add (scatter, rules/scatter.egg). Seq 32: one token
    # per rank under sequence parallelism, so the RMSNorm's per-token scale is squeezed to a
    # unit-free shape on the rank (rules/layout.egg, unit-reshape-broadcast).
    Pair("train_405b_tp8", "405B-shaped train step", LLAMA_405B, 8, TRAINVERIFY_405B, entry=TRAIN, shape=TRAIN_SHAPE),
    Pair("train_405b_tp32", "405B-shaped train step", LLAMA_405B, 32, TRAINVERIFY_405B, entry=TRAIN, shape={"seq": 32, "batch": 2}),
    # Pipeline rows (engineer G): PP 8 x TP 8 forward of the 405B decoder stack, and its TP 8 reference.
    Pair("decoder_405b_pp8_tp8", "405B decoder stack, PP 8 x TP 8", {**DECODER_405B, "pp": 8}, 8, entry=PIPE),
    Pair("decoder_405b_tp8", "405B decoder stack, TP 8", DECODER_405B, 8, entry=PIPE_TP),
]  # fmt: skip


@dataclass
class Measured:
    pair: Pair
    build_error: str | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)  # one per verification process

    @property
    def last(self) -> dict[str, Any]:
        return self.runs[-1] if self.runs else {}

    @property
    def verdict(self) -> str:
        if self.build_error is not None:
            return "build-failed"
        verdicts = {r["verdict"] for r in self.runs}
        if not verdicts:
            return "not run"
        return verdicts.pop() if len(verdicts) == 1 else "unstable:" + ",".join(sorted(verdicts))

    def median(self, key: str) -> float | None:
        values = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# Phase 1: build


def config_text(pairs: list[Pair], seq: int, batch: int, timeout: float) -> str:
    models = []
    for p in pairs:
        m: dict[str, Any] = {
            "name": p.name,
            "entry": p.entry,
            "tp": p.tp,
            "size": {**p.size, "seq": seq, "batch": batch, **p.shape},
        }
        if p.variant:
            m["variant"] = p.variant
        models.append(m)
    return tplm_config(models, timeout)


def built(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ARTIFACTS)


def build(
    pairs: list[Pair], out: Path, seq: int, batch: int, timeout: float
) -> dict[str, str | None]:
    """Build the pairs not yet in ``out``; name -> build error (None when built)."""
    errors: dict[str, str | None] = {p.name: None for p in pairs if built(out / p.name)}
    todo = [p for p in pairs if p.name not in errors]
    if todo:
        print(f"building {len(todo)} pair(s) into {out} ...", flush=True)
        config = out / ".shardproof.yml"
        config.write_text(config_text(todo, seq, batch, timeout))
        started = time.perf_counter()
        doc = run_models(config, out, verify=False)
        for entry in doc["models"]:
            error = entry["build"]["error"]
            errors[entry["name"]] = error.strip().splitlines()[-1] if error else None
            state = "built" if not error else "build failed: " + errors[entry["name"]]  # type: ignore[operator]
            print(
                f"  {entry['name']:<28} {entry['build']['seconds']:6.1f}s  peak {entry['build']['peak_rss_mb']:6.0f} MiB  {state}",
                flush=True,
            )
        print(
            f"  torch-xla import {doc['worker_import_seconds']:.1f}s once, all builds {time.perf_counter() - started:.1f}s",
            flush=True,
        )
    if len(errors) > len(todo):
        print(f"reusing {len(errors) - len(todo)} built pair(s) in {out}", flush=True)
    return errors


# ---------------------------------------------------------------------------------------------
# Phase 2: verify, one fresh process per run


# ``--without``: the check process leaves these law families out (laws.leave_out: their rules
# not loaded, their hooks not called, their relations declared and empty): what a family costs.
WITHOUT = """import runpy, sys
from shardproof.engine.analysis import laws
try:
    laws.leave_out(n for n in sys.argv.pop(1).split(",") if n)
except ValueError as e:
    sys.exit(f"--without: {e}")
runpy.run_module("shardproof.engine.cli", run_name="__main__", alter_sys=True)
"""


def check_once(folder: Path, timeout: float, without: str = "") -> dict[str, Any]:
    """One ``shardproof check`` process on the pair in ``folder``: verdict, timings, peak RSS."""
    result = folder / "check.json"
    result.unlink(missing_ok=True)
    start = [sys.executable, "-c", WITHOUT, without] if without else [sys.executable, "-m", "shardproof.engine.cli"]
    cmd = [
        *start, "check",
        str(folder / "baseline.hlo"), str(folder / "distributed.hlo"),
        "--relations", str(folder / "relations.yaml"), "--sourcemap", str(folder / "sourcemap.json"),
        "--json", str(result),
    ]  # fmt: skip
    with tempfile.TemporaryFile("w+") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = started + timeout
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read()
    cpu = usage.ru_utime + usage.ru_stime
    run: dict[str, Any] = {
        "total": wall,
        "cpu": cpu,
        "peak_rss_mb": usage.ru_maxrss / 1024.0,
        "exit": proc.returncode,
    }
    if wall > timeout:
        return {**run, "verdict": "timeout", "reason": f"killed after {timeout:g} s"}
    try:
        doc = json.loads(result.read_text())
    except (OSError, json.JSONDecodeError):
        tail = " | ".join(output.strip().splitlines()[-3:])
        return {**run, "verdict": "crashed", "reason": f"exit {proc.returncode}: {tail}"}
    timings = doc.get("timings", {})
    report = doc.get("stats", {}).get("segment_report") or []
    # Decoder layers, forward and backward (the backward of layer k is a segment of its own).
    layers = [s for s in report if s.get("layer", -1) >= 0]
    first = (doc.get("divergences") or [{}])[0]
    return {
        **run,
        "verdict": doc["verdict"],
        "reason": doc.get("reason", ""),
        "parse": sum(timings.get(k, 0.0) for k in READING),
        "verify": sum(v for k, v in timings.items() if k not in READING),
        "folded": (doc.get("stats", {}).get("fold") or {}).get("folded_layers"),
        "timings": timings,
        "layers": len(layers),
        "layers_proven": sum(1 for s in layers if not s.get("reused")),
        "layers_reused": sum(1 for s in layers if s.get("reused")),
        "segments": doc.get("stats", {}).get("segments"),
        "divergence": {k: first.get(k) for k in ("instruction", "op_name", "source", "cause")}
        if first
        else None,
        "witness": {k: (doc.get("witness") or {}).get(k) for k in ("status", "seconds", "segment")} if doc.get("witness") else None,
    }


# ---------------------------------------------------------------------------------------------
# Report


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}s" if x < 100 else f"{x:.0f}s"


def fmt_paper(x: float | None) -> str:
    if x is None:
        return "-"
    m, s = divmod(int(x), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def report(
    measured: dict[str, Measured], runs: int
) -> tuple[list[tuple[str, bool, str]], list[dict[str, Any]]]:
    """Print the table and the checks; returns (checks, JSON rows)."""
    print()
    print(
        f"medians of {runs} run(s), each a fresh `shardproof check` process; paper: Scalify Table 2 (TP 32, 6-core laptop); for train_405b_*: TrainVerify (Llama-3-405B training, 32 vCPUs)"
    )
    head = f"{'pair':<30} {'TP':>3} {'layers':>6}  {'verdict':<13} {'parse':>6} {'verify':>7} {'total':>7} {'cpu':>7} {'peak RSS':>9}  {'proven/reused':>13}  {'paper':>6}"
    print(head)
    print("-" * len(head))
    rows = []
    checks: list[tuple[str, bool, str]] = []
    for m in measured.values():
        p = m.pair
        total = m.median("total")
        rss = max((r["peak_rss_mb"] for r in m.runs), default=None)
        last = m.last
        layers = (
            f"{last['layers_proven']}/{last['layers_reused']}" if "layers_proven" in last else "-"
        )
        rss_text = "-" if rss is None else f"{rss:.0f} MiB"
        verdict = m.verdict
        print(
            f"{p.name:<30} {p.tp:>3} {p.size['layers']:>6}  {verdict:<13} {fmt_s(m.median('parse')):>6} {fmt_s(m.median('verify')):>7} {fmt_s(total):>7} {fmt_s(m.median('cpu')):>7} {rss_text:>9}  {layers:>13}  {fmt_paper(p.paper):>6}"
        )
        ok = verdict == p.expect and (p.expect != "build-failed" or p.why in (m.build_error or ""))
        why = m.build_error or last.get("reason", "")
        div = last.get("divergence") or {}
        src = div.get("source") or {}
        where = f"{src.get('file')}:{src.get('line')} ({div.get('op_name')}): {str(div.get('cause'))[:160]}"
        if p.variant and ok:
            # A bug is shown by the numeric witness (the whole pair is too big to execute: its
            # diverging instruction, executed alone, differs: `unconfirmed` with that segment)
            # and pinpointed in its layer.
            wit = last.get("witness") or {}
            shown = wit.get("status") == "confirmed" or (wit.get("status") == "unconfirmed" and bool(wit.get("segment")))
            ok = f"layers.{BUG_LAYER}." in (div.get("op_name") or "") and shown
            why = f"pinpointed at {where}; witness {wit.get('status')} in {wit.get('seconds')} s" + (f" on {wit['segment']['instruction']}" if wit.get("segment") else "")
        elif div:
            why += f"; first divergence at {where}"
        checks.append(
            (f"{p.name}: {p.expect}", ok, "" if ok and not p.variant else f"{verdict}: {why}")
        )
        rows.append({
            "name": p.name, "model": p.model, "tp": p.tp, "layers": p.size["layers"], "variant": p.variant,
            "expect": p.expect, "verdict": verdict, "build_error": m.build_error,
            "median": {k: m.median(k) for k in ("parse", "verify", "total", "cpu")}, "peak_rss_mb": rss,
            "layers_proven": last.get("layers_proven"), "layers_reused": last.get("layers_reused"),
            "paper_seconds": p.paper, "runs": m.runs,
        })  # fmt: skip

    def t(name: str, key: str = "total") -> float | None:
        m = measured.get(name)
        return m.median(key) if m and m.runs and m.verdict == m.pair.expect else None

    def bound(
        label: str, value: float | None, limit: float, unit: str = "s", cpu: float | None = None
    ) -> None:
        if value is None:
            checks.append(
                (f"{label} <= {limit:g}{unit}", False, "not measured: the pair is not verified")
            )
            return
        detail = f"{value:.2f}{unit}" + (
            "" if cpu is None else f"; the same from CPU time: {cpu:.2f}{unit}"
        )
        checks.append((f"{label} <= {limit:g}{unit}", value <= limit, detail))

    if "llama3.1_405b_tp32" in measured:
        bound("405B TP32 total", t("llama3.1_405b_tp32"), 15.0, cpu=t("llama3.1_405b_tp32", "cpu"))
        m = measured["llama3.1_405b_tp32"]
        rss = max((r["peak_rss_mb"] for r in m.runs), default=None)
        bound("405B TP32 peak RSS", rss if m.verdict == "verified" else None, RSS_BOUND_MB, " MiB")
    for name in ("llama3.1_8b_tp8", "llama3.1_8b_tp32"):
        if name in measured:
            bound(f"8B TP{measured[name].pair.tp} total", t(name), 5.0, cpu=t(name, "cpu"))
    for name in ("train_8b_32l_tp8", "train_8b_32l_tp8_fused"):
        if name in measured:
            bound(f"{name} total", t(name), 30.0, cpu=t(name, "cpu"))
    for name in ("train_405b_tp8", "train_405b_tp32"):
        if name in measured and t(name) is not None:
            print(f"  (info) {name}: {measured[name].verdict} in {t(name):.1f}s vs TrainVerify's {TRAINVERIFY_405B} s (Llama-3-405B, 32 vCPUs): {TRAINVERIFY_405B / t(name):.0f}x")

    def ratio(label: str, num: str, den: str, limit: float | None) -> None:
        if num not in measured or den not in measured:
            return
        values = []
        for key in ("total", "cpu"):
            a, b = t(num, key), t(den, key)
            values.append(a / b if a is not None and b else None)
        if limit is None:
            print(
                f"  (info) {label} = {'-' if values[0] is None else f'{values[0]:.2f}'} (from CPU time: {'-' if values[1] is None else f'{values[1]:.2f}'})"
            )
        else:
            bound(label, values[0], limit, "", cpu=values[1])

    print()
    ratio("time(405B TP32)/time(405B TP2)", "llama3.1_405b_tp32", "llama3.1_405b_tp2", 1.2)
    ratio("time(405B TP8)/time(405B TP2)", "llama3.1_405b_tp8", "llama3.1_405b_tp2", None)
    ratio(
        "time(405B 126 layers)/time(405B 32 layers), TP8",
        "llama3.1_405b_tp8",
        "llama3.1_405b_32l_tp8",
        2.0,
    )
    ratio("time(train 32 layers)/time(train 8 layers), 8B width TP8", "train_8b_32l_tp8", "train_8b_8l_tp8", 2.0)
    ratio("time(train 32 layers)/time(train 8 layers), fused QKV", "train_8b_32l_tp8_fused", "train_8b_8l_tp8_fused", 2.0)
    # A bug run costs at most 1.5x its verified twin: the folded run's divergence is witnessed
    # (no unfolded run), and the witness refuses a pair above its budget before shipping it.
    ratio("time(405B TP8 bug in layer 117)/time(405B TP8 verified)", "llama3.1_405b_tp8_bug117", "llama3.1_405b_tp8", 1.5)
    ratio("time(405B decoder PP8 x TP8)/time(405B decoder TP8)", "decoder_405b_pp8_tp8", "decoder_405b_tp8", 2.0)
    ratio("time(405B decoder PP8 x TP8)/time(405B TP8 whole model)", "decoder_405b_pp8_tp8", "llama3.1_405b_tp8", None)
    if t("decoder_405b_pp8_tp8") is not None:
        ours = t("decoder_405b_pp8_tp8")
        for model, layers, dp, pp, tp, nm, secs in TRAINVERIFY_PP:
            print(f"  (info) TrainVerify {model} ({layers} layers) DP {dp} x PP {pp} x TP {tp}, {nm} microbatches, training plan: {secs:,} s; decoder_405b_pp8_tp8 (forward, 1 microbatch): {ours:.1f} s")
    for name in ("train_405b_tp8", "train_405b_tp32"):
        # A verified pair does no localization work (the relation trace is timed apart).
        m = measured.get(name)
        runs = [r for r in (m.runs if m else []) if "timings" in r]
        if m is not None and runs and m.verdict == "verified":
            loc = statistics.median(r["timings"].get("localize", 0.0) for r in runs)
            tr = statistics.median(r["timings"].get("trace", 0.0) for r in runs)
            print(f"  (info) {name}: localization {loc:.2f}s, relation trace of the outputs {tr:.2f}s (verified)")
            checks.append((f"{name}: no localization work when verified", loc < 0.05, f"{loc:.3f}s"))
    for label, ok, detail in checks:
        print(f"  {'ok  ' if ok else 'FAIL'}  {label}" + (f"  [{detail}]" if detail else ""))
    return checks, rows


def breakdown(measured: dict[str, Measured]) -> None:
    """Where the time goes: the median of each of the verifier's timings, per pair."""
    print()
    print("verifier timings (median seconds):")
    keys = ["relations", "read", "fold", "parse", "normalize", "partition", "build", "saturate", "trace", "localize", "folded_run", "witness"]
    print(f"  {'pair':<30} " + " ".join(f"{k[:9]:>9}" for k in keys) + f" {'overhead':>9}")
    for m in measured.values():
        if not any("timings" in r for r in m.runs):
            continue
        med = {
            k: statistics.median(r["timings"].get(k, 0.0) for r in m.runs if "timings" in r)
            for k in keys
        }
        overhead = m.median("total") - sum(med.values())  # type: ignore[operator]
        print(
            f"  {m.pair.name:<30} "
            + " ".join(f"{med[k]:>9.2f}" for k in keys)
            + f" {overhead:>9.2f}"
        )
    print(
        "  (overhead: interpreter start, imports, writing the JSON, outside the verifier's timings)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=5, help="verifications per pair (median), default 5"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--out", type=Path, help="build into this folder and keep it (default: a temporary folder)"
    )
    where.add_argument(
        "--reuse",
        type=Path,
        help="use the pairs already built in this folder; build only the missing ones",
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated pair names (default all): {', '.join(p.name for p in PAIRS)}",
    )
    parser.add_argument(
        "--seq", type=int, default=4, help="sequence length of the example input (default 4)"
    )
    parser.add_argument(
        "--batch", type=int, default=2, help="batch size of the example input (default 2)"
    )
    parser.add_argument(
        "--build-timeout", type=float, default=900.0, help="build time cap per pair, seconds"
    )
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=900.0,
        help="time cap per verification process, seconds",
    )
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument(
        "--without",
        default="",
        help="comma-separated law families to leave out of every check (engine/analysis/laws: "
        "e.g. rankint,modgroup, the per-rank evaluation), to measure what they cost",
    )
    args = parser.parse_args(argv)
    pairs = PAIRS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {p.name for p in PAIRS})
        if unknown:
            parser.error(f"unknown pairs {unknown}")
        pairs = [p for p in PAIRS if p.name in names]

    print(
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)"
        + (f"; law families left out: {args.without}" if args.without else ""),
        flush=True,
    )
    started = time.perf_counter()
    tmp = None
    if args.reuse or args.out:
        out = (args.reuse or args.out).absolute()
        out.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="shardproof-scale-")
        out = Path(tmp)
    try:
        errors = build(pairs, out, args.seq, args.batch, args.build_timeout)
        measured = {p.name: Measured(p, errors[p.name]) for p in pairs}
        loads: list[float] = []
        for run in range(args.runs):
            for m in measured.values():
                if m.build_error is None:
                    r = check_once(out / m.pair.name, args.check_timeout, args.without)
                    r["load"] = os.getloadavg()[0]
                    loads.append(r["load"])
                    m.runs.append(r)
                    print(
                        f"  run {run + 1}/{args.runs}  {m.pair.name:<28} {r['verdict']:<12} {r['total']:6.1f}s (cpu {r['cpu']:5.1f}s)  {r['peak_rss_mb']:6.0f} MiB",
                        flush=True,
                    )
        checks, rows = report(measured, args.runs)
        if loads:
            print(
                f"  1-minute load average after each run: median {statistics.median(loads):.2f}, max {max(loads):.2f} on {os.cpu_count()} cores"
            )
        breakdown(measured)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; bench {time.perf_counter() - started:.0f}s"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "pairs": rows,
                    "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks],
                },
                indent=2,
            )
            + "\n"
        )
    failed = [c for c, ok, _ in checks if not ok]
    print(
        f"{len(checks) - len(failed)} of {len(checks)} checks ok"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
