"""The witness in a process of its own.

XLA aborts the whole process on some inputs it cannot compile (a ``Check failed`` in its CPU
emitter for a post-optimization dump with backend fusions, for example): that must not take
``shardproof check`` or a ``shardproof run`` of many models down with it. So the checker talks
to one long-lived worker (``python -m shardproof.engine.witness.service``, started on first use,
jax imported once there) over a pipe; a worker that dies is reported as an error of the witness
(with the tail of what XLA printed) and the next call starts a fresh one.

Only the functions in ``CALLS`` run there; arguments and results are plain data (pickled).
"""

from __future__ import annotations

import atexit
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
from typing import Any, BinaryIO

CALLS = ("pair.witness", "pair.instruction_differs", "segment.cut_instruction")


class WitnessCrashed(RuntimeError):
    """The worker died (XLA aborted) or did not answer in time."""


def _send(f: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv(f: BinaryIO) -> Any:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)  # only from our own child process


class Service:
    def __init__(self, timeout: float = 600.0) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Any = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen[bytes]:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr while it lives)
        env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-m", "shardproof.engine.witness.service"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        return self.proc

    def _tail(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        lines = [ln for ln in self.log.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        failed = [ln for ln in lines if "Check failed" in ln or "Error" in ln]
        return (failed[0] if failed else lines[-1] if lines else "")[-400:]

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name not in CALLS:
            raise ValueError(f"not a witness call: {name}")
        with self.lock:
            proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
            assert proc.stdin is not None and proc.stdout is not None
            timer = threading.Timer(self.timeout, proc.kill)
            timer.start()
            try:
                _send(proc.stdin, (name, args, kwargs))
                status, value = _recv(proc.stdout)
            except (EOFError, BrokenPipeError, OSError) as e:
                proc.kill()
                proc.wait()
                why = "did not answer within its time limit" if not timer.is_alive() else f"died (exit code {proc.returncode})"
                tail = self._tail()
                self.proc = None
                raise WitnessCrashed(f"XLA's CPU runtime {why}" + (f": {tail}" if tail else "")) from e
            finally:
                timer.cancel()
        if status == "ok":
            return value
        exc_type, message = value
        raise _rebuild(exc_type, message)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


def _rebuild(exc_type: str, message: str) -> Exception:
    from .pair import MemoryBudgetError

    if exc_type == "MemoryBudgetError":
        e = MemoryBudgetError(0, 0.0, message)
        return e
    if exc_type in ("ValueError", "KeyError", "NotImplementedError"):
        return {"ValueError": ValueError, "KeyError": KeyError, "NotImplementedError": NotImplementedError}[exc_type](message)
    return RuntimeError(f"{exc_type}: {message}")


_service: Service | None = None


def service() -> Service:
    """The process's witness worker (started on first use, stopped at exit)."""
    global _service
    if _service is None:
        _service = Service()
        atexit.register(_service.close)
    return _service


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return service().call(name, *args, **kwargs)


def _serve() -> None:
    import importlib

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing printed may corrupt the pipe
    while True:
        try:
            name, args, kwargs = _recv(stdin)
        except EOFError:
            return
        module, fn = name.split(".")
        try:
            value = getattr(importlib.import_module(f"shardproof.engine.witness.{module}"), fn)(*args, **kwargs)
            if hasattr(value, "baseline_outputs"):  # arrays stay here; the report is enough
                value.baseline_outputs, value.distributed_outputs = [], []
            _send(stdout, ("ok", value))
        except Exception as e:  # the caller decides what an error means
            _send(stdout, ("err", (type(e).__name__, str(e))))


if __name__ == "__main__":
    _serve()
