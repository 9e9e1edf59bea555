"""Build a JAX model's HLO pair and relations (runs in the build process; imports jax).

The process is started by run.py with ``JAX_PLATFORMS=cpu``, ``XLA_FLAGS`` giving the virtual
CPU devices, and XLA's dump of the module after SPMD partitioning (``--xla_dump_to``,
``--xla_dump_hlo_pass_re=spmd-partitioning``). Per model it writes into ``OUT/<name>/``:

- ``baseline.hlo``: ``jax.jit(baseline).lower(*inputs).as_text(dialect="hlo")`` (one device);
- ``distributed.hlo``: the per-device module XLA wrote right after SPMD partitioning (what each
  device runs, before XLA's optimizations: the user's operations and JAX's rank arithmetic as
  written, every op at its Python line through ``stack_frame_id``); ``distributed.compiled.hlo``
  keeps ``compile().as_text()`` of the same jit and ``baseline.compiled.hlo`` the baseline's (a
  pair the verifier reads too; XLA's CPU runtime cannot run optimized text again, so the
  witness gets the unoptimized one);
- ``relations.yaml``: derived from the mesh and the specs (see declare.py);
- ``build.json``: ``{"ok": true}`` or the error.

Inputs are ``jax.ShapeDtypeStruct``s: nothing is allocated.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml

from .declare import JaxContext, JaxModel, Spec


def _axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def groups_of(mesh: Any, group_axes: tuple[str, ...]) -> list[list[int]]:
    """Partition ids (the mesh's flat device positions) grouped along ``group_axes``: the other
    axes first, the group axes last, in the order given (a device's index in its group is its
    rank)."""
    import numpy as np

    names = list(mesh.axis_names)
    idx = np.arange(mesh.devices.size).reshape(mesh.devices.shape)
    perm = [names.index(a) for a in names if a not in group_axes] + [names.index(a) for a in group_axes]
    c = 1
    for a in group_axes:
        c *= mesh.shape[a]
    return [[int(v) for v in row] for row in np.transpose(idx, perm).reshape(-1, c)]


def relation_of(spec: Spec, shape: tuple[int, ...], mesh: Any, group_axes: tuple[str, ...], what: str) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The relation of a value with ``spec`` to the baseline value, and the baseline's shape."""
    local = list(shape)
    rel: dict[str, Any] = {"relation": "duplicate"}
    if len(spec) > len(shape):
        raise ValueError(f"{what}: spec {spec} has more entries than the shape {shape} has dims")
    for d, entry in enumerate(spec):
        axes = _axes_of(entry)
        grouped = tuple(a for a in axes if a in group_axes)
        other = [a for a in axes if a not in group_axes]
        for a in other:
            if local[d] % mesh.shape[a]:
                raise ValueError(f"{what}: dim {d} of {shape} does not divide over axis '{a}' ({mesh.shape[a]})")
            local[d] //= mesh.shape[a]
        if grouped:
            if grouped != group_axes or other:
                raise ValueError(f"{what}: dim {d} is split over {axes}; the group axes {group_axes} must split it together, in this order, and alone")
            if rel["relation"] == "sharded":
                raise ValueError(f"{what}: two dims split over the group axes")
            rel = {"relation": "sharded", "dim": d}
    return rel, tuple(local)


def derive(model: JaxModel, name: str) -> dict[str, Any]:
    mesh = model.mesh
    group_axes = tuple(model.group_axes) if model.group_axes is not None else tuple(mesh.axis_names)
    for a in group_axes:
        if a not in mesh.axis_names:
            raise ValueError(f"{name}: group axis '{a}' is not an axis of the mesh {tuple(mesh.axis_names)}")
    inputs, base_shapes = [], []
    for i, inp in enumerate(model.inputs):
        rel, local = relation_of(tuple(inp.spec), tuple(inp.shape), mesh, group_axes, f"{name}: input {inp.name}")
        entry = {"baseline": i, "distributed": i, **rel}
        if inp.int_range is not None:
            entry["int_range"] = [int(inp.int_range[0]), int(inp.int_range[1])]
        inputs.append(entry)
        base_shapes.append(local)
    return {"groups": groups_of(mesh, group_axes), "inputs": inputs, "base_shapes": base_shapes, "group_axes": group_axes}


def build_one(model: JaxModel, name: str, out: Path, dump: Path) -> None:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    d = derive(model, name)
    base_args = [jax.ShapeDtypeStruct(s, inp.dtype) for s, inp in zip(d["base_shapes"], model.inputs, strict=True)]
    dist_args = [jax.ShapeDtypeStruct(tuple(inp.shape), inp.dtype) for inp in model.inputs]
    base_lowered = jax.jit(model.baseline).lower(*base_args)
    n_out = len(jax.tree_util.tree_leaves(base_lowered.out_info))
    out_specs = list(model.outputs) if model.outputs is not None else [()] * n_out
    if len(out_specs) != n_out:
        raise ValueError(f"{name}: {len(out_specs)} output specs for {n_out} outputs")
    base_out = jax.tree_util.tree_leaves(base_lowered.out_info)
    outputs = []
    for k, (spec, o) in enumerate(zip(out_specs, base_out, strict=True)):
        # The baseline's output shape is one group's: a group-sharded dim is c times the local.
        rel, _ = relation_of(tuple(spec), tuple(o.shape), model.mesh, d["group_axes"], f"{name}: output {k}")
        outputs.append({"baseline": k, "distributed": k, **rel})
    in_sh = tuple(NamedSharding(model.mesh, P(*inp.spec)) for inp in model.inputs)
    if model.gspmd:
        out_sh = tuple(NamedSharding(model.mesh, P(*s)) for s in out_specs)
        jitted = jax.jit(model.distributed, in_shardings=in_sh, out_shardings=out_sh if n_out != 1 else out_sh[0])
    else:
        jitted = jax.jit(model.distributed, in_shardings=in_sh)
    lowered = jitted.lower(*dist_args)
    before = set(dump.iterdir()) if dump.exists() else set()
    compiled = lowered.compile()
    after = [p for p in (set(dump.iterdir()) if dump.exists() else set()) - before if "after_spmd-partitioning" in p.name]
    out.mkdir(parents=True, exist_ok=True)
    (out / "baseline.hlo").write_text(base_lowered.as_text(dialect="hlo"))
    (out / "baseline.compiled.hlo").write_text(base_lowered.compile().as_text())
    (out / "distributed.compiled.hlo").write_text(compiled.as_text())
    if len(after) == 1:
        (out / "distributed.hlo").write_text(after[0].read_text())
    else:  # one device (nothing to partition): the compiled module is the per-device program
        (out / "distributed.hlo").write_text(compiled.as_text())
    relations = {"groups": d["groups"], "inputs": d["inputs"], "outputs": outputs}
    (out / "relations.yaml").write_text(yaml.safe_dump(relations, sort_keys=False, default_flow_style=None))


def main(argv: list[str]) -> int:
    """build.py PLAN.json: [{"name", "entry", "variant", "size", "out"}], python_path in PLAN."""
    plan = json.loads(Path(argv[0]).read_text())
    dump = Path(plan["dump"])
    for p in plan["python_path"]:
        sys.path.insert(0, p)
    import jax

    devices = len(jax.devices())
    for m in plan["models"]:
        out = Path(m["out"])
        out.mkdir(parents=True, exist_ok=True)
        status: dict[str, Any] = {"ok": True}
        try:
            mod_name, fn_name = m["entry"].split(":", 1)
            fn = getattr(importlib.import_module(mod_name), fn_name)
            ctx = JaxContext(m["name"], devices, m.get("variant"), m.get("size") or {})
            model = fn(ctx)
            unread = [k for k in ctx.unread_knobs() if k in (m.get("own_size") or [])]
            if unread:
                raise ValueError(f"size knob(s) {unread} set for {m['name']} but never read by {m['entry']}")
            build_one(model, m["name"], out, dump)
            status["description"] = model.description
        except Exception as e:  # one model's failure is its build-failed row, never the run's end
            status = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        (out / "build.json").write_text(json.dumps(status))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
