"""Resolve the relations file's parameters in both graphs and check their shapes, and say which
range facts a declared ``int_range`` gives (range_seeds: on the baseline value always, on the
ranks' pieces only where they hold nothing but baseline values)."""

from __future__ import annotations

from ..errors import InputError
from ..hlo.literals import INT_BITS, int_range
from ..hlo.rank import bind_device_ids
from ..ir import Instruction, Module
from ..relations import Binding, RelationSpec


def param_index(module: Module) -> dict[int | str, Instruction]:
    """Parameters by number and by name: one scan, for thousands of bindings to look up."""
    index: dict[int | str, Instruction] = {}
    for p in module.entry.instructions:
        if p.opcode == "parameter":
            if p.parameter_number is not None:
                index[p.parameter_number] = p
            index[p.name.lstrip("%")] = p
    return index


def param(module: Module, ref: int | str, key: str, side: str, path: str, index: dict[int | str, Instruction] | None = None) -> Instruction:
    found = (index if index is not None else param_index(module)).get(ref if isinstance(ref, int) else ref.lstrip("%"))
    if found is not None:
        return found
    params = module.entry.parameters
    listed = ", ".join(f"{p.parameter_number}:{p.name} {p.shape}" for p in params[:40])
    more = ", ..." if len(params) > 40 else ""
    raise InputError(path, f"{key}.{side}", f"no parameter {ref!r} in the {side} entry computation (it has {listed}{more})")


def outputs(module: Module) -> list[Instruction]:
    root = module.entry.root
    if root.opcode == "tuple":
        return [module.entry[o] for o in root.operands]
    return [root]


def check_inputs(spec: RelationSpec, base: Module, dist: Module) -> tuple[list[tuple[Binding, Instruction | None, Instruction]], set[str]]:
    """Resolve and shape-check every input binding; every distributed parameter needs one."""
    c = spec.c
    bound: list[tuple[Binding, Instruction | None, Instruction]] = []
    # partition-id / replica-id (hlo.flavours made them device-id parameters): the values
    # computed from them that are affine in the rank on every device of every group become
    # rank arithmetic (hlo.rank); the device ids themselves relate to nothing.
    rank_params: set[str] = bind_device_ids(dist, spec.groups)
    seen: dict[str, str] = {p.name: "the device id" for p in dist.entry.parameters if p.parsed.get("device_id") or p.parsed.get("rank_from_device_id")}
    base_index, dist_index = param_index(base), param_index(dist)
    for b in spec.inputs:
        assert b.distributed is not None
        dp = param(dist, b.distributed, b.key, "distributed", spec.path, dist_index)
        if dp.name in seen:
            raise InputError(spec.path, b.key, f"distributed parameter {dp.name} is already bound by {seen[dp.name]}")
        seen[dp.name] = b.key
        bp = None
        rel = b.relation
        if rel.kind == "rank":
            if dp.shape.dims != () or dp.shape.dtype not in ("s32", "u32", "s64", "u64"):
                raise InputError(spec.path, b.key, f"a rank input must be an s32[]/u32[] scalar, {dp.name} is {dp.shape}")
            rank_params.add(dp.name)
        elif rel.kind == "token":
            # A token is a leaf with no relation: anything computed from it stays unrelated.
            pass
        else:
            assert b.baseline is not None
            bp = param(base, b.baseline, b.key, "baseline", spec.path, base_index)
            _check_shapes(spec.path, b, bp, dp, c)
            if b.gathered is not None:
                # The relation holds for the parameter's all-gathers that restore the rank's
                # value; the parameter itself, and any other use of it, relates to nothing.
                # Their int_range is seeded on those all-gathers: it must fit the type too
                # (tests/test_soundness_review_r.py: u32 ids 'in [-5, 5)' were verified).
                _check_int_range(spec.path, b, [bp, dp])
                bound.extend((b, bp, ag) for ag in _restoring_gathers(dist, dp, b))
                continue
        _check_int_range(spec.path, b, [x for x in (bp, dp) if x is not None])
        bound.append((b, bp, dp))
    missing = [p for p in dist.entry.parameters if p.name not in seen]
    if missing:
        p = missing[0]
        raise InputError(spec.path, "inputs", f"distributed parameter {p.parameter_number} ({p.name}: {p.shape}) has no relation; say how it relates to the baseline (duplicate, sharded, partial or rank)")
    return bound, rank_params


