"""Adversarial pairs written by hand as HLO text: forms no torch or JAX program here prints
(iota replica groups, a max through a negated min, unstable sorts, integer wrap, ...).

``PAIRS`` maps a name to ``(description, baseline text, distributed text, relations text)``;
names starting ``c_`` are correct, ``b_`` carry one bug.
"""

from __future__ import annotations

C = 4

_ADD = """%add (a: {t}[], b: {t}[]) -> {t}[] {{
  %a = {t}[] parameter(0)
  %b = {t}[] parameter(1)
  ROOT %r = {t}[] add(%a, %b)
}}
"""
_MAX = """%max (a: {t}[], b: {t}[]) -> {t}[] {{
  %a = {t}[] parameter(0)
  %b = {t}[] parameter(1)
  ROOT %r = {t}[] maximum(%a, %b)
}}
"""
_MIN = """%min (a: {t}[], b: {t}[]) -> {t}[] {{
  %a = {t}[] parameter(0)
  %b = {t}[] parameter(1)
  ROOT %r = {t}[] minimum(%a, %b)
}}
"""
_LT = """%lt (a: s32[], b: s32[], c: f32[], d: f32[]) -> pred[] {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  %c = f32[] parameter(2)
  %d = f32[] parameter(3)
  ROOT %r = pred[] compare(%a, %b), direction=LT
}
"""


def _module(name: str, body: str, *helpers: str) -> str:
    return f"HloModule {name}\n\n" + "\n".join(helpers) + ("\n" if helpers else "") + body


def _rel(inputs: list[str], outputs: list[str], groups: str = "[[0, 1, 2, 3]]") -> str:
    return ("groups: " + groups + "\ninputs:\n" + "".join(f"  - {i}\n" for i in inputs)
            + "outputs:\n" + "".join(f"  - {o}\n" for o in outputs))


SHARD0 = "{baseline: 0, distributed: 0, relation: sharded, dim: 0}"
DUP_OUT = "{baseline: 0, distributed: 0, relation: duplicate}"


# --- row sum over a sharded dim, all-reduced with various replica-group spellings --------------

_SUM_BASE = _module("sum_base", """ENTRY %main (x: f32[16,8]) -> f32[8] {
  %x = f32[16,8] parameter(0)
  %zero = f32[] constant(0)
  ROOT %s = f32[8] reduce(%x, %zero), dimensions={0}, to_apply=%add
}
""", _ADD.format(t="f32"))


def _sum_dist(groups: str) -> str:
    return _module("sum_dist", f"""ENTRY %main (x: f32[4,8]) -> f32[8] {{
  %x = f32[4,8] parameter(0)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={{0}}, to_apply=%add
  ROOT %r = f32[8] all-reduce(%s), replica_groups={groups}, to_apply=%add
}}
""", _ADD.format(t="f32"))


def _rs_ag(ag_dim: int) -> str:
    return _module("rs_ag", f"""ENTRY %main (x: f32[4,8]) -> f32[8] {{
  %x = f32[4,8] parameter(0)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={{0}}, to_apply=%add
  %rs = f32[2] reduce-scatter(%s), replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, to_apply=%add
  ROOT %ag = f32[8] all-gather(%rs), replica_groups={{{{0,1,2,3}}}}, dimensions={{{ag_dim}}}
}}
""", _ADD.format(t="f32"))


_SQ_BASE = _module("sq_base", """ENTRY %main (x: f32[8,8], w: f32[8,8]) -> f32[8,8] {
  %x = f32[8,8] parameter(0)
  %w = f32[8,8] parameter(1)
  ROOT %d = f32[8,8] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""")


def _sq_rs_ag(transposed: bool) -> str:
    # the bug transposes the scattered rows and gathers them along dim 1: the result's transpose
    gather = ("  %t = f32[8,2] transpose(%rs), dimensions={1,0}\n"
              "  ROOT %ag = f32[8,8] all-gather(%t), replica_groups={{0,1,2,3}}, dimensions={1}\n") if transposed else (
        "  ROOT %ag = f32[8,8] all-gather(%rs), replica_groups={{0,1,2,3}}, dimensions={0}\n")
    return _module("sq_dist", """ENTRY %main (x: f32[8,2], w: f32[2,8]) -> f32[8,8] {
  %x = f32[8,2] parameter(0)
  %w = f32[2,8] parameter(1)
  %d = f32[8,8] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %rs = f32[2,8] reduce-scatter(%d), replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%add
""" + gather + "}\n", _ADD.format(t="f32"))


_SQ_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 1}",
                "{baseline: 1, distributed: 1, relation: sharded, dim: 0}"], [DUP_OUT])


