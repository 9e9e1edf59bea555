"""Random small programs in the forms of one law family each (issue 23, item 1: per-family
property tests). Every program is a baseline / distributed HLO pair plus its relations; the
generator draws element types (narrow and unsigned ints included), sizes, group layouts
(data x tensor parallel meshes of 4 devices included) and the details a law's side conditions
are about (offsets, fills, types, groups, ranges), so that about half of the pairs compute
something different from their baseline. Nothing here knows what the rules decide: the tests
and ``bench/law_properties.py`` execute both programs in XLA (tests/oracle.py) and require that
no pair the numbers tell apart is ``verified``.

``FAMILIES[name](rng)`` returns one :class:`Program`; ``generate(name, count, seed)`` a list.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

INT_TYPES = ("s8", "u8", "s16", "u16", "s32", "u32", "s64")
FLOAT_TYPES = ("f16", "bf16", "f32")
RANGES = {"s8": (-128, 127), "u8": (0, 255), "s16": (-(1 << 15), (1 << 15) - 1), "u16": (0, (1 << 16) - 1),
          "s32": (-(1 << 31), (1 << 31) - 1), "u32": (0, (1 << 32) - 1), "s64": (-(1 << 63), (1 << 63) - 1)}
# Group layouts of 4 devices: one group of 4, or two of 2 (a 2 x 2 data x tensor mesh, either
# axis the tensor-parallel one).
LAYOUTS = ([[0, 1, 2, 3]], [[0, 1], [2, 3]], [[0, 2], [1, 3]])


@dataclass
class Program:
    family: str
    form: str  # a short description of what was drawn
    baseline: str
    distributed: str
    relations: dict[str, Any]


def _groups_text(groups: list[list[int]]) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


def _reducer(name: str, op: str, t: str) -> str:
    return f"""%{name} (a: {t}[], b: {t}[]) -> {t}[] {{
  %a = {t}[] parameter(0)
  %b = {t}[] parameter(1)
  ROOT %r = {t}[] {op}({t}[] %a, {t}[] %b)
}}
"""


def _identity(op: str, t: str) -> str:
    if op == "add":
        return "0"
    if t in RANGES:
        lo, hi = RANGES[t]
        return str(lo if op == "maximum" else hi)
    return "-inf" if op == "maximum" else "inf"


def _other_groups(rng: random.Random, groups: list[list[int]]) -> list[list[int]]:
    """Groups of the same size that differ from ``groups`` (as sets, or only in order)."""
    c = len(groups[0])
    choices = [g for g in LAYOUTS if len(g[0]) == c and g != groups]
    choices.append([list(reversed(g)) for g in groups])  # the same sets, listed backwards
    return rng.choice(choices)


def _layout(rng: random.Random) -> list[list[int]]:
    return [list(g) for g in rng.choice(LAYOUTS)]


def _int_literal(v: int, t: str) -> int:
    lo, hi = RANGES[t]
    return max(lo, min(hi, v))


# ---- rank positions / iota (rules/rankpos.egg, crossentropy.egg's ranges, hlo/rank.py) --------


def rankpos(rng: random.Random) -> Program:
    """A position mask: positions counted by an iota (baseline: 0..n-1; rank r: r·w + 0..w-1,
    the offset computed from the rank input in the position type), converted to a compare type,
    compared with a literal bound, selecting x or 0. Types are drawn independently per side, so
    narrow iotas wrap on one side and not on the other."""
    groups = _layout(rng)
    c = len(groups[0])
    w = rng.choice([2, 3, 8, 40, 64, 100, 128, 150])
    n = c * w
    tb = rng.choice(INT_TYPES + FLOAT_TYPES + ("s8", "u8", "bf16"))
    td = tb if rng.random() < 0.4 else rng.choice(INT_TYPES + FLOAT_TYPES + ("s32",))
    if rng.random() < 0.3:
        # Positions past a narrow type's range: one side wraps, the other counts on.
        tb, td = rng.sample([rng.choice(["s8", "u8", "s16"]), rng.choice(["s32", "s64", "f32"])], 2)
        w = rng.choice([100, 128, 150]) if "s16" not in (tb, td) else 16384
        n = c * w
    tc = rng.choice([tb, "s32", "f32"]) if tb in RANGES else tb
    if tc in RANGES and (tb not in RANGES or td not in RANGES):
        tc = "f32"  # a float -> int convert of positions is another law (ranges.fits_int)
    direction = rng.choice(["LT", "GE", "LE", "GT"])
    bound = rng.choice([0, 1, w, n // 2, n - 1, n, 100, 127, 128, 200, 255, 256, 300])
    bound = _int_literal(bound, tc) if tc in RANGES else bound
    off_w = w if rng.random() < 0.8 else w + rng.choice([-1, 1])

    scaled = rng.random() < 0.4  # x · float(position) instead of a mask: every position shows

    def masked(pos: str, t: str, shape: str, x: str) -> str:
        conv = f"  %cpos = {tc}[{shape}] convert({t}[{shape}] {pos})\n" if t != tc else f"  %cpos = {tc}[{shape}] copy({t}[{shape}] {pos})\n"
        if scaled:
            fpos = f"  %fpos = f32[{shape}] convert({tc}[{shape}] %cpos)\n" if tc != "f32" else f"  %fpos = f32[{shape}] copy(f32[{shape}] %cpos)\n"
            return conv + fpos + f"  ROOT %out = f32[{shape}] multiply(f32[{shape}] {x}, f32[{shape}] %fpos)\n"
        return (conv + f"  %bound = {tc}[] constant({bound})\n  %bounds = {tc}[{shape}] broadcast({tc}[] %bound), dimensions={{}}\n"
                f"  %m = pred[{shape}] compare({tc}[{shape}] %cpos, {tc}[{shape}] %bounds), direction={direction}\n"
                f"  %z = f32[] constant(0)\n  %zs = f32[{shape}] broadcast(f32[] %z), dimensions={{}}\n"
                f"  ROOT %out = f32[{shape}] select(pred[{shape}] %m, f32[{shape}] {x}, f32[{shape}] %zs)\n")

    base = (f"HloModule rankpos_base\n\nENTRY %main (x: f32[{n}]) -> f32[{n}] {{\n  %x = f32[{n}] parameter(0)\n"
            f"  %pos = {tb}[{n}] iota(), iota_dimension=0\n" + masked("%pos", tb, str(n), "%x") + "}\n")
    off = (f"  %w = s32[] constant({off_w})\n  %off32 = s32[] multiply(s32[] %r, s32[] %w)\n"
           + (f"  %off = {td}[] convert(s32[] %off32)\n" if td != "s32" else "  %off = s32[] copy(s32[] %off32)\n")
           + f"  %offs = {td}[{w}] broadcast({td}[] %off), dimensions={{}}\n")
    dist = (f"HloModule rankpos_dist\n\nENTRY %main (r: s32[], x: f32[{w}]) -> f32[{w}] {{\n  %r = s32[] parameter(0)\n  %x = f32[{w}] parameter(1)\n"
            f"  %iota = {td}[{w}] iota(), iota_dimension=0\n" + off + f"  %pos = {td}[{w}] add({td}[{w}] %iota, {td}[{w}] %offs)\n"
            + masked("%pos", td, str(w), "%x") + "}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    what = f"x·{tc}(pos)" if scaled else f"mask {tc}(pos) {direction} {bound}"
    return Program("rankpos", f"n={n} c={c} base {tb} rank {td}, {what}, offset {off_w}·r (groups {groups})", base, dist, rel)


# ---- argmax / argmin (rules/argreduce.egg) ----------------------------------------------------------


def _argcombine(name: str, vt: str, it: str, direction: str) -> str:
    return f"""%{name} (lv: {vt}[], li: {it}[], rv: {vt}[], ri: {it}[]) -> ({vt}[], {it}[]) {{
  %lv = {vt}[] parameter(0)
  %li = {it}[] parameter(1)
  %rv = {vt}[] parameter(2)
  %ri = {it}[] parameter(3)
  %c = pred[] compare({vt}[] %lv, {vt}[] %rv), direction={direction}
  %v = {vt}[] select(pred[] %c, {vt}[] %lv, {vt}[] %rv)
  %e = pred[] compare({vt}[] %lv, {vt}[] %rv), direction=EQ
  %mn = {it}[] minimum({it}[] %li, {it}[] %ri)
  %s = {it}[] select(pred[] %c, {it}[] %li, {it}[] %ri)
  %i = {it}[] select(pred[] %e, {it}[] %mn, {it}[] %s)
  ROOT %t = ({vt}[], {it}[]) tuple({vt}[] %v, {it}[] %i)
}}
"""


def argreduce(rng: random.Random) -> Program:
    """A vocab-parallel argmax (argmin): the ranks' local arg-reduce with their own index type,
    the rank offset added in the output type, the ranks not holding the extreme offering a fill,
    an all-reduce(min) over drawn groups (or an all-gather and a reduce(min)); the baseline's
    arg-reduce with its own index type, converted to the output type."""
    groups = _layout(rng)
    c = len(groups[0])
    rows = rng.choice([1, 2, 3])
    w = rng.choice([3, 8, 64, 100, 128, 200])
    n = c * w
    op = rng.choice(["max", "min"])
    direction = rng.choice(["GE", "GT"] if op == "max" else ["LE", "LT"])
    red = "maximum" if op == "max" else "minimum"
    tb = rng.choice(INT_TYPES)
    td = tb if rng.random() < 0.4 else rng.choice(INT_TYPES)
    to = rng.choice(["s32", "s64", "s16", "u8", tb])
    fill = rng.choice([RANGES[to][1], RANGES[to][1], n - 1, n - 2, n])
    fill = _int_literal(fill, to)
    ar_groups = groups if rng.random() < 0.75 else _other_groups(rng, groups)
    gathered = rng.random() < 0.3
    init_v = "-inf" if op == "max" else "inf"
    sh, shl = f"{rows},{n}", f"{rows},{w}"

    def conv(src: str, frm: str, shape: str, name: str) -> str:
        return f"  %{name} = {to}[{shape}] convert({frm}[{shape}] {src})\n" if frm != to else f"  %{name} = {to}[{shape}] copy({frm}[{shape}] {src})\n"

    base = (_argcombine("comb", "f32", tb, direction) + f"\nENTRY %main (x: f32[{sh}]) -> {to}[{rows}] {{\n  %x = f32[{sh}] parameter(0)\n"
            f"  %io = {tb}[{sh}] iota(), iota_dimension=1\n  %iv = f32[] constant({init_v})\n  %ii = {tb}[] constant(0)\n"
            f"  %ar = (f32[{rows}], {tb}[{rows}]) reduce(f32[{sh}] %x, {tb}[{sh}] %io, f32[] %iv, {tb}[] %ii), dimensions={{1}}, to_apply=%comb\n"
            f"  %idx = {tb}[{rows}] get-tuple-element((f32[{rows}], {tb}[{rows}]) %ar), index=1\n" + conv("%idx", tb, str(rows), "out").replace("%out =", "ROOT %out =") + "}\n")
    base = "HloModule argreduce_base\n\n" + base
    combine = (f"  %ag = {to}[{c},{rows}] all-gather({to}[1,{rows}] %cand1), channel_id=3, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, dimensions={{0}}\n"
               f"  %big = {to}[] constant({RANGES[to][1]})\n  ROOT %out = {to}[{rows}] reduce({to}[{c},{rows}] %ag, {to}[] %big), dimensions={{0}}, to_apply=%mint\n"
               if gathered else
               f"  ROOT %out = {to}[{rows}] all-reduce({to}[{rows}] %cand), channel_id=3, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%mint\n")
    dist = ("HloModule argreduce_dist\n\n" + _reducer("ext", red, "f32") + _reducer("mint", "minimum", to) + _argcombine("comb", "f32", td, direction)
            + f"\nENTRY %main (r: s32[], x: f32[{shl}]) -> {to}[{rows}] {{\n  %r = s32[] parameter(0)\n  %x = f32[{shl}] parameter(1)\n"
            f"  %iv = f32[] constant({init_v})\n  %m = f32[{rows}] reduce(f32[{shl}] %x, f32[] %iv), dimensions={{1}}, to_apply=%ext\n"
            f"  %g = f32[{rows}] all-reduce(f32[{rows}] %m), channel_id=1, replica_groups={_groups_text(groups)}, use_global_device_ids=true, to_apply=%ext\n"
            f"  %has = pred[{rows}] compare(f32[{rows}] %m, f32[{rows}] %g), direction=EQ\n"
            f"  %io = {td}[{shl}] iota(), iota_dimension=1\n  %ii = {td}[] constant(0)\n"
            f"  %ar = (f32[{rows}], {td}[{rows}]) reduce(f32[{shl}] %x, {td}[{shl}] %io, f32[] %iv, {td}[] %ii), dimensions={{1}}, to_apply=%comb\n"
            f"  %li = {td}[{rows}] get-tuple-element((f32[{rows}], {td}[{rows}]) %ar), index=1\n" + conv("%li", td, str(rows), "lo")
            + f"  %w = s32[] constant({w})\n  %off32 = s32[] multiply(s32[] %r, s32[] %w)\n"
            + (f"  %off = {to}[] convert(s32[] %off32)\n" if to != "s32" else "  %off = s32[] copy(s32[] %off32)\n")
            + f"  %offs = {to}[{rows}] broadcast({to}[] %off), dimensions={{}}\n  %gi = {to}[{rows}] add({to}[{rows}] %lo, {to}[{rows}] %offs)\n"
            f"  %fill = {to}[] constant({fill})\n  %fills = {to}[{rows}] broadcast({to}[] %fill), dimensions={{}}\n"
            f"  %cand = {to}[{rows}] select(pred[{rows}] %has, {to}[{rows}] %gi, {to}[{rows}] %fills)\n"
            + (f"  %cand1 = {to}[1,{rows}] reshape({to}[{rows}] %cand)\n" if gathered else "") + combine + "}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 1}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"arg{op} n={n} c={c} idx base {tb} rank {td} out {to} fill {fill} {'gather' if gathered else 'all-reduce'} over {ar_groups} (groups {groups})"
    return Program("argreduce", form, base, dist, rel)


# ---- collective-permute (rules/collectives.egg cp-dup, permute.egg, window.egg mirror) --------------


def _pairs(rng: random.Random, groups: list[list[int]]) -> tuple[list[tuple[int, int]], str]:
    """Source-target pairs: a shift within every group, a shift along the other mesh axis, a
    mirror, a random permutation of the devices, or a shift of one group only."""
    c = len(groups[0])
    kind = rng.choice(["shift", "shift", "other-axis", "mirror", "random", "partial"])
    if kind == "other-axis" and c < 4:
        other = _other_groups(rng, groups)
        m = rng.randrange(1, len(other[0]))
        return [(g[i], g[(i + m) % len(g)]) for g in other for i in range(len(g))], f"shift {m} over {other}"
    if kind == "mirror":
        return [(g[i], g[c - 1 - i]) for g in groups for i in range(c)], "mirror"
    if kind == "random":
        devs = [d for g in groups for d in g]
        perm = devs[:]
        rng.shuffle(perm)
        return list(zip(devs, perm, strict=True)), f"permutation {perm}"
    m = rng.randrange(1, c) if c > 1 else 0
    pairs = [(g[i], g[(i + m) % c]) for g in groups for i in range(c)]
    if kind == "partial":
        pairs = pairs[: len(pairs) - 1]
        return pairs, f"shift {m} missing one pair"
    return pairs, f"shift {m}"


def _pairs_text(pairs: list[tuple[int, int]]) -> str:
    return "{" + ",".join(f"{{{a},{b}}}" for a, b in pairs) + "}"


def permute(rng: random.Random) -> Program:
    """Three forms: a duplicate permuted (any pairs); a shard shifted twice (back in place when
    the shifts add up to the group size within the groups); a partial sum summed around the ring
    by shifted copies (all blocks covered or not)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "s32", "s8", "u16"])
    form = rng.choice(["dup", "shard-twice", "ring-sum"])
    h = 4
    if form == "dup":
        pairs, what = _pairs(rng, groups)
        base = f"HloModule cp_base\n\nENTRY %main (x: {t}[8,{h}]) -> {t}[8,{h}] {{\n  ROOT %x = {t}[8,{h}] parameter(0)\n}}\n"
        dist = (f"HloModule cp_dist\n\nENTRY %main (x: {t}[8,{h}]) -> {t}[8,{h}] {{\n  %x = {t}[8,{h}] parameter(0)\n"
                f"  ROOT %p = {t}[8,{h}] collective-permute({t}[8,{h}] %x), channel_id=1, source_target_pairs={_pairs_text(pairs)}\n}}\n")
        rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
               "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
        return Program("permute", f"duplicate {t} {what} (groups {groups})", base, dist, rel)
    if form == "shard-twice":
        n = 2 * c
        p1, w1 = _pairs(rng, groups)
        m1 = next((m for m in range(1, c) if sorted(p1) == sorted((g[i], g[(i + m) % c]) for g in groups for i in range(c))), None)
        if m1 is not None and rng.random() < 0.6:
            p2, w2 = [(g[i], g[(i + c - m1) % c]) for g in groups for i in range(c)], f"shift {c - m1} back"
        else:
            p2, w2 = _pairs(rng, groups)
        base = f"HloModule cp_base\n\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{n},{h}] {{\n  ROOT %x = {t}[{n},{h}] parameter(0)\n}}\n"
        dist = (f"HloModule cp_dist\n\nENTRY %main (x: {t}[2,{h}]) -> {t}[2,{h}] {{\n  %x = {t}[2,{h}] parameter(0)\n"
                f"  %p1 = {t}[2,{h}] collective-permute({t}[2,{h}] %x), channel_id=1, source_target_pairs={_pairs_text(p1)}\n"
                f"  ROOT %p2 = {t}[2,{h}] collective-permute({t}[2,{h}] %p1), channel_id=2, source_target_pairs={_pairs_text(p2)}\n}}\n")
        rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
               "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
        return Program("permute", f"shard {t} {w1}, then {w2} (groups {groups})", base, dist, rel)
    # ring-sum: y = sum over a sharded dim; rank r holds the sum over its block (a partial sum),
    # then acc += shift(t) for a number of steps.
    steps = c - 1 if rng.random() < 0.7 else rng.choice([c - 2, c]) if c > 2 else 1
    pairs, what = _pairs(rng, groups)
    n = 2 * c
    body = []
    prev, acc = "%loc", "%loc"
    for k in range(max(steps, 0)):
        body.append(f"  %t{k} = {t}[{h}] collective-permute({t}[{h}] {prev}), channel_id={k + 1}, source_target_pairs={_pairs_text(pairs)}\n")
        body.append(f"  %a{k} = {t}[{h}] add({t}[{h}] {acc}, {t}[{h}] %t{k})\n")
        prev, acc = f"%t{k}", f"%a{k}"
    body.append(f"  ROOT %out = {t}[{h}] copy({t}[{h}] {acc})\n")
    base = ("HloModule cp_base\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  ROOT %s = {t}[{h}] reduce({t}[{n},{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add\n}}\n")
    dist = ("HloModule cp_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[2,{h}]) -> {t}[{h}] {{\n  %x = {t}[2,{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  %loc = {t}[{h}] reduce({t}[2,{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add\n" + "".join(body) + "}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Program("permute", f"ring sum {t} {steps} steps of {what} (groups {groups})", base, dist, rel)


# ---- padded sharding (rules/padded.egg, declared ranges) ---------------------------------------------


def padded(rng: random.Random) -> Program:
    """x (n rows, not divisible by c) zero-padded to c·w rows and split in blocks of w; a
    pointwise map (some keep a zero tail zero, some do not: exp, + k, a guard that trips on 0)
    on one or both sides, then the sum over the padded dim (all-reduce on the ranks)."""
    groups = _layout(rng)
    c = len(groups[0])
    w = rng.choice([2, 3, 5])
    n = rng.randrange(c * (w - 1) + 1, c * w + 1)
    t = rng.choice(["f32", "s32", "s8", "u8", "s16"])
    is_int = t in RANGES
    lo = rng.choice([-3, 0, 1, 2]) if is_int else 0
    if t[0] == "u":
        lo = max(lo, 0)
    hi = lo + rng.choice([3, 10])
    maps = ["id", "negate", "add-k", "mul-k", "guard", "guard", "max-k"] + ([] if t[0] == "u" else ["abs"]) + ([] if is_int else ["exp"])  # XLA has no abs of unsigned ints
    f = rng.choice(maps)
    k = rng.choice([0, 1, 2, 7])
    bound = rng.choice([lo - 1, lo, lo + 1, 0, 1])
    where = rng.choice(["both", "both", "distributed"])
    ar_groups = groups if rng.random() < 0.8 else _other_groups(rng, groups)

    def body(shape: str, side: str) -> str:
        if (where == "distributed" and side == "baseline") or f == "id":
            return f"  %y = {t}[{shape}] copy({t}[{shape}] %x)\n"
        if f in ("negate", "abs", "exp"):
            op = {"negate": "negate", "abs": "abs", "exp": "exponential"}[f]
            return f"  %y = {t}[{shape}] {op}({t}[{shape}] %x)\n"
        kk = f"  %k = {t}[] constant({k})\n  %ks = {t}[{shape}] broadcast({t}[] %k), dimensions={{}}\n"
        if f == "add-k":
            return kk + f"  %y = {t}[{shape}] add({t}[{shape}] %x, {t}[{shape}] %ks)\n"
        if f == "mul-k":
            return kk + f"  %y = {t}[{shape}] multiply({t}[{shape}] %x, {t}[{shape}] %ks)\n"
        if f == "max-k":
            return kk + f"  %y = {t}[{shape}] maximum({t}[{shape}] %x, {t}[{shape}] %ks)\n"
        b = max(bound, 0) if t[0] == "u" else bound
        return (kk + f"  %b = {t}[] constant({b})\n  %bs = {t}[{shape}] broadcast({t}[] %b), dimensions={{}}\n"
                f"  %m = pred[{shape}] compare({t}[{shape}] %x, {t}[{shape}] %bs), direction=LT\n"
                f"  %y = {t}[{shape}] select(pred[{shape}] %m, {t}[{shape}] %ks, {t}[{shape}] %x)\n")

    h = 3
    base = ("HloModule pad_base\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n"
            + body(f"{n},{h}", "baseline") + f"  %z = {t}[] constant(0)\n  ROOT %s = {t}[{h}] reduce({t}[{n},{h}] %y, {t}[] %z), dimensions={{0}}, to_apply=%add\n}}\n")
    dist = ("HloModule pad_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{w},{h}]) -> {t}[{h}] {{\n  %x = {t}[{w},{h}] parameter(0)\n"
            + body(f"{w},{h}", "distributed") + f"  %z = {t}[] constant(0)\n  %l = {t}[{h}] reduce({t}[{w},{h}] %y, {t}[] %z), dimensions={{0}}, to_apply=%add\n"
            f"  ROOT %s = {t}[{h}] all-reduce({t}[{h}] %l), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n}}\n")
    entry: dict[str, Any] = {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "width": w}
    if is_int:
        entry["int_range"] = [lo, hi]
    rel = {"groups": groups, "inputs": [entry], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{t}[{n}] padded to {c}x{w}, range [{lo}, {hi}), {f} (k={k}, bound {bound}) on {where}, all-reduce over {ar_groups} (groups {groups})"
    return Program("padded", form, base, dist, rel)


# ---- all-reduce, all-gather, reduce-scatter, all-to-all over drawn groups (rules/collectives.egg) -----


def collectives(rng: random.Random) -> Program:
    """A sharded x reduced locally along its sharded dim and all-reduced; all-gathered along a
    drawn dim; or a local sum (a partial sum) reduce-scattered. Element types, reducers, dims and
    replica groups are drawn (wrong ones included)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "s32", "s8", "u8", "s16", "u16"])
    d = rng.choice([0, 1])
    shape = [2 * c, 2 * c]
    local = list(shape)
    local[d] //= c
    g2 = groups if rng.random() < 0.7 else _other_groups(rng, groups)
    form = rng.choice(["all-reduce", "all-gather", "reduce-scatter"])
    sh, lsh = ",".join(map(str, shape)), ",".join(map(str, local))
    other = 1 - d
    if form == "all-reduce":
        op1 = rng.choice(["add", "maximum", "minimum"])
        op2 = op1 if rng.random() < 0.8 else rng.choice(["add", "maximum", "minimum"])
        init = _identity(op1, t)
        out = str(shape[other])
        base = ("HloModule coll_base\n\n" + _reducer("r1", op1, t) + f"\nENTRY %main (x: {t}[{sh}]) -> {t}[{out}] {{\n  %x = {t}[{sh}] parameter(0)\n"
                f"  %i = {t}[] constant({init})\n  ROOT %s = {t}[{out}] reduce({t}[{sh}] %x, {t}[] %i), dimensions={{{d}}}, to_apply=%r1\n}}\n")
        dist = ("HloModule coll_dist\n\n" + _reducer("r1", op1, t) + _reducer("r2", op2, t) + f"\nENTRY %main (x: {t}[{lsh}]) -> {t}[{out}] {{\n  %x = {t}[{lsh}] parameter(0)\n"
                f"  %i = {t}[] constant({init})\n  %l = {t}[{out}] reduce({t}[{lsh}] %x, {t}[] %i), dimensions={{{d}}}, to_apply=%r1\n"
                f"  ROOT %s = {t}[{out}] all-reduce({t}[{out}] %l), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, to_apply=%r2\n}}\n")
        outrel: dict[str, Any] = {"relation": "duplicate"}
        what = f"reduce {op1} along {d}, all-reduce {op2}"
    elif form == "all-gather":
        e = d if rng.random() < 0.75 else other
        gsh = list(local)
        gsh[e] *= c
        gs = ",".join(map(str, gsh))
        base = f"HloModule coll_base\n\nENTRY %main (x: {t}[{sh}]) -> {t}[{sh}] {{\n  ROOT %x = {t}[{sh}] parameter(0)\n}}\n"
        if gsh != shape:
            base = base.replace(f"-> {t}[{sh}]", f"-> {t}[{gs}]").replace(f"ROOT %x = {t}[{sh}] parameter(0)", f"%x = {t}[{sh}] parameter(0)\n  ROOT %y = {t}[{gs}] reshape({t}[{sh}] %x)")
        dist = (f"HloModule coll_dist\n\nENTRY %main (x: {t}[{lsh}]) -> {t}[{gs}] {{\n  %x = {t}[{lsh}] parameter(0)\n"
                f"  ROOT %g = {t}[{gs}] all-gather({t}[{lsh}] %x), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, dimensions={{{e}}}\n}}\n")
        outrel = {"relation": "duplicate"}
        what = f"all-gather along {e}"
    else:
        # A local sum over the sharded dim d (a partial sum), reduce-scattered along the other.
        out_full = shape[other]
        rs = out_full // c
        base = ("HloModule coll_base\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{sh}]) -> {t}[{out_full}] {{\n  %x = {t}[{sh}] parameter(0)\n"
                f"  %z = {t}[] constant(0)\n  ROOT %s = {t}[{out_full}] reduce({t}[{sh}] %x, {t}[] %z), dimensions={{{d}}}, to_apply=%add\n}}\n")
        red = rng.choice(["add", "add", "maximum"])
        dist = ("HloModule coll_dist\n\n" + _reducer("add", "add", t) + _reducer("r2", red, t) + f"\nENTRY %main (x: {t}[{lsh}]) -> {t}[{rs}] {{\n  %x = {t}[{lsh}] parameter(0)\n"
                f"  %z = {t}[] constant(0)\n  %l = {t}[{out_full}] reduce({t}[{lsh}] %x, {t}[] %z), dimensions={{{d}}}, to_apply=%add\n"
                f"  ROOT %s = {t}[{rs}] reduce-scatter({t}[{out_full}] %l), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, dimensions={{0}}, to_apply=%r2\n}}\n")
        outrel = {"relation": "sharded", "dim": 0}
        what = f"reduce-scatter {red}"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": d}],
           "outputs": [{"baseline": 0, "distributed": 0, **outrel}]}
    return Program("collectives", f"{form} {t}[{sh}] sharded {d}: {what} over {g2} (groups {groups})", base, dist, rel)


# ---- vocab-parallel embedding (rules/slicing.egg, vocabraw.egg, rankpos.egg's affine bounds) ----------


def vocab(rng: random.Random) -> Program:
    """A vocab-parallel embedding: rank r owns rows [r·w, r·w + w) of E; it shifts the ids by
    r·w (or compares them with r·w and r·w + w), masks the ids outside its block, gathers with
    the clamped ids and masks the rows; the all-reduce sums the ranks. Drawn: the id type
    (narrow and unsigned included), the type the shift and compares run in, the ids' declared
    range (inside [0, V) or not), the block width and the groups."""
    groups = _layout(rng)
    c = len(groups[0])
    w = rng.choice([3, 8, 16, 40, 100])
    v = c * w
    h = 4
    ti = rng.choice(["s32", "s64", "s8", "u8", "s16", "u16", "u32"])
    ts = ti if rng.random() < 0.7 else rng.choice(["s32", "s64", "s8", "s16"])
    lo = rng.choice([0, 0, 0, 1, -1 if ti[0] == "s" else 0])
    hi = rng.choice([v, v, v, v - 1, v + 1, 2 * v])
    tlo, thi = RANGES[ti]
    lo, hi = max(lo, tlo), min(hi, thi + 1)
    if lo >= hi:
        lo, hi = 0, min(v, thi + 1)
    raw = rng.random() < 0.4
    off_w = w if rng.random() < 0.85 else w + rng.choice([-1, 1])
    ar_groups = groups if rng.random() < 0.85 else _other_groups(rng, groups)
    n = 6

    def cvt(src: str, frm: str, to: str, name: str, shape: str) -> str:
        return f"  %{name} = {to}[{shape}] convert({frm}[{shape}] {src})\n" if frm != to else f"  %{name} = {to}[{shape}] copy({frm}[{shape}] {src})\n"

    base = (f"HloModule vocab_base\n\nENTRY %main (ids: {ti}[{n}], e: f32[{v},{h}]) -> f32[{n},{h}] {{\n  %ids = {ti}[{n}] parameter(0)\n  %e = f32[{v},{h}] parameter(1)\n"
            f"  ROOT %g = f32[{n},{h}] gather(f32[{v},{h}] %e, {ti}[{n}] %ids), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n}}\n")
    # Same type: the value itself (a copy would be an instruction the baseline does not have).
    off = "%off" if ts != "s32" else "%off32"
    sid = "%sid" if ts != ti else "%ids"
    body = (f"  %w = s32[] constant({off_w})\n  %off32 = s32[] multiply(s32[] %r, s32[] %w)\n"
            + (cvt("%off32", "s32", ts, "off", "") if ts != "s32" else "")
            + f"  %offs = {ts}[{n}] broadcast({ts}[] {off}), dimensions={{}}\n" + (cvt("%ids", ti, ts, "sid", str(n)) if ts != ti else "")
            + f"  %s = {ts}[{n}] subtract({ts}[{n}] {sid}, {ts}[{n}] %offs)\n")
    if raw:
        body += (f"  %wl = {ts}[] constant({w})\n  %end = {ts}[] add({ts}[] {off}, {ts}[] %wl)\n  %ends = {ts}[{n}] broadcast({ts}[] %end), dimensions={{}}\n"
                 f"  %b0 = pred[{n}] compare({ts}[{n}] {sid}, {ts}[{n}] %offs), direction=LT\n"
                 f"  %bw = pred[{n}] compare({ts}[{n}] {sid}, {ts}[{n}] %ends), direction=GE\n")
    else:
        body += (f"  %zero = {ts}[] constant(0)\n  %zeros = {ts}[{n}] broadcast({ts}[] %zero), dimensions={{}}\n  %wl = {ts}[] constant({w})\n"
                 f"  %wls = {ts}[{n}] broadcast({ts}[] %wl), dimensions={{}}\n"
                 f"  %b0 = pred[{n}] compare({ts}[{n}] %s, {ts}[{n}] %zeros), direction=LT\n"
                 f"  %bw = pred[{n}] compare({ts}[{n}] %s, {ts}[{n}] %wls), direction=GE\n")
    body += (f"  %m = pred[{n}] or(pred[{n}] %b0, pred[{n}] %bw)\n  %z = {ts}[] constant(0)\n  %zs = {ts}[{n}] broadcast({ts}[] %z), dimensions={{}}\n"
             f"  %idx = {ts}[{n}] select(pred[{n}] %m, {ts}[{n}] %zs, {ts}[{n}] %s)\n"
             f"  %g = f32[{n},{h}] gather(f32[{w},{h}] %e, {ts}[{n}] %idx), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n"
             f"  %mb = pred[{n},{h}] broadcast(pred[{n}] %m), dimensions={{0}}\n  %fz = f32[] constant(0)\n  %fzs = f32[{n},{h}] broadcast(f32[] %fz), dimensions={{}}\n"
             f"  %o = f32[{n},{h}] select(pred[{n},{h}] %mb, f32[{n},{h}] %fzs, f32[{n},{h}] %g)\n"
             f"  ROOT %out = f32[{n},{h}] all-reduce(f32[{n},{h}] %o), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n")
    dist = ("HloModule vocab_dist\n\n" + _reducer("add", "add", "f32") + f"\nENTRY %main (r: s32[], ids: {ti}[{n}], e: f32[{w},{h}]) -> f32[{n},{h}] {{\n"
            f"  %r = s32[] parameter(0)\n  %ids = {ti}[{n}] parameter(1)\n  %e = f32[{w},{h}] parameter(2)\n" + body + "}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"},
                                        {"baseline": 0, "distributed": 1, "relation": "duplicate", "int_range": [lo, hi]},
                                        {"baseline": 1, "distributed": 2, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"V={v} c={c} ids {ti} in [{lo}, {hi}) shift in {ts} by {off_w}·r, {'raw bounds' if raw else 'shifted'}, all-reduce over {ar_groups} (groups {groups})"
    return Program("vocab", form, base, dist, rel)


# ---- prefix sum along the sharded dim (rules/window.egg) --------------------------------------------


def window(rng: random.Random) -> Program:
    """cumsum along the sharded dim: each rank's local prefix sum plus the exclusive prefix of the
    all-gathered block totals (a mask iota < rank over the gathered dim, as a 0/1 factor). Drawn:
    the element type (narrow ints wrap alike on both sides), the mask's compare (< r, or <= r: an
    inclusive carry) and index type, the 0/1 factor's spelling, the gather's groups."""
    groups = _layout(rng)
    c = len(groups[0])
    w = rng.choice([1, 2, 3])
    n = c * w
    h = 3
    t = rng.choice(["f32", "s32", "s8", "u8", "s16"])
    tm = rng.choice(["s32", "s64", "s8", "u8"])
    direction = rng.choice(["LT", "LT", "LT", "LE"])
    pad = w - 1
    g2 = groups if rng.random() < 0.8 else _other_groups(rng, groups)
    conv = "multiply" if rng.random() < 0.5 else "select"
    base = ("HloModule cumsum_base\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{n},{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  ROOT %cs = {t}[{n},{h}] reduce-window({t}[{n},{h}] %x, {t}[] %z), window={{size={n}x1 pad={n - 1}_0x0_0}}, to_apply=%add\n}}\n")
    mask = (f"  %io = {tm}[{c}] iota(), iota_dimension=0\n" + (f"  %rr = {tm}[] convert(s32[] %r)\n" if tm != "s32" else "")
            + f"  %rb = {tm}[{c}] broadcast({tm}[] {'%rr' if tm != 's32' else '%r'}), dimensions={{}}\n"
            f"  %m = pred[{c}] compare({tm}[{c}] %io, {tm}[{c}] %rb), direction={direction}\n  %mb = pred[{c},{h}] broadcast(pred[{c}] %m), dimensions={{0}}\n")
    if conv == "multiply":
        mask += f"  %mf = {t}[{c},{h}] convert(pred[{c},{h}] %mb)\n  %sel = {t}[{c},{h}] multiply({t}[{c},{h}] %ag, {t}[{c},{h}] %mf)\n"
    else:
        mask += f"  %zz = {t}[{c},{h}] broadcast({t}[] %z), dimensions={{}}\n  %sel = {t}[{c},{h}] select(pred[{c},{h}] %mb, {t}[{c},{h}] %ag, {t}[{c},{h}] %zz)\n"
    dist = ("HloModule cumsum_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (r: s32[], x: {t}[{w},{h}]) -> {t}[{w},{h}] {{\n  %r = s32[] parameter(0)\n  %x = {t}[{w},{h}] parameter(1)\n"
            f"  %z = {t}[] constant(0)\n  %loc = {t}[{w},{h}] reduce-window({t}[{w},{h}] %x, {t}[] %z), window={{size={w}x1 pad={pad}_0x0_0}}, to_apply=%add\n"
            f"  %tot = {t}[{h}] reduce({t}[{w},{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add\n  %tot1 = {t}[1,{h}] reshape({t}[{h}] %tot)\n"
            f"  %ag = {t}[{c},{h}] all-gather({t}[1,{h}] %tot1), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, dimensions={{0}}\n"
            + mask + f"  %pre = {t}[{h}] reduce({t}[{c},{h}] %sel, {t}[] %z), dimensions={{0}}, to_apply=%add\n"
            f"  %preb = {t}[{w},{h}] broadcast({t}[{h}] %pre), dimensions={{1}}\n  ROOT %out = {t}[{w},{h}] add({t}[{w},{h}] %loc, {t}[{w},{h}] %preb)\n}}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    form = f"cumsum {t}[{n}] c={c}: mask {tm} iota {direction} r as {conv}, gather over {g2} (groups {groups})"
    return Program("window", form, base, dist, rel)


# ---- neutral elements (rules/neutral.egg): fairscale's degree-1 mask over a declared range ----------


def neutral(rng: random.Random) -> Program:
    """fairscale's VocabParallelEmbedding at degree 1 as the baseline: it masks ids outside
    [lo_b, hi_b) (``ids < lo_b | ids >= hi_b``, the or spelled on pred or on an int type through
    pred -> int -> pred converts, as torch-xla lowers ``|``), shifts the ids by ``k·1`` and
    masks the gathered rows; the distributed program looks the ids up in its (duplicate) table
    with no mask. Drawn: the id type (narrow and unsigned included), the ids' declared range
    (inside [0, V) or not), the mask's bounds (the vocabulary, or one off), the or's type, the
    shift (0, or 1: a real shift) and the groups."""
    groups = _layout(rng)
    ti = rng.choice(["s32", "s64", "s8", "u8", "s16", "u16", "u32"])
    v = rng.choice([6, 16, 64, 100])
    n, h = 6, 4
    tlo, thi = RANGES[ti]
    lo = max(rng.choice([0, 0, 0, 1, -1]), tlo)
    hi = min(rng.choice([v, v, v, v - 1, v + 1]), thi + 1)
    lo_b = rng.choice([0, 0, 0, 1])
    hi_b = rng.choice([v, v, v, v - 1])
    to = rng.choice(["pred", "u8", "u8", "s32", "s8", "u32"])
    k = 0 if rng.random() < 0.8 else 1
    lo_l, hi_l = _int_literal(lo_b, ti), _int_literal(hi_b, ti)
    body = (f"  %c0 = {ti}[] constant({lo_l})\n  %c0s = {ti}[{n}] broadcast({ti}[] %c0), dimensions={{}}\n"
            f"  %lt = pred[{n}] compare({ti}[{n}] %ids, {ti}[{n}] %c0s), direction=LT\n"
            f"  %cv = {ti}[] constant({hi_l})\n  %cvs = {ti}[{n}] broadcast({ti}[] %cv), dimensions={{}}\n"
            f"  %ge = pred[{n}] compare({ti}[{n}] %ids, {ti}[{n}] %cvs), direction=GE\n")
    if to == "pred":
        body += f"  %m = pred[{n}] or(pred[{n}] %lt, pred[{n}] %ge)\n"
    else:
        body += (f"  %lu = {to}[{n}] convert(pred[{n}] %lt)\n  %gu = {to}[{n}] convert(pred[{n}] %ge)\n"
                 f"  %ou = {to}[{n}] or({to}[{n}] %lu, {to}[{n}] %gu)\n  %m = pred[{n}] convert({to}[{n}] %ou)\n")
    body += (f"  %k0 = {ti}[] constant({k})\n  %k1 = {ti}[] constant(1)\n  %k = {ti}[] multiply({ti}[] %k0, {ti}[] %k1)\n"
             f"  %ks = {ti}[{n}] broadcast({ti}[] %k), dimensions={{}}\n  %s = {ti}[{n}] subtract({ti}[{n}] %ids, {ti}[{n}] %ks)\n"
             f"  %z = {ti}[] constant(0)\n  %zs = {ti}[{n}] broadcast({ti}[] %z), dimensions={{}}\n"
             f"  %idx = {ti}[{n}] select(pred[{n}] %m, {ti}[{n}] %zs, {ti}[{n}] %s)\n"
             f"  %g = f32[{n},{h}] gather(f32[{v},{h}] %e, {ti}[{n}] %idx), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n"
             f"  %mb = pred[{n},{h}] broadcast(pred[{n}] %m), dimensions={{0}}\n  %fz = f32[] constant(0)\n  %fzs = f32[{n},{h}] broadcast(f32[] %fz), dimensions={{}}\n"
             f"  ROOT %o = f32[{n},{h}] select(pred[{n},{h}] %mb, f32[{n},{h}] %fzs, f32[{n},{h}] %g)\n")
    head = f"ENTRY %main (ids: {ti}[{n}], e: f32[{v},{h}]) -> f32[{n},{h}] {{\n  %ids = {ti}[{n}] parameter(0)\n  %e = f32[{v},{h}] parameter(1)\n"
    base = "HloModule masked_base\n\n" + head + body + "}\n"
    dist = ("HloModule plain_dist\n\n" + head + f"  ROOT %g = f32[{n},{h}] gather(f32[{v},{h}] %e, {ti}[{n}] %ids), offset_dims={{1}}, collapsed_slice_dims={{0}}, "
            f"start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n}}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate", "int_range": [lo, hi]},
                                        {"baseline": 1, "distributed": 1, "relation": "duplicate"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"V={v} ids {ti} in [{lo}, {hi}); baseline masks ids outside [{lo_l}, {hi_l}) (or in {to}), shifts by {k}·1 (groups {groups})"
    return Program("neutral", form, base, dist, rel)


# ---- one-hot tables written by an overwriting scatter (rules/onehot.egg, scatter.py) ----------------


def onehot(rng: random.Random) -> Program:
    """``F.one_hot`` as torch-xla lowers it: an overwriting scatter of ones into zeros at
    (iota row, class id), rows = tokens; or the transposed form (class id, iota column) into
    [E, n]. The ranks hold the same ids (duplicate) or a block of the tokens (sharded), and
    compute the same table on their rows. Drawn: the table's element type (narrow, unsigned,
    float), the id type, the ids' declared range (some past E: dropped updates), the groups,
    and the details the side conditions are about: the iota's position or dim, an iota offset,
    a second one in place of an iota (colliding updates), the fill, the update value and the
    combiner on the rank."""
    groups = _layout(rng)
    c = len(groups[0])
    w = rng.choice([1, 2, 3])
    e = rng.choice([3, 4, 8])
    te = rng.choice(["s32", "s8", "u8", "f32", "bf16", "s16"])
    ti = rng.choice(["s32", "s64", "s8", "u8", "u16"])
    cols = rng.random() < 0.35
    sharded = rng.random() < 0.6
    n = c * w
    hi = rng.choice([e, e, e, e + 1])
    defect = rng.choice(["none"] * 6 + ["iota-pos", "iota-dim", "iota-off", "no-iota", "fill", "update", "add"])
    ow = f"%ow (a: {te}[], b: {te}[]) -> {te}[] {{\n  %a = {te}[] parameter(0)\n  ROOT %b = {te}[] parameter(1)\n}}\n"

    def prog(name: str, rows: int, bug: bool) -> str:
        d = defect if bug else "none"
        one, zero = ("2" if d == "update" else "1"), ("1" if d == "fill" else "0")
        comb = "%add" if d == "add" else "%ow"
        ishape = f"1,{rows},1" if cols else f"{rows},1,1"
        idim = 1 if cols else 0
        if d == "iota-dim":
            idim = 2
        lines = [f"  %ids = {ti}[{rows}] parameter(0)", f"  %r = {ti}[{ishape}] reshape({ti}[{rows}] %ids)"]
        if d == "no-iota":
            lines += [f"  %k = {ti}[] constant(0)", f"  %io = {ti}[{ishape}] broadcast({ti}[] %k), dimensions={{}}"]
        elif d == "iota-off":
            lines += [f"  %io0 = {ti}[{ishape}] iota(), iota_dimension={idim}", f"  %k = {ti}[] constant(1)",
                      f"  %kb = {ti}[{ishape}] broadcast({ti}[] %k), dimensions={{}}", f"  %io = {ti}[{ishape}] add({ti}[{ishape}] %io0, {ti}[{ishape}] %kb)"]
        else:
            lines.append(f"  %io = {ti}[{ishape}] iota(), iota_dimension={idim}")
        first, second = ("%r", "%io") if cols else ("%io", "%r")
        if d == "iota-pos":
            first, second = second, first
        ixs = f"1,{rows},2" if cols else f"{rows},1,2"
        us = f"1,{rows}" if cols else f"{rows},1"
        out = f"{e},{rows}" if cols else f"{rows},{e}"
        lines += [f"  %ix = {ti}[{ixs}] concatenate({ti}[{ishape}] {first}, {ti}[{ishape}] {second}), dimensions={{2}}",
                  f"  %z = {te}[] constant({zero})", f"  %zs = {te}[{out}] broadcast({te}[] %z), dimensions={{}}",
                  f"  %one = {te}[] constant({one})", f"  %ones = {te}[{us}] broadcast({te}[] %one), dimensions={{}}",
                  f"  ROOT %s = {te}[{out}] scatter({te}[{out}] %zs, {ti}[{ixs}] %ix, {te}[{us}] %ones), update_window_dims={{}}, "
                  f"inserted_window_dims={{0,1}}, scatter_dims_to_operand_dims={{0,1}}, index_vector_dim=2, to_apply={comb}"]
        return (f"HloModule {name}\n\n" + ow + "\n" + _reducer("add", "add", te) + f"\nENTRY %main (ids: {ti}[{rows}]) -> {te}[{out}] {{\n"
                + "\n".join(lines) + "\n}\n")

    base = prog("onehot_base", n, False)
    dist = prog("onehot_dist", w if sharded else n, True)
    out_rel: dict[str, Any] = {"relation": "sharded", "dim": 1 if cols else 0} if sharded else {"relation": "duplicate"}
    in_rel: dict[str, Any] = {"relation": "sharded", "dim": 0} if sharded else {"relation": "duplicate"}
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, **in_rel, "int_range": [0, min(hi, RANGES[ti][1] + 1)]}],
           "outputs": [{"baseline": 0, "distributed": 0, **out_rel}]}
    form = f"one_hot {te} of {ti} ids in [0, {hi}) E={e} {'columns' if cols else 'rows'} n={n} {'sharded' if sharded else 'duplicate'}, defect {defect} (groups {groups})"
    return Program("onehot", form, base, dist, rel)


# ---- all-to-all of a duplicate (rules/a2adup.egg) ---------------------------------------------------


def a2adup(rng: random.Random) -> Program:
    """Every rank holds x (duplicate); an all-to-all along dim s over the groups gives rank j c
    copies of block j of x along s; the rank keeps one of them (a slice of block e along s) and
    doubles it. Drawn: the element type (narrow, unsigned, float), s, the block kept, the
    groups, and the side conditions: the all-to-all's groups (other sets, or the same listed
    backwards), a slice along the other dim or off by one, an all-to-all along the other dim."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    s_dim = rng.choice([0, 1])
    w = rng.choice([1, 2, 3])
    other = rng.choice([2, 3])
    dims = [c * w, other] if s_dim == 0 else [other, c * w]
    defect = rng.choice(["none"] * 5 + ["groups", "slice-dim", "slice-off", "a2a-dim"])
    e = rng.randrange(c)
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    a2a_dim = 1 - s_dim if defect == "a2a-dim" and dims[1 - s_dim] % c == 0 else s_dim
    sl_dim = 1 - s_dim if defect == "slice-dim" and dims[1 - s_dim] >= w else s_dim
    start = e * w + (1 if defect == "slice-off" and (e + 1) * w < dims[sl_dim] else 0)
    start = min(start, dims[sl_dim] - w)  # a slice along the other, shorter dim stays in range
    out = list(dims)
    out[sl_dim] = w
    sl = ", ".join(f"[{start}:{start + w}]" if d == sl_dim else f"[0:{n}]" for d, n in enumerate(dims))
    sh = ",".join(map(str, dims))
    osh = ",".join(map(str, out))
    bout = ",".join(map(str, dims))
    base = (f"HloModule a2a_base\n\nENTRY %main (x: {t}[{sh}]) -> {t}[{bout}] {{\n  %x = {t}[{sh}] parameter(0)\n"
            f"  ROOT %y = {t}[{bout}] add({t}[{bout}] %x, {t}[{bout}] %x)\n}}\n")
    dist = (f"HloModule a2a_dist\n\nENTRY %main (x: {t}[{sh}]) -> {t}[{osh}] {{\n  %x = {t}[{sh}] parameter(0)\n"
            f"  %a = {t}[{sh}] all-to-all({t}[{sh}] %x), channel_id=1, replica_groups={_groups_text(g2)}, dimensions={{{a2a_dim}}}\n"
            f"  %q = {t}[{osh}] slice({t}[{sh}] %a), slice={{{sl}}}\n"
            f"  ROOT %y = {t}[{osh}] add({t}[{osh}] %q, {t}[{osh}] %q)\n}}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": s_dim}]}
    form = f"a2a {t}[{sh}] along {a2a_dim} over {g2}, keep [{start}:{start + w}) along {sl_dim}, defect {defect} (groups {groups})"
    return Program("a2adup", form, base, dist, rel)


