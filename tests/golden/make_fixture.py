"""Regenerate tests/golden/fixture/: a frozen result document and the HLO artifacts it names.

The golden renderings must change only when the templates do, not when the pairs under
tests/pairs are regenerated, so the fixture is a copy: ``python tests/golden/make_fixture.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bot_support as bs  # noqa: E402

FIXTURE = HERE / "fixture"
MODELS = ("mlp_tp4", "bug_missing_allreduce", "bug_bsh_layout", "bug_wrong_groups")


def main() -> None:
    if FIXTURE.exists():
        shutil.rmtree(FIXTURE)
    models = []
    for name in MODELS:
        m = bs.model(name)
        m["seconds"] = 1.25
        m["result"]["timings"] = {}
        folder = FIXTURE / name
        folder.mkdir(parents=True)
        for key, path in m["artifacts"].items():
            target = folder / Path(path).name
            shutil.copy(bs.ROOT / path, target)
            m["artifacts"][key] = f"{name}/{target.name}"  # relative to result.json
        models.append(m)
    models.append(bs.build_failed("llama_tp8", "Traceback (most recent call last):\n  File \"models/llama.py\", line 12, in <module>\n    from flash_attn import flash_attn_func\nModuleNotFoundError: No module named 'flash_attn'"))
    models.append({
        "name": "moe_experts", "status": "unsupported", "seconds": 0.4,
        "build": {"seconds": 0.3, "peak_rss_mb": 210.0, "error": None},
        "result": {"verdict": "unsupported", "reason": "distributed %custom-call.12 (custom-call): no rules for custom-call target 'MegaBlocksGMM'",
                   "outputs": [], "divergences": [], "trace": [], "bijections": [], "stats": {}, "timings": {},
                   "unsupported": [{"side": "distributed", "instruction": "custom-call.12", "opcode": "custom-call", "reason": "no rules for custom-call target 'MegaBlocksGMM'", "line": 40}]},
        "artifacts": {},
    })  # fmt: skip
    doc = bs.run_doc(*models)
    (FIXTURE / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {FIXTURE.relative_to(bs.ROOT)}")


if __name__ == "__main__":
    main()
