"""Per-rank builds of an int-rank model, lifted into one SPMD program (``rank: int``).

The model's build child loads the entry point (the user's module, Megatron already imported by
the worker) and forks one child per rank, in order; none of them has touched the XLA device
before the fork. Rank 0's child traces the baseline too, in a world of one rank, then restarts
``torch.distributed`` for the model's world and traces its own program; it writes the
relations as the traced-rank build does. Every other rank's child writes only its HLO text.
The build child then lifts the texts (``lift.py``) into ``distributed.hlo``. A crash of a rank
(SIGSEGV in a lowering) comes back as a located error naming the rank and its last output.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import build as common
from .. import capture
from ..dtensor import plan_frames
from ..dtensor.host import declaring, traced_inputs
from . import backend, shims
from .lift import lift, source_reader


def _hidden(request: common.BuildRequest) -> list[str]:
    here = Path(__file__).resolve().parent
    return common.hidden_files(Path(request.root), request.hide_frames) + [str(p) for p in here.glob("*.py")]


def _declare(request: common.BuildRequest, fn: Any, rank: int, world: int) -> Any:

    backend.start(rank, world)
    shims.setup_megatron_rng()
    shims.host_deepspeed()
    ctx = common.BuildContext(request.name, request.c, request.groups, request.variant, request.size)
    try:
        with common.meta_device(), shims.cuda_as_xla(meta=True), declaring(world, request.groups):
            decl = common._check_model(fn(ctx))
    except common.KnobError as e:
        raise common.DeclarationError(str(e), f"size.{e.key}") from e
    return decl, ctx


def _trace(program: Any, inputs: dict[str, Any], where: str, request: common.BuildRequest, plan: common.Plan) -> common.Side:
    with shims.cuda_as_xla():
        side = common._trace(program, inputs, where, Path(request.root), _hidden(request), packages=request.source_packages, plan=plan)
    # Collectives the backend could only lower as calls (all-to-all) become the ops themselves.
    side.captured.hlo_text = backend.inline_collectives(side.captured.hlo_text, side.captured.sourcemap)
    return side


def _plan(decl: Any) -> common.Plan:
    try:
        return common.Plan.parse(decl.plan)
    except common.PlanError as e:
        raise common.DeclarationError(str(e), "entry") from e


def _rank_child(request: common.BuildRequest, fn: Any, rank: int, world: int, folder: Path) -> dict[str, Any]:
    """Runs in rank ``rank``'s child: trace (and for rank 0 the baseline and relations)."""

    timings: dict[str, float] = {}
    c = request.c
    t = time.perf_counter()
    if rank == 0:
        decl, ctx = _declare(request, fn, 0, 1)
        plan = _plan(decl)
        inputs = {i.name: capture.placeholder(tuple(i.shape), common._dtype(i.dtype)) for i in decl.inputs}
        base = _trace(decl.baseline, inputs, "baseline", request, plan)
        timings["baseline"] = time.perf_counter() - t
        t = time.perf_counter()
        backend.start(0, world)
    else:
        decl, ctx = _declare(request, fn, rank, world)
        plan = _plan(decl)
    with common.meta_device(), shims.cuda_as_xla(meta=True), declaring(world, request.groups):
        program = decl.distributed(rank)

    def trace(specs: list[Any]) -> common.Side:
        inputs = {i.name: capture.placeholder(common._local_shape(i, c), common._dtype(i.dtype)) for i in specs}
        return _trace(program, inputs, "distributed", request, plan)

    # DTensor's from_local of an input is checked against its declaration (without a plan, an
    # input declared without shard= takes its relation from the placement).
    decl.inputs, dist = traced_inputs(decl.inputs, not decl.plan, request.groups, trace)
    timings["distributed"] = time.perf_counter() - t
    (folder / f"rank{rank}.hlo").write_text(dist.captured.hlo_text)
    out: dict[str, Any] = {"timings": timings}
    if rank == 0:
        common._annotate_modules(base)
        common._annotate_modules(dist)
        plan_frames.add_plan_frames(program, dist.captured.sourcemap, dist.captured.hlo_text, plan_frames.repository_files(Path(request.root), _hidden(request), request.source_packages))
        (folder / "baseline.hlo").write_text(base.captured.hlo_text)
        (folder / "sourcemap.json").write_text(capture.dump_sourcemap(dist.captured.sourcemap))
        (folder / "baseline.sourcemap.json").write_text(capture.dump_sourcemap(base.captured.sourcemap))
        relations, params = common._relations(request, decl, plan, base, dist, None)
        (folder / "relations.yaml").write_text(relations)
        out["summary"] = {
            "parameters": {"baseline": len(base.captured.parameter_shapes), "distributed": len(dist.captured.parameter_shapes)},
            "sharded_parameters": sum(1 for r in params.values() if r.relation == "sharded"),
            "outputs": base.outputs,
        }
        unread = [k for k in ctx.unread_knobs() if k in request.own_size]
        if unread:
            raise common.DeclarationError(f"size knob(s) {', '.join(unread)} are never read by {request.entry}", f"size.{unread[0]}")
    return out


