"""The witness over a pair: several seeds, the f64 recheck, probes, and the memory budget.

A seed whose outputs differ beyond the tolerances is rechecked with every f32 value of both
programs computed in f64 (f16 and bf16 stay: a deliberate rounding through them is part of
the program), on the same inputs, with the original dtype's tolerances. A difference that vanishes
there is rounding noise of two summation orders, not a witness of a bug. Never rechecked (the
difference stands): an element that is inf/NaN on one side only (an overflow, not rounding), and
a pair whose programs write different kinds of lossy converts (``lossy_converts``: f64->f32,
s32->f32, f32->s32, ...), or any f64->f32 convert, which widening would erase.

Probes (numeric localization): inner instructions of both programs returned as extra outputs
of copies of the programs and compared under candidate relations (duplicate, partial sum, or
sharded along the one dim whose size differs c-fold); a probe "holds" when one candidate holds
on every seed run.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import numpy as np

from . import flat, runtime
from .compare import OutputCheck, check_output, default_tol
from .inputs import EDGE_SEEDS_FROM, groups_of, make_group_inputs
from .model import VARIANTS, model_text, perturbed_sums
from .segment import with_outputs

# Two seeds of random inputs and one of edge inputs (inputs.EDGE_SEEDS_FROM: the values the
# programs' compares, clamps and ids turn on), at the cost of the three random seeds before.
DEFAULT_SEEDS = (0, 1, EDGE_SEEDS_FROM)
DEFAULT_MEMORY_MB = 2048
DEFAULT_MAX_INSTRUCTIONS = 6000
RECHECK_RATIO = 100.0


@dataclasses.dataclass
class WitnessOptions:
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    memory_mb: float = DEFAULT_MEMORY_MB  # estimated bytes of all ranks above it: not executed
    # Instructions of both programs above it: not executed either (XLA's compile time grows
    # with them: ~3 ms per instruction at its lowest optimisation level, 168 s for a 126-layer
    # pair of 53k lines); the diverging instructions are executed alone instead.
    max_instructions: int = DEFAULT_MAX_INSTRUCTIONS
    recheck_f64: bool = True
    stop_at_first_difference: bool = True
    # Compile the f64 programs of the recheck up front, alongside the others (worth it where a
    # difference is likely: a pair the rules did not prove).
    prefetch_recheck: bool = False
    # Execute the flattened re-printing of both programs (witness.flat) instead of the texts as
    # written: "auto" does for a text that looks compiled (fusions, bitcasts) and whenever XLA
    # refuses a text as written; "always" for every text (after a worker died on a text);
    # "never": the texts as written only.
    flatten: str = "auto"


@dataclasses.dataclass
class Probe:
    """An inner distributed instruction and its baseline counterpart, compared numerically."""

    distributed: str  # instruction name (no %)
    baseline: str | None
    relations: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # candidates; empty: inferred
    holds: bool | None = None  # None: not tested
    detail: str = ""
    trials: int = 0
    check: OutputCheck | None = None  # the closest candidate's comparison on a failing seed


@dataclasses.dataclass
class PairReport:
    equal: bool
    outputs: list[OutputCheck]
    flavour: str
    seconds: float
    seed: int | None = None  # the first seed whose outputs differ (after the f64 recheck)
    seeds: list[int] = dataclasses.field(default_factory=list)  # the seeds run
    rounding: list[int] = dataclasses.field(default_factory=list)  # seeds whose difference vanished in f64
    probes: list[Probe] = dataclasses.field(default_factory=list)
    baseline_outputs: list[np.ndarray] = dataclasses.field(repr=False, default_factory=list)
    # distributed_outputs[global rank][leaf]
    distributed_outputs: list[list[np.ndarray]] = dataclasses.field(repr=False, default_factory=list)

    @property
    def trials(self) -> int:
        return len(self.seeds)

    def summary(self) -> str:
        head = f"{'EQUAL' if self.equal else 'NOT EQUAL'} ({self.flavour}, {self.seconds:.3f}s)"
        if self.seed is not None:
            head += f" seed {self.seed}"
        elif self.seeds:
            head += f" on {len(self.seeds)} seed(s) {self.seeds}"
        if self.rounding:
            head += f"; seed(s) {self.rounding} differ only by rounding (equal in f64)"
        lines = [head, *("  " + o.line() for o in self.outputs)]
        lines += [f"  probe %{p.distributed} vs %{p.baseline}: {'holds' if p.holds else 'differs' if p.holds is False else 'untested'} {p.detail}" for p in self.probes]
        return "\n".join(lines)

    def __bool__(self) -> bool:
        return self.equal


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------

_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "token": 0}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_ENTRY_LINE = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+\s*=\s*(\([^=]*?\)|[a-z][a-z0-9]*\[[0-9,]*\])(?:\{[^}]*\})?\s+([a-z][a-z0-9\-]*)\(")


def _shape_bytes(shape: str) -> int:
    total = 0
    for dt, dims in _ARRAY.findall(shape):
        size = _BYTES.get(dt, 1 if dt.startswith("f8") else 4)
        for d in dims.split(","):
            if d:
                size *= int(d)
        total += size
    return total


def program_bytes(text: str) -> int:
    """A rough bound of one rank's memory: parameters and results twice (host and device), and
    the four largest intermediates (XLA reuses buffers; the estimate only guards the budget)."""
    params = results = 0
    inner: list[int] = []
    in_entry = False
    for line in text.split("\n"):
        if line.startswith("ENTRY"):
            in_entry = True
            continue
        if not in_entry:
            continue
        if line.startswith("}"):
            break
        m = _ENTRY_LINE.match(line)
        if m is None:
            continue
        b = _shape_bytes(m.group(2))
        if m.group(3) == "parameter":
            params += b
        elif m.group(1):
            results += b
        else:
            inner.append(b)
    return 2 * (params + results) + sum(sorted(inner)[-4:])


def estimate_bytes(baseline: str, distributed: str, ranks: int) -> int:
    """Estimated bytes of executing the baseline once and the distributed program on every rank."""
    return program_bytes(baseline) + ranks * program_bytes(distributed)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

# The recheck's programs (engine.witness.model): f32 computed in f64 with every written rounding
# kept, and the baseline with its bf16/f16 sums in other orders.
def _widen(text: str) -> str:
    t = model_text(text)
    if t is None:
        raise ValueError("the text has an op whose meaning depends on the float width (bitcast-convert, custom-call, ...): no f64 recheck")
    return t


def _widenable(*texts: str) -> bool:
    return all(model_text(t) is not None for t in texts)


# Lossy converts (src -> dst types where dst cannot hold every src value): a rounding (or a
# truncation, or a wrap) the program writes on purpose. The recheck's f64 model keeps each one
# (an s32 -> f32 hop still loses the odd ids past 2^24: engine.witness.model), so a lossy
# convert one program writes and the other lacks is never widened away.
_DEF_TYPE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*([a-z][a-z0-9]*)\[", re.MULTILINE)
_CONVERT_ANY = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*([a-z][a-z0-9]*)\[[^\n]*?\sconvert\((?:([a-z][a-z0-9]*)\[[^\]]*\](?:\{[^}]*\})?\s+)?%?([\w.\-]+)\)", re.MULTILINE)
# (significand bits with the implicit one, exponent bits) of each float; value bits and
# signedness of each integer.
_FLOAT_BITS = {"f64": (53, 11), "f32": (24, 8), "f16": (11, 5), "bf16": (8, 8)}
_INT_BITS = {"pred": (1, False), "s4": (3, True), "s8": (7, True), "s16": (15, True), "s32": (31, True), "s64": (63, True),
             "u4": (4, False), "u8": (8, False), "u16": (16, False), "u32": (32, False), "u64": (64, False)}


def convert_is_exact(src: str, dst: str) -> bool:
    """Every value of ``src`` converts to ``dst`` exactly (unknown types: not exact)."""
    if src == dst or src == "pred":
        return True
    if src in _FLOAT_BITS and dst in _FLOAT_BITS:
        return _FLOAT_BITS[dst][0] >= _FLOAT_BITS[src][0] and _FLOAT_BITS[dst][1] >= _FLOAT_BITS[src][1]
    if src in _INT_BITS and dst in _FLOAT_BITS:
        return _INT_BITS[src][0] <= _FLOAT_BITS[dst][0]
    if src in _INT_BITS and dst in _INT_BITS and dst != "pred":
        (sb, ss), (db, ds) = _INT_BITS[src], _INT_BITS[dst]
        return sb <= db and (ds or not ss)
    return False


def lossy_converts(text: str) -> set[tuple[str, str]]:
    """The (src, dst) kinds of the lossy converts of ``text`` (src "?" when not known)."""
    if " convert(" not in text:
        return set()
    types = dict(_DEF_TYPE.findall(text))
    kinds = set()
    for m in _CONVERT_ANY.finditer(text):
        dst, src = m.group(1), m.group(2) or types.get(m.group(3), "?")
        if not convert_is_exact(src, dst):
            kinds.add((src, dst))
    return kinds


def _wide_args(args: list[np.ndarray], prog: runtime.Program) -> list[np.ndarray]:
    return [a.astype(p.dtype) if a.dtype != p.dtype else a for a, p in zip(args, prog.params, strict=True)]


@dataclasses.dataclass
class _Run:
    base_out: list[np.ndarray]  # group 0's (every group's, without per-group data)
    dist_out: list[list[np.ndarray]]  # [global rank][leaf]
    # [group][leaf]: each group's own baseline run, where the groups hold different data
    # (inputs.per_group_data); None when every group runs against the same baseline.
    base_by_group: list[list[np.ndarray]] | None = None

    def expected(self, leaf: int) -> list[np.ndarray] | None:
        """Each group's baseline value of ``leaf`` (None: base_out's for every group)."""
        return [b[leaf] for b in self.base_by_group] if self.base_by_group is not None else None


def _execute(base: runtime.Program, dist: runtime.Program, bases: list[list[np.ndarray]], dist_args: list[list[np.ndarray]]) -> _Run:
    """Execute the baseline on each distinct group's arguments (once when the groups share
    them) and the distributed program on every rank."""
    n = len(dist_args)
    outs: dict[int, list[np.ndarray]] = {}
    for b in bases:
        if id(b) not in outs:
            outs[id(b)] = [leaf[0] for leaf in runtime.execute(base.text, [[a] for a in b], 1)]
    leaves = runtime.execute(dist.text, [[dist_args[i][p] for i in range(n)] for p in range(len(dist.params))], n)
    by_group = [outs[id(b)] for b in bases] if len(outs) > 1 else None
    return _Run(outs[id(bases[0])], [[leaf[i] for leaf in leaves] for i in range(n)], by_group)


def _wide_groups(bases: list[list[np.ndarray]], prog: runtime.Program) -> list[list[np.ndarray]]:
    """Each group's arguments widened for ``prog`` (groups sharing arguments keep sharing)."""
    wide: dict[int, list[np.ndarray]] = {}
    for b in bases:
        wide.setdefault(id(b), _wide_args(b, prog))
    return [wide[id(b)] for b in bases]


