"""Drive egglog: load rule files form by form, load facts from TSV, run bounded, read back.

Why form by form: egglog's ``parse_program`` copies the text per span, so parsing a whole rule
file at once costs memory quadratic in its length. Why TSV: ``(input rel "file")`` loads a row
in about a microsecond, one command per fact costs a hundred times that.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.util
import itertools
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import phase
from . import laws


def _bindings() -> ModuleType:
    """egglog's Rust extension, ``egglog.bindings``, the only part of egglog this module uses.
    ``from egglog import bindings`` runs the package's ``__init__`` first: its Python front end
    (black, numpy, the expression DSL), ~140 ms of a 2 s check. So the extension is loaded from
    the package's folder as the module ``egglog.bindings``, registered so that a later ``import
    egglog`` finds it (an extension initializes once per process); anything unexpected and the
    package is imported as usual."""
    if "egglog.bindings" in sys.modules:
        return sys.modules["egglog.bindings"]
    package = importlib.util.find_spec("egglog")  # finds the package; runs nothing of it
    folder = os.path.dirname(package.origin) if package is not None and package.origin else None
    if folder is not None:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "bindings" + suffix)
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location("egglog.bindings", path)
                if spec is None or spec.loader is None:
                    break
                module = importlib.util.module_from_spec(spec)
                sys.modules["egglog.bindings"] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules["egglog.bindings"]
                    raise
                return module
    from egglog import bindings

    return bindings


bindings = _bindings()

# The registered law families' rules files, in load order (engine/analysis/laws).
RULE_FILES: tuple[str, ...] = laws.rule_files()


# One scan finds comments, strings and parentheses (in C); the loop sees only those.
_TOKENS = re.compile(r';[^\n]*|"(?:[^"\\]|\\.)*"?|[()]')


def split_forms(text: str) -> Iterator[str]:
    """Top-level s-expressions of an egglog file, skipping ``;`` comments and strings."""
    for _at, form in _forms(text):
        yield form


def _forms(text: str) -> Iterator[tuple[int, str]]:
    """(offset, form) of each top-level s-expression of ``text``."""
    depth, start = 0, -1
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok == "(":
            if depth == 0:
                start = m.start()
            depth += 1
        elif tok == ")":
            depth -= 1
            if depth == 0:
                yield start, text[start : m.end()]
            elif depth < 0:
                raise ValueError(f"unbalanced ')' at offset {m.start()}")
    if depth:
        raise ValueError("unbalanced '(' at end of rule text")


def rule_text(name: str) -> str:
    return resources.files("shardproof.rules").joinpath(name).read_text()


# Heads of s-expressions (a relation is always one): ("(", head, "") or ("", "", ")") per
# parenthesis; comments and strings match as ("", "", "") and are skipped.
_HEADS = re.compile(r'(\()\s*([^\s()";]*)|(\))|;[^\n]*|"(?:[^"\\]|\\.)*"?')
_DECLARATIONS = ("relation", "function", "constructor", "datatype", "datatype*", "sort", "ruleset")


@dataclass(frozen=True)
class Form:
    file: str  # in rules/
    line: int
    text: str
    # A rule: the input tables its query reads (empty for every other form, always loaded).
    needs: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()  # a rule: every relation its query reads
    writes: frozenset[str] = frozenset()  # a rule: every relation its actions name
    # A rule naming (as a variable) something a later file declares: egglog refuses it once that
    # declaration is loaded, so it is never left out to be loaded later.
    early: bool = False


@dataclass(frozen=True)
class Program:
    forms: tuple[Form, ...]
    inputs: frozenset[str]  # relations only the law families' hooks (and seeds) fill
    relations: frozenset[str]  # every relation declared
    # Relations that may hold rows whatever the input tables: written by a fact of the rules
    # files or by Python outside graph.build's hooks (the term rows, the layout solver's answers).
    free: frozenset[str]
    _loadable: dict[frozenset[str], frozenset[int]] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def loadable(self, present: frozenset[str]) -> frozenset[int]:
        """Indices (in ``forms``) of the rules that may fire when the relations with rows at the
        start are ``present``: every relation a rule reads may hold rows (the least fixpoint
        over the rules' writes, from ``present`` and ``free``); any other rule never fires."""
        if present not in self._loadable:
            rules = [(i, f) for i, f in enumerate(self.forms) if f.reads or f.writes]
            reach = set(present) | self.free
            grew = True
            while grew:
                grew = False
                for _, f in rules:
                    if f.reads <= reach and not f.writes <= reach:
                        reach |= f.writes
                        grew = True
            self._loadable[present] = frozenset(i for i, f in rules if f.reads <= reach)
        return self._loadable[present]


def _rule_parts(text: str) -> tuple[list[str], list[str]]:
    """Of a ``(rule (query ...) (actions ...) ...)`` form: the heads of the query's atoms and
    every head anywhere in its actions."""
    atoms: list[str] = []
    acts: list[str] = []
    depth, part = 0, -1
    for opened, head, closed in _HEADS.findall(text):
        if closed:
            depth -= 1
        elif opened:
            depth += 1
            if depth == 2:
                part += 1
            elif depth == 3 and part == 0:
                atoms.append(head)
            elif depth >= 3 and part == 1:
                acts.append(head)
    return atoms, acts


def heads(text: str) -> set[str]:
    """Every s-expression head in ``text`` (a seed fact's relations, say)."""
    return {head for _, head, _ in _HEADS.findall(text) if head}


def program(rule_files: tuple[str, ...]) -> Program:
    """The rules files' forms, analysed once per process (per ``rule_text``: tests edit it).
    The files of left-out families (laws.leave_out) give their declarations only."""
    return _program(rule_files, laws.declared_only(), rule_text)


@functools.cache
def _program(rule_files: tuple[str, ...], off: frozenset[str], read: Callable[[str], str]) -> Program:
    """The forms of ``rule_files`` in load order, each rule with the input tables it reads.

    An input table is a relation of a registered family's TABLES (engine/analysis/laws) that no
    rule's action and no fact of the rules files writes: its rows come from graph.build (and a
    proof's seeds) only. A rule whose query reads an input table holding no rows cannot fire in
    that e-graph, so leaving it out changes nothing of the proof (Session ``present``), and a
    family costs nothing on a program it does not apply to: no compiling, no per-iteration
    search (~3 µs per rule and iteration, a 405B proof runs ~600 iterations), no share of the
    e-graph's push and pop."""
    forms: list[Form] = []
    declared: set[str] = set()
    written: set[str] = set()
    queried: list[tuple[int, list[str], list[str]]] = []
    facts: set[str] = set()
    for name in rule_files:
        text = read(name)
        line, last = 1, 0
        for at, form in _forms(text):
            line += text.count("\n", last, at)
            last = at
            head = form[1:].split(None, 1)[0] if len(form) > 1 else ""
            if head in ("rule", "rewrite", "birewrite") and name in off:
                continue
            if head == "rule":
                atoms, acts = _rule_parts(form)
                written.update(acts)
                queried.append((len(forms), atoms, acts))
            elif head in _DECLARATIONS:
                if head == "relation":
                    declared.add(form[1:].split(None, 2)[1])
            elif head not in ("rewrite", "birewrite"):
                facts |= heads(form)  # a fact: (flipop "max" "min"), (union ...), (set ...)
            forms.append(Form(name, line, form))
    written |= facts
    inputs = frozenset(declared & set(laws.tables()) - written)
    for i, atoms, acts in queried:
        reads = frozenset(a for a in atoms if a in declared)
        # A rule that writes no relation (only unions or terms) is kept whenever it can match.
        writes = frozenset(a for a in acts if a in declared) or frozenset({""})
        forms[i] = dataclasses.replace(forms[i], needs=reads & inputs, reads=reads, writes=writes)
    free = frozenset(declared - written - inputs) | (facts & declared) | {""}
    later: set[str] = set()
    for i in range(len(forms) - 1, -1, -1):
        f = forms[i]
        # Every word (comments and strings too: at worst a rule loads always) by str methods,
        # ~10x faster than a tokenizing pattern.
        if f.writes and later and not later.isdisjoint(f.text.replace("(", " ").replace(")", " ").split()):
            forms[i] = dataclasses.replace(f, early=True)
        elif not f.writes and f.text[1:].split(None, 1)[0] in _DECLARATIONS:
            later.add(f.text[1:].split(None, 2)[1])
    return Program(tuple(forms), inputs, frozenset(declared), free)


# Which budget stopped a run (RunStats.exhausted); "" when the rules saturated.
ITERATIONS, SECONDS, NODES, LAYOUT_ROUNDS = "iterations", "seconds", "nodes", "layout_rounds"


@dataclass
class RunStats:
    iterations: int
    saturated: bool
    seconds: float
    exhausted: str = ""  # ITERATIONS, SECONDS, NODES or LAYOUT_ROUNDS when not saturated
    nodes: int = 0  # e-graph rows (see Session.size) when the run stopped


class Session:
    """One e-graph. Not thread-safe (egglog's EGraph cannot cross threads); make one per thread.

    ``present``: the relations that hold rows when the proofs this e-graph will run start (its
    graph's tables with rows, its seeds'); a rule that cannot fire from them (Program.loadable)
    is left out. None loads every rule. ``admit`` adds the rules a later proof needs."""

    def __init__(self, rule_files: Iterable[str] | None = None, present: Iterable[str] | None = None) -> None:
        self.eg = bindings.EGraph()
        self._tmp = tempfile.TemporaryDirectory(prefix="shardproof-egg-")
        self._files = itertools.count()
        # Parsed once: size() runs between every chunk of iterations.
        self._print_size = self.eg.parse_program("(print-size)")
        self._frozen: dict[str, Any] | None = None
        self._program = program(laws.rule_files() if rule_files is None else tuple(rule_files))
        self.present: frozenset[str] | None = None if present is None else frozenset(present)
        self._left: list[int] = []  # indices of the rules left out, in load order
        try:
            keep = None if self.present is None else self._program.loadable(self.present)
            self._left = [i for i, f in enumerate(self._program.forms) if keep is not None and f.writes and not f.early and i not in keep]
            left = set(self._left)
            self._load(i for i in range(len(self._program.forms)) if i not in left)
        except BaseException:
            self.close()
            raise

    def _load(self, indices: Iterable[int]) -> None:
        # A crash here is a broken rule file (exit 4, phase "rules"), named by file and line.
        with phase("rules", "rules/") as p:
            for i in indices:
                form = self._program.forms[i]
                p.at(f"rules/{form.file}")
                try:
                    self.command(form.text)
                except BaseException:
                    p.where = f"rules/{form.file}:{form.line}"
                    raise

    def missing(self, present: frozenset[str] | None) -> bool:
        """Whether a proof whose relations with rows are ``present`` at the start (None: any)
        needs a rule this e-graph left out."""
        if present is None:
            return bool(self._left)
        keep = self._program.loadable(present)
        return any(i in keep for i in self._left)

    def admit(self, present: frozenset[str] | None) -> None:
        """Load the left-out rules a proof starting from ``present`` (None: any) can fire.
        Outside a push only. Loaded after rules files they came before, a rule may clash with a
        later file's declaration (egglog forbids a variable named like a relation): the caller
        then builds a new Session."""
        keep = None if present is None else self._program.loadable(present)
        wanted = [i for i in self._left if keep is None or i in keep]
        self._left = [i for i in self._left if keep is not None and i not in keep]
        self.present = None if present is None or self.present is None else self.present | present
        self._load(wanted)

    def close(self) -> None:
        """Free the e-graph now, in this thread: egglog's EGraph must not be dropped by another
        thread, and a crash's traceback, read by the main thread, keeps the Session alive."""
        self._tmp.cleanup()
        self._frozen = None
        self.__dict__.pop("eg", None)

    def command(self, form: str) -> list[object]:
        self._frozen = None
        return self.eg.run_program(*self.eg.parse_program(form))

    def load(self, table: str, rows: Iterable[tuple[object, ...]]) -> int:
        rows = list(rows)
        if not rows:
            return 0
        if self._left and self.present is not None and table in self._program.relations and table not in self.present | self._program.free:
            # Rules reading it were left out as unable to fire: loading it now would silently
            # lose their facts. A caller's bug: declare the table in ``present``.
            raise RuntimeError(f"rows for table {table!r} loaded into an e-graph that left out rules as if it stayed empty (fresh_session present=)")
        data = "".join("\t".join(_cell(v) for v in row) + "\n" for row in rows).encode("utf-8")
        if _IN_MEMORY:
            # The rows in an anonymous in-memory file, read by egglog through /proc: a file
            # on disk costs ~0.3 ms of CPU to create (1 ms and more when the disk is busy), and
            # a proof loads a hundred small tables.
            fd = os.memfd_create("shardproof-rows", os.MFD_CLOEXEC)
            try:
                _write_all(fd, data)
                self.command(f'(input {table} "/proc/self/fd/{fd}")')
            finally:
                os.close(fd)
            return len(rows)
        path = Path(self._tmp.name) / f"{table}.{next(self._files)}.tsv"
        path.write_bytes(data)
        self.command(f'(input {table} "{path}")')
        path.unlink()  # read: a reused Session (fresh_session) would only pile them up
        return len(rows)

    def size(self) -> int:
        """Rows in all of the e-graph's tables (e-nodes plus relation tuples), as ``(print-size)``
        counts them. It reads each table's length, not its rows: ~0.1 ms for the ~130 tables of
        our rules at 5k and at 64k rows alike (0.3 ms at 1.5M rows), where a chunk of 8 cheap
        iterations takes ~0.9 ms and an expensive one seconds."""
        out = self.eg.run_program(*self._print_size)
        return sum(n for _, n in out[-1].sizes)  # type: ignore[attr-defined]

    def run(self, max_iterations: int, deadline_s: float, max_nodes: int | None = None, chunk: int = 8) -> RunStats:
        """Run all rules until nothing changes, or the iteration, time or node budget is spent.

        The node budget is checked between chunks of iterations, so a chunk can overshoot it; the
        chunk shrinks (down to one iteration) when the last chunk's growth rate, kept up, would
        cross the budget within it. One iteration can still overshoot it by its own growth
        (2.2x per iteration measured for an associativity/commutativity blow-up)."""
        t0 = time.perf_counter()
        done = 0
        nodes = self.size()
        if max_nodes is not None and nodes > max_nodes:
            # Rows loaded between runs (facts, layout answers) can already exceed it.
            return RunStats(0, False, time.perf_counter() - t0, NODES, nodes)
        step_cap = chunk
        while done < max_iterations:
            step = min(step_cap, max_iterations - done)
            out = self.command(f"(run {step})")
            done += step
            before, nodes = nodes, self.size()
            report = out[-1].report if out else None  # type: ignore[attr-defined]
            if report is not None and not report.updated:
                return RunStats(done, True, time.perf_counter() - t0, "", nodes)
            if max_nodes is not None and nodes > max_nodes:
                return RunStats(done, False, time.perf_counter() - t0, NODES, nodes)
            if time.perf_counter() - t0 > deadline_s:
                return RunStats(done, False, time.perf_counter() - t0, SECONDS, nodes)
            if max_nodes is not None:
                step_cap = _next_chunk(before, nodes, step, max_nodes, chunk)
        return RunStats(done, False, time.perf_counter() - t0, ITERATIONS, nodes)

    def rows(self, names: Iterable[str]) -> dict[str, list[list[object]]]:
        """Rows of the named functions/relations, values decoded (e-classes stay opaque)."""
        # One snapshot of every table until the next command: freezing copies the whole
        # e-graph, and reading a proof's facts asks for tables five times in a row.
        if self._frozen is None:
            self._frozen = self.eg.freeze().functions
        frozen = self._frozen
        out: dict[str, list[list[object]]] = {}
        for name in names:
            fn = frozen[name]
            sorts = list(fn.input_sorts)
            table = []
            for r in fn.rows:
                vals: list[object] = []
                for v, s in zip(r.inputs, sorts, strict=True):
                    if s == "i64":
                        vals.append(self.eg.value_to_i64(v))
                    elif s == "String":
                        vals.append(self.eg.value_to_string(v))
                    else:
                        vals.append(v)
                if fn.output_sort in ("T", "TL", "i64", "String"):
                    vals.append(r.output)
                table.append(vals)
            out[name] = table
        return out


_LOCAL = threading.local()


@contextmanager
def fresh_session(rule_files: tuple[str, ...] | None = None, present: Iterable[str] | None = None) -> Iterator[Session]:
    """A Session holding the rules and nothing else, for one proof.

    Loading the rules (type-checking and compiling ~750 rules) costs ~0.3 s, more than many a
    layer's proof. So each thread keeps one Session with the rules loaded (egglog's e-graph
    cannot cross threads) and each proof runs between ``(push)`` and ``(pop)``: egglog's push
    saves a clone of the whole e-graph, and pop puts that clone back, so no row, union or
    fact of one proof is left for the next. The popped e-graph is checked empty again (its row
    count, as after loading the rules; ~0.1 ms) or it is thrown away; a proof that raised, or
    a nested use, gets a Session of its own.

    ``present``: the input tables (``program``) the proof fills, its graph's tables with rows
    and the relations of its seeds; rules reading any other input table are not loaded (they
    cannot fire). None: every rule. The thread's Session grows by the rules each proof needs.
    ``rule_files`` None: the registered families' (engine/analysis/laws, read at each call)."""
    files = laws.rule_files() if rule_files is None else rule_files
    want = None if present is None else frozenset(present) & program(files).relations
    key = (files, laws.declared_only())
    cache: dict[tuple[tuple[str, ...], frozenset[str]], tuple[Session, int]] = _LOCAL.__dict__.setdefault("sessions", {})
    busy: set[tuple[tuple[str, ...], frozenset[str]]] = _LOCAL.__dict__.setdefault("busy", set())
    if key in busy:
        session = Session(files, want)
        try:
            yield session
        finally:
            session.close()
        return
    if key in cache and cache[key][0].missing(want):
        old = cache.pop(key)[0]
        try:
            old.admit(want)
            cache[key] = (old, old.size())
        except Exception:
            # A rule clashing with a later file's declaration: load the files anew, in order,
            # with the rules of every proof so far.
            grown = None if want is None or old.present is None else old.present | want
            old.close()
            want = grown
    if key not in cache:
        session = Session(files, want)
        cache[key] = (session, session.size())
    session, pristine = cache[key]
    if want is not None and session.present is not None:
        # Reused without admit: no rule it left out can fire from ``want`` (missing() said so),
        # so this proof's tables are present for load()'s guard too.
        session.present = session.present | want
    busy.add(key)
    clean = False
    try:
        session.command("(push)")
        yield session
        session.command("(pop)")
        clean = session.size() == pristine
    finally:
        busy.discard(key)
        if not clean:
            del cache[key]
            session.close()


def _next_chunk(before: int, nodes: int, step: int, max_nodes: int, chunk: int) -> int:
    """Iterations to run next: up to ``chunk``, but no more than keep the e-graph within
    ``max_nodes`` if it goes on growing by the last ``step`` iterations' factor per iteration."""
    if nodes <= before:
        return chunk
    per_iteration = (nodes / max(before, 1)) ** (1 / step)
    fits = math.log(max_nodes / nodes) / math.log(per_iteration)
    return max(1, min(chunk, int(fits)))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _in_memory_files() -> bool:
    """Whether egglog can read rows from an in-memory file (Linux: memfd_create and /proc)."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        fd = os.memfd_create("shardproof-probe", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        _write_all(fd, b"probe\n")
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            return f.read() == b"probe\n"
    except OSError:
        return False
    finally:
        os.close(fd)


_IN_MEMORY = _in_memory_files()


def _cell(v: object) -> str:
    s = str(v)
    if "\t" in s or "\n" in s:
        raise ValueError(f"TSV cell holds a tab or newline: {s[:80]!r}")
    return s
