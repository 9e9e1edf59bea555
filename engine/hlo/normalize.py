"""Normalize a parsed HLO module so both graphs speak the same small dialect.

Each pass is a function from an entry computation to a new one (the torch.fx model). What they do
and why:
- ``strip_tokens``: torch-xla threads a token through ``xm.*`` collectives (``x + broadcast(tok)``
  before, ``tok * gather(result)`` after, the token being a scalar parameter that holds 0). Only
  parameters the relations file declares as tokens are stripped; the "after" side is dead code.
- ``split_tuples``: a multi-operand all-reduce returns a tuple; split it into one all-reduce per
  operand (identical semantics) and resolve ``get-tuple-element(tuple(...))``. A tuple
  all-to-all (XLA:CPU's own form of every array all-to-all) becomes one array all-to-all
  (``tuple_all_to_all``).
- ``fold_noops``: drop converts to the same type, copies, identity transposes/reshapes/broadcasts, and
  collapse reshape∘reshape and transpose∘transpose chains (row-major reshapes compose exactly).
- ``unit_group_collectives``: a collective whose every replica group has one member is its
  operand (see the function).
- ``dce``: keep only instructions the root depends on.
- ``unmerge_batch_dots``: a batched dot over merged leading dims becomes a dot with two batch
  dims and a reshape (see the function).
Reducer computations are classified (add/max/min/mul/and/or) into ``parsed['reducer']``.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from ..ir import Computation, Instruction, Module, Shape
from .batchnorm import expand_batch_norms
from .flavours import flatten

REDUCER_OPS = {
    "add": "add",
    "maximum": "max",
    "minimum": "min",
    "multiply": "mul",
    "and": "and",
    "or": "or",
}

COLLECTIVES_WITH_REDUCER = ("all-reduce", "reduce-scatter", "reduce", "all-reduce-start")


def classify_reducer(comp: Computation) -> str | None:
    """'add', 'max', ... when the computation is ``ROOT op(p0, p1)`` of its two scalar params."""
    params = comp.parameters
    root = comp.root
    if root.opcode == "copy" and len(root.operands) == 1:
        # A copy changes no value: JAX's partially manual shard_map writes its psum's reducer as
        # copy(add(p0, p1)).
        inner = next((i for i in comp.instructions if i.name == root.operands[0]), None)
        root = inner if inner is not None else root
    if len(params) != 2 or root.opcode not in REDUCER_OPS:
        return None
    names = {p.name for p in params}
    # Seen through a convert pair (bf16 reducers upcast): keep strict, only direct params count.
    if set(root.operands) != names or len(root.operands) != 2:
        return None
    return REDUCER_OPS[root.opcode]


def _copy(ins: Instruction) -> Instruction:
    # copy.copy is ~15x slower; passes replace (never mutate) operand lists and parsed dicts.
    new = Instruction.__new__(Instruction)
    new.__dict__.update(ins.__dict__)
    return new


def _clone(comp: Computation) -> Computation:
    """A new computation over the same instructions: normalize() copied them once already."""
    return Computation(comp.name, list(comp.instructions), comp.is_entry, comp.loc)


def _rewire(instrs: list[Instruction], alias: dict[str, str]) -> None:
    def res(n: str) -> str:
        while n in alias:
            n = alias[n]
        return n

    for ins in instrs:
        ins.operands = [res(o) for o in ins.operands]


def body_text(comp: Computation) -> str:
    """A called computation's meaning without its names: opcodes, value attributes, shapes and
    operands by position. Equal texts compute the same function."""
    pos: dict[str, int] = {}
    parts = []
    for ins in comp.instructions:
        pos[ins.name] = len(pos)
        attrs = ",".join(f"{k}={v}" for k, v in sorted(ins.attrs.items()) if k not in ("metadata", "sharding", "frontend_attributes"))
        head = f"p{ins.parameter_number}" if ins.opcode == "parameter" else ins.opcode
        ops = ",".join(str(pos[o]) for o in ins.operands)
        parts.append(f"{'ROOT ' if ins.is_root else ''}{head}:{ins.shape}({ops}){{{attrs}}}{ins.literal or ''}")
    return "; ".join(parts)


def classify_reducers(module: Module) -> None:
    """On the entry computation's (already copied) instructions: parsed['reducer'] = add/max/min/mul/and/or for plain reducers, else ``body:<text>``;
    sort's comparator goes to parsed['comparator'] as body text. Keys then compare what the
    called computation computes, never its name."""
    for ins in module.entry.instructions:
        callee = ins.parsed.get("to_apply")
        if not (isinstance(callee, str) and callee in module.computations):
            continue
        called = module.computations[callee]
        if ins.opcode == "sort":
            ins.parsed = {**ins.parsed, "comparator": body_text(called)}
        else:
            ins.parsed = {**ins.parsed, "reducer": classify_reducer(called) or f"body:{body_text(called)}"}


def strip_tokens(comp: Computation, tokens: frozenset[str]) -> Computation:
    """Remove torch-xla's token arithmetic: ``x + broadcast(tok)`` is ``x`` because the token
    parameters (declared by the relations file, relation ``token``) hold 0."""
    comp = _clone(comp)
    if not tokens:
        return comp
    by = {i.name: i for i in comp.instructions}

    def is_token(name: str, depth: int = 0) -> bool:
        ins = by[name]
        while ins.opcode in ("broadcast", "reshape", "convert") and ins.operands:
            ins = by[ins.operands[0]]
        if ins.opcode == "multiply" and len(ins.operands) == 2 and depth < 8:
            # tok * v is 0 too (torch-xla's `tok * gather(result)` fed into the next
            # collective's `x + broadcast(...)`): exact for ints, and for floats in the model
            # of README "Semantics", which excludes infinities and NaN (0 * inf is NaN).
            return any(is_token(o, depth + 1) for o in ins.operands)
        return ins.opcode == "parameter" and ins.name in tokens

    alias: dict[str, str] = {}
    for ins in comp.instructions:
        if ins.opcode == "add" and len(ins.operands) == 2:
            a, b = ins.operands
            if is_token(b):
                alias[ins.name] = a
            elif is_token(a):
                alias[ins.name] = b
    _rewire(comp.instructions, alias)
    # _rewire only changes users: an add that is the ROOT itself has none, so the root moves to
    # what it stands for (else the token add stays the entry's result and dce keeps it).
    _move_root(comp.instructions, alias)
    return comp


def _move_root(instructions: list[Instruction], alias: dict[str, str]) -> None:
    """An aliased instruction that is the ROOT hands the root mark to what it stands for."""
    by = {i.name: i for i in instructions}
    for ins in instructions:
        if ins.is_root and ins.name in alias:
            target = ins.name
            while target in alias:
                target = alias[target]
            ins.is_root = False
            by[target].is_root = True


def split_tuples(comp: Computation) -> Computation:
    """One all-reduce per operand; get-tuple-element of a known tuple resolves to the element."""
    comp = _clone(comp)
    out: list[Instruction] = []
    alias: dict[str, str] = {}
    pieces: dict[str, list[str]] = {}
    by = {i.name: i for i in comp.instructions}
    made: set[str] = set()  # array all-to-alls made from tuple ones
    for ins in comp.instructions:
        ins.operands = [alias.get(o, o) for o in ins.operands]
        if ins.opcode == "all-reduce" and ins.shape.is_tuple and len(ins.operands) == len(ins.shape.tuple_shapes):
            names = []
            for k, (opnd, shp) in enumerate(zip(ins.operands, ins.shape.tuple_shapes, strict=True)):
                piece = replace(ins, name=f"{ins.name}.{k}", shape=shp, operands=[opnd], is_root=False, origin=ins.origin or ins.name)
                piece.parsed = dict(ins.parsed)
                out.append(piece)
                names.append(piece.name)
            pieces[ins.name] = names
            continue
        if ins.opcode == "all-to-all" and ins.shape.is_tuple:
            split = tuple_all_to_all(ins, by)
            if split is not None:
                out.extend(split[0])
                by.update((i.name, i) for i in split[0])
                made.update(i.name for i in split[0] if i.opcode == "all-to-all")
                pieces[ins.name] = split[1]
                continue
        if ins.opcode == "concatenate" and made:
            whole = _whole_again(ins, by)
            if whole in made:
                # XLA:CPU concatenates the received pieces again: concatenating every piece
                # of x along d in order is x.
                alias[ins.name] = whole
                if ins.is_root:
                    by[whole].is_root = True
                continue
        if ins.opcode == "tuple":
            pieces[ins.name] = list(ins.operands)
        if ins.opcode == "get-tuple-element" and ins.operands and ins.operands[0] in pieces and ins.tuple_index is not None:
            alias[ins.name] = pieces[ins.operands[0]][ins.tuple_index]
            if ins.is_root:
                by[alias[ins.name]].is_root = True
            continue
        out.append(ins)
    _rewire(out, alias)
    return Computation(comp.name, out, comp.is_entry, comp.loc)


# Collectives that, over a group of one device, return their one operand unchanged.
UNIT_GROUP_IDENTITIES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")


def unit_group_collectives(comp: Computation) -> Computation:
    """An all-reduce / all-gather / reduce-scatter / all-to-all whose replica groups all have
    exactly one member is its operand. A reduction over one participant returns that
    participant's value without applying the reducer (so for every reducer, even a
    ``subtract`` or a non-associative body), a gather or a scatter of one piece is the piece,
    an exchange with oneself keeps every element: exact for every dtype (no arithmetic, no
    rounding, NaN kept). Megatron's unguarded ``torch.distributed.all_reduce`` in a degree-1
    baseline is such a collective; left in place, it would make the baseline unsupported.

    Only the plain (synchronous, single-operand, array) forms whose result has the operand's
    type. Not for an empty group list (``replica_groups={}`` means one group of all devices),
    and not for the ``<op>.cross-replica`` forms hlo.flavours leaves when the groups' mode is
    unknown: those keep their opcode and are reported as before. flatten already turned a
    cross-replica-and-partition ``{{0}}`` into the group of all partitions, so a one-member group
    seen here names one device.

    Only in a one-device program (every group is ``{0}``): in a program of several devices,
    one-member groups are almost always a wrong group (``{{0},{1}}`` where ``{{0,1}}`` was
    meant), and kept, the rules report the collective itself at its own line rather than a
    missing reduction further on."""
    comp = _clone(comp)
    by = {i.name: i for i in comp.instructions}
    alias: dict[str, str] = {}
    for ins in comp.instructions:
        if ins.opcode not in UNIT_GROUP_IDENTITIES or len(ins.operands) != 1 or ins.shape.is_tuple:
            continue
        groups = ins.parsed.get("replica_groups") or []
        src = by.get(ins.operands[0])
        if not groups or any(list(g) != [0] for g in groups) or src is None or src.shape.is_tuple or not _same_type(src.shape, ins.shape):
            continue
        alias[ins.name] = src.name
    if not alias:
        return comp
    _rewire(comp.instructions, alias)
    _move_root(comp.instructions, alias)
    return Computation(comp.name, [i for i in comp.instructions if i.name not in alias], comp.is_entry, comp.loc)


def _whole_again(cat: Instruction, by: dict[str, Instruction]) -> str | None:
    """x when the concatenate ``cat`` along d joins slices of x that cover x along d in order
    (every other dim whole, stride 1): then it is x."""
    dims = cat.parsed.get("dimensions") or []
    srcs = [by.get(o) for o in cat.operands]
    if len(dims) != 1 or any(s is None or s.opcode != "slice" or len(s.operands) != 1 for s in srcs) or len({s.operands[0] for s in srcs}) != 1:  # type: ignore[union-attr]
        return None
    x = by.get(srcs[0].operands[0])  # type: ignore[union-attr]
    d = dims[0]
    if x is None or x.shape.is_tuple or x.shape.dims != cat.shape.dims or x.shape.dtype != cat.shape.dtype:
        return None
    at = 0
    for s in srcs:
        b = [tuple(v) for v in s.parsed.get("slice", [])]  # type: ignore[union-attr]
        if len(b) != len(x.shape.dims) or any(b[k] != (0, w, 1) for k, w in enumerate(x.shape.dims) if k != d) or b[d][0] != at or b[d][2] != 1:
            return None
        at = b[d][1]
    return x.name if at == x.shape.dims[d] else None


def _pieces_of(ins: Instruction, by: dict[str, Instruction]) -> tuple[str, int] | None:
    """(x, d) when operand i of ``ins`` is exactly slice i of n equal contiguous pieces of x
    along d (every other dim whole, stride 1): how XLA:CPU splits an array all-to-all."""
    n = len(ins.operands)
    srcs = [by.get(o) for o in ins.operands]
    if any(s is None or s.opcode != "slice" or len(s.operands) != 1 for s in srcs) or len({s.operands[0] for s in srcs}) != 1:  # type: ignore[union-attr]
        return None
    x = by.get(srcs[0].operands[0])  # type: ignore[union-attr]
    if x is None or x.shape.is_tuple:
        return None
    dims = x.shape.dims
    bounds = [[tuple(b) for b in s.parsed.get("slice", [])] for s in srcs]  # type: ignore[union-attr]
    cut = [k for k in range(len(dims)) if any(b[k] != (0, dims[k], 1) for b in bounds if len(b) == len(dims))]
    if any(len(b) != len(dims) for b in bounds) or len(cut) != 1 or dims[cut[0]] % n:
        return None
    d, m = cut[0], dims[cut[0]] // n
    if any(b[d] != (i * m, (i + 1) * m, 1) for i, b in enumerate(bounds)):
        return None
    return x.name, d


def tuple_all_to_all(ins: Instruction, by: dict[str, Instruction]) -> tuple[list[Instruction], list[str]] | None:
    """A tuple all-to-all as array instructions: (new instructions, the name of each element).

    XLA's semantics (HloAllToAllInstruction; XLA refuses several operands with ``dimensions``,
    so that form is left alone): a group of n devices exchanges n operands, operand i goes to
    the i-th device of the group and result element i is what the i-th device sent, i.e.
    element i on device j is operand j of device i. XLA:CPU writes every array all-to-all so,
    its operands the n pieces of one array (``_pieces_of``): that is the array all-to-all of the
    array. Otherwise stacking the operands along a new leading dim (reshape to [1, ...], concatenate)
    makes that the array all-to-all along dim 0 (piece i of the stack to device i, received
    pieces stacked in group order), and element i is slice i of its result. Only moves
    elements: exact for every dtype. None (kept as is, reported unsupported) when the operands
    do not all have the result elements' one shape or the groups are not all of n devices."""
    shapes = ins.shape.tuple_shapes
    n = len(ins.operands)
    if n != len(shapes) or n < 1:
        return None
    origin = ins.origin or ins.name
    if ins.parsed.get("dimensions"):
        return None
    groups = ins.parsed.get("replica_groups") or []
    one = shapes[0]
    if not groups or any(len(g) != n for g in groups) or any(s.is_tuple or s.dims != one.dims or s.dtype != one.dtype for s in shapes):
        return None

    def make(name: str, opcode: str, shape: Shape, operands: list[str], parsed: dict | None = None, attrs: dict | None = None) -> Instruction:
        return replace(ins, name=name, opcode=opcode, shape=shape, operands=operands, parsed=parsed or {}, attrs=attrs or {}, is_root=False, origin=origin)

    cut = _pieces_of(ins, by)
    if cut is not None:
        # Operand i is piece i of x along d (XLA:CPU's own split): the array all-to-all along
        # d of x sends piece i to device i and concatenates the received pieces along d in
        # group order, so element i is piece i of its result.
        x, d = cut
        whole = by[x].shape
        exchanged = make(f"{ins.name}.array", "all-to-all", Shape(whole.dtype, whole.dims), [x], dict(ins.parsed, dimensions=[d]), dict(ins.attrs, dimensions="{" + str(d) + "}"))
        new = [exchanged]
        m = whole.dims[d] // n
        for k in range(n):
            bounds = [(k * m, (k + 1) * m, 1) if j == d else (0, w, 1) for j, w in enumerate(whole.dims)]
            text = "{" + ", ".join(f"[{a}:{b}]" for a, b, _ in bounds) + "}"
            new.append(make(f"{ins.name}.{k}", "slice", Shape(one.dtype, one.dims), [exchanged.name], {"slice": bounds}, {"slice": text}))
        return new, [i.name for i in new[1:]]
    stacked = Shape(one.dtype, (n, *one.dims))
    unit = Shape(one.dtype, (1, *one.dims))
    full = "".join(f", [0:{d}]" for d in one.dims)
    new = [make(f"{ins.name}.in{k}", "reshape", unit, [o]) for k, o in enumerate(ins.operands)]
    new.append(make(f"{ins.name}.stack", "concatenate", stacked, [i.name for i in new], {"dimensions": [0]}, {"dimensions": "{0}"}))
    exchanged = make(f"{ins.name}.array", "all-to-all", stacked, [new[-1].name], dict(ins.parsed, dimensions=[0]), dict(ins.attrs, dimensions="{0}"))
    new.append(exchanged)
    names = []
    for k in range(n):
        bounds = [(k, k + 1, 1), *((0, d, 1) for d in one.dims)]
        sl = make(f"{ins.name}.slice{k}", "slice", unit, [exchanged.name], {"slice": bounds}, {"slice": "{" + f"[{k}:{k + 1}]" + full + "}"})
        el = make(f"{ins.name}.{k}", "reshape", Shape(one.dtype, one.dims), [sl.name])
        new += [sl, el]
        names.append(el.name)
    return new, names