def _output_checks(run: _Run, entries: list[dict[str, Any]], base: runtime.Program, dist: runtime.Program, groups: list[list[int]], n_base: int, n_dist: int, tolerances: list[float] | None = None) -> list[OutputCheck]:
    checks = []
    for k, e in enumerate(entries):
        bi, di = e.get("baseline"), e.get("distributed")
        for what, idx, count in (("baseline", bi, n_base), ("distributed", di, n_dist)):
            if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < count:
                raise ValueError(f"outputs[{k}].{what}: bad output index {idx!r} ({count} outputs)")
        assert isinstance(bi, int) and isinstance(di, int)
        if tolerances is not None:
            e = {**e}
            e.setdefault("rtol", tolerances[k])
            e.setdefault("atol", tolerances[k])
        checks.append(check_output(e, f"outputs[{k}]", run.base_out[bi], [r[di] for r in run.dist_out], groups, bi, di, run.expected(bi)))
    return checks


def _candidates(b: np.ndarray, d: np.ndarray, c: int) -> list[dict[str, Any]]:
    if b.shape == d.shape:
        return [{"relation": "duplicate"}, {"relation": "partial", "op": "add"}]
    if b.ndim == d.ndim:
        diff = [i for i in range(b.ndim) if b.shape[i] != d.shape[i]]
        if len(diff) == 1 and b.shape[diff[0]] == c * d.shape[diff[0]]:
            return [{"relation": "sharded", "dim": diff[0]}]
    return []


