"""Regenerate tests/golden/fixture/: a frozen result document and the HLO artifacts it names.

The golden renderings must change only when the templates do, not when the pairs under
tests/pairs are regenerated, so the fixture is a copy: ``python tests/golden/make_fixture.py``.
The source files the findings quote are copied too (``fixture/workspace/``, the checked-out
repository as the bot sees it). Each model's ``witness`` is real: the pair executed by XLA's CPU
runtime (shardproof.engine.witness), written in the result contract's shape. ``fused_block_pad``
(tests/gaps, an open rule gap: correct, not proven) is the unproven model.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import bot_support as bs  # noqa: E402

from shardproof.engine.analysis.verify import verify  # noqa: E402
from shardproof.engine.hlo.parser import parse_hlo_file  # noqa: E402
from shardproof.engine.relations import load_relations  # noqa: E402
from shardproof.engine.sourcemap import SourceMap  # noqa: E402
from shardproof.engine.witness.pair import Probe, witness  # noqa: E402

FIXTURE = HERE / "fixture"
MODELS = ("mlp_tp4", "bug_missing_allreduce", "bug_bsh_layout", "bug_wrong_groups")
GAP = "fused_block_pad"  # tests/gaps: correct, but the rules stop (an open gap)
SOURCES = ("tests/pairs/models.py", "tests/gaps/models.py")


def witness_entry(folder: Path, rel: str, divergences: list[dict[str, Any]], probe: bool = True) -> dict[str, Any]:
    """The pair executed on the default seeds; with ``probe``, each divergence with a baseline
    counterpart is also compared there (numeric localization, relation inferred)."""
    relations = yaml.safe_load((folder / "relations.yaml").read_text())
    probes = [Probe(d["instruction"].lstrip("%"), (d.get("baseline_counterpart") or "").split(" ", 1)[0].lstrip("%") or None) for d in divergences] if probe else []
    rep = witness((folder / "baseline.hlo").read_text(), (folder / "distributed.hlo").read_text(), relations, probes=probes)
    for k, d in enumerate(divergences):
        p = probes[k] if probes else None
        d["numeric"] = {"holds": bool(p.holds), "detail": p.detail} if p is not None and p.holds is not None else None

    def value(v: Any) -> Any:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v

    outputs = [{
        "output": k, "relation": c.relation, "equal": bool(c.allclose), "dtype": c.dtype,
        "max_abs_err": float(c.max_abs_diff), "max_rel_err": float(c.max_rel_diff),
        "index": [int(i) for i in c.index] if c.index is not None else [], "rank": c.rank,
        "baseline_value": value(c.baseline_value), "distributed_value": value(c.distributed_value),
    } for k, c in enumerate(rep.outputs)]  # fmt: skip
    return {
        "status": "equal" if rep.equal else "confirmed",
        "reason": "" if rep.equal else f"output(s) {', '.join(str(o['output']) for o in outputs if not o['equal'])} differ",
        "seeds": list(rep.seeds if rep.equal else [rep.seed]),
        "trials": rep.trials,
        "seconds": 0.5,  # frozen: the goldens must not change with the machine's speed
        "command": f"shardproof check {rel}/baseline.hlo {rel}/distributed.hlo --relations {rel}/relations.yaml --witness always",
        "outputs": outputs,
    }


def gap_model() -> dict[str, Any]:
    d = bs.ROOT / "tests" / "gaps" / GAP
    res = verify(load_relations(d / "relations.yaml"), parse_hlo_file(d / "baseline.hlo"), parse_hlo_file(d / "distributed.hlo"), SourceMap.load(d / "sourcemap.json")).to_json()
    res["verdict"], res["reason"] = "unproven", "the rules stopped before a proof; the witness found every output numerically equal"
    for x in res["divergences"]:
        x["kind"] = "rule-gap"
    res["witness"] = witness_entry(d, f"tests/gaps/{GAP}", res["divergences"], probe=False)
    assert res["witness"]["status"] == "equal", res["witness"]
    rel = f"tests/gaps/{GAP}"
    return {"name": GAP, "status": "unproven", "seconds": 1.25, "build": {"seconds": 0.0, "peak_rss_mb": 0.0, "error": None}, "result": res,
            "artifacts": {"baseline": f"{rel}/baseline.hlo", "distributed": f"{rel}/distributed.hlo", "relations": f"{rel}/relations.yaml", "sourcemap": f"{rel}/sourcemap.json"}}  # fmt: skip


def main() -> None:
    if FIXTURE.exists():
        shutil.rmtree(FIXTURE)
    models = []
    for rel in SOURCES:
        target = FIXTURE / "workspace" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bs.ROOT / rel, target)
    for name in (*MODELS, GAP):
        m = bs.model(name) if name != GAP else gap_model()
        m["seconds"] = 1.25
        m["result"]["timings"] = {}
        if name != GAP:
            for x in m["result"]["divergences"]:
                x["kind"] = "divergence"
            m["result"]["witness"] = witness_entry(bs.ROOT / m["artifacts"]["baseline"].rsplit("/", 1)[0], m["artifacts"]["baseline"].rsplit("/", 1)[0], m["result"]["divergences"])
            m["result"]["error"] = None
        folder = FIXTURE / name
        folder.mkdir(parents=True)
        beside = bs.ROOT / m["artifacts"]["baseline"].rsplit("/", 1)[0] / "baseline.sourcemap.json"
        if beside.is_file():
            m["artifacts"]["baseline_sourcemap"] = str(beside.relative_to(bs.ROOT))
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
    models.append({
        "name": "train_step_tp4", "status": "error", "seconds": 0.9,
        "build": {"seconds": 0.6, "peak_rss_mb": 300.0, "error": None},
        "result": {"verdict": "error", "reason": "internal error", "outputs": [], "divergences": [], "unsupported": [], "trace": [], "bijections": [], "stats": {}, "timings": {}, "witness": None,
                   "error": {"phase": "saturate", "where": "layer 1 of 2", "message": "AssertionError: a relation row names an e-class that is not in the graph"}},
        "artifacts": {},
    })  # fmt: skip
    doc = bs.run_doc(*models)
    (FIXTURE / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {FIXTURE.relative_to(bs.ROOT)}")


if __name__ == "__main__":
    main()
