"""A JAX shard_map pipeline split per rank and composed along its permutes.

A GPipe written in shard_map is one SPMD program in which every rank chooses its part with
``axis_index``: ``where(axis_index("pp") == 0, next_microbatch, received)``. No SPMD relation
says "rank 0 holds microbatch t, rank 1 holds layer 0's output of microbatch t-1", so the
pipeline is checked the way the torch stages are: per rank, composed along the transfers.

:class:`JaxPipeline` wraps a ``JaxModel`` whose ``distributed`` is a ``shard_map`` and names its
stage axis. :func:`composed` interprets the shard_map's body once per rank, all ranks in step
(SPMD: every rank runs the same equations), inside one ``jax.jit`` trace of the global
arguments:

- rank r's arguments are its blocks of the global ones (a literal slice per split dim);
- ``axis_index`` of the stage axis is the Python int r, and an equation whose inputs are all
  known values is evaluated while tracing (``ensure_compile_time_eval``), so the rank's choices
  are made here and only its chosen branch stays in the program;
- ``ppermute`` is wiring: rank d's result is the source rank's operand, or zeros where no
  pair targets d (XLA's collective-permute semantics);
- ``psum`` over the stage axis is the sum of the group's operands in rank order; an operand
  known to be all zeros (a masked-out rank) adds nothing and is left out;
- calls (``pjit``, ``closed_call``, ``custom_jvp_call``'s primal) are interpreted inline, so a
  choice made inside ``jnp.where`` is made too.

The result is one single-device program: every rank's dataflow, joined where the permutes join
it — the composition of the per-rank programs. A replicated output is returned once per rank
(each must equal the baseline); an output split over the stage axis is the concatenation of the
ranks' blocks. With more mesh axes (PP x TP; the stage axis first) the composed function runs
inside a ``shard_map`` over the other axes, whose collectives stay the SPMD collectives they
are (:func:`spmd_model`). Other collectives over the stage axis (or over it with others) are
refused with the equation named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class JaxPipeline:
    """``model``: a ``JaxModel`` whose distributed function is a ``shard_map`` over a mesh
    with the one axis ``axis``; checked per rank, composed along its permutes."""

    model: Any
    axis: str = "pp"


class SplitError(ValueError):
    pass


def _names(spec: Any) -> dict[int, tuple[str, ...]]:
    """``{dim: mesh axes}`` of a shard_map in/out spec in either of JAX's spellings."""
    if isinstance(spec, dict):
        return {int(d): tuple(a) if isinstance(a, (tuple, list)) else (a,) for d, a in spec.items()}
    out: dict[int, tuple[str, ...]] = {}
    for d, entry in enumerate(tuple(spec)):
        if entry is None:
            continue
        out[d] = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
    return out


def _is_zero(value: Any) -> bool:
    import jax
    import numpy as np

    if isinstance(value, jax.core.Tracer):
        return False
    try:
        return bool(np.all(np.asarray(value) == 0))
    except Exception:
        return False


class _Block:
    """Rank r's block of a global argument, not yet cut: a ``slice`` of it in the body becomes
    one slice of the global argument (a slice of a slice has no rule, and the baseline slices
    the global argument once: ``w[s, j]`` against the rank's ``w_local[0, j]``)."""

    def __init__(self, value: Any, starts: tuple[int, ...], limits: tuple[int, ...]) -> None:
        self.value, self.starts, self.limits = value, starts, limits
        self._cut: Any = None

    def cut(self) -> Any:
        from jax import lax

        if self._cut is None:
            whole = self.starts == (0,) * len(self.starts) and self.limits == tuple(self.value.shape)
            self._cut = self.value if whole else lax.slice(self.value, self.starts, self.limits)
        return self._cut

    def slice(self, starts: Sequence[int], limits: Sequence[int]) -> _Block:
        base = self.starts
        return _Block(self.value, tuple(b + int(s) for b, s in zip(base, starts, strict=True)), tuple(b + int(lim) for b, lim in zip(base, limits, strict=True)))


def _cut(value: Any) -> Any:
    return value.cut() if isinstance(value, _Block) else value


