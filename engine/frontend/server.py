"""Build worker: imports torch-xla once, then builds each requested model in a forked child.

    python -m shardproof.engine.frontend.server

Importing torch_xla costs ~7 s; a traced model costs well under a second. The worker pays the
import once and forks a child per model *before* anything touches the XLA device, so every build
starts from the same clean state (no user module, no collective token, no op-name counter left
over from another model) while sharing the imported libraries. The child is its own process
group: the runner enforces the model's time and memory caps by killing it, and a crash, an
import error or a hang in one model never reaches the others.

Protocol (JSON lines): the runner writes ``{"cmd": "build", "request": {...}, "log": PATH,
"result": PATH}`` or ``{"cmd": "exit"}``; the worker answers ``{"event": "ready"}`` once, then
per build ``{"event": "started", "pid": N}`` and ``{"event": "exited", "pid": N, "code": C,
"signal": S, "maxrss_kb": K}``. The child writes its summary or its error (with traceback) as
JSON to the result path and everything it prints to the log path.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from typing import Any

from . import capture


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(job: dict[str, Any]) -> int:
    """Runs in the forked child; returns its exit code."""
    os.setpgid(0, 0)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    # On the runner's SIGTERM (time or memory cap) the log shows where the build was stuck.
    faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=False)
    faulthandler.enable(file=sys.stderr)
    request = dict(job["request"])
    framework = request.pop("framework", "torch-xla")
    if framework == "jax":
        from .build import DeclarationError
        from .jax.build import build_request as build
    elif framework == "torch-xla-spmd":
        from .build import DeclarationError
        from .spmd.build import build_request as build
    else:
        from .build import BuildRequest, DeclarationError
        from .build import build as build_torch

        def build(r: dict[str, Any]) -> dict[str, Any]:
            return build_torch(BuildRequest(**r))

    started = time.perf_counter()
    try:
        summary = build(request)
        outcome: dict[str, Any] = {"ok": True, "summary": summary}
        code = 0
    except BaseException as e:  # everything becomes a build-failed result
        sys.stderr.write(traceback.format_exc())
        declaration = isinstance(e, DeclarationError)
        outcome = {
            "ok": False,
            "error": str(e) if declaration else f"{type(e).__name__}: {e}",
            "key": e.key if declaration else "",
            "traceback": _user_traceback(e, job["request"]["root"]),
            "declaration": declaration,
            "bad_input": declaration and bool(getattr(e, "key", "")) and bool(getattr(e, "bad_input", True)),
        }
        code = 1
    outcome["seconds"] = time.perf_counter() - started
    with open(job["result"], "w") as f:
        json.dump(outcome, f)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _user_traceback(error: BaseException, root: str) -> str:
    """The traceback without the worker's own frames, paths relative to the repository."""
    from pathlib import Path

    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(str(Path(__file__).parent))]
    for frame in frames:
        frame.filename = capture.portable_path(frame.filename, Path(root).resolve())
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames), *traceback.format_exception_only(error)]
    return "".join(lines)


_PRELOADED: set[str] = set()


def _preload(packages: list[str]) -> None:
    """Import the model's ``source_packages`` once in the worker, before it forks: importing
    megatron.core costs ~10 s, a fork of the imported library nothing. A namespace package
    (``megatron``) brings its subpackages. A package that fails to import is left to the
    child, whose build then fails with the located error."""
    import importlib
    import pkgutil

    for name in packages:
        if name in _PRELOADED:
            continue
        _PRELOADED.add(name)
        try:
            package = importlib.import_module(name)
            if getattr(package, "__file__", None) is None:
                for info in pkgutil.iter_modules(package.__path__, name + "."):
                    if info.ispkg:
                        importlib.import_module(info.name)
        except Exception:  # the child reports it with its traceback
            continue


def main(argv: list[str] | None = None) -> int:
    """``server [jax]``: a torch-xla worker, or with ``jax`` a JAX one (framework: jax)."""
    started = time.perf_counter()
    if (argv if argv is not None else sys.argv[1:]) == ["jax"]:
        # Only the import is shared: the backend (and the XLA flags it reads: device count,
        # dump folder) starts in each forked child, never here, so forking stays safe.
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax  # noqa: F401
    else:
        # xm.all_reduce is a no-op on one device unless told otherwise: without this a model
        # using it would trace as if the collective were missing.
        os.environ.setdefault("XLA_ALWAYS_ALLREDUCE", "1")
        capture.configure_environment()
        import torch  # noqa: F401  - the import every build shares
        import torch_xla  # noqa: F401

        capture.keep_scalars_constant()
    _send({"event": "ready", "import_seconds": round(time.perf_counter() - started, 3)})
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if job.get("cmd") == "exit":
            break
        _preload(job.get("request", {}).get("source_packages") or [])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(job)
            finally:
                os._exit(code)
        _send({"event": "started", "pid": pid})
        _, status, usage = os.wait4(pid, 0)
        _send({
            "event": "exited",
            "pid": pid,
            "code": os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "maxrss_kb": usage.ru_maxrss,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
