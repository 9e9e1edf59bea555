"""Comparing outputs under their relation, with per-dtype tolerances.

Element-wise ``|d - b| <= atol * scale + rtol * |b|`` with ``scale = max(1, max|baseline|)``;
defaults f64 1e-9, f32 1e-4, f16 5e-3, bf16 2e-2, f8 0.25 (rtol and atol alike); an output
entry's ``rtol`` / ``atol`` override them. Integers and pred must match exactly. NaN matches NaN
at the same position, an infinity the same infinity. The worst element (largest excess over its
tolerance, else the largest difference) is kept with its index, rank and both values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .inputs import norm_dim, split

TOLERANCES: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2, "complex128": 1e-9, "complex64": 1e-4}
OUTPUT_RELATIONS = ("duplicate", "sharded", "partial")


def default_tol(dt: np.dtype) -> float:
    if dt.name in TOLERANCES:
        return TOLERANCES[dt.name]
    if dt.name.startswith(("float8", "float4", "float6")):
        return 0.25
    return 0.0


def scale_of(x: np.ndarray) -> float:
    if x.size == 0 or x.dtype.kind in "biu":
        return 1.0
    v = np.abs(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64))
    v = v[np.isfinite(v)]
    return max(1.0, float(v.max())) if v.size else 1.0


def _number(x: Any) -> float | int | bool | str:
    v = x.item() if hasattr(x, "item") else x
    if isinstance(v, complex):
        return str(v)
    if isinstance(v, bool | int):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


@dataclasses.dataclass
class OutputCheck:
    """One output entry compared over every rank of every group."""

    baseline: int
    distributed: int
    relation: str
    dtype: str
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    allclose: bool = True
    rtol: float = 0.0
    atol: float = 0.0  # effective (already scaled by the baseline's magnitude)
    worst: tuple[int, int] | None = None  # (group, rank in group); rank -1: a partial's reduction
    note: str = ""
    index: tuple[int, ...] | None = None  # the worst element's index in the compared arrays
    rank: int | None = None  # its global rank (None: a partial output's reduction over ranks)
    baseline_value: Any = None
    distributed_value: Any = None
    _excess: float = dataclasses.field(default=-np.inf, repr=False)
    # The largest difference as a multiple of its element's tolerance (>1: not close).
    ratio: float = dataclasses.field(default=0.0, repr=False)
    # Some element differs with a non-finite value on one side only (inf/NaN against a finite
    # value, or infinities of opposite sign): an overflow, never rounding noise, so the f64
    # recheck (where the overflow may not happen) must not excuse it.
    nonfinite: bool = dataclasses.field(default=False, repr=False)

    @property
    def relation_text(self) -> str:
        return self.relation

    def line(self) -> str:
        where = f" worst group {self.worst[0]} rank {self.worst[1]}" if self.worst else ""
        at = f" at {list(self.index)}: baseline {self.baseline_value} distributed {self.distributed_value}" if self.index is not None and not self.allclose else ""
        note = f" ({self.note})" if self.note else ""
        return (f"out b{self.baseline}/d{self.distributed} {self.relation:9s} {self.dtype:8s} max_abs {self.max_abs_diff:.3g} max_rel {self.max_rel_diff:.3g} "
                f"[rtol {self.rtol:g} atol {self.atol:.3g}] {'ok' if self.allclose else 'MISMATCH'}{where}{at}{note}")

    def to_json(self, output: int | None = None) -> dict[str, Any]:
        def num(v: float) -> float | str:
            return v if np.isfinite(v) else str(v)

        return {
            "output": self.distributed if output is None else output, "relation": self.relation, "equal": self.allclose, "dtype": self.dtype,
            "max_abs_err": num(self.max_abs_diff), "max_rel_err": num(self.max_rel_diff),
            "index": list(self.index) if self.index is not None else [], "rank": self.rank,
            "baseline_value": self.baseline_value, "distributed_value": self.distributed_value,
        }

    def record(self, actual: np.ndarray, expected: np.ndarray, where: tuple[int, int], rank: int | None) -> None:
        """Compare one rank's (or one reduction's) array with the expected one."""
        if actual.shape != expected.shape or actual.dtype != expected.dtype:
            self.allclose = False
            self.max_abs_diff = self.max_rel_diff = float("inf")
            self.worst, self.rank, self._excess, self.ratio = where, rank, np.inf, np.inf
            self.note = f"distributed gives {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}"
            return
        if expected.size == 0:
            return
        if expected.dtype.kind in "biu":
            a, e = actual.astype(np.float64), expected.astype(np.float64)
            diff = np.abs(a - e)
            rel = diff / np.maximum(np.abs(e), 1.0)
            excess = np.where(actual != expected, diff + 1.0, -1.0)
            self.ratio = max(self.ratio, np.inf if bool((actual != expected).any()) else 0.0)
        else:
            wide = np.complex128 if expected.dtype.kind == "c" or actual.dtype.kind == "c" else np.float64
            a, e = actual.astype(wide), expected.astype(wide)
            same = (a == e) | (np.isnan(a) & np.isnan(e))  # also infinities of the same sign
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.where(same, 0.0, np.abs(a - e))
            diff = np.where(np.isnan(diff), np.inf, diff)
            if bool(((~same) & ~(np.isfinite(a) & np.isfinite(e))).any()):
                self.nonfinite = True
            finite_e = np.abs(np.where(np.isfinite(e), e, 0.0))
            rel = diff / np.maximum(finite_e, max(self.atol, np.finfo(np.float64).tiny))
            allowed = self.atol + self.rtol * finite_e
            with np.errstate(invalid="ignore"):
                excess = diff - allowed
            excess = np.where(np.isnan(excess), np.inf, excess)
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.where(diff > 0, diff / np.maximum(allowed, np.finfo(np.float64).tiny), 0.0)
            self.ratio = max(self.ratio, float(ratio.max()))
        flat = int(np.argmax(excess))
        ex = float(excess.flat[flat])
        self.max_abs_diff = max(self.max_abs_diff, float(diff.max()))
        self.max_rel_diff = max(self.max_rel_diff, float(rel.max()))
        if ex > 0:
            self.allclose = False
        if ex > self._excess:
            self._excess = ex
            self.worst, self.rank = where, rank
            self.index = tuple(int(i) for i in np.unravel_index(flat, expected.shape))
            self.baseline_value = _number(expected.flat[flat])
            self.distributed_value = _number(actual.flat[flat])


def reduce_partial(outs: list[np.ndarray], op: str) -> np.ndarray:
    dt = outs[0].dtype
    if op == "add":
        if dt.kind in "iub":
            total = np.sum(np.stack(outs), axis=0, dtype=dt if dt.kind != "b" else None)
            return total.astype(bool) if dt.kind == "b" else total
        wide = np.complex128 if dt.kind == "c" else np.float64
        return np.sum(np.stack([o.astype(wide) for o in outs]), axis=0)
    if op == "max":
        return np.max(np.stack(outs), axis=0)
    if op == "min":
        return np.min(np.stack(outs), axis=0)
    raise ValueError(f"unknown partial op {op!r} (add, max, min)")


def check_output(entry: dict[str, Any], what: str, expected_full: np.ndarray, dist_outs: list[np.ndarray], groups: list[list[int]], bi: int, di: int, per_group: list[np.ndarray] | None = None) -> OutputCheck:
    """Compare the baseline output with every rank's output under ``entry``'s relation;
    ``dist_outs[global rank]``. ``per_group``: each group's own baseline output (groups that
    hold different data, inputs.per_group_data) instead of ``expected_full`` for all."""
    rel = entry.get("relation")
    if rel not in OUTPUT_RELATIONS:
        raise ValueError(f"{what}: unknown relation {rel!r}")
    dt = expected_full.dtype
    tol = default_tol(dt)
    text = str(rel)
    if rel == "sharded":
        text = f"sharded(dim={entry.get('dim')}" + (f", blocks={list(entry['blocks'])}" if entry.get("blocks") else "") + ")"
    elif rel == "partial":
        text = f"partial({entry.get('op', 'add')})"
    scale = max(scale_of(x) for x in per_group) if per_group else scale_of(expected_full)
    check = OutputCheck(bi, di, text, dt.name, rtol=float(entry.get("rtol", tol)), atol=float(entry.get("atol", tol)) * scale)
    for gi, g in enumerate(groups):
        if per_group is not None:
            expected_full = per_group[gi]
        c = len(g)
        outs = [dist_outs[gid] for gid in g]
        if rel == "duplicate":
            for r in range(c):
                check.record(outs[r], expected_full, (gi, r), g[r])
        elif rel == "sharded":
            dim = norm_dim(entry.get("dim"), expected_full.ndim, what)
            pieces = split(expected_full, dim, c, entry.get("blocks"), what)
            for r in range(c):
                check.record(outs[r], pieces[r], (gi, r), g[r])
        else:
            bad = next((r for r, o in enumerate(outs) if o.shape != expected_full.shape or o.dtype != dt), None)
            if bad is not None:
                check.record(outs[bad], expected_full, (gi, bad), g[bad])
                continue
            total = reduce_partial(outs, str(entry.get("op", "add")))
            check.record(total.astype(total.dtype), expected_full.astype(total.dtype) if total.dtype != dt else expected_full, (gi, -1), None)
    return check
