"""Normalize a parsed HLO module so both graphs speak the same small dialect.

Each pass is a function from an entry computation to a new one (the torch.fx model). What they do
and why:
- ``strip_tokens``: torch-xla threads a token through ``xm.*`` collectives (``x + broadcast(tok)``
  before, ``tok * gather(result)`` after, the token being a scalar parameter that holds 0). Only
  parameters the relations file declares as tokens are stripped; the "after" side is dead code.
- ``split_tuples``: a multi-operand all-reduce returns a tuple; split it into one all-reduce per
  operand (identical semantics) and resolve ``get-tuple-element(tuple(...))``.
- ``fold_noops``: drop converts to the same type, copies, identity transposes/reshapes/broadcasts, and
  collapse reshape∘reshape and transpose∘transpose chains (row-major reshapes compose exactly).
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

    def is_token(name: str) -> bool:
        ins = by[name]
        while ins.opcode in ("broadcast", "reshape", "convert") and ins.operands:
            ins = by[ins.operands[0]]
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
    return comp


def split_tuples(comp: Computation) -> Computation:
    """One all-reduce per operand; get-tuple-element of a known tuple resolves to the element."""
    comp = _clone(comp)
    out: list[Instruction] = []
    alias: dict[str, str] = {}
    pieces: dict[str, list[str]] = {}
    by = {i.name: i for i in comp.instructions}
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
    """broadcast(reshape(y)) where the reshape only inserts size-1 dims becomes broadcast(y):
    a size-1 operand dim can only map onto a size-1 result dim, which a new broadcast dim
    fills the same way. Graphs that spell a per-rank extent of 1 with a reshape (one head per
    rank) then meet the baseline's broadcast."""
    comp = _clone(comp)
    by = {i.name: i for i in comp.instructions}
    for ins in comp.instructions:
        if ins.opcode != "broadcast" or not ins.operands:
            continue
        src = by[ins.operands[0]]
        if src.opcode != "reshape" or not src.operands:
            continue
        inner = by[src.operands[0]].shape.dims
        kept = [i for i, d in enumerate(src.shape.dims) if d != 1]
        if tuple(src.shape.dims[i] for i in kept) != tuple(inner) or len(kept) == src.shape.rank:
            continue
        dims = list(ins.parsed.get("dimensions", []))
        ins.parsed = dict(ins.parsed, dimensions=[dims[i] for i in kept])
        ins.operands = [src.operands[0]]
    return comp


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
        if lhs.opcode != "reshape" or rhs.opcode != "reshape":
            out.append(ins)
            continue
        xs, ys = by[lhs.operands[0]].shape.dims, by[rhs.operands[0]].shape.dims
        ok = (
            len(xs) == lhs.shape.rank + 1 and len(ys) == rhs.shape.rank + 1
            and xs[:2] == ys[:2] and xs[0] * xs[1] == lhs.shape.dims[0]
            and xs[2:] == lhs.shape.dims[1:] and ys[2:] == rhs.shape.dims[1:]
        )
        if not ok:
            out.append(ins)
            continue
        inner_shape = replace(ins.shape, dims=(xs[0], xs[1], *ins.shape.dims[1:]), layout=None)
        inner = replace(ins, name=f"{ins.name}.unmerged", shape=inner_shape, operands=[lhs.operands[0], rhs.operands[0]], is_root=False, origin=ins.origin or ins.name)
        inner.parsed = dict(p, lhs_batch_dims=[0, 1], rhs_batch_dims=[0, 1],
                            lhs_contracting_dims=[d + 1 for d in p.get("lhs_contracting_dims", [])],
                            rhs_contracting_dims=[d + 1 for d in p.get("rhs_contracting_dims", [])])
        inner.attrs = {k: v for k, v in ins.attrs.items() if not k.endswith("_dims")}
        merged = replace(ins, opcode="reshape", operands=[inner.name], parsed={}, attrs={})
        out.extend([inner, merged])
    return Computation(comp.name, out, comp.is_entry, comp.loc)


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
    for step in (split_tuples, fold_noops, unit_dim_broadcasts, unmerge_batch_dots, fold_noops, dce):
        entry = step(entry)
    module.computations[module.entry_name] = entry
    return module
