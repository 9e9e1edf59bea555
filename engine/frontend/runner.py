"""Build and check every declared model: the in-process API behind ``shardproof build`` / ``run``.

Builds run in worker processes (``server.py``): one worker per distinct ``env`` imports
torch-xla once and forks a child per model. This module never imports torch. It enforces each
model's caps from outside (wall time; resident memory, polled from ``/proc``), turns a crash, an
exception, an import error or a timeout into a ``build-failed`` result with the tail of the
traceback, and keeps going with the other models. While one model builds, the previous one is
verified, so the two cores of a small machine both work.

A build failure is never a pass: its status is ``build-failed`` and the run's exit code is 2. An
entry that cannot be resolved or imported, or a declaration that is wrong (``DeclarationError``),
is ``bad-input``, exit 3: the configuration is to blame, not the model's code.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, internal, phase
from ..portable import portable_result
from .config import Config, ModelConfig, load_config

RESULT_VERSION = 1
ERROR_STATUS = "error"
ARTIFACTS = ("baseline", "distributed", "relations", "sourcemap")
_FILES = {"baseline": "baseline.hlo", "distributed": "distributed.hlo", "relations": "relations.yaml", "sourcemap": "sourcemap.json"}
STATUS_EXIT = {"verified": 0, "diverged": 1, "rank-specific": 1, "unproven": 2, "unsupported": 2, "inconclusive": 2, "build-failed": 2, "bad-input": 3, "error": 4}
TAIL_LINES = 15
READY_TIMEOUT = 600.0  # importing torch-xla on a cold disk can be slow; this is not a model's cap
KILL_GRACE = 1.0  # seconds between SIGTERM (traceback dump) and SIGKILL


@dataclass
class BuildOutcome:
    ok: bool
    seconds: float
    peak_rss_mb: float
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)


# Lines of a crash dump that say nothing about the user's model: the worker's own frames and
# faulthandler's list of loaded extension modules.
_NOISE = ("engine/frontend/server.py", "engine/frontend/build.py", "engine/frontend/jax/build.py", "engine/frontend/spmd/build.py", "<frozen runpy>", "Extension modules:")


def tail(text: str, lines: int = TAIL_LINES) -> str:
    kept = [line for line in text.rstrip().splitlines() if line.strip() and not any(n in line for n in _NOISE)]
    return "\n".join(kept[-lines:])


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _rss_mb(pid: int) -> float | None:
    """Resident memory of ``pid`` (Linux ``/proc``); None where unavailable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