class _Ranks:
    def __init__(self, axis: str, size: int) -> None:
        self.axis, self.size = axis, size

    def run(self, jaxpr: Any, consts: Sequence[Any], args: list[list[Any]]) -> list[list[Any]]:
        """``args[i][r]``: rank r's value of input i; returns ``outs[j][r]``."""
        from jax._src import core
        from jax._src import source_info_util as siu

        env: dict[Any, list[Any]] = {}

        def read(v: Any) -> list[Any]:
            return [_host(v.val)] * self.size if isinstance(v, core.Literal) else env[v]

        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = [_host(c)] * self.size
        for v, a in zip(jaxpr.invars, args, strict=True):
            env[v] = a
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if eqn.primitive.name == "slice" and not eqn.params.get("strides") and isinstance(invals[0][0], _Block):
                env[eqn.outvars[0]] = [b.slice(eqn.params["start_indices"], eqn.params["limit_indices"]) for b in invals[0]]
                continue
            invals = [[_cut(v) for v in vals] for vals in invals]
            with siu.user_context(eqn.source_info.traceback, name_stack=siu.current_name_stack() + eqn.source_info.name_stack):
                outs = self.eqn(eqn, invals)
            for v, vals in zip(eqn.outvars, outs, strict=True):
                env[v] = vals
        return [[_cut(v) for v in read(v)] for v in jaxpr.outvars]

    def eqn(self, eqn: Any, invals: list[list[Any]]) -> list[list[Any]]:
        import jax.numpy as jnp

        name = eqn.primitive.name
        params = eqn.params
        where = f"{name} at {_line(eqn)}"
        axes = _axes(params)
        if axes and self.axis not in axes:
            # A collective of another mesh axis (tensor parallelism inside a stage): it stays
            # the SPMD collective it is, in the shard_map over the other axes (see composed).
            return self.each(eqn, invals)
        if axes and axes != (self.axis,):
            raise SplitError(f"{where}: a collective over {axes}, the stage axis {self.axis!r} with others, has no per-rank form here yet")
        if name == "axis_index":
            return [list(range(self.size))]
        if name == "ppermute":
            source = {int(d): int(s) for s, d in params["perm"]}
            outs = []
            for k, vals in enumerate(invals):
                aval = eqn.outvars[k].aval
                outs.append([vals[source[r]] if r in source else jnp.zeros(aval.shape, aval.dtype) for r in range(self.size)])
            return outs
        if name in ("psum", "psum_invariant"):
            outs = []
            for vals in invals:
                kept = [v for v in vals if not _is_zero(v)]
                if not kept:
                    total = vals[0]
                else:
                    total = kept[0]
                    for v in kept[1:]:
                        total = total + v
                outs.append([total] * self.size)
            return outs
        if axes or name in ("pmax", "pmin", "all_gather", "all_to_all", "reduce_scatter", "psum_scatter", "pbroadcast"):
            raise SplitError(f"{where}: {name} has no per-rank form here yet")
        sub = params.get("jaxpr") if name in ("jit", "pjit", "closed_call", "core_call", "remat", "checkpoint") else params.get("call_jaxpr") if name in ("custom_jvp_call", "custom_vjp_call") else None
        if sub is not None:
            closed = sub if hasattr(sub, "consts") else None
            inner = closed.jaxpr if closed is not None else sub
            consts = closed.consts if closed is not None else []
            return self.run(inner, consts, invals)
        return self.each(eqn, invals)

    def each(self, eqn: Any, invals: list[list[Any]]) -> list[list[Any]]:
        """The equation on every rank's values (once where they are the same values)."""
        import jax

        name, params = eqn.primitive.name, eqn.params
        outs_per_rank = []
        first = None
        for r in range(self.size):
            args = [vals[r] for vals in invals]
            if r > 0 and all(vals[r] is vals[0] for vals in invals):
                outs_per_rank.append(first)  # the same values on every rank: computed once
                continue
            bind = eqn.primitive.get_bind_params(params)
            for key in ("sharding", "out_sharding"):
                # The shard_map's mesh (stage axis included) is no context here: the result's
                # placement is the enclosing program's default.
                if bind.get(key) is not None:
                    bind[key] = None
            known = not any(isinstance(a, jax.core.Tracer) for a in args)
            if name == "select_n" and not isinstance(args[0], jax.core.Tracer):
                chosen = _chosen(args)
                if chosen is not None:
                    out = chosen
                    outs_per_rank.append([out])
                    first = first or [out]
                    continue
            with jax.ensure_compile_time_eval() if known else _nothing():
                out = eqn.primitive.bind(*args, **bind)
            out = list(out) if eqn.primitive.multiple_results else [out]
            outs_per_rank.append(out)
            if r == 0:
                first = out
        return [[outs_per_rank[r][k] for r in range(self.size)] for k in range(len(eqn.outvars))]


