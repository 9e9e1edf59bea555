"""Resource limits: a layer whose e-graph explodes must end ``inconclusive`` with the layer named,
never ``verified`` and never by exhausting the runner's memory.

The exploding model: one layer that fans a tensor out through every permutation of its axes,
``depth`` times (fan**depth transposes per graph), and sums the leaves; the distributed graph is
the same except for its last op (abs instead of negate), so no proof exists and the rules must
saturate before they may say ``diverged``. Every baseline/distributed pair of transposes in the
fan-out relates through some bijective layout, so the layout family derives facts for all pairs:
the fact count grows with the square of the layer.

The node budget (``Budget.max_nodes``, e-graph rows) is also checked on a bare e-graph that
explodes by associativity/commutativity (``EXPLODING_RULES``): unbudgeted it grows ~2.2x per
iteration to 916k rows and ~1.1 GB (21 s) before it saturates.

Each check runs in a child process whose peak RSS the parent samples (and which it kills when it
overruns its time or a memory cap), so a blow-up never takes the test runner down with it.

``python tests/test_resource_limits.py scale`` prints time and memory for growing layers.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MEMORY_CAP_MB = 4096  # the child is killed above this: the runner must survive the test
# A budgeted run must stay far below the runner's memory. Measured 55-180 MB for every check here
# (the 3125-wide layer peaked at 2.2 GB while merging its facts before that merge shared each
# class's member set between the class's facts).
PEAK_MB_LIMIT = 512


def fanout_pair(depth: int, fan: int) -> tuple[str, str]:
    """(baseline, distributed) HLO text: layer 1 is the transpose fan-out, layer 2 the last op."""
    perms = list(itertools.permutations(range(3)))[:fan]
    lines = ['  x = f32[2,3,4] parameter(0), metadata={op_name="model.layers.0/x"}']
    frontier = [("x", (2, 3, 4))]
    k = 0
    for _ in range(depth):
        nxt = []
        for name, shape in frontier:
            for p in perms:
                k += 1
                s = tuple(shape[i] for i in p)
                lines.append(f"  t{k} = f32[{','.join(map(str, s))}] transpose({name}), dimensions={{{','.join(map(str, p))}}}, metadata={{op_name=\"model.layers.1/t\"}}")
                nxt.append((f"t{k}", s))
        frontier = nxt
    acc = ""
    for name, _ in frontier:
        k += 1
        lines.append(f'  r{k} = f32[24] reshape({name}), metadata={{op_name="model.layers.1/r"}}')
        if acc:
            lines.append(f'  a{k} = f32[24] add({acc}, r{k}), metadata={{op_name="model.layers.1/a"}}')
            acc = f"a{k}"
        else:
            acc = f"r{k}"
    head = "HloModule fanout\nENTRY main {\n" + "\n".join(lines)
    tail = 'ROOT out = f32[24] {op}({acc}), metadata={{op_name="model.layers.2/out"}}\n}}\n'
    return head + "\n  " + tail.format(op="negate", acc=acc), head + "\n  " + tail.format(op="abs", acc=acc)


# A bare e-graph that explodes: the rewrites put every bracketing and order of the sum of products
# into one e-class. Rows after iterations 8, 9, ...: 14k, 32k, 73k, 163k, 347k, 658k, 916k.
EXPLODING_RULES = """
(datatype E (Num i64) (Add E E) (Mul E E))
(rewrite (Add a b) (Add b a))
(rewrite (Add a (Add b c)) (Add (Add a b) c))
(rewrite (Mul a b) (Mul b a))
(rewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)))
"""


def exploding_term(depth: int) -> str:
    term = "(Num 0)"
    for i in range(1, depth + 1):
        term = f"(Add (Mul (Num {i}) {term}) (Num {i + 100}))"
    return term


RELATIONS = {"groups": [[0, 1]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}


def _own_peak_mb() -> int:
    """This process's peak resident memory since its exec (VmHWM). Not ru_maxrss: Linux keeps
    that across fork and exec, so a child of a big pytest process would report the parent's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _child(depth: int, fan: int, budget: dict[str, Any]) -> None:

    from shardproof.engine.analysis.verify import Budget, verify
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.relations import parse_relations

    base, dist = fanout_pair(depth, fan)
    t0 = time.perf_counter()
    res = verify(parse_relations(RELATIONS), parse_hlo(base), parse_hlo(dist), budget=Budget(workers=1, **budget))
    print(json.dumps({
        "verdict": res.verdict, "reason": res.reason, "seconds": time.perf_counter() - t0,
        "rss_mb": _own_peak_mb(),
        "instructions": len(dist.splitlines()) - 3, "timings": res.timings,
        "exhausted": res.stats.get("exhausted"), "nodes": res.stats.get("nodes"),
    }))


def _egraph_child(max_nodes: int) -> None:

    from shardproof.engine.analysis.egg import Session, split_forms

    session = Session(rule_files=())
    try:
        for form in split_forms(EXPLODING_RULES + f"(let $root {exploding_term(11)})"):
            session.command(form)
        stats = session.run(10**6, 120.0, max_nodes)
    finally:
        session.close()
    print(json.dumps({**vars(stats), "rss_mb": _own_peak_mb()}))


def run_isolated(depth: int, fan: int, budget: dict[str, Any], timeout: float) -> dict[str, Any]:
    """verify() on the fan-out pair in a child: its JSON report plus ``peak_mb`` sampled from
    outside; ``killed`` says why the parent ended it (timeout or memory cap) when it did."""
    return _isolated(["child", str(depth), str(fan), json.dumps(budget)], timeout)