def _probe_checks(run: _Run, probes: list[Probe], slots: dict[int, tuple[int, int]], groups: list[list[int]], tolerances: dict[int, float] | None = None, atols: dict[int, float] | None = None) -> dict[int, OutputCheck | None]:
    """For each probe with slots (baseline leaf, distributed leaf): the first candidate that
    holds, else the closest one (None: no candidate at these shapes)."""
    out: dict[int, OutputCheck | None] = {}
    c = len(groups[0])
    for i, (bl, dl) in slots.items():
        b, d = run.base_out[bl], run.dist_out[0][dl]
        cands = probes[i].relations or _candidates(b, d, c)
        best: OutputCheck | None = None
        for cand in cands:
            e = dict(cand)
            if tolerances is not None:
                e.setdefault("rtol", tolerances[i])
                e.setdefault("atol", atols[i] if atols is not None and i in atols else tolerances[i])
            try:
                chk = check_output(e, f"probe %{probes[i].distributed}", b, [r[dl] for r in run.dist_out], groups, bl, dl, run.expected(bl))
            except ValueError:
                continue
            if chk.allclose:
                best = chk
                break
            if best is None or chk._excess < best._excess:
                best = chk
        out[i] = best
    return out


def run_pair(baseline_hlo: str, distributed_hlo: str, relations: dict[str, Any], seed: int = 0) -> PairReport:
    """One seed, no recheck: the comparison as the numeric oracle of the tests makes it."""
    return witness(baseline_hlo, distributed_hlo, relations, WitnessOptions(seeds=(seed,), memory_mb=float("inf"), recheck_f64=False, stop_at_first_difference=True))