def fold_noops(comp: Computation) -> Computation:
    comp = _clone(comp)
    by = {i.name: i for i in comp.instructions}
    alias: dict[str, str] = {}

    def res(n: str) -> str:
        while n in alias:
            n = alias[n]
        return n

    for ins in comp.instructions:
        ins.operands = [res(o) for o in ins.operands]
        src = by.get(ins.operands[0]) if ins.operands else None
        if src is None:
            continue
        if (ins.opcode in ("copy", "bitcast") and ins.opcode == "copy" and src.shape == ins.shape) or (ins.opcode == "convert" and _same_type(src.shape, ins.shape)) or (ins.opcode == "broadcast" and _same_type(src.shape, ins.shape) and list(ins.parsed.get("dimensions", [])) == list(range(src.shape.rank))):
            alias[ins.name] = src.name
        elif ins.opcode == "reshape":
            if src.opcode == "reshape":
                ins.operands = [src.operands[0]]
                src = by[src.operands[0]]
            if src.shape.dims == ins.shape.dims and src.shape.dtype == ins.shape.dtype:
                alias[ins.name] = src.name
        elif ins.opcode == "transpose":
            perm = list(ins.parsed.get("dimensions", []))
            if src.opcode == "transpose":
                inner = list(src.parsed.get("dimensions", []))
                perm = [inner[p] for p in perm]
                ins.parsed = dict(ins.parsed, dimensions=perm)
                ins.operands = [src.operands[0]]
            if perm == list(range(len(perm))):
                alias[ins.name] = ins.operands[0]
    for ins in comp.instructions:
        if ins.is_root and ins.name in alias:
            by[res(ins.name)].is_root = True
    kept = [i for i in comp.instructions if i.name not in alias]
    _rewire(kept, alias)
    return Computation(comp.name, kept, comp.is_entry, comp.loc)