def _fork_rank(request: common.BuildRequest, fn: Any, rank: int, world: int, folder: Path) -> dict[str, Any]:
    result = folder / f"rank{rank}.json"
    log = folder / f"rank{rank}.log"
    # A result left by an earlier build into this folder would stand for a rank that crashed.
    result.unlink(missing_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            try:
                outcome = {"ok": True, **_rank_child(request, fn, rank, world, folder)}
                code = 0
            except BaseException as e:
                traceback.print_exc()
                outcome = {"ok": False, "error": str(e) if isinstance(e, common.DeclarationError) else f"{type(e).__name__}: {e}", "key": getattr(e, "key", ""), "declaration": isinstance(e, common.DeclarationError), "bad_input": bool(getattr(e, "bad_input", False))}
            result.write_text(json.dumps(outcome))
        finally:
            sys.stderr.flush()
            os._exit(code)
    with _stack_on_term(rank, log, Path(request.root)):
        _, status, _ = os.wait4(pid, 0)
    try:
        outcome = json.loads(result.read_text())
    except (OSError, json.JSONDecodeError):
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.waitstatus_to_exitcode(status)}"
        tail = log.read_text(errors="replace").strip().splitlines()[-12:] if log.exists() else []
        raise RuntimeError(f"rank {rank}'s build crashed ({how}) before reporting; last output:\n" + "\n".join(tail)) from None
    if not outcome["ok"]:
        if outcome.get("declaration"):
            raise common.DeclarationError(f"rank {rank}: {outcome['error']}", outcome.get("key", ""), bad_input=bool(outcome.get("bad_input", True)))
        tail = log.read_text(errors="replace").strip().splitlines()[-12:]
        raise RuntimeError(f"rank {rank}: {outcome['error']}\n" + "\n".join(tail))
    return outcome


_DUMP_HEADER = re.compile(r"^(?:Current thread|Thread) 0x([0-9a-f]+) \(most recent call first\):$")
_DUMP_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>.*)$')
_STACK_FRAMES = 12  # the innermost frames of a stopped rank shown in build.log


def _rank_stack(text: str, thread: int, root: Path) -> list[str]:
    """The frames of thread ``thread`` in the last faulthandler dump of ``text``, innermost first,
    without the front end's own frames, paths named as the source map names them."""
    lines = text.splitlines()
    start = max((i for i, line in enumerate(lines) if (m := _DUMP_HEADER.match(line)) and int(m.group(1), 16) == thread), default=-1)
    if start < 0:
        return []
    frames = []
    for line in lines[start + 1 :]:
        m = _DUMP_FRAME.match(line)
        if m is None:
            break
        # The front end's own frames and the interpreter's start-up (runpy) say nothing of
        # where the model's code was.
        if m.group("file").startswith("<frozen") or Path(m.group("file")).resolve().is_relative_to(common.FRONTEND_DIR):
            continue
        frames.append(f'  File "{capture.portable_path(m.group("file"), root)}", line {m.group("line")} in {m.group("function")}')
    return frames[:_STACK_FRAMES]


