"""The one seam between the bot and the models: something that returns the run's result document.

The bot never analyses anything itself. In a pull request run it asks the front end to build and
verify the declared models; in the fork-safe ``workflow_run`` split (and for ``--result``) it reads
the document an earlier, unprivileged run wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol


class RunnerError(Exception):
    """The models could not be run at all (the commit status becomes ``error``)."""


class Runner(Protocol):
    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        """Build and verify the models; return the result document (also written to out_dir)."""
        ...


# Variables a build must never see: tokens, the action's inputs (any of them may be a secret),
# the runner's ACTIONS_* credentials (cache and artifact service tokens).
_SECRET_NAME = re.compile(r"^(INPUT_|ACTIONS_)|TOKEN|SECRET|PASSWORD|CREDENTIAL|_KEY$|^GH_|^GITHUB_PAT")


@contextlib.contextmanager
def scrubbed_environ(secrets: Iterable[str] = ()) -> Iterator[list[str]]:
    """Remove secret-looking variables (by name, or by value equal to a known secret) from this
    process's environment while the block runs, so the build workers it starts do not inherit
    them; restores them after. Yields the names removed."""
    values = {s for s in secrets if s}
    removed = {k: v for k, v in os.environ.items() if _SECRET_NAME.search(k.upper()) or v in values}
    for k in removed:
        del os.environ[k]
    try:
        yield sorted(removed)
    finally:
        os.environ.update(removed)


class FrontendRunner:
    """``shardproof.engine.frontend.runner.run_models``: front end plus verifier, per model, in
    worker subprocesses of this process (no sandbox: see ``sandbox.py``).

    ``notice`` says why the builds are not sandboxed, for the report. Secret-looking variables
    are kept from the workers' environment; that is hygiene, not isolation — a worker runs as
    this user and could still read this process's memory.
    """

    def __init__(self, notice: str | None = None, secrets: Iterable[str] = ()) -> None:
        self.notice = notice
        self.secrets = list(secrets)

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        try:
            from shardproof.engine.frontend.runner import run_models
        except ImportError as e:
            raise RunnerError(f"the front end is not available in this installation ({e})") from e
        if not config.exists():
            raise RunnerError(f"the configuration {config} does not exist")
        with scrubbed_environ(self.secrets):
            return run_models(config, out_dir, models)


class ResultFileRunner:
    """A result document written earlier (``shardproof run``, or an artifact of another job)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except OSError as e:
            raise RunnerError(f"cannot read {self.path}: {e.strerror}") from e
        except json.JSONDecodeError as e:
            raise RunnerError(f"{self.path} is not JSON ({e.msg} at line {e.lineno})") from e
        if not isinstance(doc, dict):
            raise RunnerError(f"{self.path} does not hold a result document")
        if models and isinstance(doc.get("models"), list):
            doc["models"] = [m for m in doc["models"] if isinstance(m, dict) and m.get("name") in models]
        return doc