def microbatch(rng: random.Random) -> Program:
    """A batch cut into n equal microbatches along dim d (literal slices of a duplicate), each
    run through the same row-wise layers (a pointwise op, a bias broadcast along the other dim,
    for d = 0 a dot contracting the other dim with a duplicate weight) and concatenated back
    along d. Drawn: the element type (narrow, unsigned, float), n, the block size, d, and the
    side conditions: blocks joined out of order, one block repeated, a slice off by one, a
    layer that mixes rows (subtracting the sum along d), the join along the wrong dim."""
    groups = _layout(rng)
    t = rng.choice(["f32", "bf16", "s32", "s8", "u16"])
    n, b, h = rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.choice([2, 3])
    d = rng.choice([0, 1])
    o = 1 - d
    dims = [n * b, h] if d == 0 else [h, n * b]
    defect = rng.choice(["none"] * 5 + ["order", "repeat", "offset", "mix", "catdim"])
    dot = d == 0 and t in ("f32", "s32") and rng.random() < 0.6
    order = list(range(n))
    if defect == "order":
        order[0], order[1] = order[1], order[0]
    if defect == "repeat":
        order[-1] = order[0]
    h2 = 2

    def shape(m: int) -> list[int]:
        return [m, h] if d == 0 else [h, m]

    def text(dd: list[int]) -> str:
        return f"{t}[{','.join(map(str, dd))}]"

    def layers(p: str, x: str, m: int) -> tuple[list[str], str, list[int]]:
        sh = text(shape(m))
        ln = [f"  %{p}u = {sh} {'tanh' if t in FLOAT_TYPES else 'multiply'}({sh} %{x}{'' if t in FLOAT_TYPES else f', {sh} %' + x})",
              f"  %{p}vb = {sh} broadcast({t}[{h}] %v), dimensions={{{o}}}",
              f"  %{p}z = {sh} multiply({sh} %{p}u, {sh} %{p}vb)"]
        last, out = f"{p}z", shape(m)
        if defect == "mix":
            ln += [f"  %{p}zero = {t}[] constant(0)",
                   f"  %{p}r = {t}[{h}] reduce({sh} %{p}z, {t}[] %{p}zero), dimensions={{{d}}}, to_apply=%sum",
                   f"  %{p}rb = {sh} broadcast({t}[{h}] %{p}r), dimensions={{{o}}}",
                   f"  %{p}m = {sh} subtract({sh} %{p}z, {sh} %{p}rb)"]
            last = f"{p}m"
        if dot:
            out = [m, h2]
            ln.append(f"  %{p}y = {text(out)} dot({sh} %{last}, {t}[{h},{h2}] %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}")
            last = f"{p}y"
        return ln, last, out

    params = f"x: {text(dims)}, v: {t}[{h}], w: {t}[{h},{h2}]"
    head = [f"  %x = {text(dims)} parameter(0)", f"  %v = {t}[{h}] parameter(1)", f"  %w = {t}[{h},{h2}] parameter(2)"]
    red = _reducer("sum", "add", t) + "\n" if defect == "mix" else ""
    bl, blast, bout = layers("b", "x", n * b)
    base = f"HloModule mb_base\n\n{red}ENTRY %main ({params}) -> {text(bout)} {{\n" + "\n".join(head + bl) + f"\n  ROOT %out = {text(bout)} copy({text(bout)} %{blast})\n}}\n"
    dl: list[str] = []
    lasts = []
    for i in range(n):
        e = order[i]
        start = e * b + (1 if defect == "offset" and i == 0 else 0)
        sl = ", ".join(f"[{start}:{start + b}]" if k == d else f"[0:{dims[k]}]" for k in range(2))
        dl.append(f"  %blk{i} = {text(shape(b))} slice({text(dims)} %x), slice={{{sl}}}")
        ln, last, out1 = layers(f"m{i}", f"blk{i}", b)
        dl += ln
        lasts.append((last, out1))
    cd = d
    if defect == "catdim" and lasts[0][1][o] == lasts[0][1][d]:
        cd = o  # joined along the other dim: only when the blocks are square, so it type-checks
    cat = list(lasts[0][1])
    cat[cd] *= n
    ops = ", ".join(f"{text(s)} %{x}" for x, s in lasts)
    dl.append(f"  %cat = {text(cat)} concatenate({ops}), dimensions={{{cd}}}")
    dist = f"HloModule mb_dist\n\n{red}ENTRY %main ({params}) -> {text(cat)} {{\n" + "\n".join(head + dl) + f"\n  ROOT %out = {text(cat)} copy({text(cat)} %cat)\n}}\n"
    rel = {"groups": groups, "inputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in range(3)],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{n} microbatches of {b} of {t}{dims} along {d}, dot {dot}, order {order}, join along {cd}, defect {defect}"
    return Program("microbatch", form, base, dist, rel)


# ---- the GSPMD vocab-parallel lookup: explicit clamp, mask after the gather (rules/clampgather.egg)


def clampgather(rng: random.Random) -> Program:
    """XLA's SPMD partitioner's vocab-parallel gather: ids reshaped to [n, 1], clamped to
    [lo, hi] explicitly, compared with r·w and r·w + w - 1 (raw bounds), the mask reduced over
    the unit dim, the rank's gather at the unmasked shift ids - r·w and the rows masked after it;
    the all-reduce sums the ranks. Drawn: the id type (narrow and unsigned included), the clamp
    bounds (never acting, or cutting the last row / a whole block / the first row), the upper
    compare (GT w - 1, or GT w / GE w - 1), the mask reduce (or from false, and from true, or from
    true), the ids' declared range, the offset width and the groups."""
    groups = _layout(rng)
    c = len(groups[0])
    ti = rng.choice(["s32", "s64", "s8", "u8", "s16", "u16", "u32"])
    tmax = RANGES[ti][1]
    w = rng.choice([x for x in (3, 8, 16, 25, 64) if c * x + 1 <= tmax])
    v = c * w
    h = 4
    n = 6
    clo, chi = rng.choice([(0, v - 1)] * 5 + [(0, v), (0, v - 2), (0, w - 1), (1, v - 1)])
    upper = rng.choice([("GT", w - 1)] * 6 + [("GT", w), ("GE", w - 1)])
    red = rng.choice([("or", "false")] * 4 + [("and", "true"), ("or", "true")])
    lo, hi = rng.choice([(0, v)] * 6 + [(0, v + 1), (0, 2 * v)])
    off_w = w if rng.random() < 0.85 else w + rng.choice([-1, 1])
    ar_groups = groups if rng.random() < 0.85 else _other_groups(rng, groups)
    base = (f"HloModule cg_base\n\nENTRY %main (ids: {ti}[{n}], e: f32[{v},{h}]) -> f32[{n},{h}] {{\n  %ids = {ti}[{n}] parameter(0)\n  %e = f32[{v},{h}] parameter(1)\n"
            f"  %ids2 = {ti}[{n},1] reshape({ti}[{n}] %ids)\n"
            f"  ROOT %g = f32[{n},{h}] gather(f32[{v},{h}] %e, {ti}[{n},1] %ids2), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n}}\n")
    sh = f"{ti}[{n},1]"
    off = (f"  %off = {ti}[] convert(s32[] %off32)\n" if ti != "s32" else "  %off = s32[] copy(s32[] %off32)\n")
    body = (f"  %ids2 = {sh} reshape({ti}[{n}] %ids)\n  %clo = {ti}[] constant({clo})\n  %clos = {sh} broadcast({ti}[] %clo), dimensions={{}}\n"
            f"  %chi = {ti}[] constant({chi})\n  %chis = {sh} broadcast({ti}[] %chi), dimensions={{}}\n"
            f"  %cl = {sh} clamp({sh} %clos, {sh} %ids2, {sh} %chis)\n"
            f"  %wc = s32[] constant({off_w})\n  %off32 = s32[] multiply(s32[] %r, s32[] %wc)\n" + off
            + f"  %offs = {sh} broadcast({ti}[] %off), dimensions={{}}\n  %ub = {ti}[] constant({upper[1]})\n  %end = {ti}[] add({ti}[] %off, {ti}[] %ub)\n"
            f"  %ends = {sh} broadcast({ti}[] %end), dimensions={{}}\n"
            f"  %b0 = pred[{n},1] compare({sh} %cl, {sh} %offs), direction=LT\n  %bw = pred[{n},1] compare({sh} %cl, {sh} %ends), direction={upper[0]}\n"
            f"  %m = pred[{n},1] or(pred[{n},1] %b0, pred[{n},1] %bw)\n  %init = pred[] constant({red[1]})\n"
            f"  %mr = pred[{n}] reduce(pred[{n},1] %m, pred[] %init), dimensions={{1}}, to_apply=%{red[0]}\n"
            f"  %s = {sh} subtract({sh} %cl, {sh} %offs)\n"
            f"  %g = f32[{n},{h}] gather(f32[{w},{h}] %e, {sh} %s), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}\n"
            f"  %mb = pred[{n},{h}] broadcast(pred[{n}] %mr), dimensions={{0}}\n  %fz = f32[] constant(0)\n  %fzs = f32[{n},{h}] broadcast(f32[] %fz), dimensions={{}}\n"
            f"  %o = f32[{n},{h}] select(pred[{n},{h}] %mb, f32[{n},{h}] %fzs, f32[{n},{h}] %g)\n"
            f"  ROOT %out = f32[{n},{h}] all-reduce(f32[{n},{h}] %o), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n")
    dist = ("HloModule cg_dist\n\n" + _reducer("add", "add", "f32") + "\n" + _reducer(red[0], red[0], "pred")
            + f"\nENTRY %main (r: s32[], ids: {ti}[{n}], e: f32[{w},{h}]) -> f32[{n},{h}] {{\n"
            f"  %r = s32[] parameter(0)\n  %ids = {ti}[{n}] parameter(1)\n  %e = f32[{w},{h}] parameter(2)\n" + body + "}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"},
                                        {"baseline": 0, "distributed": 1, "relation": "duplicate", "int_range": [lo, hi]},
                                        {"baseline": 1, "distributed": 2, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = (f"V={v} c={c} ids {ti} in [{lo}, {hi}) clamp [{clo}, {chi}], upper {upper[0]} r·w+{upper[1]}, mask reduce {red[0]} from {red[1]}, "
            f"offset {off_w}·r, all-reduce over {ar_groups} (groups {groups})")
    return Program("clampgather", form, base, dist, rel)


# ---- a ring all-reduce forwarding its running sum (rules/ringrun.egg) -----------------------------


def ringrun(rng: random.Random) -> Program:
    """Rank r sums its block (a partial sum), then for a number of steps receives the running sum
    of a neighbour and adds it to its own block (or, wrongly, to its running sum); the running
    sum is what it sends on. Drawn: the element type (ints with wrap, floats), the pairs (a shift
    by m within every group, or not a shift: mirror, other axis, random, one pair missing), the
    number of steps (c - 1, or one short or one too many), what the received sum is added to, and
    the groups."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "s32", "s8", "u16", "bf16"])
    steps = c - 1 if rng.random() < 0.7 else rng.choice([c - 2, c]) if c > 2 else rng.choice([0, 2])
    pairs, what = _pairs(rng, groups)
    onto = "own block" if rng.random() < 0.75 else "running sum"
    n, h = 2 * c, 4
    body = []
    acc = "%loc"
    for k in range(max(steps, 0)):
        body.append(f"  %t{k} = {t}[{h}] collective-permute({t}[{h}] {acc}), channel_id={k + 1}, source_target_pairs={_pairs_text(pairs)}\n")
        body.append(f"  %a{k} = {t}[{h}] add({t}[{h}] {'%loc' if onto == 'own block' else acc}, {t}[{h}] %t{k})\n")
        acc = f"%a{k}"
    body.append(f"  ROOT %out = {t}[{h}] copy({t}[{h}] {acc})\n")
    base = ("HloModule rr_base\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  ROOT %s = {t}[{h}] reduce({t}[{n},{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add\n}}\n")
    dist = ("HloModule rr_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {t}[2,{h}]) -> {t}[{h}] {{\n  %x = {t}[2,{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  %loc = {t}[{h}] reduce({t}[2,{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add\n" + "".join(body) + "}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Program("ringrun", f"running-sum ring {t}, {steps} steps of {what}, received sum added to the {onto} (groups {groups})", base, dist, rel)


# ---- rank groups by remainder (rules/modgroup.egg) ------------------------------------------------


def modgroup(rng: random.Random) -> Program:
    """Grouped-query attention's KV pick with the heads tiled: every rank holds x (n = 2 KV
    heads along d, duplicate), rank r takes head i = r mod 2 by index_select (a gather of one
    index) and applies a pointwise op; the baseline tiles x c/n times along d ([x0, x1, x0,
    x1]: a concatenate of copies, or a broadcast + reshape as jnp.tile), optionally through a
    transpose on both sides, and applies the op. Drawn: the element type (narrow, unsigned,
    float), the index type, the spelling of r mod 2 (remainder, Python's % with its sign
    fix-up, bitwise and, r - (r/2)·2), the tile's form, d, the groups, and the defects: the
    index r / 2 (interleaved), (r + 1) mod 2, (r - 1) rem 2 without the fix-up (negative on
    rank 0: the gather clamps), a repeat_interleave baseline."""
    groups = [[0, 1, 2, 3]] if rng.random() < 0.6 else _layout(rng)  # c = 2 has no proper group
    c = len(groups[0])
    if rng.random() < 0.4:
        return _modgroup_merge(rng, groups)
    n = 2
    t = rng.choice(["f32", "bf16", "f16", "s32", "s8", "u8", "u16"])
    ti = rng.choice(["s32", "s32", "s8", "u8", "s16", "s64"])
    h = rng.choice([1, 2, 3])
    d = rng.choice([0, 1])
    tr = rng.random() < 0.4
    spelling = rng.choice(["rem", "pymod", "and", "sub"])
    form = rng.choice(["concat", "bcast"])
    defect = rng.choice(["none"] * 6 + ["div", "rot", "nofix", "interleave"])
    xd = [n, h] if d == 0 else [h, n]
    pd = list(xd)
    pd[d] = 1
    R = max(1, c // n)

    def text(dims: list[int], ty: str = t) -> str:
        return f"{ty}[{','.join(map(str, dims))}]"

    def op(x: str, dims: list[int]) -> list[str]:
        s = text(dims)
        return [f"  %u = {s} tanh({s} {x})" if t.startswith("f") or t == "bf16" else f"  %u = {s} multiply({s} {x}, {s} {x})"]

    # The index on the rank, in type ti.
    k = f"{ti}[]"
    idx = ["  %r32 = s32[] parameter(0)", f"  %r = {k} convert(s32[] %r32)" if ti != "s32" else f"  %r = {k} copy(s32[] %r32)",
           f"  %n = {k} constant({n})"]
    if defect == "div":
        idx.append(f"  %i = {k} divide({k} %r, {k} %n)")
    elif defect == "rot":
        idx += [f"  %one = {k} constant(1)", f"  %r1 = {k} add({k} %r, {k} %one)", f"  %i = {k} remainder({k} %r1, {k} %n)"]
    elif defect == "nofix":
        idx += [f"  %one = {k} constant(1)", f"  %r1 = {k} subtract({k} %r, {k} %one)", f"  %i = {k} remainder({k} %r1, {k} %n)"]
    elif spelling == "rem":
        idx.append(f"  %i = {k} remainder({k} %r, {k} %n)")
    elif spelling == "pymod":
        idx += [f"  %m = {k} remainder({k} %r, {k} %n)", f"  %zero = {k} constant(0)",
                f"  %neg = pred[] compare({k} %m, {k} %zero), direction=LT", f"  %mn = {k} add({k} %m, {k} %n)",
                f"  %i = {k} select(pred[] %neg, {k} %mn, {k} %m)"]
    elif spelling == "and":
        idx += [f"  %mask = {k} constant({n - 1})", f"  %i = {k} and({k} %r, {k} %mask)"]
    else:
        idx += [f"  %q = {k} divide({k} %r, {k} %n)", f"  %qn = {k} multiply({k} %q, {k} %n)", f"  %i = {k} subtract({k} %r, {k} %qn)"]
    idx.append(f"  %i1 = {ti}[1] reshape({k} %i)")
    offset = [x for x in range(2) if x != d]
    dist_lines = [*idx, f"  %x = {text(xd)} parameter(1)",
                  f"  %g = {text(pd)} gather({text(xd)} %x, {ti}[1] %i1), offset_dims={{{offset[0]}}}, collapsed_slice_dims={{{d}}}, "
                  f"start_index_map={{{d}}}, index_vector_dim=1, slice_sizes={{{','.join('1' if j == d else str(xd[j]) for j in range(2))}}}",
                  f"  %g2 = {text(pd)} reshape({text(pd)} %g)"]
    dist_lines += op("%g2", pd)
    out_d = pd
    last = "%u"
    if tr:
        out_d = pd[::-1]
        dist_lines.append(f"  %o = {text(out_d)} transpose({text(pd)} %u), dimensions={{1,0}}")
        last = "%o"
    dist_lines.append(f"  ROOT %out = {text(out_d)} copy({text(out_d)} {last})")
    dist = f"HloModule modgroup_dist\n\nENTRY %main (r32: s32[], x: {text(xd)}) -> {text(out_d)} {{\n" + "\n".join(dist_lines) + "\n}\n"

    # Baseline: (transpose), tile along the head dim, op.
    reps = R
    y, yd, hd = "%x", list(xd), d
    base_lines = [f"  %x = {text(xd)} parameter(0)"]
    if tr:
        yd, hd = xd[::-1], 1 - d
        base_lines.append(f"  %y = {text(yd)} transpose({text(xd)} %x), dimensions={{1,0}}")
        y = "%y"
    zd = list(yd)
    zd[hd] = yd[hd] * reps
    if form == "concat" and defect != "interleave":
        base_lines.append(f"  %z = {text(zd)} concatenate({', '.join(f'{text(yd)} {y}' for _ in range(reps))}), dimensions={{{hd}}}")
    else:
        # new dim of extent reps before hd (tile) or after it (repeat_interleave)
        at = hd + 1 if defect == "interleave" else hd
        bd = list(yd)
        bd.insert(at, reps)
        keep = [j if j < at else j + 1 for j in range(2)]
        base_lines += [f"  %b = {text(bd)} broadcast({text(yd)} {y}), dimensions={{{','.join(map(str, keep))}}}",
                       f"  %z = {text(zd)} reshape({text(bd)} %b)"]
    base_lines += op("%z", zd)
    base_lines.append(f"  ROOT %out = {text(zd)} copy({text(zd)} %u)")
    base = f"HloModule modgroup_base\n\nENTRY %main (x: {text(xd)}) -> {text(zd)} {{\n" + "\n".join(base_lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "duplicate"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": hd}]}
    what = f"{t}{xd} pick along {d} by {ti} {spelling}, tile by {form}{' through a transpose' if tr else ''}, defect {defect} (groups {groups})"
    return Program("modgroup", what, base, dist, rel)


def _modgroup_merge(rng: random.Random, groups: list[list[int]]) -> Program:
    """The GQA merge's backward: the baseline sums x's c rows in groups (reshape (q, K) summed
    over K: interleaved heads, or (K, q) summed over K: tiled heads); rank r holds row r and
    index_adds it into zeros of q rows at floor(r / K), resp. r mod q, then all-reduces. Drawn:
    the element type, the form, the groups, and the defects: the other form's index, the index
    plus one (dropped updates), a fill of ones, no all-reduce."""
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8"])
    h = rng.choice([1, 2, 3])
    q = 2 if c == 4 else 1
    K = c // q
    form = rng.choice(["div", "mod"])
    defect = rng.choice(["none"] * 5 + ["swap", "plus1", "ones", "noar"])
    red = _reducer("add", "add", t)
    split = f"{q},{K},{h}" if form == "div" else f"{K},{q},{h}"
    base = (f"HloModule merge_base\n\n{red}\nENTRY %main (x: {t}[{c},{h}]) -> {t}[{q},{h}] {{\n  %x = {t}[{c},{h}] parameter(0)\n"
            f"  %y = {t}[{split}] reshape({t}[{c},{h}] %x)\n  %z = {t}[] constant(0)\n"
            f"  ROOT %s = {t}[{q},{h}] reduce({t}[{split}] %y, {t}[] %z), dimensions={{{1 if form == 'div' else 0}}}, to_apply=%add\n}}\n")
    use = form if defect != "swap" else ("mod" if form == "div" else "div")
    lines = ["  %r = s32[] parameter(0)", f"  %x = {t}[1,{h}] parameter(1)"]
    lines += [f"  %k = s32[] constant({K})", "  %i0 = s32[] divide(s32[] %r, s32[] %k)"] if use == "div" else \
             [f"  %k = s32[] constant({q})", "  %i0 = s32[] remainder(s32[] %r, s32[] %k)"]
    if defect == "plus1":
        lines += ["  %one = s32[] constant(1)", "  %i = s32[] add(s32[] %i0, s32[] %one)"]
    else:
        lines.append("  %i = s32[] copy(s32[] %i0)")
    lines += ["  %i1 = s32[1] reshape(s32[] %i)", f"  %f = {t}[] constant({1 if defect == 'ones' else 0})",
              f"  %zs = {t}[{q},{h}] broadcast({t}[] %f), dimensions={{}}",
              f"  %sc = {t}[{q},{h}] scatter({t}[{q},{h}] %zs, s32[1] %i1, {t}[1,{h}] %x), update_window_dims={{1}}, inserted_window_dims={{0}}, "
              "scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add"]
    if defect == "noar":
        lines.append(f"  ROOT %o = {t}[{q},{h}] copy({t}[{q},{h}] %sc)")
    else:
        lines.append(f"  ROOT %o = {t}[{q},{h}] all-reduce({t}[{q},{h}] %sc), channel_id=1, replica_groups={_groups_text(groups)}, use_global_device_ids=true, to_apply=%add")
    dist = f"HloModule merge_dist\n\n{red}\nENTRY %main (r: s32[], x: {t}[1,{h}]) -> {t}[{q},{h}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Program("modgroup", f"merge backward {t}[{c},{h}] {form} (q={q}, K={K}), defect {defect} (groups {groups})", base, dist, rel)

# ---- experts as a list per rank (rules/expertlist.egg) ----------------------------------------------


def _expert_select(rng: random.Random) -> Program:
    """A loop over the rank's local experts (MoE top-1 written with a rank index): on rank r,
    local expert j's weight row meets the tokens where the router chose expert r*n + j (the
    index computed from the rank input), the terms are added to a running sum from zero and
    all-reduced; the baseline loops over all E experts. Drawn: element types (narrow, unsigned,
    float), the index type, n, the op, the groups, and the side conditions: the index off by
    one, strided (r + j*c), the running sum started from one, the weights in reverse, the
    all-reduce missing or over other groups."""
    groups = _layout(rng)
    c = len(groups[0])
    n = rng.choice([1, 2, 3])
    e_all = c * n
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    it = rng.choice(["s32", "s64", "s16", "u8"])
    op = rng.choice(["multiply", "add"])
    rows, h = 4, 3
    defect = rng.choice(["none"] * 4 + ["offset", "strided", "start-one", "reversed", "no-allreduce", "groups"])
    if n == 1 and defect == "reversed":
        defect = "none"
    g2 = _other_groups(rng, groups) if defect == "groups" else groups

    def term(pre: str, w: str, wsh: str, e: int, idx_val: str, j: int) -> str:
        return (f"  %{pre}ws{j} = {t}[1,{h}] slice({wsh} %{w}), slice={{[{e}:{e + 1}], [0:{h}]}}\n"
                f"  %{pre}wr{j} = {t}[{h}] reshape({t}[1,{h}] %{pre}ws{j})\n"
                f"  %{pre}wb{j} = {t}[{rows},{h}] broadcast({t}[{h}] %{pre}wr{j}), dimensions={{1}}\n"
                f"  %{pre}y{j} = {t}[{rows},{h}] {op}({t}[{rows},{h}] %x, {t}[{rows},{h}] %{pre}wb{j})\n"
                f"  %{pre}ib{j} = {it}[{rows}] broadcast({it}[] {idx_val}), dimensions={{}}\n"
                f"  %{pre}eq{j} = pred[{rows}] compare({it}[{rows}] %idx, {it}[{rows}] %{pre}ib{j}), direction=EQ\n"
                f"  %{pre}sf{j} = {t}[{rows}] convert(pred[{rows}] %{pre}eq{j})\n"
                f"  %{pre}sb{j} = {t}[{rows},{h}] broadcast({t}[{rows}] %{pre}sf{j}), dimensions={{0}}\n"
                f"  %{pre}tm{j} = {t}[{rows},{h}] multiply({t}[{rows},{h}] %{pre}sb{j}, {t}[{rows},{h}] %{pre}y{j})\n"
                f"  %{pre}acc{j + 1} = {t}[{rows},{h}] add({t}[{rows},{h}] %{pre}acc{j}, {t}[{rows},{h}] %{pre}tm{j})\n")

    xsh, ish = f"{t}[{rows},{h}]", f"{it}[{rows}]"
    wsh, wlsh = f"{t}[{e_all},{h}]", f"{t}[{n},{h}]"
    base = [f"HloModule es_base\n\nENTRY %main (x: {xsh}, idx: {ish}, w: {wsh}) -> {xsh} {{\n  %x = {xsh} parameter(0)\n  %idx = {ish} parameter(1)\n  %w = {wsh} parameter(2)\n",
            f"  %zero = {t}[] constant(0)\n  %bacc0 = {xsh} broadcast({t}[] %zero), dimensions={{}}\n"]
    for e in range(e_all):
        base.append(f"  %be{e} = {it}[] constant({e})\n")
        base.append(term("b", "w", wsh, e, f"%be{e}", e))
    base.append(f"  ROOT %out = {xsh} copy({xsh} %bacc{e_all})\n}}\n")
    dist = ["HloModule es_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (x: {xsh}, idx: {ish}, w: {wlsh}, r: s32[]) -> {xsh} {{\n"
            f"  %x = {xsh} parameter(0)\n  %idx = {ish} parameter(1)\n  %w = {wlsh} parameter(2)\n  %r = s32[] parameter(3)\n  %ri = {it}[] convert(s32[] %r)\n",
            f"  %zero = {t}[] constant({1 if defect == 'start-one' else 0})\n  %dacc0 = {xsh} broadcast({t}[] %zero), dimensions={{}}\n"]
    mul, plus = (1, c) if defect == "strided" else (n, 1)
    dist.append(f"  %dn = {it}[] constant({mul})\n  %drn = {it}[] multiply({it}[] %ri, {it}[] %dn)\n")
    for j in range(n):
        off = j * plus + (1 if defect == "offset" else 0)
        dist.append(f"  %dj{j} = {it}[] constant({off})\n  %de{j} = {it}[] add({it}[] %drn, {it}[] %dj{j})\n")
        dist.append(term("d", "w", wlsh, n - 1 - j if defect == "reversed" else j, f"%de{j}", j))
    if defect == "no-allreduce":
        dist.append(f"  ROOT %out = {xsh} copy({xsh} %dacc{n})\n}}\n")
    else:
        dist.append(f"  ROOT %out = {xsh} all-reduce({xsh} %dacc{n}), channel_id=1, replica_groups={_groups_text(g2)}, to_apply=%add\n}}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"},
                                        {"baseline": 1, "distributed": 1, "relation": "duplicate", "int_range": [0, e_all]},
                                        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 0},
                                        {"distributed": 3, "relation": "rank"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"select-sum {n} local experts of {e_all}, {t} {op}, index {it}, defect {defect} (groups {groups})"
    return Program("expertlist", form, "".join(base), "".join(dist), rel)


def expertlist(rng: random.Random) -> Program:
    """DeepSpeed's MOELayer with n local experts per rank: the dispatched tokens X [E, C] are a
    duplicate, the all-to-all along the expert dim gives rank r c copies of its experts' rows,
    reshaped to [c, n, C]; chunk j (all c copies) meets local expert j's weight row (the stacked
    weight W [E, C'] is sharded along 0), by a pointwise op or a dot; the chunks are
    concatenated and returned by an all-to-all (before or after merging [c, n] into E). Drawn:
    the element type (narrow, unsigned, float), n, the expert op, where the merge happens, the
    groups, and the side conditions: experts run in reverse order, chunks concatenated in
    reverse, the return over other groups, the return left out, a chunk off by one. Half of
    the draws are the other spelling, a loop over local experts selected by the rank index."""
    if rng.random() < 0.5:
        return _expert_select(rng)
    groups = _layout(rng)
    c = len(groups[0])
    n = rng.choice([1, 2, 3]) if c == 2 else rng.choice([1, 2])
    e_all = c * n
    dot = rng.random() < 0.4
    t = rng.choice(["f32", "s32", "bf16"]) if dot else rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    cap = rng.choice([2, 3])
    op = rng.choice(["multiply", "add", "subtract"])
    merge_first = rng.random() < 0.5
    defect = rng.choice(["none"] * 4 + ["reversed", "cat-reversed", "groups", "no-return", "chunk-off"])
    if n == 1 and defect in ("reversed", "cat-reversed", "chunk-off"):
        defect = "none"
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    wsh = f"{t}[{e_all},{cap},{cap}]" if dot else f"{t}[{e_all},{cap}]"
    wlsh = f"{t}[{n},{cap},{cap}]" if dot else f"{t}[{n},{cap}]"

    def expert(v: str, w: str, e: int, copies: int, j: int, pre: str) -> tuple[str, str]:
        """Lines for expert e's weight slice applied to the chunk v ([copies,1,cap]); its name."""
        if dot:
            lines = (f"  %{pre}ws{j} = {t}[1,{cap},{cap}] slice({wlsh if pre == 'd' else wsh} %{w}), slice={{[{e}:{e + 1}], [0:{cap}], [0:{cap}]}}\n"
                     f"  %{pre}wr{j} = {t}[{cap},{cap}] reshape({t}[1,{cap},{cap}] %{pre}ws{j})\n"
                     f"  %{pre}vr{j} = {t}[{copies},{cap}] reshape({t}[{copies},1,{cap}] %{v})\n"
                     f"  %{pre}m{j} = {t}[{copies},{cap}] dot({t}[{copies},{cap}] %{pre}vr{j}, {t}[{cap},{cap}] %{pre}wr{j}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
                     f"  %{pre}y{j} = {t}[{copies},1,{cap}] reshape({t}[{copies},{cap}] %{pre}m{j})\n")
        else:
            lines = (f"  %{pre}ws{j} = {t}[1,{cap}] slice({wlsh if pre == 'd' else wsh} %{w}), slice={{[{e}:{e + 1}], [0:{cap}]}}\n"
                     f"  %{pre}wr{j} = {t}[{cap}] reshape({t}[1,{cap}] %{pre}ws{j})\n"
                     f"  %{pre}wb{j} = {t}[{copies},1,{cap}] broadcast({t}[{cap}] %{pre}wr{j}), dimensions={{2}}\n"
                     f"  %{pre}y{j} = {t}[{copies},1,{cap}] {op}({t}[{copies},1,{cap}] %{v}, {t}[{copies},1,{cap}] %{pre}wb{j})\n")
        return lines, f"{pre}y{j}"

    xsh = f"{t}[{e_all},{cap}]"
    base = [f"HloModule el_base\n\nENTRY %main (x: {xsh}, w: {wsh}) -> {xsh} {{\n  %x = {xsh} parameter(0)\n  %w = {wsh} parameter(1)\n",
            f"  %v = {t}[1,{e_all},{cap}] reshape({xsh} %x)\n"]
    outs = []
    for e in range(e_all):
        base.append(f"  %bz{e} = {t}[1,1,{cap}] slice({t}[1,{e_all},{cap}] %v), slice={{[0:1], [{e}:{e + 1}], [0:{cap}]}}\n")
        lines, name = expert(f"bz{e}", "w", e, 1, e, "b")
        base.append(lines)
        outs.append(name)
    base.append(f"  %cat = {t}[1,{e_all},{cap}] concatenate(" + ", ".join(f"{t}[1,1,{cap}] %{o}" for o in outs) + "), dimensions={1}\n")
    base.append(f"  ROOT %out = {xsh} reshape({t}[1,{e_all},{cap}] %cat)\n}}\n")
    dist = [f"HloModule el_dist\n\nENTRY %main (x: {xsh}, w: {wlsh}) -> {xsh} {{\n  %x = {xsh} parameter(0)\n  %w = {wlsh} parameter(1)\n",
            f"  %a = {xsh} all-to-all({xsh} %x), channel_id=1, replica_groups={_groups_text(groups)}, dimensions={{0}}\n",
            f"  %v = {t}[{c},{n},{cap}] reshape({xsh} %a)\n"]
    outs = []
    for j in range(n):
        jj = (j + 1) % n if defect == "chunk-off" else j
        dist.append(f"  %dz{j} = {t}[{c},1,{cap}] slice({t}[{c},{n},{cap}] %v), slice={{[0:{c}], [{jj}:{jj + 1}], [0:{cap}]}}\n")
        lines, name = expert(f"dz{j}", "w", n - 1 - j if defect == "reversed" else j, c, j, "d")
        dist.append(lines)
        outs.append(name)
    if defect == "cat-reversed":
        outs.reverse()
    dist.append(f"  %cat = {t}[{c},{n},{cap}] concatenate(" + ", ".join(f"{t}[{c},1,{cap}] %{o}" for o in outs) + "), dimensions={1}\n")
    if defect == "no-return":
        dist.append(f"  ROOT %out = {xsh} reshape({t}[{c},{n},{cap}] %cat)\n}}\n")
    elif merge_first:
        dist.append(f"  %m = {xsh} reshape({t}[{c},{n},{cap}] %cat)\n"
                    f"  ROOT %out = {xsh} all-to-all({xsh} %m), channel_id=2, replica_groups={_groups_text(g2)}, dimensions={{0}}\n}}\n")
    else:
        dist.append(f"  %back = {t}[{c},{n},{cap}] all-to-all({t}[{c},{n},{cap}] %cat), channel_id=2, replica_groups={_groups_text(g2)}, dimensions={{0}}\n"
                    f"  ROOT %out = {xsh} reshape({t}[{c},{n},{cap}] %back)\n}}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"},
                                        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = (f"{n} local experts of {e_all}, {t}, {'dot' if dot else op}, {'merge then all-to-all' if merge_first else 'all-to-all then merge'}, "
            f"defect {defect} (groups {groups})")
    return Program("expertlist", form, "".join(base), "".join(dist), rel)


# ---- FSDP inside a scan: a layer's slice gathered inside the loop (rules/fsdpslice.egg) -------------


def fsdpslice(rng: random.Random) -> Program:
    """A stacked weight P [L, 8, 6] bound ``gathered`` (split over the other mesh axis as well and
    gathered whole inside the program): the rank slices one layer (dynamic-slice at a start from
    literals), squeezes it, and all-gathers the slice over the gathered groups; the baseline
    slices the same layer of P. Drawn: the element type (narrow, unsigned, float), the binding
    (sharded along 2 and gathered along 1, sharded along 1 and gathered along 2, duplicate
    gathered along 1), an extra unit dim, and the side conditions: the layer start off by one or
    computed from the rank, the all-gather over the sharding groups or with a gathered group's
    devices in reverse order."""
    groups, gathered = rng.choice([([[0, 1], [2, 3]], [[0, 2], [1, 3]]), ([[0, 2], [1, 3]], [[0, 1], [2, 3]])])
    t = rng.choice(["f32", "s8", "u16", "bf16", "s32"])
    layers = 3
    li = rng.randrange(layers)
    kind = rng.choice(["s2g1", "s1g2", "dg1"])
    unit = rng.random() < 0.3
    start = rng.choice(["same"] * 6 + ["off", "rank"])
    ag_groups = rng.choice([gathered] * 6 + [groups, [list(reversed(x)) for x in gathered]])
    local = {"s2g1": (4, 3), "s1g2": (4, 3), "dg1": (4, 6)}[kind]
    gdim = 1 if kind in ("s2g1", "dg1") else 2  # in P
    full_out = [8, 6]
    sq = list(local)
    agd = gdim - 1
    gathered_out = list(sq)
    gathered_out[agd] *= 2
    if unit:
        sq, gathered_out, full_out = [sq[0], 1, sq[1]], [gathered_out[0], 1, gathered_out[1]], [8, 1, 6]
        agd = 0 if agd == 0 else 2

    def text(dims: list[int]) -> str:
        return f"{t}[{','.join(map(str, dims))}]"

    base = (f"HloModule fs_base\n\nENTRY %main (p: {t}[{layers},8,6]) -> {text(full_out)} {{\n  %p = {t}[{layers},8,6] parameter(0)\n"
            f"  %i = s32[] constant({li})\n  %z = s32[] constant(0)\n"
            f"  %ds = {t}[1,8,6] dynamic-slice({t}[{layers},8,6] %p, s32[] %i, s32[] %z, s32[] %z), dynamic_slice_sizes={{1,8,6}}\n"
            f"  ROOT %out = {text(full_out)} reshape({t}[1,8,6] %ds)\n}}\n")
    di = {"same": f"  %i = s32[] constant({li})\n", "off": f"  %i = s32[] constant({(li + 1) % layers})\n",
          "rank": f"  %l = s32[] constant({li})\n  %i = s32[] add(s32[] %l, s32[] %r)\n"}[start]
    dist = (f"HloModule fs_dist\n\nENTRY %main (p: {t}[{layers},{local[0]},{local[1]}], r: s32[]) -> {text(gathered_out)} {{\n"
            f"  %p = {t}[{layers},{local[0]},{local[1]}] parameter(0)\n  %r = s32[] parameter(1)\n" + di + "  %z = s32[] constant(0)\n"
            f"  %ds = {t}[1,{local[0]},{local[1]}] dynamic-slice({t}[{layers},{local[0]},{local[1]}] %p, s32[] %i, s32[] %z, s32[] %z), dynamic_slice_sizes={{1,{local[0]},{local[1]}}}\n"
            f"  %sq = {text(sq)} reshape({t}[1,{local[0]},{local[1]}] %ds)\n  %cp = {text(sq)} copy({text(sq)} %sq)\n"
            f"  ROOT %ag = {text(gathered_out)} all-gather({text(sq)} %cp), channel_id=1, replica_groups={_groups_text(ag_groups)}, dimensions={{{agd}}}, use_global_device_ids=true\n}}\n")
    pin: dict[str, Any] = {"baseline": 0, "distributed": 0, "gathered": {"dim": gdim, "groups": gathered}}
    if kind == "dg1":
        pin["relation"] = "duplicate"
        out: dict[str, Any] = {"baseline": 0, "distributed": 0, "relation": "duplicate"}
    else:
        pin.update(relation="sharded", dim=2 if kind == "s2g1" else 1)
        sd = 1 if kind == "s2g1" else 0
        out = {"baseline": 0, "distributed": 0, "relation": "sharded", "dim": (2 if unit and sd == 1 else sd)}
    rel = {"groups": groups, "inputs": [pin, {"distributed": 1, "relation": "rank"}], "outputs": [out]}
    form = f"P {t}, {kind}, layer {li}, start {start}, {'extra unit dim, ' if unit else ''}all-gather over {ag_groups} (groups {groups}, gathered {gathered})"
    return Program("fsdpslice", form, base, dist, rel)

# ---- JAX's arg-reduce combine (engine/analysis/laws/argreduce.py arg_reducer; rules/argreduce.egg) --


def _jax_argcombine(name: str, vt: str, it: str, strict: str, tie: str, nan_first: bool) -> str:
    """jnp.argmax / argmin's combine: NaN first, then the strict order, ties to the lower index
    (``tie`` LT; GT takes the higher one); ``nan_first`` False leaves the NaN clause out of the
    index's select only (a combine no JAX version writes)."""
    nan_i = "pred[] %first" if nan_first else "pred[] %gt"
    return f"""%{name} (lv: {vt}[], li: {it}[], rv: {vt}[], ri: {it}[]) -> ({vt}[], {it}[]) {{
  %lv = {vt}[] parameter(0)
  %li = {it}[] parameter(1)
  %rv = {vt}[] parameter(2)
  %ri = {it}[] parameter(3)
  %gt = pred[] compare({vt}[] %lv, {vt}[] %rv), direction={strict}
  %nan = pred[] compare({vt}[] %lv, {vt}[] %lv), direction=NE
  %first = pred[] or(pred[] %gt, pred[] %nan)
  %v = {vt}[] select(pred[] %first, {vt}[] %lv, {vt}[] %rv)
  %eq = pred[] compare({vt}[] %lv, {vt}[] %rv), direction=EQ
  %lt = pred[] compare({it}[] %li, {it}[] %ri), direction={tie}
  %tie = pred[] and(pred[] %eq, pred[] %lt)
  %pick = pred[] or({nan_i}, pred[] %tie)
  %i = {it}[] select(pred[] %pick, {it}[] %li, {it}[] %ri)
  ROOT %t = ({vt}[], {it}[]) tuple({vt}[] %v, {it}[] %i)
}}
"""


def jaxargreduce(rng: random.Random) -> Program:
    """The vocab-parallel arg-reduce of ``argreduce`` with JAX's combine in place of torch's on
    either side or both (jnp.argmax, also vmapped): the same law on NaN-free values. Drawn on top
    of argreduce's draws: which side uses JAX's combine, and the combines no JAX writes (ties to
    the higher index, the NaN clause missing from the index) that must not be read as arg-reduces."""
    import re

    p = argreduce(rng)
    sides = rng.choice(["both", "both", "baseline", "distributed"])
    tie, nan_first = rng.choice([("LT", True)] * 5 + [("GT", True), ("LT", False)])
    pat = re.compile(r"%comb \(lv: (\w+)\[\], li: (\w+)\[\].*?\n}\n", re.S)

    def swap(text: str) -> str:
        m = pat.search(text)
        assert m is not None
        strict = "GT" if "direction=G" in m.group(0) else "LT"
        return text[: m.start()] + _jax_argcombine("comb", m.group(1), m.group(2), strict, tie, nan_first) + text[m.end():]

    if sides in ("both", "baseline"):
        p.baseline = swap(p.baseline)
    if sides in ("both", "distributed"):
        p.distributed = swap(p.distributed)
    p.family = "jaxargreduce"
    p.form += f", JAX combine on {sides} (ties {tie}{'' if nan_first else ', no NaN clause in the index'})"
    return p

# ---- a partial sum masked by a replicated predicate (rules/selectpartial.egg) ------------------------


def selectpartial(rng: random.Random) -> Program:
    """x is a partial sum (each rank a piece), m = (k < t) from a replicated k; the ranks select
    their piece where m holds and zero elsewhere (or the other operand order) and all-reduce;
    the baseline selects x. Drawn: the element type (narrow, unsigned, float), the operand order,
    the fill (zero, -0.0, or one), the mask (replicated, or compared with the rank), the groups
    of the all-reduce."""
    groups = _layout(rng)
    t = rng.choice(["f32", "s32", "s8", "u16", "bf16"])
    n, h = 6, 4
    then = rng.random() < 0.5
    fill = rng.choice(["0"] * 5 + ["1"] + (["-0"] if t in ("f32", "bf16") else []))
    mask = "dup" if rng.random() < 0.8 else "rank"
    ar_groups = groups if rng.random() < 0.85 else _other_groups(rng, groups)
    thr = rng.randrange(1, 9)

    def sel(m: str, a: str, z: str) -> str:
        return f"{t}[{n},{h}] select(pred[{n},{h}] {m}, {t}[{n},{h}] {a}, {t}[{n},{h}] {z})" if then else f"{t}[{n},{h}] select(pred[{n},{h}] {m}, {t}[{n},{h}] {z}, {t}[{n},{h}] {a})"

    base = (f"HloModule sp_base\n\nENTRY %main (x: {t}[{n},{h}], k: s32[{n},{h}]) -> {t}[{n},{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n  %k = s32[{n},{h}] parameter(1)\n"
            f"  %th = s32[] constant({thr})\n  %ths = s32[{n},{h}] broadcast(s32[] %th), dimensions={{}}\n  %m = pred[{n},{h}] compare(s32[{n},{h}] %k, s32[{n},{h}] %ths), direction=LT\n"
            f"  %z = {t}[] constant(0)\n  %zs = {t}[{n},{h}] broadcast({t}[] %z), dimensions={{}}\n  ROOT %o = {sel('%m', '%x', '%zs')}\n}}\n")
    th = f"  %th = s32[] constant({thr})\n" if mask == "dup" else f"  %th0 = s32[] constant({thr})\n  %th = s32[] add(s32[] %th0, s32[] %r)\n"
    dist = ("HloModule sp_dist\n\n" + _reducer("add", "add", t) + f"\nENTRY %main (r: s32[], x: {t}[{n},{h}], k: s32[{n},{h}]) -> {t}[{n},{h}] {{\n"
            f"  %r = s32[] parameter(0)\n  %x = {t}[{n},{h}] parameter(1)\n  %k = s32[{n},{h}] parameter(2)\n" + th
            + f"  %ths = s32[{n},{h}] broadcast(s32[] %th), dimensions={{}}\n  %m = pred[{n},{h}] compare(s32[{n},{h}] %k, s32[{n},{h}] %ths), direction=LT\n"
            f"  %z = {t}[] constant({fill})\n  %zs = {t}[{n},{h}] broadcast({t}[] %z), dimensions={{}}\n  %s = {sel('%m', '%x', '%zs')}\n"
            f"  ROOT %o = {t}[{n},{h}] all-reduce({t}[{n},{h}] %s), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n}}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "partial"},
                                        {"baseline": 1, "distributed": 2, "relation": "duplicate", "int_range": [0, 10]}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{t} select({'m, x, fill' if then else 'm, fill, x'}) fill {fill}, mask {mask} (k < {thr}), all-reduce over {ar_groups} (groups {groups})"
    return Program("selectpartial", form, base, dist, rel)

# ---- fills through broadcasts of arrays (rules/fillbcast.egg) ------------------------------------


def fillbcast(rng: random.Random) -> Program:
    """LayerNorm's scale and offset as torch-xla lowers a norm without weights: x·s + o with s
    a vector of ones and o a vector of zeros (a broadcast of a scalar literal, reshaped),
    broadcast along the feature dim of the rows. The baseline holds x whole and writes the
    identities, the ranks hold a block of rows (sharded along d) and use x alone. Drawn: the
    element type (narrow, unsigned, float), the shape, d, the feature dim, the groups, and the
    defects: a fill of 2 or -1 in place of 1, of 1 in place of 0, the vector read from an input
    (not a fill), the ones added as an offset too."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "f16", "s32", "s8", "u8", "u16"])
    rows, feat = c * rng.choice([1, 2]), rng.choice([2, 3, 4])
    d = rng.choice([0, 1])
    dims = [rows, feat] if d == 0 else [feat, rows]
    f = 1 - d  # the feature dim (kept whole on every rank)
    defect = rng.choice(["none"] * 5 + ["one2", "onem1", "zero1", "input", "offset2"])
    one = {"one2": "2", "onem1": "-1" if not t.startswith("u") else "2"}.get(defect, "1")
    zero = "1" if defect == "zero1" else "0"
    sh = f"{t}[{dims[0]},{dims[1]}]"
    vec = f"{t}[{feat}]"
    lines = [f"  %x = {sh} parameter(0)"]
    params = f"x: {sh}"
    if defect == "input":
        params += f", v: {vec}"
        lines.append(f"  %s = {vec} parameter(1)")
    else:
        lines += [f"  %one = {t}[] constant({one})", f"  %one1 = {t}[1] reshape({t}[] %one)",
                  f"  %one0 = {t}[] reshape({t}[1] %one1)", f"  %s = {vec} broadcast({t}[] %one0), dimensions={{}}"]
    lines += [f"  %zero = {t}[] constant({zero})", f"  %o = {vec} broadcast({t}[] %zero), dimensions={{}}",
              f"  %sx = {sh} broadcast({vec} %s), dimensions={{{f}}}", f"  %ox = {sh} broadcast({vec} %o), dimensions={{{f}}}",
              f"  %m = {sh} multiply({sh} %x, {sh} %sx)", f"  %a = {sh} add({sh} %m, {sh} %ox)"]
    last = "%a"
    if defect == "offset2":
        lines.append(f"  %a2 = {sh} add({sh} %a, {sh} %sx)")  # the scale's ones added as well
        last = "%a2"
    lines.append(f"  ROOT %out = {sh} copy({sh} {last})")
    base = f"HloModule fill_base\n\nENTRY %main ({params}) -> {sh} {{\n" + "\n".join(lines) + "\n}\n"
    ld = list(dims)
    ld[d] //= c
    lsh = f"{t}[{ld[0]},{ld[1]}]"
    dparams = f"x: {lsh}" + (f", v: {vec}" if defect == "input" else "")
    dist = (f"HloModule fill_dist\n\nENTRY %main ({dparams}) -> {lsh} {{\n  %x = {lsh} parameter(0)\n"
            + (f"  %v = {vec} parameter(1)\n" if defect == "input" else "")
            + f"  ROOT %out = {lsh} copy({lsh} %x)\n}}\n")
    inputs: list[dict[str, Any]] = [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": d}]
    if defect == "input":
        inputs.append({"baseline": 1, "distributed": 1, "relation": "duplicate"})
    rel = {"groups": groups, "inputs": inputs, "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": d}]}
    form = f"{t}{dims} rows along {d}, scale {one} offset {zero}, defect {defect} (groups {groups})"
    return Program("fillbcast", form, base, dist, rel)

# ---- prefix-sum carry as an exclusive scan of gathered totals (rules/scancarry.egg) -------------


def scancarry(rng: random.Random) -> Program:
    """cumsum along a sharded dim: rank r adds to its local prefix sum the carry (S - T)[r], T the
    all-gathered block totals (stacked along a new dim), S their inclusive prefix (a
    reduce-window), picked at the rank by a gather. Drawn: the element type (narrow ints that
    wrap, unsigned, floats: the subtraction is exact only for ints), the block size, the groups,
    and the defects: the inclusive scan (no subtraction), the pick at r + 1 or at 0, the local
    total subtracted instead of the stack, a window one short."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["s32", "s8", "u8", "u16", "s16", "f32"])
    w, h = rng.choice([1, 2, 3]), rng.choice([1, 2, 2, 3])
    n = c * w
    defect = rng.choice(["none"] * 5 + ["inclusive", "pick1", "pick0", "localsub", "short"])
    red = _reducer("add", "add", t)
    win = c - 1 if defect == "short" else c
    base = (f"HloModule scan_base\n\n{red}\nENTRY %main (x: {t}[{n},{h}]) -> {t}[{n},{h}] {{\n  %x = {t}[{n},{h}] parameter(0)\n"
            f"  %z = {t}[] constant(0)\n  ROOT %y = {t}[{n},{h}] reduce-window({t}[{n},{h}] %x, {t}[] %z), window={{size={n}x1 pad={n - 1}_0x0_0}}, to_apply=%add\n}}\n")
    lines = ["  %r = s32[] parameter(0)", f"  %x = {t}[{w},{h}] parameter(1)", f"  %z = {t}[] constant(0)",
             f"  %loc = {t}[{w},{h}] reduce-window({t}[{w},{h}] %x, {t}[] %z), window={{size={w}x1 pad={w - 1}_0x0_0}}, to_apply=%add",
             f"  %tot = {t}[{h}] reduce({t}[{w},{h}] %x, {t}[] %z), dimensions={{0}}, to_apply=%add",
             f"  %tot1 = {t}[1,{h}] reshape({t}[{h}] %tot)",
             f"  %g = {t}[{c},{h}] all-gather({t}[1,{h}] %tot1), channel_id=1, replica_groups={_groups_text(groups)}, dimensions={{0}}",
             f"  %s = {t}[{c},{h}] reduce-window({t}[{c},{h}] %g, {t}[] %z), window={{size={win}x1 pad={win - 1}_0x0_0}}, to_apply=%add"]
    sub = "%g"
    if defect == "localsub":
        lines.append(f"  %tb = {t}[{c},{h}] broadcast({t}[{h}] %tot), dimensions={{1}}")
        sub = "%tb"
    if defect == "inclusive":
        lines.append(f"  %e = {t}[{c},{h}] copy({t}[{c},{h}] %s)")
    else:
        lines.append(f"  %e = {t}[{c},{h}] subtract({t}[{c},{h}] %s, {t}[{c},{h}] {sub})")
    if defect == "pick1":
        lines += ["  %one = s32[] constant(1)", "  %rp = s32[] add(s32[] %r, s32[] %one)"]
    elif defect == "pick0":
        lines += ["  %rp = s32[] constant(0)"]
    else:
        lines += ["  %rp = s32[] copy(s32[] %r)"]
    lines += ["  %i = s32[1] reshape(s32[] %rp)",
              f"  %o1 = {t}[1,{h}] gather({t}[{c},{h}] %e, s32[1] %i), offset_dims={{1}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1,{h}}}",
              f"  %o = {t}[{h}] reshape({t}[1,{h}] %o1)", f"  %ob = {t}[{w},{h}] broadcast({t}[{h}] %o), dimensions={{1}}",
              f"  ROOT %y = {t}[{w},{h}] add({t}[{w},{h}] %loc, {t}[{w},{h}] %ob)"]
    dist = f"HloModule scan_dist\n\n{red}\nENTRY %main (r: s32[], x: {t}[{w},{h}]) -> {t}[{w},{h}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    return Program("scancarry", f"{t}[{n},{h}] blocks of {w}, defect {defect} (groups {groups})", base, dist, rel)

# ---- split, stack, all-to-all, unbind, concatenate (rules/a2astack.egg) --------------------------


def a2astack(rng: random.Random) -> Program:
    """Re-sharding from dim u to dim v of a 3-D tensor as torch writes it: chunk the rank's
    block along v into c pieces, stack them along a new dim w (unit reshapes + concatenate),
    all-to-all along w, unbind along w (slices + unit-dropping reshapes), concatenate along u.
    Drawn: the element type (narrow, unsigned, float), the extents, u, v, w, the groups, and the
    defects: the pieces concatenated in reverse order, the all-to-all over other groups, a
    piece taken one block off, the concatenation along another dim of equal extent."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    u, v = rng.sample([0, 1, 2], 2)
    dims = [rng.choice([1, 2]) for _ in range(3)]
    dims[u] = c * rng.choice([1, 2])
    dims[v] = c * rng.choice([1, 2])
    w = rng.choice([0, 3])
    defect = rng.choice(["none"] * 5 + ["reverse", "groups", "offset", "catdim"])
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    loc = list(dims)
    loc[u] //= c  # the rank's block

    def ty(d: list[int]) -> str:
        return f"{t}[{','.join(map(str, d))}]"

    piece = list(loc)
    piece[v] //= c
    unit = list(piece)
    unit.insert(w if w < 3 else 3, 1)
    ax = w if w < 3 else 3
    stack = list(piece)
    stack.insert(ax, c)
    lines = [f"  %x = {ty(loc)} parameter(0)"]
    for e in range(c):
        e2 = min(e + 1, c - 1) if defect == "offset" and e == 0 else e
        sl = ", ".join(f"[{e2 * piece[k]}:{(e2 + 1) * piece[k]}]" if k == v else f"[0:{loc[k]}]" for k in range(3))
        lines += [f"  %piece{e} = {ty(piece)} slice({ty(loc)} %x), slice={{{sl}}}", f"  %unit{e} = {ty(unit)} reshape({ty(piece)} %piece{e})"]
    lines.append(f"  %st = {ty(stack)} concatenate({', '.join(f'{ty(unit)} %unit{e}' for e in range(c))}), dimensions={{{ax}}}")
    lines.append(f"  %a = {ty(stack)} all-to-all({ty(stack)} %st), channel_id=1, replica_groups={_groups_text(g2)}, dimensions={{{ax}}}")
    for r in range(c):
        sl = ", ".join(f"[{r}:{r + 1}]" if k == ax else f"[0:{n}]" for k, n in enumerate(stack))
        lines += [f"  %recv{r} = {ty(unit)} slice({ty(stack)} %a), slice={{{sl}}}", f"  %back{r} = {ty(piece)} reshape({ty(unit)} %recv{r})"]
    order = list(range(c))[::-1] if defect == "reverse" else list(range(c))
    cat = u
    if defect == "catdim":
        other = 3 - u - v
        if piece[other] == piece[u]:
            cat = other
    out = list(piece)
    out[cat] *= c
    lines.append(f"  ROOT %o = {ty(out)} concatenate({', '.join(f'{ty(piece)} %back{r}' for r in order)}), dimensions={{{cat}}}")
    dist = f"HloModule stk_dist\n\nENTRY %main (x: {ty(loc)}) -> {ty(out)} {{\n" + "\n".join(lines) + "\n}\n"
    base = f"HloModule stk_base\n\nENTRY %main (x: {ty(dims)}) -> {ty(dims)} {{\n  %x = {ty(dims)} parameter(0)\n  ROOT %o = {ty(dims)} copy({ty(dims)} %x)\n}}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": u}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": v}]}
    return Program("a2astack", f"{t}{dims} from {u} to {v}, stack at {ax}, defect {defect} (groups {g2})", base, dist, rel)

# ---- movement through collectives followed on labels (rules/labelmove.egg) -------------------------


def labelmove(rng: random.Random) -> Program:
    """Ulysses' untiled all-to-all both ways: x [S, H, D] sharded along the sequence is split
    into [S/c, c, H/c, D], the group axis moved first, exchanged (all-to-all along 0) and merged
    to [S, H/c, D] (sharded along the heads), or back the other way. Drawn: the element type,
    the direction, the groups, and the side conditions: the transpose left out or another one,
    the all-to-all over other groups or with a group's members reversed."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s8", "u16", "s32"])
    s, h, d = 2 * c, 2 * c, 2
    to_heads = rng.random() < 0.5
    perm = rng.choice([(1, 0, 2, 3)] * 5 + [(0, 1, 2, 3), (1, 0, 3, 2)])
    a2a_groups = rng.choice([groups] * 5 + [_other_groups(rng, groups)])

    def ty(dims: list[int]) -> str:
        return f"{t}[{','.join(map(str, dims))}]"

    def tr(dims: list[int], p: tuple[int, ...]) -> list[int]:
        return [dims[i] for i in p]

    if to_heads:
        src, in_dim, out_dim = [s // c, h, d], 0, 1
        a = [s // c, c, h // c, d]
        b = tr(a, perm)
        body = (f"  %a = {ty(a)} reshape({ty(src)} %x)\n  %b = {ty(b)} transpose({ty(a)} %a), dimensions={{{','.join(map(str, perm))}}}\n"
                f"  %e = {ty(b)} all-to-all({ty(b)} %b), channel_id=1, replica_groups={_groups_text(a2a_groups)}, dimensions={{0}}\n")
        out = [s, h // c, d] if b[0] * b[1] == s else [b[0] * b[1], b[2], b[3]]
        body += f"  ROOT %o = {ty(out)} reshape({ty(b)} %e)\n"
    else:
        src, in_dim, out_dim = [s, h // c, d], 1, 0
        a = [c, s // c, h // c, d]
        body = (f"  %a = {ty(a)} reshape({ty(src)} %x)\n"
                f"  %e = {ty(a)} all-to-all({ty(a)} %a), channel_id=1, replica_groups={_groups_text(a2a_groups)}, dimensions={{0}}\n")
        b = tr(a, perm)
        body += f"  %b = {ty(b)} transpose({ty(a)} %e), dimensions={{{','.join(map(str, perm))}}}\n"
        out = [s // c, h, d] if b[0] == s // c and b[1] * b[2] == h else [b[0], b[1] * b[2], b[3]]
        body += f"  ROOT %o = {ty(out)} reshape({ty(b)} %b)\n"
    base = f"HloModule lm_base\n\nENTRY %main (x: {ty([s, h, d])}) -> {ty([s, h, d])} {{\n  %x = {ty([s, h, d])} parameter(0)\n  ROOT %o = {ty([s, h, d])} copy({ty([s, h, d])} %x)\n}}\n"
    dist = f"HloModule lm_dist\n\nENTRY %main (x: {ty(src)}) -> {ty(out)} {{\n  %x = {ty(src)} parameter(0)\n" + body + "}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": in_dim}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": out_dim}]}
    form = f"{t} {'seq->heads' if to_heads else 'heads->seq'}, transpose {perm}, all-to-all over {a2a_groups}, declared along {out_dim} (groups {groups})"
    return Program("labelmove", form, base, dist, rel)

# ---- one all-reduce of packed tensors (rules/packedar.egg) ----------------------------------------


def packedar(rng: random.Random) -> Program:
    """Two partial sums (or max/min partials) packed into one all-reduce: concatenated along a
    dim (or flattened to 1-D and concatenated, a gradient bucket), all-reduced once, sliced back
    (and reshaped). Drawn: the element type (narrow, unsigned, float), the shapes, the packing,
    the reducer, the groups, and the defects: a slice one element off, the two slices swapped
    (equal shapes), the all-reduce over other groups, a max all-reduce of sum partials."""
    groups = _layout(rng)
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    op = rng.choice(["add", "add", "add", "maximum", "minimum"])
    flat = rng.random() < 0.4
    r0, r1 = rng.choice([1, 2]), rng.choice([1, 2])
    h = rng.choice([2, 3])
    defect = rng.choice(["none"] * 5 + ["off", "swap", "groups", "reducer"])
    if defect == "swap":
        r1 = r0
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    aop = "maximum" if defect == "reducer" and op != "maximum" else ("add" if defect == "reducer" else op)
    red = _reducer("comb", aop, t)
    s0, s1 = f"{t}[{r0},{h}]", f"{t}[{r1},{h}]"
    base = (f"HloModule pk_base\n\nENTRY %main (a: {s0}, b: {s1}) -> ({s0}, {s1}) {{\n  %a = {s0} parameter(0)\n  %b = {s1} parameter(1)\n"
            f"  ROOT %o = ({s0}, {s1}) tuple({s0} %a, {s1} %b)\n}}\n")
    n0, n1 = r0 * h, r1 * h
    if flat:
        pk = f"{t}[{n0 + n1}]"
        lines = [f"  %fa = {t}[{n0}] reshape({s0} %a)", f"  %fb = {t}[{n1}] reshape({s1} %b)",
                 f"  %cat = {pk} concatenate({t}[{n0}] %fa, {t}[{n1}] %fb), dimensions={{0}}"]
        rng0, rng1 = (0, n0), (n0, n0 + n1)
        sl = lambda lo, hi: f"[{lo}:{hi}]"  # noqa: E731
        piece = lambda n: f"{t}[{n}]"  # noqa: E731
    else:
        pk = f"{t}[{r0 + r1},{h}]"
        lines = [f"  %cat = {pk} concatenate({s0} %a, {s1} %b), dimensions={{0}}"]
        rng0, rng1 = (0, r0), (r0, r0 + r1)
        sl = lambda lo, hi: f"[{lo}:{hi}], [0:{h}]"  # noqa: E731
        piece = lambda n: f"{t}[{n // h},{h}]"  # noqa: E731
    lines.append(f"  %ar = {pk} all-reduce({pk} %cat), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, to_apply=%comb")
    if defect == "swap":
        rng0, rng1 = rng1, rng0
    if defect == "off":
        top = rng1[1]
        rng0 = (rng0[0] + 1, rng0[1] + 1) if rng0[1] + 1 <= top else rng0
    lines += [f"  %x0 = {piece(n0)} slice({pk} %ar), slice={{{sl(*((rng0[0], rng0[1]) if not flat else rng0))}}}",
              f"  %x1 = {piece(n1)} slice({pk} %ar), slice={{{sl(*rng1)}}}"]
    if flat:
        lines += [f"  %y0 = {s0} reshape({t}[{n0}] %x0)", f"  %y1 = {s1} reshape({t}[{n1}] %x1)"]
    else:
        lines += [f"  %y0 = {s0} copy({s0} %x0)", f"  %y1 = {s1} copy({s1} %x1)"]
    lines.append(f"  ROOT %o = ({s0}, {s1}) tuple({s0} %y0, {s1} %y1)")
    dist = f"HloModule pk_dist\n\n{red}\nENTRY %main (a: {s0}, b: {s1}) -> ({s0}, {s1}) {{\n  %a = {s0} parameter(0)\n  %b = {s1} parameter(1)\n" + "\n".join(lines) + "\n}\n"
    pop = {"add": "add", "maximum": "max", "minimum": "min"}[op]
    rel = {"groups": groups, "inputs": [{"baseline": i, "distributed": i, "relation": "partial", "op": pop} for i in range(2)],
           "outputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in range(2)]}
    return Program("packedar", f"{t} partial({pop}) [{r0},{h}] + [{r1},{h}] {'flat' if flat else 'rows'} into {aop} all-reduce, defect {defect} (groups {g2})", base, dist, rel)

# ---- a dot cut along a free dim of each operand (rules/dotblock.egg) -------------------------------


def dotblock(rng: random.Random) -> Program:
    """x sharded by rows times each column block of a duplicate W, exchanged with a tuple
    all-to-all (operands computed separately), concatenated by rows: block j of the columns of
    x · W. Drawn: the element type (narrow, unsigned, float), the extents, the groups, and the
    defects: the received blocks in another order, every destination sent the same block, a
    column slice off by one."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8"])
    m, k, n = rng.choice([1, 2]), rng.choice([2, 3]), rng.choice([1, 2])
    rows, cols = c * m, c * n
    defect = rng.choice(["none"] * 5 + ["order", "same", "off"])
    xs, ws, ys = f"{t}[{rows},{k}]", f"{t}[{k},{cols}]", f"{t}[{rows},{cols}]"
    base = (f"HloModule db_base\n\nENTRY %main (x: {xs}, w: {ws}) -> {ys} {{\n  %x = {xs} parameter(0)\n  %w = {ws} parameter(1)\n"
            f"  ROOT %y = {ys} dot({xs} %x, {ws} %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n}}\n")
    lx, piece = f"{t}[{m},{k}]", f"{t}[{m},{n}]"
    lines = [f"  %x = {lx} parameter(0)", f"  %w = {ws} parameter(1)"]
    for j in range(c):
        b = 0 if defect == "same" else j
        lo = b * n + (1 if defect == "off" and j == 0 else 0)
        lines += [f"  %wj{j} = {t}[{k},{n}] slice({ws} %w), slice={{[0:{k}], [{lo}:{lo + n}]}}",
                  f"  %o{j} = {piece} dot({lx} %x, {t}[{k},{n}] %wj{j}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"]
    tup = "(" + ", ".join([piece] * c) + ")"
    lines.append(f"  %a = {tup} all-to-all({', '.join(f'{piece} %o{j}' for j in range(c))}), channel_id=1, replica_groups={_groups_text(groups)}")
    lines += [f"  %e{i} = {piece} get-tuple-element({tup} %a), index={i}" for i in range(c)]
    order = list(range(c))
    if defect == "order":
        order[0], order[1] = order[1], order[0]
    lines.append(f"  ROOT %y = {t}[{rows},{n}] concatenate({', '.join(f'{piece} %e{i}' for i in order)}), dimensions={{0}}")
    dist = f"HloModule db_dist\n\nENTRY %main (x: {lx}, w: {ws}) -> {t}[{rows},{n}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0},
                                        {"baseline": 1, "distributed": 1, "relation": "duplicate"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    return Program("dotblock", f"{t} x[{rows},{k}] W[{k},{cols}], defect {defect} (groups {groups})", base, dist, rel)

FAMILIES: dict[str, Callable[[random.Random], Program]] = {
    "rankpos": rankpos,
    "argreduce": argreduce,
    "permute": permute,
    "padded": padded,
    "collectives": collectives,
    "vocab": vocab,
    "window": window,
    "neutral": neutral,
    "onehot": onehot,
    "a2adup": a2adup,
    "microbatch": microbatch,
    "clampgather": clampgather,
    "ringrun": ringrun,
    "fsdpslice": fsdpslice,
    "jaxargreduce": jaxargreduce,
    "selectpartial": selectpartial,
    "labelmove": labelmove,
    "expertlist": expertlist,
    "modgroup": modgroup,
    "fillbcast": fillbcast,
    "scancarry": scancarry,
    "a2astack": a2astack,
    "packedar": packedar,
    "dotblock": dotblock,
}


def generate(family: str, count: int, seed: int) -> list[Program]:
    """``count`` programs of ``family``. In a program of several groups (a data x tensor mesh),
    most draws say the groups hold different data (``per_group_data`` on every input with a
    baseline value, as the JAX front end writes for a batch split over the data axis): then a
    program that mixes the groups computes something else, and the witness can see it."""
    rng = random.Random(f"{family}:{seed}")
    out = []
    for _ in range(count):
        p = FAMILIES[family](rng)
        if len(p.relations["groups"]) > 1 and rng.random() < 0.7:
            for entry in p.relations["inputs"]:
                # (a gathered input holds one value across its gathered groups: never per group)
                if "baseline" in entry and "gathered" not in entry:
                    entry["per_group_data"] = True
            p.form += ", per-group data"
        out.append(p)
    return out


# ---- reductions over microbatch blocks (rules/microbatch.egg: mbp / mbacc) ----------------------


def mbreduce(rng: random.Random) -> Program:
    """The loss and the weight gradient of a batch cut into n microbatches (literal slices of a
    duplicate along d): each block reduced (a reduce(add) over dims containing d, a mean: the
    block's sum divided by its size and then by n, or a dot contracting d with a second input
    cut the same way), the blocks' results summed in a drawn order. Drawn: the element type
    (narrow, unsigned, float), n, the block size, d, the form, the order of the adds, and the
    side conditions: a block left out, one block counted twice, the mean not divided by n,
    a reduce started from one, a slice off by one, one block cut along the other dim."""
    groups = _layout(rng)
    form = rng.choice(["reduce", "mean", "dot"])
    t = rng.choice(["f32", "bf16"]) if form == "mean" else rng.choice(["f32", "bf16", "s32", "s8", "u16"])
    n, b, h = rng.choice([2, 3, 4]), rng.choice([1, 2]), rng.choice([2, 3])
    d = rng.choice([0, 1]) if form != "dot" else 0
    o = 1 - d
    dims = [n * b, h] if d == 0 else [h, n * b]
    defect = rng.choice(["none"] * 6 + ["missing", "twice", "unscaled", "init", "offset", "otherdim"])
    if defect == "unscaled" and form != "mean":
        defect = "none"
    if defect == "otherdim" and (form == "dot" or dims[o] % n or dims[o] // n != b or dims[o] != dims[d]):
        defect = "none"  # another dim cut into the same block shape: only for square operands
    order = list(range(n))
    rng.shuffle(order)
    if defect == "missing":
        order = order[:-1]
    if defect == "twice":
        order[-1] = order[0]

    def text(dd: list[int]) -> str:
        return f"{t}[{','.join(map(str, dd))}]"

    out = f"{t}[{h},{h}]" if form == "dot" else f"{t}[]"
    head = [f"  %x = {text(dims)} parameter(0)", f"  %y = {text(dims)} parameter(1)", f"  %zero = {t}[] constant(0)"]
    params = f"x: {text(dims)}, y: {text(dims)}"
    sq = f"  %sq = {text(dims)} multiply({text(dims)} %x, {text(dims)} %y)"
    if form == "dot":
        bl = [f"  %r = {out} dot({text(dims)} %x, {text(dims)} %y), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}"]
    else:
        bl = [sq, f"  %r = {t}[] reduce({text(dims)} %sq, {t}[] %zero), dimensions={{0,1}}, to_apply=%sum"]
        if form == "mean":
            bl += [f"  %cnt = {t}[] constant({n * b * h})", f"  %r2 = {t}[] divide({t}[] %r, {t}[] %cnt)"]
    last = "r2" if form == "mean" else "r"
    base = f"HloModule mbr_base\n\n{_reducer('sum', 'add', t)}\nENTRY %main ({params}) -> {out} {{\n" + "\n".join([*head, *bl]) + f"\n  ROOT %out = {out} copy({out} %{last})\n}}\n"
    dl = list(head)
    if defect == "init":
        dl.append(f"  %one = {t}[] constant(1)")
    parts = []
    for i, e in enumerate(order):
        cut = o if defect == "otherdim" and i == 0 else d
        start = e * b + (1 if defect == "offset" and i == 0 and e < n - 1 else 0)
        sl = ", ".join(f"[{start}:{start + b}]" if k == cut else f"[0:{dims[k]}]" for k in range(2))
        blk = [b, h] if cut == 0 else [h, b]
        dl += [f"  %x{i} = {text(blk)} slice({text(dims)} %x), slice={{{sl}}}", f"  %y{i} = {text(blk)} slice({text(dims)} %y), slice={{{sl}}}"]
        if form == "dot":
            dl.append(f"  %p{i} = {out} dot({text(blk)} %x{i}, {text(blk)} %y{i}), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}")
        else:
            init = "one" if defect == "init" and i == 0 else "zero"
            dl += [f"  %s{i}q = {text(blk)} multiply({text(blk)} %x{i}, {text(blk)} %y{i})",
                   f"  %p{i} = {t}[] reduce({text(blk)} %s{i}q, {t}[] %{init}), dimensions={{0,1}}, to_apply=%sum"]
            if form == "mean":
                dl += [f"  %c{i} = {t}[] constant({b * h})", f"  %m{i} = {t}[] divide({t}[] %p{i}, {t}[] %c{i})"]
                if defect != "unscaled":
                    dl += [f"  %n{i} = {t}[] constant({n})", f"  %l{i} = {t}[] divide({t}[] %m{i}, {t}[] %n{i})"]
                parts.append(f"m{i}" if defect == "unscaled" else f"l{i}")
                continue
        parts.append(f"p{i}")
    acc = parts[0]
    for i, p in enumerate(parts[1:]):
        dl.append(f"  %acc{i} = {out} add({out} %{acc}, {out} %{p})")
        acc = f"acc{i}"
    dist = f"HloModule mbr_dist\n\n{_reducer('sum', 'add', t)}\nENTRY %main ({params}) -> {out} {{\n" + "\n".join(dl) + f"\n  ROOT %out = {out} copy({out} %{acc})\n}}\n"
    rel = {"groups": groups, "inputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in range(2)],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    desc = f"{form} of {t}{dims} over {n} blocks of {b} along {d}, adds in order {order}, defect {defect}"
    return Program("mbreduce", desc, base, dist, rel)


FAMILIES["mbreduce"] = mbreduce


# ---- cross entropy under loss_parallel (rules/crossentropy.egg, section e) ---------------------


def crossentropy(rng: random.Random) -> Program:
    """torch's nll_loss over the whole vocabulary (torch-xla's one-hot form: the sum over both
    dims of (-oh·x)·(w·oh), w = (t != ignore_index), divided by the sum of w·oh; or the per-row
    one-hot sums) against DTensor's loss_parallel (labels made safe, compared with the rank's
    bounds r·w and r·w + w, shifted, picked by a gather of (row, shift) pairs, masked, summed
    over the ranks by an all-reduce, negated, ignored labels zeroed, summed and divided by the
    count of kept labels). Drawn: the label type, the float type, the labels' declared range
    (inside [0, V) or not), ignore_index (outside the range or inside it), labels padded with it
    (ignored rows present) or not, sum / mean / per-row,
    the groups, and a defect: the offset of the next rank or a width off by one, the all-reduce
    dropped or over other groups, the mean over the rank's own labels or over all n tokens,
    the negation dropped, the ignored rows not zeroed, the ranks padding with 0."""
    groups = _layout(rng)
    c = len(groups[0])
    n = rng.choice([4, 6, 8])
    ti = rng.choice(["s8", "s16", "s32", "s64"])
    w = rng.choice([3, 8, 16]) if ti != "s8" else rng.choice([3, 8])
    v = c * w
    ft = rng.choice(["f32", "f32", "f16", "bf16"])
    form = rng.choice(["mean", "mean", "sum", "none"])
    lo, hi = rng.choice([(0, v)] * 5 + [(0, v + 1), (-1, v), (0, 2 * v)])
    ig = -100 if rng.random() < 0.8 else rng.choice([0, v - 1])
    # ignored labels: the labels of n - 1 tokens padded with ig (transformers' shifted labels)
    padded = rng.random() < 0.4
    defect = rng.choice(["none"] * 6 + ["offset_next", "width_minus", "no_all_reduce", "other_groups", "local_count", "count_all", "no_negate"]
                        + (["unmasked", "pad_zero"] if padded else []))
    ar_groups = _other_groups(rng, groups) if defect == "other_groups" else groups

    tin = f"{ti}[{n - 1}]" if padded else f"{ti}[{n}]"

    def labels(pad_value: int) -> list[str]:
        if not padded:
            return [f"  %t = {ti}[{n}] parameter({{t}})"]
        return [f"  %t0 = {ti}[{n - 1}] parameter({{t}})", f"  %pv = {ti}[] constant({pad_value})",
                f"  %t = {ti}[{n}] pad({ti}[{n - 1}] %t0, {ti}[] %pv), padding=0_1"]

    base = [line.format(t=0) for line in labels(ig)] + [f"  %x = {ft}[{n},{v}] parameter(1)",
            f"  %tb = {ti}[{n},{v}] broadcast({ti}[{n}] %t), dimensions={{0}}",
            f"  %io = {ti}[1,{v}] iota(), iota_dimension=1", f"  %ior = {ti}[{v}] reshape({ti}[1,{v}] %io)",
            f"  %iob = {ti}[{n},{v}] broadcast({ti}[{v}] %ior), dimensions={{1}}",
            f"  %eq = pred[{n},{v}] compare({ti}[{n},{v}] %tb, {ti}[{n},{v}] %iob), direction=EQ",
            f"  %one = {ft}[] constant(1)", f"  %ones = {ft}[{n},{v}] broadcast({ft}[] %one), dimensions={{}}",
            f"  %zero = {ft}[] constant(0)", f"  %zeros = {ft}[{n},{v}] broadcast({ft}[] %zero), dimensions={{}}",
            f"  %oh = {ft}[{n},{v}] select(pred[{n},{v}] %eq, {ft}[{n},{v}] %ones, {ft}[{n},{v}] %zeros)",
            f"  %ne1 = pred[{n},{v}] compare({ft}[{n},{v}] %oh, {ft}[{n},{v}] %ones), direction=NE",
            f"  %noh = {ft}[{n},{v}] negate({ft}[{n},{v}] %oh)",
            f"  %prod = {ft}[{n},{v}] multiply({ft}[{n},{v}] %noh, {ft}[{n},{v}] %x)",
            f"  %s = {ft}[{n},{v}] select(pred[{n},{v}] %ne1, {ft}[{n},{v}] %zeros, {ft}[{n},{v}] %prod)",
            f"  %ig = {ti}[] constant({ig})", f"  %igb = {ti}[{n}] broadcast({ti}[] %ig), dimensions={{}}",
            f"  %keep = pred[{n}] compare({ti}[{n}] %t, {ti}[{n}] %igb), direction=NE"]
    if form == "none":
        base += [f"  %row = {ft}[{n}] reduce({ft}[{n},{v}] %s, {ft}[] %zero), dimensions={{1}}, to_apply=%add",
                 f"  %zn = {ft}[{n}] broadcast({ft}[] %zero), dimensions={{}}",
                 f"  ROOT %loss = {ft}[{n}] select(pred[{n}] %keep, {ft}[{n}] %row, {ft}[{n}] %zn)"]
    else:
        base += [f"  %keepb = pred[{n},{v}] broadcast(pred[{n}] %keep), dimensions={{0}}",
                 f"  %w = {ft}[{n},{v}] select(pred[{n},{v}] %keepb, {ft}[{n},{v}] %ones, {ft}[{n},{v}] %zeros)",
                 f"  %m = {ft}[{n},{v}] multiply({ft}[{n},{v}] %w, {ft}[{n},{v}] %oh)",
                 f"  %sm = {ft}[{n},{v}] multiply({ft}[{n},{v}] %s, {ft}[{n},{v}] %m)",
                 f"  %num = {ft}[] reduce({ft}[{n},{v}] %sm, {ft}[] %zero), dimensions={{0,1}}, to_apply=%add"]
        if form == "mean":
            base += [f"  %den = {ft}[] reduce({ft}[{n},{v}] %m, {ft}[] %zero), dimensions={{0,1}}, to_apply=%add",
                     f"  ROOT %loss = {ft}[] divide({ft}[] %num, {ft}[] %den)"]
        else:
            base += [f"  ROOT %loss = {ft}[] copy({ft}[] %num)"]
    out_t = f"{ft}[{n}]" if form == "none" else f"{ft}[]"
    baseline = (f"HloModule xent_base\n\n{_reducer('add', 'add', ft)}\nENTRY %main (t: {tin}, x: {ft}[{n},{v}]) -> {out_t} {{\n"
                + "\n".join(base) + "\n}\n")

    wc = w - 1 if defect == "width_minus" else w
    d = ["  %r = s32[] parameter(0)", *(line.format(t=1) for line in labels(0 if defect == "pad_zero" else ig)), f"  %x = {ft}[{n},{w}] parameter(2)",
         f"  %ig = {ti}[] constant({ig})", f"  %igb = {ti}[{n}] broadcast({ti}[] %ig), dimensions={{}}",
         f"  %keep = pred[{n}] compare({ti}[{n}] %t, {ti}[{n}] %igb), direction=NE",
         f"  %zt = {ti}[] constant(0)", f"  %ztb = {ti}[{n}] broadcast({ti}[] %zt), dimensions={{}}",
         f"  %safe = {ti}[{n}] select(pred[{n}] %keep, {ti}[{n}] %t, {ti}[{n}] %ztb)",
         f"  %safe2 = {ti}[{n},1] reshape({ti}[{n}] %safe)",
         f"  %wc = s32[] constant({wc})", "  %off0 = s32[] multiply(s32[] %r, s32[] %wc)"]
    d.append("  %off32 = s32[] add(s32[] %off0, s32[] %wc)" if defect == "offset_next" else "  %off32 = s32[] copy(s32[] %off0)")
    d += [f"  %off = {ti}[] convert(s32[] %off32)" if ti != "s32" else "  %off = s32[] copy(s32[] %off32)",
          f"  %offb = {ti}[{n},1] broadcast({ti}[] %off), dimensions={{}}",
          f"  %wl = {ti}[] constant({w})", f"  %end = {ti}[] add({ti}[] %off, {ti}[] %wl)",
          f"  %endb = {ti}[{n},1] broadcast({ti}[] %end), dimensions={{}}",
          f"  %b0 = pred[{n},1] compare({ti}[{n},1] %safe2, {ti}[{n},1] %offb), direction=LT",
          f"  %bw = pred[{n},1] compare({ti}[{n},1] %safe2, {ti}[{n},1] %endb), direction=GE",
          f"  %mask = pred[{n},1] or(pred[{n},1] %b0, pred[{n},1] %bw)",
          f"  %sh = {ti}[{n},1] subtract({ti}[{n},1] %safe2, {ti}[{n},1] %offb)",
          f"  %zb = {ti}[{n},1] broadcast({ti}[] %zt), dimensions={{}}",
          f"  %idx = {ti}[{n},1] select(pred[{n},1] %mask, {ti}[{n},1] %zb, {ti}[{n},1] %sh)",
          f"  %idxu = u32[{n},1] convert({ti}[{n},1] %idx)", f"  %idx3 = u32[{n},1,1] reshape(u32[{n},1] %idxu)",
          f"  %rows = u32[{n},1,1] iota(), iota_dimension=0",
          f"  %pairs = u32[{n},1,2] concatenate(u32[{n},1,1] %rows, u32[{n},1,1] %idx3), dimensions={{2}}",
          f"  %g = {ft}[{n},1] gather({ft}[{n},{w}] %x, u32[{n},1,2] %pairs), offset_dims={{}}, collapsed_slice_dims={{0,1}}, start_index_map={{0,1}}, index_vector_dim=2, slice_sizes={{1,1}}",
          f"  %fz = {ft}[] constant(0)", f"  %fzb = {ft}[{n},1] broadcast({ft}[] %fz), dimensions={{}}",
          f"  %p = {ft}[{n},1] select(pred[{n},1] %mask, {ft}[{n},1] %fzb, {ft}[{n},1] %g)"]
    d.append(f"  %q = {ft}[{n},1] copy({ft}[{n},1] %p)" if defect == "no_all_reduce" else
             f"  %q = {ft}[{n},1] all-reduce({ft}[{n},1] %p), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add")
    d += [f"  %q1 = {ft}[{n}] reshape({ft}[{n},1] %q)",
          f"  %nq = {ft}[{n}] negate({ft}[{n}] %q1)" if defect != "no_negate" else f"  %nq = {ft}[{n}] copy({ft}[{n}] %q1)",
          f"  %fzn = {ft}[{n}] broadcast({ft}[] %fz), dimensions={{}}",
          f"  %l = {ft}[{n}] select(pred[{n}] %keep, {ft}[{n}] %nq, {ft}[{n}] %fzn)" if defect != "unmasked" else f"  %l = {ft}[{n}] copy({ft}[{n}] %nq)"]
    if form == "none":
        d.append(f"  ROOT %loss = {ft}[{n}] copy({ft}[{n}] %l)")
    else:
        d.append(f"  %sum = {ft}[] reduce({ft}[{n}] %l, {ft}[] %fz), dimensions={{0}}, to_apply=%add")
        if form == "sum":
            d.append(f"  ROOT %loss = {ft}[] copy({ft}[] %sum)")
        else:
            kept = "%keep"
            if defect == "local_count":
                d += [f"  %mr = pred[{n}] reshape(pred[{n},1] %mask)", f"  %nm = pred[{n}] not(pred[{n}] %mr)",
                      f"  %kl = pred[{n}] and(pred[{n}] %keep, pred[{n}] %nm)"]
                kept = "%kl"
            if defect == "count_all":
                d.append(f"  %cntf = {ft}[] constant({n})")
            else:
                d += [f"  %kc = s64[{n}] convert(pred[{n}] {kept})", "  %zi = s64[] constant(0)",
                      f"  %cnt = s64[] reduce(s64[{n}] %kc, s64[] %zi), dimensions={{0}}, to_apply=%addi",
                      f"  %cntf = {ft}[] convert(s64[] %cnt)"]
            d.append(f"  ROOT %loss = {ft}[] divide({ft}[] %sum, {ft}[] %cntf)")
    dist = (f"HloModule xent_dist\n\n{_reducer('add', 'add', ft)}\n{_reducer('addi', 'add', 's64')}\n"
            f"ENTRY %main (r: s32[], t: {tin}, x: {ft}[{n},{w}]) -> {out_t} {{\n" + "\n".join(d) + "\n}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"},
                                        {"baseline": 0, "distributed": 1, "relation": "duplicate", "int_range": [lo, hi]},
                                        {"baseline": 1, "distributed": 2, "relation": "sharded", "dim": 1}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    desc = (f"{form} over n={n} V={v} (c={c}, w={w}) labels {ti} in [{lo}, {hi}){' padded with the ignore index' if padded else ''} ignore {ig}, {ft}, defect {defect}, "
            f"all-reduce over {ar_groups} (groups {groups})")
    return Program("crossentropy", desc, baseline, dist, rel)


FAMILIES["crossentropy"] = crossentropy


def crossentropy_jax(rng: random.Random) -> Program:
    """The label's log-probability picked as JAX writes it on a vocabulary shard: s = t - r·w
    (or the raw labels compared with r·w and r·w + w), in = (s >= 0) & (s < w), idx =
    select(in, s, 0), jnp's negative-index guard, take_along_axis (a gather batched over the
    rows), select(in, picked, 0) and a psum; the baseline's take_along_axis over the whole
    vocabulary. Drawn: the label type, the float type, the labels' range (inside [0, V) or
    not), raw or shifted bounds, the groups, and a defect: the next rank's offset, a width off
    by one, `s > 0` for `s >= 0`, the mask's branches swapped, the psum dropped or over other
    groups."""
    groups = _layout(rng)
    c = len(groups[0])
    n = rng.choice([4, 6, 8])
    ti = rng.choice(["s16", "s32", "s64"] if rng.random() < 0.8 else ["s8"])
    w = rng.choice([3, 8, 16]) if ti != "s8" else rng.choice([3, 8])
    v = c * w
    ft = rng.choice(["f32", "f32", "f16", "bf16"])
    lo, hi = rng.choice([(0, v)] * 5 + [(0, v + 1), (-1, v), (0, 2 * v)])
    raw = rng.random() < 0.4
    defect = rng.choice(["none"] * 6 + ["offset_next", "width_minus", "gt0", "swapped", "no_psum", "other_groups"])
    ar_groups = _other_groups(rng, groups) if defect == "other_groups" else groups
    gather = "offset_dims={}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1}"

    def guard(src: str, width: int, pre: str) -> list[str]:
        return [f"  %{pre}z = {ti}[{n},1] broadcast({ti}[] %zt), dimensions={{}}",
                f"  %{pre}lt = pred[{n},1] compare({ti}[{n},1] {src}, {ti}[{n},1] %{pre}z), direction=LT",
                f"  %{pre}wl = {ti}[] constant({width})", f"  %{pre}wb = {ti}[{n},1] broadcast({ti}[] %{pre}wl), dimensions={{}}",
                f"  %{pre}add = {ti}[{n},1] add({ti}[{n},1] {src}, {ti}[{n},1] %{pre}wb)",
                f"  %{pre}sel = {ti}[{n},1] select(pred[{n},1] %{pre}lt, {ti}[{n},1] %{pre}add, {ti}[{n},1] {src})",
                f"  %{pre}i3 = {ti}[{n},1,1] reshape({ti}[{n},1] %{pre}sel)"]

    base = [f"  %x = {ft}[{n},{v}] parameter(0)", f"  %t = {ti}[{n}] parameter(1)", f"  %zt = {ti}[] constant(0)",
            f"  %t2 = {ti}[{n},1] reshape({ti}[{n}] %t)", *guard("%t2", v, "b"),
            f"  %g = {ft}[{n},1] gather({ft}[{n},{v}] %x, {ti}[{n},1,1] %bi3), {gather}",
            f"  ROOT %z = {ft}[{n}] reshape({ft}[{n},1] %g)"]
    baseline = f"HloModule xj_base\n\nENTRY %main (x: {ft}[{n},{v}], t: {ti}[{n}]) -> {ft}[{n}] {{\n" + "\n".join(base) + "\n}\n"
    wc = w - 1 if defect == "width_minus" else w
    d = ["  %r = s32[] parameter(0)", f"  %x = {ft}[{n},{w}] parameter(1)", f"  %t = {ti}[{n}] parameter(2)", f"  %zt = {ti}[] constant(0)",
         f"  %wc = s32[] constant({wc})", "  %r1 = s32[] constant(1)",
         "  %rr = s32[] add(s32[] %r, s32[] %r1)" if defect == "offset_next" else "  %rr = s32[] copy(s32[] %r)",
         "  %off32 = s32[] multiply(s32[] %rr, s32[] %wc)",
         f"  %off = {ti}[] convert(s32[] %off32)" if ti != "s32" else "  %off = s32[] copy(s32[] %off32)",
         f"  %offb = {ti}[{n}] broadcast({ti}[] %off), dimensions={{}}",
         f"  %s = {ti}[{n}] subtract({ti}[{n}] %t, {ti}[{n}] %offb)",
         f"  %ztb = {ti}[{n}] broadcast({ti}[] %zt), dimensions={{}}", f"  %wl = {ti}[] constant({w})",
         f"  %wlb = {ti}[{n}] broadcast({ti}[] %wl), dimensions={{}}"]
    ge = "GT" if defect == "gt0" else "GE"
    if raw:
        d += [f"  %end = {ti}[] add({ti}[] %off, {ti}[] %wl)", f"  %endb = {ti}[{n}] broadcast({ti}[] %end), dimensions={{}}",
              f"  %ge = pred[{n}] compare({ti}[{n}] %t, {ti}[{n}] %offb), direction={ge}",
              f"  %lt = pred[{n}] compare({ti}[{n}] %t, {ti}[{n}] %endb), direction=LT"]
    else:
        d += [f"  %ge = pred[{n}] compare({ti}[{n}] %s, {ti}[{n}] %ztb), direction={ge}",
              f"  %lt = pred[{n}] compare({ti}[{n}] %s, {ti}[{n}] %wlb), direction=LT"]
    d += [f"  %in = pred[{n}] and(pred[{n}] %ge, pred[{n}] %lt)",
          f"  %idx = {ti}[{n}] select(pred[{n}] %in, {ti}[{n}] %s, {ti}[{n}] %ztb)" if defect != "swapped" else
          f"  %idx = {ti}[{n}] select(pred[{n}] %in, {ti}[{n}] %ztb, {ti}[{n}] %s)",
          f"  %idx2 = {ti}[{n},1] reshape({ti}[{n}] %idx)", *guard("%idx2", w, "d"),
          f"  %g = {ft}[{n},1] gather({ft}[{n},{w}] %x, {ti}[{n},1,1] %di3), {gather}",
          f"  %g1 = {ft}[{n}] reshape({ft}[{n},1] %g)", f"  %fz = {ft}[] constant(0)",
          f"  %fzb = {ft}[{n}] broadcast({ft}[] %fz), dimensions={{}}",
          f"  %p = {ft}[{n}] select(pred[{n}] %in, {ft}[{n}] %g1, {ft}[{n}] %fzb)",
          f"  ROOT %q = {ft}[{n}] copy({ft}[{n}] %p)" if defect == "no_psum" else
          f"  ROOT %q = {ft}[{n}] all-reduce({ft}[{n}] %p), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add"]
    dist = (f"HloModule xj_dist\n\n{_reducer('add', 'add', ft)}\nENTRY %main (r: s32[], x: {ft}[{n},{w}], t: {ti}[{n}]) -> {ft}[{n}] {{\n"
            + "\n".join(d) + "\n}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"},
                                        {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 1},
                                        {"baseline": 1, "distributed": 2, "relation": "duplicate", "int_range": [lo, hi]}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    desc = (f"pick over n={n} V={v} (c={c}, w={w}) labels {ti} in [{lo}, {hi}), {ft}, {'raw' if raw else 'shifted'} bounds, "
            f"defect {defect}, psum over {ar_groups} (groups {groups})")
    return Program("crossentropy_jax", desc, baseline, dist, rel)


FAMILIES["crossentropy_jax"] = crossentropy_jax


# ---- a microbatch block inside a tensor-parallel stage (rules/microbatch.egg: mbsh) -----------


def mbtp(rng: random.Random) -> Program:
    """A PP x TP stage over n microbatches: each block of the batch (literal slices of a
    duplicate) through a column-parallel dot with a sharded bias, a pointwise op, a
    row-parallel dot and an all-reduce(add) over the groups, the blocks concatenated back.
    Drawn: the element type (narrow, unsigned, float), n, the block size, the widths, the
    groups, and the side conditions: the all-reduce missing or over other groups, two blocks
    joined out of order, the bias taken whole instead of the rank's block."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "s32", "s8", "u16"])
    n, b, h, w = rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([2, 3]), 2  # w 1: the normalizer rewrites a size-1 contraction
    ff = c * w
    defect = rng.choice(["none"] * 5 + ["no_allreduce", "other_groups", "order"])
    ar_groups = _other_groups(rng, groups) if defect == "other_groups" else groups
    order = list(range(n))
    if defect == "order":
        order[0], order[1] = order[1], order[0]
    act = "tanh" if t == "f32" else "negate"

    def block(p: str, rows: int, cols: int, src: str) -> list[str]:
        x, a, v = f"{t}[{rows},{h}]", f"{t}[{rows},{cols}]", f"{t}[{cols}]"
        return [f"  %{p}a = {a} dot({x} %{src}, {t}[{h},{cols}] %w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}",
                f"  %{p}vb = {a} broadcast({v} %v), dimensions={{1}}",
                f"  %{p}s = {a} add({a} %{p}a, {a} %{p}vb)",
                f"  %{p}t = {a} {act}({a} %{p}s)",
                f"  %{p}z = {t}[{rows},{h}] dot({a} %{p}t, {t}[{cols},{h}] %w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"]

    red = _reducer("sum", "add", t)
    rows = n * b
    bparams = f"x: {t}[{rows},{h}], w1: {t}[{h},{ff}], v: {t}[{ff}], w2: {t}[{ff},{h}]"
    bhead = [f"  %x = {t}[{rows},{h}] parameter(0)", f"  %w1 = {t}[{h},{ff}] parameter(1)", f"  %v = {t}[{ff}] parameter(2)", f"  %w2 = {t}[{ff},{h}] parameter(3)"]
    base = f"HloModule mbtp_base\n\n{red}\nENTRY %main ({bparams}) -> {t}[{rows},{h}] {{\n" + "\n".join([*bhead, *block("b", rows, ff, "x")]) + f"\n  ROOT %out = {t}[{rows},{h}] copy({t}[{rows},{h}] %bz)\n}}\n"
    dparams = f"x: {t}[{rows},{h}], w1: {t}[{h},{w}], v: {t}[{w}], w2: {t}[{w},{h}]"
    dl = [f"  %x = {t}[{rows},{h}] parameter(0)", f"  %w1 = {t}[{h},{w}] parameter(1)", f"  %v = {t}[{w}] parameter(2)", f"  %w2 = {t}[{w},{h}] parameter(3)"]
    outs = []
    for i, e in enumerate(order):
        dl.append(f"  %x{i} = {t}[{b},{h}] slice({t}[{rows},{h}] %x), slice={{[{e * b}:{e * b + b}], [0:{h}]}}")
        dl += block(f"m{i}", b, w, f"x{i}")
        if defect == "no_allreduce":
            outs.append(f"m{i}z")
            continue
        dl.append(f"  %r{i} = {t}[{b},{h}] all-reduce({t}[{b},{h}] %m{i}z), channel_id={i + 1}, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%sum")
        outs.append(f"r{i}")
    ops = ", ".join(f"{t}[{b},{h}] %{o}" for o in outs)
    dl.append(f"  %cat = {t}[{rows},{h}] concatenate({ops}), dimensions={{0}}")
    dist = f"HloModule mbtp_dist\n\n{red}\nENTRY %main ({dparams}) -> {t}[{rows},{h}] {{\n" + "\n".join(dl) + f"\n  ROOT %out = {t}[{rows},{h}] copy({t}[{rows},{h}] %cat)\n}}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"},
                                        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 1},
                                        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 0},
                                        {"baseline": 3, "distributed": 3, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{n} microbatches of {b} of {t}[{rows},{h}], ffn {ff} over {c} ranks, groups {groups}, order {order}, defect {defect}"
    return Program("mbtp", form, base, dist, rel)


FAMILIES["mbtp"] = mbtp


# ---- vocab-parallel argmax from gathered (extreme, id) pairs (rules/argranks.egg) -----------------


def argranks(rng: random.Random) -> Program:
    """A vocab-parallel argmax (argmin) as torch writes greedy decoding over sharded logits: each
    rank's block extreme and the global id of its first extreme, taken from its id table
    arange(w) + r*w (broadcast over the rows) by a take-along-row gather; both all-gathered along
    a new column; the id at the arg-reduce of the gathered extremes. Drawn: the id type (narrow and
    unsigned: ids that wrap), the local and gather index types, the offset stride (w or off by
    one), the groups of each all-gather, the final arg-reduce's op; the baseline's arg-reduce
    converted to the id type."""
    groups = _layout(rng)
    c = len(groups[0])
    rows = rng.choice([1, 2, 3])
    w = rng.choice([3, 8, 40, 100])
    n = c * w
    op = rng.choice(["max", "min"])
    direction = rng.choice(["GE", "GT"] if op == "max" else ["LE", "LT"])
    red = "maximum" if op == "max" else "minimum"
    tb = rng.choice(["s32", "s64", "u16"])
    td = rng.choice(["s32", "s64", "u8", "s16"])
    to = rng.choice(["s64", "s32", "u8", "s8", "u16"])
    ix = rng.choice(["u32", "s32", "s64"])
    stride = w if rng.random() < 0.6 else rng.choice([w + 1, w - 1])
    vgroups = groups if rng.random() < 0.85 else _other_groups(rng, groups)
    igroups = groups if rng.random() < 0.85 else _other_groups(rng, groups)
    op2 = op if rng.random() < 0.85 else ("min" if op == "max" else "max")
    dir2 = rng.choice(["GE", "GT"] if op2 == "max" else ["LE", "LT"])
    init_v = "-inf" if op == "max" else "inf"
    init_2 = "-inf" if op2 == "max" else "inf"
    sh, shl, shc = f"{rows},{n}", f"{rows},{w}", f"{rows},{c}"

    def conv(src: str, frm: str, t: str, shape: str, name: str) -> str:
        return f"  %{name} = {t}[{shape}] {'convert' if frm != t else 'copy'}({frm}[{shape}] {src})\n"

    base = ("HloModule argranks_base\n\n" + _argcombine("comb", "f32", tb, direction) + f"\nENTRY %main (x: f32[{sh}]) -> {to}[{rows}] {{\n  %x = f32[{sh}] parameter(0)\n"
            f"  %io = {tb}[{sh}] iota(), iota_dimension=1\n  %iv = f32[] constant({init_v})\n  %ii = {tb}[] constant(0)\n"
            f"  %ar = (f32[{rows}], {tb}[{rows}]) reduce(f32[{sh}] %x, {tb}[{sh}] %io, f32[] %iv, {tb}[] %ii), dimensions={{1}}, to_apply=%comb\n"
            f"  %idx = {tb}[{rows}] get-tuple-element((f32[{rows}], {tb}[{rows}]) %ar), index=1\n" + conv("%idx", tb, to, str(rows), "out").replace("%out =", "ROOT %out =") + "}\n")
    take = "offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1}"
    dist = ("HloModule argranks_dist\n\n" + _reducer("ext", red, "f32") + _argcombine("comb", "f32", td, direction) + _argcombine("comb2", "f32", "s32", dir2)
            + f"\nENTRY %main (r: s32[], x: f32[{shl}]) -> {to}[{rows}] {{\n  %r = s32[] parameter(0)\n  %x = f32[{shl}] parameter(1)\n"
            f"  %iv = f32[] constant({init_v})\n  %m = f32[{rows}] reduce(f32[{shl}] %x, f32[] %iv), dimensions={{1}}, to_apply=%ext\n"
            f"  %m1 = f32[{rows},1] reshape(f32[{rows}] %m)\n"
            f"  %io = {td}[{shl}] iota(), iota_dimension=1\n  %ii = {td}[] constant(0)\n"
            f"  %ar = (f32[{rows}], {td}[{rows}]) reduce(f32[{shl}] %x, {td}[{shl}] %io, f32[] %iv, {td}[] %ii), dimensions={{1}}, to_apply=%comb\n"
            f"  %li = {td}[{rows}] get-tuple-element((f32[{rows}], {td}[{rows}]) %ar), index=1\n" + conv("%li", td, ix, str(rows), "lic")
            + f"  %li3 = {ix}[{rows},1,1] reshape({ix}[{rows}] %lic)\n  %rows = {ix}[{rows},1,1] iota(), iota_dimension=0\n"
            f"  %cat = {ix}[{rows},1,2] concatenate({ix}[{rows},1,1] %rows, {ix}[{rows},1,1] %li3), dimensions={{2}}\n"
            f"  %ar0 = {to}[{w}] iota(), iota_dimension=0\n" + conv("%r", "s32", to, "", "rc")
            + f"  %wo = {to}[] constant({stride})\n  %off = {to}[] multiply({to}[] %rc, {to}[] %wo)\n"
            f"  %offb = {to}[{w}] broadcast({to}[] %off), dimensions={{}}\n  %tab1 = {to}[{w}] add({to}[{w}] %ar0, {to}[{w}] %offb)\n"
            f"  %tab = {to}[{shl}] broadcast({to}[{w}] %tab1), dimensions={{1}}\n"
            f"  %gid = {to}[{rows},1] gather({to}[{shl}] %tab, {ix}[{rows},1,2] %cat), {take}\n"
            f"  %G = f32[{shc}] all-gather(f32[{rows},1] %m1), channel_id=1, replica_groups={_groups_text(vgroups)}, use_global_device_ids=true, dimensions={{1}}\n"
            f"  %I = {to}[{shc}] all-gather({to}[{rows},1] %gid), channel_id=2, replica_groups={_groups_text(igroups)}, use_global_device_ids=true, dimensions={{1}}\n"
            f"  %io2 = s32[{shc}] iota(), iota_dimension=1\n  %iv2 = f32[] constant({init_2})\n  %i0 = s32[] constant(0)\n"
            f"  %ar2 = (f32[{rows}], s32[{rows}]) reduce(f32[{shc}] %G, s32[{shc}] %io2, f32[] %iv2, s32[] %i0), dimensions={{1}}, to_apply=%comb2\n"
            f"  %j = s32[{rows}] get-tuple-element((f32[{rows}], s32[{rows}]) %ar2), index=1\n  %j3 = s32[{rows},1,1] reshape(s32[{rows}] %j)\n"
            f"  %rows2 = s32[{rows},1,1] iota(), iota_dimension=0\n  %cat2 = s32[{rows},1,2] concatenate(s32[{rows},1,1] %rows2, s32[{rows},1,1] %j3), dimensions={{2}}\n"
            f"  %pick = {to}[{rows},1] gather({to}[{shc}] %I, s32[{rows},1,2] %cat2), {take}\n"
            f"  ROOT %out = {to}[{rows}] reshape({to}[{rows},1] %pick)\n}}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 1}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = (f"arg{op} n={n} c={c} idx base {tb} local {td} take {ix} ids {to} stride {stride} (w {w}), values over {vgroups}, ids over {igroups},"
            f" combine arg{op2} (groups {groups})")
    return Program("argranks", form, base, dist, rel)


FAMILIES["argranks"] = argranks


# ---- gathers from a duplicate table by sharded indices (rules/gatherbatch.egg) -------------------


def gatherbatch(rng: random.Random) -> Program:
    """An embedding lookup of sharded positions: a gather of rows of a table every rank holds
    whole, by int indices [N, M] sharded along dim di (0 or 1), the result [N, M, H] sharded
    along the same batch dim. Drawn: the table's and the indices' types (narrow and unsigned),
    index values past the table's rows (the clamp acts), groups; defects: the ranks' indices
    shifted by one, the table reversed, the table cut by one row (its clamp differs)."""
    groups = _layout(rng)
    c = len(groups[0])
    te = rng.choice(["f32", "bf16", "s8", "u16", "s32"])
    ti = rng.choice(["s32", "u32", "s64", "u8", "s16"])
    v, h = rng.choice([3, 8, 12]), rng.choice([1, 2, 3])
    di = rng.choice([0, 1])
    n, m = (c * rng.choice([1, 2]), rng.choice([1, 3])) if di == 0 else (rng.choice([1, 2]), c * rng.choice([1, 3]))
    nl, ml = (n // c, m) if di == 0 else (n, m // c)
    defect = rng.choice(["none"] * 5 + ["shift", "reverse", "cut"])
    hi = v + rng.choice([0, 0, 2])
    form = "offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2"

    def prog(name: str, a: int, b: int, body: str, tab: str, vv: int) -> str:
        return (f"HloModule {name}\n\nENTRY %main (e: {te}[{v},{h}], i: {ti}[{a},{b}]) -> {te}[{a},{b},{h}] {{\n  %e = {te}[{v},{h}] parameter(0)\n"
                f"  %i = {ti}[{a},{b}] parameter(1)\n" + body
                + f"  ROOT %g = {te}[{a},{b},{h}] gather({te}[{vv},{h}] {tab}, {ti}[{a},{b}] %ix), {form}, slice_sizes={{1,{h}}}\n}}\n")

    base = prog("gatherbatch_base", n, m, "  %ix = " + f"{ti}[{n},{m}] copy({ti}[{n},{m}] %i)\n", "%e", v)
    body, tab, vv = f"  %ix = {ti}[{nl},{ml}] copy({ti}[{nl},{ml}] %i)\n", "%e", v
    if defect == "shift":
        body = f"  %one = {ti}[] constant(1)\n  %ones = {ti}[{nl},{ml}] broadcast({ti}[] %one), dimensions={{}}\n  %ix = {ti}[{nl},{ml}] add({ti}[{nl},{ml}] %i, {ti}[{nl},{ml}] %ones)\n"
    elif defect == "reverse":
        body += f"  %er = {te}[{v},{h}] reverse({te}[{v},{h}] %e), dimensions={{0}}\n"
        tab = "%er"
    elif defect == "cut":
        body += f"  %ec = {te}[{v - 1},{h}] slice({te}[{v},{h}] %e), slice={{[0:{v - 1}], [0:{h}]}}\n"
        tab, vv = "%ec", v - 1
    dist = prog("gatherbatch_dist", nl, ml, body, tab, vv)
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"},
                                        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": di, "int_range": [0, hi]}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": di}]}
    return Program("gatherbatch", f"table {te}[{v},{h}] ids {ti}[{n},{m}] in [0, {hi}) sharded dim {di}, defect {defect} (groups {groups})", base, dist, rel)