class Worker:
    """One build worker process and the thread that reads its answers."""

    def __init__(self, env: dict[str, str], log_path: Path, framework: str = "torch-xla") -> None:
        self.env = env
        self.log_path = log_path
        self.framework = framework
        self.proc: subprocess.Popen[str] | None = None
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.import_seconds = 0.0

    def _start(self) -> str | None:
        """Start the worker; returns an error text if it does not become ready."""
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "a")  # noqa: SIM115  - owned by the worker process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardproof.engine.frontend.server", *(["jax"] if self.framework == "jax" else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )  # fmt: skip
        log.close()
        self.events = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.events), daemon=True).start()
        event = self._next(READY_TIMEOUT)
        if event is None or event.get("event") != "ready":
            self.close()
            what = "jax" if self.framework == "jax" else "torch/torch_xla"
            return f"the build worker did not start (importing {what} failed?):\n" + tail(_read(self.log_path))
        self.import_seconds = float(event.get("import_seconds", 0.0))
        return None

    @staticmethod
    def _read(proc: subprocess.Popen[str], events: queue.Queue[dict[str, Any] | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                events.put(json.loads(line))
            except json.JSONDecodeError:
                continue  # stray output of a library: the protocol lines are JSON
        events.put(None)

    def _next(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def build(self, job: dict[str, Any], timeout: float, memory_mb: float) -> BuildOutcome:
        started = time.perf_counter()
        if not self.alive():
            error = self._start()
            if error:
                return BuildOutcome(False, time.perf_counter() - started, 0.0, error)
            started = time.perf_counter()  # the shared import is not the model's time
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"cmd": "build", **job}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return BuildOutcome(False, 0.0, 0.0, "the build worker died:\n" + tail(_read(self.log_path)))
        event = self._next(60.0)
        if event is None or event.get("event") != "started":
            self.close()
            return BuildOutcome(False, time.perf_counter() - started, 0.0, "the build worker died before the build started:\n" + tail(_read(self.log_path)))
        pid = int(event["pid"])
        killed: str | None = None
        peak = 0.0
        while True:
            event = self._next(0.05)
            if event is not None:
                break
            if not self.alive() and self.events.empty():
                self.close()
                return BuildOutcome(False, time.perf_counter() - started, peak, "the build worker died during the build:\n" + tail(_read(self.log_path)))
            elapsed = time.perf_counter() - started
            rss = _rss_mb(pid)
            if rss is not None:
                peak = max(peak, rss)
            if killed is None and elapsed > timeout:
                killed = f"exceeded its time cap of {timeout:g} s"
                _kill(pid)
            elif killed is None and rss is not None and rss > memory_mb:
                killed = f"exceeded its memory cap of {memory_mb:g} MiB (resident {rss:.0f} MiB)"
                _kill(pid)
        seconds = time.perf_counter() - started
        if event.get("event") != "exited":
            self.close()
            return BuildOutcome(False, seconds, peak, "the build worker stopped answering:\n" + tail(_read(self.log_path)))
        peak = max(peak, float(event.get("maxrss_kb") or 0) / 1024.0)
        result = _load_json(Path(job["result"]))
        log_tail = tail(_read(Path(job["log"])))
        if killed:
            return BuildOutcome(False, seconds, peak, f"build {killed} and was killed" + (f"\nwhere it was:\n{log_tail}" if log_tail else ""))
        if result is None:
            how = f"signal {event['signal']} ({signal.Signals(event['signal']).name})" if event.get("signal") else f"exit code {event.get('code')}"
            return BuildOutcome(False, seconds, peak, f"build crashed ({how}) before reporting" + (f"\nlast output:\n{log_tail}" if log_tail else ""))
        if not result.get("ok"):
            text = result.get("error", "build failed")
            if not result.get("declaration"):
                text += "\n" + tail(result.get("traceback", ""))
            return BuildOutcome(False, seconds, peak, text, {"key": result.get("key", ""), "bad_input": bool(result.get("bad_input"))})
        return BuildOutcome(True, seconds, peak, None, result.get("summary", {}))

    def close(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                proc.stdin.flush()
                proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def _kill(pid: int) -> None:
    """SIGTERM makes the child dump its Python stacks into its log; SIGKILL ends it for sure."""
    for sig, pause in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pid, sig)  # the child leads its own group: its subprocesses go too
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(pause)


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, json.JSONDecodeError):
        return None


# --------------------------------------------------------------------------------------------


def _job(config: Config, model: ModelConfig, folder: Path) -> dict[str, Any]:
    request = {
        "name": model.name,
        "entry": model.entry,
        "groups": model.groups,
        "root": str(config.root),
        "out_dir": str(folder),
        "python_path": [str(p) for p in config.python_path],
        "hide_frames": config.hide_frames,
        "size": model.size,
        "own_size": model.own_size,
        "variant": model.variant,
        "outputs": model.outputs,
        "rank": model.rank,
        "source_packages": config.source_packages,
    }
    if model.framework != "torch-xla":
        # jax / torch-xla-spmd builds derive groups and relations from the mesh and the specs.
        for key in ("groups", "outputs", "rank"):
            del request[key]
        request.update(framework=model.framework, devices=model.devices, description=model.description)
    return {"request": request, "log": str(folder / "build.log"), "result": str(folder / "build.json")}


# A builder takes (config, models, out_dir, on_built) and reports per model an object with the
# fields of BuildOutcome (ok, seconds, peak_rss_mb, error); it returns worker stats.
Builder = Callable[[Config, list[ModelConfig], Path, Callable[[ModelConfig, Any], None]], dict[str, float]]


def build_all(
    config: Config,
    models: list[ModelConfig],
    out_dir: Path,
    on_built: Callable[[ModelConfig, BuildOutcome], None],
) -> dict[str, float]:
    """Build ``models`` in order, calling ``on_built`` as each finishes; returns worker stats."""
    workers: dict[tuple[Any, ...], Worker] = {}
    try:
        for model in models:
            folder = out_dir / model.name
            folder.mkdir(parents=True, exist_ok=True)
            for name in (*_FILES.values(), "build.json", "build.log", "baseline.sourcemap.json"):
                (folder / name).unlink(missing_ok=True)  # never report a stale artifact
            key = (model.framework, *sorted(model.env.items()))
            if key not in workers:
                workers[key] = Worker(model.env, out_dir / f"worker-{len(workers)}.log", model.framework)
            outcome = workers[key].build(_job(config, model, folder), model.timeout, model.memory_mb)
            if outcome.error and outcome.summary.get("key"):
                outcome.error = f"{config.where(model, outcome.summary['key'])}: {outcome.error}"
            on_built(model, outcome)
    finally:
        for worker in workers.values():
            worker.close()
    return {"import_seconds": max((w.import_seconds for w in workers.values()), default=0.0)}


def verify_model(model: ModelConfig, folder: Path) -> tuple[str, dict[str, Any] | None, str | None]:
    """(status, Result.to_json() or None, error) for built artifacts in ``folder``."""
    from ..analysis.check import check_files
    from ..analysis.verify import ERROR, Budget, Result
    from ..relations import load_relations, with_assumptions
    from ..sourcemap import SourceMap

    budget = Budget(
        max_iterations=int(model.verify.get("max_iterations", 400)),
        max_nodes=int(model.verify.get("max_nodes", 2_000_000)),
        seconds=float(model.verify.get("timeout", 120.0)),
        partition=bool(model.verify.get("partition", True)),
        fold=bool(model.verify.get("fold", True)),
        layer_pattern=model.layer_pattern,
    )
    try:
        with phase("read", str(folder / _FILES["relations"])) as p:
            # verify: {assume: [...]} in .shardproof.yml: assumptions the verdict then names.
            spec = with_assumptions(load_relations(folder / _FILES["relations"]), model.verify.get("assume") or [])
            p.at(str(folder / _FILES["sourcemap"]))
            sourcemap = SourceMap.load(folder / _FILES["sourcemap"])
        from ..witness.pair import DEFAULT_MAX_INSTRUCTIONS, DEFAULT_MEMORY_MB, WitnessOptions

        witness = WitnessOptions(memory_mb=float(model.verify.get("witness_memory_mb", DEFAULT_MEMORY_MB)), max_instructions=int(model.verify.get("witness_max_instructions", DEFAULT_MAX_INSTRUCTIONS)))
        result = check_files(spec, folder / _FILES["baseline"], folder / _FILES["distributed"], sourcemap, budget, witness=str(model.verify.get("witness", "auto")), witness_options=witness)
    except InputError as e:
        return "build-failed", None, f"the verifier rejected the built artifacts: {e}"
    except Exception as e:  # a crash of the verifier is no verdict: status error, exit 4
        err = internal(e, "verify", str(folder))
        files = [str(folder / _FILES[k]) for k in ARTIFACTS]
        return ERROR, Result(ERROR, reason=err.explain(files), error=err.to_json()).to_json(), None
    return result.verdict, result.to_json(), None


def rank_specific_status(entry: dict[str, Any], status: str, result: dict[str, Any] | None, summary: dict[str, Any]) -> str:
    """The status of an int-rank model whose ranks' programs differ other than by metadata, no-op
    round trips and rank arithmetic (frontend/torchdist/lift.py), given the lifted program's
    verdict ``status``. A difference is a bug claim only with evidence, like ``diverged``: the
    witness executed the lifted program (every rank's own program) and an output differs. Then
    the model is ``rank-specific`` and ``entry["rank_specific"]`` lists the differences (the
    bot's findings). Otherwise they are kept as ``entry["rank_differences"]``, not as bugs:
    proven harmless (verified), found equal by the witness (unproven), or not executed."""
    differences = summary["rank_specific"]
    faithful = bool((summary.get("lifted") or {}).get("faithful", True))
    witness = ((result or {}).get("witness") or {}).get("status")
    if faithful and status == "diverged" and witness == "confirmed":
        entry["rank_specific"] = differences
        return "rank-specific"
    entry["rank_differences"] = differences
    if not faithful and status == "diverged" and witness == "confirmed":
        return status  # rank 0's own program differs from the baseline: that much is evidenced
    if not faithful:
        # The ranks' programs could not be put into one: the checked program is rank 0's alone,
        # so neither its proof nor its witness speaks for the other ranks.
        if result is not None:
            result["reason"] = (f"not proven: the ranks' programs differ in a way that cannot be lifted into one program ({differences[0]['message']}); "
                                f"only rank 0's program was checked ({status}: {result.get('reason', '')})")
        return "unproven"
    if status == "verified":
        return status  # the lifted program is each rank's own: the difference is proven harmless
    if result is not None:
        why = "the witness finds the outputs equal" if witness == "equal" else f"no witness confirmed a difference (witness {witness or 'not run'})"
        result["reason"] = f"{result.get('reason', '')}; the ranks' programs differ ({differences[0]['message']}), but {why}: not reported as a bug"
    return "unproven" if status == "diverged" else status


def matches(entry: dict[str, Any]) -> bool:
    """Whether a model's status is what it should be: its ``expect``, else verified."""
    if entry["status"] in ("build-failed", "bad-input"):
        return False
    return entry["status"] == (entry.get("expect") or "verified")


def exit_code(doc: dict[str, Any]) -> int:
    """0 when every model is as expected; 1 when a verdict differs (a divergence, or a bug
    variant that verified); 2 when anything is unproven, unsupported, inconclusive or failed to
    build; 3 when a model's entry or declaration is bad input; 4 when the verifier crashed on a model (an internal error beats every verdict)."""
    code = 0
    for entry in doc["models"]:
        if matches(entry):
            continue
        code = max(code, STATUS_EXIT[entry["status"]] or 1)
    return code


def layers_of(result: dict[str, Any] | None) -> int | None:
    if not result:
        return None
    report = result.get("stats", {}).get("segment_report")
    if not report:
        return None
    from ..analysis.partition import is_backward  # the backward of a layer is no layer of its own

    return sum(1 for seg in report if seg.get("layer", -1) >= 0 and not is_backward(seg["layer"]))


def run_models(
    config_path: Path | str,
    out_dir: Path | str,
    models: list[str] | None = None,
    *,
    verify: bool = True,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    builder: Builder | None = None,
    isolation: str | None = None,
) -> dict[str, Any]:
    """Build (and unless ``verify`` is false, check) the models of ``config_path``.

    Returns the ``result.json`` document (also written to ``out_dir/result.json``); calls
    ``on_result`` with each model's entry as soon as it is final. Raises :class:`InputError`
    for a bad configuration or an unknown model name. ``builder`` replaces :func:`build_all`
    (the bot's sandbox builds each model in a container); ``isolation`` then names where the
    builds ran, for the result and each model's build record.
    """
    started = time.perf_counter()
    config = load_config(config_path)
    selected = config.select(models)
    out = Path(out_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    built: queue.Queue[tuple[ModelConfig, BuildOutcome] | None] = queue.Queue()
    stats: dict[str, float] = {}
    failure: list[BaseException] = []

    def produce() -> None:
        try:
            stats.update((builder or build_all)(config, selected, out, lambda m, o: built.put((m, o))))
        except BaseException as e:  # surfaced by the consumer below
            failure.append(e)
        finally:
            built.put(None)

    producer = threading.Thread(target=produce, name="shardproof-builds", daemon=True)
    producer.start()
    entries: list[dict[str, Any]] = []
    while True:
        item = built.get()
        if item is None:
            break
        model, outcome = item
        folder = out / model.name
        entry: dict[str, Any] = {
            "name": model.name,
            "status": "build-failed",
            "expect": model.expect,
            "seconds": 0.0,
            "build": {"seconds": round(outcome.seconds, 3), "peak_rss_mb": round(outcome.peak_rss_mb, 1), "error": outcome.error},
        }
        if isolation:
            entry["build"]["isolation"] = isolation
        summary = outcome.summary or {}  # builders other than the worker (the sandbox) may report none
        if summary.get("rank_seconds"):  # an int-rank model: one build per rank
            entry["build"]["rank_seconds"] = summary["rank_seconds"]
        verify_seconds = 0.0
        if outcome.ok and verify:
            t = time.perf_counter()
            status, result, error = verify_model(model, folder)
            verify_seconds = time.perf_counter() - t
            entry["status"] = status
            if summary.get("rank_specific") and status != ERROR_STATUS:
                entry["status"] = rank_specific_status(entry, status, result, summary)
            if result is not None:
                # result.json is shared: trace and divergence sources relative to the repository.
                entry["result"] = portable_result(result, str(config.root))
            if error:
                entry["build"]["error"] = error
        elif outcome.ok:
            entry["status"] = "built"
        elif summary.get("bad_input"):
            entry["status"] = "bad-input"  # the config or declaration is wrong, not the model's code
        entry["seconds"] = round(outcome.seconds + verify_seconds, 3)
        entry["artifacts"] = {k: (config.relative(folder / f) if (folder / f).exists() else None) for k, f in _FILES.items()}
        entry["log"] = config.relative(folder / "build.log")
        if model.variant:
            entry["variant"] = model.variant
        entries.append(entry)
        if on_result is not None:
            on_result(entry)
    producer.join()
    if failure:
        raise failure[0]
    doc = {
        "version": RESULT_VERSION,
        "config": config.display_path,
        "repository_root": ".",
        "models": entries,
        "seconds": round(time.perf_counter() - started, 3),
        "worker_import_seconds": round(stats.get("import_seconds", 0.0), 3),
    }
    if isolation:
        doc["isolation"] = isolation
    with phase("report", str(out / "result.json")):
        (out / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc
