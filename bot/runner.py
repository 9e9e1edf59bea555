"""The one seam between the bot and the models: something that returns the run's result document.

The bot never analyses anything itself. In a pull request run it asks the front end to build and
verify the declared models; in the fork-safe ``workflow_run`` split (and for ``--result``) it reads
the document an earlier, unprivileged run wrote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class RunnerError(Exception):
    """The models could not be run at all (the commit status becomes ``error``)."""


class Runner(Protocol):
    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        """Build and verify the models; return the result document (also written to out_dir)."""
        ...


class FrontendRunner:
    """``shardproof.engine.frontend.runner.run_models``: front end plus verifier, per model."""

    def run(self, config: Path, out_dir: Path, models: list[str] | None) -> dict[str, Any]:
        try:
            from shardproof.engine.frontend.runner import run_models
        except ImportError as e:
            raise RunnerError(f"the front end is not available in this installation ({e})") from e
        if not config.exists():
            raise RunnerError(f"the configuration {config} does not exist")
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