FAMILIES["gatherbatch"] = gatherbatch


# ---- labelmove from the blocks form to baseline moves (rules/labelmove.egg lmsst) ---------------


def labelmove_moved(rng: random.Random) -> Program:
    """DeepSpeed Ulysses' 5-D spelling: x [B, S, H*D] sharded along the sequence, flattened to
    [B*S, H*D] before a pointwise op (so the rank's rows are a blocks-form piece of the
    baseline's), split into [B, S/c, c, H/c, D], the group axis moved first, exchanged
    (all-to-all along 0), moved back and merged to [B, S, H/c, D], then transposed to
    [B, H/c, S, D]: block r along the heads of the baseline's own reshape + transpose of its
    flattened tensor. Drawn: the element type, B, the groups; defects: the post-exchange permute
    interleaving the sequence, the all-to-all over other groups, the final transpose left out."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s8", "s32"])
    bb, s, h, d = rng.choice([1, 2]), 2 * c, 2 * c, rng.choice([1, 2])
    sl, hl = s // c, h // c
    defect = rng.choice(["none"] * 5 + ["interleave", "groups", "notranspose"])
    a2a_groups = _other_groups(rng, groups) if defect == "groups" else groups
    back = (1, 2, 0, 3, 4) if defect == "interleave" else (1, 0, 2, 3, 4)

    def ty(dims: list[int]) -> str:
        return f"{t}[{','.join(map(str, dims))}]"

    base = (f"HloModule lmm_base\n\nENTRY %main (x: {ty([bb, s, h * d])}) -> {ty([bb, h, s, d])} {{\n  %x = {ty([bb, s, h * d])} parameter(0)\n"
            f"  %f = {ty([bb * s, h * d])} reshape({ty([bb, s, h * d])} %x)\n  %n = {ty([bb * s, h * d])} negate({ty([bb * s, h * d])} %f)\n"
            f"  %r = {ty([bb, s, h, d])} reshape({ty([bb * s, h * d])} %n)\n"
            f"  ROOT %o = {ty([bb, h, s, d])} transpose({ty([bb, s, h, d])} %r), dimensions={{0,2,1,3}}\n}}\n")
    a, b = [bb, sl, c, hl, d], [c, bb, sl, hl, d]
    e = [b[i] for i in back]
    last = (f"  ROOT %o = {ty([bb, hl, s, d])} transpose({ty([bb, s, hl, d])} %m), dimensions={{0,2,1,3}}\n" if defect != "notranspose"
            else f"  ROOT %o = {ty([bb, hl, s, d])} reshape({ty([bb, s, hl, d])} %m)\n")
    dist = (f"HloModule lmm_dist\n\nENTRY %main (x: {ty([bb, sl, h * d])}) -> {ty([bb, hl, s, d])} {{\n  %x = {ty([bb, sl, h * d])} parameter(0)\n"
            f"  %f = {ty([bb * sl, h * d])} reshape({ty([bb, sl, h * d])} %x)\n  %n = {ty([bb * sl, h * d])} negate({ty([bb * sl, h * d])} %f)\n"
            f"  %a = {ty(a)} reshape({ty([bb * sl, h * d])} %n)\n  %b = {ty(b)} transpose({ty(a)} %a), dimensions={{2,0,1,3,4}}\n"
            f"  %x2 = {ty(b)} all-to-all({ty(b)} %b), channel_id=1, replica_groups={_groups_text(a2a_groups)}, dimensions={{0}}\n"
            f"  %e = {ty(e)} transpose({ty(b)} %x2), dimensions={{{','.join(map(str, back))}}}\n"
            f"  %m = {ty([bb, s, hl, d])} reshape({ty(e)} %e)\n" + last + "}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    return Program("labelmove_moved", f"{t} B={bb} S={s} H={h} D={d}, defect {defect}, all-to-all over {a2a_groups} (groups {groups})", base, dist, rel)


FAMILIES["labelmove_moved"] = labelmove_moved


# ---- ring blocks meeting a fill, unit-dim reshapes of a ring max (rules/ringfill.egg) -----------


def ringfill(rng: random.Random) -> Program:
    """Ring attention's scores and running max: q stays, k travels round the ring; each step's
    score block q . k^T is scaled by a scalar fill (multiply/divide/add, either order) or masked
    by select(compare(s, fill), s, fill) (either branch), reduced by max along the key dim,
    reshaped to [rows, 1] (JAX's keepdims), combined by maximum, and reshaped back. Drawn: the
    element type (f32, bf16, s32 with wrap), the op, the pairs (shift within every group or
    not), the number of steps, the groups; defects: the last step's fill another value, the running max
    kept as [1, rows] and its rows reversed at the end."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32"])
    s, d = 2 * c, 2
    sl = s // c
    form = rng.choice(["multiply", "divide", "add", "select"]) if t != "s32" else rng.choice(["multiply", "add", "select"])
    fill_first = rng.random() < 0.3 and form != "divide"
    # (a select's fill below the typical score: the kept scores decide the max, not the fill)
    v = ("3" if t == "s32" else "2.5") if form != "select" else ("-3" if t == "s32" else "-0.5")
    defect = rng.choice(["none"] * 5 + ["fill", "order"])
    vd = ("5" if t == "s32" else "0.75") if defect == "fill" else v
    steps = c if rng.random() < 0.7 else max(1, c - 1)
    pairs, what = _pairs(rng, groups)
    lo = _identity("maximum", t)

    def scored(pre: str, x: str, n: int, val: str) -> str:
        sh = f"{t}[{n},{n}]"
        text = f"  %{pre}c = {t}[] constant({val})\n  %{pre}b = {sh} broadcast({t}[] %{pre}c), dimensions={{}}\n"
        if form == "select":
            text += f"  %{pre}m = pred[{n},{n}] compare({sh} {x}, {sh} %{pre}b), direction=GT\n"
            ops = (f"%{pre}b", x) if fill_first else (x, f"%{pre}b")
            return text + f"  %{pre}f = {sh} select(pred[{n},{n}] %{pre}m, {sh} {ops[0]}, {sh} {ops[1]})\n"
        ops = (f"%{pre}b", x) if fill_first else (x, f"%{pre}b")
        return text + f"  %{pre}f = {sh} {form}({sh} {ops[0]}, {sh} {ops[1]})\n"

    base = ("HloModule rf_base\n\n" + _reducer("mx", "maximum", t) + f"\nENTRY %main (q: {t}[{s},{d}], k: {t}[{s},{d}]) -> {t}[{s}] {{\n"
            f"  %q = {t}[{s},{d}] parameter(0)\n  %k = {t}[{s},{d}] parameter(1)\n"
            f"  %s = {t}[{s},{s}] dot({t}[{s},{d}] %q, {t}[{s},{d}] %k), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}\n"
            + scored("", "%s", s, v) + f"  %lo = {t}[] constant({lo})\n"
            f"  ROOT %out = {t}[{s}] reduce({t}[{s},{s}] %f, {t}[] %lo), dimensions={{1}}, to_apply=%mx\n}}\n")
    body = [f"  %lo = {t}[] constant({lo})\n"]
    kv, acc = "%k", ""
    for j in range(steps):
        if j:
            body.append(f"  %k{j} = {t}[{sl},{d}] collective-permute({t}[{sl},{d}] {kv}), channel_id={j}, source_target_pairs={_pairs_text(pairs)}\n")
            kv = f"%k{j}"
        body.append(f"  %sc{j} = {t}[{sl},{sl}] dot({t}[{sl},{d}] %q, {t}[{sl},{d}] {kv}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}\n")
        body.append(scored(f"p{j}", f"%sc{j}", sl, vd if j == steps - 1 else v))
        body.append(f"  %r{j} = {t}[{sl}] reduce({t}[{sl},{sl}] %p{j}f, {t}[] %lo), dimensions={{1}}, to_apply=%mx\n")
        if defect == "order":
            body.append(f"  %un{j} = {t}[1,{sl}] reshape({t}[{sl}] %r{j})\n")
            ush = f"{t}[1,{sl}]"
        else:
            body.append(f"  %un{j} = {t}[{sl},1] reshape({t}[{sl}] %r{j})\n")
            ush = f"{t}[{sl},1]"
        if acc:
            body.append(f"  %mx{j} = {ush} maximum({ush} {acc}, {ush} %un{j})\n")
            acc = f"%mx{j}"
        else:
            acc = f"%un{j}"
    if defect == "order":
        body.append(f"  %rs = {t}[{sl}] reshape({ush} {acc})\n  ROOT %o = {t}[{sl}] reverse({t}[{sl}] %rs), dimensions={{0}}\n")
    else:
        body.append(f"  ROOT %o = {t}[{sl}] reshape({ush} {acc})\n")
    dist = ("HloModule rf_dist\n\n" + _reducer("mx", "maximum", t) + f"\nENTRY %main (q: {t}[{sl},{d}], k: {t}[{sl},{d}]) -> {t}[{sl}] {{\n"
            f"  %q = {t}[{sl},{d}] parameter(0)\n  %k = {t}[{sl},{d}] parameter(1)\n" + "".join(body) + "}\n")
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0},
                                        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    return Program("ringfill", f"{t} {form}{' fill first' if fill_first else ''}, {steps} steps of {what}, defect {defect} (groups {groups})", base, dist, rel)