def unit_dim_broadcasts(comp: Computation) -> Computation:
    """broadcast(reshape(y)) where the reshape only inserts or removes size-1 dims becomes a
    broadcast whose operand has no size-1 dims: of y itself when y has none, else of one
    reshape of y to its other dims (``<reshape>.squeeze``). Such a reshape keeps the elements
    and the order of the other dims, and a size-1 operand dim maps onto a result dim that does
    not depend on its index, which a new broadcast dim fills the same way: exact for every
    dtype. Graphs that spell a per-rank extent of 1 with a reshape (one head per rank, RoPE's
    [s, 1, 1, d] frequencies viewed as [s, 1, d] on the rank and [s, d] in the baseline) then
    meet the baseline's broadcast.

    A broadcast of any other operand whose size-1 dims land on size-1 result dims at other
    positions broadcasts a squeezing reshape of it (``<operand>.squeeze``), by the same law:
    torch-xla folds ``cos.unsqueeze(1)`` times q of one head per rank into a broadcast that
    maps cos's unit batch dim onto the unit heads dim, where the baseline broadcasts [s, d]."""
    comp = _clone(comp)
    by = {i.name: i for i in comp.instructions}
    squeezes: dict[str, list[Instruction]] = {}  # operand name -> its squeezed copies, placed after it
    for ins in comp.instructions:
        if ins.opcode != "broadcast" or not ins.operands:
            continue
        src = by[ins.operands[0]]
        if src.opcode != "reshape" or not src.operands:
            _squeeze_unit_operand(ins, src, squeezes)
            continue
        inner = by[src.operands[0]].shape.dims
        kept = [i for i, d in enumerate(src.shape.dims) if d != 1]
        squeezed = tuple(src.shape.dims[i] for i in kept)
        if squeezed != tuple(d for d in inner if d != 1) or len(kept) == src.shape.rank:
            continue
        dims = list(ins.parsed.get("dimensions", []))
        ins.parsed = dict(ins.parsed, dimensions=[dims[i] for i in kept])
        if squeezed == tuple(inner):
            ins.operands = [src.operands[0]]
            continue
        if src.name not in squeezes:
            squeezes[src.name] = [replace(src, name=f"{src.name}.squeeze", shape=Shape(src.shape.dtype, squeezed), is_root=False, origin=src.origin or src.name)]
        ins.operands = [squeezes[src.name][0].name]
    if squeezes:
        return Computation(comp.name, [x for ins in comp.instructions for x in [ins, *squeezes.get(ins.name, ())]], comp.is_entry, comp.loc)
    return comp


