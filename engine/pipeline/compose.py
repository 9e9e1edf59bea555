"""Compose the per-stage programs of a pipeline into one program along their transfer edges.

A pipeline artifact is ``baseline.hlo`` plus one HLO module per stage (``stage<k>.hlo``) and
``pipeline.yaml``: what each stage parameter is (a model input, a weight named like the
baseline's, or a receive), what each stage output is (a result or a send), the transfer edges
(output ``o`` of stage ``s`` feeds parameter ``p`` of stage ``d``; per microbatch, one edge per
transfer) and each stage's point-to-point operations in program order (the schedule).

The composer checks the schedule first (every send has its receive, shapes agree, no blocking
order deadlocks, no transfer depends on its own value), then writes one HLO module whose entry
holds every stage's instructions renamed ``s<k>.<name>`` (so each instruction keeps its own
source, re-keyed in the source map), a received value replaced by the sender's instruction, and
inputs and weights read by several stages merged into one parameter. The rest of the engine then
sees one ordinary pair (baseline, composed), so a proof of the pair is a proof of the pipeline:
the composition is exactly the dataflow the transfers create, nothing is assumed about it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..hlo.parser import parse_hlo
from ..hlo.printer import print_computation, print_shape
from ..ir import Computation, Instruction, Module

__all__ = ["Composed", "PipelineError", "compose", "compose_folder", "load_spec"]


class PipelineError(InputError):
    """A pipeline that cannot run as written (unmatched transfer, shape mismatch, deadlock)."""


@dataclass
class Composed:
    text: str
    sourcemap: dict[str, Any]
    # (kind, name) of each composed parameter in order: ("input", "x"), ("weight", "layers.0.w")
    parameters: list[tuple[str, str]]
    # (stage, output index) of each composed output in order
    outputs: list[tuple[int, int]]
    stats: dict[str, Any] = field(default_factory=dict)


def load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InputError(str(path), "", f"cannot read the pipeline description: {e}") from e
    for key in ("stages", "edges", "schedule"):
        if not isinstance(spec, dict) or key not in spec:
            raise InputError(str(path), key, "expected a mapping with keys stages, edges, schedule")
    return spec


def _at(op: dict[str, Any]) -> str:
    return str(op.get("at") or "<unknown line>")


def check_schedule(spec: dict[str, Any], path: str = "pipeline.yaml") -> None:
    """Match sends to receives per channel (FIFO, as NCCL and gloo do) and run the schedule:
    a blocking send or receive waits until its counterpart is posted; isend/irecv post and go
    on. A stage that cannot go on while another waits for it is a deadlock, named with both
    ends' lines."""
    ops: dict[int, list[dict[str, Any]]] = {int(k): list(v) for k, v in spec["schedule"].items()}
    # Number each op within its channel: the k-th send on s->d meets the k-th receive on s->d.
    sends: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for stage, seq in ops.items():
        for op in seq:
            if int(op["peer"]) not in ops:
                raise PipelineError(path, f"stage {stage}", f"{op['op']} at {_at(op)} names peer {op['peer']}, which is no stage of this pipeline (stages {sorted(ops)})")
            ch = (stage, int(op["peer"])) if op["op"] == "send" else (int(op["peer"]), stage)
            (sends if op["op"] == "send" else recvs)[ch].append(op)
            op["_k"] = len((sends if op["op"] == "send" else recvs)[ch]) - 1
            op["_ch"] = ch
    lonely: list[str] = []  # ends without a counterpart, both kinds, in channel order
    for ch in sorted(set(sends) | set(recvs)):
        s, r = sends.get(ch, []), recvs.get(ch, [])
        for k in range(len(r), len(s)):
            lonely.append(f"send #{k + 1} at {_at(s[k])} (stage {ch[0]} to stage {ch[1]}) has no matching receive on stage {ch[1]} (it receives {len(r)} time(s) from stage {ch[0]})")
        for k in range(len(s), len(r)):
            lonely.append(f"receive #{k + 1} at {_at(r[k])} (stage {ch[1]} from stage {ch[0]}) has no matching send on stage {ch[0]} (it sends {len(s)} time(s) to stage {ch[1]})")
        for a, b in zip(s, r, strict=False):
            if a.get("shape") != b.get("shape"):
                raise PipelineError(path, f"stage {ch[0]} -> stage {ch[1]}", f"shapes disagree: stage {ch[0]} sends {a.get('shape')} at {_at(a)}, stage {ch[1]} receives into {b.get('shape')} at {_at(b)}")
    if lonely:
        # A send to the wrong peer leaves two ends: the send nobody receives and the receive
        # nobody sends to; naming both shows where the peer went wrong.
        pair = [m for m in lonely if m.startswith("send")][:1] + [m for m in lonely if m.startswith("receive")][:1]
        more = len(lonely) - len(pair)
        raise PipelineError(path, "transfers", "; ".join(pair) + (f" (and {more} more unmatched transfer(s))" if more > 0 else ""))
    # Run the schedule.
    pc = dict.fromkeys(ops, 0)
    posted: set[tuple[str, tuple[int, int], int]] = set()
    while True:
        moved = False
        for stage, seq in ops.items():
            while pc[stage] < len(seq):
                op = seq[pc[stage]]
                key = (op["op"], op["_ch"], op["_k"])
                posted.add(key)
                other = ("recv" if op["op"] == "send" else "send", op["_ch"], op["_k"])
                if op.get("blocking", True) and other not in posted:
                    break
                pc[stage] += 1
                moved = True
        if all(pc[s] == len(seq) for s, seq in ops.items()):
            return
        if not moved:
            waiting = [(s, ops[s][pc[s]]) for s in ops if pc[s] < len(ops[s])]
            what = "; ".join(f"stage {s} waits in {op['op']} {'to' if op['op'] == 'send' else 'from'} stage {op['peer']} at {_at(op)}" for s, op in waiting)
            raise PipelineError(path, "schedule", f"the schedule deadlocks: {what}")


