"""Mutation campaign benchmark: random single-point mutants of every correct pair (and twin
mutants, one edit applied to a related value on both sides), judged by the numeric oracle (XLA's
CPU runtime) and by the verifier.

    python bench/mutants.py --count 10000 --seed 0 [--workers 2] [--json out/mutants.json]

Prints time, peak RSS, counts per mutation kind and verdict, every soundness bug (a mutant the
oracle finds different that the verifier verifies), robustness findings, and the completeness
backlog (mutants the oracle finds equal that the verifier does not verify), grouped by mutation
kind and opcode. Exits 1 when there is a new soundness bug (one without a reproduction under
tests/soundness_regressions) or a verifier crash.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from mutation.campaign import (  # noqa: E402  (tests/ is not a package on the default path)
    Outcome,
    Pool,
    cpu_count,
    format_report,
    generate,
    judge,
    load_corpus,
    outcome_json,
    peak_rss_mb,
    summarize,
)
from mutation.mutate import KINDS, Mutant  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=cpu_count())
    ap.add_argument("--kinds", help=f"comma-separated subset of: {', '.join(KINDS)}")
    ap.add_argument("--pairs", help="comma-separated subset of corpus pair names")
    ap.add_argument("--extra", type=Path, action="append", default=[], help="a folder of pair folders to add (e.g. shardproof-report, after make example); pairs named bug* are skipped")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per mutant before its worker is killed")
    ap.add_argument("--verify-seconds", type=float, default=60.0, help="the verifier's time budget per e-graph")
    ap.add_argument("--json", type=Path, help="write every outcome (without the mutant text) here")
    ap.add_argument("--save", type=Path, help="write the text of every soundness bug / crash mutant into this folder")
    ns = ap.parse_args(argv)

    t0 = time.perf_counter()
    corpus = load_corpus(REPO, ns.extra)
    if ns.pairs:
        wanted = set(ns.pairs.split(","))
        corpus = [p for p in corpus if p.name in wanted]
    kinds = ns.kinds.split(",") if ns.kinds else None
    # A pair the oracle or the verifier does not accept as correct would make every mutant noise.
    originals = {}
    for p in corpus:
        originals[p.name] = judge(p, Mutant(p.name, "original", "", "", "", p.distributed))
    corpus = [p for p in corpus if originals[p.name]["oracle"] == "equal"]
    names = ", ".join(f"{p.name}:{originals[p.name]['verdict']}" for p in corpus)
    print(f"corpus: {len(corpus)} pairs ({names})", flush=True)
    mutants = generate(corpus, ns.count, ns.seed, kinds)
    print(f"generated {len(mutants)} distinct mutants in {time.perf_counter() - t0:.1f} s; judging with {ns.workers} workers", flush=True)

    pool = Pool(corpus, workers=ns.workers, timeout=ns.timeout, verify_seconds=ns.verify_seconds)
    outcomes: list[Outcome | None] = [None] * len(mutants)
    last = time.perf_counter()
    for done, (i, res) in enumerate(pool.map(mutants), start=1):
        o = outcomes[i] = Outcome(mutants[i], res)
        if o.soundness_bug:
            m = mutants[i]
            tag = f"known: {o.known_bug}" if o.known_bug else "NEW"
            print(f"!! SOUNDNESS BUG [{tag}]: {m.pair} {m.kind} %{m.instruction}: {m.detail}", flush=True)
        if time.perf_counter() - last > 30:
            last = time.perf_counter()
            print(f"  {done}/{len(mutants)} judged, {last - t0:.0f} s", flush=True)
    final = [o for o in outcomes if o is not None]
    summary = summarize(final)
    seconds = time.perf_counter() - t0
    print(format_report(summary, seconds, max(pool.peak_rss_mb, peak_rss_mb())))
    print(f"worker restarts {pool.restarts}")
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps({"seconds": seconds, "outcomes": [outcome_json(o) for o in final]}, indent=1))
    if ns.save:
        ns.save.mkdir(parents=True, exist_ok=True)
        for k, o in enumerate(summary["soundness_bugs"] + summary["crashes"]):
            stem = ns.save / f"{k:03d}_{o.mutant.pair}_{o.mutant.kind}"
            stem.with_suffix(".hlo").write_text(f"// {o.mutant.detail}\n" + o.mutant.text)
            if o.mutant.baseline is not None:
                stem.with_suffix(".baseline.hlo").write_text(o.mutant.baseline)
    return 1 if summary["new_soundness_bugs"] or summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
