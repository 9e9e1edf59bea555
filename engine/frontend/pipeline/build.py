"""Build a :class:`Pipeline`: trace the baseline and every stage, record the transfers, compose.

Each stage is traced like a traced-rank program (placeholders for weights and inputs), with
``torch.distributed``'s point-to-point calls replaced for the trace: a receive fills the user's
buffer from a fresh placeholder (a parameter of the stage program, the receiving end of an
edge); a send records the tensor, which becomes an output of the stage program (the sending
end). Every call is recorded in program order with its peer, whether it blocks, the shape and
the user's line, so the composer can match sends to receives per channel (FIFO, as NCCL and
gloo do), detect deadlocks and name both ends of every error. Peers are the ranks the code
names: with one rank per stage (TP 1) rank k runs stage k, and torch.distributed is started as
rank k of the stages on the torchdist front end's backend, so library schedules
(torch.distributed.pipelining, megatron-core) find their rank, world and groups; objects they
exchange with ``send_object_list`` / ``recv_object_list`` (shape inference) are carried between
the stages' traces.

Not modelled (said so, not guessed): ``Work.wait()`` (a non-blocking receive's buffer is taken
to hold the received value from the call on, so reading it before ``wait`` is not a finding),
a transfer's process group (peers are global ranks; with TP 1 every group's ranks are stages),
and tensor parallelism inside a library-scheduled stage.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import yaml

from ...pipeline.compose import PipelineError, compose
from .. import build as common
from .. import capture
from . import Pipeline

_HERE = str(Path(__file__).resolve().parent)


@functools.lru_cache(maxsize=4096)
def _real(path: str) -> str:
    return os.path.realpath(path)


class _Work:
    """What ``isend``/``irecv`` return: the transfer is already in the program."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _P2POp:
    """``dist.P2POp`` without a process group (the real one asks the default group)."""

    def __init__(self, op: Any, tensor: Any, peer: int | None = None, group: Any = None, tag: int = 0, group_peer: int | None = None) -> None:
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer if peer is not None else group_peer, tag


class _Waiting(Exception):
    """A stage's trace waits for an object a stage not yet traced sends."""


