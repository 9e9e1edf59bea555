"""The laws of rules/rankpos.egg and rules/window.egg (issue 15, item 5), each in several
spellings. Every correct pair is verified AND executed by the witness (XLA's CPU runtime, every
output equal); every bug variant, a real change of value, is never verified and the witness
confirms the difference.

- positions ``w·r + i``: an iota or an arange literal, s32 or s64, converted to u32 or f32, the
  scalar on either side of the add (rotary angles of sequence-parallel rows);
- index_select of a rank's own rows at ``w·r + arange(w)``;
- rank offsets through ``shift-left`` and through float arithmetic (``s32(f32(r)·w)``);
- the vocab-parallel mask spelled ``ids < w·r | ids >= w·r + w``, with the range-decided
  guard ``ids < 0 ? ids + V : ids`` on ids in [0, V);
- a rank's block written into zeros at ``w·r`` and summed by an all-reduce;
- reverse and reduce-window (cumsum) along a dim other than the sharded one;
- max(x, -inf) = x, and a divisor computed as an exact constant expression;
- max(x + v) over a sharded dim as all-reduce(max)(local max) + v (floats; ints without wrap).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import VERIFIED
from shardproof.engine.relations import load_relations

RANK4 = "groups: [[0, 1, 2, 3]]\n"


def _rel(inputs: list[str], outputs: list[str]) -> str:
    return RANK4 + "inputs:\n" + "".join(f"  - {{{i}}}\n" for i in inputs) + "outputs:\n" + "".join(f"  - {{{o}}}\n" for o in outputs)


def _hlo(name: str, params: str, body: str) -> str:
    # params: documentation only (the entry's parameters are its parameter instructions)
    del params
    return f"HloModule {name}\n\n%add (a: f32[], b: f32[]) -> f32[] {{\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}}\n\nENTRY %main {{\n{body}}}\n"


def _check(tmp_path: Path, base: str, dist: str, rel: str, witness: str) -> object:
    for name, text in (("baseline.hlo", base), ("distributed.hlo", dist), ("relations.yaml", rel)):
        (tmp_path / name).write_text(text)
    return check_files(load_relations(tmp_path / "relations.yaml"), tmp_path / "baseline.hlo", tmp_path / "distributed.hlo", witness=witness)


# ---- positions: rows of x (sharded along 0) scaled by their global position ----------------
POS_BASE = {
    "iota": "  %i = s32[16] iota(), iota_dimension=0\n  %p = f32[16] convert(%i)\n",
    "arange_s64": "  %i = s64[16] constant({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})\n  %p = f32[16] convert(%i)\n",
}
POS_BASE_TAIL = "  %pb = f32[16,8] broadcast(%p), dimensions={0}\n  ROOT %y = f32[16,8] multiply(%x, %pb)\n"
# The rank's positions, r the s32[] rank: (baseline key, distributed lines defining %p as f32[4]).
POS_DIST = {
    # JAX: axis_index·w + iota
    "jax_iota": ("iota", "  %w = s32[] constant(4)\n  %o = s32[] multiply(%r, %w)\n  %ob = s32[4] broadcast(%o), dimensions={}\n  %i = s32[4] iota(), iota_dimension=0\n  %q = s32[4] add(%ob, %i)\n  %p = f32[4] convert(%q)\n"),
    # torch: s64(rank·w) + arange·1, the literal on the left
    "torch_s64_arange": ("arange_s64", "  %w = s32[] constant(4)\n  %o = s32[] multiply(%r, %w)\n  %o64 = s64[] convert(%o)\n  %ob = s64[4] broadcast(%o64), dimensions={}\n  %a = s64[4] constant({0, 1, 2, 3})\n  %one = s64[] constant(1)\n  %oneb = s64[4] broadcast(%one), dimensions={}\n  %a1 = s64[4] multiply(%a, %oneb)\n  %q = s64[4] add(%a1, %ob)\n  %p = f32[4] convert(%q)\n"),
    # through u32 (torch-xla's index convert), against the baseline's iota
    "u32_iota": ("iota", "  %w = s32[] constant(4)\n  %o = s32[] multiply(%w, %r)\n  %ob = s32[4] broadcast(%o), dimensions={}\n  %i = s32[4] iota(), iota_dimension=0\n  %q = s32[4] add(%i, %ob)\n  %u = u32[4] convert(%q)\n  %p = f32[4] convert(%u)\n"),
}
POS_BUGS = {
    "off_by_one": ("iota", "  %w = s32[] constant(4)\n  %o = s32[] multiply(%r, %w)\n  %one = s32[] constant(1)\n  %o1 = s32[] add(%o, %one)\n  %ob = s32[4] broadcast(%o1), dimensions={}\n  %i = s32[4] iota(), iota_dimension=0\n  %q = s32[4] add(%ob, %i)\n  %p = f32[4] convert(%q)\n"),
    "stride_half": ("iota", "  %w = s32[] constant(2)\n  %o = s32[] multiply(%r, %w)\n  %ob = s32[4] broadcast(%o), dimensions={}\n  %i = s32[4] iota(), iota_dimension=0\n  %q = s32[4] add(%ob, %i)\n  %p = f32[4] convert(%q)\n"),
    "local_positions": ("arange_s64", "  %i = s32[4] iota(), iota_dimension=0\n  %p = f32[4] convert(%i)\n"),
}
POS_REL = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 0", "distributed: 1, relation: rank"], ["baseline: 0, distributed: 0, relation: sharded, dim: 0"])


def _pos_pair(base_key: str, dist_lines: str) -> tuple[str, str]:
    base = _hlo("pos_b", "x: f32[16,8]", "  %x = f32[16,8] parameter(0)\n" + POS_BASE[base_key] + POS_BASE_TAIL)
    dist = _hlo("pos_d", "x: f32[4,8], r: s32[]", "  %x = f32[4,8] parameter(0)\n  %r = s32[] parameter(1)\n" + dist_lines + "  %pb = f32[4,8] broadcast(%p), dimensions={0}\n  ROOT %y = f32[4,8] multiply(%x, %pb)\n")
    return base, dist


@pytest.mark.parametrize("spelling", sorted(POS_DIST))
def test_rank_positions_verify_in_every_spelling(tmp_path: Path, spelling: str) -> None:
    r = _check(tmp_path, *_pos_pair(*POS_DIST[spelling]), POS_REL, "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("bug", sorted(POS_BUGS))
def test_wrong_rank_positions_are_never_verified(tmp_path: Path, bug: str) -> None:
    r = _check(tmp_path, *_pos_pair(*POS_BUGS[bug]), POS_REL, "auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- index_select of the rank's own rows ---------------------------------------------------
def _rows_pair(start: str) -> tuple[str, str, str]:
    base = _hlo("rows_b", "x: f32[8,16]", "  %x = f32[8,16] parameter(0)\n  ROOT %t = f32[8,16] tanh(%x)\n")
    dist = _hlo("rows_d", "x: f32[8,16], r: s32[]", "  %x = f32[8,16] parameter(0)\n  %r = s32[] parameter(1)\n  %t = f32[8,16] tanh(%x)\n"
                + start + "  %ob = s64[2] broadcast(%o64), dimensions={}\n  %a = s64[2] constant({0, 1})\n  %q = s64[2] add(%ob, %a)\n  %u = u32[2] convert(%q)\n"
                "  ROOT %g = f32[2,16] gather(%t, %u), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: duplicate", "distributed: 1, relation: rank"], ["baseline: 0, distributed: 0, relation: sharded, dim: 0"])
    return base, dist, rel


ROWS = {
    "s32_then_s64": "  %w = s32[] constant(2)\n  %o = s32[] multiply(%r, %w)\n  %o64 = s64[] convert(%o)\n",
    "s64_then_multiply": "  %r64 = s64[] convert(%r)\n  %w = s64[] constant(2)\n  %o64 = s64[] multiply(%w, %r64)\n",
}
ROWS_BUGS = {
    "next_rank_rows": "  %w = s32[] constant(2)\n  %o = s32[] multiply(%r, %w)\n  %two = s32[] constant(2)\n  %o2 = s32[] add(%o, %two)\n  %o64 = s64[] convert(%o2)\n",
    "stride_one": "  %o64 = s64[] convert(%r)\n",
}


@pytest.mark.parametrize("spelling", sorted(ROWS))
def test_index_select_of_own_rows_is_the_shard(tmp_path: Path, spelling: str) -> None:
    r = _check(tmp_path, *_rows_pair(ROWS[spelling]), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("bug", sorted(ROWS_BUGS))
def test_index_select_of_other_rows_is_diverged(tmp_path: Path, bug: str) -> None:
    r = _check(tmp_path, *_rows_pair(ROWS_BUGS[bug]), "auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- rank offsets of a dynamic-slice through shift-left and float arithmetic -----------------
OFFSETS = {
    "shift_left_2": "  %k = s32[] constant(2)\n  %start = s32[] shift-left(%r, %k)\n",
    "float_times_4": "  %rf = f32[] convert(%r)\n  %k = f32[] constant(4)\n  %m = f32[] multiply(%k, %rf)\n  %start = s32[] convert(%m)\n",
    "float_sum": "  %rf = f32[] convert(%r)\n  %m = f32[] add(%rf, %rf)\n  %m2 = f32[] add(%m, %m)\n  %start = s32[] convert(%m2)\n",
}
OFFSET_BUGS = {
    "shift_left_1": "  %k = s32[] constant(1)\n  %start = s32[] shift-left(%r, %k)\n",
    "float_times_3": "  %rf = f32[] convert(%r)\n  %k = f32[] constant(3)\n  %m = f32[] multiply(%rf, %k)\n  %start = s32[] convert(%m)\n",
}


def _offset_pair(lines: str) -> tuple[str, str, str]:
    base = _hlo("off_b", "x: f32[16,8]", "  %x = f32[16,8] parameter(0)\n  ROOT %t = f32[16,8] tanh(%x)\n")
    dist = _hlo("off_d", "x: f32[16,8], r: s32[]", "  %x = f32[16,8] parameter(0)\n  %r = s32[] parameter(1)\n" + lines
                + "  %zero = s32[] constant(0)\n  %d = f32[4,8] dynamic-slice(%x, %start, %zero), dynamic_slice_sizes={4,8}\n  ROOT %t = f32[4,8] tanh(%d)\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: duplicate", "distributed: 1, relation: rank"], ["baseline: 0, distributed: 0, relation: sharded, dim: 0"])
    return base, dist, rel


@pytest.mark.parametrize("spelling", sorted(OFFSETS))
def test_rank_offsets_verify_in_every_spelling(tmp_path: Path, spelling: str) -> None:
    r = _check(tmp_path, *_offset_pair(OFFSETS[spelling]), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("bug", sorted(OFFSET_BUGS))
def test_wrong_rank_offsets_are_diverged(tmp_path: Path, bug: str) -> None:
    r = _check(tmp_path, *_offset_pair(OFFSET_BUGS[bug]), "auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- vocab-parallel embedding with the mask compared against the rank's bounds ---------------
def _vocab_pair(upper: str) -> tuple[str, str, str]:
    # The baseline wraps negative ids (JAX's take): a guard the ids' range [0, 32) decides.
    base = _hlo("voc_b", "e: f32[32,8], ids: s32[6]", "  %e = f32[32,8] parameter(0)\n  %ids = s32[6] parameter(1)\n"
                "  %z = s32[] constant(0)\n  %zb = s32[6] broadcast(%z), dimensions={}\n  %neg = pred[6] compare(%ids, %zb), direction=LT\n"
                "  %v = s32[] constant(32)\n  %vb = s32[6] broadcast(%v), dimensions={}\n  %wrap = s32[6] add(%ids, %vb)\n  %i = s32[6] select(%neg, %wrap, %ids)\n"
                "  ROOT %g = f32[6,8] gather(%e, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}\n")
    dist = _hlo("voc_d", "e: f32[8,8], ids: s32[6], r: s32[]", "  %e = f32[8,8] parameter(0)\n  %ids = s32[6] parameter(1)\n  %r = s32[] parameter(2)\n"
                "  %w = s32[] constant(8)\n  %lo = s32[] multiply(%r, %w)\n  %lob = s32[6] broadcast(%lo), dimensions={}\n  %below = pred[6] compare(%ids, %lob), direction=LT\n"
                + upper + "  %hib = s32[6] broadcast(%hi), dimensions={}\n  %above = pred[6] compare(%ids, %hib), direction=GE\n  %m = pred[6] or(%below, %above)\n"
                "  %s = s32[6] subtract(%ids, %lob)\n  %z = s32[] constant(0)\n  %zb = s32[6] broadcast(%z), dimensions={}\n  %i = s32[6] select(%m, %zb, %s)\n"
                "  %g = f32[6,8] gather(%e, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}\n"
                "  %mb = pred[6,8] broadcast(%m), dimensions={0}\n  %f = f32[] constant(0)\n  %fb = f32[6,8] broadcast(%f), dimensions={}\n  %o = f32[6,8] select(%mb, %fb, %g)\n"
                "  ROOT %y = f32[6,8] all-reduce(%o), replica_groups={{0,1,2,3}}, to_apply=%add\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 0", "baseline: 1, distributed: 1, relation: duplicate, int_range: [0, 32]", "distributed: 2, relation: rank"],
               ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


def test_vocab_mask_compared_with_rank_bounds_verifies(tmp_path: Path) -> None:
    r = _check(tmp_path, *_vocab_pair("  %hi = s32[] add(%lo, %w)\n"), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_vocab_mask_one_id_short_is_diverged(tmp_path: Path) -> None:
    """Upper bound w·r + 7: the last id of each rank's rows is masked on every rank."""
    r = _check(tmp_path, *_vocab_pair("  %seven = s32[] constant(7)\n  %hi = s32[] add(%lo, %seven)\n"), "auto")
    assert r.verdict != VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- a rank's block into zeros at its offset, then an all-reduce -----------------------------
