"""Law families cost nothing where they cannot apply, and any one of them can be left out.

egg.program marks each rule with the input tables its query reads (tables only graph.build's
hooks fill); a proof loads only the rules whose input tables all hold rows (egg.fresh_session
``present``). A rule left out cannot fire, so the facts must be exactly those of the e-graph
holding every rule. laws.leave_out (bench/scale.py ``--without``) unregisters whole families:
the check must still run, its verdict may drop but never rise to verified."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.analysis import egg, laws
from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.verify import Budget
from shardproof.engine.relations import load_relations

PAIRS = Path(__file__).parent / "pairs"


@pytest.fixture
def own_sessions(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This thread's cached e-graphs start empty and are dropped after the test."""
    monkeypatch.setattr(egg._LOCAL, "sessions", {}, raising=False)
    yield
    laws.leave_out(())


def _rules(forms: tuple[egg.Form, ...]) -> list[egg.Form]:
    return [f for f in forms if f.text.startswith("(rule")]


def test_input_tables_are_written_by_no_rule_and_no_fact() -> None:
    p = egg.program(laws.rule_files())
    assert p.inputs and p.inputs <= set(laws.tables())
    for f in p.forms:
        if f.text.startswith("(rule"):
            _atoms, acts = egg._rule_parts(f.text)
            assert not set(acts) & p.inputs, (f.file, f.line)
        assert f.needs <= p.inputs
    # The layout solver's answers are loaded between runs, not by graph.build: never an input.
    assert not {"lstep-d", "lstep-b", "ldot", "lpair", "ldot2"} & p.inputs
    # Most families' rules wait for their own tables.
    assert sum(1 for f in _rules(p.forms) if f.needs) > len(_rules(p.forms)) // 2


def test_a_gated_session_proves_what_the_full_one_proves(own_sessions: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same pairs proven with every rule loaded (present=None) and with the rules their
    tables can fire: the same facts in every e-graph, and the gated e-graphs hold fewer rules."""
    from shardproof.engine.analysis import verify

    pairs = ["vocab_embedding_tp4", "greedy_argmax_gather_tp4", "bug_missing_allreduce", "ulysses_attention_tp4"]
    real_solve, real_session = verify._solve, egg.fresh_session
    proofs: list[frozenset[tuple[int, str, frozenset[int]]]] = []
    loaded: list[int] = []

    def solve(g: Any, seeds: Any, solver: Any, budget: Any) -> Any:
        facts, stats = real_solve(g, seeds, solver, budget)
        proofs.append(frozenset((dg, f.relation, frozenset(facts.members.get(f.baseline, ()))) for dg, fs in facts.by_dist.items() for f in fs))
        return facts, stats

    @contextmanager
    def counting(rule_files: tuple[str, ...] | None = None, present: Any = None) -> Iterator[egg.Session]:
        with real_session(rule_files, present) as session:
            loaded.append(len(session._program.forms) - len(session._left))
            yield session

    monkeypatch.setattr(verify, "_solve", solve)
    monkeypatch.setattr(verify, "fresh_session", counting)
    gated = [_facts(p) for p in pairs]
    gated_proofs, proofs[:] = list(proofs), []
    monkeypatch.setattr(verify, "fresh_session", lambda rule_files=None, present=None: real_session(rule_files, None))
    full = [_facts(p) for p in pairs]
    assert gated == full
    assert gated_proofs == proofs and any(proofs)
    assert loaded and max(loaded) < len(egg.program(laws.rule_files()).forms)


def _facts(pair: str, partition: bool = True) -> tuple[str, list[tuple[str, str, str]]]:
    """Verdict and every output's relation with its reason: the proof's observable result."""
    d = PAIRS / pair
    spec = load_relations(d / "relations.yaml")
    result = check_files(spec, d / "baseline.hlo", d / "distributed.hlo", budget=Budget(fold=False, partition=partition), witness="never")
    doc = result.to_json()
    outs = [(str(o.get("name")), str(o.get("relation")), str(o.get("ok"))) for o in doc.get("outputs", [])]
    stops = sorted(str(s.get("instruction", s)) for s in doc.get("divergences", []))
    return result.verdict, outs + [("stop", s, "") for s in stops]


def test_every_family_can_be_left_out(own_sessions: None) -> None:
    """Each family left out in turn (its rules and hooks; bench/scale.py --without): a verified
    pair and a buggy one still check, the buggy one never verified, no crash (KeyError of a
    table, egglog refusing a rule naming the family's relations)."""
    pairs = ["greedy_argmax_gather_tp4", "bug_missing_allreduce"]
    full = {p: _facts(p, partition=False)[0] for p in pairs}
    assert full == {"greedy_argmax_gather_tp4": "verified", "bug_missing_allreduce": "diverged"}
    names = [f.name for f in laws.FAMILIES]
    verdicts: dict[tuple[str, str], str] = {}
    for name in names:
        laws.leave_out([name])
        assert name not in {f.name for f in laws.FAMILIES} and laws.rule_files() == egg.RULE_FILES
        for p in pairs:
            verdicts[name, p] = _facts(p, partition=False)[0]
        egg._LOCAL.sessions.clear()
    laws.leave_out(())
    assert [f.name for f in laws.FAMILIES] == names
    assert set(verdicts.values()) <= {"verified", "unproven", "diverged", "unsupported", "inconclusive"}, verdicts
    assert all(verdicts[n, "bug_missing_allreduce"] != "verified" for n in names)
    # Leaving out core (the term rows every law matches) loses every proof.
    assert verdicts["core", "greedy_argmax_gather_tp4"] != "verified"


def test_leave_out_names_an_unknown_family() -> None:
    with pytest.raises(ValueError, match="no law family"):
        laws.leave_out(["nosuchfamily"])
