"""Literal fuzzer: every HLO pair the test suites hold, with extreme values put into its constants.

    python bench/literal_fuzz.py [--sample N] [--seed S] [--pairs SUBSTRING] [--seconds T]
                                 [--start I] [--stop J] [--max-seconds T]

For each pair (a folder with baseline.hlo, distributed.hlo and relations.yaml anywhere under
tests/, and the prefix-named pairs of tests/hlo_handwritten), each scalar constant of either
program (the constants of one type and literal text together) and each extreme value of the
lists below, one input: the pair with those literals replaced. Values are int64/uint64 limits, the limits of the constant's own type and one past
them, 2^53 + 1, ±inf, nan (and -nan, nan(0x...)), -0.0, denormals, the largest and lowest
finite floats, hexadecimal floats, and text of the wrong kind (a float in an int constant).
Every input must give a verdict or a located bad-input error (``InputError``: an int literal
out of its type's range is one); anything else — an exception, or the verdict ``error`` — is an
internal error, printed with the input that caused it. The last line reads
``N inputs, K internal errors``. ``--sample N`` runs a seeded sample of N inputs
(tests/test_literal_fuzz.py runs one). The numeric witness is not run (``witness="never"``):
this fuzzes the verifier.
"""

from __future__ import annotations

import argparse
import inspect
import random
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

I64 = (-(2**63), 2**63 - 1)
U64_MAX = 2**64 - 1
INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}
FLOATS = ("f16", "bf16", "f32", "f64")

# One value of each kind of behaviour (a denormal spelled in decimal and in hex, a decimal that
# rounds to the f32 maximum and one that overflows it to inf, 2^53 + 1, ...).
INT_VALUES = ("0", "-1", "1", str(I64[0]), str(I64[1]), str(U64_MAX), str(2**53 + 1), "0x7fffffff")
FLOAT_VALUES = (
    "inf", "-inf", "nan", "-nan(0x7fc00001)", "-0.0", "1e-45", "0x1p-149", "5e-324", "3.4028235e+38",
    "-3.40282347e+38", "1e39", "65520", "9007199254740993", "18446744073709551615", "0x1.8p3",
)  # fmt: skip
WRONG_KIND = ("1.5", "inf", "")
PRED_VALUES = ("true", "false", "2")

# A scalar constant: `= <type>[] constant(<literal>)` (a layout `{}` may follow the brackets).
_SCALAR = re.compile(r"=\s*(\w+)\[\](?:\{[^}]*\})?\s+constant\(([^()]*)\)")


@dataclass(frozen=True)
class Pair:
    """A pair's files as read when the run started (other suites may change under a long run)."""

    name: str
    baseline: Path
    distributed: Path
    relations: Path
    sourcemap: Path | None
    texts: tuple[str, str, str, str | None]  # baseline, distributed, relations, sourcemap

    def text(self, side: str) -> str:
        return self.texts[0] if side == "baseline" else self.texts[1]


@dataclass(frozen=True)
class Case:
    """Every scalar constant of one type and one literal text in one program gets ``new``."""

    pair: Pair
    side: str  # "baseline" | "distributed"
    offsets: tuple[int, ...]  # where the literals start in that file
    old: str
    new: str
    dtype: str

    def label(self) -> str:
        path = self.pair.baseline if self.side == "baseline" else self.pair.distributed
        line = self.pair.text(self.side).count("\n", 0, self.offsets[0]) + 1
        more = f" (and {len(self.offsets) - 1} more)" if len(self.offsets) > 1 else ""
        return f"{path.relative_to(ROOT)}:{line}{more}: {self.dtype}[] constant({self.old}) -> constant({self.new})"

    def text(self) -> str:
        t = self.pair.text(self.side)
        for off in sorted(self.offsets, reverse=True):
            t = t[:off] + self.new + t[off + len(self.old) :]
        return t


def pairs() -> list[Pair]:
    """Every HLO pair under tests/ (sorted, so samples are reproducible); a pair copied into
    another suite (the golden fixtures) counts once."""
    found = _all_pairs()
    seen: set[tuple[str, str, str]] = set()
    out = []
    for p in found:
        key = p.texts[:3]
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def _all_pairs() -> list[Pair]:
    out = []
    for rel in sorted(TESTS.rglob("relations.yaml")):
        d = rel.parent
        if (d / "baseline.hlo").is_file() and (d / "distributed.hlo").is_file():
            sm = d / "sourcemap.json"
            out.append(_pair(str(d.relative_to(TESTS)), d / "baseline.hlo", d / "distributed.hlo", rel, sm if sm.is_file() else None))
    for rel in sorted(TESTS.rglob("*_relations.yaml")):
        prefix = rel.name[: -len("_relations.yaml")]
        base = rel.with_name(f"{prefix}_baseline.hlo")
        if not base.is_file():
            continue
        for dist in sorted(rel.parent.glob(f"{prefix}_*distributed.hlo")):
            out.append(_pair(str(dist.relative_to(TESTS)), base, dist, rel, None))
    return [p for p in out if p is not None]