def witness(baseline_hlo: str, distributed_hlo: str, relations: dict[str, Any], options: WitnessOptions | None = None, probes: list[Probe] | None = None) -> PairReport:
    """Execute the pair on ``options.seeds`` (stopping at the first seed whose outputs really
    differ, unless told otherwise) and compare every output under its relation. A text XLA
    refuses as written (a compiled module) is executed flattened (witness.flat)."""
    options = options or WitnessOptions()
    if options.flatten == "never":
        return _witness(baseline_hlo, distributed_hlo, relations, options, probes)
    fresh = [dataclasses.replace(p) for p in probes or []]
    always = options.flatten == "always"
    try:
        texts = (flat.executable(baseline_hlo, always), flat.executable(distributed_hlo, always))
    except Exception:  # not a module the flattener reads: XLA may still read it as written
        texts = (baseline_hlo, distributed_hlo)
    try:
        return _witness(*texts, relations, options, probes)
    except MemoryBudgetError:
        raise
    except Exception as first:
        try:
            flat_texts = (flat.flat_text(baseline_hlo), flat.flat_text(distributed_hlo))
        except Exception:
            raise first from None
        if flat_texts == texts:
            raise
        try:
            return _witness(*flat_texts, relations, options, fresh)
        except Exception:
            raise first from None