FAMILIES["ringfill"] = ringfill


# ---- a row scaling moved out of a dot, operands swapped (rules/dotscale.egg) ------------------


def dotscale(rng: random.Random) -> Program:
    """Baseline dot(L, E / D) (or dot(E / D, L)) with D one value per row of E, transposed;
    the ranks (sharded along the batch dim) compute dot(E, L) / D and transpose it. Drawn: the
    element type (float, or s32 where division does not distribute), the operand order, the
    extents, the groups, and the defects: D repeated along the contracted dim instead of the
    rows, no division on the ranks, D repeated along the wrong output dim."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "f32", "f64", "s32"])
    m, n = rng.choice([1, 2]), rng.choice([2, 3])
    h, hl = c * m, m
    side = rng.choice(["rhs", "lhs"])
    defect = rng.choice(["none"] * 4 + ["contract", "nodiv", "wrongrow"])
    ls, es, ds = f"{t}[{n},{h},{n}]", f"{t}[{h},{n},{n}]", f"{t}[{h},{n}]"
    bdims = "{0,2}" if defect == "contract" else "{0,1}"
    if side == "rhs":
        dot = (f"  %z = {t}[{h},{n},{n}] dot({ls} %l, {es} %p), lhs_batch_dims={{1}}, lhs_contracting_dims={{0}}, "
               f"rhs_batch_dims={{0}}, rhs_contracting_dims={{2}}\n  ROOT %o = {t}[{n},{h},{n}] transpose({t}[{h},{n},{n}] %z), dimensions={{2,0,1}}\n")
    else:
        dot = (f"  %z = {t}[{h},{n},{n}] dot({es} %p, {ls} %l), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, "
               f"rhs_batch_dims={{1}}, rhs_contracting_dims={{0}}\n  ROOT %o = {t}[{n},{h},{n}] transpose({t}[{h},{n},{n}] %z), dimensions={{1,0,2}}\n")
    base = (f"HloModule ds_base\n\nENTRY %main (l: {ls}, e: {es}, d: {ds}) -> {t}[{n},{h},{n}] {{\n"
            f"  %l = {ls} parameter(0)\n  %e = {es} parameter(1)\n  %d = {ds} parameter(2)\n"
            f"  %b = {es} broadcast({ds} %d), dimensions={bdims}\n  %p = {es} divide({es} %e, {es} %b)\n" + dot + "}\n")
    ll, el, dl = f"{t}[{n},{hl},{n}]", f"{t}[{hl},{n},{n}]", f"{t}[{hl},{n}]"
    lines = [f"  %l = {ll} parameter(0)", f"  %e = {el} parameter(1)", f"  %d = {dl} parameter(2)",
             f"  %w = {el} dot({el} %e, {ll} %l), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{1}}, rhs_contracting_dims={{0}}"]
    if defect == "nodiv":
        y = "%w"
    else:
        wb = "{0,2}" if defect == "wrongrow" else "{0,1}"
        lines += [f"  %b = {el} broadcast({dl} %d), dimensions={wb}", f"  %y = {el} divide({el} %w, {el} %b)"]
        y = "%y"
    lines.append(f"  ROOT %o = {t}[{n},{hl},{n}] transpose({el} {y}), dimensions={{1,0,2}}")
    dist = f"HloModule ds_dist\n\nENTRY %main (l: {ll}, e: {el}, d: {dl}) -> {t}[{n},{hl},{n}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1},
                                        {"baseline": 1, "distributed": 1, "relation": "sharded", "dim": 0},
                                        {"baseline": 2, "distributed": 2, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    return Program("dotscale", f"{t} {side} L[{n},{h},{n}] E[{h},{n},{n}], defect {defect} (groups {groups})", base, dist, rel)


FAMILIES["dotscale"] = dotscale


# ---- a float convert moved through a reduce max/min (rules/convmax.egg) ------------------------


def convmax(rng: random.Random) -> Program:
    """One program takes the max (min) of x in its own type and converts it, the other converts
    x to the other float type and reduces there (either program in either form). Two shapes: the
    reduce along a whole dim (rows sharded), or along the sharded dim itself (a partial extreme,
    all-reduced in the new type over drawn groups: DP x TP included); JAX's keepdims reshape
    between reduce and convert or not. Drawn: the two types (bf16/f16/f32/f64, narrowing and
    widening), the reducer, the groups, and the near misses: the convert moved across a SUM
    (not monotone: the sum rounds in the other type), the reduce started from 0 (no identity of
    max/min), the reduce along the other dim, the convert into s32 (a float->int convert)."""
    groups = _layout(rng)
    c = len(groups[0])
    src, dst = rng.sample(["bf16", "f16", "f32", "f64"], 2)
    op = rng.choice(["maximum", "minimum"])
    defect = rng.choice(["none"] * 4 + ["sum", "init", "dim", "int"])
    if defect == "sum":
        op = "add"
    if defect == "int":
        dst = "s32"
    across = rng.random() < 0.4
    keep = rng.random() < 0.5 and not across
    flip = rng.random() < 0.5 and not across  # the baseline converts the reduce, the ranks reduce converted values
    m, n = rng.choice([1, 2]), 3
    rows = c * m
    red = "mxd" if op != "add" else "sumd"

    def reduce_then_convert(x: str, r: int, k: int, dim: int, init: str) -> list[str]:
        out = r if dim == 1 else k
        lines = [f"  %lo = {src}[] constant({init})",
                 f"  %r = {src}[{out}] reduce({src}[{r},{k}] {x}, {src}[] %lo), dimensions={{{dim}}}, to_apply=%mxs"]
        if keep:  # JAX's keepdims max: reduce, reshape to [rows, 1], then the convert
            lines.append(f"  %u = {src}[{out},1] reshape({src}[{out}] %r)")
            lines.append(f"  %cv = {dst}[{out},1] convert({src}[{out},1] %u)")
        else:
            lines.append(f"  %cv = {dst}[{out}] convert({src}[{out}] %r)")
        return lines

    def convert_then_reduce(x: str, r: int, k: int, dim: int) -> list[str]:
        out = r if dim == 1 else k
        init = _identity(op, dst) if dst != "s32" else ("0" if op == "add" else str(RANGES["s32"][0 if op == "maximum" else 1]))
        lines = [f"  %cx = {dst}[{r},{k}] convert({src}[{r},{k}] {x})", f"  %lo2 = {dst}[] constant({init})",
                 f"  %cr = {dst}[{out}] reduce({dst}[{r},{k}] %cx, {dst}[] %lo2), dimensions={{{dim}}}, to_apply=%{red}"]
        if keep:
            return [*lines, f"  %cv = {dst}[{out},1] reshape({dst}[{out}] %cr)"]
        return [*lines, f"  %cv = {dst}[{out}] copy({dst}[{out}] %cr)"]

    init = "0" if defect in ("init",) or op == "add" else _identity(op, src)
    reducers = _reducer("mxs", op, src) + _reducer(red, op, dst)
    if across:
        # The ranks reduce their block of rows (dim 0, the sharded one), convert, and all-reduce.
        dim = 1 if defect == "dim" else 0
        body = reduce_then_convert("%x", m, n, dim, init)
        outn = n if dim == 0 else m
        body.append(f"  ROOT %o = {dst}[{outn}] all-reduce({dst}[{outn}] %cv), channel_id=1, replica_groups={_groups_text(groups)}, use_global_device_ids=true, to_apply=%{red}")
        base = [*convert_then_reduce("%x", rows, n, 0), f"  ROOT %o = {dst}[{n}] copy({dst}[{n}] %cv)"]
        bout, dout = f"{dst}[{n}]", f"{dst}[{outn}]"
        out_rel: dict[str, Any] = {"baseline": 0, "distributed": 0, "relation": "duplicate"}
    else:
        bdim = 1
        ddim = 0 if defect == "dim" else 1
        if flip:
            base = reduce_then_convert("%x", rows, n, bdim, init)
            body = convert_then_reduce("%x", m, n, ddim)
        else:
            base = convert_then_reduce("%x", rows, n, bdim)
            body = reduce_then_convert("%x", m, n, ddim, init)
        outd = m if ddim == 1 else n
        unit = ",1" if keep else ""
        base.append(f"  ROOT %o = {dst}[{rows}{unit}] copy({dst}[{rows}{unit}] %cv)")
        body.append(f"  ROOT %o = {dst}[{outd}{unit}] copy({dst}[{outd}{unit}] %cv)")
        bout, dout = f"{dst}[{rows}{unit}]", f"{dst}[{outd}{unit}]"
        out_rel = {"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}
    head = f"\nENTRY %main (x: {src}[{{}},{n}]) -> {{}} {{{{\n  %x = {src}[{{}},{n}] parameter(0)\n"
    btext = "HloModule cm_base\n\n" + reducers + head.format(rows, bout, rows) + "\n".join(base) + "\n}\n"
    dtext = "HloModule cm_dist\n\n" + reducers + head.format(m, dout, m) + "\n".join(body) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}], "outputs": [out_rel]}
    where = "across the sharded dim, all-reduced" if across else ("baseline converts the reduce" if flip else "ranks convert the reduce")
    return Program("convmax", f"{src}->{dst} {op} {where}{' keepdims' if keep else ''}, defect {defect} (groups {groups})", btext, dtext, rel)


FAMILIES["convmax"] = convmax


# ---- a reshape undone on the other side (rules/reshapeback.egg) ----------------------------------


def reshapeback(rng: random.Random) -> Program:
    """LayerNorm's rows after a row-parallel all-reduce, as torch-xla writes them: the baseline
    views rows w [N, H] as x [B, S, H] (and its norm views x back as [N, H], a chain the
    normalizer composes to w), the rank all-reduces its partial x and reshapes the result to
    [N, H]. Drawn: the element type (narrow, unsigned, float), B, S, H, the groups (DP x TP
    included), the norm's [1, N, H] view or not; defects: the rank's rows transposed (S, B)
    before the reshape back, reversed, rotated by one row, the all-reduce over other groups."""
    groups = _layout(rng)
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "f16"])
    b, s, h = rng.choice([2, 3]), rng.choice([2, 4]), rng.choice([1, 3, 8])
    n = b * s
    defect = rng.choice(["none"] * 5 + ["transpose", "reverse", "rotate", "groups"])
    xs, ws = f"{t}[{b},{s},{h}]", f"{t}[{n},{h}]"
    view = rng.choice([True, False])
    chain = (f"  %u = {t}[1,{n},{h}] reshape({xs} %x)\n  %y = {ws} reshape({t}[1,{n},{h}] %u)\n" if view
             else f"  %y = {ws} reshape({xs} %x)\n")
    base = (f"HloModule rb_base\n\nENTRY %main (w: {ws}) -> ({xs}, {ws}) {{\n  %w = {ws} parameter(0)\n"
            f"  %x = {xs} reshape({ws} %w)\n" + chain
            + f"  %o = {ws} add({ws} %y, {ws} %y)\n  ROOT %r = ({xs}, {ws}) tuple({xs} %x, {ws} %o)\n}}\n")
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    lines = [f"  %w = {ws} parameter(0)", f"  %p = {xs} reshape({ws} %w)",
             f"  %a = {xs} all-reduce({xs} %p), channel_id=1, replica_groups={_groups_text(g2)}, use_global_device_ids=true, to_apply=%sum"]
    if defect == "transpose":
        lines += [f"  %q = {t}[{s},{b},{h}] transpose({xs} %a), dimensions={{1,0,2}}", f"  %z = {ws} reshape({t}[{s},{b},{h}] %q)"]
    else:
        lines.append(f"  %z = {ws} reshape({xs} %a)")
    if defect == "reverse":
        lines.append(f"  %z2 = {ws} reverse({ws} %z), dimensions={{0}}")
    elif defect == "rotate":
        lines += [f"  %t0 = {t}[{n - 1},{h}] slice({ws} %z), slice={{[1:{n}], [0:{h}]}}", f"  %t1 = {t}[1,{h}] slice({ws} %z), slice={{[0:1], [0:{h}]}}",
                  f"  %z2 = {ws} concatenate({t}[{n - 1},{h}] %t0, {t}[1,{h}] %t1), dimensions={{0}}"]
    else:
        lines.append(f"  %z2 = {ws} copy({ws} %z)")
    lines += [f"  %o = {ws} add({ws} %z2, {ws} %z2)", f"  ROOT %r = ({xs}, {ws}) tuple({xs} %a, {ws} %o)"]
    dist = f"HloModule rb_dist\n\n{_reducer('sum', 'add', t)}\nENTRY %main (w: {ws}) -> ({xs}, {ws}) {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "partial", "op": "add"}],
           "outputs": [{"baseline": i, "distributed": i, "relation": "duplicate"} for i in range(2)]}
    return Program("reshapeback", f"{t} rows [{n},{h}] as [{b},{s},{h}]{' via [1,N,H]' if view else ''}, defect {defect} (groups {g2})", base, dist, rel)


FAMILIES["reshapeback"] = reshapeback


# ---- the vocab-sharded take_along_axis of any rank (rules/takealong.egg) --------------------------


def takealong(rng: random.Random) -> Program:
    """jnp.take_along_axis of labels into logits of rank 2 or 3 whose last dim (the vocabulary)
    is sharded, in the two forms JAX code meets: shard_map's clipped shift (s = t - r·w, idx =
    jnp.clip(s, 0, w - 1) spelled min(max(s, 0), w - 1), max(min(..)) or clamp, the pick masked
    by (s >= 0) & (s < w), a psum) and GSPMD's masked-after gather (clamp(0, t, V - 1), the shift,
    the raw-bound mask reduced over the index vector's unit dim, the gather at the unclipped
    shift, select(mask, 0, g), an all-reduce). Drawn: the rank, the label type (narrow and
    unsigned included), the float type, the labels' range, the clip's spelling, the groups, and
    a defect: the next rank's offset, an offset width off by one, clip bounds [1, w - 1] or
    [0, w - 2], the mask's branches swapped, the psum dropped or over other groups."""
    groups = _layout(rng)
    c = len(groups[0])
    bdims = [rng.choice([2, 4])] if rng.random() < 0.4 else [2, rng.choice([3, 4])]
    r = len(bdims) + 1
    ti = rng.choice(["s32", "s32", "s64", "s16", "s8", "u8", "u32"])
    w = rng.choice([3, 8, 16]) if ti not in ("s8", "u8") else rng.choice([3, 8])
    v = c * w
    ft = rng.choice(["f32", "f32", "f16", "bf16"])
    lo, hi = rng.choice([(0, v)] * 6 + [(0, v + 1), (0, 2 * v)] + ([(-1, v)] if ti[0] == "s" else []))
    form = rng.choice(["clip", "after"])
    spell = rng.choice(["minmax", "maxmin", "clamp"])
    defect = rng.choice(["none"] * 7 + ["offset_next", "width_minus", "clip_lo1", "clip_hi", "swapped", "no_psum", "other_groups"])
    ar_groups = _other_groups(rng, groups) if defect == "other_groups" else groups
    bt = ",".join(map(str, bdims))
    lab, lab11 = f"{ti}[{bt}]", f"{ti}[{bt},1,1]"
    bat = ",".join(map(str, range(r - 1)))
    gather = (f"offset_dims={{}}, collapsed_slice_dims={{{r - 1}}}, start_index_map={{{r - 1}}}, operand_batching_dims={{{bat}}}, "
              f"start_indices_batching_dims={{{bat}}}, index_vector_dim={r}, slice_sizes={{{','.join(['1'] * r)}}}")
    out1, out = f"{ft}[{bt},1]", f"{ft}[{bt}]"
    base = [f"  %x = {ft}[{bt},{v}] parameter(0)", f"  %t = {lab} parameter(1)",
            f"  %t3 = {lab11} reshape({lab} %t)",
            f"  %g = {out1} gather({ft}[{bt},{v}] %x, {lab11} %t3), {gather}",
            f"  ROOT %z = {out} reshape({out1} %g)"]
    baseline = f"HloModule ta_base\n\nENTRY %main (x: {ft}[{bt},{v}], t: {lab}) -> {out} {{\n" + "\n".join(base) + "\n}\n"
    wc = w - 1 if defect == "width_minus" else w
    d = ["  %r = s32[] parameter(0)", f"  %x = {ft}[{bt},{w}] parameter(1)", f"  %t = {lab} parameter(2)",
         f"  %wc = s32[] constant({wc})", "  %r1 = s32[] constant(1)",
         "  %rr = s32[] add(s32[] %r, s32[] %r1)" if defect == "offset_next" else "  %rr = s32[] copy(s32[] %r)",
         "  %off32 = s32[] multiply(s32[] %rr, s32[] %wc)",
         f"  %off = {ti}[] convert(s32[] %off32)" if ti != "s32" else "  %off = s32[] copy(s32[] %off32)",
         f"  %zt = {ti}[] constant(0)", f"  %fz = {ft}[] constant(0)"]
    if form == "clip":
        clo = 1 if defect == "clip_lo1" else 0
        chi = w - 2 if defect == "clip_hi" else w - 1
        d += [f"  %offb = {lab} broadcast({ti}[] %off), dimensions={{}}", f"  %s = {lab} subtract({lab} %t, {lab} %offb)",
              f"  %ztb = {lab} broadcast({ti}[] %zt), dimensions={{}}", f"  %wl = {ti}[] constant({w})",
              f"  %wlb = {lab} broadcast({ti}[] %wl), dimensions={{}}",
              f"  %ge = pred[{bt}] compare({lab} %s, {lab} %ztb), direction=GE",
              f"  %lt = pred[{bt}] compare({lab} %s, {lab} %wlb), direction=LT",
              f"  %in = pred[{bt}] and(pred[{bt}] %ge, pred[{bt}] %lt)",
              f"  %clo = {ti}[] constant({clo})", f"  %clob = {lab} broadcast({ti}[] %clo), dimensions={{}}",
              f"  %chi = {ti}[] constant({chi})", f"  %chib = {lab} broadcast({ti}[] %chi), dimensions={{}}"]
        if spell == "minmax":
            d += [f"  %mx = {lab} maximum({lab} %clob, {lab} %s)", f"  %idx = {lab} minimum({lab} %chib, {lab} %mx)"]
        elif spell == "maxmin":
            d += [f"  %mn = {lab} minimum({lab} %s, {lab} %chib)", f"  %idx = {lab} maximum({lab} %mn, {lab} %clob)"]
        else:
            d += [f"  %idx = {lab} clamp({lab} %clob, {lab} %s, {lab} %chib)"]
        keep, drop = ("%fzb", "%g1") if defect == "swapped" else ("%g1", "%fzb")
        d += [f"  %i3 = {lab11} reshape({lab} %idx)",
              f"  %g = {out1} gather({ft}[{bt},{w}] %x, {lab11} %i3), {gather}",
              f"  %g1 = {out} reshape({out1} %g)", f"  %fzb = {out} broadcast({ft}[] %fz), dimensions={{}}",
              f"  %p = {out} select(pred[{bt}] %in, {out} {keep}, {out} {drop})"]
    else:
        ub = w if defect in ("clip_lo1", "clip_hi") else w - 1  # no clip here: the mask's bound off by one instead
        d += [f"  %t3 = {lab11} reshape({lab} %t)", f"  %ztb = {lab11} broadcast({ti}[] %zt), dimensions={{}}",
              f"  %vm = {ti}[] constant({v - 1})", f"  %vmb = {lab11} broadcast({ti}[] %vm), dimensions={{}}",
              f"  %cl = {lab11} clamp({lab11} %ztb, {lab11} %t3, {lab11} %vmb)",
              f"  %offb = {lab11} broadcast({ti}[] %off), dimensions={{}}", f"  %ub = {ti}[] constant({ub})",
              f"  %end = {ti}[] add({ti}[] %off, {ti}[] %ub)", f"  %endb = {lab11} broadcast({ti}[] %end), dimensions={{}}",
              f"  %b0 = pred[{bt},1,1] compare({lab11} %cl, {lab11} %offb), direction=LT",
              f"  %bw = pred[{bt},1,1] compare({lab11} %cl, {lab11} %endb), direction=GT",
              f"  %m = pred[{bt},1,1] or(pred[{bt},1,1] %b0, pred[{bt},1,1] %bw)", "  %fl = pred[] constant(false)",
              f"  %mr = pred[{bt},1] reduce(pred[{bt},1,1] %m, pred[] %fl), dimensions={{{r}}}, to_apply=%or",
              f"  %s = {lab11} subtract({lab11} %cl, {lab11} %offb)",
              f"  %g = {out1} gather({ft}[{bt},{w}] %x, {lab11} %s), {gather}",
              f"  %fzb = {out1} broadcast({ft}[] %fz), dimensions={{}}"]
        sel = f"  %p1 = {out1} select(pred[{bt},1] %mr, {out1} %g, {out1} %fzb)" if defect == "swapped" else \
            f"  %p1 = {out1} select(pred[{bt},1] %mr, {out1} %fzb, {out1} %g)"
        d += [sel, f"  %p = {out} reshape({out1} %p1)"]
    d += [f"  ROOT %q = {out} copy({out} %p)" if defect == "no_psum" else
          f"  ROOT %q = {out} all-reduce({out} %p), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add"]
    dist = (f"HloModule ta_dist\n\n{_reducer('add', 'add', ft)}\n{_reducer('or', 'or', 'pred')}\n"
            f"ENTRY %main (r: s32[], x: {ft}[{bt},{w}], t: {lab}) -> {out} {{\n" + "\n".join(d) + "\n}\n")
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"},
                                        {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": r - 1},
                                        {"baseline": 1, "distributed": 2, "relation": "duplicate", "int_range": [lo, hi]}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    desc = (f"{form} ({spell}) pick of rank {r} batch {bdims} V={v} (c={c}, w={w}) labels {ti} in [{lo}, {hi}), {ft}, "
            f"defect {defect}, psum over {ar_groups} (groups {groups})")
    return Program("takealong", desc, baseline, dist, rel)


FAMILIES["takealong"] = takealong


# ---- causal ring attention: the mask per rank and step, the -inf fill (rules/ringmask.egg) -----


def ringmask(rng: random.Random) -> Program:
    """Causal ring attention over one head: the baseline masks q . k^T with positions
    compare(iota_q, iota_k) (GE, or LE with the operands swapped; 2-D iotas or 1-D iotas
    broadcast), fills the masked scores (-inf, -1e9, f32's lowest, or a moderate -0.5) and takes
    the softmax times v; rank r (rank parameter, index in its group) keeps query block r, k/v
    travel one rank on per step, and step j masks with positions r*b + iota against
    ((r - j) mod c)*b + iota (the block index spelled as a non-negative remainder or as
    Python's % with its sign fix-up; the position type s32, s64, u32 or s8), then folds an
    online softmax (running max, rescaled denominator and numerator). The select keeps the
    scores where the mask holds (or takes the fill where its complement LT holds). Drawn: those
    spellings, the mask added as a bias (scores + f32(keys after the query) * fill, as the
    ringattention package writes it), the groups, and the defects: a strict compare (GT) on the ranks, the key
    positions offset by one block, the mask on the wrong axis (k >= q), the key block of step
    j + 1 used at step j (the mask one step ahead of the keys), a permute before the first step
    (a ring starting at block r - 1: NaN on rank 0 with a -inf fill, equal with a finite one),
    the last step's fill another value, one step short."""
    groups = _layout(rng)
    c = len(groups[0])
    t = "f32"
    b, d = 2, 2
    s = c * b
    pt = rng.choice(["s32", "s32", "s64", "u32", "s8"])
    # The fill as a literal, or computed from literals: f32's lowest rounded to bf16 and back, or
    # doubled, is -inf on every input (never finite, whatever the spelling).
    fill = rng.choice(["-inf", "-inf", "-1e+09", "-3.40282347e+38", "-0.5", "bf16(lowest)", "2*lowest"])
    spell = rng.choice(["GE", "LE"])  # GE(q, k) or LE(k, q)
    # select(m, x, fill); select(not-m, fill, x); or the mask added as a bias, x + f32(not-m) * fill
    form = rng.choice(["keep", "keep", "complement", "bias"])
    keep_then = form == "keep"
    base_2d = rng.random() < 0.5
    modform = rng.choice(["rem", "pymod"])
    defect = rng.choice(["none"] * 6 + ["gt", "offset", "axis", "ahead", "sendfirst", "fill", "short"])
    steps = c - 1 if defect == "short" and c > 1 else c
    lo = "-inf"

    def mask_lines(pre: str, qp: str, kp: str, shape: str, strict: bool = False, swap_axis: bool = False) -> list[str]:
        a, bb = (kp, qp) if swap_axis else (qp, kp)
        if keep_then:
            dirn, x, y = ("GT" if strict else "GE", a, bb) if spell == "GE" else ("LT" if strict else "LE", bb, a)
        else:  # the complement: q < k (or k > q) takes the fill
            dirn, x, y = ("LE" if strict else "LT", a, bb) if spell == "GE" else ("GE" if strict else "GT", bb, a)
        return [f"  %{pre}m = pred[{shape}] compare({pt}[{shape}] {x}, {pt}[{shape}] {y}), direction={dirn}"]

    def fill_lines(pre: str, val: str) -> list[str]:  # the scalar %{pre}f
        if val == "bf16(lowest)":
            return [f"  %{pre}f0 = {t}[] constant(-3.40282347e+38)", f"  %{pre}f1 = bf16[] convert({t}[] %{pre}f0)", f"  %{pre}f = {t}[] convert(bf16[] %{pre}f1)"]
        if val == "2*lowest":
            return [f"  %{pre}f0 = {t}[] constant(-3.40282347e+38)", f"  %{pre}f2 = {t}[] constant(2)", f"  %{pre}f = {t}[] multiply({t}[] %{pre}f0, {t}[] %{pre}f2)"]
        return [f"  %{pre}f = {t}[] constant({val})"]

    def select_line(pre: str, m: str, x: str, f: str, shape: str) -> list[str]:
        if form == "bias":
            return [f"  %{pre}cv = {t}[{shape}] convert(pred[{shape}] {m})", f"  %{pre}bi = {t}[{shape}] multiply({t}[{shape}] %{pre}cv, {t}[{shape}] {f})",
                    f"  %{pre}x = {t}[{shape}] add({t}[{shape}] {x}, {t}[{shape}] %{pre}bi)"]
        ops = (x, f) if keep_then else (f, x)
        return [f"  %{pre}x = {t}[{shape}] select(pred[{shape}] {m}, {t}[{shape}] {ops[0]}, {t}[{shape}] {ops[1]})"]

    ss = f"{s},{s}"
    base = [f"  %q = {t}[{s},{d}] parameter(0)", f"  %k = {t}[{s},{d}] parameter(1)", f"  %v = {t}[{s},{d}] parameter(2)",
            f"  %sc = {t}[{ss}] dot({t}[{s},{d}] %q, {t}[{s},{d}] %k), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}"]
    if base_2d:
        base += [f"  %iq = {pt}[{ss}] iota(), iota_dimension=0", f"  %ik = {pt}[{ss}] iota(), iota_dimension=1"]
    else:
        base += [f"  %i1 = {pt}[{s}] iota(), iota_dimension=0", f"  %iq = {pt}[{ss}] broadcast({pt}[{s}] %i1), dimensions={{0}}",
                 f"  %ik = {pt}[{ss}] broadcast({pt}[{s}] %i1), dimensions={{1}}"]
    base += mask_lines("", "%iq", "%ik", ss)
    base += [*fill_lines("", fill), f"  %fb = {t}[{ss}] broadcast({t}[] %f), dimensions={{}}", *select_line("", "%m", "%sc", "%fb", ss),
             f"  %lo = {t}[] constant({lo})", f"  %zero = {t}[] constant(0)",
             f"  %mx = {t}[{s}] reduce({t}[{ss}] %x, {t}[] %lo), dimensions={{1}}, to_apply=%mx",
             f"  %mb = {t}[{ss}] broadcast({t}[{s}] %mx), dimensions={{0}}", f"  %sub = {t}[{ss}] subtract({t}[{ss}] %x, {t}[{ss}] %mb)",
             f"  %e = {t}[{ss}] exponential({t}[{ss}] %sub)", f"  %den = {t}[{s}] reduce({t}[{ss}] %e, {t}[] %zero), dimensions={{1}}, to_apply=%add",
             f"  %num = {t}[{s},{d}] dot({t}[{ss}] %e, {t}[{s},{d}] %v), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}",
             f"  %db = {t}[{s},{d}] broadcast({t}[{s}] %den), dimensions={{0}}", f"  ROOT %o = {t}[{s},{d}] divide({t}[{s},{d}] %num, {t}[{s},{d}] %db)"]
    bs = f"{b},{b}"
    pairs = [(g[i], g[(i + 1) % c]) for g in groups for i in range(c)]
    dist = ["  %r = s32[] parameter(0)", f"  %q = {t}[{b},{d}] parameter(1)", f"  %k0 = {t}[{b},{d}] parameter(2)", f"  %v0 = {t}[{b},{d}] parameter(3)",
            f"  %rp = {pt}[] convert(s32[] %r)" if pt != "s32" else "  %rp = s32[] copy(s32[] %r)",
            f"  %bsz = {pt}[] constant({b})", f"  %cn = {pt}[] constant({c})", f"  %zi = {pt}[] constant(0)",
            f"  %qo = {pt}[] multiply({pt}[] %rp, {pt}[] %bsz)", f"  %qob = {pt}[{bs}] broadcast({pt}[] %qo), dimensions={{}}",
            f"  %iq = {pt}[{bs}] iota(), iota_dimension=0", f"  %qp = {pt}[{bs}] add({pt}[{bs}] %qob, {pt}[{bs}] %iq)",
            f"  %ik = {pt}[{bs}] iota(), iota_dimension=1",
            f"  %lo = {t}[] constant({lo})", f"  %zero = {t}[] constant(0)"]
    kv, vv, m, den, num = "%k0", "%v0", "", "", ""
    first = 1 if defect == "sendfirst" else 0
    for j in range(steps):
        held = j + first  # the key block held at this step is (r - held) mod c
        if held:
            dist += [f"  %k{held}p = {t}[{b},{d}] collective-permute({t}[{b},{d}] {kv}), channel_id={2 * held}, source_target_pairs={_pairs_text(pairs)}",
                     f"  %v{held}p = {t}[{b},{d}] collective-permute({t}[{b},{d}] {vv}), channel_id={2 * held + 1}, source_target_pairs={_pairs_text(pairs)}"]
            kv, vv = f"%k{held}p", f"%v{held}p"
        blk = held + (1 if defect == "ahead" else 0)
        p = f"s{j}"
        if modform == "rem" or pt[0] == "u":
            dist += [f"  %{p}a = {pt}[] constant({(c - blk % c) % c})", f"  %{p}t = {pt}[] add({pt}[] %rp, {pt}[] %{p}a)",
                     f"  %{p}kb = {pt}[] remainder({pt}[] %{p}t, {pt}[] %cn)"]
        else:
            dist += [f"  %{p}a = {pt}[] constant({blk})", f"  %{p}t = {pt}[] subtract({pt}[] %rp, {pt}[] %{p}a)",
                     f"  %{p}rm = {pt}[] remainder({pt}[] %{p}t, {pt}[] %cn)", f"  %{p}ng = pred[] compare({pt}[] %{p}rm, {pt}[] %zi), direction=LT",
                     f"  %{p}ad = {pt}[] add({pt}[] %{p}rm, {pt}[] %cn)", f"  %{p}kb = {pt}[] select(pred[] %{p}ng, {pt}[] %{p}ad, {pt}[] %{p}rm)"]
        dist += [f"  %{p}ko = {pt}[] multiply({pt}[] %{p}kb, {pt}[] %bsz)", f"  %{p}kob = {pt}[{bs}] broadcast({pt}[] %{p}ko), dimensions={{}}",
                 f"  %{p}kp = {pt}[{bs}] add({pt}[{bs}] %{p}kob, {pt}[{bs}] %ik)"]
        kp = f"%{p}kp"
        if defect == "offset":
            dist += [
                f"  %{p}bb = {pt}[{bs}] broadcast({pt}[] %bsz), dimensions={{}}", f"  %{p}kpo = {pt}[{bs}] add({pt}[{bs}] {kp}, {pt}[{bs}] %{p}bb)"]
            kp = f"%{p}kpo"
        dist += mask_lines(p, "%qp", kp, bs, strict=defect == "gt", swap_axis=defect == "axis")
        fv = "0.25" if defect == "fill" and j == steps - 1 else fill
        dist += [f"  %{p}sc = {t}[{bs}] dot({t}[{b},{d}] %q, {t}[{b},{d}] {kv}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}",
                 *fill_lines(p, fv), f"  %{p}fb = {t}[{bs}] broadcast({t}[] %{p}f), dimensions={{}}",
                 *select_line(p, f"%{p}m", f"%{p}sc", f"%{p}fb", bs),
                 f"  %{p}bm = {t}[{b}] reduce({t}[{bs}] %{p}x, {t}[] %lo), dimensions={{1}}, to_apply=%mx"]
        if not m:
            mn = f"%{p}bm"
        else:
            dist.append(f"  %{p}mn = {t}[{b}] maximum({t}[{b}] {m}, {t}[{b}] %{p}bm)")
            mn = f"%{p}mn"
        dist += [f"  %{p}mb = {t}[{bs}] broadcast({t}[{b}] {mn}), dimensions={{0}}", f"  %{p}sub = {t}[{bs}] subtract({t}[{bs}] %{p}x, {t}[{bs}] %{p}mb)",
                 f"  %{p}e = {t}[{bs}] exponential({t}[{bs}] %{p}sub)",
                 f"  %{p}ds = {t}[{b}] reduce({t}[{bs}] %{p}e, {t}[] %zero), dimensions={{1}}, to_apply=%add",
                 f"  %{p}nm = {t}[{b},{d}] dot({t}[{bs}] %{p}e, {t}[{b},{d}] {vv}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"]
        if not m:
            den, num = f"%{p}ds", f"%{p}nm"
        else:
            dist += [f"  %{p}dm = {t}[{b}] subtract({t}[{b}] {m}, {t}[{b}] {mn})", f"  %{p}cf = {t}[{b}] exponential({t}[{b}] %{p}dm)",
                     f"  %{p}d1 = {t}[{b}] multiply({t}[{b}] {den}, {t}[{b}] %{p}cf)", f"  %{p}d2 = {t}[{b}] add({t}[{b}] %{p}d1, {t}[{b}] %{p}ds)",
                     f"  %{p}cb = {t}[{b},{d}] broadcast({t}[{b}] %{p}cf), dimensions={{0}}",
                     f"  %{p}n1 = {t}[{b},{d}] multiply({t}[{b},{d}] {num}, {t}[{b},{d}] %{p}cb)", f"  %{p}n2 = {t}[{b},{d}] add({t}[{b},{d}] %{p}n1, {t}[{b},{d}] %{p}nm)"]
            den, num = f"%{p}d2", f"%{p}n2"
        m = mn
    dist += [f"  %db = {t}[{b},{d}] broadcast({t}[{b}] {den}), dimensions={{0}}", f"  ROOT %o = {t}[{b},{d}] divide({t}[{b},{d}] {num}, {t}[{b},{d}] %db)"]
    head = _reducer("mx", "maximum", t) + "\n" + _reducer("add", "add", t)
    bt, dt_ = f"{t}[{s},{d}]", f"{t}[{b},{d}]"
    base_text = f"HloModule rm_base\n\n{head}\nENTRY %main (q: {bt}, k: {bt}, v: {bt}) -> {bt} {{\n" + "\n".join(base) + "\n}\n"
    dist_text = f"HloModule rm_dist\n\n{head}\nENTRY %main (r: s32[], q: {dt_}, k: {dt_}, v: {dt_}) -> {dt_} {{\n" + "\n".join(dist) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}] + [
        {"baseline": i, "distributed": i + 1, "relation": "sharded", "dim": 0} for i in range(3)],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}
    desc = (f"{pt} mask {spell} {form}, fill {fill}, {'2-D' if base_2d else '1-D'} iotas, "
            f"block index {modform}, {steps} steps, defect {defect} (groups {groups})")
    return Program("ringmask", desc, base_text, dist_text, rel)