def _host(value: Any) -> Any:
    """A literal or constant of the body as a host value: a jax array there carries the
    shard_map's mesh (stage axis included), which is no context of the composed program."""
    import jax
    import numpy as np

    if isinstance(value, jax.core.Tracer) or not isinstance(value, (jax.Array, np.ndarray)):
        return value
    # A typed literal (an ndarray subclass that carries its aval) or array: its plain values.
    return np.asarray(value)


def _axes(params: dict[str, Any]) -> tuple[str, ...]:
    """The mesh axes a collective (or ``axis_index``) names, ``()`` for other equations."""
    for key in ("axes", "axis_name"):
        if key in params:
            value = params[key]
            names = tuple(value) if isinstance(value, (tuple, list)) else (value,)
            # Reductions name their dims ``axes`` too (ints): only mesh axis names count.
            return tuple(n for n in names if isinstance(n, str))
    return ()


def _chosen(args: list[Any]) -> Any:
    """The case ``select_n(pred, *cases)`` takes when ``pred`` is known and the same everywhere."""
    import numpy as np

    pred = np.asarray(args[0])
    if pred.size == 0:
        return None
    first = pred.flat[0]
    if not np.all(pred == first):
        return None
    case = args[1 + int(first)]
    return case if tuple(np.shape(case)) == tuple(np.shape(args[1])) else None


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _line(eqn: Any) -> str:
    from jax._src import source_info_util as siu

    frame = siu.user_frame(eqn.source_info.traceback)
    return f"{frame.file_name}:{frame.start_line}" if frame is not None else "<unknown line>"


def composed(pipeline: JaxPipeline, global_args: Sequence[Any]) -> Any:
    """A function of the global arguments computing every rank's outputs, composed."""
    import jax

    model = pipeline.model
    mesh = model.mesh
    if tuple(mesh.axis_names)[:1] != (pipeline.axis,):
        raise SplitError(f"the pipeline's mesh has axes {tuple(mesh.axis_names)}; a JaxPipeline splits the mesh's first axis, the stage axis {pipeline.axis!r}")
    size = int(mesh.shape[pipeline.axis])
    closed = jax.make_jaxpr(model.distributed)(*global_args)
    eqns = [e for e in closed.jaxpr.eqns if e.primitive.name == "shard_map"]
    if len(closed.jaxpr.eqns) != 1 or not eqns:
        raise SplitError("JaxPipeline: the distributed function must be one shard_map (found " + ", ".join(e.primitive.name for e in closed.jaxpr.eqns) + ")")
    sm = eqns[0]
    in_names = sm.params.get("in_names") or sm.params.get("in_specs")
    out_names = sm.params.get("out_names") or sm.params.get("out_specs")
    body = sm.params["jaxpr"]
    body_jaxpr = body.jaxpr if hasattr(body, "jaxpr") else body
    body_consts = body.consts if hasattr(body, "consts") else []

    def fn(*args: Any) -> tuple[Any, ...]:
        per_rank: list[list[Any]] = []
        for a, spec in zip(args, in_names, strict=True):
            dims = _names(spec)
            vals: list[Any] = []
            for r in range(size):
                starts, limits = [0] * a.ndim, list(a.shape)
                for d, axes in dims.items():
                    if pipeline.axis not in axes:
                        continue  # split over the other axes: the enclosing shard_map's
                    if axes != (pipeline.axis,):
                        raise SplitError(f"an input dim is split over {axes}; the stage axis {pipeline.axis!r} splits a dim alone")
                    k = a.shape[d] // size
                    starts[d], limits[d] = r * k, (r + 1) * k
                vals.append(_Block(a, tuple(starts), tuple(limits)) if any(pipeline.axis in axes for axes in dims.values()) else a)
            per_rank.append(vals)
        outs = _Ranks(pipeline.axis, size).run(body_jaxpr, body_consts, per_rank)
        results: list[Any] = []
        for vals, spec in zip(outs, out_names, strict=True):
            staged = [d for d, axes in _names(spec).items() if pipeline.axis in axes]
            if not staged:
                results.extend(vals)  # replicated over the stages: every rank's must equal the baseline's
            elif len(staged) == 1 and _names(spec)[staged[0]] == (pipeline.axis,):
                results.append(jax.numpy.concatenate(vals, axis=staged[0]))
            else:
                raise SplitError(f"an output split as {_names(spec)}; only outputs replicated over {pipeline.axis!r} or one dim split over it alone are composed")
        return tuple(results)

    copies = [1 if any(pipeline.axis in axes for axes in _names(s).values()) else size for s in out_names]
    return fn, copies, in_names, out_names