def _witness(baseline_hlo: str, distributed_hlo: str, relations: dict[str, Any], options: WitnessOptions, probes: list[Probe] | None) -> PairReport:
    probes = list(probes or [])
    t0 = time.perf_counter()
    groups = groups_of(relations)
    n = sum(len(g) for g in groups)
    entries = list(relations.get("outputs") or [])
    if not entries and not probes:
        raise ValueError("relations: no outputs to compare")
    need = estimate_bytes(baseline_hlo, distributed_hlo, n)
    if need > options.memory_mb * 2**20:
        raise MemoryBudgetError(need, options.memory_mb)
    count = instruction_count(baseline_hlo) + instruction_count(distributed_hlo)
    if count > options.max_instructions:
        raise MemoryBudgetError(need, options.memory_mb, f"the pair has {count} instructions, above the witness's compile budget of {options.max_instructions}")
    base0, dist0 = runtime.read(baseline_hlo), runtime.read(distributed_hlo)
    base_text, dist_text = base0.text, dist0.text
    slots: dict[int, tuple[int, int]] = {}
    if probes:
        base_text, b_added = with_outputs(base0.text, [p.baseline for p in probes if p.baseline])
        dist_text, d_added = with_outputs(dist0.text, [p.distributed for p in probes])
        for i, p in enumerate(probes):
            if p.baseline in b_added and p.distributed in d_added:
                slots[i] = (len(base0.results) + b_added.index(p.baseline), len(dist0.results) + d_added.index(p.distributed))
            else:
                p.detail = "not an instruction of the entry the witness can return (renamed by the normalizer, or tuple-shaped)"
    base, dist = runtime.read(base_text), runtime.read(dist_text)
    jobs = [(base.text, 1), (dist.text, n)]
    if options.prefetch_recheck and options.recheck_f64 and _widenable(base_text, dist_text):
        jobs += [(runtime.read(_widen(base_text)).text, 1), (runtime.read(_widen(dist_text)).text, n)]
    _precompile(jobs)
    report = PairReport(True, [], dist0.flavour, 0.0, probes=probes)
    probe_seen: dict[int, bool] = {}
    doubt: set[int] = set()  # probes that differed only near their tolerance on some seed
    for seed in options.seeds:
        bases, dist_args = make_group_inputs(base0, dist0, relations, groups, seed)
        run = _execute(base, dist, bases, dist_args)
        report.seeds.append(seed)
        checks = _output_checks(run, entries, base, dist, groups, len(base0.results), len(dist0.results))
        pchecks = _probe_checks(run, probes, slots, groups)
        out_bad = [k for k, chk in enumerate(checks) if not chk.allclose]
        probe_bad = [i for i, chk in pchecks.items() if chk is not None and not chk.allclose]
        # Every output difference is rechecked in f64: cancellation can blow rounding up to
        # any size (x + 1e7 - 1e7 in f32 rounds x to an integer). Probes are rechecked along
        # with the outputs only (a recheck compiles both programs again); with every output
        # equal, a probe that differs by less than RECHECK_RATIO x its tolerance is left
        # untested (rounding not excluded) rather than called different.
        uncertain = {i for i in probe_bad if pchecks[i].ratio < RECHECK_RATIO and not pchecks[i].nonfinite}  # type: ignore[union-attr]
        if out_bad and options.recheck_f64:
            uncertain = set()
            wide = _recheck(base, dist, base_text, dist_text, bases, dist_args, entries, probes, slots, groups, checks, pchecks, len(base0.results), len(dist0.results))
            if wide is not None:
                wchecks, wpchecks = wide
                # An overflow to inf/NaN on one side only is never rounding noise.
                still = [k for k in out_bad if checks[k].nonfinite or not wchecks[k].allclose]
                if not still:
                    report.rounding.append(seed)
                out_bad = still
                probe_bad = [i for i in probe_bad if pchecks[i].nonfinite or (wpchecks.get(i) is not None and not wpchecks[i].allclose)]  # type: ignore[union-attr]
        for i, chk in pchecks.items():
            probes[i].trials += 1
            if chk is None:
                probes[i].detail = "no relation to test at these shapes"
                continue
            if i in uncertain:
                if probe_seen.get(i, True):
                    probe_seen[i] = True
                    doubt.add(i)
                continue
            if i in probe_bad:
                if probe_seen.get(i, True):
                    probes[i].check = chk
                probe_seen[i] = False
            else:
                probe_seen.setdefault(i, True)
        if report.seed is None:
            report.outputs = checks
            report.baseline_outputs, report.distributed_outputs = run.base_out[: len(base0.results)], [r[: len(dist0.results)] for r in run.dist_out]
        if out_bad and report.seed is None:
            report.seed = seed
            report.equal = False
            for k, chk in enumerate(checks):
                chk.allclose = k not in out_bad
            if options.stop_at_first_difference:
                break
    for i, p in enumerate(probes):
        if i not in probe_seen:
            continue
        p.holds = probe_seen[i]
        if p.holds and i in doubt:
            p.holds = None
            p.detail = f"differs by less than {RECHECK_RATIO:g}x its tolerance; rounding not excluded (not rechecked in f64)"
        elif p.holds:
            p.detail = f"holds numerically on {p.trials} random input(s)"
        elif p.check is not None:
            chk = p.check
            p.detail = (f"differs from %{p.baseline} under {chk.relation}: max abs err {chk.max_abs_diff:.3g}, max rel err {chk.max_rel_diff:.3g}"
                        + (f"; at {list(chk.index)} {_compared(chk.rank)}: baseline {chk.baseline_value}, distributed {chk.distributed_value}" if chk.index is not None else ""))
    report.seconds = time.perf_counter() - t0
    return report


def _precompile(jobs: list[tuple[str, int]]) -> None:
    """Compile these (text, replicas) at once in threads: XLA compiles without the GIL, so the
    programs of a pair compile side by side (1.7 s instead of 2.5 s for an example pair on a
    loaded 2-core machine). A failure is left to the caller's own compile to report."""
    from concurrent.futures import ThreadPoolExecutor

    if len(jobs) < 2:
        return
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for f in [pool.submit(runtime.compile, text, n) for text, n in jobs]:
            f.exception()