def _squeeze_unit_operand(ins: Instruction, src: Instruction, squeezes: dict[str, list[Instruction]]) -> None:
    """``ins`` = broadcast(src) with src's size-1 dims mapped onto size-1 result dims: the
    broadcast of src reshaped to its other dims (see unit_dim_broadcasts)."""
    dims = list(ins.parsed.get("dimensions", []))
    shape = src.shape
    if shape.is_tuple or len(dims) != shape.rank:
        return
    # Only a unit dim that lands on a unit result dim at another position (cos's batch dim on the
    # heads dim); a keep-dims reduction broadcast back in place (dims[i] == i) keeps its unit
    # dims, whose rank-group relations the squeeze would not carry.
    kept = [i for i, d in enumerate(shape.dims) if d != 1 or dims[i] == i]
    if len(kept) == shape.rank or any(ins.shape.dims[dims[i]] != 1 for i in range(shape.rank) if i not in kept):
        return
    # Which dims are kept depends on this broadcast's dimensions, so two broadcasts of src may
    # need different squeezes: one copy per squeezed shape (sharing one would hand a broadcast
    # an operand of another rank than its dimensions list).
    want = Shape(shape.dtype, tuple(shape.dims[i] for i in kept))
    copies = squeezes.setdefault(src.name, [])
    sq = next((x for x in copies if x.shape == want), None)
    if sq is None:
        sq = Instruction(
            name=f"{src.name}.squeeze" + (f".{len(copies)}" if copies else ""), opcode="reshape", shape=want,
            operands=[src.name], metadata=src.metadata, loc=src.loc, origin=src.origin or src.name,
        )
        copies.append(sq)
    ins.parsed = dict(ins.parsed, dimensions=[dims[i] for i in kept])
    ins.operands = [sq.name]


