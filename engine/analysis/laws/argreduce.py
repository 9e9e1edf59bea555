"""Tables of rules/argreduce.egg: variadic (value, index) reduces with an argmax/argmin combine.

``argred(k, d, op, n)``  a variadic reduce of (values, indices) along the single dim d (extent
                         n) whose to_apply is the arg combine of op (arg_reducer);
``iotadim(k, d)``        int iotas counting along d, exactly (values.iota_exact);
``gteidx(k, i, t)``      get-tuple-element i of type t;
``intwidento(k, t)``     int->int converts to t that keep every value;
``redone(k, d, op)``     a plain reduce along d alone with max or min;
``cmpeq(k)``             an == compare without comparison type;
``affmove(k)``           a reshape/broadcast/copy of one element to one element (keeps a value);
``unitdim(k, e)``        a reshape inserting one unit dim at e.

Side conditions: the combine is recognized structurally (ties to the lowest index, compares
without a total-order type, so -0.0 equals 0.0); it is associative and commutative on NaN-free
values; an index table counts 0 .. n-1 only while n - 1 fits its int type (no wrap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...hlo.literals import FLOAT_MAX, INT_BITS
from ...ir import Instruction, Module, Shape
from ..signature import Sig
from .values import iota_exact, widens

if TYPE_CHECKING:
    from ..graph import Graphs, Node

Rows = dict[str, list[tuple[object, ...]]]
TABLES = ("argred", "iotadim", "gteidx", "intwidento", "redone", "cmpeq", "affmove", "unitdim")


def walk(rows: Rows, g: Graphs) -> Callable[[Node, str, Sig | None, list[Shape]], None]:
    def visit(node: Node, key: str, sig: Sig | None, opnd: list[Shape]) -> None:
        if sig is not None:
            _arg_tables(rows, node, sig, opnd, g.baseline if node.side == "baseline" else g.distributed)

    return visit


ARG_DIRECTIONS = {"GE": "max", "GT": "max", "LE": "min", "LT": "min"}


def arg_reducer(module: Module, ins: Instruction) -> str | None:
    """"max" or "min" when ``ins`` is a reduce of (values, indices) whose to_apply is the
    argmax/argmin combine torch-xla emits (torch.argmax, torch.max(dim), argmin), or JAX's
    NaN-first one (jnp.argmax / argmin, vmapped too; below):

        value = select(compare(lv, rv, D), lv, rv)
        index = select(compare(lv, rv, EQ), minimum(li, ri), select(compare(lv, rv, D), li, ri))

    with D = GE or GT (max) and LE or LT (min), compares without a comparison type (so -0.0
    equals 0.0 and no total order applies), parameters (lv, li, rv, ri) = 0..3, scalar values of
    one type and indices of one int type. On NaN-free values this combine is associative and
    commutative: it yields the extreme and the lowest index holding it, whatever the order XLA
    reduces in. Anything else is None (the reduce stays unsupported)."""
    if ins.opcode != "reduce" or len(ins.operands) != 4 or not ins.shape.is_tuple or len(ins.shape.tuple_shapes) != 2:
        return None
    callee = ins.parsed.get("to_apply")
    comp = module.computations.get(callee) if isinstance(callee, str) else None
    if comp is None:
        return None
    by = {i.name: i for i in comp.instructions}
    params = {i.parameter_number: i for i in comp.instructions if i.opcode == "parameter"}
    if sorted(params) != [0, 1, 2, 3] or any(p.shape.dims for p in params.values()):
        return None
    lv, li, rv, ri = (params[n].shape.dtype for n in range(4))
    if lv != rv or li != ri or li not in INT_BITS or not (lv in FLOAT_MAX or lv in INT_BITS):
        return None

    def expr(name: str, depth: int = 0) -> object:
        i = by.get(name)
        if i is None or depth > 6:
            return None
        if i.opcode == "parameter":
            return i.parameter_number
        extra = {k for k in i.attrs if k not in ("metadata", "direction")}
        if extra:
            return None
        head = f"compare.{i.parsed.get('direction', i.attrs.get('direction'))}" if i.opcode == "compare" else i.opcode
        return (head, *(expr(o, depth + 1) for o in i.operands))

    root = comp.root
    if root.opcode != "tuple" or len(root.operands) != 2:
        return None
    value, index = (expr(o) for o in root.operands)
    for d, op in ARG_DIRECTIONS.items():
        cmp = (f"compare.{d}", 0, 2)
        # JAX's combine (jnp.argmax / argmin): NaN first, then the strict order, ties to the
        # lower index: value = select(D | lv != lv, lv, rv), index = select(D | lv != lv |
        # (lv == rv & li < ri), li, ri), D strict. On NaN-free values lv != lv is false and
        # this is the extreme and its lowest index, as the torch combine below.
        first = ("or", cmp, ("compare.NE", 0, 0))
        if d in ("GT", "LT") and value == ("select", first, 0, 2) and index == ("select", ("or", first, ("and", ("compare.EQ", 0, 2), ("compare.LT", 1, 3))), 1, 3):
            return op
        if value != ("select", cmp, 0, 2):
            continue
        keep = ("select", cmp, 1, 3)
        ties = [("select", (eq, a, b), (mn, x, y), keep) for eq in ("compare.EQ",) for a, b in ((0, 2), (2, 0)) for mn in ("minimum",) for x, y in ((1, 3), (3, 1))]
        if index in ties:
            return op
    return None


def _arg_tables(rows: Rows, node: Node, sig: Sig, opnd: list[Shape], module: Module) -> None:
    """Tables of rules/argreduce.egg, for both graphs: argred(k, d, op, n) a variadic reduce of
    (values, indices) along the single dim d (extent n) with the arg combine of op; iotadim(k, d)
    iotas counting along d; gteidx(k, i, t) get-tuple-element i of type t; intwidento(k, t)
    int->int converts to t that keep every value; redone(k, d, op) a plain reduce along d alone;
    cmpeq(k) an == compare without comparison type; affmove(k) a reshape/broadcast/copy of one
    element to one element (keeps an exact value); unitdim(k, e) a reshape inserting one unit
    dim at e."""
    ins = node.ins
    key = sig.key()
    op = ins.opcode
    if op == "reduce" and len(opnd) == 4:
        a = arg_reducer(module, ins)
        dims = list(ins.parsed.get("dimensions", []))
        if a is not None and len(dims) == 1 and opnd[0].dims == opnd[1].dims and 0 <= dims[0] < len(opnd[0].dims) and opnd[2].dims == opnd[3].dims == ():
            rows["argred"].append((key, dims[0], a, opnd[0].dims[dims[0]]))
    elif op == "reduce" and len(opnd) == 2:
        dims = list(ins.parsed.get("dimensions", []))
        reducer = ins.parsed.get("reducer")
        if len(dims) == 1 and reducer in ("max", "min"):
            rows["redone"].append((key, dims[0], reducer))
    elif op == "iota" and ins.shape.dtype in INT_BITS:
        d = ins.parsed.get("iota_dimension")
        # The index table counts 0 .. n-1 only while n - 1 fits its type (a u8 iota of 512
        # wraps at 256: the "lowest index" would be taken modulo 256).
        if isinstance(d, int) and 0 <= d < ins.shape.rank and iota_exact(ins.shape.dtype, ins.shape.dims[d]):
            rows["iotadim"].append((key, d))
    elif op == "get-tuple-element" and ins.tuple_index is not None and not ins.shape.is_tuple:
        rows["gteidx"].append((key, ins.tuple_index, ins.shape.dtype))
    elif op == "convert" and opnd and widens(opnd[0].dtype, ins.shape.dtype):
        rows["intwidento"].append((key, ins.shape.dtype))
    elif op == "compare" and len(opnd) == 2 and ins.parsed.get("direction", ins.attrs.get("direction")) == "EQ" and "type" not in ins.attrs:
        rows["cmpeq"].append((key,))
    if op in ("reshape", "broadcast", "copy") and opnd and opnd[0].numel == 1 and ins.shape.numel == 1 and opnd[0].dtype == ins.shape.dtype:
        rows["affmove"].append((key,))
    if op == "reshape" and opnd:
        src, out = opnd[0].dims, ins.shape.dims
        for e in range(len(src) + 1):
            if out == (*src[:e], 1, *src[e:]):
                rows["unitdim"].append((key, e))