FAMILIES["ringmask"] = ringmask


# ---- padded in blocks: a fused weight, each block padded on its own (rules/padded.egg padb) ------


def padblocks(rng: random.Random) -> Program:
    """x fused along dim 0 from 2 or 3 blocks of n_i rows, each padded to c·w_i (w_i >= n_i/c,
    sometimes wider than needed) and split over the ranks, rank r holding its rows of every
    block in block order. A map on the fused tensor (zero-keeping or not: add of a constant, a
    dot with a duplicate matrix, exp, ...), block i cut out, a second map, then the sum over the
    padded rows (all-reduce on the ranks). Defects drawn: the rank cuts block i at another
    block's offset or one row off, the relation declared as one padding after the whole fused
    tensor (the layout bug), an all-reduce over other groups; for equal blocks split off by a
    reshape, the rank's rows read as (rows, blocks) instead (every m-th row)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "f32", "s32", "s8", "u8", "s16"])
    is_int = t in RANGES
    nb = rng.choice([2, 3])
    # The cut: a slice at the block's offsets, or (equal blocks) a reshape to (blocks, rows)
    # and a slice of one block (timm's qkv.reshape(B, N, 3, heads, hd)).
    split = rng.random() < 0.3
    blocks, widths = [], []
    for _ in range(nb):
        n = rng.randrange(1, 3 * c)
        w = -(-n // c) + (1 if rng.random() < 0.2 else 0)
        if split and blocks:
            n, w = blocks[0], widths[0]
        blocks.append(n)
        widths.append(w)
    F, W, h = sum(blocks), sum(widths), 2
    i = rng.randrange(nb)
    o, oo = sum(blocks[:i]), sum(widths[:i])
    defect = rng.choice(["none"] * 5 + (["interleave", "whole", "groups"] if split else ["offset", "shift", "whole", "groups"]))
    at = oo
    if defect == "offset":
        at = rng.choice([sum(widths[:j]) for j in range(nb) if sum(widths[:j]) != oo and sum(widths[:j]) + widths[i] <= W] or [oo])
    elif defect == "shift":
        at = oo + 1 if oo + 1 + widths[i] <= W else max(oo - 1, 0)
    maps1 = ["id", "add-k", "neg", "dot"] + ([] if is_int else ["exp"])
    maps2 = ["id", "mul-k", "add-k"] + ([] if is_int else ["tanh", "exp"])
    f1, f2 = rng.choice(maps1), rng.choice(maps2)
    k = rng.choice([0, 1, 3])
    ar_groups = _other_groups(rng, groups) if defect == "groups" else groups

    def apply(f: str, src: str, dst: str, rows: int) -> str:
        sh = f"{t}[{rows},{h}]"
        if f == "id":
            return f"  %{dst} = {sh} copy({sh} %{src})\n"
        if f in ("neg", "exp", "tanh"):
            op = {"neg": "negate", "exp": "exponential", "tanh": "tanh"}[f]
            return f"  %{dst} = {sh} {op}({sh} %{src})\n"
        if f == "dot":
            return f"  %{dst} = {sh} dot({sh} %{src}, {t}[{h},{h}] %a), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}\n"
        op = "add" if f == "add-k" else "multiply"
        return (f"  %{dst}k = {t}[] constant({k})\n  %{dst}b = {sh} broadcast({t}[] %{dst}k), dimensions={{}}\n"
                f"  %{dst} = {sh} {op}({sh} %{src}, {sh} %{dst}b)\n")

    def cut_out(rows: int, cut: int, take: int, side: str) -> str:
        if not split:
            return f"  %s = {t}[{take},{h}] slice({t}[{rows},{h}] %y), slice={{[{cut}:{cut + take}], [0:{h}]}}\n"
        if side == "distributed" and defect == "interleave":  # (rows, blocks): every m-th row
            return (f"  %y3 = {t}[{take},{nb},{h}] reshape({t}[{rows},{h}] %y)\n"
                    f"  %blk = {t}[{take},1,{h}] slice({t}[{take},{nb},{h}] %y3), slice={{[0:{take}], [{i}:{i + 1}], [0:{h}]}}\n"
                    f"  %s = {t}[{take},{h}] reshape({t}[{take},1,{h}] %blk)\n")
        return (f"  %y3 = {t}[{nb},{take},{h}] reshape({t}[{rows},{h}] %y)\n"
                f"  %blk = {t}[1,{take},{h}] slice({t}[{nb},{take},{h}] %y3), slice={{[{i}:{i + 1}], [0:{take}], [0:{h}]}}\n"
                f"  %s = {t}[{take},{h}] reshape({t}[1,{take},{h}] %blk)\n")

    def prog(name: str, rows: int, cut: int, take: int, tail: str) -> str:
        return ("HloModule " + name + "\n\n" + _reducer("add", "add", t)
                + f"\nENTRY %main (x: {t}[{rows},{h}], a: {t}[{h},{h}]) -> {t}[{h}] {{\n  %x = {t}[{rows},{h}] parameter(0)\n  %a = {t}[{h},{h}] parameter(1)\n"
                + apply(f1, "x", "y", rows)
                + cut_out(rows, cut, take, "baseline" if name == "pb_base" else "distributed")
                + apply(f2, "s", "z", take)
                + f"  %zero = {t}[] constant(0)\n  %l = {t}[{h}] reduce({t}[{take},{h}] %z, {t}[] %zero), dimensions={{0}}, to_apply=%add\n" + tail + "}\n")

    base = prog("pb_base", F, o, blocks[i], f"  ROOT %o = {t}[{h}] copy({t}[{h}] %l)\n")
    dist = prog("pb_dist", W, at, widths[i], f"  ROOT %o = {t}[{h}] all-reduce({t}[{h}] %l), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n")
    entry: dict[str, Any] = {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "blocks": blocks, "width": widths}
    if defect == "whole":
        entry = {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "width": max(W, -(-F // c))}
        if entry["width"] != W:  # the program's per-rank extent stays W: no layout of that size
            entry["width"] = W
    if is_int:
        entry["int_range"] = [0 if t[0] == "u" else -3, 5]
    rel = {"groups": groups, "inputs": [entry, {"baseline": 1, "distributed": 1, "relation": "duplicate", **({"int_range": [0, 3]} if is_int else {})}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{t} blocks {blocks} widths {widths} over c={c}, block {i} {'split off' if split else 'cut'} at {at} (expected {oo}), {f1} then {f2} (k={k}), defect {defect} (groups {groups})"
    return Program("padblocks", form, base, dist, rel)


FAMILIES["padblocks"] = padblocks


# ---- ring buffers of c rows moved by a rank-dependent roll (rules/rollring.egg) --------------


def rollring(rng: random.Random) -> Program:
    """A ring all-gather into a (c, w) buffer rolled back by the rank, as jnp.roll writes it: the
    rank's block x' travels c - 1 steps round the ring; the c blocks held are stacked as rows
    (reshape to [1, w], concatenate), in order or reversed, reversed (reverse) when they run
    against the ring, rolled by a traced shift (dynamic-slice of the buffer concatenated with
    itself at a per-rank offset (S·r + Q) rem c, optionally with offset 0 written as c, JAX's
    form) and merged back (reshape). Drawn: the element type (floats, narrow and unsigned ints: values only move), w,
    the ring's shift, the pairs, the stacking order, the reverse, the groups; defects: the shift
    off by one, the rank's coefficient negated, the roll along the other axis (w = c), the roll
    length c + 1 (offsets rem c + 1), the pairs of another kind (other mesh axis, mirror, a
    permutation, one missing), the reverse left out. Or flat: the blocks joined as one vector,
    rolled by w·((S·r + Q) rem c) (jnp.roll of the chunk vector)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "u16"])
    defect = rng.choice(["none"] * 5 + ["shift", "sign", "axis", "length", "pairs", "norev"])
    w = c if defect == "axis" else rng.choice([1, 2, 3])
    m = rng.choice([1, c - 1]) if c > 1 else 0
    pairs = [(g[i], g[(i + m) % c]) for g in groups for i in range(c)]
    what = f"shift {m}"
    if defect == "pairs":
        pairs, what = _pairs(rng, groups)
    order = rng.choice(["natural", "reversed"])
    # flat: the blocks joined as one vector of c·w (no rows, no reverse), rolled by multiples of w;
    # its blocks must already run with the ring (a = 1), unless the reverse is the defect.
    shape_form = rng.choice(["rows", "flat"]) if defect not in ("axis", "pairs") else "rows"
    if shape_form == "flat" and c > 1:
        m = (c - 1 if order == "natural" else 1) if defect != "norev" else (1 if order == "natural" else c - 1)
        pairs = [(g[i], g[(i + m) % c]) for g in groups for i in range(c)]
        what = f"shift {m}"
    zero_as_c = rng.random() < 0.5
    # Row i holds block (r - i·m) (natural) or (r - (c - 1 - i)·m) (reversed): (a·i + r + b) mod c.
    a, b = ((-m) % c, 0) if order == "natural" else (m % c, (-(c - 1) * m) % c)
    # Rows back in order need a = 1: a reverse (row i is row c - 1 - i) when the rows run the other
    # way (a = c - 1); the defect norev leaves it out.
    rev = a != 1 and defect != "norev" and shape_form == "rows"
    if rev:
        a, b = (-a) % c, (a * (c - 1) + b) % c
    # Roll back: row j of the roll is row (j + S·r + Q) mod c; block (a·j + (a·S + 1)·r + a·Q + b).
    inv = a  # a is 1 or c - 1, its own inverse mod c
    S, Q = (-inv) % c, (-inv * b) % c
    if defect == "shift":
        Q = (Q + 1) % c
    if defect == "sign" and c > 2:
        S = (c - S) % c
    mod = c + 1 if defect == "length" else c
    n = c * w
    lines = ["  %r = s32[] parameter(0)", f"  %x = {t}[{w}] parameter(1)"]
    held = ["%x"]
    for i in range(1, c):
        lines.append(f"  %p{i} = {t}[{w}] collective-permute({t}[{w}] {held[-1]}), channel_id={i}, source_target_pairs={_pairs_text(pairs)}")
        held.append(f"%p{i}")
    rows = held if order == "natural" else held[::-1]
    if shape_form == "flat":
        lines.append(f"  %st = {t}[{n}] concatenate(" + ", ".join(f"{t}[{w}] {h}" for h in rows) + "), dimensions={0}")
        lines += [f"  %dd = {t}[{2 * n}] concatenate({t}[{n}] %st, {t}[{n}] %st), dimensions={{0}}",
                  f"  %cs = s32[] constant({S})", f"  %cq = s32[] constant({Q + mod})", f"  %cm = s32[] constant({mod})", f"  %cw = s32[] constant({w})",
                  "  %o1 = s32[] multiply(s32[] %r, s32[] %cs)", "  %o2 = s32[] add(s32[] %o1, s32[] %cq)",
                  "  %o3 = s32[] remainder(s32[] %o2, s32[] %cm)", "  %o4 = s32[] multiply(s32[] %o3, s32[] %cw)"]
        off = "%o4"
        if zero_as_c:
            lines += ["  %z = s32[] constant(0)", "  %isz = pred[] compare(s32[] %o4, s32[] %z), direction=EQ",
                      f"  %cn = s32[] constant({n})", "  %o5 = s32[] select(pred[] %isz, s32[] %cn, s32[] %o4)"]
            off = "%o5"
        lines.append(f"  ROOT %o = {t}[{n}] dynamic-slice({t}[{2 * n}] %dd, s32[] {off}), dynamic_slice_sizes={{{n}}}")
    else:
        for i, h in enumerate(rows):
            lines.append(f"  %row{i} = {t}[1,{w}] reshape({t}[{w}] {h})")
        lines.append(f"  %st = {t}[{c},{w}] concatenate(" + ", ".join(f"{t}[1,{w}] %row{i}" for i in range(c)) + "), dimensions={0}")
        buf = "%st"
        if rev:
            lines.append(f"  %rv = {t}[{c},{w}] reverse({t}[{c},{w}] %st), dimensions={{0}}")
            buf = "%rv"
        ax = 1 if defect == "axis" else 0
        dbl = f"{t}[{2 * c},{w}]" if ax == 0 else f"{t}[{c},{2 * w}]"
        lines += [f"  %dd = {dbl} concatenate({t}[{c},{w}] {buf}, {t}[{c},{w}] {buf}), dimensions={{{ax}}}",
                  f"  %cs = s32[] constant({S})", f"  %cq = s32[] constant({Q + mod})", f"  %cm = s32[] constant({mod})",
                  "  %o1 = s32[] multiply(s32[] %r, s32[] %cs)", "  %o2 = s32[] add(s32[] %o1, s32[] %cq)",
                  "  %o3 = s32[] remainder(s32[] %o2, s32[] %cm)"]
        off = "%o3"
        if zero_as_c:
            lines += ["  %z = s32[] constant(0)", "  %isz = pred[] compare(s32[] %o3, s32[] %z), direction=EQ",
                      f"  %cc = s32[] constant({c})", "  %o4 = s32[] select(pred[] %isz, s32[] %cc, s32[] %o3)"]
            off = "%o4"
        lines.append("  %zero = s32[] constant(0)")
        starts = f"s32[] {off}, s32[] %zero" if ax == 0 else f"s32[] %zero, s32[] {off}"
        lines += [f"  %rl = {t}[{c},{w}] dynamic-slice({dbl} %dd, {starts}), dynamic_slice_sizes={{{c},{w}}}",
                  f"  ROOT %o = {t}[{n}] reshape({t}[{c},{w}] %rl)"]
    base = f"HloModule rr_base\n\nENTRY %main (x: {t}[{n}]) -> {t}[{n}] {{\n  %x = {t}[{n}] parameter(0)\n  ROOT %o = {t}[{n}] copy({t}[{n}] %x)\n}}\n"
    dist = f"HloModule rr_dist\n\nENTRY %main (r: s32[], x: {t}[{w}]) -> {t}[{n}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{t} w={w} {shape_form} {what}, blocks {order}{', reversed' if rev else ''}, roll ({S}r+{Q}) rem {mod}{' (0 as c)' if zero_as_c else ''}, defect {defect} (groups {groups})"
    return Program("rollring", form, base, dist, rel)


