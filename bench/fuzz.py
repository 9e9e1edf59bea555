"""Fuzzing benchmark: a million inputs into the HLO parser, the relations loader, the
``.shardproof.yml`` loader and the bot's GitHub event and patch parsers, and whole mutated pairs
through verify(), on every core.

    python bench/fuzz.py --count 1000000 [--engine auto|atheris|random] [--verify-count 2000]

``--count`` is shared by every target (TARGET_SHARE); ``--verify-count`` pairs come on top.

Engines:
- ``atheris`` (coverage-guided libFuzzer, if ``pip install atheris`` worked): one fuzzer process
  per text target, seeded with the repository's files of that kind and a token dictionary,
  ``-timeout`` as the hang detector. A crash stops that fuzzer and leaves its input under
  ``out/fuzz/``; the data targets (relations-data, verify) run on the random engine;
- ``random``: our own structured mutators (tests/mutation/fuzzing.py) in a process pool; every
  input is timed, a SIGALRM watchdog turns a hang into a counted outcome.

Counted per target: ok / clean error / known engine bug (KNOWN in tests/mutation/fuzzing.py) /
crash / slow (> 1 s). Exits 1 when any new crash or slow input was found.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mutation import fuzzing  # noqa: E402  (tests/ is not a package on the default path)

CHUNK = 2000
WATCHDOG_S = 20
# Share of --count per target. The parser gets what rounding leaves.
TARGET_SHARE = {"parser": 0.25, "relations": 0.2, "relations-data": 0.1, "config": 0.15, "event": 0.15, "patch": 0.15}
TEXT_TARGETS = ("parser", "relations", "config", "event", "patch")  # atheris feeds these bytes
DICTIONARY = [
    "HloModule", "ENTRY", "ROOT", "parameter(", "constant(", "tuple(", "get-tuple-element(", "index=",
    "f32[", "bf16[", "s32[", "pred[", "]{1,0}", "(f32[], f32[])", "->", "%", "=", "{", "}", "(", ")",
    "replica_groups=", "{{0,1},{2,3}}", "[2,2]<=[4]", "T(1,0)", "dimensions={", "slice={[0:8], [0:4]}",
    "to_apply=", "metadata={op_name=\"", "source_line=", "lhs_contracting_dims={1}", "channel_id=1",
    "all-reduce(", "all-gather(", "reduce-scatter(", "dot(", "reduce(", "broadcast(", "/*", "*/", "//",
    "sharding={devices=[2,1]<=[2]}", "padding=0_0x1_2_1", "window={size=1x3 stride=1x2}", "FileNames",
    "groups:", "inputs:", "outputs:", "relation:", "duplicate", "sharded", "partial", "rank", "token",
    "dim:", "blocks:", "baseline:", "distributed:", "custom_calls:", "int_range:", "&a", "*a", "!!str",
    "version: 1", "models:", "- name:", "entry:", "m:f", "tp:", "defaults:", "size:", "timeout:", "layer_pattern:",
    "python_path:", "hide_frames:", "<<:", "!!int", "!!timestamp", ".nan", ".inf",
    '"pull_request"', '"head"', '"sha"', '"number"', '"repository"', '"full_name"', '"workflow_run"',
    '"head_sha"', '"pull_requests"', '"after"', "null", "1e999", "@@ -1,3 +1,4 @@", "\\ No newline at end of file",
]  # fmt: skip


# -- random engine ------------------------------------------------------------------------------


def _alarm(_sig: int, _frame: Any) -> None:
    raise TimeoutError("watchdog")


def _random_input(rng: random.Random, target: str, seeds: dict[str, list[Any]]) -> tuple[str, Any]:
    r = rng.random()
    if target == "parser":
        if r < 0.6:
            return "mutated", fuzzing.mutate_text(rng, rng.choice(seeds["hlo"]))
        if r < 0.85:
            return "values", fuzzing.mutate_hlo(rng, rng.choice(seeds["hlo"]))
        alphabet = "HloModule ENTRY ROOT %p=f32[4,2]{1,0}()parameter,add\n:->\"=\x00\u00e9"
        return "random", "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    if target == "relations":
        if r < 0.7:
            return "mutated", fuzzing.mutate_text(rng, rng.choice(seeds["rel"])).replace("\ud800", "?")
        alphabet = "groups:inputs[]{},-0123 \nrelation: sharded dim: &a*a!!"
        return "random", "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
    if target == "relations-data":
        base = rng.choice(seeds["data"])
        if r < 0.4:
            return "mutated", fuzzing.mutate_relations(rng, base)
        if r < 0.8:
            return "perturbed", fuzzing.perturb_relations(rng, base)
        return "random", fuzzing.random_value(rng)
    if target == "config":
        if r < 0.4:
            return "structured", fuzzing.mutate_config(rng, rng.choice(seeds["config"]))
        if r < 0.8:
            return "mutated", fuzzing.mutate_text(rng, rng.choice(seeds["config"]))
        if r < 0.9:
            return "bytes", bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
        alphabet = "models:- name entry: m:f tp: 2 groups[[0,1]]{}\n  #&*!<>|'\"\x00\t"
        return "random", "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    if target == "event":
        pr_event = rng.choice([None, None, rng.choice(seeds["event"]), fuzzing.mutate_tree(rng, rng.choice(seeds["event"]), fuzzing._EVENT_KEYS, fuzzing._EVENT_VALUES)])
        name = rng.choice(fuzzing.EVENT_NAMES)
        if r < 0.85:
            return "mutated", (fuzzing.mutate_event(rng, rng.choice(seeds["event"])), name, pr_event)
        return "bytes", (bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))), name, pr_event)
    if target == "patch":
        if r < 0.35:
            patch, added, context = fuzzing.valid_patch(rng)
            return "valid", (patch, (added, context))
        if r < 0.9:
            return "mutated", (fuzzing.mutate_patch(rng, rng.choice(seeds["patch"])), None)
        alphabet = "@@ -+,0123456789\n \\No newline\r\x0c\u2028"
        return "random", ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))), None)
    pair = rng.choice(seeds["pairs"])
    dist, rel = pair.distributed, pair.relations
    if r < 0.7:
        from shardproof.engine.hlo.parser import parse_hlo

        for _ in range(20):
            cand = fuzzing.mutate_hlo(rng, dist)
            try:
                parse_hlo(cand)
            except Exception:  # unparseable candidates are skipped here
                continue
            dist = cand
            break
    if r > 0.4:
        rel = fuzzing.perturb_relations(rng, rel)
    return "pair", (pair.baseline, dist, rel)


def _run_one(target: str, arg: Any) -> fuzzing.Outcome:
    if target == "parser":
        return fuzzing.parse_target(arg)
    if target == "relations":
        return fuzzing.relations_text_target(arg)
    if target == "relations-data":
        return fuzzing.relations_data_target(arg)
    if target == "config":
        return fuzzing.config_target(arg)
    if target == "event":
        return fuzzing.event_target(*arg)
    if target == "patch":
        return fuzzing.patch_target(*arg)
    return fuzzing.verify_target(*arg)


def _chunk(job: tuple[str, int, int]) -> dict[str, Any]:
    target, seed, n = job
    seeds = _seeds()
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    slowest = 0.0
    signal.signal(signal.SIGALRM, _alarm)
    for _ in range(n):
        how, arg = _random_input(rng, target, seeds)
        signal.alarm(WATCHDOG_S)
        try:
            out = _run_one(target, arg)
        except TimeoutError:
            out = fuzzing.Outcome("slow", "hang", f"no result within {WATCHDOG_S}s", WATCHDOG_S)
        finally:
            signal.alarm(0)
        slowest = max(slowest, out.seconds)
        key = f"{out.status}" + (f" {out.key}" if out.status in ("known", "crash") else "")
        counts[key] += 1
        if out.status in ("crash", "slow") and key not in examples:
            examples[key] = f"[{how}] {out.detail[:200]} | input: {repr(arg)[:600]}"
    return {"target": target, "counts": counts, "examples": examples, "slowest": slowest, "n": n}


_SEEDS: dict[str, list[Any]] | None = None


def _seeds() -> dict[str, list[Any]]:
    global _SEEDS
    if _SEEDS is None:
        import yaml
        from mutation.campaign import load_corpus

        rel = fuzzing.relations_seeds()
        _SEEDS = {
            "hlo": fuzzing.hlo_seeds(), "rel": rel, "data": [yaml.safe_load(t) for t in rel], "pairs": load_corpus(REPO),
            "config": fuzzing.config_seeds(), "event": fuzzing.event_seeds(), "patch": fuzzing.patch_seeds(),
        }  # fmt: skip
    return _SEEDS


def text_seeds(target: str) -> list[bytes]:
    """The repository's own inputs of a text target, for atheris' starting corpus."""
    if target == "parser":
        texts = fuzzing.hlo_seeds()
    elif target == "relations":
        texts = fuzzing.relations_seeds()
    elif target == "config":
        texts = fuzzing.config_seeds()
    elif target == "event":
        texts = [json.dumps(e) for e in fuzzing.event_seeds()]
    else:
        texts = fuzzing.patch_seeds()
    return [t.encode("utf-8", errors="surrogatepass") for t in texts]


def text_outcome(target: str, data: bytes) -> fuzzing.Outcome:
    """One atheris input (bytes) into a text target."""
    if target == "config":
        return fuzzing.config_target(data)  # as bytes: the loader's decoding is under test too
    if target == "event":
        return fuzzing.event_target(data)
    text = data.decode("utf-8", errors="replace")
    if target == "parser":
        return fuzzing.parse_target(text)
    if target == "relations":
        return fuzzing.relations_text_target(text)
    return fuzzing.patch_target(text)


def random_engine(targets: dict[str, int], workers: int, seed: int) -> dict[str, Any]:
    jobs = []
    for t_index, (target, count) in enumerate(targets.items()):
        size = 100 if target == "verify" else CHUNK  # a verify() input costs ~1000 parser inputs
        for k in range(0, count, size):
            jobs.append((target, seed * 1_000_003 + t_index * 100_003 + k, min(size, count - k)))
    random.Random(seed).shuffle(jobs)  # mix cheap and expensive chunks across workers
    totals: dict[str, dict[str, Any]] = {t: {"counts": Counter(), "examples": {}, "slowest": 0.0, "n": 0} for t in targets}
    done = 0
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        for res in pool.imap_unordered(_chunk, jobs):
            tot = totals[res["target"]]
            tot["counts"].update(res["counts"])
            for k, v in res["examples"].items():
                tot["examples"].setdefault(k, v)
            tot["slowest"] = max(tot["slowest"], res["slowest"])
            tot["n"] += res["n"]
            done += res["n"]
            if done % 50_000 < res["n"]:
                print(f"  {done} inputs, {time.perf_counter() - t0:.0f} s", flush=True)
    return totals


# -- atheris engine ----------------------------------------------------------------------------


def atheris_child(target: str, runs: int, seed: int, stats: Path, corpus: Path, artifacts: Path) -> None:
    """Runs inside its own process: libFuzzer drives TestOneInput until ``runs`` inputs."""
    import atheris

    # Modules imported inside this block get coverage instrumentation (libFuzzer's guidance);
    # fuzzing.py imports them lazily, so this is their first import in this process. PyYAML is
    # imported first, uninstrumented: instrumented, its pure-Python scanner is ~50x slower, and
    # its coverage would steer the fuzzer into YAML syntax instead of our loaders.
    import yaml  # noqa: F401

    with atheris.instrument_imports():
        for name in ("shardproof.engine.hlo.parser", "shardproof.engine.hlo.shapecheck", "shardproof.engine.relations", "shardproof.engine.frontend.schema", "shardproof.engine.frontend.config", "shardproof.bot.event", "shardproof.bot.diff"):
            importlib.import_module(name)
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    slowest = [0.0]
    dumped = [time.monotonic()]

    def dump() -> None:
        stats.write_text(json.dumps({"counts": counts, "examples": examples, "slowest": slowest[0]}))
        dumped[0] = time.monotonic()

    def one(data: bytes) -> None:
        out = text_outcome(target, data)
        slowest[0] = max(slowest[0], out.seconds)
        key = f"{out.status}" + (f" {out.key}" if out.status in ("known", "crash") else "")
        counts[key] += 1
        if out.status in ("crash", "slow") and key not in examples:
            examples[key] = f"{out.detail[:200]} | input: {data[:600]!r}"
        # libFuzzer ends the process from C when it is done (no Python exit handlers run): write
        # the counts often, and at the last input it will run.
        n = sum(counts.values())
        if n % 500 == 0 or n >= runs or time.monotonic() - dumped[0] > 2:
            dump()
        if out.status == "crash":
            dump()
            raise RuntimeError(f"new crash class {out.key}: {out.detail}")

    dict_file = artifacts / "hlo.dict"
    dict_file.write_text("".join(f'"{_escape(w)}"\n' for w in DICTIONARY))
    args = [sys.argv[0], f"-runs={runs}", f"-seed={seed}", "-timeout=10", "-rss_limit_mb=4096", "-max_len=8192", f"-dict={dict_file}", f"-artifact_prefix={artifacts}/{target}-", "-print_final_stats=1", str(corpus)]
    atheris.Setup(args, one)
    atheris.Fuzz()


def _escape(w: str) -> str:
    return "".join(c if c.isprintable() and c not in '"\\' else f"\\x{ord(c):02x}" for c in w)


def atheris_engine(targets: dict[str, int], seed: int) -> dict[str, Any]:
    artifacts = REPO / "out" / "fuzz"
    artifacts.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardproof-fuzz-"))
    procs = {}
    for i, (target, runs) in enumerate(targets.items()):
        corpus = work / f"corpus-{target}"
        corpus.mkdir()
        for k, data in enumerate(text_seeds(target)):
            (corpus / f"seed{k}").write_bytes(data[:8192])
        stats = work / f"{target}.json"
        cmd = [sys.executable, __file__, "--atheris-child", target, "--count", str(runs), "--seed", str(seed + i), "--stats", str(stats), "--corpus", str(corpus), "--artifacts", str(artifacts)]
        log = open(work / f"{target}.log", "w")  # noqa: SIM115 - closed after the child exits
        procs[target] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), stats, log)
    totals: dict[str, dict[str, Any]] = {}
    for target, (proc, stats, log) in procs.items():
        proc.wait()
        log.close()
        text = (work / f"{target}.log").read_text(errors="replace")
        data = json.loads(stats.read_text()) if stats.is_file() else {"counts": {}, "examples": {}, "slowest": 0.0}
        done = re.findall(r"Done (\d+) runs in (\d+) second", text)
        n = int(done[-1][0]) if done else sum(data["counts"].values())
        if proc.returncode != 0:
            data["examples"]["fuzzer exit"] = f"exit code {proc.returncode}; log tail: {text[-1500:]}"
            data["counts"]["crash fuzzer-stopped"] = data["counts"].get("crash fuzzer-stopped", 0) + 1
        totals[target] = {"counts": Counter(data["counts"]), "examples": data["examples"], "slowest": data["slowest"], "n": n, "log": str(work / f"{target}.log")}
    return totals


# -- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000, help="inputs over all targets together (shares: TARGET_SHARE)")
    ap.add_argument("--verify-count", type=int, default=2000, help="mutated pairs through verify() (random engine)")
    ap.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--atheris-child", help=argparse.SUPPRESS)
    ap.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--artifacts", type=Path, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.atheris_child:
        atheris_child(ns.atheris_child, ns.count, ns.seed, ns.stats, ns.corpus, ns.artifacts)
        return 0

    engine = ns.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "random"
    shares = {t: int(ns.count * w) for t, w in TARGET_SHARE.items()}
    shares["parser"] += ns.count - sum(shares.values())
    t0 = time.perf_counter()
    print(f"engine {engine}: {ns.count} inputs over {', '.join(shares)}, {ns.verify_count} pairs through verify(), {ns.workers} workers", flush=True)
    if engine == "atheris":
        totals = atheris_engine({t: n for t, n in shares.items() if t in TEXT_TARGETS}, ns.seed)
        rest = {t: n for t, n in shares.items() if t not in TEXT_TARGETS} | ({"verify": ns.verify_count} if ns.verify_count else {})
        totals.update(random_engine(rest, ns.workers, ns.seed))
    else:
        totals = random_engine(shares | {"verify": ns.verify_count}, ns.workers, ns.seed)
    seconds = time.perf_counter() - t0
    bad = 0
    total_inputs = sum(t["n"] for t in totals.values())
    print(f"\n{total_inputs} inputs in {seconds:.0f} s ({total_inputs / max(seconds, 1e-9):.0f}/s)")
    for target, t in totals.items():
        counts = t["counts"]
        print(f"{target:15s} {t['n']:9d} inputs, slowest {t['slowest']:.2f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
        for k, v in t["examples"].items():
            print(f"    {k}: {v[:400]}")
        bad += sum(v for k, v in counts.items() if k.startswith(("crash", "slow")))
    print("known engine bugs (tests/mutation/fuzzing.py KNOWN):")
    for k, v in fuzzing.KNOWN.items():
        n = sum(t["counts"].get(f"known {k}", 0) for t in totals.values())
        print(f"  {n:8d}  {k}: {v}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