# --- max over a sharded dim -------------------------------------------------------------------

_MAXRED_BASE = _module("max_base", """ENTRY %main (x: f32[16,8]) -> f32[8] {
  %x = f32[16,8] parameter(0)
  %lo = f32[] constant(-inf)
  ROOT %m = f32[8] reduce(%x, %lo), dimensions={0}, to_apply=%max
}
""", _MAX.format(t="f32"))


def _neg_red(local: str, coll: str) -> str:
    init = "inf" if local == "min" else "-inf"
    return _module("negmax_dist", f"""ENTRY %main (x: f32[4,8]) -> f32[8] {{
  %x = f32[4,8] parameter(0)
  %n = f32[4,8] negate(%x)
  %init = f32[] constant({init})
  %m = f32[8] reduce(%n, %init), dimensions={{0}}, to_apply=%{local}
  %g = f32[8] all-reduce(%m), replica_groups={{{{0,1,2,3}}}}, to_apply=%{coll}
  ROOT %r = f32[8] negate(%g)
}}
""", _MIN.format(t="f32"), _MAX.format(t="f32"))


# --- a dot whose contraction dim is the sharded dim 0 of both operands --------------------------

_DOTT_BASE = _module("dott_base", """ENTRY %main (a: f32[16,8], b: f32[16,8]) -> f32[8,8] {
  %a = f32[16,8] parameter(0)
  %b = f32[16,8] parameter(1)
  ROOT %d = f32[8,8] dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
""")


def _dott_dist(transpose_out: bool) -> str:
    tail = ("  %g = f32[8,8] all-reduce(%d), replica_groups={{0,1,2,3}}, to_apply=%add\n"
            "  ROOT %t = f32[8,8] transpose(%g), dimensions={1,0}\n") if transpose_out else (
        "  ROOT %g = f32[8,8] all-reduce(%d), replica_groups={{0,1,2,3}}, to_apply=%add\n")
    return _module("dott_dist", """ENTRY %main (a: f32[4,8], b: f32[4,8]) -> f32[8,8] {
  %a = f32[4,8] parameter(0)
  %b = f32[4,8] parameter(1)
  %d = f32[8,8] dot(%a, %b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
""" + tail + "}\n", _ADD.format(t="f32"))


_DOTT_REL = _rel([SHARD0, "{baseline: 1, distributed: 1, relation: sharded, dim: 0}"], [DUP_OUT])


# --- bf16 inputs summed over a sharded dim -------------------------------------------------------

_BF_BASE = _module("bf_base", """ENTRY %main (x: bf16[64,8]) -> f32[8] {
  %x = bf16[64,8] parameter(0)
  %w = f32[64,8] convert(%x)
  %zero = f32[] constant(0)
  ROOT %s = f32[8] reduce(%w, %zero), dimensions={0}, to_apply=%add
}
""", _ADD.format(t="f32"))


def _bf_dist(accumulate_bf16: bool) -> str:
    if accumulate_bf16:
        body = """  %zero = bf16[] constant(0)
  %s = bf16[8] reduce(%x, %zero), dimensions={0}, to_apply=%addbf
  %w = f32[8] convert(%s)
"""
        helpers = (_ADD.format(t="f32"), _ADD.format(t="bf16").replace("%add ", "%addbf "))
    else:
        body = """  %v = f32[16,8] convert(%x)
  %zero = f32[] constant(0)
  %w = f32[8] reduce(%v, %zero), dimensions={0}, to_apply=%add
"""
        helpers = (_ADD.format(t="f32"),)
    return _module("bf_dist", "ENTRY %main (x: bf16[16,8]) -> f32[8] {\n  %x = bf16[16,8] parameter(0)\n"
                   + body + "  ROOT %r = f32[8] all-reduce(%w), replica_groups={{0,1,2,3}}, to_apply=%add\n}\n",
                   *helpers)


# --- sort along a non-sharded dim, keys with ties, a payload ----------------------------------

N_SORT = 64


def _sort(rows: int, stable: bool) -> str:
    flag = ", is_stable=true" if stable else ""
    return _module("sort", f"""ENTRY %main (k: s32[{rows},{N_SORT}], v: f32[{rows},{N_SORT}]) -> f32[{rows},{N_SORT}] {{
  %k = s32[{rows},{N_SORT}] parameter(0)
  %v = f32[{rows},{N_SORT}] parameter(1)
  %s = (s32[{rows},{N_SORT}], f32[{rows},{N_SORT}]) sort(%k, %v), dimensions={{1}}{flag}, to_apply=%lt
  ROOT %p = f32[{rows},{N_SORT}] get-tuple-element(%s), index=1
}}
""", _LT)


