"""The mutation campaign: corpus of correct pairs, mutant generation, judging each mutant with the
numeric oracle and the verifier in worker processes, and the report.

Judging runs in separate processes for two reasons: both cores are used, and a mutant that makes
XLA abort or hang (a collective deadlock, a CHECK failure) only costs its worker, which is killed
by pid and replaced; the mutant is then counted under ``timeout``/``crash``.

Outcome of one mutant:
- ``oracle``: ``different`` (some seed's outputs differ beyond tolerance), ``equal`` (every seed
  agrees), ``malformed`` (XLA refuses to parse, compile or run it);
- ``verdict``: the verifier's verdict, ``bad-input`` (InputError, e.g. its shape check), or
  ``crash`` (any other exception: a robustness bug);
- a **soundness bug** is ``oracle == different`` with ``verdict == verified``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import re
import resource
import sys
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import yaml

from .mutate import KINDS, Mutant, mutate, twin_mutate

REPO = Path(__file__).resolve().parents[2]
SEEDS = (0, 1, 2)
CONFIRM_SEEDS = (3, 4, 5, 6, 7)  # extra seeds before a verified mutant is believed equal
REJECTED = ("diverged", "unsupported", "inconclusive")


@dataclass(frozen=True)
class Pair:
    name: str
    baseline: str
    distributed: str
    relations: dict[str, Any] = field(hash=False)

    @property
    def ranks(self) -> int:
        return sum(len(g) for g in self.relations["groups"])

    @property
    def group_size(self) -> int:
        return len(self.relations["groups"][0])


def load_corpus(repo: Path = REPO, extra: Iterable[Path] = ()) -> list[Pair]:
    """Correct pairs: test pairs and examples whose expect.yaml says verified (examples that
    repeat a test pair once), the hand-written pairs without a bug, the probe pairs of
    ``probes.py``, and the pair folders under each ``extra`` root whose name does not start with
    ``bug`` (e.g. the front end's ``shardproof-report/``)."""
    pairs: list[Pair] = []
    seen: set[tuple[str, str]] = set()
    for root in (repo / "tests" / "pairs", repo / "examples" / "hlo"):
        for d in sorted(p for p in root.glob("*") if (p / "expect.yaml").is_file()):
            if (yaml.safe_load((d / "expect.yaml").read_text()) or {}).get("verdict") != "verified":
                continue
            b, m = (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text()
            if (b, m) in seen:
                continue
            seen.add((b, m))
            pairs.append(Pair(d.name, b, m, yaml.safe_load((d / "relations.yaml").read_text())))
    hw = repo / "tests" / "hlo_handwritten"
    for dist in sorted(hw.glob("*_distributed.hlo")):
        stem = dist.name[: -len("_distributed.hlo")]
        if "_bug" in stem or not (hw / f"{stem}_baseline.hlo").is_file() or not (hw / f"{stem}_relations.yaml").is_file():
            continue
        pairs.append(Pair(f"hw_{stem}", (hw / f"{stem}_baseline.hlo").read_text(), dist.read_text(), yaml.safe_load((hw / f"{stem}_relations.yaml").read_text())))
    for root in extra:
        for d in sorted(p for p in Path(root).glob("*") if (p / "distributed.hlo").is_file() and (p / "relations.yaml").is_file()):
            if not d.name.startswith("bug"):
                pairs.append(Pair(f"x_{d.name}", (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())))
    from .probes import probe_pairs

    return pairs + probe_pairs()


ALL_KINDS = [*KINDS, "twin-op"]


def trace_steps(pair: Pair) -> list[tuple[str, str, str]]:
    """(distributed, baseline, relation) instruction pairs the verifier relates in the correct
    pair: where a twin mutation applies the same edit to both sides."""
    from shardproof.engine.analysis.verify import Budget, verify
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.relations import parse_relations

    res = verify(parse_relations(pair.relations), parse_hlo(pair.baseline), parse_hlo(pair.distributed), budget=Budget(workers=1))
    b_names = {i.name for i in parse_hlo(pair.baseline).entry.instructions}
    d_names = {i.name for i in parse_hlo(pair.distributed).entry.instructions}
    steps = {(s["distributed"].lstrip("%"), (s["baseline"] or "").lstrip("%"), s["relation"]) for t in res.trace for s in t["steps"]}
    return sorted(x for x in steps if x[0] in d_names and x[1] in b_names)


def generate(corpus: list[Pair], count: int, seed: int, kinds: list[str] | None = None) -> list[Mutant]:
    """``count`` distinct mutants, deterministic in ``seed``. Pairs are drawn uniformly, then a
    kind among those that apply to the pair; a (pair, kind) that keeps yielding duplicates is
    retired, so small pairs do not spin."""
    rng = random.Random(seed)
    active = {p.name: list(kinds or ALL_KINDS) for p in corpus}
    steps: dict[str, list[tuple[str, str, str]]] = {}
    by_name = {p.name: p for p in corpus}
    misses: Counter[tuple[str, str]] = Counter()
    seen: set[tuple[str, str | None]] = {(p.distributed, None) for p in corpus}
    out: list[Mutant] = []
    while len(out) < count:
        live = [n for n, ks in active.items() if ks]
        if not live:
            break
        name = rng.choice(live)
        kind = rng.choice(active[name])
        pair = by_name[name]
        if kind == "twin-op":
            if name not in steps:
                steps[name] = trace_steps(pair)
            m = twin_mutate(name, pair.baseline, pair.distributed, steps[name], pair.ranks, pair.group_size, rng)
        else:
            m = mutate(name, pair.distributed, pair.ranks, pair.group_size, rng, kinds=[kind], tries=8)
        if m is None or (m.text, m.baseline) in seen:
            misses[(name, kind)] += 1
            if misses[(name, kind)] >= 100 or (m is None and misses[(name, kind)] >= 10):
                active[name].remove(kind)
            continue
        misses[(name, kind)] = 0
        seen.add((m.text, m.baseline))
        out.append(m)
    return out


# -- judging (runs in a worker process) ----------------------------------------------------------


def judge(pair: Pair, m: Mutant, verify_seconds: float = 60.0) -> dict[str, Any]:
    from shardproof.engine.analysis.verify import Budget, verify
    from shardproof.engine.errors import InputError
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.relations import parse_relations

    oracle = _oracle()
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        spec = parse_relations(pair.relations, "relations.yaml")
        res = verify(spec, parse_hlo(m.baseline or pair.baseline, "baseline.hlo"), parse_hlo(m.text, "mutant.hlo"), budget=Budget(workers=1, seconds=verify_seconds))
        out["verdict"] = res.verdict
        out["reason"] = res.reason[:300]
        out["frontier"] = sorted({d["opcode"] for d in res.divergences})
        out["unsupported"] = sorted({u["opcode"] for u in res.unsupported})
    except InputError as e:
        out["verdict"] = "bad-input"
        out["reason"] = str(e)[:300]
    except Exception:  # any other exception is exactly what we are looking for
        out["verdict"] = "crash"
        out["reason"] = traceback.format_exc()[-1500:]
    out["verify_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    out["oracle"] = _oracle_says(oracle, pair, m, SEEDS, out)
    if out["oracle"] == "equal" and out["verdict"] == "verified":
        # Believe an equal-and-verified mutant only after more inputs agree.
        out["oracle"] = _oracle_says(oracle, pair, m, CONFIRM_SEEDS, out)
    if out["oracle"] == "different" and out["verdict"] == "verified":
        # The verifier's claim is equality in real arithmetic. Programs that only reorder a sum
        # differ by rounding, which a twin op can amplify past the tolerance (rounding through
        # bf16, cbrt near 0). Recompute both in f64 with the original tolerances: a semantic
        # difference survives that, rounding does not ("rounding": not a soundness bug).
        # A NaN or an infinity in an output puts that input outside the proof (README,
        # Semantics: real arithmetic, where 1/(+0) and 1/(-0) do not differ): "nonfinite".
        wide: dict[str, Any] = {}
        if out.get("oracle_nonfinite"):
            out["oracle"] = "nonfinite"
        elif _oracle_says(oracle, pair, widened(pair, m), SEEDS + CONFIRM_SEEDS, wide, tolerances(pair)) == "equal":
            out["oracle"] = "rounding"
    out["oracle_s"] = round(time.perf_counter() - t0, 3)
    return out


def _oracle() -> Any:
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import oracle

    return oracle


_WIDEN = re.compile(r"\b(f16|f32)\[")
# The oracle's default tolerance per float output dtype (tests/oracle.py, _TOLERANCES).
_DEFAULT_TOL = {"f16": 5e-3, "bf16": 2e-2, "f32": 1e-4, "f64": 1e-9}


def _has_nonfinite(arrays: Iterable[Any]) -> bool:
    import numpy as np

    return any(np.asarray(a).dtype.kind in "fc" and not bool(np.isfinite(np.asarray(a)).all()) for a in arrays)


def widened(pair: Pair, m: Mutant) -> Mutant:
    """The mutant and its baseline with every f16/f32 value computed in f64 (bf16 stays: a
    deliberate rounding through bf16 is part of the program)."""
    return replace(m, text=_WIDEN.sub("f64[", m.text), baseline=_WIDEN.sub("f64[", m.baseline or pair.baseline))


def tolerances(pair: Pair) -> dict[str, Any]:
    """pair.relations with each output's tolerance fixed to that of its original dtype."""
    dtypes = _output_dtypes(pair.baseline)
    rel = dict(pair.relations)
    outs = []
    for o in rel.get("outputs") or []:
        o = dict(o)
        i = o.get("baseline", 0)
        tol = _DEFAULT_TOL.get(dtypes[i] if isinstance(i, int) and i < len(dtypes) else "f32", 1e-4)
        o.setdefault("rtol", tol)
        o.setdefault("atol", tol)
        outs.append(o)
    rel["outputs"] = outs
    return rel


def _output_dtypes(text: str) -> list[str]:
    """The element types of the entry's result, in tuple order, from entry_computation_layout."""
    m = re.search(r"entry_computation_layout=\{.*\)->(.*)\}", text.split("\n", 1)[0])
    return re.findall(r"([a-z]+[0-9]*)\[", m.group(1)) if m else []


def _oracle_says(oracle: Any, pair: Pair, m: Mutant, seeds: Iterable[int], out: dict[str, Any], relations: dict[str, Any] | None = None) -> str:
    for s in seeds:
        try:
            r = oracle.run_pair(m.baseline or pair.baseline, m.text, relations or pair.relations, seed=s)
        except Exception as e:  # XLA refusing the text is an outcome, not an error
            out["oracle_error"] = f"{type(e).__name__}: {e}"[:300]
            return "malformed"
        if not r.equal:
            out["oracle_seed"] = s
            out["oracle_detail"] = "; ".join(o.line() for o in r.outputs if not o.allclose)[:300]
            out["oracle_nonfinite"] = _has_nonfinite([*r.baseline_outputs, *(x for rank in r.distributed_outputs for x in rank)])
            return "different"
    return "equal"


def _worker(conn: Connection, corpus: list[Pair], verify_seconds: float) -> None:
    by_name = {p.name: p for p in corpus}
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        i, m = task
        res = judge(by_name[m.pair], m, verify_seconds)
        res["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        conn.send((i, res))


class Pool:
    """Worker processes judging mutants; a worker that dies or overruns its time is killed (by
    the pid this pool started) and replaced, and its mutant recorded as crash/timeout."""

    def __init__(self, corpus: list[Pair], workers: int = 2, timeout: float = 180.0, verify_seconds: float = 60.0) -> None:
        self.corpus = corpus
        self.n = max(1, workers)
        self.timeout = timeout
        self.verify_seconds = verify_seconds
        self.ctx = mp.get_context("spawn")
        self.peak_rss_mb = 0
        self.restarts = 0

    def _start(self) -> tuple[Any, Connection]:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.corpus, self.verify_seconds), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def map(self, mutants: list[Mutant]) -> Iterator[tuple[int, dict[str, Any]]]:
        todo = list(enumerate(mutants))[::-1]
        slots: list[dict[str, Any]] = []
        for _ in range(min(self.n, len(todo))):
            proc, conn = self._start()
            slots.append({"proc": proc, "conn": conn, "task": None, "t": 0.0})
        try:
            while todo or any(s["task"] is not None for s in slots):
                for s in slots:
                    if s["task"] is None and todo:
                        s["task"] = todo.pop()
                        s["t"] = time.monotonic()
                        s["conn"].send(s["task"])
                busy = [s for s in slots if s["task"] is not None]
                ready = wait([s["conn"] for s in busy], timeout=1.0)
                for s in busy:
                    if s["conn"] in ready:
                        try:
                            i, res = s["conn"].recv()
                        except (EOFError, OSError):
                            yield s["task"][0], {"verdict": "crash", "oracle": "crash", "reason": f"worker died (exit code {s['proc'].exitcode})"}
                            self._replace(s)
                            continue
                        self.peak_rss_mb = max(self.peak_rss_mb, int(res.get("rss_mb", 0)))
                        s["task"] = None
                        yield i, res
                    elif time.monotonic() - s["t"] > self.timeout:
                        yield s["task"][0], {"verdict": "timeout", "oracle": "timeout", "reason": f"no answer within {self.timeout:.0f}s"}
                        self._replace(s)
        finally:
            for s in slots:
                with contextlib.suppress(OSError):
                    s["conn"].send(None)
            for s in slots:
                s["proc"].join(timeout=5)
                if s["proc"].is_alive():
                    s["proc"].kill()
                    s["proc"].join()

    def _replace(self, slot: dict[str, Any]) -> None:
        proc = slot["proc"]
        if proc.is_alive():
            proc.kill()  # SIGKILL to the pid this pool started
        proc.join()
        self.restarts += 1
        slot["proc"], slot["conn"] = self._start()
        slot["task"] = None


# -- report ----------------------------------------------------------------------------------


# Soundness gaps already reported and kept open, each with a minimal reproduction under
# tests/soundness_regressions/<name>/: the twin edits that trigger them. A mutant matching one is
# still counted and listed, but as known, so the seeded sample test guards against new ones.
# (The non-monotone converts and sqrt/log under partial max found by this campaign are fixed.)
NAN_MAKERS = ("sqrt", "log", "log-plus-one", "rsqrt")


def known_soundness(m: Mutant) -> str | None:
    """all_reduce_max_skips_nan: a value NaN on some ranks reaching a max all-reduce (NaN is
    outside the proof, README "Semantics")."""
    if m.kind == "twin-op" and m.detail.split(" after ", 1)[0] in NAN_MAKERS:
        return "all_reduce_max_skips_nan"
    return None


@dataclass
class Outcome:
    mutant: Mutant
    result: dict[str, Any]

    @property
    def soundness_bug(self) -> bool:
        return self.result.get("oracle") == "different" and self.result.get("verdict") == "verified"

    @property
    def known_bug(self) -> str | None:
        return known_soundness(self.mutant) if self.soundness_bug else None

    @property
    def status(self) -> str:
        """malformed / different / equal / crash / timeout from the oracle's and verifier's view."""
        o, v = self.result.get("oracle"), self.result.get("verdict")
        if o in ("timeout", "crash"):
            return str(o)
        if o == "malformed" or (v == "bad-input" and o != "different"):
            return "malformed"
        return str(o)


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    per_kind: dict[str, Counter[str]] = defaultdict(Counter)
    total: Counter[str] = Counter()
    for o in outcomes:
        k = o.mutant.kind
        st = o.status
        v = o.result.get("verdict", "?")
        for c in (per_kind[k], total):
            c["mutants"] += 1
            c[st] += 1
            c[f"{st}/{v}"] += 1
    backlog: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.status == "equal" and o.result.get("verdict") in REJECTED:
            backlog[(o.mutant.kind, o.mutant.opcode)].append(o)
    return {
        "total": total,
        "per_kind": dict(per_kind),
        "soundness_bugs": [o for o in outcomes if o.soundness_bug],
        "new_soundness_bugs": [o for o in outcomes if o.soundness_bug and o.known_bug is None],
        "crashes": [o for o in outcomes if o.result.get("verdict") in ("crash", "timeout") or o.result.get("oracle") in ("crash", "timeout")],
        "verified_but_xla_rejects": [o for o in outcomes if o.result.get("oracle") == "malformed" and o.result.get("verdict") == "verified"],
        "bad_input_but_xla_runs": [o for o in outcomes if o.result.get("verdict") == "bad-input" and o.result.get("oracle") in ("equal", "different")],
        "equal_verified": [o for o in outcomes if o.status == "equal" and o.result.get("verdict") == "verified"],
        "backlog": dict(sorted(backlog.items(), key=lambda kv: -len(kv[1]))),
    }


def format_report(s: dict[str, Any], seconds: float | None = None, peak_rss_mb: int | None = None) -> str:
    t = s["total"]
    lines = []
    if seconds is not None:
        lines.append(f"time {seconds:.1f} s" + (f", peak RSS {peak_rss_mb} MB (largest process)" if peak_rss_mb is not None else ""))
    lines.append(
        f"mutants {t['mutants']}: malformed {t['malformed']}, numerically different {t['different']}, equal {t['equal']}, "
        f"different only by float rounding (equal in f64) {t['rounding']}, different only where an output is NaN or infinite {t['nonfinite']}, crash {t['crash']}, timeout {t['timeout']}"
    )
    for st in ("different", "equal", "rounding", "nonfinite", "malformed"):
        verdicts = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith(st + "/")}
        lines.append(f"  {st:9s} -> " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items(), key=lambda x: -x[1])))
    lines.append(f"SOUNDNESS BUGS (different but verified): {len(s['soundness_bugs'])}, of them new (no reproduction under tests/soundness_regressions yet): {len(s['new_soundness_bugs'])}")
    for o in s["soundness_bugs"][:60]:
        tag = f"known: {o.known_bug}" if o.known_bug else "NEW"
        lines.append(f"  !! [{tag}] {o.mutant.pair} {o.mutant.kind} %{o.mutant.instruction} ({o.mutant.opcode}): {o.mutant.detail} | {o.result.get('oracle_detail', '')[:120]}")
    lines.append("")
    lines.append(f"{'kind':22s} {'mutants':>7s} {'malf':>5s} {'diff':>5s} {'d/div':>5s} {'d/uns':>5s} {'d/inc':>5s} {'d/VER':>5s} {'equal':>5s} {'e/ver':>5s} {'e/rej':>5s} {'other':>5s}")
    for k in sorted(s["per_kind"]):
        c = s["per_kind"][k]
        rej = sum(c[f"equal/{v}"] for v in REJECTED)
        lines.append(
            f"{k:22s} {c['mutants']:7d} {c['malformed']:5d} {c['different']:5d} {c['different/diverged']:5d} {c['different/unsupported']:5d} "
            f"{c['different/inconclusive']:5d} {c['different/verified']:5d} {c['equal']:5d} {c['equal/verified']:5d} {rej:5d} {c['crash'] + c['timeout']:5d}"
        )
    lines.append("")
    lines.append(f"robustness: verifier crashes/timeouts {len(s['crashes'])}, verified although XLA rejects the text {len(s['verified_but_xla_rejects'])}, "
                 f"bad input although XLA runs it {len(s['bad_input_but_xla_runs'])}")
    for o in (s["crashes"] + s["verified_but_xla_rejects"] + s["bad_input_but_xla_runs"])[:15]:
        lines.append(f"  - {o.mutant.pair} {o.mutant.kind} %{o.mutant.instruction}: {o.mutant.detail} -> {o.result.get('verdict')}: {str(o.result.get('reason', '')).splitlines()[-1][:160] if o.result.get('reason') else ''} {o.result.get('oracle_error', '')[:120]}")
    lines.append("")
    lines.append(f"completeness backlog: {sum(len(v) for v in s['backlog'].values())} mutants equal by the oracle but not verified, by (kind, opcode):")
    for (kind, op), os_ in s["backlog"].items():
        verdicts = Counter(o.result.get("verdict") for o in os_)
        frontier = Counter(x for o in os_ for x in o.result.get("frontier", []) + o.result.get("unsupported", []))
        ex = os_[0]
        lines.append(f"  {len(os_):5d}  {kind:20s} {op:18s} {dict(verdicts)} frontier {dict(frontier.most_common(3))}  e.g. {ex.mutant.pair}: {ex.mutant.detail}")
    lines.append(f"equal and verified (kept for review): {len(s['equal_verified'])}")
    kinds = Counter((o.mutant.kind, o.mutant.opcode) for o in s["equal_verified"])
    for (kind, op), n in kinds.most_common(20):
        ex = next(o for o in s["equal_verified"] if (o.mutant.kind, o.mutant.opcode) == (kind, op))
        lines.append(f"  {n:5d}  {kind:20s} {op:18s} e.g. {ex.mutant.pair}: {ex.mutant.detail}")
    return "\n".join(lines)


def outcome_json(o: Outcome) -> dict[str, Any]:
    d = asdict(o.mutant)
    d.pop("text")
    d["twin"] = d.pop("baseline") is not None
    return {**d, **o.result}


def peak_rss_mb() -> int:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
    return max(own, kids)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