def _isolated(args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status = Path(f"/proc/{proc.pid}/status")
    peak = 0
    killed = ""
    t0 = time.perf_counter()
    while proc.poll() is None:
        try:
            hwm = next((int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmHWM:")), 0)
            peak = max(peak, hwm // 1024)
        except (OSError, ValueError):
            pass
        if time.perf_counter() - t0 > timeout:
            killed = f"timeout after {timeout:.0f} s"
        elif peak > MEMORY_CAP_MB:
            killed = f"memory above {MEMORY_CAP_MB} MB"
        if killed:
            proc.kill()  # the child this function started, by its pid
            proc.wait()
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if killed:
        return {"killed": killed, "peak_mb": peak, "wall": wall}
    if proc.returncode != 0:
        return {"killed": f"exit code {proc.returncode}: {err[-800:]}", "peak_mb": peak, "wall": wall}
    report = json.loads(out.strip().splitlines()[-1])
    return {**report, "peak_mb": max(peak, report["rss_mb"]), "wall": wall, "killed": ""}


def test_iteration_budget_ends_inconclusive_naming_the_layer() -> None:
    r = run_isolated(3, 6, {"max_iterations": 40, "seconds": 60}, timeout=60)
    assert not r["killed"], r
    assert r["verdict"] == "inconclusive", r
    assert "budget exhausted in layer(s) 1: iteration budget (max_iterations=40)" in r["reason"]
    assert r["peak_mb"] < PEAK_MB_LIMIT


def test_time_budget_ends_inconclusive_naming_the_layer() -> None:
    r = run_isolated(4, 6, {"max_iterations": 10**6, "seconds": 0.05}, timeout=90)
    assert not r["killed"], r
    assert r["verdict"] == "inconclusive", r
    assert "budget exhausted in layer(s) 1: time budget (seconds=0.05)" in r["reason"]
    assert r["peak_mb"] < PEAK_MB_LIMIT


def test_node_budget_ends_inconclusive_naming_the_layer_and_the_budget() -> None:
    # Time and iterations to spare: this layer saturates at ~5.2k rows, so only the node budget
    # stops it, and never with a pass.
    r = run_isolated(3, 6, {"max_iterations": 10**6, "seconds": 60, "max_nodes": 4500}, timeout=60)
    assert not r["killed"], r
    assert r["verdict"] == "inconclusive", r
    assert "budget exhausted in layer(s) 1: node budget (max_nodes=4500)" in r["reason"], r["reason"]
    assert r["exhausted"] == "nodes", r
    assert 4500 < r["nodes"] < 2 * 4500, r  # stopped on the first check past the budget
    assert r["peak_mb"] < PEAK_MB_LIMIT


def test_node_budget_stops_a_wide_layer_whatever_the_time_budget() -> None:
    # The 3125-wide layer (17.7k instructions, 48k rows when loaded) saturates at 64k rows.
    r = run_isolated(5, 5, {"max_iterations": 10**6, "seconds": 600, "max_nodes": 50_000}, timeout=60)
    assert not r["killed"], r
    assert r["verdict"] == "inconclusive", r
    assert "budget exhausted in layer(s) 1: node budget (max_nodes=50000)" in r["reason"], r["reason"]
    assert r["peak_mb"] < PEAK_MB_LIMIT, r


def test_node_budget_bounds_the_memory_of_an_exploding_egraph() -> None:
    # Unbudgeted: 916k rows, ~1.1 GB. Checked only between chunks of 8 iterations, the budget
    # would let the second chunk (iterations 9-16) run to the end; the chunk shrinks as the graph
    # nears the budget, so it ends one iteration (~2.2x) past it: 163k rows, ~130 MB.
    r = _isolated(["egraph", "100000"], timeout=60)
    assert not r["killed"], r
    assert (r["saturated"], r["exhausted"]) == (False, "nodes"), r
    assert 100_000 < r["nodes"] <= 2.5 * 100_000, r
    assert r["peak_mb"] < 256, r


def test_enough_budget_finds_the_divergence() -> None:
    # The same model with room to saturate: the abs/negate difference is found, so the budget
    # (not the model) is what made the other answers inconclusive.
    r = run_isolated(3, 4, {"max_iterations": 10**6, "seconds": 60}, timeout=90)
    assert r["verdict"] == "diverged", r


def test_budget_bounds_time_and_memory_of_an_exploding_layer() -> None:
    r = run_isolated(5, 5, {"max_iterations": 10**6, "seconds": 1.0}, timeout=12)
    assert not r["killed"], r
    assert r["verdict"] in ("inconclusive", "diverged"), r
    assert r["peak_mb"] < PEAK_MB_LIMIT, r


def _scale() -> None:
    print(f"{'depth':>5} {'fan':>4} {'instr':>7} {'budget_s':>8} {'verdict':>13} {'wall_s':>7} {'peak_MB':>8}  timings")
    for depth, fan, secs in ((3, 6, 2.0), (4, 5, 2.0), (4, 6, 2.0), (5, 4, 2.0), (5, 5, 2.0), (5, 6, 2.0)):
        r = run_isolated(depth, fan, {"max_iterations": 10**6, "seconds": secs}, timeout=300)
        timings = {k: round(v, 1) for k, v in r.get("timings", {}).items()}
        instr = len(fanout_pair(depth, fan)[1].splitlines()) - 3
        print(f"{depth:5d} {fan:4d} {instr:7d} {secs:8.1f} {r.get('verdict', r['killed'])[:13]:>13} {r['wall']:7.1f} {r['peak_mb']:8d}  {timings}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        _child(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]))
    elif sys.argv[1:2] == ["egraph"]:
        _egraph_child(int(sys.argv[2]))
    elif sys.argv[1:2] == ["scale"]:
        _scale()