def _dus_pair(start: str) -> tuple[str, str, str]:
    base = _hlo("dus_b", "x: f32[16,8]", "  %x = f32[16,8] parameter(0)\n  ROOT %t = f32[16,8] tanh(%x)\n")
    dist = _hlo("dus_d", "x: f32[4,8], r: s32[]", "  %x = f32[4,8] parameter(0)\n  %r = s32[] parameter(1)\n  %t = f32[4,8] tanh(%x)\n"
                "  %f = f32[] constant(0)\n  %z = f32[16,8] broadcast(%f), dimensions={}\n" + start
                + "  %zero = s32[] constant(0)\n  %u = f32[16,8] dynamic-update-slice(%z, %t, %s, %zero)\n  ROOT %g = f32[16,8] all-reduce(%u), replica_groups={{0,1,2,3}}, to_apply=%add\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 0", "distributed: 1, relation: rank"], ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


def test_own_block_into_zeros_summed_is_the_whole(tmp_path: Path) -> None:
    for start in ("  %w = s32[] constant(4)\n  %s = s32[] multiply(%r, %w)\n", "  %k = s32[] constant(2)\n  %s = s32[] shift-left(%r, %k)\n"):
        r = _check(tmp_path, *_dus_pair(start), "always")
        assert r.verdict == VERIFIED, r.reason
        assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_block_into_zeros_at_a_wrong_offset_is_diverged(tmp_path: Path) -> None:
    r = _check(tmp_path, *_dus_pair("  %w = s32[] constant(3)\n  %s = s32[] multiply(%r, %w)\n"), "auto")
    assert r.verdict == "diverged", r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- reverse / reduce-window along the dim that is not sharded -------------------------------
