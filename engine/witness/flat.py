"""A text XLA's CPU runtime can compile, made from a module it refuses as written.

``jax.jit(...).compile().as_text()`` prints a module after XLA's own optimisation: fusions with
backend configs, layouts, bitcasts and copies. Compiling that text again fails ("Fusion must
have backend config", a layout of the wrong rank) or aborts the process (a ``Check failed`` in
the CPU emitter). The analysis reads such modules through ``engine.hlo.flavours.flatten``, which
rewrites only by XLA's semantics: calls and fusions inlined, a copy is its operand, a bitcast is
a transpose/reshape of its operand's physical order, loops with known trip counts unrolled. The
witness executes the same flat module, re-printed (``engine.hlo.printer``), with:

- the device id restored: ``flatten`` makes ``partition-id`` / ``replica-id`` a parameter
  marked ``device_id`` (the analysis relates it to the rank); here it is the instruction again;
- collectives it renamed ``<op>.cross-replica`` given their opcode back (the groups as
  written; the runtime maps the flavour);
- no layouts: after the rewrites above a layout means nothing to a value, and XLA lays out a
  text without layouts itself; header attributes about the compiled module (its entry layout,
  its schedule) dropped;
- only the computations still called (the fused computations are inlined);
- an all-reduce of several operands (XLA's combiner writes them) split into one all-reduce per
  operand and a tuple of them (the same values by definition: each operand is reduced
  element-wise over the same groups); XLA:CPU's layout assignment fails on the combined form
  once its layouts are gone.

The instruction names of the entry are those the analysis reports (the same flatten), so the
witness's probes find the frontier instructions by name.
"""

from __future__ import annotations

import copy
import dataclasses
import re

from ..hlo.flavours import flatten
from ..hlo.parser import parse_hlo
from ..hlo.printer import print_hlo
from ..ir import Instruction, Module, Shape

# What a compiled module prints that XLA refuses (or aborts on) when compiling the text again.
# (calls and copies alone compile as written: those texts are flattened only when XLA refuses.)
_COMPILED = re.compile(r"\s(?:fusion|bitcast)\(|\bis_scheduled=true")
_DROP_HEADER = ("entry_computation_layout", "is_scheduled", "computation_layout")


def looks_compiled(text: str) -> bool:
    """The text has fusions or bitcasts, or says it is scheduled (an optimised module's printing)."""
    return _COMPILED.search(text) is not None


def executable(text: str, always: bool = False) -> str:
    """``text`` as the witness compiles it: flattened when it looks compiled (or ``always``)."""
    return flat_text(text) if always or looks_compiled(text) else text


def _no_layout(shape: Shape) -> Shape:
    if shape.is_tuple:
        return dataclasses.replace(shape, tuple_shapes=tuple(_no_layout(s) for s in shape.tuple_shapes), layout=None)
    return dataclasses.replace(shape, layout=None)


def _restore(ins: Instruction) -> Instruction:
    new = copy.copy(ins)
    device = ins.parsed.get("device_id") if ins.opcode == "parameter" else None
    if isinstance(device, str):
        new.opcode, new.parameter_number, new.operands, new.attrs = device, None, [], {}
    elif ins.opcode.endswith(".cross-replica"):
        new.opcode = ins.opcode[: -len(".cross-replica")]
    new.shape = _no_layout(ins.shape)
    # A layout inside an attribute (a custom-call's operand_layout_constraints, say) stays.
    return new


def _split_all_reduces(instrs: list[Instruction]) -> list[Instruction]:
    taken = {i.name for i in instrs}
    out: list[Instruction] = []
    for ins in instrs:
        if ins.opcode != "all-reduce" or not ins.shape.is_tuple or len(ins.operands) < 2 or len(ins.shape.tuple_shapes) != len(ins.operands):
            out.append(ins)
            continue
        parts = []
        for k, (operand, shape) in enumerate(zip(ins.operands, ins.shape.tuple_shapes, strict=True)):
            name = f"{ins.name}.part{k}"
            while name in taken:
                name += "_"
            taken.add(name)
            out.append(dataclasses.replace(ins, name=name, shape=shape, operands=[operand], is_root=False))
            parts.append(name)
        out.append(dataclasses.replace(ins, opcode="tuple", operands=parts, attrs={}, parsed={}))
    return out


def flat_text(text: str) -> str:
    """The module in ``text`` flattened and re-printed for XLA (see the module doc); raises the
    parser's located error when the text is not a module the analysis reads either."""
    module = flatten(parse_hlo(text, "<witness>"))
    comps = {}
    todo, seen = [module.entry_name], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in module.computations:
            continue
        seen.add(name)
        comp = module.computations[name]
        new = dataclasses.replace(comp, instructions=[_restore(i) for i in comp.instructions])
        comps[name] = new
        for ins in new.instructions:
            todo.extend(ins.called)
    entry = comps[module.entry_name]
    comps[module.entry_name] = dataclasses.replace(entry, instructions=_split_all_reduces(entry.instructions))
    # Callees before their callers, in the module's order (the printer puts the entry last).
    ordered = {n: comps[n] for n in module.computations if n in comps}
    header = {k: v for k, v in module.header.items() if k not in _DROP_HEADER}
    out = Module(module.name, ordered, module.entry_name, header, module.path)
    return print_hlo(out)
