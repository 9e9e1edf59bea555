"""A model whose code attacks the job that builds it — reads the token, phones the GitHub API,
writes into the workspace — before building a correct MLP (or its missing-all-reduce bug).

Each probe prints ``PROBE <name>: blocked (<why>)`` or ``PROBE <name>: ESCAPED (<what>)`` into
the build log. If any probe escaped, the build raises, so a leaking sandbox can never look like
a clean run: the model becomes build-failed and the log says what leaked.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch_xla
from torch import Tensor

from shardproof.engine.frontend.declare import BuildContext, Input, Model

# What a GitHub token or the runner's credentials look like, by name and by value.
SECRET_NAMES = ("GITHUB_TOKEN", "GH_TOKEN", "INPUT_GITHUB-TOKEN", "ACTIONS_RUNTIME_TOKEN", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")
SECRET_VALUES = ("ghs_", "ghp_", "github_pat_", "actions-runtime-secret")


def _token() -> str | None:
    found = [f"${k}" for k, v in os.environ.items() if k in SECRET_NAMES or k.startswith(("INPUT_", "ACTIONS_")) or any(s in v for s in SECRET_VALUES)]
    for proc in Path("/proc").iterdir():  # every process this code can see, its environment
        if not proc.name.isdigit():
            continue
        try:
            data = (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(s.encode() in data for s in SECRET_VALUES):
            found.append(f"/proc/{proc.name}/environ")
    if Path("/var/run/docker.sock").exists():
        found.append("/var/run/docker.sock")  # the daemon's socket is root on the host
    return ", ".join(found) if found else None


def _network(host: str, port: int) -> str | None:
    escaped = []
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(b"GET /pwned HTTP/1.0\r\nHost: x\r\n\r\n")
            s.recv(64)
        escaped.append(f"connected to {host}:{port}")
    except OSError as e:
        print(f"PROBE network {host}:{port}: blocked ({type(e).__name__}: {e})")
    try:
        socket.getaddrinfo("api.github.com", 443)
        escaped.append("resolved api.github.com")
    except OSError as e:
        print(f"PROBE network dns: blocked ({type(e).__name__}: {e})")
    return ", ".join(escaped) if escaped else None


def _write(root: Path) -> str | None:
    escaped = []
    for target, mode in ((root / "pwned.txt", "w"), (root / ".shardproof.yml", "a"), (root / "hostile.py", "a")):
        try:
            with open(target, mode) as f:
                f.write("\n# pwned\n")
            escaped.append(f"wrote {target.name}")
        except OSError as e:
            print(f"PROBE write {target.name}: blocked ({type(e).__name__}: {e})")
    return ", ".join(escaped) if escaped else None


def attack(host: str, port: int) -> None:
    escaped = []
    token = _token()
    print("PROBE token: " + (f"ESCAPED ({token})" if token else "blocked (no token in any visible environment, no Docker socket)"))
    print("PROBE environment:", " ".join(sorted(os.environ)))
    for leak in (f"token: {token}" if token else None, _network(host, port), _write(Path(__file__).resolve().parent)):
        if leak:
            escaped.append(leak)
            print(f"PROBE ESCAPED ({leak})")
    if escaped:
        raise RuntimeError("sandbox escape: " + "; ".join(escaped))


class MLP(nn.Module):
    def __init__(self, hidden: int, tp: int, groups: list[list[int]], bug: bool = False) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, 2 * hidden // tp)
        self.down = nn.Linear(2 * hidden // tp, hidden, bias=False)
        self.tp, self.groups, self.bug = tp, groups, bug

    def forward(self, x: Tensor) -> Tensor:
        y = self.down(torch.relu(self.up(x)))
        if self.tp > 1 and not self.bug:
            y = torch_xla._XLAC._xla_spmd_all_reduce("sum", y, 1.0, self.groups)
        return x + y  # BUG-SITE: missing_allreduce


def model(ctx: BuildContext) -> Model:
    hidden = ctx.knob("hidden", 16)
    attack(ctx.knob("host", "127.0.0.1"), ctx.knob("port", 9))
    # A build that outlasts its cap whatever the import of torch-xla costs on this machine.
    time.sleep(ctx.knob("stall_seconds", 0))
    return Model(
        baseline=MLP(hidden, 1, [[0]]),
        distributed=lambda rank: MLP(hidden, ctx.tp, ctx.groups, ctx.variant == "missing_allreduce"),
        inputs=[Input("x", (4, hidden))],
        plan={"up": "colwise", "down": "rowwise"},
    )


def raises(ctx: BuildContext) -> Model:
    raise RuntimeError("the model's constructor failed on purpose")
