"""Independent numeric oracle of the tests: run a baseline / distributed HLO pair on XLA's own
CPU runtime and compare.

The machinery is the product's numeric witness, ``engine/witness`` (runtime: reading, flavour
mapping, channel renumbering, compiling, executing; inputs: random inputs satisfying the
relations; compare: per-dtype tolerances); this module keeps the functions the tests use.
It never reads op semantics itself: it hands the HLO text to XLA and compares numbers.

``run_pair(baseline, distributed, relations, seed)`` runs one seed without the f64 recheck
(the tests judge rounding themselves); ``run_hlo`` / ``run_distributed`` run one program.
See ``engine/witness/inputs.py`` and ``compare.py`` for the relations contract and the
tolerances.

Command line: ``python tests/oracle.py BASELINE.hlo DISTRIBUTED.hlo RELATIONS.yaml [--seed N]``
prints the comparison and exits 0 when the pair is equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from shardproof.engine.witness.compare import OutputCheck
from shardproof.engine.witness.pair import PairReport as PairResult
from shardproof.engine.witness.pair import run_pair
from shardproof.engine.witness.runtime import run_distributed, run_hlo

__all__ = ["OutputCheck", "PairResult", "assert_equal_on_seeds", "fusions_as_calls", "run_distributed", "run_hlo", "run_pair"]


def assert_equal_on_seeds(baseline: str, distributed: str, relations: object, seeds: int = 2) -> None:
    """The truth for a correct twin: XLA runs both programs equal on every seed."""
    for seed in range(seeds):
        run = run_pair(baseline, distributed, relations, seed=seed)  # type: ignore[arg-type]
        assert run.equal, run.summary()


def fusions_as_calls(text: str) -> str:
    """XLA:CPU cannot compile the fusions of an already optimized module again ('Fusion must
    have backend config'); a fusion computes its fused computation, so XLA runs the same
    program with each fusion written as a call (XLA inlines it itself)."""
    out = []
    for line in text.split("\n"):
        if re.search(r"\bfusion\(", line):
            line = re.sub(r"\bfusion\(", "call(", line)
            line = re.sub(r",\s*kind=k\w+", "", line)
            line = re.sub(r"\bcalls=", "to_apply=", line)
            line = re.sub(r",\s*backend_config=\{.*\}\s*$", "", line)
        out.append(line)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    import yaml

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("baseline", help="baseline HLO text file")
    ap.add_argument("distributed", help="distributed HLO text file")
    ap.add_argument("relations", help="relations YAML file")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    with open(ns.baseline) as f:
        baseline = f.read()
    with open(ns.distributed) as f:
        distributed = f.read()
    with open(ns.relations) as f:
        relations = yaml.safe_load(f)
    result = run_pair(baseline, distributed, relations, seed=ns.seed)
    print(result.summary())
    return 0 if result.equal else 1


if __name__ == "__main__":
    sys.exit(main())
