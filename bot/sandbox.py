"""Sandboxed model builds: each model of a pull request is built in a sibling container.

A pull request's model code is untrusted, and building a model imports (runs) it. In the action,
GitHub mounts the Docker socket into the bot's container, so the bot starts one sibling
container of its own image per model, and that container gets:

- no network (``network_mode: none``);
- an environment written from nothing: no ``GITHUB_TOKEN``, no ``INPUT_*`` (inputs may be
  secrets), no ``ACTIONS_*`` runtime tokens, no proxy settings of the Docker client;
- the workspace mounted read-only at the path it has here (source lines come out alike), a
  read-only root file system, a private ``/tmp``, every capability dropped, no new privileges;
- caps from the model's own ``timeout`` and ``memory_mb`` (plus room for starting torch-xla),
  a CPU quota and a process-count limit;
- one writable folder, a fresh volume, from which the artifacts are copied out afterwards as
  files (known names only, size-capped) and then verified here, on the trusted side.

Inside, ``shardproof build`` runs the front end as usual (its worker enforces the exact caps and
writes the traceback of a failure); the container caps are the backstop it cannot escape. A
build that fails in any way — an exception, a crash, a cap, a missing artifact — is
``build-failed``, never a pass.

``SandboxBuilder.build_all`` has the signature of the front end's ``build_all`` and plugs into
``run_models``, which assembles the result as for any run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .runner import RunnerError

SOCKET = Path("/var/run/docker.sock")
OUT = "/sandbox-out"  # the only writable folder of a sandbox besides its private /tmp
LABEL = "io.shardproof.sandbox"
STARTUP_SECONDS = (
    300.0  # on top of the model's time cap: starting the container, importing torch-xla
)
MEMORY_HEADROOM_MB = 2048  # on top of the model's memory cap: the runner and torch-xla's worker
PIDS_LIMIT = 4096  # threads count too; torch starts one pool per core
TMP_SIZE = "1g"
MAX_FILE_BYTES = 256 * 1024 * 1024  # a 405B-shaped HLO module is ~6 MB
MAX_TOTAL_BYTES = 1024 * 1024 * 1024
MODEL_FILES = (
    "baseline.hlo",
    "distributed.hlo",
    "relations.yaml",
    "sourcemap.json",
    "baseline.sourcemap.json",
    "build.log",
)
ARTIFACTS = {
    "baseline": "baseline.hlo",
    "distributed": "distributed.hlo",
    "relations": "relations.yaml",
    "sourcemap": "sourcemap.json",
}
LOG_TAIL = 20
MAX_ERROR_CHARS = 8000  # the error text comes from code that ran the untrusted model
# The whole environment of a sandbox. HOME and the caches point into the private /tmp because
# everything else is read-only.
SANDBOX_ENV = {
    "HOME": "/tmp",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "PJRT_DEVICE": "CPU",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
_CONTAINER_MOUNT = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf)$")


class SandboxUnavailable(RunnerError):
    """Model builds cannot be sandboxed here; the message says why."""


@dataclass
class Sandbox:
    client: Any
    image: str
    program: str  # the shardproof executable inside the image
    workspace: Path  # as this process sees it
    host_workspace: str  # the same folder as the Docker daemon sees it
    cpus: float
    daemon: str

    def describe(self) -> str:
        return f"sandbox containers of image {self.image.removeprefix('sha256:')[:12]} via {self.daemon} (no network, workspace read-only, no secrets)"


def _daemon_url(base_url: str | None) -> str | None:
    if base_url:
        return base_url
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    return f"unix://{SOCKET}" if SOCKET.exists() else None


def own_container_ids(mountinfo: str, hostname: str) -> list[str]:
    """Candidate ids of the container this process runs in.

    Docker bind-mounts ``/etc/hostname``, ``/etc/hosts`` and ``/etc/resolv.conf`` from
    ``<data-root>/containers/<id>/``; the mount table shows that path, also with host networking
    (where the hostname is the host's). The hostname is the short id otherwise. Only those three
    mount points count: on a host, the table also lists the shm mounts of other containers.
    """
    ids: list[str] = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
            m = _CONTAINER_MOUNT.search(fields[3])
            if m and m.group(1) not in ids:
                ids.append(m.group(1))
    if re.fullmatch(r"[0-9a-f]{12,64}", hostname) and hostname not in ids:
        ids.append(hostname)
    return ids


def host_path(mounts: list[dict[str, Any]], path: Path) -> str | None:
    """Where ``path`` (inside this container) is on the Docker host: through the deepest mount
    that contains it."""
    best: tuple[int, str] | None = None
    for m in mounts:
        dest, source = str(m.get("Destination") or ""), str(m.get("Source") or "")
        if not dest or not source:
            continue
        try:
            rest = path.relative_to(dest)
        except ValueError:
            continue
        if best is None or len(dest) > best[0]:
            best = (len(dest), str(Path(source) / rest) if str(rest) != "." else source)
    return best[1] if best else None


def connect(
    workspace: Path,
    image: str | None = None,
    cpus: float | None = None,
    base_url: str | None = None,
) -> Sandbox:
    """A sandbox on the Docker daemon this process can reach; raises SandboxUnavailable."""
    url = _daemon_url(base_url)
    if url is None:
        raise SandboxUnavailable(f"no Docker socket at {SOCKET}")
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound, NotFound
    except ImportError as e:
        raise SandboxUnavailable(f"the docker Python package is not installed ({e})") from e
    try:
        client = docker.DockerClient(base_url=url, timeout=120)
        client.ping()
    except DockerException as e:
        raise SandboxUnavailable(f"the Docker daemon at {url} does not answer ({e})") from e
    workspace = workspace.absolute()
    own = None
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        mountinfo = ""
    for cid in own_container_ids(mountinfo, socket.gethostname()):
        with contextlib.suppress(NotFound, DockerException):
            own = client.containers.get(cid)
            break
    if own is not None:
        image = image or str(own.attrs.get("Image") or "")
        mapped = host_path(own.attrs.get("Mounts") or [], workspace)
        if mapped is None:
            raise SandboxUnavailable(
                f"the workspace {workspace} is not mounted into this container, so a sibling container cannot mount it"
            )
    elif Path("/.dockerenv").exists() and not image:
        raise SandboxUnavailable(
            "this container is not among the Docker daemon's containers, so its image and workspace mount are unknown"
        )
    else:
        # Not in a container the daemon knows: a daemon on this machine, seeing the same paths
        # (outside a container, or a daemon started inside this one with an image named).
        mapped = str(workspace)
    if not image:
        raise SandboxUnavailable(
            "no image to build in: outside the action's container, name one (--sandbox-image)"
        )
    try:
        found = client.images.get(image)
    except (ImageNotFound, DockerException) as e:
        raise SandboxUnavailable(
            f"the image {image} is not available to the Docker daemon ({e})"
        ) from e
    entry = (found.attrs.get("Config") or {}).get("Entrypoint") or ["shardproof"]
    return Sandbox(
        client,
        str(found.id),
        str(entry[0]),
        workspace,
        mapped,
        float(cpus or os.cpu_count() or 1),
        url,
    )


@dataclass
class Built:
    """The outcome of one sandboxed build (the fields of the front end's BuildOutcome)."""

    ok: bool
    seconds: float
    peak_rss_mb: float
    error: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)  # what the build reports beyond its artifacts


class SandboxBuilder:
    def __init__(self, sandbox: Sandbox, log: Callable[[str], None] | None = None) -> None:
        self.sandbox = sandbox
        self.log = log or (lambda _msg: None)

    def build_all(
        self, config: Any, models: list[Any], out_dir: Path, on_built: Callable[[Any, Built], None]
    ) -> dict[str, float]:
        """Build ``models`` one container each, calling ``on_built`` as each finishes."""
        for model in models:
            folder = out_dir / model.name
            folder.mkdir(parents=True, exist_ok=True)
            for name in (*MODEL_FILES, "build.json"):
                (folder / name).unlink(missing_ok=True)  # never report a stale artifact
            on_built(model, self.build_one(config, model, folder))
        return {"import_seconds": 0.0}

    def build_one(self, config: Any, model: Any, folder: Path) -> Built:
        sb = self.sandbox
        config_path = Path(config.path)
        try:
            config_path.relative_to(sb.workspace)
            Path(config.root).relative_to(sb.workspace)
        except ValueError:
            return Built(
                False,
                0.0,
                0.0,
                f"the configuration {config_path} and its repository root must be inside the workspace {sb.workspace}, the only folder a sandbox sees",
            )
        cap = float(model.timeout) + STARTUP_SECONDS
        memory = int(model.memory_mb) + MEMORY_HEADROOM_MB
        client = sb.client
        started = time.monotonic()
        volume = client.volumes.create(labels={LABEL: model.name})
        container = None
        try:
            container = client.containers.create(
                sb.image,
                entrypoint=[sb.program],
                command=[
                    "build",
                    "--config",
                    str(config_path),
                    "--models",
                    model.name,
                    "--out",
                    OUT,
                ],
                environment=dict(SANDBOX_ENV),
                use_config_proxy=False,  # the client's proxy settings may carry credentials
                working_dir=str(sb.workspace),
                volumes={
                    sb.host_workspace: {"bind": str(sb.workspace), "mode": "ro"},
                    volume.name: {"bind": OUT, "mode": "rw"},
                },
                network_mode="none",
                read_only=True,
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={TMP_SIZE}"},
                mem_limit=f"{memory}m",
                memswap_limit=f"{memory}m",  # no swap: the cap is real
                nano_cpus=int(sb.cpus * 1e9),
                pids_limit=PIDS_LIMIT,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                hostname="shardproof-sandbox",
                labels={LABEL: model.name},
            )
            container.start()
            self.log(f"building {model.name} in sandbox container {container.short_id}")
            killed = None
            code = None
            try:
                code = container.wait(timeout=cap).get("StatusCode")
            except Exception:
                if time.monotonic() - started < cap:
                    raise  # not the client's read timeout: the daemon failed us
                with contextlib.suppress(Exception):
                    container.kill()
                with contextlib.suppress(Exception):
                    code = container.wait(timeout=60).get("StatusCode")
                killed = f"exceeded the sandbox's wall-time cap of {cap:g} s (the model's timeout plus {STARTUP_SECONDS:g} s to start)"
            seconds = time.monotonic() - started
            container.reload()
            oom = bool((container.attrs.get("State") or {}).get("OOMKilled"))
            inner, copied, problem = self._copy_out(container, model.name, folder)
            logs = _text(container.logs(stdout=True, stderr=True, tail=LOG_TAIL * 4))
        except Exception as e:  # the daemon failed us: no verdict for this model
            return Built(
                False,
                time.monotonic() - started,
                0.0,
                f"the sandbox container could not run the build: {type(e).__name__}: {e}",
            )
        finally:
            if container is not None:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
            with contextlib.suppress(Exception):
                volume.remove(force=True)
        return _outcome(model, inner, copied, problem, killed, oom, memory, code, seconds, logs)

    def _copy_out(
        self, container: Any, name: str, folder: Path
    ) -> tuple[dict[str, Any] | None, set[str], str | None]:
        """Copy the known files out of the sandbox's volume; returns (its result entry for the
        model, the model files copied, a problem with the archive)."""
        wanted = {f"{Path(OUT).name}/{name}/{f}": f for f in (*MODEL_FILES, "build.json")}
        result_name = f"{Path(OUT).name}/result.json"
        copied: set[str] = set()
        inner: dict[str, Any] | None = None
        with tempfile.TemporaryFile() as spool:
            try:
                stream, _ = container.get_archive(OUT)
                total = 0
                for chunk in stream:
                    total += len(chunk)
                    if total > MAX_TOTAL_BYTES:
                        return (
                            None,
                            copied,
                            f"the build wrote more than {MAX_TOTAL_BYTES // 2**20} MiB",
                        )
                    spool.write(chunk)
            except Exception as e:
                return None, copied, f"its files could not be copied out: {type(e).__name__}: {e}"
            spool.seek(0)
            try:
                with tarfile.open(fileobj=spool, mode="r:") as tar:
                    for member in tar:
                        if not member.isreg() or member.size > MAX_FILE_BYTES:
                            continue  # links, devices and oversized files never leave the sandbox
                        if member.name == result_name:
                            inner = _entry_of(tar.extractfile(member), name)
                        elif member.name in wanted:
                            src = tar.extractfile(member)
                            if src is not None:
                                (folder / wanted[member.name]).write_bytes(src.read())
                                copied.add(wanted[member.name])
            except tarfile.TarError as e:
                return None, copied, f"its files could not be read: {e}"
        return inner, copied, None


def _text(data: bytes | str) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


def _entry_of(stream: Any, name: str) -> dict[str, Any] | None:
    """The model's entry of the sandbox's result.json (written by code that ran untrusted
    models: read as data, every field checked)."""
    if stream is None:
        return None
    try:
        doc = json.loads(stream.read(MAX_FILE_BYTES))
    except ValueError:
        return None
    for entry in doc.get("models") or [] if isinstance(doc, dict) else []:
        if (
            isinstance(entry, dict)
            and entry.get("name") == name
            and isinstance(entry.get("build"), dict)
        ):
            return entry
    return None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _tail(text: str, lines: int = LOG_TAIL) -> str:
    kept = [line for line in text.rstrip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _outcome(
    model: Any,
    inner: dict[str, Any] | None,
    copied: set[str],
    problem: str | None,
    killed: str | None,
    oom: bool,
    memory: int,
    code: int | None,
    seconds: float,
    logs: str,
) -> Built:
    build = (inner or {}).get("build") or {}
    peak = _number(build.get("peak_rss_mb"))
    where = f"\nlast output:\n{_tail(logs)}" if _tail(logs) else ""
    if killed:
        return Built(False, seconds, peak, f"the build {killed} and was killed{where}")
    if oom:
        return Built(
            False,
            seconds,
            peak,
            f"the build exceeded the sandbox's memory cap of {memory} MiB (the model's memory_mb plus {MEMORY_HEADROOM_MB} MiB) and the kernel killed it{where}",
        )
    if problem:
        return Built(False, seconds, peak, f"the sandboxed build's results are unusable: {problem}")
    if inner is None:
        return Built(
            False,
            seconds,
            peak,
            f"the sandboxed build exited with code {code} before reporting{where}",
        )
    if inner.get("status") != "built":
        error = build.get("error")
        text = (
            str(error)[-MAX_ERROR_CHARS:]
            if error
            else f"the sandboxed build failed (exit code {code}){where}"
        )
        # The build found the model's .shardproof.yml entry wrong (an entry that does not import,
        # a knob never read): the author's configuration error, as without the sandbox. Its
        # located message comes first in the error, so it is kept from the start.
        bad = inner.get("status") == "bad-input" and bool(error)
        if bad:
            text = str(error)[:MAX_ERROR_CHARS]
        return Built(
            False,
            _number(build.get("seconds")) or seconds,
            peak,
            text,
            summary={"bad_input": True} if bad else {},
        )
    missing = [f for f in ARTIFACTS.values() if f not in copied]
    if missing:
        return Built(
            False,
            seconds,
            peak,
            f"the sandboxed build reported success but did not write {', '.join(missing)}",
        )
    # Per-rank build times and rank-specific findings of an int-rank model travel with the build.
    summary = {k: build[k] for k in ("rank_seconds", "rank_specific") if k in build}
    return Built(True, _number(build.get("seconds")) or seconds, peak, summary=summary)


class SandboxRunner:
    """The runner seam with builds in sandbox containers and verification here."""

    def __init__(self, sandbox: Sandbox, log: Callable[[str], None] | None = None) -> None:
        self.sandbox = sandbox
        self.builder = SandboxBuilder(sandbox, log)
        self.notice: str | None = None

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        # The configuration is read here only as data (YAML, checked against the schema); no
        # model code runs outside a sandbox. While one model builds in its container, the
        # previous one is verified here.
        from shardproof.engine.frontend.runner import run_models

        if not config.exists():
            raise RunnerError(f"the configuration {config} does not exist")
        doc = run_models(
            config, out_dir, models, builder=self.builder.build_all, isolation="docker"
        )
        doc["isolation"] = self.sandbox.describe()
        (Path(out_dir).absolute() / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
        return doc