# How many times the baseline's own low-precision summation noise (the largest move of an output
# under VARIANTS other summation orders of its bf16/f16 sums) a difference left by the f64 model
# may be and still count as rounding. Measured on the mixed-precision training step
# (examples: train_mixed_tp4, bf16 norm gradients summed over the sequence in one order on one
# device, in 4 local sums and a bf16 all-reduce on the ranks): the largest |baseline -
# distributed| of an output was at most 3.6x that output's noise over 30 seeds and 39 outputs
# (median ~1.2x). A sum the ranks compute in bf16 where the baseline computes it in f32
# (tests/adversarial: b_hlo_bf16_accumulate) leaves the baseline without a low-precision sum:
# no noise to excuse anything, the difference stands.
NOISE_FACTOR = 8.0


def _recheck(base: runtime.Program, dist: runtime.Program, base_text: str, dist_text: str, bases: list[list[np.ndarray]], dist_args: list[list[np.ndarray]], entries: list[dict[str, Any]], probes: list[Probe], slots: dict[int, tuple[int, int]], groups: list[list[int]], checks: list[OutputCheck], pchecks: dict[int, OutputCheck | None], nb: int, nd: int) -> tuple[list[OutputCheck], dict[int, OutputCheck | None]] | None:
    """The same inputs through both programs in the float model of ``verified`` (module
    engine.witness.model: f32 computed in f64, every written rounding kept), compared with the
    original tolerances; None when the model texts do not compile (a bitcast-convert, say).

    Why a difference as written is not evidence (seen on examples train_sp_tp4_separate, f32,
    seed 1): output 1 is layer 0's attention RMSNorm weight after the SGD step, w - 0.01 g,
    where g sums dy * x_hat over the 16 tokens, and dy comes back through two layers of N(0, 1)
    weights (the loss is ~2e3), so the sum cancels terms ~10^4 larger than its result. The f32
    baseline alone is 3.5e-3 from its own f64 value there; the ranks' order of the same sums is
    1.4e-3 from it; the two differ by 2.1e-3, which is 0.9 % of the element 0.64 (4x the f32
    tolerance at the output's scale 4.5). In the model the two agree to 4e-14. What the f64
    model leaves (bf16/f16 arithmetic stays as written) is compared again with the tolerance
    raised by NOISE_FACTOR x the baseline's own low-precision summation noise (``_noise``):
    train_mixed_tp4's bf16 sums differ by up to 1.4 as written (abs, on an element of -0.92),
    within ~2x the distance the baseline itself moves when its own bf16 sums are reordered."""
    try:
        wb, wd = runtime.read(_widen(base_text)), runtime.read(_widen(dist_text))
        wide_bases = _wide_groups(bases, wb)
        wide_base_args = wide_bases[0]
        run = _execute(wb, wd, wide_bases, [_wide_args(a, wd) for a in dist_args])
    except Exception:  # the recheck is an extra: without it, the difference stands
        return None
    tol_out = [default_tol(np.dtype(c.dtype)) for c in checks]
    tol_probe = {i: default_tol(np.dtype(c.dtype)) if c is not None else 0.0 for i, c in pchecks.items()}
    out = _output_checks(run, entries, wb, wd, groups, nb, nd, tol_out)
    pout = _probe_checks(run, probes, slots, groups, tol_probe)
    if all(c.allclose for c in out) and all(c is None or c.allclose for c in pout.values()):
        return out, pout
    try:
        noise = _noise(wb, wide_base_args, run.base_out)
    except Exception:  # no noise scale: the model's comparison stands
        return out, pout
    if noise is None:
        return out, pout

    def atol(tol: float, leaf: int) -> float:
        from .compare import scale_of

        return tol + NOISE_FACTOR * noise[leaf] / scale_of(run.base_out[leaf])

    noisy = [{**e, "rtol": tol_out[k], "atol": atol(tol_out[k], e["baseline"])} for k, e in enumerate(entries)]
    out = _output_checks(run, noisy, wb, wd, groups, nb, nd)
    pout = _probe_checks(run, probes, slots, groups, tol_probe, {i: atol(tol_probe[i], bl) for i, (bl, _) in slots.items()})
    return out, pout


