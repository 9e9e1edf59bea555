"""Build a JAX model's HLO pair and relations (runs in a forked build child; imports jax).

``shardproof run`` builds ``framework: jax`` models like torch ones (runner.py): a worker
(``server.py jax``) imports jax once and forks a child per model under the runner's time and
memory caps; the child calls :func:`build_request`, which sets ``JAX_PLATFORMS=cpu`` and
``XLA_FLAGS`` (the model's virtual CPU devices, and XLA's dump of the module after SPMD
partitioning into the model's folder) before the backend starts. It writes into the model's
folder:

- ``baseline.hlo``: ``jax.jit(baseline).lower(*inputs).as_text(dialect="hlo")`` (one device);
- ``distributed.hlo``: the per-device module XLA wrote right after SPMD partitioning (what each
  device runs, before XLA's optimizations: the user's operations and JAX's rank arithmetic as
  written, every op at its Python line through ``stack_frame_id``); ``distributed.compiled.hlo``
  keeps ``compile().as_text()`` of the same jit and ``baseline.compiled.hlo`` the baseline's (a
  pair the verifier reads too; XLA's CPU runtime cannot run optimized text again, so the
  witness gets the unoptimized one);
- ``relations.yaml``: derived from the mesh and the specs (see declare.py);
- ``sourcemap.json`` / ``baseline.sourcemap.json``: each instruction's Python frames in the
  repository (from the ``stack_frame_id`` tables XLA prints), paths relative to its root, so
  findings and review comments land on the model's lines and no machine path is reported.

The runner writes ``build.json`` (the summary, or the error with its traceback).

Inputs are ``jax.ShapeDtypeStruct``s: nothing is allocated.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from .declare import JaxContext, JaxModel, Spec
from .trees import Leaf, TreeError, flatten, output_specs

JAX_DIR = Path(__file__).resolve().parent


class SpecError(ValueError):
    """A spec that cannot become a relation: a mistake in the declaration, not in jax."""


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


def relation_of(spec: Spec, shape: tuple[int, ...], mesh: Any, group_axes: tuple[str, ...], what: str, per_group: bool = False, state: bool = False) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The relation of a value with ``spec`` to the baseline value, and the baseline's shape.

    ``shape`` is the global shape of an input; with ``per_group`` it is already one group's (a
    baseline output's): a dim split over a non-group (data-parallel) axis is that group's part,
    so it is not divided again. A dim of model ``state`` (a weight: one value for every group)
    split over non-group axes is FSDP: the baseline receives it whole, and the relation holds
    for the program's all-gather of it over those axes (``gathered``)."""
    local = list(shape)
    rel: dict[str, Any] = {"relation": "duplicate"}
    gathered: dict[str, Any] | None = None
    if len(spec) > len(shape):
        raise SpecError(f"{what}: spec {spec} has more entries than the shape {shape} has dims")
    for d, entry in enumerate(spec):
        axes = _axes_of(entry)
        for a in axes:
            if a not in mesh.shape:
                raise SpecError(f"{what}: dim {d} is split over {a!r}, which is not an axis of the mesh {tuple(mesh.axis_names)}")
        grouped = tuple(a for a in axes if a in group_axes)
        other = [a for a in axes if a not in group_axes]
        if other and state and not per_group:
            if gathered is not None:
                raise SpecError(f"{what}: dims {gathered['dim']} and {d} of a weight are both split over non-group axes; FSDP gathers one dim")
            if grouped:
                raise SpecError(f"{what}: dim {d} is split over {axes}; the group axes {group_axes} must split it together, in this order, and alone")
            _divides(what, d, shape, local[d], other, mesh)
            gathered = {"dim": d, "groups": groups_of(mesh, tuple(other))}
        elif not per_group:
            for a in other:
                if local[d] % mesh.shape[a]:
                    raise SpecError(f"{what}: dim {d} of {shape} does not divide over axis '{a}' ({mesh.shape[a]})")
                local[d] //= mesh.shape[a]
        if grouped:
            if grouped != group_axes or other:
                raise SpecError(f"{what}: dim {d} is split over {axes}; the group axes {group_axes} must split it together, in this order, and alone")
            if rel["relation"] == "sharded":
                raise SpecError(f"{what}: two dims split over the group axes")
            _divides(what, d, shape, local[d], grouped, mesh)
            rel = {"relation": "sharded", "dim": d}
    if gathered is not None:
        rel["gathered"] = gathered
    return rel, tuple(local)