FAMILIES["rollring"] = rollring


# ---- a variadic reduce over dims other than the sharded one (rules/tuplerows.egg) -----------------


def tuplerows(rng: random.Random) -> Program:
    """jnp.argmax / argmin along a dim that is not sharded (a vmapped argmax per token, GShard's
    gating per group): the variadic (value, index) reduce with JAX's combine on x and an iota
    along the reduced dim, x block-sharded along another dim; the ranks run the same reduce on
    their block, both outputs stay sharded. Drawn: the value type (floats, narrow and unsigned
    ints: ties are common there), rank 2 or 3, the sharded and the reduced dim, argmax or argmin,
    the groups; near misses: the ranks' combine with the other tie rule or the other order, the
    iota along the sharded dim, the iota shifted by the rank's offset (global positions), a
    non-identity init, the outputs' relation declared on the reduced dim's neighbour."""
    groups = _layout(rng)
    c = len(groups[0])
    vt = rng.choice(["f32", "f32", "bf16", "s32", "s8", "u8", "s16"])
    it = rng.choice(["s32", "s32", "s64", "u32"])
    shape = [rng.choice([2, 3]) * c, rng.choice([3, 4, 5])] + ([rng.choice([2, 4])] if rng.random() < 0.5 else [])
    rank = len(shape)
    red = rng.choice([d for d in range(1, rank)])
    shd = rng.choice([d for d in range(rank) if d != red and shape[d] % c == 0])
    strict, tie = ("GT", "LT") if rng.random() < 0.5 else ("LT", "LT")
    defect = rng.choice(["none"] * 6 + ["tie", "order", "iota_dim", "iota_rank", "init", "out_dim"])
    iota_dim = shd if defect == "iota_dim" else red
    dstrict, dtie = (strict, "GT") if defect == "tie" else (("LT" if strict == "GT" else "GT"), tie) if defect == "order" else (strict, tie)
    if vt in RANGES:
        lo, hi = RANGES[vt]
        vinit = str(lo if strict == "GT" else hi)
    else:
        vinit = "-inf" if strict == "GT" else "inf"
    dinit = ("0" if vt in RANGES and vt[0] == "u" and strict == "LT" else "1") if defect == "init" else vinit
    out = [shape[d] for d in range(rank) if d != red]
    e = shd - (1 if red < shd else 0)
    local = list(shape)
    local[shd] //= c
    lout = [local[d] for d in range(rank) if d != red]

    def t(ty: str, dims: list[int]) -> str:
        return f"{ty}[{','.join(map(str, dims))}]"

    def body(dims: list[int], odims: list[int], init: str, rank_offset: bool) -> list[str]:
        lines = [f"  %io = {t(it, dims)} iota(), iota_dimension={iota_dim}"]
        if rank_offset:
            w = dims[shd]
            lines += [f"  %wc = s32[] constant({w})", "  %off32 = s32[] multiply(s32[] %r, s32[] %wc)",
                      f"  %off = {it}[] convert(s32[] %off32)" if it != "s32" else "  %off = s32[] copy(s32[] %off32)",
                      f"  %offb = {t(it, dims)} broadcast({it}[] %off), dimensions={{}}", f"  %idx = {t(it, dims)} add({t(it, dims)} %io, {t(it, dims)} %offb)"]
        else:
            lines += [f"  %idx = {t(it, dims)} copy({t(it, dims)} %io)"]
        lines += [f"  %vi = {vt}[] constant({init})", f"  %ii = {it}[] constant(0)",
                  f"  %red = ({t(vt, odims)}, {t(it, odims)}) reduce({t(vt, dims)} %x, {t(it, dims)} %idx, {vt}[] %vi, {it}[] %ii), dimensions={{{red}}}, to_apply=%comb",
                  f"  %v = {t(vt, odims)} get-tuple-element(({t(vt, odims)}, {t(it, odims)}) %red), index=0",
                  f"  %i = {t(it, odims)} get-tuple-element(({t(vt, odims)}, {t(it, odims)}) %red), index=1",
                  f"  ROOT %o = ({t(vt, odims)}, {t(it, odims)}) tuple({t(vt, odims)} %v, {t(it, odims)} %i)"]
        return lines

    base = (f"HloModule tr_base\n\n{_jax_argcombine('comb', vt, it, strict, tie, True)}\n"
            f"ENTRY %main (x: {t(vt, shape)}) -> ({t(vt, out)}, {t(it, out)}) {{\n  %x = {t(vt, shape)} parameter(0)\n"
            + "\n".join(body(shape, out, vinit, False)) + "\n}\n")
    dist = (f"HloModule tr_dist\n\n{_jax_argcombine('comb', vt, it, dstrict, dtie, True)}\n"
            f"ENTRY %main (r: s32[], x: {t(vt, local)}) -> ({t(vt, lout)}, {t(it, lout)}) {{\n  %r = s32[] parameter(0)\n  %x = {t(vt, local)} parameter(1)\n"
            + "\n".join(body(local, lout, dinit, defect == "iota_rank")) + "\n}\n")
    oe = e
    if defect == "out_dim":
        cands = [d for d in range(len(out)) if d != e and out[d] % c == 0 and lout[d] * c == out[d]]
        oe = cands[0] if cands else e
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": shd}],
           "outputs": [{"baseline": i, "distributed": i, "relation": "sharded", "dim": oe} for i in (0, 1)]}
    form = (f"{'argmax' if strict == 'GT' else 'argmin'} of {vt}{shape} along {red}, sharded along {shd} (c={c}), index {it}, "
            f"defect {defect} (groups {groups})")
    return Program("tuplerows", form, base, dist, rel)


