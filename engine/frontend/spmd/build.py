"""Build a torch-xla SPMD model (runs in a forked child of a torch-xla build worker).

The runner starts a torch-xla worker for ``framework: torch-xla-spmd`` models and forks a child
per model under the model's caps (runner.py, server.py). :func:`build_request` sets what the
runtime reads when it starts, which is in this child (the worker only imported torch-xla):
``CPU_NUM_DEVICES`` (the virtual devices) and XLA's dump of the module after SPMD partitioning
into the model's folder; then it switches the runtime to SPMD and writes:

- ``baseline.hlo`` (+ ``baseline.sourcemap.json``): ``baseline`` traced on placeholders of one
  group's shapes, without any annotation (frontend/capture.py, as for torch models);
- ``distributed.hlo``: ``distributed`` traced on placeholders of the global shapes, each
  annotated with its spec (``xs.annotate_custom_sharding``: ``mark_sharding`` refuses
  placeholders), outputs marked with theirs, compiled without running
  (``_xla_warm_up_cache``); the file is what XLA wrote right after SPMD partitioning, the
  program each device runs;
- ``relations.yaml``: derived from the mesh and the specs (frontend/jax/build.py's rules), by
  the parameter numbers the lowering gave each placeholder (the partitioner keeps them);
- ``sourcemap.json``: the repository frames of the dump's metadata (``XLA_HLO_DEBUG``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from ..jax.build import SpecError, groups_of, relation_of, sourcemap
from .declare import SpmdContext, SpmdModel

SPMD_DIR = Path(__file__).resolve().parent
_DTYPES = {"float32", "bfloat16", "float16", "int32", "int64"}


def _mesh_view(mesh: Any) -> SimpleNamespace:
    """The mesh as the relation rules read it (axis names, sizes, devices in partition order)."""
    import numpy as np

    names = tuple(mesh.axis_names)
    shape = tuple(int(s) for s in mesh.mesh_shape)
    if [int(d) for d in np.asarray(mesh.device_ids).reshape(-1)] != list(range(int(np.prod(shape)))):
        raise SpecError(f"the mesh's devices must be 0..n-1 in order (ctx.mesh makes such a mesh), got {list(mesh.device_ids)}")
    return SimpleNamespace(axis_names=names, shape=dict(zip(names, shape, strict=True)), devices=np.zeros(shape))


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in _flat(item)]
    if isinstance(out, dict):
        return [t for item in out.values() for t in _flat(item)]
    return [out]


def _partition_spec(spec: tuple[Any, ...], rank: int) -> tuple[Any, ...]:
    return tuple(spec) + (None,) * (rank - len(spec))


def output_relations(specs: list[Any], base_shapes: list[tuple[int, ...]], mesh: Any, group_axes: tuple[str, ...], name: str) -> list[dict[str, Any]]:
    """The expected relation of each output. A baseline output already has one group's shape
    (the baseline runs on one group's part of the batch), so a dim split over a data-parallel
    axis is not divided again (``per_group``): dividing it would refuse a correct batch of one
    row per group, or demand a divisibility the program never needed."""
    outputs = []
    for k, (spec, shape) in enumerate(zip(specs, base_shapes, strict=True)):
        rel, _ = relation_of(tuple(spec), tuple(shape), mesh, group_axes, f"{name}: output {k}", per_group=True)
        outputs.append({"baseline": k, "distributed": k, **rel})
    return outputs


def build_request(request: dict[str, Any]) -> dict[str, Any]:
    from ..build import DeclarationError, hidden_files, load_entry

    out = Path(request["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    dump = out / ".xla_dump"
    shutil.rmtree(dump, ignore_errors=True)
    os.environ["CPU_NUM_DEVICES"] = str(int(request["devices"]))
    # Compiled only to run the partitioner: the fastest backend settings do.
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from .. import capture

    xr.use_spmd()
    fn = load_entry(request["entry"], request["python_path"])
    ctx = SpmdContext(request["name"], int(request["devices"]), request.get("variant"), request.get("size") or {})
    model = fn(ctx)
    if not isinstance(model, SpmdModel):
        raise DeclarationError(f"the entry point must return shardproof.engine.frontend.spmd.declare.SpmdModel, got {type(model).__name__}", "entry")
    unread = [k for k in ctx.unread_knobs() if k in (request.get("own_size") or [])]
    if unread:
        raise DeclarationError(f"size knob(s) {', '.join(unread)} are never read by {request['entry']}", f"size.{unread[0]}")
    name = request["name"]
    try:
        mesh = _mesh_view(model.mesh)
        group_axes = tuple(model.group_axes) if model.group_axes is not None else tuple(mesh.axis_names)
        inputs, base_shapes = [], []
        for inp in model.inputs:
            if inp.dtype not in _DTYPES:
                raise SpecError(f"{name}: input {inp.name}: dtype {inp.dtype!r}; expected one of {sorted(_DTYPES)}")
            rel, local = relation_of(tuple(inp.spec), tuple(inp.shape), mesh, group_axes, f"{name}: input {inp.name}")
            inputs.append(rel)
            base_shapes.append(local)
    except SpecError as e:
        raise DeclarationError(str(e), "entry") from e

    root = Path(request["root"]).resolve()
    exclude = [*hidden_files(root, request.get("hide_frames") or []), *(str(p) for p in SPMD_DIR.glob("*.py"))]
    base_in = [capture.placeholder(s, getattr(torch, i.dtype)) for s, i in zip(base_shapes, model.inputs, strict=True)]
    base_out = _flat(model.baseline(*base_in))
    base = capture.capture(base_out, root, exclude=exclude)

    dist_in = [capture.placeholder(tuple(i.shape), getattr(torch, i.dtype)) for i in model.inputs]
    # The annotation replaces a tensor's value by the Sharding custom-call of it; annotating a
    # clone keeps the placeholder itself a parameter whose number the lowering can tell.
    annotated = [t.clone() for t in dist_in]
    for t, i in zip(annotated, model.inputs, strict=True):
        xs.annotate_custom_sharding(t, model.mesh, _partition_spec(tuple(i.spec), len(i.shape)))
    dist_out = _flat(model.distributed(*annotated))
    out_specs = list(model.outputs) if model.outputs is not None else [()] * len(base_out)
    if not len(out_specs) == len(base_out) == len(dist_out):
        raise DeclarationError(f"{len(out_specs)} output spec(s), but the baseline returns {len(base_out)} and the distributed function {len(dist_out)} output(s)", "entry")
    try:
        outputs = output_relations(out_specs, [tuple(t.shape) for t in base_out], mesh, group_axes, name)
    except SpecError as e:
        raise DeclarationError(str(e), "entry") from e
    for t, spec in zip(dist_out, out_specs, strict=True):
        xs.mark_sharding(t, model.mesh, _partition_spec(tuple(spec), t.dim()))
    # The lowering numbers the placeholders; the partitioner keeps the numbers.
    dist = capture.capture(dist_out, root, exclude=exclude)
    torch_xla._XLAC._xla_warm_up_cache(dist_out, [])
    dumped = sorted(dump.glob("*after_spmd-partitioning*.txt"))
    if len(dumped) != 1:
        raise RuntimeError(f"expected XLA to dump one module after SPMD partitioning, found {[p.name for p in dumped]}")

    relations: dict[str, Any] = {"groups": groups_of(mesh, group_axes), "inputs": [], "outputs": outputs}
    for i, rel, b_ph, d_ph in zip(model.inputs, inputs, base_in, dist_in, strict=True):
        try:
            b, d = base.parameter_number(b_ph), dist.parameter_number(d_ph)
        except ValueError as e:
            raise DeclarationError(f"input {i.name!r} must be read by both functions ({e})", "entry") from e
        entry = {"baseline": b, "distributed": d, **rel}
        if i.int_range is not None:
            entry["int_range"] = [int(i.int_range[0]), int(i.int_range[1])]
        relations["inputs"].append(entry)
    (out / "baseline.hlo").write_text(base.hlo_text)
    (out / "baseline.sourcemap.json").write_text(capture.dump_sourcemap(base.sourcemap))
    (out / "distributed.hlo").write_text(dumped[0].read_text())
    (out / "relations.yaml").write_text(yaml.safe_dump(relations, sort_keys=False, default_flow_style=None))
    hidden = {str(Path(p).resolve()) for p in exclude}
    (out / "sourcemap.json").write_text(json.dumps(sourcemap(out / "distributed.hlo", root, hidden), indent=1) + "\n")
    shutil.rmtree(dump, ignore_errors=True)
    return {"description": model.description or request.get("description", ""), "devices": int(request["devices"]),
            "hlo_bytes": {k: (out / f"{k}.hlo").stat().st_size for k in ("baseline", "distributed")}}