_COMP_REF = re.compile(r"%([A-Za-z0-9_][A-Za-z0-9_.\-]*)")


def _stage_outputs(comp: Computation) -> list[str]:
    root = comp.root
    return list(root.operands) if root.opcode == "tuple" else [root.name]


def compose(spec: dict[str, Any], stages: dict[int, Module], sourcemaps: dict[int, dict[str, Any]], path: str = "pipeline.yaml", unread: tuple[tuple[str, str, Any], ...] = ()) -> Composed:
    """One module computing what the stages compute together (see the module docstring).

    ``unread``: (kind, name, shape) of inputs and weights of the baseline that no stage reads
    (a layer no stage runs): they become parameters nothing reads, so the pair still has a
    counterpart for every baseline parameter and the witness can execute it."""
    check_schedule(spec, path)
    params_of: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for st in spec["stages"]:
        for p in st.get("parameters", []):
            params_of[int(st["stage"])][int(p["parameter"])] = p
    results = [(int(st["stage"]), int(o)) for st in spec["stages"] for o in st.get("results", [])]
    feeds: dict[tuple[int, int], tuple[int, int, dict[str, Any]]] = {}
    for e in spec["edges"]:
        feeds[(int(e["dst"]), int(e["parameter"]))] = (int(e["src"]), int(e["output"]), e)

    comps: list[str] = []
    names: dict[tuple[int, str], str] = {}  # (stage, old name) -> new name
    merged: dict[tuple[str, str], Instruction] = {}  # the composed parameters
    graph: dict[str, Instruction] = {}
    order: list[str] = []
    out_names: dict[tuple[int, int], str] = {}
    src_map: dict[str, Any] = {"instructions": {}}
    for k in sorted(stages):
        mod = stages[k]
        prefix = f"s{k}."
        for cname, comp in mod.computations.items():
            if cname != mod.entry_name:
                comps.append(print_computation(_renamed(comp, k, mod)))
        entry = mod.entry
        outs = _stage_outputs(entry)
        for i, o in enumerate(outs):
            out_names[(k, i)] = prefix + o
        for ins in entry.instructions:
            if ins.opcode == "parameter":
                desc = params_of[k].get(ins.parameter_number or 0)
                if desc is None:
                    raise PipelineError(path, f"stage {k}", f"parameter {ins.parameter_number} of stage{k}.hlo is not described (expected an input, weight or recv entry)")
                if desc["kind"] == "recv":
                    continue  # replaced by the sender's value below
                key = (str(desc["kind"]), str(desc["name"]))
                if key in merged:
                    if merged[key].shape != ins.shape:
                        raise PipelineError(path, f"stage {k}", f"{key[0]} {key[1]!r} is {print_shape(merged[key].shape, False)} on an earlier stage but {print_shape(ins.shape, False)} on stage {k}")
                    names[(k, ins.name)] = merged[key].name
                    continue
                new = Instruction(f"p{len(merged)}.{ins.name}", "parameter", ins.shape, [], dict(ins.attrs), metadata=ins.metadata, parameter_number=len(merged))
                merged[key] = new
                names[(k, ins.name)] = new.name
                graph[new.name] = new
                order.append(new.name)
                continue
            names[(k, ins.name)] = prefix + ins.name
        for ins in entry.instructions:
            if ins.opcode == "parameter" and params_of[k][ins.parameter_number or 0]["kind"] == "recv":
                src, out, edge = feeds.get((k, ins.parameter_number or 0), (None, None, None))
                if src is None or out is None or edge is None:
                    raise PipelineError(path, f"stage {k}", f"parameter {ins.parameter_number} of stage {k} is a receive that no edge feeds")
                names[(k, ins.name)] = ("edge", src, out, edge, ins.shape)  # type: ignore[assignment]
        sm = sourcemaps.get(k, {}).get("instructions", {})
        for old, entry_sm in sm.items():
            new_name = names.get((k, old))
            if isinstance(new_name, str):
                src_map["instructions"][new_name] = entry_sm
        src_map.setdefault("hidden", [])
        for h in sourcemaps.get(k, {}).get("hidden", []) or []:
            if h not in src_map["hidden"]:
                src_map["hidden"].append(h)

    for kind, name, shape in unread:
        if (kind, name) not in merged:
            p = Instruction(f"p{len(merged)}.unread", "parameter", shape, [], parameter_number=len(merged))
            merged[(kind, name)] = p
            graph[p.name] = p
            order.append(p.name)

    def resolve(k: int, operand: str) -> str:
        n = names[(k, operand)]
        if isinstance(n, str):
            return n
        _, src, out, edge, shape = n  # type: ignore[misc]
        sent = out_names.get((src, out))
        if sent is None:
            raise PipelineError(path, f"stage {src} -> stage {k}", f"edge from output {out} of stage {src}, which has no such output (send at {edge.get('send_at')}, receive at {edge.get('recv_at')})")
        # Logical shapes: a sender's physical layout (XLA may pick {2,0,1} for a transposed
        # value) is no disagreement with the receiving parameter's default layout.
        if print_shape(graph_shape[sent], False) != print_shape(shape, False):
            raise PipelineError(path, f"stage {src} -> stage {k}", f"shapes disagree: stage {src} sends {print_shape(graph_shape[sent], False)} at {edge.get('send_at')}, stage {k} receives {print_shape(shape, False)} at {edge.get('recv_at')}")
        return sent

    graph_shape: dict[str, Any] = {}
    staged: list[tuple[int, Instruction]] = []
    for k in sorted(stages):
        for ins in stages[k].entry.instructions:
            if ins.opcode != "parameter":
                graph_shape[prefix_name(k, ins.name)] = ins.shape
                staged.append((k, ins))
    for p in merged.values():
        graph_shape[p.name] = p.shape
    deps: dict[str, list[str]] = {}
    edge_of: dict[tuple[str, str], dict[str, Any]] = {}
    for k, ins in staged:
        new_ops = []
        for o in ins.operands:
            r = resolve(k, o)
            n = names[(k, o)]
            if not isinstance(n, str):
                edge_of[(prefix_name(k, ins.name), r)] = n[3]  # type: ignore[index]
            new_ops.append(r)
        attrs = {key: (_rename_comp_refs(v, stages[k], k) if key in _COMP_KEYS else v) for key, v in ins.attrs.items()}
        new = Instruction(prefix_name(k, ins.name), ins.opcode, ins.shape, new_ops, attrs, metadata=ins.metadata, literal=ins.literal, tuple_index=ins.tuple_index)
        graph[new.name] = new
        deps[new.name] = new_ops
    # Topological order over the whole composition: a transfer whose value depends on itself
    # (through the other stage) is a cycle and can never run.
    state: dict[str, int] = {}
    topo: list[str] = list(order)
    for start in [n for _, i in staged for n in [prefix_name(_, i.name)]]:
        if start in state:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        state[start] = 1
        while stack:
            node, idx = stack[-1]
            ops = deps.get(node, [])
            if idx < len(ops):
                stack[-1] = (node, idx + 1)
                nxt = ops[idx]
                if nxt not in deps:
                    continue  # a parameter
                if state.get(nxt) == 1:
                    cyc = [n for n, _ in stack[[n for n, _ in stack].index(nxt):]]
                    edges = [edge_of[(a, b)] for a, b in zip(cyc, [*cyc[1:], nxt], strict=False) if (a, b) in edge_of]
                    what = "; ".join(f"stage {e['src']} sends at {e.get('send_at')} what stage {e['dst']} receives at {e.get('recv_at')}" for e in edges)
                    raise PipelineError(path, "schedule", f"the transfers form a cycle (a value that needs itself): {what}")
                if nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, 0))
            else:
                state[node] = 2
                topo.append(node)
                stack.pop()
    outs = [out_names[r] for r in results]
    root_shape = "(" + ", ".join(print_shape(graph[o].shape) for o in outs) + ")"
    lines = [f"ENTRY %pipeline.composed ({', '.join(f'{p.name}: {print_shape(p.shape, False)}' for p in merged.values())}) -> ({', '.join(print_shape(graph[o].shape, False) for o in outs)}) {{"]
    from ..hlo.printer import print_instruction

    for n in topo:
        lines.append("  " + print_instruction(graph[n]))
    lines.append(f"  ROOT %pipeline.outputs = {root_shape} tuple({', '.join('%' + o for o in outs)})")
    lines.append("}")
    text = "HloModule pipeline_composed\n\n" + "\n\n".join([*comps, "\n".join(lines)]) + "\n"
    return Composed(text, src_map, list(merged), results, {"stages": len(stages), "edges": len(spec["edges"]), "instructions": len(topo)})