def _check_int_range(path: str, b: Binding, params: list[Instruction]) -> None:
    """A declared ``int_range: [lo, hi)`` is a fact about integer values the inputs hold: the
    parameters must have an integer type that holds every value of it (a range beyond the type
    would be seeded as a fact about values no input can hold: u32 ids 'in [-5, 5)' are
    4294967291.. and 0..4, and a compare decided on [-5, 5) is wrong)."""
    if b.int_range is None:
        return
    lo, hi = int(b.int_range[0]), int(b.int_range[1])
    if lo >= hi:
        raise InputError(path, f"{b.key}.int_range", f"expected lo < hi, got [{lo}, {hi}]")
    for p in params:
        dt = p.shape.dtype
        if dt not in INT_BITS:
            raise InputError(path, f"{b.key}.int_range", f"an int_range applies to integer inputs; {p.name} is {p.shape}")
        tlo, thi = int_range(dt)
        if lo < tlo or hi - 1 > thi:
            raise InputError(path, f"{b.key}.int_range", f"[{lo}, {hi}) does not fit {p.name}'s type {dt} (values {tlo}..{thi})")


def _restoring_gathers(dist: Module, dp: Instruction, b: Binding) -> list[Instruction]:
    """The all-gathers of parameter ``dp`` along the gathered dim over exactly the gathered
    groups (each group's devices in its order: block j comes from its j-th device)."""
    assert b.gathered is not None
    want = sorted(b.gathered.groups)
    out = []
    for ins in dist.entry.instructions:
        if ins.opcode != "all-gather" or [o.lstrip("%") for o in ins.operands] != [dp.name.lstrip("%")]:
            continue
        groups = ins.parsed.get("replica_groups")
        if list(ins.parsed.get("dimensions", [])) == [b.gathered.dim] and groups and sorted(tuple(g) for g in groups) == want:
            out.append(ins)
    return out


