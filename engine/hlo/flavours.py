"""Every flavour of per-device program XLA writes, reduced to one flat entry computation.

A user gets HLO from JAX or XLA in several flavours without special flags; the analysis reads
one: a single entry computation of plain instructions (reducers and comparators stay called
computations). ``flatten`` runs first in ``normalize`` and rewrites only by XLA's own semantics:

- ``call`` (nested ``jax.jit``: ``jax.nn.relu``, ``jnp.where``, ...): the callee's instructions
  are copied in place of the call, its parameters bound to the call's operands, the call's value
  is the callee's root.
- ``fusion`` (what ``compile().as_text()`` prints: kLoop, kInput, kOutput and custom fusions
  such as ``__ynn_fusion``): a fusion computes its fused computation on its operands, whatever
  the backend later emits for it; inlined exactly like ``call``.
- ``while`` with a trip count known from the program (``lax.scan``, ``fori_loop``): the
  condition is evaluated exactly (hlo.rank.ScalarEval) on the carried values known as integer
  constants; while it is true the body is copied with its parameter bound to the carried tuple.
  At most MAX_TRIPS iterations per loop (and MAX_UNROLLED instructions in all); a loop whose
  condition is not a known constant stays a ``while`` (reported unsupported). Scalar integers
  computed from literals inside an iteration (the counter) become literals. Each iteration's instructions get ``op_name`` prefix
  ``while.<j>/layers.<k>/`` (k counts iterations over all loops in program order) when the
  program names no layers itself, so the verifier cuts the unrolled loop into layers and proves
  identical iterations once (its layer memo), as it does for a model's repeated layers.
- ``partition-id`` / ``replica-id``: the device's id becomes a parameter marked ``device_id``;
  analysis.inputs relates it to the rank through the relations file's groups (hlo.rank).
- layouts (optimized modules): a ``copy`` is its operand (a layout change moves no value); a
  ``bitcast`` reads its operand's buffer in the result's layout, i.e. a transpose to the
  operand's physical order, a row-major reshape and a transpose from the result's (see
  ``bitcast``); layouts mean nothing else to a value.

Which id names a device, and how collectives' groups name devices (XLA's
CollectiveOpGroupMode), for a program of R replicas and P partitions (header ``replica_count``,
``num_partitions``; 1 when absent):

- partition flavour (P > 1, or the program reads ``partition-id``; then R must be 1): the device
  id is ``partition-id``; ``replica-id`` is the constant 0. A collective with ``channel_id`` and
  ``use_global_device_ids=true`` names flattened ids ``replica·P + partition`` = partition ids;
  all-to-all / collective-permute with ``channel_id`` name partition ids (cross-partition). Those
  keep their groups. An all-reduce / all-gather / reduce-scatter with ``channel_id`` but without
  ``use_global_device_ids`` is cross-replica-and-partition: its groups name replicas (all 0 here)
  and each spans all P partitions, so its groups become ``[[0..P-1]]``; a collective without
  ``channel_id`` is cross-replica, i.e. a group of one partition. Both are renamed (opcode
  ``<op>.cross-replica``) when P is unknown or the groups are not {0}, so they are reported
  unsupported rather than read with the wrong groups.
- replica flavour (otherwise, torch-xla): the device id is ``replica-id``; ``partition-id`` is 0
  when the header says P = 1; groups name replica ids as they are printed (unchanged).

Pre-partitioning global programs (``jax.jit(f).lower(...).as_text()``: Shardy's ``xla.sdy.*``
custom-calls, GSPMD's ``Sharding`` / ``SPMDFullToShardShape`` / ``SPMDShardToFullShape``) are
not per-device programs: they are refused with a located error that says which flavour to give.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace

from ..errors import HloParseError
from ..ir import Computation, Instruction, Metadata, Module, Shape
from .literals import INT_BITS
from .rank import ScalarEval

MAX_TRIPS = 4096  # iterations unrolled per loop (a 126-layer scan is far below)
MAX_UNROLLED = 1_000_000  # instructions a module may grow to by unrolling; beyond, loops stay
GLOBAL_TARGETS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape"})
GLOBAL_PREFIXES = ("xla.sdy.", "sdy.")
GROUPED = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-reduce-start", "all-gather-start"})
CHANNELED = frozenset({"all-to-all", "collective-permute", "collective-permute-start", "ragged-all-to-all", "collective-broadcast"})
_LAYER = re.compile(r"(?:^|[/._])(?:layers|layer|blocks|block|h)[._/](\d+)(?=$|[/._])")

HOW_TO_GET = (
    "shardproof checks the per-device program (after SPMD partitioning), not the global one. "
    "Give it `jax.jit(f).lower(*args).compile().as_text()`, or the module XLA dumps after "
    "partitioning (XLA_FLAGS='--xla_dump_to=DIR --xla_dump_hlo_pass_re=spmd-partitioning', the "
    "file '*after_spmd-partitioning*.txt'), or write the program with shard_map and give "
    "`jax.jit(shard_map(...)).lower(*args).compile().as_text()`"
)


def _header_int(module: Module, key: str) -> int | None:
    raw = module.header.get(key)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def reject_global(module: Module) -> None:
    """A located error for a pre-partitioning global program (see the module doc)."""
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.opcode != "custom-call":
                continue
            target = ins.parsed.get("custom_call_target", "")
            if target in GLOBAL_TARGETS or (isinstance(target, str) and target.startswith(GLOBAL_PREFIXES)):
                kind = "Shardy (xla.sdy)" if "sdy" in target else "GSPMD"
                loc = ins.loc
                raise HloParseError(
                    module.path, loc.line if loc else 0, loc.column if loc else 0,
                    f"custom-call '{target}' (%{ins.name}) marks a {kind} global program before SPMD partitioning: {HOW_TO_GET}",
                )


class _Flattener:
    def __init__(self, module: Module) -> None:
        self.m = module
        # Names taken in the flat entry: inlined instructions keep theirs unless taken (XLA's
        # names are unique in a module; a callee inlined twice, or a loop body, is renamed).
        self.used: set[str] = {i.name for i in module.entry.instructions}
        self.out: list[Instruction] = []
        self.by: dict[str, Instruction] = {}
        self.in_loop = 0
        self.suffix: dict[str, int] = {}
        self.consts = ScalarEval(self.by.get)
        self.loops = 0
        self.iteration = 0
        self.label_loops = not any(_LAYER.search(i.metadata.op_name) for c in module.computations.values() for i in c.instructions)
        self.params = 1 + max((i.parameter_number or 0) for i in module.entry.instructions if i.opcode == "parameter") if module.entry.parameters else 0
        parts = _header_int(module, "num_partitions")
        replicas = _header_int(module, "replica_count")
        opcodes = {i.opcode for c in module.computations.values() for i in c.instructions}
        self.partitions = parts
        self.partition_flavour = (parts or 1) > 1 or "partition-id" in opcodes
        # Both kinds of id in one program with neither count known: no reading is safe.
        self.ambiguous = ((parts or 1) > 1 and (replicas or 1) > 1) or (
            "partition-id" in opcodes and "replica-id" in opcodes and parts is None and replicas is None)
        self.replicas = replicas

    def fresh(self, name: str) -> str:
        if name not in self.used:
            self.used.add(name)
            return name
        k = self.suffix.get(name, 1)  # where the last search for this name stopped
        while f"{name}.{k}" in self.used:
            k += 1
        self.suffix[name] = k + 1
        self.used.add(f"{name}.{k}")
        return f"{name}.{k}"

    def emit(self, ins: Instruction) -> None:
        self.out.append(ins)
        self.by[ins.name] = ins

    def expand(self, instrs: list[Instruction], binds: dict[int, str], label: str, entry: bool = False, only: set[str] | None = None) -> str:
        """Copy ``instrs`` (a computation's body) to the output, its parameters bound to
        ``binds`` (by number); return the name that holds its root's value. ``label`` prefixes
        the op_name of the copies (of those named in ``only``, when given)."""
        names: dict[str, str] = {}
        root = instrs[-1].name
        written = {i.name: i for i in instrs}
        for ins in instrs:
            if ins.is_root:
                root = ins.name
            if ins.opcode == "parameter" and not entry:
                assert ins.parameter_number is not None
                names[ins.name] = binds[ins.parameter_number]
                continue
            new = copy.copy(ins)
            new.name = ins.name if entry else self.fresh(ins.name)
            new.operands = [names.get(o, o) for o in ins.operands]
            new.is_root = False
            if ins.opcode == "bitcast" and ins.operands and ins.operands[0] in written:
                # The layout a bitcast reads is its operand's as written here (a copy that only
                # changed the layout is dropped below, its layout must not be).
                new.parsed = {**ins.parsed, "operand_layout": written[ins.operands[0]].shape}
            lab = label if only is None or ins.name in only else ""
            if lab:
                new.metadata = replace(ins.metadata, op_name=lab + ins.metadata.op_name)
            names[ins.name] = self.one(new, lab)
        return names[root]

    def one(self, ins: Instruction, label: str) -> str:
        """Emit one instruction (expanding calls, fusions and loops); the name of its value."""
        op = ins.opcode
        callee = ins.parsed.get("to_apply") if op == "call" else ins.parsed.get("calls") if op == "fusion" else None
        if isinstance(callee, list) and len(callee) == 1:
            callee = callee[0]
        if isinstance(callee, str) and callee in self.m.computations:
            comp = self.m.computations[callee]
            self.check_signature(ins, comp, [self.shape_of(o) for o in ins.operands], ins.shape)
            return self.expand(comp.instructions, dict(enumerate(ins.operands)), label)
        if op == "get-tuple-element" and len(ins.operands) == 1:
            # Inlined bodies bring their get-tuple-elements to the entry: XLA's verifier's rule.
            src = self.shape_of(ins.operands[0])
            k = ins.tuple_index
            if src is not None and (not src.is_tuple or k is None or not 0 <= k < len(src.tuple_shapes) or str(src.tuple_shapes[k]) != str(ins.shape)):
                loc = ins.loc
                raise HloParseError(self.m.path, loc.line if loc else 0, loc.column if loc else 0, f"%{ins.name} (get-tuple-element) takes index {k} of {src}, which does not give {ins.shape}")
        if op == "while":
            done = self.unroll(ins, label)
            if done is not None:
                return done
        if op in ("partition-id", "replica-id") and not self.ambiguous:
            return self.device_id(ins)
        if op == "copy" and len(ins.operands) == 1:
            return ins.operands[0]  # a copy only moves the value (perhaps to another layout)
        if op == "bitcast" and len(ins.operands) == 1:
            done = self.bitcast(ins)
            if done is not None:
                return done
        if op == "reduce" and len(ins.operands) == 2:
            ins = self.untree(ins)
        if self.partition_flavour and (op in GROUPED or op in CHANNELED):
            ins = self.partition_groups(ins)
        if self.in_loop and ins.shape.dims == () and ins.shape.dtype in INT_BITS and op not in ("constant", "parameter"):
            # A loop counter (or anything computed from literals only) inside an unrolled
            # iteration: its exact machine value, as a literal (the iteration's weight slice then
            # reads dynamic-slice(w, k) instead of a chain of k adds).
            v = self.consts.value(ins.name) if self.by.setdefault(ins.name, ins) is ins else None
            if isinstance(v, int):
                ins = replace(ins, opcode="constant", operands=[], literal=str(v), parsed={}, attrs={})
        self.emit(ins)
        return ins.name

    def shape_of(self, name: str) -> Shape | None:
        found = self.by.get(name)
        return found.shape if found is not None else None

    def check_signature(self, ins: Instruction, comp: Computation, operands: list[Shape | None], result: Shape | None) -> None:
        """XLA's verifier's rule, as bad input: a called computation takes parameters 0..n-1 of
        the operands' shapes (layouts aside) and returns the caller's shape."""
        params = comp.parameters
        problem = ""
        if sorted(p.parameter_number or 0 for p in params) != list(range(len(operands))):
            problem = f"passes {len(operands)} operand(s) to %{comp.name}, which has parameter(s) {[p.parameter_number for p in params]}"
        else:
            for p, shp in zip(params, operands, strict=True):
                if shp is not None and str(p.shape) != str(shp):
                    problem = f"passes {shp} as parameter {p.parameter_number} of %{comp.name}, which is {p.shape}"
                    break
            if not problem and result is not None and comp.instructions and str(comp.root.shape) != str(result):
                problem = f"is {result}, but %{comp.name} returns {comp.root.shape}"
        if problem:
            loc = ins.loc
            raise HloParseError(self.m.path, loc.line if loc else 0, loc.column if loc else 0, f"%{ins.name} ({ins.opcode}) {problem}")

    def bitcast(self, ins: Instruction) -> str | None:
        """A bitcast keeps the buffer and reads it with the result's shape and layout: with
        physical (major-to-minor) dim orders P_x and P_y of operand and result, it is
        ``transpose(reshape(transpose(x, P_x), [y dims in P_y]), inverse(P_y))`` (row-major
        reshape of the physical arrays). Default layouts give a plain reshape."""
        src = self.by.get(ins.operands[0])
        if src is None or src.shape.is_tuple or ins.shape.is_tuple or src.shape.dtype != ins.shape.dtype or src.shape.numel != ins.shape.numel:
            return None
        written = ins.parsed.get("operand_layout")
        px, py = _physical(written if isinstance(written, Shape) and written.dims == src.shape.dims else src.shape), _physical(ins.shape)
        if px is None or py is None:
            return None
        x = src.name
        if px != list(range(len(px))):
            t = replace(ins, name=self.fresh(ins.name + ".phys"), opcode="transpose", operands=[x], shape=replace(src.shape, dims=tuple(src.shape.dims[d] for d in px), layout=None),
                        parsed={"dimensions": px}, attrs={"dimensions": "{" + ",".join(map(str, px)) + "}"}, is_root=False)
            self.emit(t)
            x = t.name
        inv = [py.index(d) for d in range(len(py))]
        last = py == list(range(len(py)))
        r = replace(ins, name=ins.name if last else self.fresh(ins.name + ".flat"), opcode="reshape", operands=[x], shape=replace(ins.shape, dims=tuple(ins.shape.dims[d] for d in py), layout=None), parsed={}, attrs={}, is_root=False)
        self.emit(r)
        if last:
            return r.name
        t2 = replace(ins, opcode="transpose", operands=[r.name], parsed={"dimensions": inv}, attrs={"dimensions": "{" + ",".join(map(str, inv)) + "}"}, is_root=False)
        self.emit(t2)
        return t2.name

    def untree(self, r: Instruction) -> Instruction:
        """XLA:CPU's tree-reduction rewrite undone: ``reduce(reduce-window(x, i0), i1)`` over
        dims D, where the window tiles each dim of D (size = stride, extent divisible, no
        padding or dilation) and is 1 along every other dim, with one reducer on both, is
        ``reduce(x, i1)`` over D. Law: XLA's reduce takes an associative, commutative reducer
        and leaves the order of its applications to the implementation; the rewrite (which
        compiled text prints for rows longer than its window) only groups the elements of each
        row into windows. max / min: exact for every dtype (idempotent, so it holds for any
        i0 = i1). add: i0 must be the literal 0 (added once per window); exact for integers (wrap
        is associative), for floats a reordering of the same sum, the one XLA's reduce allows
        (rounding as for any reduction order; a zero sum's sign may differ)."""
        w = self.by.get(r.operands[0])
        if w is None or w.opcode != "reduce-window" or len(w.operands) != 2:
            return r
        from .normalize import classify_reducer  # (normalize imports this module)

        def reducer(ins: Instruction) -> str | None:
            callee = ins.parsed.get("to_apply")
            comp = self.m.computations.get(callee) if isinstance(callee, str) else None
            return classify_reducer(comp) if comp is not None else None

        def literal(name: str) -> str | None:
            c = self.by.get(name)
            return c.literal if c is not None and c.opcode == "constant" and c.shape.dims == () else None

        kind = reducer(r)
        x = self.by.get(w.operands[0])
        if kind is None or kind != reducer(w) or kind not in ("add", "max", "min") or x is None or x.shape.is_tuple:
            return r
        i0, i1 = literal(w.operands[1]), literal(r.operands[1])
        if i0 is None or (i0 != i1 if kind != "add" else i0.strip() not in ("0", "0.0")):
            return r
        window = w.parsed.get("window")
        dims = r.parsed.get("dimensions")
        if not isinstance(window, dict) or not isinstance(dims, list) or set(window) - {"size", "stride", "pad", "lhs_dilate", "rhs_dilate"}:
            return r
        n = x.shape.rank
        fields = {str(k): str(v).split("x") for k, v in window.items()}
        if any(len(v) != n for v in fields.values()) or len(w.shape.dims) != n:
            return r
        plain = {"pad": "0_0", "lhs_dilate": "1", "rhs_dilate": "1"}
        if any(v[d] != plain[k] for k, v in fields.items() if k in plain for d in range(n)):
            return r
        size, stride = fields.get("size"), fields.get("stride", ["1"] * n)
        if size is None or x.shape.dtype != w.shape.dtype:
            return r
        for d in range(n):
            try:
                s, st = int(size[d]), int(stride[d])
            except ValueError:
                return r
            whole = s == st and x.shape.dims[d] == w.shape.dims[d] * s
            if not (whole if d in dims else s == st == 1 and x.shape.dims[d] == w.shape.dims[d]):
                return r
        return replace(r, operands=[x.name, r.operands[1]])

    def device_id(self, ins: Instruction) -> str:
        op = ins.opcode  # (a walrus inside the conditional left `op` unbound in the replica flavour)
        is_device = op == ("partition-id" if self.partition_flavour else "replica-id")
        if is_device:
            p = replace(ins, opcode="parameter", operands=[], parameter_number=self.params, parsed={"device_id": op}, attrs={})
            self.params += 1
        elif (op == "replica-id" and (self.replicas or 1) == 1) or (op == "partition-id" and self.partitions == 1):
            p = replace(ins, opcode="constant", operands=[], literal="0", parsed={}, attrs={})  # one replica / partition
        else:
            self.emit(ins)
            return ins.name
        self.emit(p)
        return p.name

    def partition_groups(self, ins: Instruction) -> Instruction:
        channel = ins.parsed.get("channel_id") is not None
        global_ids = ins.parsed.get("use_global_device_ids") in (True, "true")
        if channel and (global_ids or ins.opcode in CHANNELED):
            return ins  # flattened / cross-partition ids: partition ids when R = 1
        groups = ins.parsed.get("replica_groups") or []
        if channel and ins.opcode in GROUPED and self.partitions and all(g == [0] for g in groups) and (self.replicas or 1) == 1:
            # Cross-replica-and-partition with one replica: one group of all partitions.
            new = copy.copy(ins)
            new.parsed = dict(ins.parsed, replica_groups=[list(range(self.partitions))])
            return new
        return replace(ins, opcode=f"{ins.opcode}.cross-replica")

    def unroll(self, w: Instruction, label: str) -> str | None:
        cond = self.m.computations.get(str(w.parsed.get("condition")))
        body = self.m.computations.get(str(w.parsed.get("body")))
        if cond is None or body is None or len(w.operands) != 1:
            return None
        carried = self.shape_of(w.operands[0])
        self.check_signature(w, body, [carried], carried)
        self.check_signature(w, cond, [carried], None)
        j = self.loops
        self.loops += 1
        state = w.operands[0]
        saved = (list(self.out), dict(self.by), self.iteration)
        for _ in range(MAX_TRIPS + 1):
            go = self.condition(cond, state)
            if go is None or len(self.out) > MAX_UNROLLED:
                break
            if not go:
                return state
            k = self.iteration
            self.iteration += 1
            self.in_loop += 1
            if self.label_loops and not label:
                state = self.expand(body.instructions, {0: state}, f"while.{j}/layers.{k}/", only=self.carried(body, state))
            else:
                state = self.expand(body.instructions, {0: state}, label)
            self.in_loop -= 1
        # Not a known trip count (or too many): keep the loop, reported unsupported.
        self.out, self.iteration = saved[0], saved[2]
        self.by.clear()
        self.by.update(saved[1])
        self.consts.memo.clear()
        return None

    def carried(self, body: Computation, state: str) -> set[str]:
        """The body instructions that depend on the data the loop carries from one iteration to
        the next: those form the iteration's layer. The rest reads only loop invariants (the
        stacked weights) and counters whose value is a known integer this iteration (the slice
        of this iteration's weights): left unlabelled, it is cut into the segment of what it
        reads, so every iteration's layer reads its weights from outside and identical
        iterations have identical layer texts (proven once by the verifier's layer memo)."""
        root = body.root
        param = next((i for i in body.instructions if i.opcode == "parameter"), None)
        st = self.by.get(state)
        if param is None or root.opcode != "tuple" or st is None or st.opcode != "tuple":
            return {i.name for i in body.instructions}
        by = {i.name: i for i in body.instructions}
        ev = ScalarEval(self.by.get)
        sources: set[str] = set()
        for ins in body.instructions:
            if ins.opcode != "get-tuple-element" or ins.operands != [param.name] or ins.tuple_index is None:
                continue
            k = ins.tuple_index
            elem = by.get(root.operands[k]) if k < len(root.operands) else None
            while elem is not None and elem.opcode == "copy":
                elem = by.get(elem.operands[0])
            invariant = elem is not None and elem.opcode == "get-tuple-element" and elem.operands == [param.name] and elem.tuple_index == k
            known = k < len(st.operands) and isinstance(ev.value(st.operands[k]), int)
            if not invariant and not known:
                sources.add(ins.name)
        tainted = set(sources)
        for ins in body.instructions:
            if any(o in tainted for o in ins.operands):
                tainted.add(ins.name)
        return tainted

    def condition(self, cond: Computation, state: str) -> bool | None:
        """The loop condition's value on the carried tuple ``state``, when it is a constant."""
        scratch = _Flattener.__new__(_Flattener)
        scratch.__dict__.update(self.__dict__)
        scratch.out, scratch.by = [], {}
        scratch.label_loops = False
        root = scratch.expand(cond.instructions, {0: state}, "")
        local = scratch.by

        def lookup(n: str) -> Instruction | None:
            return local.get(n) or self.by.get(n)

        v = ScalarEval(lookup).value(root)
        return None if not isinstance(v, int) else bool(v)


def _physical(shape: Shape) -> list[int] | None:
    """Major-to-minor dim order of an array shape's layout (row-major when none is printed)."""
    n = shape.rank
    if not shape.layout:
        return list(range(n))
    head = shape.layout.split(":", 1)[0].strip("{} ")
    try:
        m2m = [int(t) for t in head.split(",")] if head else []
    except ValueError:
        return None
    return m2m[::-1] if sorted(m2m) == list(range(n)) else None


def flatten(module: Module) -> Module:
    """A new module whose entry computation has no call, fusion, known-trip-count while or
    device-id instruction (see the module doc). The input module is not changed."""
    reject_global(module)
    module = neuron_layers(module)
    entry = module.entry
    if not any(i.opcode in ("call", "fusion", "while", "partition-id", "replica-id", "bitcast", "copy") or i.opcode in GROUPED or i.opcode in CHANNELED for i in entry.instructions):
        return module
    f = _Flattener(module)
    result = f.expand(entry.instructions, {}, "", entry=True)
    out = f.out
    root = f.by.get(result)
    if root is None:  # the entry returns a parameter through a call: keep a copy as the root
        src = next(i for i in out if i.name == result)
        root = replace(src, name=f.fresh(result + ".root"), opcode="copy", operands=[result], parsed={}, attrs={}, literal=None, parameter_number=None, metadata=Metadata())
        out.append(root)
    root.is_root = True
    new = copy.copy(module)
    new.computations = dict(module.computations)
    new.computations[module.entry_name] = Computation(entry.name, out, entry.is_entry, entry.loc)
    return new


# --- Neuron (transformers-neuronx / torch-neuronx) ------------------------------------------
#
# Neuron's HLO carries two custom-calls XLA:CPU cannot run. The analysis never reads them
# through this section: the relations file declares what each keeps (custom_calls:
# AwsNeuronTransferWithStaticRing ``keeps: all``, AwsNeuronRmsNorm ``keeps: [duplicate]`` or
# ``[duplicate, sharded]`` with ``reduces: [d]``), and the rules use only that declaration.
# Executing a pair (the numeric witness) needs values, so ``neuron_executable`` spells each
# call out in plain HLO, as torch-neuronx defines it:
# - ``AwsNeuronTransferWithStaticRing(x)`` moves x to the device's ring buffer: the identity
#   (a copy);
# - ``AwsNeuronRmsNorm(x, w, eps)`` with ``backend_config="d"`` (torch_neuronx RmsNorm.apply(x,
#   w, eps, d)): x · rsqrt(mean(x², over dim d) + eps) · w (w along dim d), in f32, converted
#   to the call's result type.
NEURON_TRANSFER = "AwsNeuronTransferWithStaticRing"
NEURON_RMSNORM = "AwsNeuronRmsNorm"
_NEURON_ADD = "neuron.rmsnorm.add"


def neuron_executable(text: str) -> str:
    """``text`` with Neuron's custom-calls spelled out in plain HLO (see above); the text
    itself when it has none. Instruction names are kept (a call's value keeps its name)."""
    if NEURON_TRANSFER not in text and NEURON_RMSNORM not in text:
        return text
    from .parser import parse_hlo
    from .printer import print_hlo

    module = parse_hlo(text)
    used = {i.name for c in module.computations.values() for i in c.instructions}
    spelled = False
    for name, comp in list(module.computations.items()):
        out: list[Instruction] = []
        by = {i.name: i for i in comp.instructions}
        for ins in comp.instructions:
            target = ins.parsed.get("custom_call_target") if ins.opcode == "custom-call" else None
            if target == NEURON_TRANSFER and len(ins.operands) == 1:
                out.append(replace(ins, opcode="copy", attrs=_plain_attrs(ins), parsed={}))
            elif target == NEURON_RMSNORM and len(ins.operands) == 3 and not ins.shape.is_tuple:
                out.extend(_rmsnorm(ins, by, used))
                spelled = True
            else:
                out.append(ins)
        module.computations[name] = Computation(comp.name, out, comp.is_entry, comp.loc)
    if spelled:
        add = Computation(_NEURON_ADD, [
            Instruction("neuron.a", "parameter", Shape("f32"), [], parameter_number=0),
            Instruction("neuron.b", "parameter", Shape("f32"), [], parameter_number=1),
            Instruction("neuron.sum", "add", Shape("f32"), ["neuron.a", "neuron.b"], is_root=True),
        ])
        module.computations = {_NEURON_ADD: add, **module.computations}
    return print_hlo(module)


def _plain_attrs(ins: Instruction) -> dict[str, str]:
    # A copy takes none of the custom-call's attributes; its metadata (source lines) stays.
    return {k: v for k, v in ins.attrs.items() if k == "metadata"}


def _rmsnorm(ins: Instruction, by: dict[str, Instruction], used: set[str]) -> list[Instruction]:
    x, w, eps = ins.operands
    raw = str(ins.attrs.get("backend_config", "")).strip('"')
    dims = ins.shape.dims
    try:
        d = int(raw)
    except ValueError:
        return [ins]  # a configuration this spelling does not know: left as the call (XLA refuses it)
    if not 0 <= d < len(dims):
        return [ins]
    meta = _plain_attrs(ins)

    def fresh(stem: str) -> str:
        k = 0
        while f"{ins.name}.{stem}{k or ''}" in used:
            k += 1
        used.add(n := f"{ins.name}.{stem}{k or ''}")
        return n

    def shp(ds: tuple[int, ...]) -> Shape:
        return Shape("f32", ds, ",".join(str(k) for k in reversed(range(len(ds)))))

    full, kept = dims, tuple(n for k, n in enumerate(dims) if k != d)
    rest = [k for k in range(len(dims)) if k != d]
    seq: list[Instruction] = []

    def emit(stem: str, opcode: str, shape: Shape, operands: list[str], attrs: dict[str, str] | None = None, literal: str | None = None) -> str:
        name = fresh(stem)
        seq.append(Instruction(name, opcode, shape, operands, attrs={**(attrs or {}), **meta}, literal=literal))
        return name

    def f32(operand: str, shape: tuple[int, ...]) -> str:
        src = by.get(operand)
        if src is not None and src.shape.dtype == "f32":
            return operand
        return emit("f32", "convert", shp(shape), [operand])

    xf = f32(x, full)
    wf = f32(w, (full[d],))
    ef = f32(eps, ())
    sq = emit("sq", "multiply", shp(full), [xf, xf])
    zero = emit("zero", "constant", shp(()), [], literal="0")
    total = emit("sum", "reduce", shp(kept), [sq, zero], {"dimensions": "{" + str(d) + "}", "to_apply": "%" + _NEURON_ADD})
    count = emit("n", "constant", shp(()), [], literal=str(full[d]))
    mean = emit("mean", "divide", shp(kept), [total, emit("nb", "broadcast", shp(kept), [count], {"dimensions": "{}"})])
    var = emit("var", "add", shp(kept), [mean, emit("epsb", "broadcast", shp(kept), [ef], {"dimensions": "{}"})])
    inv = emit("rsqrt", "rsqrt", shp(kept), [var])
    scaled = emit("scaled", "multiply", shp(full), [xf, emit("rb", "broadcast", shp(full), [inv], {"dimensions": "{" + ",".join(map(str, rest)) + "}"})])
    weighted = emit("weighted", "multiply", shp(full), [scaled, emit("wb", "broadcast", shp(full), [wf], {"dimensions": "{" + str(d) + "}"})])
    seq.append(replace(ins, opcode="convert", operands=[weighted], attrs=meta, parsed={}))
    return seq


def neuron_layers(module: Module) -> Module:
    """Layer names for a Neuron decoder, whose metadata names no module path (so the verifier
    would prove all its layers in one e-graph, its depth growing with the layer count). Each
    transformers-neuronx decoder layer opens with two ``AwsNeuronRmsNorm`` calls (attention,
    MLP) and the head with one more: the call that is the n-th norm on its longest path from the
    inputs gets ``op_name`` ``layers.<(n-1)//2>/``, and every other instruction inherits its
    operands' layer (analysis/partition). Only where the program names no layers itself and
    has at least two such calls. A layer name only decides where the verifier cuts, which can
    cost a proof, never make one (analysis/partition's cuts carry only proven facts); baseline
    and distributed are labelled by the same count, so their layers pair up. The input module
    is not changed."""
    entry = module.entry
    if sum(1 for i in entry.instructions if i.opcode == "custom-call" and i.parsed.get("custom_call_target") == NEURON_RMSNORM) < 2:
        return module
    if any(_LAYER.search(i.metadata.op_name) for c in module.computations.values() for i in c.instructions):
        return module
    depth: dict[str, int] = {}
    out: list[Instruction] = []
    for ins in entry.instructions:
        d = max((depth.get(o, 0) for o in ins.operands), default=0)
        if ins.opcode == "custom-call" and ins.parsed.get("custom_call_target") == NEURON_RMSNORM:
            d += 1
            ins = replace(ins, metadata=replace(ins.metadata, op_name=f"layers.{(d - 1) // 2}/{ins.metadata.op_name}"))
        depth[ins.name] = d
        out.append(ins)
    new = copy.copy(module)
    new.computations = dict(module.computations)
    new.computations[module.entry_name] = Computation(entry.name, out, entry.is_entry, entry.loc)
    return new
