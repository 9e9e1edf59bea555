"""A Docker daemon of the tests' own, a Debian base image made locally, and the action's image.

Why each step is the way it is (DESIGN.md §6): this machine has no Docker running and cannot
reach Docker Hub, and its containers cannot get private-range networks. So the tests start
``dockerd`` themselves with ``--bridge=none`` and their own data/exec roots under a temporary
folder, make the base image with ``debootstrap`` (the Dockerfile takes its base as an ``ARG``),
build with ``--network host`` and run model builds with ``--network none``. Package traffic
here goes through a proxy with its own CA: the host's CA bundle goes into the base image.

The daemon is stopped by its pid (never by name), in a ``finally`` of the session fixture.
Set ``SHARDPROOF_TEST_DOCKER_DIR`` to a folder to keep the daemon's data (images) between
sessions while developing; by default everything lives in temporary folders that are removed.
The image needs ~8 GB of layers and, while it builds, as much again (downloaded wheels, the
committed copy of the build container's layer): the data root goes to the roomiest of the
checkout's ``.tools/``, ``/var/tmp`` and ``/tmp``, never to ``/tmp`` by default, which is a
RAM-backed tmpfs of half the memory on some machines (a CI run ran out of space there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASE_TAG = "local/shardproof-base:bookworm"
IMAGE_TAG = "local/shardproof-action:test"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_PACKAGES = "python3,python3-venv,python3-pip,ca-certificates"


class DockerUnavailable(RuntimeError):
    """Docker cannot be started here; the message says why. Tests fail on it, never skip."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_pid(pid: int, grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: only the one process named by ``pid``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Daemon:
    folder: Path  # socket, exec root, pid file, log: short paths (108-byte socket limit)
    proc: subprocess.Popen[bytes]
    data: Path  # the data root: image layers, gigabytes
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.folder / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.folder / "dockerd.log"

    def client(self, timeout: int = 600) -> Any:
        import docker

        return docker.DockerClient(base_url=self.url, timeout=timeout)

    def stop(self) -> None:
        """Stop the daemon by its pid, then the containerd it started (its pid file)."""
        containerd_pid = self.folder / "exec" / "containerd" / "containerd.pid"
        if self.proc.poll() is None:
            _stop_pid(self.proc.pid, grace=60.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        try:
            pid = int(containerd_pid.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            _stop_pid(pid, grace=20.0)
        self.unmount()

    def unmount(self) -> None:
        """Mounts the daemon left under its folder (its network namespace file stays mounted
        after a clean shutdown), deepest first, so that the folder can be removed."""
        try:
            mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        except OSError:
            return
        prefixes = tuple(str(p.resolve()) + "/" for p in (self.folder, self.data))
        for point in sorted((m for m in mounts if m.startswith(prefixes)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


# What a build of the action's image needs on the data root's file system, measured (7.97 GB
# image, plus the wheels and the committed layer copy while the big RUN step finishes).
NEEDED_BYTES = 20 * 2**30


def roomiest_data_dir() -> Path:
    """The candidate folder whose file system has the most free space (see the module doc)."""
    candidates = [ROOT / ".tools", Path("/var/tmp"), Path("/tmp")]
    best, best_free = candidates[-1], -1
    for c in candidates:
        try:
            c.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(c).free
        except OSError:
            continue
        if free > best_free:
            best, best_free = c, free
    return best


def free_space(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**30:.1f} GiB free under {path}"
    except OSError as e:
        return f"free space under {path} unknown ({e})"


def start_daemon(folder: Path, data: Path | None = None, ready_timeout: float = 90.0) -> Daemon:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailable("dockerd is not installed: `make install` installs Debian's docker.io (apt-get install docker.io debootstrap)")
    if os.geteuid() != 0:
        raise DockerUnavailable("dockerd needs root here (no rootless set-up); run the tests as root")
    folder.mkdir(parents=True, exist_ok=True)
    data = data or folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    for stale in ("docker.sock", "dockerd.pid"):
        (folder / stale).unlink(missing_ok=True)
    cmd = [
        dockerd,
        "--bridge=none", "--iptables=false", "--ip6tables=false",  # no private-range networks here
        f"--data-root={data}", f"--exec-root={folder / 'exec'}",
        f"--pidfile={folder / 'dockerd.pid'}", "-H", f"unix://{folder / 'docker.sock'}",
    ]  # fmt: skip
    log = open(folder / "dockerd.log", "ab")  # noqa: SIM115 - the daemon owns it
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    daemon = Daemon(folder, proc, data)
    deadline = started + ready_timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DockerUnavailable(f"dockerd exited with code {proc.returncode} while starting:\n{_tail(daemon.log)}")
        if daemon.socket.exists():
            try:
                daemon.client(timeout=5).ping()
                daemon.timings["dockerd_start"] = time.monotonic() - started
                return daemon
            except Exception as e:  # not answering yet
                last = f"{type(e).__name__}: {e}"
        time.sleep(0.3)
    daemon.stop()
    raise DockerUnavailable(f"dockerd did not answer within {ready_timeout:g} s ({last}):\n{_tail(daemon.log)}")


def make_base_image(daemon: Daemon, work: Path, tag: str = BASE_TAG) -> str:
    """A minimal Debian bookworm with Python 3.11, imported as ``tag``; returns the tag."""
    client = daemon.client()
    with contextlib.suppress(Exception):
        client.images.get(tag)
        return tag  # a kept data root (SHARDPROOF_TEST_DOCKER_DIR) already has it
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise DockerUnavailable("debootstrap is not installed: `make install` installs it (apt-get install debootstrap)")
    rootfs = work / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    log = work / "debootstrap.log"
    started = time.monotonic()
    mirror = os.environ.get("SHARDPROOF_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with open(log, "wb") as out:
        code = subprocess.run([debootstrap, "--variant=minbase", f"--include={DEBIAN_PACKAGES}", "bookworm", str(rootfs), mirror], stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise DockerUnavailable(f"debootstrap failed (exit {code}):\n{_tail(log)}")
    if CA_BUNDLE.exists():
        # Traffic may go through a proxy with its own CA, which only the host's bundle knows.
        shutil.copy(CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    tarball = work / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    shutil.rmtree(rootfs, ignore_errors=True)
    repo, _, version = tag.partition(":")
    client.api.import_image_from_file(str(tarball), repository=repo, tag=version or "latest", changes=[f"ENV PIP_CERT={CA_BUNDLE}"])
    tarball.unlink()
    daemon.timings["debootstrap"] = time.monotonic() - started
    return tag


def build_image(daemon: Daemon, base: str, log: Path, tag: str = IMAGE_TAG, context: Path = ROOT) -> str:
    """Build the repository's Dockerfile on ``base`` with host networking; returns the image id."""
    client = daemon.client(timeout=3600)
    started = time.monotonic()
    lines: list[str] = []
    with open(log, "w") as out:
        for chunk in client.api.build(path=str(context), tag=tag, buildargs={"BASE": base}, network_mode="host", rm=True, forcerm=True, decode=True, pull=False):
            text = chunk.get("stream") or chunk.get("status") or ""
            if text:
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()
                lines.append(text.rstrip())
            if "error" in chunk:
                raise DockerUnavailable(f"docker build failed ({free_space(daemon.data)}; the build needs ~{NEEDED_BYTES // 2**30} GiB): {chunk['error']}\n" + "\n".join(lines[-30:]))
    daemon.timings["image_build"] = time.monotonic() - started
    image = client.images.get(tag)
    return str(image.id)


@contextlib.contextmanager
def docker_session() -> Iterator[Daemon]:
    """A running daemon for the whole session; stopped by pid and its folder removed after."""
    kept = os.environ.get("SHARDPROOF_TEST_DOCKER_DIR")
    # A short path: containerd's unix sockets live under the exec root (108-byte limit).
    folder = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="spd-", dir="/tmp"))
    data = folder / "data" if kept else Path(tempfile.mkdtemp(prefix="shardproof-dockerd-", dir=roomiest_data_dir()))
    if shutil.disk_usage(data).free < NEEDED_BYTES:
        warnings.warn(f"the test daemon's data root has {free_space(data)}; building the action's image needs ~{NEEDED_BYTES // 2**30} GiB", stacklevel=1)
    daemon = start_daemon(folder, data)
    try:
        yield daemon
    finally:
        daemon.stop()
        if not kept:
            for path in (data, folder):
                shutil.rmtree(path, ignore_errors=True)
                if path.exists():  # gigabytes of image layers: say so rather than leave them quietly
                    warnings.warn(f"could not remove the test daemon's folder {path}", stacklevel=1)


# --------------------------------------------------------------------------------------------
# Running the action's container the way GitHub's runner does (`docker run` of a Docker action):
# the workspace, home and file-command folders mounted under /github, the Docker socket
# mounted, every input as INPUT_<NAME> with the defaults of action.yml, GitHub's variables.


@dataclass
class ActionRun:
    code: int
    logs: str
    outputs: dict[str, str]
    step_summary: str
    seconds: float


def action_defaults(token: str) -> dict[str, str]:
    """INPUT_<NAME> for every input of action.yml with its default, as the runner sets them."""
    import yaml

    spec = yaml.safe_load((ROOT / "action.yml").read_text())
    env = {}
    for name, decl in spec["inputs"].items():
        default = str(decl.get("default", ""))
        env[f"INPUT_{name.upper()}"] = token if default == "${{ github.token }}" else default
    return env


def _read_outputs(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and "=" not in line.split("<<", 1)[0]:
            key, delim = line.split("<<", 1)
            j = lines.index(delim, i + 1)
            out[key] = "\n".join(lines[i + 1 : j])
            i = j + 1
            continue
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
        i += 1
    return out


def run_action(daemon: Daemon, image: str, workspace: Path, work: Path, event: dict[str, Any], inputs: dict[str, str], github: dict[str, str], token: str, timeout: float = 900) -> ActionRun:
    """Run the action's image on ``workspace`` for ``event``; ``github`` holds GITHUB_* values
    (API URL, repository, ...). The container uses the host's network to reach the fake GitHub
    on 127.0.0.1; the model builds it starts get no network at all."""
    import json

    home, commands, workflow = work / "_github_home", work / "_runner_file_commands", work / "_github_workflow"
    for d in (home, commands, workflow):
        d.mkdir(parents=True, exist_ok=True)
    (workflow / "event.json").write_text(json.dumps(event))
    (commands / "set_output").write_text("")
    (commands / "step_summary").write_text("")
    env = {
        **action_defaults(token),
        **{f"INPUT_{k.upper()}": v for k, v in inputs.items()},
        "HOME": "/github/home",
        "GITHUB_ACTIONS": "true", "CI": "true",
        "GITHUB_WORKSPACE": "/github/workspace",
        "GITHUB_EVENT_PATH": "/github/workflow/event.json",
        "GITHUB_OUTPUT": "/github/file_commands/set_output",
        "GITHUB_STEP_SUMMARY": "/github/file_commands/step_summary",
        "GITHUB_RUN_ID": "4242", "RUNNER_OS": "Linux", "RUNNER_TEMP": "/github/runner_temp",
        "ACTIONS_RUNTIME_TOKEN": "actions-runtime-secret-0123456789",  # GitHub passes it too
        **github,
    }  # fmt: skip
    client = daemon.client()
    started = time.monotonic()
    container = client.containers.create(
        image,
        environment=env,
        working_dir="/github/workspace",
        volumes={
            str(daemon.socket): {"bind": "/var/run/docker.sock", "mode": "rw"},
            str(home): {"bind": "/github/home", "mode": "rw"},
            str(workflow): {"bind": "/github/workflow", "mode": "rw"},
            str(commands): {"bind": "/github/file_commands", "mode": "rw"},
            str(workspace): {"bind": "/github/workspace", "mode": "rw"},
        },
        network_mode="host",
        labels={"io.shardproof.test": "action"},
    )
    try:
        container.start()
        code = int(container.wait(timeout=timeout).get("StatusCode", -1))
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
    finally:
        container.remove(force=True)
    return ActionRun(code, logs, _read_outputs(commands / "set_output"), (commands / "step_summary").read_text(), time.monotonic() - started)


def leftover_sandboxes(daemon: Daemon) -> list[str]:
    """Sandbox containers and volumes still on the daemon (there must be none after a run)."""
    client = daemon.client()
    label = "io.shardproof.sandbox"
    return [c.name for c in client.containers.list(all=True, filters={"label": label})] + [v.name for v in client.volumes.list(filters={"label": label})]


def image_layers(daemon: Daemon, image: str) -> list[str]:
    """The image's size and what each layer of it holds (``docker history``), biggest first."""
    client = daemon.client()
    total = client.images.get(image).attrs["Size"]
    rows = sorted((h for h in client.api.history(image) if h.get("Size")), key=lambda h: -h["Size"])
    return [f"image {image[:19]}: {total / 1e9:.2f} GB"] + [f"  {h['Size'] / 1e6:9.1f} MB  {' '.join(str(h.get('CreatedBy') or '').split())[:160]}" for h in rows]