WINDOW_OPS = {
    "reverse_other_dim": ("%v = f32[{n},8] reverse(%e), dimensions={{1}}", True),
    "cumsum_other_dim": ("%v = f32[{n},8] reduce-window(%e, %f), window={{size=1x8 pad=0_0x7_0}}, to_apply=%add", True),
    "window_sum_other_dim": ("%v = f32[{n},8] reduce-window(%e, %f), window={{size=1x3 pad=0_0x1_1}}, to_apply=%add", True),
    "reverse_sharded_dim": ("%v = f32[{n},8] reverse(%e), dimensions={{0}}", False),
    "cumsum_sharded_dim": ("%v = f32[{n},8] reduce-window(%e, %f), window={{size={n}x1 pad={p}_0x0_0}}, to_apply=%add", False),
}


@pytest.mark.parametrize("name", sorted(WINDOW_OPS))
def test_window_ops_along_the_other_dim(tmp_path: Path, name: str) -> None:
    op, correct = WINDOW_OPS[name]

    def side(n: int) -> str:
        return _hlo("win", f"x: f32[{n},8]", f"  %x = f32[{n},8] parameter(0)\n  %e = f32[{n},8] exponential(%x)\n  %f = f32[] constant(0)\n  ROOT " + op.format(n=n, p=n - 1) + "\n")

    rel = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 0"], ["baseline: 0, distributed: 0, relation: sharded, dim: 0"])
    r = _check(tmp_path, side(16), side(4), rel, "always" if correct else "auto")
    if correct:
        assert r.verdict == VERIFIED, r.reason
        assert r.witness is not None and r.witness["status"] == "equal", r.witness
    else:
        assert r.verdict == "diverged", r.reason
        assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