_SORT_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 0, int_range: [0, 3]}",
                  "{baseline: 1, distributed: 1, relation: sharded, dim: 0}"],
                 ["{baseline: 0, distributed: 0, relation: sharded, dim: 0}"])


# --- reverse -------------------------------------------------------------------------------------


def _reverse(rows: int, dim: int) -> str:
    return _module("rev", f"""ENTRY %main (x: f32[{rows},8]) -> f32[{rows},8] {{
  %x = f32[{rows},8] parameter(0)
  %e = f32[{rows},8] exponential(%x)
  ROOT %r = f32[{rows},8] reverse(%e), dimensions={{{dim}}}
}}
""")


_SH0_REL = _rel([SHARD0], ["{baseline: 0, distributed: 0, relation: sharded, dim: 0}"])


# --- integer sums and maxima -------------------------------------------------------------------

_S32_SUM_BASE = _module("s32sum_base", """ENTRY %main (x: s32[16,8]) -> s32[8] {
  %x = s32[16,8] parameter(0)
  %k = s32[] constant(2147483000)
  %kb = s32[16,8] broadcast(%k), dimensions={}
  %y = s32[16,8] add(%x, %kb)
  %zero = s32[] constant(0)
  ROOT %s = s32[8] reduce(%y, %zero), dimensions={0}, to_apply=%add
}
""", _ADD.format(t="s32"))

_S32_SUM_DIST = _module("s32sum_dist", """ENTRY %main (x: s32[4,8]) -> s32[8] {
  %x = s32[4,8] parameter(0)
  %k = s32[] constant(2147483000)
  %kb = s32[4,8] broadcast(%k), dimensions={}
  %y = s32[4,8] add(%x, %kb)
  %zero = s32[] constant(0)
  %s = s32[8] reduce(%y, %zero), dimensions={0}, to_apply=%add
  ROOT %r = s32[8] all-reduce(%s), replica_groups={{0,1,2,3}}, to_apply=%add
}
""", _ADD.format(t="s32"))

_INT_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 0, int_range: [0, 16]}"], [DUP_OUT])


def _s32_max_base(k: int) -> str:
    return _module("s32max_base", f"""ENTRY %main (x: s32[16,8]) -> s32[8] {{
  %x = s32[16,8] parameter(0)
  %k = s32[] constant({k})
  %kb = s32[16,8] broadcast(%k), dimensions={{}}
  %y = s32[16,8] add(%x, %kb)
  %lo = s32[] constant(-2147483648)
  ROOT %m = s32[8] reduce(%y, %lo), dimensions={{0}}, to_apply=%max
}}
""", _MAX.format(t="s32"))


def _s32_max_dist(k: int) -> str:
    return _module("s32max_dist", f"""ENTRY %main (x: s32[4,8]) -> s32[8] {{
  %x = s32[4,8] parameter(0)
  %lo = s32[] constant(-2147483648)
  %m = s32[8] reduce(%x, %lo), dimensions={{0}}, to_apply=%max
  %g = s32[8] all-reduce(%m), replica_groups={{{{0,1,2,3}}}}, to_apply=%max
  %k = s32[] constant({k})
  %kb = s32[8] broadcast(%k), dimensions={{}}
  ROOT %y = s32[8] add(%g, %kb)
}}
""", _MAX.format(t="s32"))


# --- rank-offset dynamic-slice and rank guards -----------------------------------------------

_DS_BASE = _module("ds_base", """ENTRY %main (x: f32[16,8]) -> f32[16,8] {
  %x = f32[16,8] parameter(0)
  ROOT %t = f32[16,8] tanh(%x)
}
""")


def _ds_dist(offset: int, mult: int = 4, start: str | None = None) -> str:
    """dynamic-slice of rows at ``start`` (HLO lines defining %start from %r), by default
    rank*mult + offset."""
    start = start or f"""  %w = s32[] constant({mult})
  %o = s32[] multiply(%r, %w)
  %off = s32[] constant({offset})
  %start = s32[] add(%o, %off)"""
    return _module("ds_dist", f"""ENTRY %main (x: f32[16,8], r: s32[]) -> f32[4,8] {{
  %x = f32[16,8] parameter(0)
  %r = s32[] parameter(1)
{start}
  %zero = s32[] constant(0)
  %d = f32[4,8] dynamic-slice(%x, %start, %zero), dynamic_slice_sizes={{4,8}}
  ROOT %t = f32[4,8] tanh(%d)
}}
""")


_DS_REL = _rel(["{baseline: 0, distributed: 0, relation: duplicate}", "{distributed: 1, relation: rank}"],
               ["{baseline: 0, distributed: 0, relation: sharded, dim: 0}"])

