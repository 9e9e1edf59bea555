"""A small user repository, as a real git history, for the bot's end-to-end tests.

It is what a team using shardproof would have: its own tensor-parallel block (a column-parallel
``fc1``, a row-parallel ``fc2`` whose partial sums one all-reduce completes), a second model, and
a ``.shardproof.yml``. The commits are the pull requests of the scenarios:

- ``base``: both models correct — the block verifies; the scaled model computes its scale by an
  identity no rule encodes (sin² + cos² = 1), so it is ``unproven`` (numerically equal);
- ``bug``: the all-reduce is dropped on its own line, the canonical bug
  (``out = all_reduce(self.fc2(h), self.groups)`` becomes ``out = self.fc2(h)``);
- ``deleted``: the all-reduce was a line of its own, and the pull request deletes it;
- ``fix``: the bug branch with the all-reduce restored;
- ``typo_key``: ``.shardproof.yml`` with ``expcet:`` for ``expect:``;
- ``typo_entry``: an ``entry:`` naming a module that does not exist.

``files(repo, a, b)`` gives GitHub's "list pull request files" entries for ``a..b`` from
``git diff`` (the patch is the hunks only, as the API sends it).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

BLOCK = '''"""Our tensor-parallel MLP block."""

import torch
import torch.nn as nn
import torch_xla

from shardproof.engine.frontend.declare import BuildContext, Input, Model


def all_reduce(x, groups):
    return torch_xla._XLAC._xla_spmd_all_reduce("sum", x, 1.0, groups)


class Block(nn.Module):
    def __init__(self, hidden, ffn, tp, groups):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn // tp)
        self.fc2 = nn.Linear(ffn // tp, hidden, bias=False)
        self.groups = groups

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        out = all_reduce(self.fc2(h), self.groups)
        return x + out


class Scaled(nn.Module):
    def __init__(self, hidden, tp, groups):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.tp, self.groups = tp, groups

    def forward(self, x):
        y = torch.exp(self.proj(x))
        if self.tp > 1:
            # The sharded path rescales by a unit factor (sin^2 + cos^2 = 1).
            y = y * (torch.sin(x) ** 2 + torch.cos(x) ** 2)
        return y


def block(ctx: BuildContext) -> Model:
    hidden, ffn = ctx.knob("hidden", 16), ctx.knob("ffn", 32)
    return Model(
        baseline=Block(hidden, ffn, 1, [[0]]),
        distributed=lambda rank: Block(hidden, ffn, ctx.tp, ctx.groups),
        inputs=[Input("x", (4, hidden))],
        plan={"fc1": "colwise", "fc2": "rowwise"},
    )


def scaled(ctx: BuildContext) -> Model:
    hidden = ctx.knob("hidden", 16)
    return Model(
        baseline=Scaled(hidden, 1, [[0]]),
        distributed=lambda rank: Scaled(hidden, ctx.tp, ctx.groups),
        inputs=[Input("x", (4, hidden))],
        plan={},
    )
'''

CONFIG = """# The models CI verifies on every pull request.
version: 1
python_path: ["."]

defaults:
  tp: 2
  timeout: 300
  memory_mb: 4096

models:
  - name: block
    entry: mlp:block
    expect: verified
  - name: scaled
    entry: mlp:scaled
    expect: verified
"""

BUG_LINE = 23  # `out = all_reduce(self.fc2(h), self.groups)` in mlp.py
USE_LINE = 24  # `return x + out`: where the programs first differ


def _git(repo: Path, *args: str, raw: bool = False) -> str:
    env = {"GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.com", "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.com",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout
    # A diff's last context line may be a lone space: only the final newline goes.
    return out.removesuffix("\n") if raw else out.strip()


def _commit(repo: Path, files: dict[str, str], message: str, parent: str | None = None) -> str:
    if parent is not None:
        _git(repo, "checkout", "-q", "--detach", parent)
    for name, text in files.items():
        (repo / name).write_text(text)
    _git(repo, "add", *files)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def make(repo: Path) -> dict[str, str]:
    """Create the repository; returns the commit of each scenario by name."""
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q", "-b", "main")
    assert BLOCK.splitlines()[BUG_LINE - 1].strip() == "out = all_reduce(self.fc2(h), self.groups)"
    assert BLOCK.splitlines()[USE_LINE - 1].strip() == "return x + out"
    shas = {"base": _commit(repo, {"mlp.py": BLOCK, ".shardproof.yml": CONFIG}, "two models")}
    bug = BLOCK.replace("out = all_reduce(self.fc2(h), self.groups)", "out = self.fc2(h)")
    shas["bug"] = _commit(repo, {"mlp.py": bug}, "drop the all-reduce", shas["base"])
    shas["fix"] = _commit(repo, {"mlp.py": BLOCK}, "restore the all-reduce", shas["bug"])
    two = BLOCK.replace("        out = all_reduce(self.fc2(h), self.groups)\n", "        out = self.fc2(h)\n        out = all_reduce(out, self.groups)\n")
    shas["two_lines"] = _commit(repo, {"mlp.py": two}, "the all-reduce on a line of its own", shas["base"])
    shas["deleted"] = _commit(repo, {"mlp.py": two.replace("        out = all_reduce(out, self.groups)\n", "")}, "delete the all-reduce line", shas["two_lines"])
    shas["typo_key"] = _commit(repo, {".shardproof.yml": CONFIG.replace("    expect: verified\n  - name: scaled", "    expcet: verified\n  - name: scaled")}, "typo", shas["base"])
    shas["typo_entry"] = _commit(repo, {".shardproof.yml": CONFIG.replace("entry: mlp:block", "entry: mpl:block")}, "typo", shas["base"])
    _git(repo, "checkout", "-q", "--detach", shas["base"])
    return shas


def checkout(repo: Path, sha: str) -> None:
    _git(repo, "checkout", "-q", "--detach", sha)


def files(repo: Path, base: str, head: str) -> list[dict[str, Any]]:
    """GitHub's pull request file entries for base..head, patches from ``git diff``."""
    out = []
    for line in _git(repo, "diff", "--name-status", base, head).splitlines():
        status, name = line.split("\t", 1)
        diff = _git(repo, "diff", "-U3", base, head, "--", name, raw=True)
        # The API's patch is the hunks only: no "diff --git", "index", "---" or "+++" lines.
        patch = diff[diff.index("@@") :] if "@@" in diff else ""
        out.append({"filename": name, "status": {"M": "modified", "A": "added", "D": "removed"}[status[0]], "patch": patch,
                    "additions": len(re.findall(r"^\+", patch, re.M)), "deletions": len(re.findall(r"^-", patch, re.M))})
    return out


def calls(fake: Any, start: int = 0) -> list[str]:
    """The API calls, as the report shows them: method, path and the key fields of the body."""
    out = []
    for r in fake.log[start:]:
        b = r.body if isinstance(r.body, dict) else {}
        keys = {k: b[k] for k in ("event", "state", "conclusion", "context") if k in b}
        if b.get("comments"):
            keys["comments"] = [(c["path"], c["line"], c["side"]) for c in b["comments"]]
        if "message" in b and r.method == "PUT":
            keys["message"] = b["message"]
        if isinstance(b.get("output"), dict):
            keys["title"] = b["output"].get("title")
            keys["annotations"] = [(a["path"], a["start_line"], a["annotation_level"]) for a in b["output"].get("annotations") or []]
        out.append(f"{r.method} {r.path}" + (f" {keys}" if keys else ""))
    return out
