"""``framework: jax`` models: build every declared model in one JAX process, check each pair.

    python -m shardproof.engine.frontend.jax run --config examples/jax/.shardproof.yml [--models a,b] [--out DIR]

The configuration is ``.shardproof.yml``'s format with ``framework: jax``: ``version``,
``python_path``, ``defaults`` (``devices``: virtual CPU devices, default 8; ``size`` knobs;
``verify`` budgets) and ``models`` (``name``, ``entry``, ``variant``, ``expect``, ``size``,
``description``, ``reference``). The build runs in a child process (``XLA_FLAGS`` must be set
before jax starts); the checks run here, through the same ``check_files`` as ``shardproof
check`` (numeric witness included). One row per model; ``DIR/result.json`` holds every result;
exit 0 when every model is as expected, 1 when one is not, 2 when one failed to build, 3 for a
bad configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from ...errors import InputError

MODEL_KEYS = {"name", "entry", "variant", "expect", "size", "description", "reference", "verify"}
TOP_KEYS = {"version", "framework", "python_path", "defaults", "models"}
EXPECT = ("verified", "diverged", "unproven", "unsupported", "inconclusive")


def load(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise InputError(str(path), "", f"cannot read the configuration: {e}") from e
    if not isinstance(data, dict) or data.get("framework") != "jax":
        raise InputError(str(path), "framework", "expected `framework: jax` (torch models go to `shardproof run`)")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise InputError(str(path), sorted(unknown)[0], f"unknown key; expected one of {sorted(TOP_KEYS)}")
    defaults = data.get("defaults") or {}
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise InputError(str(path), "models", "expected a non-empty list of models")
    seen: set[str] = set()
    out = []
    for i, m in enumerate(models):
        key = f"models[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not isinstance(m.get("entry"), str) or ":" not in m["entry"]:
            raise InputError(str(path), key, "expected a mapping with name and entry (module:function)")
        bad = set(m) - MODEL_KEYS
        if bad:
            raise InputError(str(path), f"{key}.{sorted(bad)[0]}", f"unknown key; expected one of {sorted(MODEL_KEYS)}")
        if m["name"] in seen:
            raise InputError(str(path), f"{key}.name", f"model name {m['name']!r} is used twice")
        if m.get("expect", "verified") not in EXPECT:
            raise InputError(str(path), f"{key}.expect", f"expected one of {EXPECT}, got {m.get('expect')!r}")
        seen.add(m["name"])
        out.append({**m, "size": {**(defaults.get("size") or {}), **(m.get("size") or {})}, "own_size": sorted(m.get("size") or {}),
                    "verify": {**(defaults.get("verify") or {}), **(m.get("verify") or {})}})
    root = path.parent
    return {"models": out, "devices": int(defaults.get("devices", 8)), "python_path": [str((root / p).resolve()) for p in data.get("python_path", ["."])], "root": root}


def build(cfg: dict[str, Any], models: list[dict[str, Any]], out: Path, timeout: float = 1800) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dump = out / ".xla_dump"
    shutil.rmtree(dump, ignore_errors=True)  # XLA numbers modules from 0 again in every process
    plan = {"dump": str(dump), "python_path": cfg["python_path"],
            "models": [{**m, "out": str(out / m["name"])} for m in models]}
    (out / "build_plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={cfg['devices']} --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"}
    with open(out / "build.log", "w") as log:
        subprocess.run([sys.executable, "-m", "shardproof.engine.frontend.jax.build", str(out / "build_plan.json")], env=env, stdout=log, stderr=log, timeout=timeout, cwd=str(cfg["root"]))


def check(m: dict[str, Any], out: Path, witness: str = "auto") -> dict[str, Any]:
    from ...analysis.check import check_files
    from ...analysis.verify import Budget
    from ...relations import load_relations

    d = out / m["name"]
    status = json.loads((d / "build.json").read_text()) if (d / "build.json").exists() else {"ok": False, "error": "the build process wrote nothing (see build.log)"}
    row: dict[str, Any] = {"model": m["name"], "expect": m.get("expect", "verified"), "description": status.get("description") or m.get("description", "")}
    if not status.get("ok"):
        return {**row, "verdict": "build-failed", "reason": status.get("error", ""), "as_expected": False, "seconds": 0.0}
    names = {"timeout": "seconds", "max_iterations": "max_iterations", "max_nodes": "max_nodes", "partition": "partition", "fold": "fold"}
    budget = Budget(**{names[k]: v for k, v in m.get("verify", {}).items() if k in names})
    t = time.perf_counter()
    try:
        result = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", budget=budget, witness=witness)
    except InputError as e:
        return {**row, "verdict": "bad-input", "reason": str(e), "as_expected": False, "seconds": time.perf_counter() - t}
    seconds = time.perf_counter() - t
    first = ""
    for dv in result.divergences[:1]:
        src = dv.get("source") or {}
        f = str(src.get("file", "?"))
        if os.path.isabs(f):  # JAX records absolute paths; the table shows them from here
            f = os.path.relpath(f)
        first = f"{f}:{src.get('line', '?')}" if src else "<no source>"
    return {**row, "verdict": result.verdict, "reason": result.reason, "as_expected": result.verdict == row["expect"], "seconds": seconds,
            "first_divergence": first, "result": result.to_json()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m shardproof.engine.frontend.jax", description=__doc__.split("\n", 1)[0])
    ap.add_argument("command", choices=["run", "build"])
    ap.add_argument("--config", default=".shardproof.yml")
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default="shardproof-report")
    ap.add_argument("--witness", choices=["auto", "always", "never"], default="auto")
    ns = ap.parse_args(argv)
    try:
        cfg = load(Path(ns.config))
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    wanted = [s for s in ns.models.split(",") if s]
    models = [m for m in cfg["models"] if not wanted or m["name"] in wanted]
    out = Path(ns.out)
    t = time.perf_counter()
    build(cfg, models, out)
    print(f"built {len(models)} model(s) in {time.perf_counter() - t:.1f} s (log: {out / 'build.log'})")
    if ns.command == "build":
        return 0
    rows = []
    width = max([len("model"), *(len(m["name"]) for m in models)])
    print(f"{'model':{width}} {'verdict':13} {'expected':9} {'time':>7}  first divergence")
    for m in models:
        r = check(m, out, ns.witness)
        rows.append(r)
        print(f"{r['model']:{width}} {r['verdict']:13} {'yes' if r['as_expected'] else 'NO':9} {r['seconds']:6.2f}s  {r.get('first_divergence') or ''}"
              + ("" if r["verdict"] not in ("build-failed", "bad-input") else f"  {r['reason'][:200]}"), flush=True)
    (out / "result.json").write_text(json.dumps({"models": rows}, indent=1, default=str))
    if any(r["verdict"] == "build-failed" for r in rows):
        return 2
    return 0 if all(r["as_expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
