"""Judge generated programs (tests/laws/families.py): the verifier's verdict and XLA's numbers.

``judge(program, seeds)`` runs the verifier (rules only, no witness) and executes both programs
on XLA's CPU runtime (tests/oracle.py, the product's witness machinery) on ``seeds``; a pair is
``unsound`` when it is verified although the runtime finds an output that differs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

from .families import Program


@dataclass
class Judged:
    program: Program
    verdict: str
    equal: bool | None  # None: the runtime could not execute the pair
    detail: str = ""

    @property
    def unsound(self) -> bool:
        return self.verdict == "verified" and self.equal is False


def judge(p: Program, seeds: tuple[int, ...] = (0, 1)) -> Judged:
    import oracle

    result = verify(parse_relations(p.relations, "relations.yaml"), parse_hlo(p.baseline, "baseline.hlo"), parse_hlo(p.distributed, "distributed.hlo"))
    try:
        runs = [oracle.run_pair(p.baseline, p.distributed, p.relations, seed=s) for s in seeds]
    except Exception as e:  # a program XLA refuses: counted, never taken for equal
        return Judged(p, result.verdict, None, f"{type(e).__name__}: {e}"[:300])
    bad = next((r for r in runs if not r.equal), None)
    return Judged(p, result.verdict, bad is None, bad.summary() if bad is not None else "")


def tally(judged: list[Judged]) -> Counter[str]:
    """Counts of verdict x numbers: 'verified/equal', 'diverged/differs', 'unproven/error', ..."""
    out: Counter[str] = Counter()
    for j in judged:
        num = "error" if j.equal is None else "equal" if j.equal else "differs"
        out[f"{j.verdict}/{num}"] += 1
    return out