def _check_shapes(path: str, b: Binding, bp: Instruction, dp: Instruction, c: int) -> None:
    rel = b.relation
    bs, ds = bp.shape, dp.shape
    if bs.dtype != ds.dtype:
        raise InputError(path, b.key, f"element types differ: baseline {bp.name} is {bs}, distributed {dp.name} is {ds}")
    expect = list(bs.dims)
    if rel.kind == "sharded":
        d = rel.dim or 0
        if d >= len(expect):
            raise InputError(path, f"{b.key}.dim", f"dim {d} is out of range for {bp.name}: {bs}")
        if rel.blocks:
            if sum(rel.blocks) != expect[d] or any(x % c for x in rel.blocks):
                raise InputError(path, f"{b.key}.blocks", f"blocks {list(rel.blocks)} must sum to {expect[d]} and each divide by c={c}")
        elif expect[d] % c:
            raise InputError(path, f"{b.key}.dim", f"dim {d} of {bs} does not divide by c={c}")
        expect[d] //= c
    if rel.kind == "grouped" or (rel.kind == "padded" and rel.head_groups > 1):
        # K head groups of equal extent, c/K ranks per group (rules/kvgroups.egg).
        d, k = rel.dim or 0, rel.head_groups
        if d >= len(expect):
            raise InputError(path, f"{b.key}.dim", f"dim {d} is out of range for {bp.name}: {bs}")
        if c % k or expect[d] % k:
            raise InputError(path, f"{b.key}.head_groups", f"{k} head groups need c={c} ranks and dim {d} of baseline {bp.name} ({bs}) to divide by {k}")
    if rel.kind == "grouped":
        expect[rel.dim or 0] //= rel.head_groups
    if rel.kind == "padded" and rel.head_groups > 1:
        d, w, k = rel.dim or 0, rel.width or 0, rel.head_groups
        if (c // k) * w < expect[d] // k:
            raise InputError(path, f"{b.key}.width", f"width {w} over the {c // k} ranks of each of {k} head groups covers {(c // k) * w} elements, fewer than a group's {expect[d] // k} along dim {d} of baseline {bp.name} ({bs}) (expected width >= {-(-(expect[d] // k) // (c // k))})")
        expect[d] = w
    elif rel.kind == "padded":
        d, w = rel.dim or 0, rel.width or 0
        if d >= len(expect):
            raise InputError(path, f"{b.key}.dim", f"dim {d} is out of range for {bp.name}: {bs}")
        if rel.blocks:
            # Each block padded on its own: the blocks tile dim d, and block i's width covers it.
            if sum(rel.blocks) != expect[d]:
                raise InputError(path, f"{b.key}.blocks", f"blocks {list(rel.blocks)} sum to {sum(rel.blocks)}, but dim {d} of baseline {bp.name} ({bs}) has {expect[d]}")
            for i, (n, wi) in enumerate(zip(rel.blocks, rel.widths, strict=True)):
                if c * wi < n:
                    raise InputError(path, f"{b.key}.width", f"block {i} ({n} elements) with width {wi} over c={c} ranks covers {c * wi}, fewer than the block (expected width >= {-(-n // c)})")
        elif c * w < expect[d]:
            raise InputError(path, f"{b.key}.width", f"width {w} over c={c} ranks covers {c * w} elements, fewer than the {expect[d]} of dim {d} of baseline {bp.name} ({bs})")
        expect[d] = w
    how = rel.describe()
    if b.gathered is not None:
        gd, k = b.gathered.dim, len(b.gathered.groups[0])
        if gd >= len(expect) or expect[gd] % k:
            raise InputError(path, f"{b.key}.gathered.dim", f"dim {gd} of {how} of baseline {bp.name} ({bs}) does not divide into {k} gathered blocks")
        expect[gd] //= k
        how += f" in {k} blocks along dim {gd}"
    if list(ds.dims) != expect:
        raise InputError(path, b.key, f"distributed {dp.name} is {ds}, but {how} of baseline {bp.name} ({bs}) needs {bs.dtype}[{','.join(map(str, expect))}]")


def range_seeds(b: Binding, bg: int | str | None, dg: int | str) -> list[str]:
    """The ``inrange`` facts (rules/slicing.egg) a declared ``int_range: [lo, hi)`` states, for
    baseline node ``bg`` (None when only the distributed side is in view) and distributed node
    ``dg``. The range bounds the baseline value. It holds on the ranks' pieces only where they
    hold nothing but baseline values:

    - duplicate, sharded: each piece is (a block of) the baseline value: [lo, hi) there;
    - partial: the pieces sum (max, min) to the baseline value and are unbounded themselves:
      the range goes on the baseline only (the witness draws it so);
    - padded: past the baseline's extent a piece holds the zero tail, a value the baseline
      does not hold, so the pieces lie in [lo, hi) joined with {0}; the baseline in [lo, hi)
      (a guard such as ``where(w < 1, d, w)`` is then not decided false on the tail)."""
    if b.int_range is None:
        return []
    lo, hi = int(b.int_range[0]), int(b.int_range[1])
    kind = b.relation.kind
    out: list[str] = []
    if bg is not None and kind in ("partial", "padded"):
        out.append(f"(inrange (N {bg}) {lo} {hi})")
    if kind == "padded":
        out.append(f"(inrange (N {dg}) {min(lo, 0)} {max(hi, 1)})")
    elif kind != "partial":
        out.append(f"(inrange (N {dg}) {lo} {hi})")
    return out