class _Recorder:
    def __init__(self, stage: int, stages: int, root: Path, mailbox: dict[tuple[int, int], list[Any]] | None = None) -> None:
        self.stage, self.stages, self.root = stage, stages, root
        # Objects sent with send_object_list, per (src, dst), shared by every stage's recorder:
        # the stages are traced in order, so what stage k sends to a later stage is here when
        # that stage receives it (torch.distributed.pipelining's runtime shape inference sends
        # each stage's output shapes forward this way).
        self.mailbox = mailbox if mailbox is not None else {}
        self.objects_sent: dict[int, int] = {}
        self.objects_received: dict[int, int] = {}
        self.ops: list[dict[str, Any]] = []
        self.sent: list[Any] = []
        self.received: list[tuple[Any, dict[str, Any]]] = []

    def _where(self) -> str:
        """The user's line of a transfer: the innermost frame in the repository (a library's
        schedule, Megatron's p2p_communication, is called from the user's line), else the
        innermost frame outside torch and this package."""
        f = sys._getframe(1)
        outside: str | None = None
        root = _real(str(self.root)) + os.sep
        while f is not None:
            name = f.f_code.co_filename
            # realpath: this package may be reached through a symlink (a linked checkout).
            real = _real(name)
            if not real.startswith(_HERE) and "/torch/" not in name:
                at = f"{capture.portable_path(name, self.root)}:{f.f_lineno}"
                if real.startswith(root) and "/site-packages/" not in real:
                    return at
                outside = outside or at
            f = f.f_back
        return outside or "<unknown line>"

    def _peer(self, peer: Any, what: str, at: str) -> int:
        if not isinstance(peer, int) or not 0 <= peer < self.stages:
            raise common.DeclarationError(f"stage {self.stage}: {what} at {at} names peer {peer!r}; expected a stage rank 0..{self.stages - 1}")
        if peer == self.stage:
            raise common.DeclarationError(f"stage {self.stage}: {what} at {at} names its own rank as the peer")
        return peer

    def send(self, tensor: Any, peer: Any, blocking: bool, at: str) -> None:
        peer = self._peer(peer, "send", at)
        self.ops.append({"op": "send", "peer": peer, "blocking": blocking, "shape": _shape(tensor), "at": at, "output": len(self.sent)})
        self.sent.append(tensor.clone())  # a snapshot: the buffer may be reused afterwards

    def recv(self, tensor: Any, peer: Any, blocking: bool, at: str) -> None:
        peer = self._peer(peer, "recv", at)
        import torch

        ph = capture.placeholder(tuple(tensor.shape), tensor.dtype)
        # The transport writes the buffer outside autograd (torch.distributed.pipelining's
        # receive buffers are leaves that require grad: the gradient sent back is theirs).
        with torch.no_grad():
            tensor.copy_(ph)
        op = {"op": "recv", "peer": peer, "blocking": blocking, "shape": _shape(tensor), "at": at}
        self.ops.append(op)
        self.received.append((ph, op))

    @contextmanager
    def patched(self) -> Iterator[None]:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        rec = self

        def send(tensor: Any, dst: Any = None, group: Any = None, tag: int = 0, group_dst: Any = None) -> None:
            rec.send(tensor, dst if dst is not None else group_dst, True, rec._where())

        def recv(tensor: Any, src: Any = None, group: Any = None, tag: int = 0, group_src: Any = None) -> int:
            rec.recv(tensor, src if src is not None else group_src, True, rec._where())
            return int(src if src is not None else group_src)

        def isend(tensor: Any, dst: Any = None, group: Any = None, tag: int = 0, group_dst: Any = None) -> _Work:
            rec.send(tensor, dst if dst is not None else group_dst, False, rec._where())
            return _Work()

        def irecv(tensor: Any, src: Any = None, group: Any = None, tag: int = 0, group_src: Any = None) -> _Work:
            rec.recv(tensor, src if src is not None else group_src, False, rec._where())
            return _Work()

        def batch_isend_irecv(p2p_op_list: list[Any]) -> list[_Work]:
            at = rec._where()
            for op in p2p_op_list:
                kind = getattr(op.op, "__name__", "")
                if kind == "isend":
                    rec.send(op.tensor, op.peer, False, at)
                elif kind == "irecv":
                    rec.recv(op.tensor, op.peer, False, at)
                else:
                    raise common.DeclarationError(f"stage {rec.stage}: batch_isend_irecv at {at}: a P2POp of {kind or op.op!r}; expected dist.isend or dist.irecv")
            return [_Work() for _ in p2p_op_list]

        def send_object_list(object_list: list[Any], dst: Any = None, group: Any = None, device: Any = None, group_dst: Any = None, use_batch: bool = False) -> None:
            at = rec._where()
            peer = rec._peer(dst if dst is not None else group_dst, "send_object_list", at)
            box = rec.mailbox.setdefault((rec.stage, peer), [])
            n = rec.objects_sent[peer] = rec.objects_sent.get(peer, 0) + 1
            # The n-th object on the channel; a stage traced again writes the same object again.
            box[n - 1 :] = [list(object_list), *box[n:]]

        def recv_object_list(object_list: list[Any], src: Any = None, group: Any = None, device: Any = None, group_src: Any = None, use_batch: bool = False) -> int:
            at = rec._where()
            peer = rec._peer(src if src is not None else group_src, "recv_object_list", at)
            box = rec.mailbox.get((peer, rec.stage), [])
            n = rec.objects_received[peer] = rec.objects_received.get(peer, 0) + 1
            if len(box) < n:
                raise _Waiting(f"stage {rec.stage} waits in recv_object_list at {at} for object #{n} from stage {peer}, which sends {len(box)}")
            got = box[n - 1]
            if len(got) != len(object_list):
                raise common.DeclarationError(f"stage {rec.stage}: recv_object_list at {at} receives {len(object_list)} object(s), stage {peer} sent {len(got)}")
            object_list[:] = got
            return peer

        fns = {"send": send, "recv": recv, "isend": isend, "irecv": irecv, "batch_isend_irecv": batch_isend_irecv, "P2POp": _P2POp, "send_object_list": send_object_list, "recv_object_list": recv_object_list}
        saved = [(mod, k, getattr(mod, k)) for mod in (dist, c10d) for k in fns]
        for mod, k, _ in saved:
            setattr(mod, k, fns[k])
        try:
            with _pipelining_handshake_off():
                yield
        finally:
            for mod, k, v in saved:
                setattr(mod, k, v)

    def wrap(self, program: Any) -> Any:
        """The stage program returning its results followed by every tensor it sent."""
        import torch.nn as nn

        def results(out: Any) -> tuple[Any, ...]:
            self.results = common._flatten(out, f"stage {self.stage}") if out is not None else []
            return (*self.results, *self.sent)

        if isinstance(program, nn.Module):
            forward = program.forward
            # An instance attribute: nn.Module.__call__ (and functional_call) call self.forward.
            program.forward = lambda *a, **kw: results(forward(*a, **kw))
            return program
        if callable(program):
            return lambda *a: results(program(*a))
        raise common.DeclarationError(f"stage {self.stage} is {type(program).__name__}; expected an nn.Module or a callable")


