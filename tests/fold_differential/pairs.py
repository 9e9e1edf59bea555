"""Hand-written multi-layer pairs (2 ranks): every layer slices a duplicated weight by the rank,
gathers, and runs a column->row MLP with an all-reduce calling its own reducer computation, as
torch-xla prints it (one reducer per collective). Layer k's instructions carry
``op_name="model.layers.k/..."``; baseline and distributed share instruction names where they
compute the same value, so attributes that hold names read the same on both sides. Each layer
ends with a dead ``negate`` (so a layer can end the entry without being its result)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

C = 2  # ranks
B, H, F = 4, 8, 8  # batch, hidden, FFN width (per rank: F // C)


@dataclass
class Pair:
    name: str
    baseline: str
    distributed: str
    relations: dict[str, Any]
    sourcemap: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _md(k: int, what: str, line: int) -> str:
    return f'metadata={{op_type="{what}" op_name="model.layers.{k}/{what}" source_file="model.py" source_line={line}}}'


def _reducer(name: str) -> str:
    return f"%{name} (x.{name}: f32[], y.{name}: f32[]) -> f32[] {{\n  %x.{name} = f32[] parameter(0)\n  %y.{name} = f32[] parameter(1)\n  ROOT %r.{name} = f32[] add(f32[] %x.{name}, f32[] %y.{name})\n}}\n"


def handwritten(layers: int = 5, extra_attrs: bool = False) -> Pair:
    """The pair; ``extra_attrs`` adds to every layer's scale multiply attributes whose values
    hold names, a channel id and metadata look-alikes (the same text on both sides)."""
    f = F // C
    # Parameters: 0 x, then per layer w (dup, sliced by rank), up (sharded 1), down (sharded 0);
    # then q (a duplicated s32 scalar in [0, 2)); distributed only: r (rank), t (token).
    bparams = [f"f32[{B},{H}]"]
    dparams = [f"f32[{B},{H}]"]
    inputs: list[dict[str, Any]] = [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]
    for k in range(layers):
        n = 1 + 3 * k
        bparams += [f"f32[{H},{H}]", f"f32[{H},{F}]", f"f32[{F},{H}]"]
        dparams += [f"f32[{H},{H}]", f"f32[{H},{f}]", f"f32[{f},{H}]"]
        inputs += [
            {"baseline": n, "distributed": n, "relation": "duplicate"},
            {"baseline": n + 1, "distributed": n + 1, "relation": "sharded", "dim": 1},
            {"baseline": n + 2, "distributed": n + 2, "relation": "sharded", "dim": 0},
        ]
    q = len(bparams)
    bparams.append("s32[]")
    dparams += ["s32[]", "s32[]", "s32[]"]
    inputs += [
        {"baseline": q, "distributed": q, "relation": "duplicate", "int_range": [0, C]},
        {"distributed": q + 1, "relation": "rank"},
        {"distributed": q + 2, "relation": "token"},
    ]
    base: list[str] = []
    dist: list[str] = []
    comps: list[str] = []

    def both(line: str) -> None:
        base.append(line)
        dist.append(line)

    both(f"  %x = f32[{B},{H}]{{1,0}} parameter(0)")
    both(f"  %q = s32[] parameter({q})")
    dist.append(f"  %r = s32[] parameter({q + 1})")
    dist.append(f"  %t = s32[] parameter({q + 2})")
    x = "x"
    for k in range(layers):
        n = 1 + 3 * k
        line = 100 + 10 * k
        both(f"  %w.{k} = f32[{H},{H}]{{1,0}} parameter({n}), {_md(k, 'xla__device_data', line)}")
        base.append(f"  %up.{k} = f32[{H},{F}]{{1,0}} parameter({n + 1}), {_md(k, 'xla__device_data', line)}")
        base.append(f"  %down.{k} = f32[{F},{H}]{{1,0}} parameter({n + 2}), {_md(k, 'xla__device_data', line)}")
        dist.append(f"  %up.{k} = f32[{H},{f}]{{1,0}} parameter({n + 1}), {_md(k, 'xla__device_data', line)}")
        dist.append(f"  %down.{k} = f32[{f},{H}]{{1,0}} parameter({n + 2}), {_md(k, 'xla__device_data', line)}")
        # Attention-like part: x @ w, the distributed side computing its rank's columns.
        base.append(f"  %xw.{k} = f32[{B},{H}]{{1,0}} dot(f32[{B},{H}]{{1,0}} %{x}, f32[{H},{H}]{{1,0}} %w.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 1)}")
        dist.append(f"  %four.{k} = s32[] constant({H // C}), {_md(k, 'aten__mul', line + 1)}")
        dist.append(f"  %off.{k} = s32[] multiply(s32[] %r, s32[] %four.{k}), {_md(k, 'aten__mul', line + 1)}")
        dist.append(f"  %zero.{k} = s32[] constant(0), {_md(k, 'aten__slice', line + 1)}")
        dist.append(f"  %ws.{k} = f32[{H},{H // C}]{{1,0}} dynamic-slice(f32[{H},{H}]{{1,0}} %w.{k}, s32[] %zero.{k}, s32[] %off.{k}), dynamic_slice_sizes={{{H},{H // C}}}, {_md(k, 'aten__slice', line + 1)}")
        dist.append(f"  %xl.{k} = f32[{B},{H // C}]{{1,0}} dot(f32[{B},{H}]{{1,0}} %{x}, f32[{H},{H // C}]{{1,0}} %ws.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 1)}")
        dist.append(f"  %xw.{k} = f32[{B},{H}]{{1,0}} all-gather(f32[{B},{H // C}]{{1,0}} %xl.{k}), channel_id={2 * k + 1}, replica_groups={{{{0,1}}}}, dimensions={{1}}, use_global_device_ids=true, {_md(k, 'xla__all_gather', line + 1)}")
        both(f"  %half.{k} = f32[] constant(0.5), {_md(k, 'aten__mul', line + 2)}")
        both(f"  %hb.{k} = f32[{B},{H}]{{1,0}} broadcast(f32[] %half.{k}), dimensions={{}}, {_md(k, 'aten__mul', line + 2)}")
        extra = ""
        if extra_attrs:
            extra = f', control-predecessors={{%xw.{k}}}, foo={{a=%hb.{k}, channel_id=3}}, baz={{k=v, metadata={{op_name="model.layers.0/q"}}}}, bar="b, metadata={{op_name=\\"model.layers.0/q\\"}}"'
        both(f"  %sc.{k} = f32[{B},{H}]{{1,0}} multiply(f32[{B},{H}]{{1,0}} %xw.{k}, f32[{B},{H}]{{1,0}} %hb.{k}){extra}, {_md(k, 'aten__mul', line + 2)}")
        both(f"  %res.{k} = f32[{B},{H}]{{1,0}} add(f32[{B},{H}]{{1,0}} %{x}, f32[{B},{H}]{{1,0}} %sc.{k}), {_md(k, 'aten__add', line + 3)}")
        # MLP part: column-parallel up, row-parallel down, all-reduce.
        both(f"  %h.{k} = f32[{B},{F}]{{1,0}} dot(f32[{B},{H}]{{1,0}} %res.{k}, f32[{H},{F}]{{1,0}} %up.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 4)}".replace(f"f32[{B},{F}]{{1,0}} dot", f"f32[{B},{F}]{{1,0}} dot") if False else "")
        base[-1] = f"  %h.{k} = f32[{B},{F}]{{1,0}} dot(f32[{B},{H}]{{1,0}} %res.{k}, f32[{H},{F}]{{1,0}} %up.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 4)}"
        dist[-1] = f"  %h.{k} = f32[{B},{f}]{{1,0}} dot(f32[{B},{H}]{{1,0}} %res.{k}, f32[{H},{f}]{{1,0}} %up.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 4)}"
        base.append(f"  %relu0.{k} = f32[] constant(0), {_md(k, 'aten__relu', line + 5)}")
        dist.append(f"  %relu0.{k} = f32[] constant(0), {_md(k, 'aten__relu', line + 5)}")
        base.append(f"  %rb.{k} = f32[{B},{F}]{{1,0}} broadcast(f32[] %relu0.{k}), dimensions={{}}, {_md(k, 'aten__relu', line + 5)}")
        dist.append(f"  %rb.{k} = f32[{B},{f}]{{1,0}} broadcast(f32[] %relu0.{k}), dimensions={{}}, {_md(k, 'aten__relu', line + 5)}")
        base.append(f"  %act.{k} = f32[{B},{F}]{{1,0}} maximum(f32[{B},{F}]{{1,0}} %h.{k}, f32[{B},{F}]{{1,0}} %rb.{k}), {_md(k, 'aten__relu', line + 5)}")
        dist.append(f"  %act.{k} = f32[{B},{f}]{{1,0}} maximum(f32[{B},{f}]{{1,0}} %h.{k}, f32[{B},{f}]{{1,0}} %rb.{k}), {_md(k, 'aten__relu', line + 5)}")
        base.append(f"  %o.{k} = f32[{B},{H}]{{1,0}} dot(f32[{B},{F}]{{1,0}} %act.{k}, f32[{F},{H}]{{1,0}} %down.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 6)}")
        dist.append(f"  %ol.{k} = f32[{B},{H}]{{1,0}} dot(f32[{B},{f}]{{1,0}} %act.{k}, f32[{f},{H}]{{1,0}} %down.{k}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, {_md(k, 'aten__mm', line + 6)}")
        comps.append(_reducer(f"sum.{k}"))
        dist.append(f"  %o.{k} = f32[{B},{H}]{{1,0}} all-reduce(f32[{B},{H}]{{1,0}} %ol.{k}), channel_id={2 * k + 2}, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=%sum.{k}, {_md(k, 'xla__cross_replica_sum', line + 6)}")
        both(f"  %out.{k} = f32[{B},{H}]{{1,0}} add(f32[{B},{H}]{{1,0}} %res.{k}, f32[{B},{H}]{{1,0}} %o.{k}), {_md(k, 'aten__add', line + 7)}")
        both(f"  %dead.{k} = f32[{B},{H}]{{1,0}} negate(f32[{B},{H}]{{1,0}} %out.{k}), {_md(k, 'aten__neg', line + 8)}")
        x = f"out.{k}"
    both(f"  ROOT %result = (f32[{B},{H}]{{1,0}}) tuple(f32[{B},{H}]{{1,0}} %{x})")

    def module(name: str, params: list[str], body: list[str], with_comps: bool) -> str:
        sig = ", ".join(f"p{i}: {s}" for i, s in enumerate(params))
        head = f"HloModule {name}, entry_computation_layout={{({', '.join(params)})->(f32[{B},{H}]{{1,0}})}}\n\n"
        return head + ("\n".join(comps) + "\n" if with_comps else "") + f"ENTRY %{name} ({sig}) -> (f32[{B},{H}]) {{\n" + "\n".join(body) + "\n}\n"

    relations = {"groups": [list(range(C))], "inputs": inputs, "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Pair(f"handwritten{'_attrs' if extra_attrs else ''}_{layers}l", module("base", bparams, base, False), module("dist", dparams, dist, True), relations)
