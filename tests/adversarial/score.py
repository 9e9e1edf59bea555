"""Score the verifier on the adversarial suite: ``python tests/adversarial/score.py [names...]``.

Runs ``engine.analysis.check.check_files`` with the default ``Budget`` on every pair under
``tests/adversarial/pairs/`` and prints one row per pair (kind, producer, oracle label, verdict,
time, reason) and the score line::

    bugs: N, verified bugs: K (must be 0); correct: M, verified V, diverged D (must be 0),
    unproven U, unsupported/inconclusive X

A verdict is counted by its string; anything else (``error``, an exception of the checker, or
``crash``, its process died: each pair runs in a worker process) is counted under ``other``. Exit status: 0 when no bug is verified and no correct pair diverged,
1 otherwise. A second line counts the bugs by verdict (an ``unproven`` bug passes the gate).
``--json FILE`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import Budget
from shardproof.engine.relations import load_relations

PAIRS_DIR = Path(__file__).resolve().parent / "pairs"


@dataclass
class Row:
    name: str
    kind: str  # correct | bug
    producer: str
    oracle: str  # equal | different
    verdict: str
    seconds: float
    reason: str


def pair_names() -> list[str]:
    return sorted(p.name for p in PAIRS_DIR.iterdir() if (p / "label.yaml").is_file())


def label(name: str) -> dict[str, object]:
    return yaml.safe_load((PAIRS_DIR / name / "label.yaml").read_text())


def check_pair(name: str) -> Row:
    folder = PAIRS_DIR / name
    meta = label(name)
    t = time.perf_counter()
    try:
        result = check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo", budget=Budget())
        verdict, reason = str(result.verdict), _reason(result)
    except Exception as e:  # a crash of the checker is a verdict of its own here, never a pass
        verdict, reason = "error", f"{type(e).__name__}: {e}"
    return Row(name, str(meta["kind"]), str(meta["producer"]), str(meta["oracle"]), verdict, time.perf_counter() - t, " ".join(reason.split()))


def _reason(result: object) -> str:
    divergences = getattr(result, "divergences", None) or []
    if divergences:
        d = divergences[0]
        return f"%{str(d.get('instruction', '?')).lstrip('%')} ({d.get('opcode', '?')}): {d.get('cause', '')}"
    return str(getattr(result, "reason", ""))


def run_all(names: list[str]) -> Iterator[Row]:
    """check_pair for each name in a worker process, so that a checker that dies (a fatal
    CHECK in XLA kills the process) is a verdict of that pair (``crash``) and the rest still run."""
    worker: subprocess.Popen[str] | None = None
    try:
        for name in names:
            if worker is None or worker.poll() is not None:
                worker = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert worker.stdin is not None and worker.stdout is not None
            t = time.perf_counter()
            worker.stdin.write(name + "\n")
            worker.stdin.flush()
            line = worker.stdout.readline()
            if line:
                yield Row(**json.loads(line))
                continue
            code = worker.wait()
            meta = label(name)
            yield Row(name, str(meta["kind"]), str(meta["producer"]), str(meta["oracle"]), "crash", time.perf_counter() - t, f"the checker died (exit status {code})")
            worker = None
    finally:
        if worker is not None and worker.poll() is None:
            assert worker.stdin is not None
            worker.stdin.close()
            worker.wait()


def _worker() -> int:
    """--worker: read pair names from stdin, answer one JSON row per line on stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the checker prints stays out of the protocol
    for line in sys.stdin:
        out.write(json.dumps(asdict(check_pair(line.strip()))) + "\n")
        out.flush()
    return 0


def score_line(rows: list[Row]) -> str:
    bugs = [r for r in rows if r.kind == "bug"]
    correct = [r for r in rows if r.kind == "correct"]

    def count(rs: list[Row], *verdicts: str) -> int:
        return sum(r.verdict in verdicts for r in rs)

    other = len(rows) - count(rows, "verified", "diverged", "unproven", "unsupported", "inconclusive")
    line = (f"bugs: {len(bugs)}, verified bugs: {count(bugs, 'verified')} (must be 0); "
            f"correct: {len(correct)}, verified {count(correct, 'verified')}, "
            f"diverged {count(correct, 'diverged')} (must be 0), unproven {count(correct, 'unproven')}, "
            f"unsupported/inconclusive {count(correct, 'unsupported', 'inconclusive')}")
    return line + (f"; other verdicts (error, crash) {other}" if other else "")


def bug_line(rows: list[Row]) -> str:
    """How the bugs ended: only ``diverged`` fails the gate; ``unproven`` passes it."""
    bugs = [r for r in rows if r.kind == "bug"]
    counts: dict[str, int] = {}
    for r in bugs:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    return "bugs by verdict: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="pairs to check (default: all)")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    ap.add_argument("--width", type=int, default=110, help="reason column cut at this many characters")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker()
    names = args.names or pair_names()
    unknown = sorted(set(names) - set(pair_names()))
    if unknown:
        ap.error(f"unknown pairs {unknown}")
    rows = []
    print(f"{'pair':38s} {'kind':7s} {'producer':9s} {'oracle':9s} {'verdict':12s} {'time':>6s}  reason")
    for row in run_all(names):
        rows.append(row)
        flag = " !!" if (row.kind == "bug" and row.verdict == "verified") or (row.kind == "correct" and row.verdict == "diverged") else ""
        print(f"{row.name:38s} {row.kind:7s} {row.producer:9s} {row.oracle:9s} {row.verdict + flag:12s} {row.seconds:5.1f}s  {row.reason[: args.width]}", flush=True)
    line = score_line(rows)
    print(line)
    print(bug_line(rows))
    if args.json:
        args.json.write_text(json.dumps({"score": line, "rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    bad = [r for r in rows if (r.kind == "bug" and r.verdict == "verified") or (r.kind == "correct" and r.verdict == "diverged")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