@contextmanager
def _pipelining_handshake_off() -> Iterator[None]:
    """torch.distributed.pipelining's first step posts a handshake with each neighbour (a
    non-blocking batch that sends the stage index, a 0-d int64, into a ``zeros(1)`` float
    buffer nobody reads) only to create the NCCL communicators. It carries no value the
    program uses and, all non-blocking in one batch, cannot deadlock; matched like a data
    transfer it would read as a shape mismatch and shift every later transfer's microbatch
    number. It is left out of the recorded schedule while a stage is traced."""
    stage_mod = sys.modules.get("torch.distributed.pipelining.stage")
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None:
        yield
        return
    saved = base._get_init_p2p_neighbors_ops
    base._get_init_p2p_neighbors_ops = lambda self: []
    try:
        yield
    finally:
        base._get_init_p2p_neighbors_ops = saved


def _cuda_shims() -> Any:
    """Megatron's schedules allocate their buffers on ``"cuda"`` / ``torch.cuda.current_device()``
    and its attention forks the CUDA RNG tracker: with megatron-core loaded, the baseline and
    every stage are traced under the torchdist front end's shims (as an int-rank Megatron
    model is)."""
    if "megatron.core" not in sys.modules:
        return nullcontext()
    from ..torchdist import shims

    shims.setup_megatron_rng()  # attention's dropout forks Megatron's CUDA RNG tracker
    return shims.cuda_as_xla()


def _start_dist(rank: int, world: int) -> None:
    from ..torchdist import backend

    backend.start(rank, world)


def _shape(t: Any) -> str:
    return common._shape_text(common._type_name(t.dtype), tuple(t.shape))


def _check(decl: Pipeline, request: common.BuildRequest) -> None:
    if not isinstance(decl.stages, int) or decl.stages < 2:
        raise common.DeclarationError(f"Pipeline.stages: expected an integer >= 2, got {decl.stages!r}", "entry")
    if len(request.groups) != 1:
        raise common.DeclarationError(f"a pipeline's stage is one tensor-parallel group (tp: N); got groups {request.groups}", "tp")
    names = [i.name for i in decl.inputs]
    if not all(isinstance(i, common.Input) for i in decl.inputs) or len(set(names)) != len(names):
        raise common.DeclarationError(f"Pipeline.inputs: expected Input(...) values with unique names, got {list(decl.inputs)!r}", "entry")
    if any(i.shard is not None for i in decl.inputs):
        raise common.DeclarationError("Pipeline.inputs: a sharded input (shard=d) is not supported in a pipeline yet; every stage reads the whole input", "entry")
    if not callable(decl.stage):
        raise common.DeclarationError("Pipeline.stage: expected a function of the stage rank returning its module or callable", "entry")