def derive(model: JaxModel, name: str, leaves: list[Leaf]) -> dict[str, Any]:
    mesh = model.mesh
    group_axes = tuple(model.group_axes) if model.group_axes is not None else tuple(mesh.axis_names)
    for a in group_axes:
        if a not in mesh.axis_names:
            raise SpecError(f"{name}: group axis '{a}' is not an axis of the mesh {tuple(mesh.axis_names)}")
    inputs, base_shapes = [], []
    for i, leaf in enumerate(leaves):
        what = f"{name}: input {leaf.name}"
        rel, local = relation_of(tuple(leaf.spec), leaf.shape, mesh, group_axes, what, state=leaf.state)
        entry = {"baseline": i, "distributed": i, **rel}
        if not leaf.state and any(a not in group_axes for e in leaf.spec for a in _axes_of(e)):
            # Split over a data-parallel axis: each group holds its own part of the batch
            # (the witness gives each group different data, so a program mixing them shows).
            entry["per_group_data"] = True
        if leaf.int_range is not None:
            entry["int_range"] = [int(leaf.int_range[0]), int(leaf.int_range[1])]
        inputs.append(entry)
        base_shapes.append(local)
    return {"groups": groups_of(mesh, group_axes), "inputs": inputs, "base_shapes": base_shapes, "group_axes": group_axes}


@contextlib.contextmanager
def _sharding_context(model: JaxModel) -> Iterator[None]:
    """Where the distributed function is traced: the model's mesh in force (for
    ``with_sharding_constraint`` with bare PartitionSpecs) and, for flax code split by the
    partitioner, its logical axis rules (``nn.with_logical_constraint`` is a no-op without
    them, as in the baseline; inside a shard_map the code is per device, so they stay off)."""
    import jax

    with contextlib.ExitStack() as stack:
        stack.enter_context(jax.set_mesh(model.mesh))
        if model.rules is not None and model.gspmd:
            from flax.linen import logical_axis_rules

            stack.enter_context(logical_axis_rules(list(model.rules)))
        yield


def _rules(model: JaxModel) -> Sequence[tuple[str, Any]] | None:
    """The model's logical axis rules, else flax's rules in force now (if flax is in use)."""
    if model.rules is not None:
        return list(model.rules)
    import sys

    if "flax" in sys.modules:
        from flax.linen import get_logical_axis_rules

        return list(get_logical_axis_rules()) or None
    return None


def build_one(model: JaxModel, name: str, out: Path, dump: Path) -> None:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rules = _rules(model)
    try:
        leaves, rebuild = flatten(model.inputs, model.mesh, rules, model.state)
    except TreeError as e:
        raise SpecError(f"{name}: {e}") from e
    d = derive(model, name, leaves)
    base_args = rebuild([jax.ShapeDtypeStruct(s, leaf.dtype) for s, leaf in zip(d["base_shapes"], leaves, strict=True)])
    dist_args = rebuild([jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(model.mesh, P(*leaf.spec))) for leaf in leaves])
    # keep_unused: every leaf stays a parameter, so parameter i is leaf i in both programs.
    try:
        base_lowered = jax.jit(model.baseline, keep_unused=True).lower(*base_args)
    except Exception as e:
        halved = [leaf.name for leaf, entry in zip(leaves, d["inputs"], strict=True)
                  if not leaf.state and any(a not in d["group_axes"] for x in leaf.spec for a in _axes_of(x))]
        if halved:
            # The usual cause: an FSDP weight declared as data, so the baseline got one group's part.
            e.add_note(f"{name}: the baseline received one data-parallel group's part of {', '.join(halved)} (split over a non-group axis); "
                       "if one is a weight gathered whole inside the program (FSDP), declare it model state: JaxModel(state=[argument index]) or JaxInput(state=True)")
        raise
    base_out, out_tree = jax.tree_util.tree_flatten(base_lowered.out_info)
    try:
        out_specs = output_specs(model.outputs, len(base_out), model.mesh, rules)
    except TreeError as e:
        raise SpecError(f"{name}: {e}") from e
    outputs = []
    for k, (spec, o) in enumerate(zip(out_specs, base_out, strict=True)):
        # The baseline's output shape is one group's: a group-sharded dim is c times the local.
        rel, _ = relation_of(tuple(spec), tuple(o.shape), model.mesh, d["group_axes"], f"{name}: output {k}", per_group=True)
        outputs.append({"baseline": k, "distributed": k, **rel})
    with _sharding_context(model):
        if model.gspmd:
            out_sh = jax.tree_util.tree_unflatten(out_tree, [NamedSharding(model.mesh, P(*s)) for s in out_specs])
            jitted = jax.jit(model.distributed, out_shardings=out_sh, keep_unused=True)
        else:
            jitted = jax.jit(model.distributed, keep_unused=True)
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
    for entry, leaf in zip(d["inputs"], leaves, strict=True):
        entry["name"] = leaf.name
    relations = {"groups": d["groups"], "inputs": d["inputs"], "outputs": outputs}
    (out / "relations.yaml").write_text(yaml.safe_dump(relations, sort_keys=False, default_flow_style=None))