# ---- max identity and constant-expression divisors ------------------------------------------
def _softmax_pair(guard: str, divisor: str) -> tuple[str, str, str]:
    base = ("HloModule sm_b\n\n%max (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %m = f32[] maximum(%a, %b)\n}\n\n"
            "ENTRY %main (x: f32[8,16]) -> f32[8] {\n  %x = f32[8,16] parameter(0)\n  %lo = f32[] constant(-inf)\n  %mx = f32[8] reduce(%x, %lo), dimensions={1}, to_apply=%max\n"
            + guard + "  %n = f32[] constant(16)\n  %z = s32[] constant(0)\n  %zf = f32[] convert(%z)\n  %nd = f32[] subtract(%n, %zf)\n  %ndb = f32[8] broadcast(%nd), dimensions={}\n"
            "  ROOT %y = f32[8] divide(%g, %ndb)\n}\n")
    dist = ("HloModule sm_d\n\n%max (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %m = f32[] maximum(%a, %b)\n}\n\n"
            "ENTRY %main (x: f32[8,4]) -> f32[8] {\n  %x = f32[8,4] parameter(0)\n  %lo = f32[] constant(-inf)\n  %mx = f32[8] reduce(%x, %lo), dimensions={1}, to_apply=%max\n"
            "  %g = f32[8] all-reduce(%mx), replica_groups={{0,1,2,3}}, to_apply=%max\n  %n = f32[] constant(" + divisor + ")\n  %nb = f32[8] broadcast(%n), dimensions={}\n  ROOT %y = f32[8] divide(%g, %nb)\n}\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 1"], ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


