"""The law-family registry (engine/analysis/laws): every rules file is registered once (the loader
checks the order: a file using a relation declared later fails to load); every family fills only
tables a registered rules file declares, and no two families fill the same table; graph.py
builds terms and iterates the registry without naming a family. A newcomer's family that skips
its registry line, or a move that leaves a hand-wired table behind, fails here."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

from shardproof.engine.analysis import egg, graph, laws

ROOT = Path(__file__).resolve().parents[1]
DECL = re.compile(r"^\((?:relation|function|constructor|sort)\s+([^\s()]+)", re.M)


def _declared(name: str) -> set[str]:
    text = egg.rule_text(name)
    out = set(DECL.findall(text))
    for form in egg.split_forms(text):  # datatype variants are constructors too
        if form.startswith("(datatype"):
            out.update(re.findall(r"\(\s*([A-Za-z][\w-]*)", form[1:]))
    return out


def test_every_rules_file_is_registered_once_in_load_order() -> None:
    shipped = sorted(p.name for p in resources.files("shardproof.rules").iterdir() if p.name.endswith(".egg"))
    registered = [f.rules for f in laws.FAMILIES]
    assert sorted(registered) == shipped, set(shipped) ^ set(registered)
    assert tuple(registered) == egg.RULE_FILES
    assert len({f.name for f in laws.FAMILIES}) == len(laws.FAMILIES)


def test_each_family_fills_declared_tables_of_its_own() -> None:
    seen: dict[str, str] = {}
    declared = {t for fam in laws.FAMILIES for t in _declared(fam.rules)}
    for fam in laws.FAMILIES:
        for t in fam.tables:
            assert t in declared, f"family {fam.name}: table {t} is declared by no registered rules file"
            assert t not in seen, f"table {t} is filled by both {seen[t]} and {fam.name}"
            seen[t] = fam.name
        if fam.tables:
            assert fam.instruction_rows or fam.walk or fam.graph_rows or fam.name == "a2adup", f"family {fam.name} lists tables but no hook fills them"
    assert not set(seen) & set(graph.ROW_TABLES)


def test_graph_names_no_family() -> None:
    tree = ast.parse((ROOT / "engine/analysis/graph.py").read_text())
    build = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build")
    called = {n.func.id for n in ast.walk(build) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert called <= {"Graphs", "set", "len", "Node", "_check_supported", "_literal_key", "_groups_ok", "make_sig", "_with_direction", "isinstance", "new_list", "hooks", "sorted", "reversed", "frozenset", "hook", "visit", "all_tables"}, called
    written = set(re.findall(r'rows\["([\w-]+)"\]', ast.get_source_segment((ROOT / "engine/analysis/graph.py").read_text(), build) or ""))
    assert written <= set(graph.ROW_TABLES) | {"groupsize"}, written - set(graph.ROW_TABLES)