_FLOAT_START = """  %rf = f32[] convert(%r)
  %w = f32[] constant({w})
  %m = f32[] multiply(%rf, %w)
  %start = s32[] convert(%m)"""
_SHIFT_START = """  %w = s32[] constant({w})
  %start = s32[] shift-left(%r, %w)"""

# --- data x tensor parallel: two groups of two -------------------------------------------------


def _dp_tp_dist(groups: str) -> str:
    return _module("dptp_dist", f"""ENTRY %main (x: f32[8,8], w: f32[8,16]) -> f32[8,16] {{
  %x = f32[8,8] parameter(0)
  %w = f32[8,16] parameter(1)
  %d = f32[8,16] dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %g = f32[8,16] all-reduce(%d), replica_groups={groups}, to_apply=%add
}}
""", _ADD.format(t="f32"))


_DP_TP_BASE = _module("dptp_base", """ENTRY %main (x: f32[8,16], w: f32[16,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0)
  %w = f32[16,16] parameter(1)
  ROOT %d = f32[8,16] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
""")
_DP_TP_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 1}",
                   "{baseline: 1, distributed: 1, relation: sharded, dim: 0}"], [DUP_OUT], "[[0, 1], [2, 3]]")

_GUARD_BASE = _module("guard_base", """ENTRY %main (x: f32[8,16], b: f32[8]) -> f32[8] {
  %x = f32[8,16] parameter(0)
  %b = f32[8] parameter(1)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={1}, to_apply=%add
  ROOT %y = f32[8] add(%s, %b)
}
""", _ADD.format(t="f32"))


def _guard_dist(direction: str) -> str:
    return _module("guard_dist", f"""ENTRY %main (x: f32[8,4], b: f32[8], r: s32[]) -> f32[8] {{
  %x = f32[8,4] parameter(0)
  %b = f32[8] parameter(1)
  %r = s32[] parameter(2)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={{1}}, to_apply=%add
  %z = s32[] constant(0)
  %p = pred[] compare(%r, %z), direction={direction}
  %pb = pred[8] broadcast(%p), dimensions={{}}
  %zb = f32[8] broadcast(%zero), dimensions={{}}
  %bb = f32[8] select(%pb, %b, %zb)
  %y = f32[8] add(%s, %bb)
  ROOT %g = f32[8] all-reduce(%y), replica_groups={{{{0,1,2,3}}}}, to_apply=%add
}}
""", _ADD.format(t="f32"))


_GUARD_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 1}",
                   "{baseline: 1, distributed: 1, relation: duplicate}", "{distributed: 2, relation: rank}"],
                  [DUP_OUT])


# --- a mean over a sharded dim: all-reduce then divide by the whole count -------------------------

_MEAN_BASE = _module("mean_base", """ENTRY %main (x: f32[16,8]) -> f32[8] {
  %x = f32[16,8] parameter(0)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={0}, to_apply=%add
  %n = f32[] constant(16)
  %nb = f32[8] broadcast(%n), dimensions={}
  ROOT %m = f32[8] divide(%s, %nb)
}
""", _ADD.format(t="f32"))


def _mean_dist(count: int) -> str:
    return _module("mean_dist", f"""ENTRY %main (x: f32[4,8]) -> f32[8] {{
  %x = f32[4,8] parameter(0)
  %zero = f32[] constant(0)
  %s = f32[8] reduce(%x, %zero), dimensions={{0}}, to_apply=%add
  %g = f32[8] all-reduce(%s), replica_groups={{{{0,1,2,3}}}}, to_apply=%add
  %n = f32[] constant({count})
  %nb = f32[8] broadcast(%n), dimensions={{}}
  ROOT %m = f32[8] divide(%g, %nb)
}}
""", _ADD.format(t="f32"))


# --- an elided gather-index literal -------------------------------------------------------------


def _perm_gather(indices: str) -> str:
    return _module("perm", f"""ENTRY %main (x: f32[16,8]) -> f32[16,8] {{
  %x = f32[16,8] parameter(0)
  %i = s32[16,1] constant({indices})
  ROOT %g = f32[16,8] gather(%x, %i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,8}}
}}
""")


def _perm_dist(indices: str) -> str:
    return _module("perm_dist", f"""ENTRY %main (x: f32[16,2]) -> f32[16,2] {{
  %x = f32[16,2] parameter(0)
  %i = s32[16,1] constant({indices})
  ROOT %g = f32[16,2] gather(%x, %i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,2}}
}}
""")


def _literal(values: list[int]) -> str:
    return "{ " + ", ".join(f"{{{v}}}" for v in values) + " }"


