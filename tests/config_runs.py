"""A .shardproof.yml a test writes from a template and runs: the template names the repository
(``{root}``), ``examples/`` (``{examples}``) and any test project by JSON strings, since those
paths are known only at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shardproof.engine.frontend.runner import run_models

ROOT = Path(__file__).resolve().parents[1]

# The head of a template for tplm models at TP 4 (its `size:` and `models:` follow).
TPLM_HEAD = """\
version: 1
root: {root}
python_path: [{examples}]
hide_frames: ["examples/tplm/parallel.py"]
defaults:
  tp: 4
  timeout: 300
  memory_mb: 4096
"""


def run_template(folder: Path, filename: str, template: str, verify: bool = True, **paths: Path) -> tuple[dict[str, Any], Path]:
    """Write ``template`` as ``folder/filename`` and run it (builds, and checks unless
    ``verify`` is false) into ``folder/out``: the runner's summary and that folder."""
    fields = {"root": ROOT, "examples": ROOT / "examples", **paths}
    config = folder / filename
    config.write_text(template.format(**{k: json.dumps(str(v)) for k, v in fields.items()}))
    out = folder / "out"
    return run_models(config, out, verify=verify), out
