"""One e-graph per thread is reused across proofs (egg.fresh_session: push, prove, pop).

A proof's facts left in the reused e-graph would be facts about another segment's node ids:
the next proof could "verify" from them. These tests load real rules into real egglog and check
that nothing of one proof survives into the next, whatever way the proof ends."""

from __future__ import annotations

import gc
import threading

import pytest

from shardproof.engine.analysis.egg import Session, fresh_session
from shardproof.engine.gcpause import gc_paused


def _dup_rows(s: Session) -> list[list[object]]:
    return s.rows(["dup"])["dup"]


def test_a_reused_session_holds_nothing_of_the_last_proof() -> None:
    empty = Session()
    try:
        pristine = empty.size()
    finally:
        empty.close()
    with fresh_session() as s:
        first = s
        s.load("leafrow", [(0,), (1,)])
        s.command("(dup (N 0) (N 1))")
        s.run(50, 30.0)
        assert _dup_rows(s) and s.size() > pristine
    with fresh_session() as s:
        assert s is first  # the same e-graph, popped back to the rules alone
        assert s.size() == pristine
        assert _dup_rows(s) == []


def test_a_proof_that_raised_gives_its_session_up() -> None:
    with pytest.raises(RuntimeError), fresh_session() as s:
        broken = s
        s.command("(dup (N 5) (N 6))")
        raise RuntimeError("the proof crashed")
    with fresh_session() as s:
        assert s is not broken
        assert _dup_rows(s) == []


def test_nested_and_threaded_uses_get_sessions_of_their_own() -> None:
    seen: dict[str, list[list[object]]] = {}

    def other() -> None:
        with fresh_session() as t:
            seen["thread"] = _dup_rows(t)

    with fresh_session() as outer:
        outer.command("(dup (N 0) (N 1))")
        with fresh_session() as inner:
            assert inner is not outer
            assert _dup_rows(inner) == []
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert len(_dup_rows(outer)) == 1
    assert seen["thread"] == []


def test_tables_load_through_the_in_memory_file_as_written() -> None:
    with fresh_session() as s:
        assert s.load("litrow", [(3, "f32:1.5"), (4, "s32:-7")]) == 2
        rows = s.rows(["litrow"])["litrow"]
        assert sorted((r[0], r[1]) for r in rows) == [(3, "f32:1.5"), (4, "s32:-7")]


def test_gc_paused_nests_and_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer phase still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before: stays off
    finally:
        gc.enable()
