"""Per-family property run of the laws (issue 23, item 1), larger than the suite's: for each
family of tests/laws/families.py, COUNT random programs (random element types with narrow and
unsigned ints, sizes, groups incl. 2 x 2 data x tensor meshes, offsets, fills, ranges, replica
groups) are checked by the verifier and executed in XLA (tests/oracle.py) on two seeds.

    PJRT_DEVICE=CPU python bench/law_properties.py [--count 200] [--seed 1] [--families rankpos,padded]

Prints, per family, the number of programs and the counts of verdict x numbers
(verified/equal, diverged/differs, ...), and every pair that is verified although XLA finds an
output different (a soundness bug: its form and both programs). Exits 1 when there is one.

Measured (2026-11-28, 2 cores shared, ``--count 200 --seed 11``): 1400 programs, 0 verified but
different. argreduce: verified/equal 43, diverged/differs 46, diverged/equal 111; collectives:
118 / 82 / 0; padded: 108 / 56 / 36; permute: 107 verified/equal, 86 differs (82 inconclusive,
4 diverged), 7 inconclusive/equal; rankpos: 81 / 68 / 51; vocab: 18 / 72 / 110; window:
61 / 71 / 68 (verified/equal, not verified and different, not verified and equal)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from laws.families import FAMILIES, generate  # noqa: E402  (tests/ is not a package on the default path)
from laws.run import judge, tally  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=200, help="programs per family")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", default=",".join(sorted(FAMILIES)))
    ns = ap.parse_args(argv)
    unsound = 0
    for family in ns.families.split(","):
        t0 = time.time()
        judged = [judge(p) for p in generate(family, ns.count, ns.seed)]
        counts = tally(judged)
        bad = [j for j in judged if j.unsound]
        unsound += len(bad)
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"{family:12s} {len(judged):5d} programs in {time.time() - t0:6.1f} s: {verdicts}; verified but different: {len(bad)}", flush=True)
        for j in bad:
            print(f"  SOUNDNESS BUG: {j.program.form}\n  {j.detail}\n--- baseline\n{j.program.baseline}--- distributed\n{j.program.distributed}", flush=True)
    return 1 if unsound else 0


if __name__ == "__main__":
    sys.exit(main())
