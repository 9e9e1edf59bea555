"""IR (``engine/ir.py``) -> HLO text that both our parser and XLA's read back.

The IR keeps every attribute's raw text, so printing is mostly putting the pieces back in order;
``parse_hlo(print_hlo(m))`` equals ``m`` up to source locations. Uses: writing mutated modules
for the mutation campaign (tests/mutation, bench/mutants.py) and minimal reproductions.

What is printed and why:
- names always with ``%`` and operands without their shapes: XLA's parser accepts both forms,
  and shapes next to operands would only be a second copy that could disagree after an edit;
- computation signatures are regenerated from the parameters and the root, so an edited module
  never prints a stale signature;
- the stack-frame tables (``FileNames`` ...) newer XLA prints after the header come back as
  sections, and every other header attribute stays on the ``HloModule`` line.
"""

from __future__ import annotations

from ..ir import Computation, Instruction, Module, Shape

__all__ = ["print_computation", "print_hlo", "print_instruction", "print_shape"]

# Kept in sync with the parser's _SECTIONS: header keys that are tables, not attributes.
_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def print_shape(shape: Shape, layout: bool = True) -> str:
    """``f32[8,<=4,?]{1,0}``, ``(f32[2]{0}, s32[])``, ``token[]``; ``layout=False`` drops the
    minor-to-major part (computation signatures print shapes without it)."""
    if shape.is_tuple:
        return "(" + ", ".join(print_shape(s, layout) for s in shape.tuple_shapes) + ")"
    if shape.dtype in ("token", "opaque") and not shape.dims:
        return f"{shape.dtype}[]"
    dyn = shape.dynamic or (False,) * len(shape.dims)
    dims = ",".join("?" if d < 0 else ("<=" if is_dyn else "") + str(d) for d, is_dyn in zip(shape.dims, dyn, strict=True))
    text = f"{shape.dtype}[{dims}]"
    if layout and shape.layout is not None:
        text += "{" + shape.layout + "}"
    return text


def print_instruction(ins: Instruction) -> str:
    head = f"{'ROOT ' if ins.is_root else ''}%{ins.name} = {print_shape(ins.shape)} {ins.opcode}("
    if ins.opcode == "constant":
        body = ins.literal or ""
    elif ins.opcode == "parameter":
        body = str(ins.parameter_number)
    else:
        body = ", ".join(f"%{o}" for o in ins.operands)
    attrs = "".join(f", {k}={v}" for k, v in ins.attrs.items())
    return f"{head}{body}){attrs}"


def print_computation(comp: Computation) -> str:
    params = ", ".join(f"{p.name}: {print_shape(p.shape, layout=False)}" for p in comp.parameters)
    sig = f"({params}) -> {print_shape(comp.root.shape, layout=False)}"
    lines = [f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} {sig} {{"]
    root = comp.root
    for ins in comp.instructions:
        text = print_instruction(ins)
        # A module parsed without ROOT marks its last instruction as root; say so explicitly.
        if ins is root and not ins.is_root:
            text = "ROOT " + text
        lines.append("  " + text)
    lines.append("}")
    return "\n".join(lines)


def print_hlo(module: Module) -> str:
    head = f"HloModule {module.name}" + "".join(f", {k}={v}" for k, v in module.header.items() if k not in _SECTIONS)
    parts = [head]
    for title in _SECTIONS:
        if title in module.header:
            parts.append(f"{title}\n{module.header[title]}")
    # Callees first, as XLA prints them; the entry last.
    comps = [c for c in module.computations.values() if c.name != module.entry_name]
    comps.append(module.entry)
    parts.extend(print_computation(c) for c in comps)
    return "\n\n".join(parts) + "\n"