_REV16 = _literal(list(range(15, -1, -1)))
_ROT16 = _literal([(i + 1) % 16 for i in range(16)])
_PERM_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 1}"],
                 ["{baseline: 0, distributed: 0, relation: sharded, dim: 1}"])


# --- a precision drop through f16 ------------------------------------------------------------

_TANH_BASE = _module("tanh_base", """ENTRY %main (x: f32[8,16], w: f32[16,16]) -> f32[8,16] {
  %x = f32[8,16] parameter(0)
  %w = f32[16,16] parameter(1)
  %d = f32[8,16] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = f32[8,16] tanh(%d)
}
""")


def _tanh_dist(via: str | None) -> str:
    body = "  %y = f32[8,16] all-reduce(%d), replica_groups={{0,1,2,3}}, to_apply=%add\n"
    last = "%y"
    if via:
        body += f"  %h = {via}[8,16] convert(%y)\n  %u = f32[8,16] convert(%h)\n"
        last = "%u"
    return _module("tanh_dist", """ENTRY %main (x: f32[8,4], w: f32[4,16]) -> f32[8,16] {
  %x = f32[8,4] parameter(0)
  %w = f32[4,16] parameter(1)
  %d = f32[8,16] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
""" + body + f"  ROOT %t = f32[8,16] tanh({last})\n}}\n", _ADD.format(t="f32"))


_TANH_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 1}",
                  "{baseline: 1, distributed: 1, relation: sharded, dim: 0}"], [DUP_OUT])


# --- round trips through a narrower type ---------------------------------------------------------


def _round_trip(t0: str, mids: list[str], rows: int, op: str) -> str:
    body, prev = "", "%x"
    for i, t in enumerate(mids):
        body += f"  %v{i} = {t}[{rows},8] convert({prev})\n"
        prev = f"%v{i}"
    return _module("rt", f"""ENTRY %main (x: {t0}[{rows},8]) -> {t0}[{rows},8] {{
  %x = {t0}[{rows},8] parameter(0)
{body}  ROOT %y = {t0}[{rows},8] {op}({prev})
}}
""")


_F64_REL = _rel([SHARD0], ["{baseline: 0, distributed: 0, relation: sharded, dim: 0}"])
_BIG_IDS_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 0, int_range: [16777217, 16777300]}"],
                    ["{baseline: 0, distributed: 0, relation: sharded, dim: 0}"])


# --- all-gather: the group's order is the order of the gathered blocks -------------------------


def _ag(groups: str) -> str:
    return _module("ag", f"""ENTRY %main (x: f32[4,8]) -> f32[16,8] {{
  %x = f32[4,8] parameter(0)
  %t = f32[4,8] tanh(%x)
  ROOT %g = f32[16,8] all-gather(%t), replica_groups={groups}, dimensions={{0}}
}}
""")


def _ag_rel(groups: str) -> str:
    return _rel([SHARD0], [DUP_OUT], groups)


# --- all-gather spelled as dynamic-update-slice into a fill at the rank's offset, then a sum -------


def _dus_gather(fill: str, offset: int) -> str:
    return _module("dus", f"""ENTRY %main (x: f32[4,8], r: s32[]) -> f32[16,8] {{
  %x = f32[4,8] parameter(0)
  %r = s32[] parameter(1)
  %t = f32[4,8] tanh(%x)
  %f = f32[] constant({fill})
  %z = f32[16,8] broadcast(%f), dimensions={{}}
  %w = s32[] constant(4)
  %o = s32[] multiply(%r, %w)
  %k = s32[] constant({offset})
  %s = s32[] add(%o, %k)
  %zero = s32[] constant(0)
  %u = f32[16,8] dynamic-update-slice(%z, %t, %s, %zero)
  ROOT %g = f32[16,8] all-reduce(%u), replica_groups={{{{0,1,2,3}}}}, to_apply=%add
}}
""", _ADD.format(t="f32"))


_DUS_REL = _rel([SHARD0, "{distributed: 1, relation: rank}"], [DUP_OUT])


# (description, baseline, distributed, relations[, oracle baseline, oracle distributed])
def _regression(name: str, twin: tuple[str, str, str] | None = None) -> tuple[str, str, str]:
    """(baseline, distributed, relations) of tests/soundness_regressions/<name> (issue 23's holes),
    or its correct twin: ``twin = (side, old, new)`` replaces one text on one side."""
    from pathlib import Path

    d = Path(__file__).resolve().parents[1] / "soundness_regressions" / name
    base, dist, rel = ((d / f).read_text() for f in ("baseline.hlo", "distributed.hlo", "relations.yaml"))
    if twin is not None:
        side, old, new = twin
        assert old in (base if side == "baseline" else dist), (name, old)
        base, dist = (base.replace(old, new), dist) if side == "baseline" else (base, dist.replace(old, new))
    return base, dist, rel