_COMP_KEYS = ("to_apply", "calls", "body", "condition", "true_computation", "false_computation", "branch_computations")


def prefix_name(k: int, name: str) -> str:
    return f"s{k}.{name}"


def _renamed(comp: Computation, k: int, mod: Module) -> Computation:
    """A called computation of stage ``k`` with every name prefixed (instructions and the
    computations it calls), so stages never collide."""
    out = []
    for ins in comp.instructions:
        attrs = {key: (_rename_comp_refs(v, mod, k) if key in _COMP_KEYS else v) for key, v in ins.attrs.items()}
        out.append(Instruction(prefix_name(k, ins.name), ins.opcode, ins.shape, [prefix_name(k, o) for o in ins.operands], attrs, metadata=ins.metadata, literal=ins.literal, parameter_number=ins.parameter_number, tuple_index=ins.tuple_index, is_root=ins is comp.root))
    return Computation(prefix_name(k, comp.name), out)


def _rename_comp_refs(value: str, mod: Module, k: int) -> str:
    return _COMP_REF.sub(lambda m: "%" + (prefix_name(k, m.group(1)) if m.group(1) in mod.computations else m.group(1)), value)


def compose_folder(folder: Path) -> Composed:
    """Read ``pipeline.yaml`` and its stage programs from ``folder`` and compose them."""
    spec_path = folder / "pipeline.yaml"
    spec = load_spec(spec_path)
    import json

    stages: dict[int, Module] = {}
    maps: dict[int, dict[str, Any]] = {}
    for st in spec["stages"]:
        k = int(st["stage"])
        prog = folder / str(st["program"])
        stages[k] = parse_hlo(prog.read_text(), str(prog))
        sm = folder / str(st.get("sourcemap", ""))
        if st.get("sourcemap") and sm.exists():
            maps[k] = json.loads(sm.read_text())
    unread: list[tuple[str, str, Any]] = []
    if spec.get("unread"):
        base = parse_hlo((folder / "baseline.hlo").read_text(), str(folder / "baseline.hlo"))
        shapes = {p.parameter_number: p.shape for p in base.entry.parameters}
        for u in spec["unread"]:
            if u.get("baseline_parameter") not in shapes:
                raise InputError(str(spec_path), "unread", f"{u.get('kind')} {u.get('name')!r}: baseline.hlo has no parameter {u.get('baseline_parameter')}")
            unread.append((str(u["kind"]), str(u["name"]), shapes[u["baseline_parameter"]]))
    return compose(spec, stages, maps, str(spec_path), tuple(unread))