@contextmanager
def _stack_on_term(rank: int, log: Path, root: Path) -> Iterator[None]:
    """While rank ``rank``'s child builds, a SIGTERM (the runner's time or memory cap) writes
    that rank's Python stack into this process's log (build.log), not this process's own.

    The runner stops the whole process group. The rank's child inherits the worker's
    faulthandler, which dumps its stacks into its own log (rankN.log); this process only waits
    for it, and its own stack (``_fork_rank`` in ``wait4``) says nothing about where the model
    hung. So, while it waits, a SIGTERM here waits for the rank's dump to settle and copies the
    forking thread's frames (the rank's main thread has its ident: fork keeps it) into
    build.log, where the runner reads the tail it reports."""
    thread = threading.get_ident()
    had_faulthandler = faulthandler.unregister(signal.SIGTERM)

    def on_term(_signum: int, _frame: Any) -> None:
        text, settled = "", time.monotonic() + _DUMP_WAIT
        while time.monotonic() < settled:
            time.sleep(0.05)
            now = log.read_text(errors="replace") if log.exists() else ""
            if now != text:
                text, settled = now, min(time.monotonic() + 0.15, settled)
        frames = _rank_stack(text, thread, root)
        where = "\n".join(frames) if frames else "  (no Python stack of the rank was dumped; see " + log.name + ")"
        sys.stderr.write(f"rank {rank}'s build was still running when it was stopped; its Python stack, most recent call first:\n{where}\n")
        sys.stderr.flush()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if had_faulthandler:
            faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=False)


_DUMP_WAIT = 0.6  # seconds; the runner sends SIGKILL one second after SIGTERM


def _sources(folder: Path) -> dict[str, str]:
    """Instruction name -> the innermost user frame ``file:line`` of rank 0's source map."""
    data = json.loads((folder / "sourcemap.json").read_text())
    out = {}
    for name, entry in data.get("instructions", {}).items():
        frames = entry.get("frames") or []
        if frames:
            out[name] = f"{frames[0]['file']}:{frames[0]['line']}"
    return out


def build(request: common.BuildRequest) -> dict[str, Any]:
    """Build every rank of the model's world and lift them into ``distributed.hlo``."""
    t0 = time.perf_counter()
    fn = common.load_entry(request.entry, request.python_path)
    folder = Path(request.out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    world = sorted(r for g in request.groups for r in g)
    timings: dict[str, float] = {"declare": time.perf_counter() - t0}
    per_rank: list[float] = []
    summary: dict[str, Any] = {}
    for rank in world:
        t = time.perf_counter()
        outcome = _fork_rank(request, fn, rank, len(world), folder)
        per_rank.append(round(time.perf_counter() - t, 3))
        if rank == 0:
            summary = outcome["summary"]
    t = time.perf_counter()
    texts = [(folder / f"rank{r}.hlo").read_text() for r in world]
    lifted = lift(texts, world, request.groups, _sources(folder), source_reader(Path(request.root)))
    (folder / "distributed.hlo").write_text(lifted.text)
    findings = [f.to_json() for f in lifted.findings]
    (folder / "rank_specific.json").write_text(json.dumps(findings, indent=1) + "\n")
    timings["lift"] = time.perf_counter() - t
    summary.update({
        "rank": "int",
        "ranks": len(world),
        "rank_seconds": per_rank,
        "lifted": {"tables": lifted.tables, "affine": lifted.affine, "merged_groups": lifted.merged_groups, "round_trips": lifted.round_trips, "faithful": lifted.faithful},
        "rank_specific": findings,
        "hlo_bytes": {"baseline": (folder / "baseline.hlo").stat().st_size, "distributed": len(lifted.text)},
        "timings": {k: round(v, 4) for k, v in timings.items()},
    })
    return summary