# Issue 25: a tuple all-to-all of operands that are not pieces of one array. Rank r computes
# x_r · W[:, block j] for every destination j as a tensor of its own; the tuple all-to-all
# gives rank j the blocks (r, j) of x · W, concatenated along the rows: block j of the columns.
_TA2A_BASE = _module("tuple_a2a_base", """ENTRY %main (x: f32[8,16], w: f32[16,8]) -> f32[8,8] {
  %x = f32[8,16] parameter(0)
  %w = f32[16,8] parameter(1)
  ROOT %y = f32[8,8] dot(f32[8,16] %x, f32[16,8] %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""")
_TA2A_REL = _rel(["{baseline: 0, distributed: 0, relation: sharded, dim: 0}", "{baseline: 1, distributed: 1, relation: duplicate}"],
                 ["{baseline: 0, distributed: 0, relation: sharded, dim: 1}"])


def _tuple_a2a(order: tuple[int, ...] = (0, 1, 2, 3), own_block: bool = False) -> str:
    lines = ["ENTRY %main (x: f32[2,16], w: f32[16,8]) -> f32[8,2] {", "  %x = f32[2,16] parameter(0)", "  %w = f32[16,8] parameter(1)"]
    for j in range(C):
        k = 0 if own_block else j  # own_block: every destination gets the same block of W
        lines += [f"  %wj{j} = f32[16,2] slice(f32[16,8] %w), slice={{[0:16], [{2 * k}:{2 * k + 2}]}}",
                  f"  %o{j} = f32[2,2] dot(f32[2,16] %x, f32[16,2] %wj{j}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"]
    tup = "(" + ", ".join(["f32[2,2]"] * C) + ")"
    lines.append(f"  %a = {tup} all-to-all({', '.join(f'f32[2,2] %o{j}' for j in range(C))}), channel_id=1, replica_groups={{{{0,1,2,3}}}}")
    lines += [f"  %e{i} = f32[2,2] get-tuple-element({tup} %a), index={i}" for i in range(C)]
    lines.append(f"  ROOT %y = f32[8,2] concatenate({', '.join(f'f32[2,2] %e{i}' for i in order)}), dimensions={{0}}")
    return _module("tuple_a2a_dist", "\n".join(lines) + "\n}")


