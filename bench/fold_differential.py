"""Differential check of layer folding and the layer memo (issue 19), at bench scale.

Seeded one-layer mutants of multi-layer pairs (hand-written HLO and the front end's
deep_mlp_tp4), each verified in three modes (default: folded; --no-fold: partitioned with the
layer memo; --no-fold --no-partition: one e-graph), and by XLA's CPU runtime (tests/oracle.py)
where a mode says verified or the modes disagree and XLA accepts the text. Prints the mutants
per class, the verdicts per mode, and the count of folded/memoized ``verified`` without a
whole-graph ``verified`` (must be 0), plus any ``verified`` the oracle refutes.

    python bench/fold_differential.py --count 2000 --seed 19
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fold_differential.suite import MUTATIONS, base_pairs, mutants, oracle, run_modes, violation  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="mutants in all (default 2000)")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--classes", default="", help="comma-separated mutation classes (default all): " + ", ".join(MUTATIONS))
    ap.add_argument("--no-oracle", action="store_true", help="skip XLA's CPU runtime")
    ap.add_argument("--show", type=int, default=10, help="print up to this many violations in full")
    args = ap.parse_args(argv)
    classes = [c for c in args.classes.split(",") if c] or None
    t0 = time.perf_counter()
    cases = mutants(base_pairs(), args.count, args.seed, classes)
    per_class: Counter[str] = Counter()
    verdicts: dict[str, Counter[str]] = defaultdict(Counter)
    violations: list[tuple[str, str, int, dict[str, str]]] = []
    refuted: list[tuple[str, str, int, dict[str, str]]] = []
    disagree = 0
    oracle_runs = Counter[str]()
    for n, (cls, name, layer, pair) in enumerate(cases, 1):
        v = run_modes(pair)
        per_class[cls] += 1
        for mode, verdict in v.items():
            verdicts[mode][verdict.split(":")[0]] += 1
        if violation(v):
            violations.append((cls, name, layer, v))
        if len(set(v.values())) > 1:
            disagree += 1
        if not args.no_oracle and ("verified" in v.values() or len(set(v.values())) > 1):
            eq = oracle(pair)
            oracle_runs["equal" if eq else "differ" if eq is False else "refused"] += 1
            if eq is False and "verified" in v.values():
                refuted.append((cls, name, layer, v))
        if n % 100 == 0:
            print(f"  {n}/{len(cases)} mutants, {time.perf_counter() - t0:.0f}s, violations so far {len(violations)}", file=sys.stderr, flush=True)
    print(f"{len(cases)} mutants of {len(base_pairs())} pairs (seed {args.seed}) in {time.perf_counter() - t0:.0f}s")
    print("mutants per class: " + ", ".join(f"{c} {per_class[c]}" for c in MUTATIONS if per_class[c]))
    for mode in ("default", "no-fold", "whole"):
        print(f"  {mode:8s} " + ", ".join(f"{k} {c}" for k, c in sorted(verdicts[mode].items())))
    print(f"modes disagree on {disagree}; oracle: " + ", ".join(f"{k} {c}" for k, c in sorted(oracle_runs.items())))
    print(f"folded/memoized verified without whole-graph verified: {len(violations)}")
    print(f"verified refuted by the oracle: {len(refuted)}")
    for cls, name, layer, v in (violations + refuted)[: args.show]:
        print(f"  {cls} on {name} layer {layer}: {v}")
    return 1 if violations or refuted else 0


if __name__ == "__main__":
    raise SystemExit(main())