def _pair(name: str, base: Path, dist: Path, rel: Path, sm: Path | None) -> Pair | None:
    try:
        texts = (base.read_text(), dist.read_text(), rel.read_text(), sm.read_text() if sm else None)
    except OSError:  # a suite being rewritten while we look
        return None
    return Pair(name, base, dist, rel, sm, texts)


def values_for(dtype: str) -> tuple[str, ...]:
    if dtype == "pred":
        return PRED_VALUES
    if dtype in INT_BITS:
        bits = INT_BITS[dtype]
        lo, hi = (0, 2**bits - 1) if dtype[0] == "u" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        own = (str(lo), str(hi), str(lo - 1), str(hi + 1))
        return (*own, *INT_VALUES, *WRONG_KIND)
    if dtype in FLOATS:
        return (*FLOAT_VALUES, "1", "abc")
    return ()


def cases(all_pairs: list[Pair]) -> Iterator[Case]:
    for pair in all_pairs:
        for side in ("baseline", "distributed"):
            sites: dict[tuple[str, str], list[int]] = {}
            for m in _SCALAR.finditer(pair.text(side)):
                sites.setdefault((m.group(1), m.group(2)), []).append(m.start(2))
            for (dtype, old), offsets in sites.items():
                for new in values_for(dtype):
                    if new != old.strip():
                        yield Case(pair, side, tuple(offsets), old, new, dtype)


def _relations_and_map(pair: Pair, workdir: Path) -> tuple[object, object]:
    from shardproof.engine.relations import load_relations
    from shardproof.engine.sourcemap import SourceMap

    rel = workdir / "relations.yaml"
    rel.write_text(pair.texts[2])
    spec = load_relations(rel)
    sm = None
    if pair.texts[3] is not None:
        (workdir / "sourcemap.json").write_text(pair.texts[3])
        sm = SourceMap.load(workdir / "sourcemap.json")
    return spec, sm


def run_case(case: Case, workdir: Path, seconds: float = 30.0) -> str | None:
    """None when the input gives a verdict or a located InputError; else the internal error."""
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.analysis.verify import Budget
    from shardproof.engine.errors import InputError

    texts = {"baseline": case.pair.texts[0], "distributed": case.pair.texts[1]}
    texts[case.side] = case.text()
    paths = {}
    for side, text in texts.items():
        p = workdir / f"{side}.hlo"
        p.write_text(text)
        paths[side] = p
    budget = Budget(seconds=seconds, max_nodes=400_000, workers=1)
    try:
        spec, sm = _relations_and_map(case.pair, workdir)
        kwargs = {"witness": "never"} if "witness" in inspect.signature(check_files).parameters else {}
        result = check_files(spec, paths["baseline"], paths["distributed"], sm, budget, **kwargs)  # type: ignore[arg-type]
    except InputError as e:
        if not e.path or not (e.where or e.message):
            return f"InputError without a location: {e}"
        return None
    except Exception as e:  # the point: anything else is a crash of the tool
        return f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
    if result.verdict == "error":
        return f"verdict error: {result.reason} {getattr(result, 'error', None)}"
    return None


def select(all_cases: list[Case], sample: int | None, seed: int) -> list[Case]:
    if sample is None or sample >= len(all_cases):
        return all_cases
    return random.Random(seed).sample(all_cases, sample)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=None, help="run a seeded sample of N inputs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pairs", default="", help="only pairs whose name (suite/folder) matches this regex")
    ap.add_argument("--seconds", type=float, default=30.0, help="saturation budget per e-graph")
    ap.add_argument("--start", type=int, default=0, help="first input (index in the run's order), to split a run")
    ap.add_argument("--stop", type=int, default=None, help="stop before this input")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this long (the count line says how far it got)")
    args = ap.parse_args(argv)
    chosen = [p for p in pairs() if re.search(args.pairs, p.name)]
    todo = select(list(cases(chosen)), args.sample, args.seed)[args.start : args.stop]
    t0 = time.perf_counter()
    errors = done = 0
    stopped = ""
    with tempfile.TemporaryDirectory(prefix="literal-fuzz-") as tmp:
        try:
            for i, case in enumerate(todo, 1):
                if args.max_seconds is not None and time.perf_counter() - t0 > args.max_seconds:
                    stopped = f" (of {len(todo)}: stopped at the time limit)"
                    break
                err = run_case(case, Path(tmp), args.seconds)
                done = i
                if err is not None:
                    errors += 1
                    print(f"INTERNAL ERROR {case.label()}\n  {err}", flush=True)
                if i % 500 == 0:
                    print(f"... {i}/{len(todo)} inputs, {errors} internal errors, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            stopped = f" (of {len(todo)}: interrupted)"
    print(f"{len(chosen)} pairs, {time.perf_counter() - t0:.0f} s")
    print(f"{done} inputs, {errors} internal errors{stopped}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