def build(pipeline: JaxPipeline, name: str, out: Any) -> None:
    """Write ``baseline.hlo``, ``distributed.hlo`` (the ranks composed) and ``relations.yaml``:
    every input is the same global value in both programs, and output k of the composed program
    (rank r's copy of a replicated output, or a split output's concatenation) is a duplicate of
    the baseline's output it copies."""
    from pathlib import Path

    import jax
    import yaml

    model = pipeline.model
    inputs = list(model.inputs)
    if not all(hasattr(i, "shape") and hasattr(i, "name") for i in inputs):
        raise SplitError(f"{name}: a JaxPipeline's inputs are JaxInput values (one array each)")
    args = [jax.ShapeDtypeStruct(tuple(i.shape), i.dtype) for i in inputs]
    fn, copies, _, _ = composed(pipeline, args)

    def baseline(*a: Any) -> tuple[Any, ...]:
        flat = jax.tree_util.tree_leaves(model.baseline(*a))
        if len(flat) != len(copies):
            raise SplitError(f"{name}: the baseline returns {len(flat)} output(s), the shard_map {len(copies)}")
        return tuple(o for o, n in zip(flat, copies, strict=True) for _ in range(n))

    base = jax.jit(baseline, keep_unused=True).lower(*args)
    dist = jax.jit(fn, keep_unused=True).lower(*args)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    # With metadata: the source map is read from each instruction's recorded frames.
    (folder / "baseline.hlo").write_text(base.as_text(dialect="hlo", debug_info=True))
    (folder / "distributed.hlo").write_text(dist.as_text(dialect="hlo", debug_info=True))
    relations = {
        "groups": [[0]],
        "inputs": [{"baseline": k, "distributed": k, "relation": "duplicate", "name": i.name, **({"int_range": list(i.int_range)} if i.int_range else {})} for k, i in enumerate(inputs)],
        "outputs": [{"baseline": k, "distributed": k, "relation": "duplicate"} for k in range(sum(copies))],
    }
    (folder / "relations.yaml").write_text(f"# {name}: the shard_map over {pipeline.axis!r} split per rank and composed along its permutes\n" + yaml.safe_dump(relations, sort_keys=False, default_flow_style=None))


def spmd_model(pipeline: JaxPipeline) -> Any:
    """PP x other axes (tensor parallelism inside a stage): the stages composed as above inside
    one ``shard_map`` over the mesh's other axes, whose collectives stay SPMD collectives; the
    result is an ordinary ``JaxModel`` over the sub-mesh of those axes (the devices of stage
    0's group: which devices changes no value), checked as every SPMD model is."""
    import dataclasses

    import jax
    from jax import shard_map
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from ..jax.declare import JaxModel

    model = pipeline.model
    inputs = list(model.inputs)
    args = [jax.ShapeDtypeStruct(tuple(i.shape), i.dtype) for i in inputs]
    fn, copies, in_names, out_names = composed(pipeline, args)
    sub = Mesh(model.mesh.devices[0], tuple(model.mesh.axis_names[1:]))

    def without_stage(names: Any, ndim: int) -> tuple[Any, ...]:
        dims = _names(names)
        return tuple((dims[d][0] if len(dims[d]) == 1 else dims[d]) if d in dims and pipeline.axis not in dims[d] else None for d in range(ndim))

    in_specs = tuple(P(*without_stage(n, len(i.shape))) for n, i in zip(in_names, inputs, strict=True))
    outs = jax.eval_shape(model.distributed, *args)
    out_avals = jax.tree_util.tree_leaves(outs)
    out_specs = [without_stage(n, len(a.shape)) for n, a, c in zip(out_names, out_avals, copies, strict=True) for _ in range(c)]
    dist = shard_map(fn, mesh=sub, in_specs=in_specs, out_specs=tuple(P(*o) for o in out_specs), check_vma=False)

    def baseline(*a: Any) -> tuple[Any, ...]:
        flat = jax.tree_util.tree_leaves(model.baseline(*a))
        return tuple(o for o, n in zip(flat, copies, strict=True) for _ in range(n))

    staged_inputs = [dataclasses.replace(i, spec=tuple(spec)) for i, spec in zip(inputs, in_specs, strict=True)]
    return JaxModel(baseline, dist, sub, staged_inputs, outputs=out_specs, description=model.description)