FAMILIES["tuplerows"] = tuplerows


# ---- a baseline reshape taken through the shape a rank gathers (rules/reshapesplit.egg) ----------


def reshapesplit(rng: random.Random) -> Program:
    """transformers' colwise_gather_output: the rank's column block of y [N, H] (N = B*S) viewed
    as [B, S, H/c], gathered along the last dim - directly (all-gather along dim 2) or as DTensor
    writes it (all-gather along dim 0, split into c pieces, concatenated along dim 2) - and viewed
    per head [B, S, K, D]; the baseline reshapes y to [B, S, K, D] in one step. Drawn: the element
    type (narrow, unsigned, float), the extents, the groups (DP x TP included), the form; defects:
    the pieces concatenated in another order, the gather's dim-0 result viewed without the split,
    the rank's view transposed to [S, B, H/c], the gather over other groups."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "f16"])
    b, s, w, d = rng.choice([1, 2]), rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([1, 2, 4])
    h = c * w * d
    k = h // d
    form = rng.choice(["direct", "dtensor"])
    defect = rng.choice(["none"] * 5 + ["order", "unsplit", "transposed", "groups"])
    if defect == "order":
        form = "dtensor"
    if defect == "transposed":
        b = 2  # with b = 1 the (S, B) view is the same sequence: no defect
    n = b * s  # after b is drawn for good: the baseline's rows are B*S
    ys, zs, loc = f"{t}[{n},{h}]", f"{t}[{b},{s},{k},{d}]", f"{t}[{n},{h // c}]"
    base = (f"HloModule rs_base\n\nENTRY %main (y: {ys}) -> {zs} {{\n  %y = {ys} parameter(0)\n"
            f"  %n = {ys} negate({ys} %y)\n  ROOT %z = {zs} reshape({ys} %n)\n}}\n")
    g2 = _other_groups(rng, groups) if defect == "groups" else groups
    piece = f"{t}[{b},{s},{h // c}]"
    lines = [f"  %y = {loc} parameter(0)", f"  %n = {loc} negate({loc} %y)"]
    if defect == "transposed":
        lines += [f"  %v = {t}[{s},{b},{h // c}] reshape({loc} %n)", f"  %r = {piece} transpose({t}[{s},{b},{h // c}] %v), dimensions={{1,0,2}}"]
    else:
        lines.append(f"  %r = {piece} reshape({loc} %n)")
    gt = _groups_text(g2)
    if defect == "unsplit":
        lines += [f"  %a = {t}[{c * b},{s},{h // c}] all-gather({piece} %r), channel_id=1, replica_groups={gt}, dimensions={{0}}, use_global_device_ids=true",
                  f"  %g = {t}[{b},{s},{h}] reshape({t}[{c * b},{s},{h // c}] %a)"]
    elif form == "direct":
        lines.append(f"  %g = {t}[{b},{s},{h}] all-gather({piece} %r), channel_id=1, replica_groups={gt}, dimensions={{2}}, use_global_device_ids=true")
    else:
        lines.append(f"  %a = {t}[{c * b},{s},{h // c}] all-gather({piece} %r), channel_id=1, replica_groups={gt}, dimensions={{0}}, use_global_device_ids=true")
        order = list(range(c))
        if defect == "order":
            order[0], order[1] = order[1], order[0]
        for j in range(c):
            lines.append(f"  %p{j} = {piece} slice({t}[{c * b},{s},{h // c}] %a), slice={{[{j * b}:{(j + 1) * b}], [0:{s}], [0:{h // c}]}}")
        lines.append(f"  %g = {t}[{b},{s},{h}] concatenate({', '.join(f'{piece} %p{j}' for j in order)}), dimensions={{2}}")
    lines.append(f"  ROOT %z = {zs} reshape({t}[{b},{s},{h}] %g)")
    dist = f"HloModule rs_dist\n\nENTRY %main (y: {loc}) -> {zs} {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Program("reshapesplit", f"{t} y [{n},{h}] -> [{b},{s},{k},{d}], {form} gather, defect {defect} (groups {g2})", base, dist, rel)


FAMILIES["reshapesplit"] = reshapesplit


# ---- an untiled reduce-scatter between a split and a unit-dim drop (rules/splitscatter.egg) -------


def splitscatter(rng: random.Random) -> Program:
    """y' = dot(a', b') a partial sum (the contracting dim sharded), reshaped to split dim e into
    (c, n/c), reduce-scattered along e over the group, the unit dim dropped: block r along e of
    the baseline's dot. Drawn: the element type (floats and ints, narrow ones wrap alike), rank
    2 or 3, e, the groups; near misses: the split as (n/c, c) scattered along e + 1 (strided
    rows), a max reducer, the reduce-scatter over other groups, the output declared along the
    other dim, the contraction not sharded (a duplicate summed c times)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "f32", "bf16", "s32", "s8", "u16"])
    rows = [rng.choice([2, 3]) * c] + ([rng.choice([2, 4])] if rng.random() < 0.4 else [])
    m = rng.choice([3, 4])
    k = 2 * c
    out = [*rows, m]
    e = rng.choice([i for i, n in enumerate(rows) if n % c == 0])  # the scattered dim splits into c
    defect = rng.choice(["none"] * 6 + ["strided", "max", "other_groups", "out_dim", "dup_contract"])
    rs_groups = _other_groups(rng, groups) if defect == "other_groups" else groups
    kl = k if defect == "dup_contract" else k // c

    def sh(dims: list[int]) -> str:
        return f"{t}[{','.join(map(str, dims))}]"

    a_b, a_d = [*rows, k], [*rows, kl]
    nd = len(out)
    dot = f"lhs_contracting_dims={{{nd - 1}}}, rhs_contracting_dims={{0}}"
    base = (f"HloModule ss_base\n\nENTRY %main (a: {sh(a_b)}, b: {sh([k, m])}) -> {sh(out)} {{\n  %a = {sh(a_b)} parameter(0)\n  %b = {sh([k, m])} parameter(1)\n"
            f"  ROOT %y = {sh(out)} dot({sh(a_b)} %a, {sh([k, m])} %b), {dot}\n}}\n")
    n = out[e]
    if defect == "strided":
        split = [*out[:e], n // c, c, *out[e + 1:]]
        se = e + 1
    else:
        split = [*out[:e], c, n // c, *out[e + 1:]]
        se = e
    scat = list(split)
    scat[se] = 1
    final = [d for i, d in enumerate(scat) if i != se]
    red = "maximum" if defect == "max" else "add"
    dist = (f"HloModule ss_dist\n\n{_reducer('red', red, t)}\nENTRY %main (r: s32[], a: {sh(a_d)}, b: {sh([kl, m])}) -> {sh(final)} {{\n"
            f"  %r = s32[] parameter(0)\n  %a = {sh(a_d)} parameter(1)\n  %b = {sh([kl, m])} parameter(2)\n"
            f"  %y = {sh(out)} dot({sh(a_d)} %a, {sh([kl, m])} %b), {dot}\n"
            f"  %s = {sh(split)} reshape({sh(out)} %y)\n"
            f"  %rs = {sh(scat)} reduce-scatter({sh(split)} %s), channel_id=1, replica_groups={_groups_text(rs_groups)}, use_global_device_ids=true, dimensions={{{se}}}, to_apply=%red\n"
            f"  ROOT %z = {sh(final)} reshape({sh(scat)} %rs)\n}}\n")
    oe = e
    if defect == "out_dim":
        cands = [i for i in range(nd) if i != e and out[i] % c == 0]
        oe = cands[0] if cands else e
    ins = [{"distributed": 0, "relation": "rank"},
           {"baseline": 0, "distributed": 1, "relation": "duplicate"} if defect == "dup_contract" else {"baseline": 0, "distributed": 1, "relation": "sharded", "dim": nd - 1},
           {"baseline": 1, "distributed": 2, "relation": "duplicate"} if defect == "dup_contract" else {"baseline": 1, "distributed": 2, "relation": "sharded", "dim": 0}]
    rel = {"groups": groups, "inputs": ins, "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": oe}]}
    form = f"{t} dot {out} split dim {e} ({'strided' if defect == 'strided' else 'blocks'}), reduce-scatter {red} over {rs_groups}, defect {defect} (groups {groups})"
    return Program("splitscatter", form, base, dist, rel)