def _noise(wb: runtime.Program, args: list[np.ndarray], base_out: list[np.ndarray]) -> list[float] | None:
    """Per baseline leaf: the largest difference between the model baseline's value and its
    value with the bf16/f16 sums in VARIANTS other orders (elements finite on both sides);
    None when the baseline has no such sum (nothing of its rounding is left to measure)."""
    noise = [0.0] * len(base_out)
    for v in range(VARIANTS):
        t = perturbed_sums(wb.text, v)
        if t is None:
            return None
        pb = runtime.read(t)
        got = [leaf[0] for leaf in runtime.execute(pb.text, [[a] for a in args], 1)]
        for k, (a, b) in enumerate(zip(got, base_out, strict=False)):
            if a.size == 0 or a.shape != b.shape or b.dtype.kind not in "fV":
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            both = np.isfinite(a64) & np.isfinite(b64)
            if both.any():
                noise[k] = max(noise[k], float(np.abs(a64 - b64)[both].max()))
    return noise


def instruction_count(text: str) -> int:
    """Instructions of every computation (lines that define a name), read without XLA."""
    return sum(1 for line in text.split("\n") if _DEFINES.match(line))


_DEFINES = re.compile(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*\S")


class MemoryBudgetError(Exception):
    """The pair exceeds the witness's memory (or compile) budget: nothing was executed."""

    def __init__(self, need: int, budget_mb: float, why: str = "") -> None:
        super().__init__(why or f"executing the pair needs about {need / 2**30:.1f} GiB (all ranks), above the witness memory budget of {budget_mb / 1024:.1f} GiB")
        self.need = need
        self.budget_mb = budget_mb


def instruction_differs(baseline_hlo: str, distributed_hlo: str, relations: dict[str, Any], options: WitnessOptions | None = None) -> tuple[bool, str, int | None, int, OutputCheck | None] | None:
    """Two one-instruction programs (segment.cut_instruction) on inputs satisfying
    ``relations['inputs']``: (differs, detail, the seed that shows it, seeds run, comparison);
    None when no relation can be tested at these shapes."""
    options = options or WitnessOptions()
    groups = groups_of(relations)
    n = sum(len(g) for g in groups)
    need = estimate_bytes(baseline_hlo, distributed_hlo, n)
    if need > options.memory_mb * 2**20:
        raise MemoryBudgetError(need, options.memory_mb)
    if options.flatten == "never":
        base, dist = runtime.read(baseline_hlo), runtime.read(distributed_hlo)
    else:
        always = options.flatten == "always"
        base, dist = runtime.read(flat.executable(baseline_hlo, always)), runtime.read(flat.executable(distributed_hlo, always))
    # The relation(s) the caller knows the instruction's value has (empty: inferred from the shapes).
    probe = Probe("segment", "segment", relations=list(relations.get("candidates") or []))
    trials = 0
    for seed in options.seeds:
        bases, dist_args = make_group_inputs(base, dist, relations, groups, seed)
        run = _execute(base, dist, bases, dist_args)
        trials += 1
        chk = _probe_checks(run, [probe], {0: (0, 0)}, groups)[0]
        if chk is None:
            return None
        if chk.allclose:
            continue
        if options.recheck_f64 and not chk.nonfinite:  # an overflow on one side: never rounding
            wide = None
            try:
                wb, wd = runtime.read(_widen(base.text)), runtime.read(_widen(dist.text))
                wrun = _execute(wb, wd, _wide_groups(bases, wb), [_wide_args(a, wd) for a in dist_args])
                wide = _probe_checks(wrun, [probe], {0: (0, 0)}, groups, {0: default_tol(np.dtype(chk.dtype))})[0]
            except Exception:  # the recheck is an extra: without it, the difference stands
                wide = None
            if wide is not None and wide.allclose:
                continue
        detail = (f"differs from the baseline's value under {chk.relation} on seed {seed}: max abs err {chk.max_abs_diff:.3g}, max rel err {chk.max_rel_diff:.3g}"
                  + (f"; at {list(chk.index)} {_compared(chk.rank)}: baseline {chk.baseline_value}, distributed {chk.distributed_value}" if chk.index is not None else ""))
        return True, detail, seed, trials, chk
    return False, f"holds numerically on {trials} random input(s)", None, trials, None


def _compared(rank: int | None) -> str:
    """Which distributed value a numeric check compared: one rank's, or (a partial relation)
    the sum over the ranks, which has no rank of its own."""
    return f"on rank {rank}" if rank is not None else "of the sum over the ranks"