def build(request: common.BuildRequest, decl: Pipeline, ctx: Any, timings: dict[str, float]) -> dict[str, Any]:
    _check(decl, request)
    root = Path(request.root)
    exclude = [*common.hidden_files(root, request.hide_frames), *(str(p) for p in Path(_HERE).glob("*.py"))]
    try:
        plan = common.Plan.parse(dict(decl.plan))
    except common.PlanError as e:
        raise common.DeclarationError(str(e), "entry") from e
    c = request.c
    relations: dict[str, Any] = {}
    folder = Path(request.out_dir)
    folder.mkdir(parents=True, exist_ok=True)

    t = time.perf_counter()
    base_inputs = {i.name: capture.placeholder(tuple(i.shape), common._dtype(i.dtype)) for i in decl.inputs}
    with _cuda_shims():
        base = common._trace(decl.baseline, base_inputs, "baseline", root, exclude, request.source_packages, plan)
    timings["baseline"] = time.perf_counter() - t

    t = time.perf_counter()
    sides: list[Any] = []
    recorders: list[_Recorder] = []
    stage_specs: list[dict[str, Any]] = []
    mailbox: dict[tuple[int, int], list[Any]] = {}
    traced: dict[int, tuple[Any, _Recorder, dict[str, Any]]] = {}
    pending = list(range(decl.stages))
    while pending:
        # Stages are traced in rank order; one that waits for an object a later rank sends
        # (an interleaved schedule's rank 0 needs stage pp-1's output shapes for its stage pp)
        # is traced again once the others have run.
        waiting: dict[int, str] = {}
        before = sum(len(box) for box in mailbox.values())
        for k in pending:
            if len(request.groups[0]) == 1:
                # One rank per stage: torch.distributed runs as rank k of the stages (the
                # schedules of torch.distributed.pipelining and Megatron ask for the rank and
                # world size); point-to-point calls are recorded by the patches, never sent.
                _start_dist(k, decl.stages)
            with common.meta_device():
                program = decl.stage(k)
            rec = _Recorder(k, decl.stages, root, mailbox)
            inputs = {i.name: capture.placeholder(tuple(i.shape), common._dtype(i.dtype)) for i in decl.inputs}
            try:
                with rec.patched(), _cuda_shims():
                    side = common._trace(rec.wrap(program), inputs, f"stage {k}", root, exclude, request.source_packages, plan)
            except _Waiting as w:
                waiting[k] = str(w)
                continue
            traced[k] = (side, rec, inputs)
        if len(waiting) == len(pending) and sum(len(box) for box in mailbox.values()) == before:
            raise common.DeclarationError("the stages' object exchange (send_object_list / recv_object_list) deadlocks: " + "; ".join(waiting.values()), "entry")
        pending = sorted(waiting)
    for k in range(decl.stages):
        side, rec, inputs = traced[k]
        params: list[dict[str, Any]] = []
        known: set[int] = set()
        for name, ph in inputs.items():
            if (n := common._number(side, ph)) is not None:
                params.append({"parameter": n, "kind": "input", "name": name})
                known.add(n)
        for name, ph in side.params.items():
            if (n := common._number(side, ph)) is not None:
                if name not in base.params:
                    raise common.DeclarationError(f"stage {k} reads parameter {name!r}, which the baseline does not have; a stage holds some of the baseline's layers under the baseline's names", "entry")
                try:
                    relations[name] = common.relation_for(plan, name, common._module_kind(decl.baseline, name), tuple(base.params[name].shape), tuple(ph.shape), c)
                except common.PlanError as e:
                    raise common.DeclarationError(f"stage {k}: {e}", "entry") from e
                params.append({"parameter": n, "kind": "weight", "name": name})
                known.add(n)
        for ph, op in rec.received:
            if (n := common._number(side, ph)) is not None:
                op["parameter"] = n
                params.append({"parameter": n, "kind": "recv", "name": f"recv from stage {op['peer']} at {op['at']}"})
                known.add(n)
        for n in sorted(set(side.captured.parameter_shapes) - known):
            if common._is_collective_token(side, n):
                params.append({"parameter": n, "kind": "token", "name": "token"})
                continue
            raise common.DeclarationError(f"stage {k}'s program has parameter {n} that is no input, weight or receive: {common._describe_parameter(side, n)}")
        results = len(rec.results)
        for op in rec.ops:
            if op["op"] == "send":
                op["output"] += results
        common._annotate_modules(side)
        (folder / f"stage{k}.hlo").write_text(side.captured.hlo_text)
        (folder / f"stage{k}.sourcemap.json").write_text(capture.dump_sourcemap(side.captured.sourcemap))
        stage_specs.append({"stage": k, "program": f"stage{k}.hlo", "sourcemap": f"stage{k}.sourcemap.json", "parameters": params, "results": list(range(results))})
        sides.append(side)
        recorders.append(rec)
    timings["stages"] = time.perf_counter() - t
    unread_knobs = [k for k in ctx.unread_knobs() if k in request.own_size]
    if unread_knobs:
        raise common.DeclarationError(f"size knob(s) {', '.join(unread_knobs)} are never read by {request.entry}", f"size.{unread_knobs[0]}")

    # Edges: the k-th send on channel s -> d meets the k-th receive on it (the k-th microbatch
    # of a GPipe loop); unmatched ends are reported by the composer with both lines.
    sends: dict[tuple[int, int], list[dict[str, Any]]] = {}
    recvs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for rec in recorders:
        for op in rec.ops:
            ch = (rec.stage, op["peer"]) if op["op"] == "send" else (op["peer"], rec.stage)
            (sends if op["op"] == "send" else recvs).setdefault(ch, []).append(op)
    edges = []
    for ch, ss in sorted(sends.items()):
        for i, (s, r) in enumerate(zip(ss, recvs.get(ch, []), strict=False)):
            if "parameter" in r:
                edges.append({"src": ch[0], "output": s["output"], "dst": ch[1], "parameter": r["parameter"], "microbatch": i, "send_at": s["at"], "recv_at": r["at"]})
    schedule = {rec.stage: [{k: v for k, v in op.items() if k in ("op", "peer", "blocking", "shape", "at")} for op in rec.ops] for rec in recorders}
    spec = {"version": 1, "stages": stage_specs, "edges": edges, "schedule": schedule}
    (folder / "pipeline.yaml").write_text("# Generated by shardproof build: stage programs, transfer edges and each stage's point-to-point calls in program order.\n" + yaml.safe_dump(spec, sort_keys=False, width=200))

    t = time.perf_counter()
    from ...hlo.parser import parse_hlo

    base_mod = parse_hlo(base.captured.hlo_text, "baseline.hlo")
    shapes = {p.parameter_number: p.shape for p in base_mod.entry.parameters}
    read = {(p["kind"], p["name"]) for st in stage_specs for p in st["parameters"]}
    unread = tuple(
        (kind, name, shapes[n])
        for kind, table in (("input", base.inputs), ("weight", base.params))
        for name, t in table.items()
        if (kind, name) not in read and (n := common._number(base, t)) is not None
    )
    if unread:
        # Baseline parameters no stage reads (a layer no stage runs): kept in the artifact so
        # `shardproof compose` rebuilds the same program from the files alone.
        spec["unread"] = [{"kind": kind, "name": name, "baseline_parameter": common._number(base, base.inputs[name] if kind == "input" else base.params[name])} for kind, name, _ in unread]
        (folder / "pipeline.yaml").write_text("# Generated by shardproof build: stage programs, transfer edges and each stage's point-to-point calls in program order.\n" + yaml.safe_dump(spec, sort_keys=False, width=200))
    try:
        composed = compose(json.loads(json.dumps(spec)), {k: parse_hlo(s.captured.hlo_text, f"stage{k}.hlo") for k, s in enumerate(sides)}, {k: json.loads(capture.dump_sourcemap(s.captured.sourcemap)) for k, s in enumerate(sides)}, "pipeline.yaml", unread)
    except PipelineError as e:
        raise common.DeclarationError(f"the pipeline cannot run: {e.message}", "entry") from e
    timings["compose"] = time.perf_counter() - t
    common._annotate_modules(base)
    (folder / "baseline.hlo").write_text(base.captured.hlo_text)
    (folder / "baseline.sourcemap.json").write_text(capture.dump_sourcemap(base.captured.sourcemap))
    (folder / "distributed.hlo").write_text(composed.text)
    (folder / "sourcemap.json").write_text(json.dumps(composed.sourcemap, indent=1) + "\n")
    (folder / "relations.yaml").write_text(_relations(request, decl, base, composed, relations))
    return {
        # Facts for the reader of a diverged pipeline, not verdicts: a weight no stage reads is a
        # layer no stage runs; one several stages read may be a repeated layer (or a tied weight).
        "pipeline": {
            "stages": decl.stages,
            "edges": len(edges),
            "transfers": sum(len(r.ops) for r in recorders) // 2,
            "unread": [name for kind, name, _ in unread if kind == "weight"],
            "read_by_several_stages": {name: ks for name in base.params if len(ks := [st["stage"] for st in stage_specs if any(p["kind"] == "weight" and p["name"] == name for p in st["parameters"])]) > 1},
        },
        "parameters": {"baseline": len(base.captured.parameter_shapes), "distributed": len(composed.parameters)},
        "sharded_parameters": 0,
        "outputs": base.outputs,
        "hlo_bytes": {"baseline": (folder / "baseline.hlo").stat().st_size, "distributed": len(composed.text)},
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }


def _relations(request: common.BuildRequest, decl: Pipeline, base: Any, composed: Any, weights: dict[str, Any]) -> str:
    """Inputs are whole on every rank; weights as the plan says (whole with one rank per
    stage); results are expected as declared (default: equal to the baseline's outputs)."""
    lines = [common._HEADER, f"# pipeline {request.name}: {request.entry}" + (f" variant={request.variant}" if request.variant else "") + f", {decl.stages} stages composed\n", f"groups: {json.dumps(request.groups)}\n", "inputs:\n"]
    by_input = {i.name: i for i in decl.inputs}
    for d, (kind, name) in enumerate(composed.parameters):
        if kind == "token":
            lines.append(f"  - {{distributed: {d}, relation: token}}  # torch-xla's collective token; 0 at program start\n")
            continue
        b = common._number(base, base.inputs[name] if kind == "input" else base.params[name])
        if b is None:
            raise common.DeclarationError(f"the stages read {kind} {name!r}, which the baseline never reads; the two programs must compute the same function", "entry")
        rel = weights.get(name) if kind == "weight" else None
        fields = [f"baseline: {b}", f"distributed: {d}"]
        if rel is None or rel.relation == "duplicate":
            fields.append("relation: duplicate")
        elif rel.relation == "sharded":
            fields += ["relation: sharded", f"dim: {rel.dim}"] + ([f"blocks: {json.dumps(list(rel.blocks))}"] if rel.blocks else [])
        else:
            raise common.DeclarationError(f"weight {name!r}: {rel.describe()} is not supported in a pipeline stage yet", "entry")
        spec = by_input.get(name) if kind == "input" else None
        if spec is not None and spec.int_range is not None:
            fields.append(f"int_range: {json.dumps(list(spec.int_range))}")
        lines.append(f"  - {{{', '.join(fields)}}}  # {kind} {name}\n")
    specs = list(decl.outputs) if decl.outputs is not None else ["replicate"] * base.outputs
    if len(specs) != base.outputs or len(composed.outputs) != base.outputs:
        raise common.DeclarationError(f"the baseline returns {base.outputs} output(s), the stages {len(composed.outputs)} result(s) (outputs lists {len(specs)})", "outputs")
    lines.append("outputs:\n")
    for i, spec in enumerate(specs):
        rel = common._output_relation(spec, i, weights, "Pipeline.outputs")
        fields = [f"baseline: {i}", f"distributed: {i}"] + [f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in rel.items()]
        lines.append(f"  - {{{', '.join(fields)}}}  # stage {composed.outputs[i][0]} result {composed.outputs[i][1]}\n")
    return "".join(lines)