PAIRS: dict[str, tuple[str, ...]] = {
    "c_hlo_iota_replica_groups": ("sum over a sharded dim, all-reduce with iota replica groups [1,4]<=[4]", _SUM_BASE, _sum_dist("[1,4]<=[4]"), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_reordered_groups_ar": ("sum over a sharded dim, all-reduce over {{3,1,0,2}}", _SUM_BASE, _sum_dist("{{3,1,0,2}}"), _rel([SHARD0], [DUP_OUT])),
    "b_hlo_iota_groups_pairs": ("all-reduce over iota groups [2,2]<=[4] = {{0,1},{2,3}} in a group of 4", _SUM_BASE, _sum_dist("[2,2]<=[4]"), _rel([SHARD0], [DUP_OUT])),
    "b_hlo_iota_groups_transposed": ("all-reduce over [2,2]<=[2,2]T(1,0) = {{0,2},{1,3}} in a group of 4", _SUM_BASE, _sum_dist("[2,2]<=[2,2]T(1,0)"), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_ag_iota_transposed_group": ("all-gather over iota groups [1,4]<=[2,2]T(1,0) = {0,2,1,3}, the ranks numbered in that order", _DS_BASE, _ag("[1,4]<=[2,2]T(1,0)"), _ag_rel("[[0, 2, 1, 3]]")),
    "b_hlo_ag_iota_transposed_group": ("all-gather over [1,4]<=[2,2]T(1,0) = {0,2,1,3} while the ranks are numbered 0,1,2,3: blocks 1 and 2 swap", _DS_BASE, _ag("[1,4]<=[2,2]T(1,0)"), _ag_rel("[[0, 1, 2, 3]]")),
    "c_hlo_ag_unsorted_group": ("the group lists its replicas as [1,0,3,2]; the all-gather names them in that order", _DS_BASE, _ag("{{1,0,3,2}}"), _ag_rel("[[1, 0, 3, 2]]")),
    "b_hlo_ag_unsorted_group_sorted_gather": ("the group lists its replicas as [1,0,3,2]; the all-gather names them sorted", _DS_BASE, _ag("{{0,1,2,3}}"), _ag_rel("[[1, 0, 3, 2]]")),
    "c_hlo_rs_then_ag": ("reduce-scatter then all-gather along the same dim, as an all-reduce", _SUM_BASE, _rs_ag(0), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_sq_rs_ag": ("square row-parallel dot: reduce-scatter dim 0, all-gather dim 0", _SQ_BASE, _sq_rs_ag(False), _SQ_REL),
    "b_hlo_sq_rs_ag_dims": ("square row-parallel dot: reduce-scatter dim 0, the shard transposed and all-gathered along dim 1", _SQ_BASE, _sq_rs_ag(True), _SQ_REL),
    "c_hlo_max_as_neg_min": ("max over a sharded dim as -(all-reduce min of local min(-x))", _MAXRED_BASE, _neg_red("min", "min"), _rel([SHARD0], [DUP_OUT])),
    "b_hlo_neg_max_is_min": ("-(all-reduce max of local max(-x)): the minimum where the maximum was meant", _MAXRED_BASE, _neg_red("max", "max"), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_dot_contract_dim0": ("a^T b with the contraction along the sharded dim 0 of both, all-reduce", _DOTT_BASE, _dott_dist(False), _DOTT_REL),
    "b_hlo_dot_contract_dim0_transposed": ("a^T b all-reduced, then transposed (b^T a): same square shape", _DOTT_BASE, _dott_dist(True), _DOTT_REL),
    "c_hlo_bf16_upcast_sum": ("bf16 rows converted to f32 before the sum on both sides", _BF_BASE, _bf_dist(False), _rel([SHARD0], [DUP_OUT])),
    "b_hlo_bf16_accumulate": ("the ranks accumulate their bf16 rows in bf16, the baseline in f32", _BF_BASE, _bf_dist(True), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_stable_sort_rows": ("stable sort of rows sharded along the other dim, keys with ties", _sort(16, True), _sort(4, True), _SORT_REL),
    "b_hlo_unstable_sort": ("is_stable dropped on the ranks; keys in [0,3) tie", _sort(16, True), _sort(4, False), _SORT_REL),
    "c_hlo_reverse_nonsharded": ("reverse along the non-sharded dim", _reverse(16, 1), _reverse(4, 1), _SH0_REL),
    "b_hlo_reverse_sharded_local": ("reverse along the sharded dim, locally only (shard order not reversed)", _reverse(16, 0), _reverse(4, 0), _SH0_REL),
    "c_hlo_s32_sum_wraps": ("s32 sum over a sharded dim whose terms wrap: the sum mod 2^32 is the same", _S32_SUM_BASE, _S32_SUM_DIST, _INT_REL),
    "c_hlo_s32_max_add_no_wrap": ("s32 max over a sharded dim, + 1000 after the all-reduce (no wrap for ids in [0,16))", _s32_max_base(1000), _s32_max_dist(1000), _INT_REL),
    "b_hlo_s32_max_add_wraps": ("s32 max(x + K) as max(x) + K with K = 2^31-8: the add wraps", _s32_max_base(2147483640), _s32_max_dist(2147483640), _INT_REL),
    "c_hlo_rank_dynamic_slice": ("the rank's rows by dynamic-slice at rank*4", _DS_BASE, _ds_dist(0), _DS_REL),
    "b_hlo_rank_dynamic_slice_plus1": ("dynamic-slice at rank*4 + 1 (clamped on the last rank)", _DS_BASE, _ds_dist(1), _DS_REL),
    "c_hlo_rank_float_offset": ("the rank's rows at convert_s32(float(rank) * 4.0), torch's float index arithmetic", _DS_BASE, _ds_dist(0, start=_FLOAT_START.format(w=4)), _DS_REL),
    "b_hlo_rank_float_offset_5": ("the rank's rows at convert_s32(float(rank) * 5.0)", _DS_BASE, _ds_dist(0, start=_FLOAT_START.format(w=5)), _DS_REL),
    "c_hlo_rank_shift_offset": ("the rank's rows at rank << 2", _DS_BASE, _ds_dist(0, start=_SHIFT_START.format(w=2)), _DS_REL),
    "b_hlo_rank_shift_offset_3": ("the rank's rows at rank << 3 (clamped from rank 2 on)", _DS_BASE, _ds_dist(0, start=_SHIFT_START.format(w=3)), _DS_REL),
    "c_hlo_dp2_tp2_groups": ("two tensor-parallel groups {0,1},{2,3} (data x tensor parallel), all-reduce within each", _DP_TP_BASE, _dp_tp_dist("{{0,1},{2,3}}"), _DP_TP_REL),
    "b_hlo_dp_tp_groups_swapped": ("the all-reduce runs over the data-parallel groups {0,2},{1,3} instead", _DP_TP_BASE, _dp_tp_dist("{{0,2},{1,3}}"), _DP_TP_REL),
    "c_hlo_dus_psum_gather": ("all-gather as dynamic-update-slice into zeros at rank*4, then all-reduce (sum)", _DS_BASE, _dus_gather("0", 0), _DUS_REL),
    "b_hlo_dus_psum_fill_one": ("dynamic-update-slice all-gather into a fill of ones: the sum adds 3 everywhere", _DS_BASE, _dus_gather("1", 0), _DUS_REL),
    "b_hlo_dus_psum_offset_plus1": ("dynamic-update-slice all-gather at rank*4 + 1 (clamped on the last rank)", _DS_BASE, _dus_gather("0", 1), _DUS_REL),
    "c_hlo_bias_guard_select": ("bias added through select(rank == 0, b, 0) before the all-reduce", _GUARD_BASE, _guard_dist("EQ"), _GUARD_REL),
    "b_hlo_bias_guard_ne": ("bias guard compare direction NE: three ranks add the bias", _GUARD_BASE, _guard_dist("NE"), _GUARD_REL),
    "c_hlo_mean_after_ar": ("mean as all-reduce(sum) / 16 (the whole count)", _MEAN_BASE, _mean_dist(16), _rel([SHARD0], [DUP_OUT])),
    "b_hlo_mean_local_count": ("all-reduce(sum) / 4: divided by the local count", _MEAN_BASE, _mean_dist(4), _rel([SHARD0], [DUP_OUT])),
    "c_hlo_row_parallel_tanh": ("row-parallel dot, all-reduce, tanh", _TANH_BASE, _tanh_dist(None), _TANH_REL),
    "b_hlo_f16_roundtrip": ("the all-reduced activations pass through f16 (convert f32->f16->f32) before tanh", _TANH_BASE, _tanh_dist("f16"), _TANH_REL),
    "b_hlo_f64_through_f32": ("an f64 program whose ranks round the activations through f32", _round_trip("f64", [], 16, "tanh"), _round_trip("f64", ["f32", "f64"], 4, "tanh"), _F64_REL),
    "b_hlo_s32_ids_through_f32": ("s32 ids above 2^24 passed through f32 and back (torch index arithmetic in float)", _round_trip("s32", [], 16, "negate"), _round_trip("s32", ["f32", "s32"], 4, "negate"), _BIG_IDS_REL),
    "b_hlo_elided_gather_indices": ("row permutation by a constant index table, reversed vs rotated, both printed {...}",
                                    _perm_gather("{...}"), _perm_dist("{...}"), _PERM_REL,
                                    _perm_gather(_REV16), _perm_dist(_ROT16)),
    # Issue 23: narrow integer iotas and declared ranges on padded inputs.
    "b_hlo_s8_positions_wrap": ("positions from an s8 iota of 256 (wraps at 128) widened and masked >= 0", *_regression("s8_iota_positions_wrap")),
    "c_hlo_s16_positions": ("positions from an s16 iota of 256 widened and masked >= 0 (every position kept)",
                            *_regression("s8_iota_positions_wrap", ("baseline", "s8[256]", "s16[256]"))),
    "b_hlo_u8_argmax_index_wraps": ("vocab-parallel argmax against a baseline whose index table is a u8 iota of 512", *_regression("u8_argmax_index_wraps")),
    "c_hlo_s16_argmax_index": ("vocab-parallel argmax against a baseline with an s16 index table of 512",
                               *_regression("u8_argmax_index_wraps", ("baseline", "u8", "s16"))),
    "b_hlo_padded_guard_trips_on_tail": ("where(w < 1, 7, w) on padded counts in [1, 10): the zero tail becomes 7", *_regression("padded_int_range_on_tail")),
    "c_hlo_padded_guard_passes_tail": ("where(w < 0, 7, w) on padded counts in [1, 10): the zero tail passes",
                                       *_regression("padded_int_range_on_tail", ("distributed", "%one = s32[] constant(1)", "%one = s32[] constant(0)"))),
    "c_hlo_tuple_a2a_row_col_blocks": ("tuple all-to-all of four separately computed dots x_r W[:, block j]: rank j stacks blocks (r, j) into column block j", _TA2A_BASE, _tuple_a2a(), _TA2A_REL),
    "b_hlo_tuple_a2a_rows_swapped": ("the tuple all-to-all's received blocks concatenated with ranks 0 and 1 swapped", _TA2A_BASE, _tuple_a2a((1, 0, 2, 3)), _TA2A_REL),
    "b_hlo_tuple_a2a_same_block": ("every destination sent W's block 0 instead of its own column block", _TA2A_BASE, _tuple_a2a(own_block=True), _TA2A_REL),
}