def _frames(md: Any) -> list[tuple[str, int, str]]:
    if md.frames:
        return list(md.frames)
    return [(md.source_file, md.source_line, "")] if md.source_file else []


def sourcemap(hlo: Path, root: Path, hidden: set[str]) -> dict[str, Any]:
    """Each instruction of ``hlo`` with its metadata's frames that lie in the repository (not in
    installed packages, not hidden), innermost first, named relative to ``root``. An instruction
    whose recorded frames all lie elsewhere gets no frames: the report then says so rather than
    name a file of jax or of this machine."""
    from ...hlo.parser import parse_hlo_file
    from ..capture import is_repository_file, portable_path

    module = parse_hlo_file(hlo)
    out: dict[str, Any] = {}
    for comp in module.computations.values():
        for ins in comp.instructions:
            frames = _frames(ins.metadata)
            if not frames:
                continue
            kept = [{"file": portable_path(f, root), "line": line, "function": fn} for f, line, fn in frames
                    if is_repository_file(f, root) and f not in hidden and line > 0]
            # No op_name: the metadata's stays in charge (the normalizer names unrolled loop
            # iterations there, which is how the verifier cuts a scan into its layers).
            out[ins.name] = {"frames": kept}
    return {"instructions": out}


def _hidden(root: Path, globs: Sequence[str]) -> set[str]:
    """Files whose frames never name an instruction: the configuration's ``hide_frames`` and
    the front end's own files (the calls into the user's functions)."""
    out = {str(p) for p in JAX_DIR.parent.rglob("*.py")}
    for pattern in globs:
        out |= {str(p.resolve()) for p in root.glob(pattern) if p.is_file()}
    return out


def build_request(request: dict[str, Any]) -> dict[str, Any]:
    """Build one model in this (forked) process: the runner's job for ``framework: jax``."""
    from ..build import DeclarationError, load_entry

    out = Path(request["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    dump = out / ".xla_dump"
    shutil.rmtree(dump, ignore_errors=True)
    # Read when the backend starts, which is below in this process: the worker only imported jax.
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={int(request['devices'])} --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
    import jax

    fn = load_entry(request["entry"], request["python_path"])
    ctx = JaxContext(request["name"], len(jax.devices()), request.get("variant"), request.get("size") or {})
    model = fn(ctx)
    from ..pipeline.jaxsplit import JaxPipeline

    if not isinstance(model, (JaxModel, JaxPipeline)):
        raise DeclarationError(f"the entry point must return shardproof.engine.frontend.jax.declare.JaxModel, got {type(model).__name__}", "entry")
    unread = [k for k in ctx.unread_knobs() if k in (request.get("own_size") or [])]
    if unread:
        raise DeclarationError(f"size knob(s) {', '.join(unread)} are never read by {request['entry']}", f"size.{unread[0]}")
    try:
        if isinstance(model, JaxPipeline):  # per-rank programs composed along the permutes
            from ..pipeline import jaxsplit

            try:
                if len(model.model.mesh.axis_names) > 1:  # PP x TP: the stages inside an SPMD program
                    build_one(jaxsplit.spmd_model(model), request["name"], out, dump)
                else:
                    jaxsplit.build(model, request["name"], out)
            except jaxsplit.SplitError as e:
                raise SpecError(str(e)) from e
            model = model.model
        else:
            build_one(model, request["name"], out, dump)
    except SpecError as e:
        raise DeclarationError(str(e), "entry") from e
    root = Path(request["root"])
    hidden = _hidden(root, request.get("hide_frames") or [])
    for hlo, name in (("distributed.hlo", "sourcemap.json"), ("baseline.hlo", "baseline.sourcemap.json")):
        (out / name).write_text(json.dumps(sourcemap(out / hlo, root, hidden), indent=1) + "\n")
    shutil.rmtree(dump, ignore_errors=True)
    return {"description": model.description or request.get("description", ""), "devices": len(jax.devices()),
            "hlo_bytes": {k: (out / f"{k}.hlo").stat().st_size for k in ("baseline", "distributed")}}


def _divides(what: str, d: int, shape: Any, extent: int, axes: Sequence[str], mesh: Any) -> None:
    """Dim ``d`` (``extent`` long) must split evenly over the product of ``axes``."""
    k = 1
    for a in axes:
        k *= mesh.shape[a]
    if extent % k:
        raise SpecError(f"{what}: dim {d} of {shape} does not divide over axis {'/'.join(axes)} ({k})")