MAX_GUARD = "  %ninf = f32[] constant(-inf)\n  %nb = f32[8] broadcast(%ninf), dimensions={}\n  %g = f32[8] maximum(%mx, %nb)\n"
MAX_GUARD_L = "  %ninf = f32[] constant(-3.40282347e+38)\n  %nb = f32[8] broadcast(%ninf), dimensions={}\n  %g = f32[8] maximum(%nb, %mx)\n"


@pytest.mark.parametrize("guard", [MAX_GUARD, MAX_GUARD_L])
def test_max_identity_and_constant_divisor(tmp_path: Path, guard: str) -> None:
    r = _check(tmp_path, *_softmax_pair(guard, "16"), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_max_with_a_non_identity_and_a_wrong_divisor_differs(tmp_path: Path) -> None:
    clip = "  %big = f32[] constant(100)\n  %zb = f32[8] broadcast(%big), dimensions={}\n  %g = f32[8] maximum(%mx, %zb)\n"
    r = _check(tmp_path, *_softmax_pair(clip, "16"), "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason
    r = _check(tmp_path, *_softmax_pair(MAX_GUARD, "15"), "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason


# ---- an extreme shifted by a constant before (baseline) or after (ranks) the reduction --------
def _shift_pair(dtype: str, v_base: str, v_dist: str, op: str, lo: str) -> tuple[str, str, str]:
    red = f"%{op} (a: {dtype}[], b: {dtype}[]) -> {dtype}[] {{\n  %a = {dtype}[] parameter(0)\n  %b = {dtype}[] parameter(1)\n  ROOT %m = {dtype}[] {'maximum' if op == 'max' else 'minimum'}(%a, %b)\n}}\n\n"
    base = (f"HloModule sh_b\n\n{red}ENTRY %main {{\n  %x = {dtype}[16,8] parameter(0)\n  %k = {dtype}[] constant({v_base})\n  %kb = {dtype}[16,8] broadcast(%k), dimensions={{}}\n"
            f"  %y = {dtype}[16,8] add(%kb, %x)\n  %lo = {dtype}[] constant({lo})\n  ROOT %m = {dtype}[8] reduce(%y, %lo), dimensions={{0}}, to_apply=%{op}\n}}\n")
    dist = (f"HloModule sh_d\n\n{red}ENTRY %main {{\n  %x = {dtype}[4,8] parameter(0)\n  %lo = {dtype}[] constant({lo})\n  %m = {dtype}[8] reduce(%x, %lo), dimensions={{0}}, to_apply=%{op}\n"
            f"  %g = {dtype}[8] all-reduce(%m), replica_groups={{{{0,1,2,3}}}}, to_apply=%{op}\n  %k = {dtype}[] constant({v_dist})\n  %kb = {dtype}[8] broadcast(%k), dimensions={{}}\n  ROOT %y = {dtype}[8] add(%g, %kb)\n}}\n")
    rng = ", int_range: [0, 16]" if dtype == "s32" else ""
    rel = _rel([f"baseline: 0, distributed: 0, relation: sharded, dim: 0{rng}"], ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


@pytest.mark.parametrize("case", [("f32", "2.5", "max", "-inf"), ("f32", "-7", "min", "inf"), ("s32", "1000", "max", "-2147483648")])
def test_extreme_shifted_by_a_constant(tmp_path: Path, case: tuple[str, str, str, str]) -> None:
    dtype, v, op, lo = case
    r = _check(tmp_path, *_shift_pair(dtype, v, v, op, lo), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_extreme_shifted_by_another_constant_or_wrapping_is_not_verified(tmp_path: Path) -> None:
    r = _check(tmp_path, *_shift_pair("f32", "2.5", "3", "max", "-inf"), "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason
    # s32, x in [0, 16): x + 2147483640 wraps for x >= 8, so max(x + v) is not max(x) + v.
    r = _check(tmp_path, *_shift_pair("s32", "2147483640", "2147483640", "max", "-2147483648"), "auto")
    assert r.verdict != VERIFIED, r.reason


# ---- an extreme through negation: max(x) = -min(-x) over the ranks ---------------------------
def _neg_pair(op: str, local: str, across: str, final_negate: bool = True) -> tuple[str, str, str]:
    def comp(name: str) -> str:
        return f"%{name} (a: f32[], b: f32[]) -> f32[] {{\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %m = f32[] {'maximum' if name == 'max' else 'minimum'}(%a, %b)\n}}\n\n"

    init = {"max": "-inf", "min": "inf"}
    base = f"HloModule ng_b\n\n{comp(op)}ENTRY %main {{\n  %x = f32[16,8] parameter(0)\n  %lo = f32[] constant({init[op]})\n  ROOT %m = f32[8] reduce(%x, %lo), dimensions={{0}}, to_apply=%{op}\n}}\n"
    tail = "  ROOT %y = f32[8] negate(%g)\n" if final_negate else "  ROOT %y = f32[8] copy(%g)\n"
    dist = (f"HloModule ng_d\n\n{comp('max')}{comp('min')}ENTRY %main {{\n  %x = f32[4,8] parameter(0)\n  %n = f32[4,8] negate(%x)\n  %i = f32[] constant({init[local]})\n"
            f"  %m = f32[8] reduce(%n, %i), dimensions={{0}}, to_apply=%{local}\n  %g = f32[8] all-reduce(%m), replica_groups={{{{0,1,2,3}}}}, to_apply=%{across}\n" + tail + "}\n")
    rel = _rel(["baseline: 0, distributed: 0, relation: sharded, dim: 0"], ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


@pytest.mark.parametrize("op", ["max", "min"])
def test_extreme_through_negation(tmp_path: Path, op: str) -> None:
    flip = "min" if op == "max" else "max"
    r = _check(tmp_path, *_neg_pair(op, flip, flip), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


@pytest.mark.parametrize("variant", [("max", "min", "max", True), ("max", "max", "max", True), ("max", "min", "min", False)])
def test_extreme_through_negation_bugs_are_diverged(tmp_path: Path, variant: tuple[str, str, str, bool]) -> None:
    """all-reduce of the wrong extreme; the local reduce not flipped; the final negate missing."""
    r = _check(tmp_path, *_neg_pair(*variant), "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason


# ---- torch-xla's token: `tok * gather(result)` added to the next collective's input ----------
def _token_pair(scale: str) -> tuple[str, str, str]:
    base = _hlo("tok_b", "", "  %x = f32[16,8] parameter(0)\n  %t = f32[16,8] tanh(%x)\n  ROOT %e = f32[16,8] exponential(%t)\n")
    dist = _hlo("tok_d", "", "  %tok = f32[] parameter(0)\n  %x = f32[4,8] parameter(1)\n  %t = f32[4,8] tanh(%x)\n"
                "  %ag = f32[16,8] all-gather(%t), replica_groups={{0,1,2,3}}, dimensions={0}\n  %z = s32[] constant(0)\n  %zb = s32[2] broadcast(%z), dimensions={}\n"
                "  %g = f32[] gather(%ag, %zb), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=0, slice_sizes={1,1}\n"
                f"  %m = f32[] multiply({scale}, %g)\n  %mb = f32[16,8] broadcast(%m), dimensions={{}}\n  %y = f32[16,8] add(%ag, %mb)\n  ROOT %e = f32[16,8] exponential(%y)\n")
    rel = _rel(["distributed: 0, relation: token", "baseline: 0, distributed: 1, relation: sharded, dim: 0"], ["baseline: 0, distributed: 0, relation: duplicate"])
    return base, dist, rel


def test_token_times_a_value_is_zero(tmp_path: Path) -> None:
    r = _check(tmp_path, *_token_pair("%tok"), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_a_non_token_scale_is_not_stripped(tmp_path: Path) -> None:
    base, dist, rel = _token_pair("%one")
    dist = dist.replace("  %m = f32[] multiply(", "  %one = f32[] constant(1)\n  %m = f32[] multiply(")
    r = _check(tmp_path, base, dist, rel, "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason


# ---- the compiled JAX embedding: rows kept as a unit dim, a reshape drops it -----------------
JAXC_VOCAB = Path(__file__).parent / "adversarial" / "pairs" / "c_jaxc_vocab_embedding_axis_index"


@pytest.mark.parametrize(("old", "new"), [
    ("%add.12 = s32[] add(%mul.4, %constant.10.clone.2)", "%c7 = s32[] constant(7)\n  %add.12 = s32[] add(%mul.4, %c7)"),  # upper bound w·r + 7
    ("%sub.5 = s32[8]{0} subtract(%param_1.3, %lt.15)", "%sub.5 = s32[8]{0} subtract(%lt.15, %param_1.3)"),  # w·r - id, not id - w·r
])
def test_compiled_vocab_embedding_mutants_are_not_verified(tmp_path: Path, old: str, new: str) -> None:
    base = (JAXC_VOCAB / "baseline.hlo").read_text()
    dist = (JAXC_VOCAB / "distributed.hlo").read_text()
    assert old in dist
    r = _check(tmp_path, base, dist.replace(old, new), (JAXC_VOCAB / "relations.yaml").read_text(), "auto")
    assert r.verdict != VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "confirmed", r.witness


def test_compiled_vocab_embedding_verifies(tmp_path: Path) -> None:
    texts = [(JAXC_VOCAB / n).read_text() for n in ("baseline.hlo", "distributed.hlo", "relations.yaml")]
    r = _check(tmp_path, *texts, "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


# ---- a stable sort along the dim that is not sharded -----------------------------------------
def _sort_pair(dim: int, stable: bool, two: bool) -> tuple[str, str, str]:
    cmp2 = "%lt (a: s32[], b: s32[], c: f32[], d: f32[]) -> pred[] {\n  %a = s32[] parameter(0)\n  %b = s32[] parameter(1)\n  %c = f32[] parameter(2)\n  %d = f32[] parameter(3)\n  ROOT %r = pred[] compare(%a, %b), direction=LT\n}\n\n"
    cmp1 = "%lt (a: f32[], b: f32[]) -> pred[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %r = pred[] compare(%a, %b), direction=GT\n}\n\n"
    attr = f"dimensions={{{dim}}}" + (", is_stable=true" if stable else "")

    def side(n: int) -> str:
        if two:
            body = (f"  %k = s32[{n},64] parameter(0)\n  %v = f32[{n},64] parameter(1)\n  %s = (s32[{n},64], f32[{n},64]) sort(%k, %v), {attr}, to_apply=%lt\n"
                    f"  ROOT %p = f32[{n},64] get-tuple-element(%s), index=1\n")
        else:
            body = f"  %v = f32[{n},64] parameter(0)\n  %e = f32[{n},64] exponential(%v)\n  ROOT %s = f32[{n},64] sort(%e), {attr}, to_apply=%lt\n"
        return f"HloModule srt\n\n{cmp2 if two else cmp1}ENTRY %main {{\n{body}}}\n"

    ins = ["baseline: 0, distributed: 0, relation: sharded, dim: 0, int_range: [0, 3]", "baseline: 1, distributed: 1, relation: sharded, dim: 0"] if two else ["baseline: 0, distributed: 0, relation: sharded, dim: 0"]
    return side(16), side(4), _rel(ins, ["baseline: 0, distributed: 0, relation: sharded, dim: 0"])


@pytest.mark.parametrize("two", [True, False])
def test_stable_sort_along_the_other_dim(tmp_path: Path, two: bool) -> None:
    r = _check(tmp_path, *_sort_pair(1, True, two), "always")
    assert r.verdict == VERIFIED, r.reason
    assert r.witness is not None and r.witness["status"] == "equal", r.witness


def test_sort_along_the_sharded_dim_or_unstable_is_not_verified(tmp_path: Path) -> None:
    r = _check(tmp_path, *_sort_pair(0, True, False), "auto")
    assert r.verdict == "diverged" and r.witness is not None and r.witness["status"] == "confirmed", r.reason
    assert _check(tmp_path, *_sort_pair(1, False, True), "auto").verdict != VERIFIED
