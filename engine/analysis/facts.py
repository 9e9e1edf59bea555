"""Facts read back from the e-graph, indexed by distributed instruction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..relations import Binding, RelationSpec
from .egg import Session
from .graph import Graphs
from .laws.layout import LayoutSolver


@dataclass
class Fact:
    baseline: int
    distributed: int
    relation: str  # "duplicate", "sharded(dim=1)", "partial(add)", ...
    rule: str = ""
    # The egglog fact that re-asserts this relation in another e-graph, with {b} and {d} for the
    # baseline and distributed handles (None: not carried across a partition boundary).
    seed: str | None = None


@dataclass
class Facts:
    # distributed gid -> list of (baseline gids, relation text, rule)
    by_dist: dict[int, list[Fact]]
    classes: dict[int, int]  # gid -> e-class number
    members: dict[int, list[int]]  # e-class number -> gids
    bijections: list[dict[str, object]]  # every non-identity layout relating a pair


def _mask(m: object) -> str:
    """The ring offsets k (block (r + k) mod c) in a bit mask, as a set."""
    return "{" + ",".join(str(k) for k in range(63) if int(m) >> k & 1) + "}"  # type: ignore[call-overload]


def read_facts(session: Session, g: Graphs, solver: LayoutSolver) -> Facts:
    tables = session.rows(["N", "dup", "sharded", "partial", "via", "rank", "layout", "affine", "shifted", "below0", "abovew", "outside", "clamped", "clipin", "lrd", "vgather", "vmask", "faffine", "fquot", "rdiv", "grp", "gpart", "inrange", "argpair", "argix", "extof", "gext", "gix", "athas", "argcand", "rot", "lrot", "rterm", "rsum", "scof", "pad", "padb", "kvg", "rot2", "rred", "pexp", "osum", "fsdppiece", "xcol", "xpair", "xgp", "xpp", "xpd", "xlab", "mb", "mbevery", "mbp", "mbacc"])
    cls_of_value: dict[object, int] = {}
    classes: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    for gid, value in tables["N"]:
        cid = cls_of_value.setdefault(value, len(cls_of_value))
        classes[int(gid)] = cid  # type: ignore[arg-type]
        members.setdefault(cid, []).append(int(gid))  # type: ignore[arg-type]
    rules: dict[tuple[int, int], str] = {}
    scaled_rules: dict[tuple[object, object], str] = {}
    for x, xp, name in tables["via"]:
        if x in cls_of_value and xp in cls_of_value:
            rules.setdefault((cls_of_value[x], cls_of_value[xp]), str(name))
        elif xp in cls_of_value:
            scaled_rules.setdefault((x, xp), str(name))
    # Scaled baseline values (rules/scaling.egg): the e-class of q·x -> (x, "num/den").
    scaled: dict[object, tuple[object, str]] = {}
    for s, x, num, den in tables["scof"]:
        if s not in cls_of_value and x in cls_of_value:
            scaled.setdefault(s, (x, str(num) if str(den) == "1" else f"{num}/{den}"))
    by_dist: dict[int, list[Fact]] = {}

    def add(x: object, xp: object, text: str, seed: str | None = None) -> None:
        if xp not in cls_of_value:
            return
        scale = ""
        if x not in cls_of_value:
            if x not in scaled:
                return
            rule = scaled_rules.get((x, xp), "input")
            x, scale = scaled[x]
            num, _, den = scale.partition("/")
            seed = seed.replace("{b}", f"(Sc (bigrat (bigint {num}) (bigint {den or 1})) {{b}})") if seed else seed
            # Its own text, so that no check for a plain relation (an output's, the witness's
            # seeding) takes it for one: it relates to scale·x, not to x.
            text = f"{SCALED}{scale}) {text}"
        cx, cxp = cls_of_value[x], cls_of_value[xp]
        if not scale:
            rule = rules.get((cx, cxp), "input")
        for dg in members[cxp]:
            if g.nodes[dg].side != "distributed":
                continue
            by_dist.setdefault(dg, []).append(Fact(cx, dg, text, rule, seed))

    for x, xp in tables["dup"]:
        add(x, xp, "duplicate", "(dup {b} {d})")
    for x, xp, d, s in tables["sharded"]:
        add(x, xp, f"sharded(dim={d}, blocks=[{s}])" if s else f"sharded(dim={d})", f'(sharded {{b}} {{d}} {d} "{s}")')
    for x, xp, op in tables["partial"]:
        add(x, xp, f"partial({op})", f'(partial {{b}} {{d}} "{op}")')
    bijections: list[dict[str, object]] = []
    for x, xp, lkey, kind in tables["layout"]:
        if lkey != "id" and (x in cls_of_value or x in scaled) and xp in cls_of_value:
            ops = solver.describe(str(lkey))
            add(x, xp, f"layout({kind}, bijection=[{', '.join(ops)}])", f'(layout {{b}} {{d}} "{lkey}" "{kind}")')
            if x not in cls_of_value:
                continue
            bs = [m for m in members[cls_of_value[x]] if g.nodes[m].side == "baseline"]
            ds = [m for m in members[cls_of_value[xp]] if g.nodes[m].side == "distributed"]
            if bs and ds:
                bijections.append({"baseline": "%" + g.nodes[bs[0]].ins.name, "distributed": "%" + g.nodes[ds[0]].ins.name, "relation": kind, "ops": ops, "key": str(lkey), "gids": (bs[0], ds[0])})
    def add_dist_only(xp: object, text: str, rule: str, seed: str | None = None) -> None:
        if xp in cls_of_value:
            for dg in members[cls_of_value[xp]]:
                if g.nodes[dg].side == "distributed":
                    by_dist.setdefault(dg, []).append(Fact(-1, dg, text, rule, seed))

    for (xp,) in tables["rank"]:
        add_dist_only(xp, "rank", "input", "(rank {d})")
    for xp, a, b in tables["affine"]:
        add_dist_only(xp, f"rank-affine({a}*r{int(b):+d})", "slicing/rank-arithmetic", f"(affine {{d}} {a} {b})")  # type: ignore[call-overload]
    for xp, a, b in tables["faffine"]:
        add_dist_only(xp, f"rank-affine float({a}*r{int(b):+d})", "slicing/rank-arithmetic", f"(faffine {{d}} {a} {b})")  # type: ignore[call-overload]
    for xp, a, v in tables["fquot"]:
        add_dist_only(xp, f"rank-affine float({a}*r/{v})", "slicing/rank-division")
    for xp, lo, hi in tables["inrange"]:
        add_dist_only(xp, f"{VALUE_RANGE}[{lo}, {hi})", "slicing/value-range", f"(inrange {{d}} {lo} {hi})")
    for xp, k in tables["rdiv"]:
        add_dist_only(xp, f"floor(r/{k})", "slicing/rank-division", f"(rdiv {{d}} {k})")
    for x, xp, d, w, z in tables["pad"]:
        tail = "zeros" if int(z) else "any values"  # type: ignore[call-overload]
        add(x, xp, f"padded(dim={d}, width={w}, tail={tail})", f"(pad {{b}} {{d}} {d} {w} {z})")
    for x, xp, d, w, z, s in tables["padb"]:  # rules/padded.egg: padded in blocks (a fused weight)
        tail = "zeros" if int(z) else "any values"  # type: ignore[call-overload]
        add(x, xp, f"padded(dim={d}, blocks=[{s}], width={w}, tail={tail})", f'(padb {{b}} {{d}} {d} {w} {z} "{s}")')
    for x, xp, d, w, z, k, o in tables["kvg"]:  # rules/kvgroups.egg: K head groups (GQA replicated KV)
        tail = "zeros" if int(z) else "any values"  # type: ignore[call-overload]
        how = f"padded within {k} head groups(dim={d}, width={w}, tail={tail})" if int(o) else f"grouped in {k} head groups(dim={d}, block floor(r*{k}/c))"  # type: ignore[call-overload]
        add(x, xp, how, f"(kvg {{b}} {{d}} {d} {w} {z} {k} {o})")
    for x, xp, d, k, e in tables["grp"]:
        where = f", block r mod {k} of {k} along dim {e}" if int(e) >= 0 else ""  # type: ignore[call-overload]
        add(x, xp, f"rank-group(block floor(r/{k}) along dim {d}{where})", f"(grp {{b}} {{d}} {d} {k} {e})")
    for x, xp, d, k in tables["gpart"]:  # rules/scatter.egg
        add(x, xp, f"rank-group partial sum(block floor(r/{k}) along dim {d}, summed over the {k} ranks of the group)", f"(gpart {{b}} {{d}} {d} {k})")
    # Microbatches (rules/microbatch.egg): blocks of the batch and their contributions count as
    # related for localization, so a pipeline's finding is where the blocks stop relating (a
    # sum missing a block, a loss not divided by M), not at the first slice or bias broadcast.
    for x, xp, d, e, n in tables["mb"]:
        add(x, xp, f"microbatch block {e} of {n} along dim {d}", f"(mb {{b}} {{d}} {d} {e} {n})")
    for x, xp, d, n in tables["mbevery"]:
        add(x, xp, f"every microbatch block of {n} along dim {d}", f"(mbevery {{b}} {{d}} {d} {n})")
    for x, xp, e, n, _y, _d in tables["mbp"]:
        add(x, xp, f"microbatch {e}'s contribution (of {n})")
    for x, xp, m, n, _y, _d in tables["mbacc"]:
        add(x, xp, f"sum of the contributions of microbatches {_mask(m)} (of {n})")
    for z, x, d, _size, n, mask in tables["lrd"]:
        # Only sums over blocks of a sharded tensor relate to the baseline (x is the baseline).
        blocks = [str(e) for e in range(int(n)) if int(mask) >> e & 1]  # type: ignore[call-overload]
        add(x, z, f"sum of local blocks {{{','.join(blocks)}}} of {n} along dim {d}")
    # Intermediates of the vocab-parallel argmax (rules/argreduce.egg) count as related for
    # localization; only the all-reduce(min) that discharges them relates to the baseline.
    # argpair/extof/argix hold of ANY tensor (a softmax's row max is an extof): they count only
    # when the tensor reduced is sharded along the reduced dim (the vocab-parallel case, where a
    # later all-reduce makes them relate), else every softmax after a divergence (its scores
    # unrelated, or a partial sum) would be reported as a frontier of its own.
    sharded_along = {(cls_of_value[xp], int(d)) for _x, xp, d, _s in tables["sharded"] if xp in cls_of_value}  # type: ignore[call-overload]

    def vocab_parallel(x: object, d: object) -> bool:
        return x in cls_of_value and (cls_of_value[x], int(d)) in sharded_along  # type: ignore[call-overload]

    for xp, x, d, op, n in tables["argpair"]:
        if vocab_parallel(x, d):
            add_dist_only(xp, f"(arg{op}, index) of the rank's values along dim {d} ({n} of them)", "argreduce/argpair")
    for xp, x, d, op in tables["extof"]:
        if vocab_parallel(x, d):
            add_dist_only(xp, f"{op} of the rank's values along dim {d}", "argreduce/extreme")
    for xp, x, d, op, n, _t in tables["argix"]:
        if vocab_parallel(x, d):
            add_dist_only(xp, f"arg{op} along dim {d} within the rank's {n} values", "argreduce/local-index")
    for xp, _x, d, op in tables["gext"]:
        add_dist_only(xp, f"{op} along dim {d} over all ranks", "argreduce/global-extreme")
    for xp, _x, d, op, n, _t in tables["gix"]:
        add_dist_only(xp, f"index of the rank's {op} along dim {d} in all {n} values (rank offset added)", "argreduce/global-index")
    for xp, _x, d, op in tables["athas"]:
        add_dist_only(xp, f"whether the rank holds the {op} along dim {d}", "argreduce/holds-extreme")
    for xp, _x, d, op, _n, _t in tables["argcand"]:
        add_dist_only(xp, f"the rank's candidate for arg{op} along dim {d} (min over ranks)", "argreduce/candidate")
    # The gathered (extreme, id) pairs of rules/argranks.egg: related for localization (only the
    # id taken at the arg-reduce of the gathered extremes relates to the baseline), so a wrong
    # id table is reported where it is built, not at the extremes' all-gather. (Read apart: the
    # family may be left out, bench/scale.py --without.)
    try:
        tables.update(session.rows(["bext", "lidx", "gidx", "gvals", "gids"]))
    except KeyError:
        tables.update({name: [] for name in ("bext", "lidx", "gidx", "gvals", "gids")})
    for xp, x, op in tables["bext"]:
        if vocab_parallel(x, 1):
            add_dist_only(xp, f"{op} of the rank's values along dim 1", "argranks/block-extreme")
    for xp, x, op, n in tables["lidx"]:
        if vocab_parallel(x, 1):
            add_dist_only(xp, f"arg{op} along dim 1 within the rank's {n} values", "argranks/local-index")
    for xp, _x, op, w, _t in tables["gidx"]:
        add_dist_only(xp, f"the rank's id of its arg{op} along dim 1 (r*{w} + local index)", "argranks/rank-id")
    for xp, _x, op in tables["gvals"]:
        add_dist_only(xp, f"every rank's {op} along dim 1, gathered in rank order", "argranks/gathered-extremes")
    for xp, _x, op, n, _t in tables["gids"]:
        add_dist_only(xp, f"every rank's id of its arg{op} among {n} values, gathered in rank order", "argranks/gathered-ids")
    # Ring steps (rules/permute.egg): related for localization; only a sum over every block
    # (rsum over all offsets) relates plainly, as dup.
    for x, xp, d, k in tables["rot"]:
        add(x, xp, f"block (r+{k}) mod c along dim {d}")
    for x, xp, lkey, kind, k in tables["lrot"]:
        add(x, xp, f"block (r+{k}) mod c ({kind}) under layout {lkey}")
    for x, xp, k, _a, _b, _tag in tables["rterm"]:
        add(x, xp, f"the term of block (r+{k}) mod c of a sum over blocks")
    for x, xp, m, _a, _b, _tag in tables["rsum"]:
        ks = [str(k) for k in range(63) if int(m) >> k & 1]  # type: ignore[call-overload]
        add(x, xp, f"the sum of the terms of blocks (r+k) mod c for k in {{{','.join(ks)}}}")
    # 2-D ring blocks and the online softmax over ring steps (rules/ring.egg): related for
    # localization only; a reduce or sum over every key block relates plainly (rot).
    for x, xp, da, ka, db, kb in tables["rot2"]:
        add(x, xp, f"block (r+{ka}) mod c along dim {da} and (r+{kb}) mod c along dim {db}")
    for x, xp, e, ka, m, op, _x, _db in tables["rred"]:
        add(x, xp, f"the {op} over key blocks {_mask(m)} of the rows of block (r+{ka}) mod c along dim {e}")
    for x, xp, _da, _ka, _db, kb, m, _x in tables["pexp"]:
        add(x, xp, f"exp relative to the running max over key blocks {_mask(m)}, key block (r+{kb}) mod c")
    for x, xp, e, ka, s, m, _x, _db, _w in tables["osum"]:
        text = f"the sum over key blocks {_mask(s)} relative to the running max over key blocks {_mask(m)}, rows of block (r+{ka}) mod c along dim {e}"
        if x in cls_of_value:
            add(x, xp, text)
        else:
            # x is a term the rules wrote (rules/dotscale.egg's dot(E, V)), no baseline
            # instruction: the rank's sum still counts as related, so a wrong step of the ring
            # is found at that step and not at the dots feeding it.
            add_dist_only(xp, text, "ring/online-softmax")
    for name in ("shifted", "below0", "abovew", "outside", "clamped", "clipin", "vgather", "vmask"):  # clipin: rules/takealong.egg
        for ids, xp, w in tables[name]:
            if ids in cls_of_value:
                add(ids, xp, f"{name}(w={w})")
            else:
                # ids is a term of the rules, not an instruction (rules/crossentropy.egg: the
                # labels reshaped as the ranks reshape them): related for localization only.
                add_dist_only(xp, f"{name}(w={w}) of reshaped labels", "crossentropy/labels")
    # The vocab-parallel pick of the labels' log-probabilities (rules/crossentropy.egg): its
    # intermediates count as related for localization; only the loss relates to the baseline.
    for (xp,) in tables["xlab"]:
        add_dist_only(xp, "the labels with ignored ones set to 0 (a term of the rules, not an instruction)", "crossentropy/labels")
    for _t, xp, w in tables["xcol"]:
        add_dist_only(xp, f"the labels shifted into this rank's block (w={w})", "crossentropy/pick")
    for _t, xp, w in tables["xpair"]:
        add_dist_only(xp, f"(row, label shifted into this rank's block) index pairs (w={w})", "crossentropy/pick")
    for _s, _t, xp, w in tables["xgp"]:
        add_dist_only(xp, f"log-probabilities picked in this rank's block (w={w})", "crossentropy/pick")
    for _s, _t, xp in tables["xpp"]:
        add_dist_only(xp, "picked log-probabilities, one rank's share (their sum over the ranks is the pick)", "crossentropy/pick")
    for _s, _t, xp in tables["xpd"]:
        add_dist_only(xp, "the labels' log-probabilities (summed over the ranks)", "crossentropy/pick")
    # Experts as a list per rank (rules/expertlist.egg): each fact holds on one rank only (rank
    # r's local expert j is the baseline's expert r*n + j), so these count as related for
    # localization and never as a relation of an output or a seed of another segment.
    try:
        el = session.rows(["ex", "tb", "dupr", "segr"])
    except KeyError:  # the family is not registered (bench/scale.py --without expertlist)
        el = {"ex": [], "tb": [], "dupr": [], "segr": []}

    def _bname(x: object) -> str:
        names = ["%" + g.nodes[m].ins.name for m in members.get(cls_of_value.get(x, -1), []) if g.nodes[m].side == "baseline"]
        return names[0] if names else "a baseline value"

    per_rank: dict[object, list[str]] = {}
    for x, xp, r, a in el["ex"]:
        tiled = f" tiled {g.spec.c} times along dim {a}" if int(a) >= 0 else ""  # type: ignore[call-overload]
        per_rank.setdefault(xp, []).append(f"rank {r}: {_bname(x)}{tiled}")
    for xp, texts in per_rank.items():
        shown = sorted(texts)
        more = f", ... ({len(shown)} ranks)" if len(shown) > 4 else ""
        add_dist_only(xp, "one baseline expert's value per rank (" + "; ".join(shown[:4]) + more + ")", "expertlist/local-expert")
    for x, xp, a, d in el["tb"]:
        add_dist_only(xp, f"block r along dim {d} of {_bname(x)}, tiled along dim {a}", "expertlist/received-or-joined")
    for x, xp, _s in el["dupr"]:
        add_dist_only(xp, f"{_bname(x)} reshaped", "expertlist/returned")
    for tp, r, _sa, sb in el["segr"]:
        add_dist_only(tp, f"rank {r}: its share of the sum {_bname(sb)}", "expertlist/summed")
    # Rank blocks bound for an all-to-all (rules/alltoall.egg's rkblock: on rank r, block r along
    # u of block e along v of x, established from the operands' own relations): related for
    # localization only, so a wrong order of the received pieces is found where they are joined,
    # not at the pieces themselves.
    try:
        rk = session.rows(["rkblock"])["rkblock"]
    except KeyError:  # the family is not registered (bench/scale.py --without alltoall)
        rk = []
    for x, p, u, v, e in rk:
        add_dist_only(p, f"on rank r, block r along dim {u} of block {e} along dim {v} of {_bname(x)}", "alltoall/rank-block")
    # A layer's slice of an FSDP-split input (rules/fsdpslice.egg): a piece of the weight its
    # all-gather restores, related for localization only.
    for (xp,) in tables["fsdppiece"]:
        add_dist_only(xp, "one layer's slice of an FSDP-split input (its all-gather restores the layer)", "fsdpslice/piece")
    # Rows of a rolled ring buffer (rules/rollring.egg) and chunks of a ring's partial sums
    # (rules/ringcollect.egg's rpart): related for localization only. A buffer counts once
    # every one of its rows is known, so a ring step that writes a wrong row is found where it
    # writes, not where the buffer is cut or rolled back.
    try:
        rv = session.rows(["rvzu", "rvpu", "rvz", "rvp", "rpart", "rvblock"])
    except KeyError:  # the family is not registered (bench/scale.py --without rollring)
        rv = {"rvzu": [], "rvpu": [], "rvz": [], "rvp": [], "rpart": [], "rvblock": []}
    blocks = {(int(v), int(d)) for v, d in rv["rvblock"]}  # type: ignore[call-overload]
    for x, bp, _d, a, s, b, *_rest in rv["rvzu"] + rv["rvpu"]:
        add_dist_only(bp, f"ring buffer: row j is block ({a}*j + {s}*r + {b}) mod c of {_bname(x)}", "rollring/rows")
    rows_known: dict[object, dict[int, str]] = {}
    for x, bp, d, j, s, k, *rest in rv["rvz"] + rv["rvp"]:
        terms = f" (terms {_mask(rest[0])})" if rest else ""
        rows_known.setdefault((bp, int(d)), {})[int(j)] = f"row {j} is block ({s}*r + {k}) mod c of {_bname(x)}{terms}"  # type: ignore[call-overload]
    for (bp, d), known_rows in rows_known.items():
        # Keyed d (a split buffer: c rows; a unit row: extent 1) or d + 64 (a flat buffer: c
        # blocks; one block taken out: rvblock).
        gids = members.get(cls_of_value.get(bp, -1), [])
        unit = bool(gids) and (g.nodes[gids[0]].ins.shape.dims[d] == 1 if d < 64 else (gids[0], d - 64) in blocks)
        if gids and (len(known_rows) == g.spec.c or (unit and set(known_rows) == {0})):
            add_dist_only(bp, "ring buffer: " + "; ".join(known_rows[j] for j in sorted(known_rows)), "rollring/rows")
    for x, xp, e, ka, m, *_rest in rv["rpart"]:
        add_dist_only(xp, f"block (r+{ka}) mod c along dim {e} of a sum over the terms {_mask(m)} of {_bname(x)}", "ringcollect/chunk")
    bijections.sort(key=lambda b: (str(b["distributed"]), str(b["baseline"])))
    return Facts(by_dist, classes, members, bijections)


def carried_seeds(known: Facts, dg: int, d_handle: str, b_handle: Callable[[int], str | None]) -> list[str]:
    """The proven facts about distributed node dg, as seeds for another e-graph in which dg is
    ``d_handle`` and a baseline node m is ``b_handle(m)`` (None: not in that e-graph)."""
    out = []
    for f in known.by_dist.get(dg, []):
        if f.seed is None:
            continue
        if "{b}" not in f.seed:
            out.append(f.seed.format(d=f"(N {d_handle})"))
            continue
        for m in known.members.get(f.baseline, []):
            bh = b_handle(m)
            if bh is not None:
                out.append(f.seed.format(b=f"(N {bh})", d=f"(N {d_handle})"))
    return out


def public_bijections(bijections: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in b.items() if k != "gids"} for b in bijections]


def expected_text(b: Binding) -> str:
    r = b.relation
    if r.kind == "duplicate":
        return "duplicate"
    if r.kind == "sharded":
        return f"sharded(dim={r.dim}, blocks=[{','.join(map(str, r.blocks))}])" if r.blocks else f"sharded(dim={r.dim})"
    return f"partial({r.op})"


# A relation to a multiple of a baseline value (rules/scaling.egg): "scaled(4) partial(add)".
SCALED = "scaled("


def split_scaled(relation: str) -> tuple[str, str]:
    """("4", "partial(add)") for "scaled(4) partial(add)"; ("", relation) for a plain one."""
    if relation.startswith(SCALED):
        scale, _, base = relation[len(SCALED) :].partition(") ")
        return scale, base
    return "", relation


# A value range says nothing about the baseline: it never makes an instruction related.
VALUE_RANGE = "value-range"


def related(facts: Facts, gid: int) -> bool:
    return any(not f.relation.startswith(VALUE_RANGE) for f in facts.by_dist.get(gid, []))


def describe(g: Graphs, facts: Facts, gid: int) -> str:
    fs = facts.by_dist.get(gid, [])
    if not fs:
        return "unrelated"
    parts = []
    for f in fs[:3]:
        if f.relation == "rank":
            parts.append("the rank index")
        elif f.baseline < 0:
            parts.append(f.relation)
        else:
            bname = baseline_name(g, facts, f.baseline)
            scale, base = split_scaled(f.relation)
            parts.append(f"{base} of {scale}·{bname}" if scale else f"{f.relation} of {bname}")
    return "; ".join(parts)


def baseline_name(g: Graphs, facts: Facts, cls: int) -> str:
    for gid in facts.members.get(cls, []):
        if g.nodes[gid].side == "baseline":
            return "%" + g.nodes[gid].ins.name
    for gid in facts.members.get(cls, []):
        ins = g.nodes[gid].ins
        if ins.opcode == "constant":
            return f"constant {ins.literal}"
    return "a rank-independent value"


def group_text(spec: RelationSpec) -> str:
    return "{" + ",".join(map(str, spec.groups[0])) + "}" if len(spec.groups) == 1 else str(spec.groups)


def ancestors(g: Graphs, roots: list[int], through: Callable[[int], bool] | None = None) -> set[int]:
    """The roots and what they read, transitively; with ``through``, the walk goes on past an
    instruction only where ``through`` holds for it (the instruction itself is still in)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if through is None or through(n):
            stack.extend(g.nodes[n].operands)
    return seen