def flat_row_slices(comp: Computation) -> Computation:
    """reshape(slice(reshape(x) to [N]), [a:b]) back to [m, *x.dims[1:]] becomes the slice of x
    along dim 0, [a/k : b/k] with k = prod(x.dims[1:]), when k divides a and b. In row-major
    order the flat elements [a, b) are exactly rows a/k .. b/k - 1 of x, and the reshape lays
    them out as those rows again: the same values for every dtype (nothing is computed).
    torch-xla lowers a view through ``as_strided`` this way (``torch.chunk`` of an all-gathered
    tensor in DTensor's Shard(d) -> Replicate), where a plain chunk is a slice."""
    by = {i.name: i for i in comp.instructions}
    changed = False
    out: list[Instruction] = []
    for ins in comp.instructions:
        sl = by.get(ins.operands[0]) if ins.opcode == "reshape" and ins.operands else None
        flat = by.get(sl.operands[0]) if sl is not None and sl.opcode == "slice" and sl.operands else None
        x = by.get(flat.operands[0]) if flat is not None and flat.opcode == "reshape" and flat.operands else None
        if sl is None or flat is None or x is None or x.shape.is_tuple or flat.shape.rank != 1 or x.shape.rank < 1:
            out.append(ins)
            continue
        (a, b, stride), = sl.parsed.get("slice", [(0, 0, 0)])
        k = 1
        for n in x.shape.dims[1:]:
            k *= n
        rows = (b - a) // k if k else 0
        if stride != 1 or k == 0 or a % k or b % k or rows < 1 or tuple(ins.shape.dims) != (rows, *x.shape.dims[1:]) or ins.shape.dtype != x.shape.dtype:
            out.append(ins)
            continue
        bounds = [(a // k, b // k, 1)] + [(0, n, 1) for n in x.shape.dims[1:]]
        text = "{" + ", ".join(f"[{lo}:{hi}]" for lo, hi, _ in bounds) + "}"
        out.append(replace(ins, opcode="slice", operands=[x.name], attrs={**ins.attrs, "slice": text}, parsed={**ins.parsed, "slice": bounds}))
        changed = True
    return Computation(comp.name, out, comp.is_entry, comp.loc) if changed else comp


def unmerge_batch_dots(comp: Computation) -> Computation:
    """dot(reshape(x), reshape(y)) whose one batch dim is the merge of x's and y's two leading
    dims becomes reshape(dot(x, y) with two batch dims). Both graphs merge heads into the batch
    differently (b·n vs b·n/c); unmerged, a head sharding is a plain sharding again."""
    comp = _clone(comp)
    by = {i.name: i for i in comp.instructions}
    out: list[Instruction] = []
    for ins in comp.instructions:
        p = ins.parsed
        if ins.opcode != "dot" or list(p.get("lhs_batch_dims", [])) != [0] or list(p.get("rhs_batch_dims", [])) != [0]:
            out.append(ins)
            continue
        lhs, rhs = (by[o] for o in ins.operands)
        lsrc, rsrc = _merge_source(lhs, by), _merge_source(rhs, by)
        # One operand a plain merge reshape, the other any tensor with the same leading extent:
        # split it by the same two leading dims (a row-major split reshape; merging it back is
        # the operand). Only then, and not for the merge of a repeat (a broadcast that creates
        # dim 1: GQA's repeat_interleave of KV heads, which the rank-group rules follow merged).
        if lsrc is not None and rsrc is None and lhs.opcode == "reshape" and not _repeat_merge(lsrc):
            rsrc = _split_leading(rhs, lsrc.shape.dims[:2])
        elif rsrc is not None and lsrc is None and rhs.opcode == "reshape" and not _repeat_merge(rsrc):
            lsrc = _split_leading(lhs, rsrc.shape.dims[:2])
        # A merge whose reshape also folded a reshape before it (the source has more dims than
        # (a, b, rest): repeat_kv's merge of (kv, n) then of (batch, heads), folded into one)
        # is split by the other operand's two leading dims like a plain tensor.
        if lsrc is not None and rsrc is not None and _fits(lsrc, lhs) and not _fits(rsrc, rhs) and rhs.opcode == "reshape" and not _repeat_merge(rsrc):
            rsrc = _split_leading(rhs, lsrc.shape.dims[:2])
        elif lsrc is not None and rsrc is not None and _fits(rsrc, rhs) and not _fits(lsrc, lhs) and lhs.opcode == "reshape" and not _repeat_merge(lsrc):
            lsrc = _split_leading(lhs, rsrc.shape.dims[:2])
        if lsrc is None or rsrc is None:
            out.append(ins)
            continue
        xs, ys = lsrc.shape.dims, rsrc.shape.dims
        ok = (
            len(xs) == lhs.shape.rank + 1 and len(ys) == rhs.shape.rank + 1
            and xs[:2] == ys[:2] and xs[0] * xs[1] == lhs.shape.dims[0]
            and xs[2:] == lhs.shape.dims[1:] and ys[2:] == rhs.shape.dims[1:]
        )
        if not ok:
            out.append(ins)
            continue
        inner_shape = replace(ins.shape, dims=(xs[0], xs[1], *ins.shape.dims[1:]), layout=None)
        # A source made by _merge_source (a transpose moved before the merge) enters here.
        out.extend(x for x in (lsrc, rsrc) if x.name not in by)
        by.update((x.name, x) for x in (lsrc, rsrc))
        inner = replace(ins, name=f"{ins.name}.unmerged", shape=inner_shape, operands=[lsrc.name, rsrc.name], is_root=False, origin=ins.origin or ins.name)
        inner.parsed = dict(p, lhs_batch_dims=[0, 1], rhs_batch_dims=[0, 1],
                            lhs_contracting_dims=[d + 1 for d in p.get("lhs_contracting_dims", [])],
                            rhs_contracting_dims=[d + 1 for d in p.get("rhs_contracting_dims", [])])
        inner.attrs = {k: v for k, v in ins.attrs.items() if not k.endswith("_dims")}
        merged = replace(ins, opcode="reshape", operands=[inner.name], parsed={}, attrs={})
        out.extend([inner, merged])
    return Computation(comp.name, out, comp.is_entry, comp.loc)


def _merge_source(op: Instruction, by: dict[str, Instruction]) -> Instruction | None:
    """The tensor whose two leading dims a batched dot's operand merges into its dim 0 (checked
    by the caller): the reshape's operand; or, for transpose(reshape(y), perm) with perm[0] = 0
    (the merged dim stays first), a new transpose of y by [0, 1, perm[1:] + 1]. Layout identity:
    the merge makes row-major index a·B + b of (a, b) and the transpose only permutes the other
    dims, so both orders put y[a, b, ...] at the same place (every dtype: values only move).
    None for any other operand."""
    if op.opcode == "reshape":
        return by[op.operands[0]]
    if op.opcode != "transpose" or not op.operands:
        return None
    perm = list(op.parsed.get("dimensions", []))
    inner = by.get(op.operands[0])
    if inner is None or inner.opcode != "reshape" or not perm or perm[0] != 0:
        return None
    src = by[inner.operands[0]]
    sd, md = src.shape.dims, inner.shape.dims
    if len(sd) != len(md) + 1 or sd[0] * sd[1] != md[0] or sd[2:] != md[1:]:
        return None
    new_perm = [0, 1, *(p + 1 for p in perm[1:])]
    dims = tuple(sd[p] for p in new_perm)
    moved = replace(op, name=f"{op.name}.premerge", shape=replace(op.shape, dims=dims, layout=None), operands=[src.name], is_root=False, origin=op.origin or op.name)
    moved.parsed = dict(op.parsed, dimensions=new_perm)
    moved.attrs = {k: v for k, v in op.attrs.items() if k != "dimensions"}
    return moved


def _fits(src: Instruction, op: Instruction) -> bool:
    """``src`` is (a, b, rest) with a·b = op's dim 0 and rest op's other dims."""
    sd, od = src.shape.dims, op.shape.dims
    return len(sd) == len(od) + 1 and bool(od) and sd[0] * sd[1] == od[0] and sd[2:] == od[1:]


def _repeat_merge(src: Instruction) -> bool:
    """True when ``src`` is a broadcast whose dim 1 is new (merged into dim 0 it repeats)."""
    return src.opcode == "broadcast" and 1 not in list(src.parsed.get("dimensions", []))


def _split_leading(op: Instruction, lead: tuple[int, ...]) -> Instruction | None:
    """reshape(op) splitting its dim 0 into ``lead`` (two dims, a·b = op's dim 0), or None.
    A unit extent in ``lead`` is split too (one head per rank: the rank's merge is (b, 1), the
    baseline's (b, n)); refusing it unmerged the baseline's dot alone, and Megatron's MHA layer
    then related through no layout (a row-major split is exact for any extents)."""
    dims = op.shape.dims
    if len(lead) != 2 or not dims or lead[0] * lead[1] != dims[0]:
        return None
    return replace(op, name=f"{op.name}.split", opcode="reshape", shape=replace(op.shape, dims=(*lead, *dims[1:]), layout=None), operands=[op.name],
                   attrs={}, parsed={}, literal=None, parameter_number=None, tuple_index=None, is_root=False, origin=op.origin or op.name)


def _same_type(a: Shape, b: Shape) -> bool:
    return a.dtype == b.dtype and a.dims == b.dims


def dce(comp: Computation) -> Computation:
    by = {i.name: i for i in comp.instructions}
    roots = [i for i in comp.instructions if i.is_root] or comp.instructions[-1:]
    live: set[str] = set()
    stack = [r.name for r in roots]
    while stack:
        n = stack.pop()
        if n in live or n not in by:
            continue
        live.add(n)
        stack.extend(by[n].operands)
    # Parameters stay even when unused: the relations file numbers them.
    kept = [i for i in comp.instructions if i.name in live or i.opcode == "parameter"]
    if sum(1 for i in kept if i.is_root) > 1:
        for i in kept[:-1]:
            i.is_root = False
    return Computation(comp.name, kept, comp.is_entry, comp.loc)


def normalize(module: Module, tokens: frozenset[str] = frozenset()) -> Module:
    """Return a new module whose entry computation went through every pass; ``tokens`` names
    the parameters that carry torch-xla's collective token."""
    module = expand_batch_norms(flatten(module))  # flattened (hlo.flavours), then batch-norms as plain ops (hlo.batchnorm)
    module = copy.copy(module)
    module.computations = dict(module.computations)
    entry = module.entry
    module.computations[module.entry_name] = Computation(entry.name, [_copy(i) for i in entry.instructions], entry.is_entry, entry.loc)
    classify_reducers(module)
    entry = strip_tokens(module.entry, tokens)
    for step in (split_tuples, unit_group_collectives, fold_noops, flat_row_slices, unit_dim_broadcasts, unmerge_batch_dots, fold_noops, dce):
        entry = step(entry)
    module.computations[module.entry_name] = entry
    return module