FAMILIES["splitscatter"] = splitscatter


# ---- GQA heads in K groups: KV replicated per group, q padded within each group (rules/kvgroups.egg)


def kvgroups(rng: random.Random) -> Program:
    """neuronx-distributed-inference's GQA.REPLICATE_TO_TP_DEGREE at head granularity: q rows
    [K·G, h] padded within each of K groups to (c/K)·w and split over the group's ranks
    (relation padded with head_groups), the KV rows [K, h] one per rank, rank r holding row
    floor(r·K/c) (grouped). The baseline expands KV by repeat_interleave (a broadcast inserting
    G after dim 0, merged), the rank its one row W = w times; both are combined with q
    (multiply keeps q's zero padding, add does not), mapped, then summed over the heads: a reduce,
    or a dot with an output weight padded like q (all-reduce on the ranks). Defects drawn: the
    baseline tiles KV (query head h reads KV head h mod K, not h // G), q declared padded at the
    tail (CONVERT_TO_MHA's layout: the padding interleaved at the wrong group), the replicated
    KV rows' sum added before the all-reduce (counted c/K times), an all-reduce over other
    groups."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "f32", "s32", "s8", "u8"])
    is_int = t in RANGES
    k = rng.choice([kk for kk in (2, 4) if c % kk == 0])
    q = c // k
    g_heads = rng.randrange(1, 2 * q + 1)
    w = -(-g_heads // q) + (1 if rng.random() < 0.2 else 0)
    n, h = k * g_heads, 2
    combine = rng.choice(["multiply", "multiply", "add"])
    f = rng.choice(["id", "neg"] + ([] if is_int else ["exp"]))
    leave = rng.choice(["sum", "dot"])
    defect = rng.choice(["none"] * 4 + ["tiled", "tailpad", "oversum", "groups"])
    ar_groups = _other_groups(rng, groups) if defect == "groups" else groups

    def prog(name: str, dist: bool) -> str:
        rows, kv, rep = (w, 1, w) if dist else (n, k, g_heads)
        sh, out = f"{t}[{rows},{h}]", f"{t}[{h},{h}]" if leave == "dot" else f"{t}[{h}]"
        if not dist and defect == "tiled":  # jnp.tile: the copies before the KV heads
            expand = f"  %kb = {t}[{rep},{kv},{h}] broadcast({t}[{kv},{h}] %xk), dimensions={{1,2}}\n"
            expand += f"  %ke = {sh} reshape({t}[{rep},{kv},{h}] %kb)\n"
        else:
            expand = f"  %kb = {t}[{kv},{rep},{h}] broadcast({t}[{kv},{h}] %xk), dimensions={{0,2}}\n"
            expand += f"  %ke = {sh} reshape({t}[{kv},{rep},{h}] %kb)\n"
        body = expand + f"  %y = {sh} {combine}({sh} %xq, {sh} %ke)\n"
        body += {"id": f"  %z = {sh} copy({sh} %y)\n", "neg": f"  %z = {sh} negate({sh} %y)\n", "exp": f"  %z = {sh} exponential({sh} %y)\n"}[f]
        body += f"  %zero = {t}[] constant(0)\n"
        if leave == "dot":
            body += f"  %l = {out} dot({sh} %z, {sh} %wo), lhs_contracting_dims={{0}}, rhs_contracting_dims={{0}}\n"
        else:
            body += f"  %l = {out} reduce({sh} %z, {t}[] %zero), dimensions={{0}}, to_apply=%add\n"
        if defect == "oversum":  # the KV rows' own sum added on every rank before the reduce
            body += f"  %ks = {t}[{h}] reduce({t}[{kv},{h}] %xk, {t}[] %zero), dimensions={{0}}, to_apply=%add\n"
            bs = f"  %kt = {out} broadcast({t}[{h}] %ks), dimensions={{{1 if leave == 'dot' else 0}}}\n"
            body += bs + f"  %l2 = {out} add({out} %l, {out} %kt)\n"
        else:
            body += f"  %l2 = {out} copy({out} %l)\n"
        if dist:
            body += f"  ROOT %o = {out} all-reduce({out} %l2), channel_id=1, replica_groups={_groups_text(ar_groups)}, use_global_device_ids=true, to_apply=%add\n"
        else:
            body += f"  ROOT %o = {out} copy({out} %l2)\n"
        return ("HloModule " + name + "\n\n" + _reducer("add", "add", t)
                + f"\nENTRY %main (xq: {sh}, xk: {t}[{kv},{h}], wo: {sh}) -> {out} {{\n  %xq = {sh} parameter(0)\n  %xk = {t}[{kv},{h}] parameter(1)\n  %wo = {sh} parameter(2)\n"
                + body + "}\n")

    qrel: dict[str, Any] = {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "width": w, "head_groups": k}
    if defect == "tailpad" and c * w >= n:
        qrel = {"baseline": 0, "distributed": 0, "relation": "padded", "dim": 0, "width": w}
    orel = {**qrel, "baseline": 2, "distributed": 2}
    ints: dict[str, Any] = {"int_range": [0 if t[0] == "u" else -3, 4]} if is_int else {}
    rel = {"groups": groups, "inputs": [{**qrel, **ints}, {"baseline": 1, "distributed": 1, "relation": "grouped", "dim": 0, "head_groups": k, **ints}, {**orel, **ints}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    form = f"{t} K={k} groups of {g_heads} heads, width {w} over c={c}, {combine} then {f}, {leave}, defect {defect} (groups {groups})"
    return Program("kvgroups", form, prog("kv_base", False), prog("kv_dist", True), rel)


FAMILIES["kvgroups"] = kvgroups


def reshapesplit_split(rng: random.Random) -> Program:
    """transformers' rowwise_split_input (Phi-3's o_proj after its gathered fused qkv): every rank
    holds the whole attention output x [B, S, K, D], views it as [B, S, H] (H = K*D), takes its
    block of the last dim by a dynamic-slice at r*H/c and views that [N, H/c] (N = B*S); the
    baseline views x as [N, H] in one reshape. Drawn: the element type (narrow, unsigned, float),
    the extents, the groups (DP x TP included: r is the position in the rank's group); defects:
    the offset off by one, the block of rank r + 1 (mod c), the view [S, B, H] (transposed rows)."""
    groups = _layout(rng)
    c = len(groups[0])
    t = rng.choice(["f32", "bf16", "s32", "s8", "u8", "f16"])
    b, s, w, d = rng.choice([1, 2]), rng.choice([2, 3]), rng.choice([1, 2]), rng.choice([1, 2, 4])
    h, n = c * w * d, b * s
    k = h // d
    defect = rng.choice(["none"] * 5 + ["off", "next", "transposed"])
    if defect == "transposed":
        b = 2
        n = b * s
    xs, ys, blk = f"{t}[{b},{s},{k},{d}]", f"{t}[{n},{h}]", h // c
    base = (f"HloModule rss_base\n\nENTRY %main (x: {xs}) -> {ys} {{\n  %x = {xs} parameter(0)\n"
            f"  %n = {xs} negate({xs} %x)\n  ROOT %y = {ys} reshape({xs} %n)\n}}\n")
    lines = ["  %r = s32[] parameter(0)", f"  %x = {xs} parameter(1)", f"  %n = {xs} negate({xs} %x)"]
    if defect == "transposed":
        lines += [f"  %v0 = {t}[{s},{b},{h}] reshape({xs} %n)", f"  %v = {t}[{b},{s},{h}] transpose({t}[{s},{b},{h}] %v0), dimensions={{1,0,2}}"]
    else:
        lines.append(f"  %v = {t}[{b},{s},{h}] reshape({xs} %n)")
    rank = "%r"
    if defect == "next":
        lines += ["  %one = s32[] constant(1)", "  %r1 = s32[] add(s32[] %r, s32[] %one)", f"  %cc = s32[] constant({c})", "  %rn = s32[] remainder(s32[] %r1, s32[] %cc)"]
        rank = "%rn"
    lines += [f"  %wd = s32[] constant({blk})", f"  %off0 = s32[] multiply(s32[] {rank}, s32[] %wd)"]
    if defect == "off":
        lines += ["  %one = s32[] constant(1)", "  %off = s32[] add(s32[] %off0, s32[] %one)"]
    else:
        lines.append("  %off = s32[] copy(s32[] %off0)")
    lines += ["  %z = s32[] constant(0)",
              f"  %ds = {t}[{b},{s},{blk}] dynamic-slice({t}[{b},{s},{h}] %v, s32[] %z, s32[] %z, s32[] %off), dynamic_slice_sizes={{{b},{s},{blk}}}",
              f"  ROOT %y = {t}[{n},{blk}] reshape({t}[{b},{s},{blk}] %ds)"]
    dist = f"HloModule rss_dist\n\nENTRY %main (r: s32[], x: {xs}) -> {t}[{n},{blk}] {{\n" + "\n".join(lines) + "\n}\n"
    rel = {"groups": groups, "inputs": [{"distributed": 0, "relation": "rank"}, {"baseline": 0, "distributed": 1, "relation": "duplicate"}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}]}
    return Program("reshapesplit_split", f"{t} x [{b},{s},{k},{d}] -> [{n},{h}], rank block of {blk}, defect {defect} (groups {groups})", base, dist, rel)


FAMILIES["reshapesplit_split"] = reshapesplit_split
