"""Robustness fuzzing of the inputs shardproof reads: HLO text, relations files (text and
parsed data), whole pairs through ``verify()``, the front end's ``.shardproof.yml``, and the bot's
GitHub event payloads and pull request patches.

The contract under test: an input yields a result (a Module, a RelationSpec, a verdict, a Config,
a Target, commentable lines) or the module's clean error — ``InputError``/``HloParseError``, or
the bot's ``PatchError`` — that points inside the input (``line:column`` or a line within the
text, or a key or field), within a second; never any other exception and never a hang.

Exceptions are classified by a *crash key*: the exception type and the innermost frame inside
``engine/`` or ``bot/`` (``TypeError@relations.py:_binding``). Keys of engine bugs this campaign found and
reported are listed in ``KNOWN`` so the fuzz tests keep guarding against *new* crash classes
while those are open; ``tests/test_fuzz_*.py`` holds one strict-xfail regression per known key,
which starts failing (XPASS) once the bug is fixed, as a reminder to drop the entry here.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENGINE = str(REPO / "engine") + os.sep
OURS = (ENGINE, str(REPO / "bot") + os.sep)  # frames that name a crash
SLOW_SECONDS = 1.0

# Engine bugs found by fuzzing and reported to the lead (see the module docstring).
KNOWN: dict[str, str] = {
    "RecursionError@parser.py:shape": "deeply nested tuple shapes recurse without bound",
    "MemoryError@parser.py:_iota_groups": "iota replica groups [G,S]<=[N] are expanded without a size bound",
    "IndexError@shapecheck.py:_problem": "collective/concatenate dimensions out of range index the operand dims",
    "ZeroDivisionError@shapecheck.py:_problem": "reduce-scatter over an empty replica group divides by zero",
    "TypeError@relations.py:parse_relations": "non-list custom_calls, or keys of mixed types (sorting them)",
    "TypeError@relations.py:_binding": "non-list blocks on a sharded relation, or entry keys of mixed types",
    "ValueError@relations.py:load_relations": "YAML values PyYAML cannot construct (2001-13-45) escape as ValueError",
    "RecursionError@relations.py:load_relations": "deeply nested YAML escapes as RecursionError (pure-Python YAML loader)",
    "UnicodeDecodeError@relations.py:load_relations": "a relations file that is not UTF-8 escapes as UnicodeDecodeError",
}
# Both used to hang and were skipped here: the parser now refuses iota replica groups over more
# than 65,536 devices and the YAML loaders flow nesting past 100 levels, each at once.


@dataclass
class Outcome:
    status: str  # ok | error (clean InputError) | known | crash | slow
    key: str = ""
    detail: str = ""
    seconds: float = 0.0


class Wrong(Exception):
    """A wrong result (not a crash) found by a differential check; ``key`` names what is wrong."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key


def crash_key(exc: BaseException) -> str:
    """``Type@file:function`` of the innermost engine or bot frame (comprehensions skipped);
    for a RecursionError the function that recursed most, since the innermost frame is
    wherever the stack happened to run out."""
    if isinstance(exc, Wrong):
        return exc.key
    frames = [f"{os.path.basename(f.filename)}:{f.name}" for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(OURS) and not f.name.startswith("<")]
    if not frames:
        return f"{type(exc).__name__}@outside-engine"
    if isinstance(exc, RecursionError):
        return f"RecursionError@{Counter(frames).most_common(1)[0][0]}"
    return f"{type(exc).__name__}@{frames[-1]}"


_YAML_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _located(text: str, exc: Any) -> str | None:
    """None when the error's location is plausible, else what is wrong with it."""
    from shardproof.engine.errors import HloParseError

    if isinstance(exc, HloParseError):
        lines = text.split("\n")
        if not 1 <= exc.line <= len(lines):
            return f"line {exc.line} outside 1..{len(lines)}"
        if not 1 <= exc.column <= len(lines[exc.line - 1]) + 1:
            return f"column {exc.column} outside line {exc.line} (length {len(lines[exc.line - 1])})"
        return None
    if not exc.message:
        return "empty message"
    m = re.fullmatch(r"(\d+):(\d+)", exc.where or "")
    if m:
        lines = _YAML_BREAK.split(text)  # YAML (which reports these) also breaks lines at \r
        line, col = int(m.group(1)), int(m.group(2))
        if not 1 <= line <= len(lines) + 1 or col < 1:
            return f"{line}:{col} outside the text"
    return None


def run(fn: Callable[[], Any], text: str = "", clean: tuple[type[Exception], ...] = (), locate: Callable[[Any], str | None] | None = None) -> Outcome:
    """Call ``fn`` and classify what happens (``text`` is the input, for location checks).

    ``InputError`` and the ``clean`` types are clean errors when ``locate`` (default: the
    ``line:column`` check of ``_located``) finds nothing wrong with where they point."""
    from shardproof.engine.errors import InputError

    t0 = time.perf_counter()
    try:
        fn()
        out = Outcome("ok")
    except (InputError, *clean) as e:
        if locate is not None:
            bad = locate(e)
        else:
            bad = _located(text, e) if text and isinstance(e, InputError) else None
        out = Outcome("crash", "badlocation@" + type(e).__name__, f"{bad}: {e}"[:300]) if bad else Outcome("error", detail=str(e)[:200])
    except Exception as e:  # classifying every other exception is the point
        key = crash_key(e)
        out = Outcome("known" if key in KNOWN else "crash", key, f"{type(e).__name__}: {e}"[:300])
    out.seconds = time.perf_counter() - t0
    if out.seconds > SLOW_SECONDS and out.status in ("ok", "error"):
        out.status, out.key = "slow", "slow"
    return out


# -- targets ------------------------------------------------------------------------------------


def parse_target(text: str) -> Outcome:
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.hlo.shapecheck import check_module

    def go() -> None:
        check_module(parse_hlo(text, "fuzz.hlo"))

    return run(go, text)


_RELDIR: str | None = None


def relations_text_target(text: str) -> Outcome:
    """The relations file as a user writes it (YAML text, through ``load_relations``)."""
    from shardproof.engine.relations import load_relations

    global _RELDIR
    if _RELDIR is None:
        _RELDIR = tempfile.mkdtemp(prefix="shardproof-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    path = os.path.join(_RELDIR, "relations.yaml")
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
    return run(lambda: load_relations(path), text)


def relations_data_target(data: Any) -> Outcome:
    from shardproof.engine.relations import parse_relations

    return run(lambda: parse_relations(data, "fuzz.yaml"))


def verify_target(baseline: str, distributed: str, relations: Any, seconds: float = 5.0) -> Outcome:
    """A whole pair through ``verify()``: a verdict or InputError, never another exception."""
    from shardproof.engine.analysis.verify import Budget, verify
    from shardproof.engine.hlo.parser import parse_hlo
    from shardproof.engine.relations import parse_relations

    verdicts = ("verified", "diverged", "unsupported", "inconclusive")

    def go() -> None:
        res = verify(parse_relations(relations, "fuzz.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "fuzz.hlo"), budget=Budget(workers=1, seconds=seconds, max_iterations=200))
        if res.verdict not in verdicts:
            raise AssertionError(f"verdict {res.verdict!r}")

    out = run(go)
    if out.status == "slow" and out.seconds < seconds * 4:
        out.status = "ok"  # the verifier has its own budget; only overrunning it is a hang
    return out


# -- input generation ---------------------------------------------------------------------------


def hlo_seeds() -> list[str]:
    files = sorted((REPO / "tests").rglob("*.hlo")) + sorted((REPO / "examples").rglob("*.hlo"))
    return [p.read_text() for p in files if "__pycache__" not in p.parts]


def relations_seeds() -> list[str]:
    files = sorted((REPO / "tests").rglob("*relations*.yaml")) + sorted((REPO / "examples").rglob("relations.yaml"))
    return [p.read_text() for p in files]


_ALPHABET = (
    "{}()[],=%:\"'<>!&*|-_.\\/#@ \t\n\r0123456789abcdefxyzACDEFTX"
    "\x00\x01\x7f\u00e9\u00df\u202e\ufeff\u2028\u3000\U0001f600\ud800"
)
_HUGE = ("99999999999999999999999999", "18446744073709551617", "9223372036854775808", "-1", "-0", "0", "4294967296", "1e309", "nan", "-inf", "65536")
_TOKEN = re.compile(r"%?[\w.\-]+|\S")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def mutate_text(rng: random.Random, text: str, max_len: int = 200_000) -> str:
    """1-4 random edits: byte flips, inserts of odd characters (NUL, BOM, bidi, emoji, lone
    surrogates), deletions, truncation, token and line deletion/duplication, huge numbers,
    deep nesting."""
    for _ in range(rng.randint(1, 4)):
        n = len(text)
        pos = rng.randint(0, n)
        op = rng.randrange(12)
        if op == 0 and n:  # flip one character
            p = rng.randrange(n)
            text = text[:p] + rng.choice(_ALPHABET) + text[p + 1 :]
        elif op == 1:  # insert a short random string
            text = text[:pos] + "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 8))) + text[pos:]
        elif op == 2 and n:  # delete a span
            text = text[:pos] + text[pos + rng.randint(1, 40) :]
        elif op == 3:  # truncate
            text = text[:pos]
        elif op in (4, 5):  # delete or duplicate one token
            toks = list(_TOKEN.finditer(text))
            if toks:
                t = rng.choice(toks)
                text = text[: t.start()] + (t.group(0) * 2 if op == 5 else "") + text[t.end() :]
        elif op in (6, 7):  # delete, duplicate or swap lines
            lines = text.split("\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if op == 6:
                del lines[i]
            elif rng.random() < 0.5:
                lines.insert(i, lines[j])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif op == 8:  # a number becomes huge, negative or special
            nums = list(_NUMBER.finditer(text))
            if nums:
                m = rng.choice(nums)
                text = text[: m.start()] + rng.choice(_HUGE) + text[m.end() :]
        elif op == 9:  # deep nesting
            depth = rng.choice((10, 100, 1000, 5000))
            o, c = rng.choice((("(", ")"), ("{", "}"), ("[", "]")))
            text = text[:pos] + o * depth + (c * depth if rng.random() < 0.7 else "") + text[pos:]
        elif op == 10:  # repeat a piece
            piece = text[pos : pos + rng.randint(1, 200)]
            text = text[:pos] + piece * rng.randint(2, 50) + text[pos:]
        elif op == 11:  # NULs and unicode
            text = text[:pos] + rng.choice(("\x00", "\x00" * 10, "\ufeff", "\u00e9", "\U0001f600", "\r\n", "\u2028")) + text[pos:]
        if len(text) > max_len:
            text = text[:max_len]
    return text


_METADATA = re.compile(r',\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_SHAPE_DIMS = re.compile(r"\b(?:pred|[suf]\d+|bf16)\[([0-9,]*)\]")
_ATTR_INTS = re.compile(r"\b(dimensions|slice|lhs_contracting_dims|rhs_contracting_dims|lhs_batch_dims|rhs_batch_dims|replica_groups|index|dynamic_slice_sizes|offset_dims|collapsed_slice_dims|start_index_map|slice_sizes|index_vector_dim|iota_dimension|padding|source_target_pairs|parameter)(=|\()")


def mutate_hlo(rng: random.Random, text: str) -> str:
    """An edit where the meaning lives (metadata dropped first, as it is most of the text):
    a dimension inside a shape, a number inside a value attribute, or ``mutate_text``."""
    text = _METADATA.sub("", text)
    r = rng.random()
    if r < 0.35:
        shapes = [m for m in _SHAPE_DIMS.finditer(text) if m.group(1)]
        if shapes:
            m = rng.choice(shapes)
            dims = m.group(1).split(",")
            i = rng.randrange(len(dims))
            dims[i] = str(rng.choice([0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 33, 64, int(dims[i]) * 2, int(dims[i]) + 1]))
            if rng.random() < 0.2:
                dims.insert(i, str(rng.choice([1, 2, 4])))
            elif rng.random() < 0.2 and len(dims) > 1:
                del dims[i]
            return text[: m.start(1)] + ",".join(dims) + text[m.end(1) :]
    elif r < 0.7:
        attrs = list(_ATTR_INTS.finditer(text))
        if attrs:
            m = rng.choice(attrs)
            nums = list(_NUMBER.finditer(text, m.end(), min(len(text), m.end() + 80)))
            if nums:
                n = rng.choice(nums[:6])
                new = str(rng.choice([0, 1, 2, 3, 4, 5, 7, 8, -1, 16, 64]))
                return text[: n.start()] + new + text[n.end() :]
    return mutate_text(rng, text)


def perturb_relations(rng: random.Random, data: dict[str, Any]) -> dict[str, Any]:
    """A relations dict with one well-typed but possibly wrong change: another dim, relation
    kind, parameter reference, group layout, block list or output index."""
    import copy

    data = copy.deepcopy(data)
    entries = [("inputs", i) for i in range(len(data.get("inputs") or []))] + [("outputs", i) for i in range(len(data.get("outputs") or []))]
    r = rng.random()
    if r < 0.15 or not entries:
        data["groups"] = rng.choice([[[0, 1]], [[0, 1], [2, 3]], [[0, 1, 2, 3]], [[1, 0, 2, 3]], [[0, 1, 2]], [[0, 2], [1, 3]], [list(range(8))], [[0]], [[5, 6]]])
        return data
    key, i = rng.choice(entries)
    e = data[key][i]
    r = rng.random()
    if r < 0.25:
        e["dim"] = rng.choice([0, 1, 2, 3, 5])
        e.setdefault("relation", "sharded")
    elif r < 0.45:
        e["relation"] = rng.choice(["duplicate", "sharded", "partial", "rank", "token"] if key == "inputs" else ["duplicate", "sharded", "partial"])
        e.pop("dim", None)
        if e["relation"] == "sharded":
            e["dim"] = rng.choice([0, 1, 2])
        if e["relation"] == "partial" and rng.random() < 0.5:
            e["op"] = rng.choice(["add", "max", "min"])
        if e["relation"] in ("rank", "token"):
            e.pop("baseline", None)
    elif r < 0.65:
        side = rng.choice(["baseline", "distributed"])
        e[side] = rng.choice([0, 1, 2, 3, 4, 5, 9, 40, "p0.2", "%p1.4", "x", "nonexistent"])
    elif r < 0.75:
        e["blocks"] = rng.choice([[2, 2], [64, 32, 32], [1], [4, 4, 4, 4], [3, 5]])
        e["relation"], e["dim"] = "sharded", e.get("dim", 0) if isinstance(e.get("dim"), int) else 0
    elif r < 0.85:
        e["int_range"] = rng.choice([[0, 1], [-5, 5], [0, 10**6], [3, 2]])
    elif r < 0.93:
        data[key].append(copy.deepcopy(e))
    else:
        del data[key][i]
    return data


_KEYS = ("groups", "inputs", "outputs", "custom_calls", "description", "baseline", "distributed", "relation", "dim", "blocks", "op", "int_range", "name", "target", "keeps")
_RELATIONS = ("duplicate", "sharded", "partial", "rank", "token", "max", "add", "")


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Arbitrary YAML-like data, biased towards the relations file's own vocabulary."""
    r = rng.random()
    if depth > 4 or r < 0.45:
        return rng.choice([None, True, False, 0, 1, -1, 2, 3, 7, 2**70, 1.5, float("nan"), "", "x", "%p0", "p0.1", *(_RELATIONS), *(_KEYS)])
    if r < 0.7:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    out: dict[Any, Any] = {}
    for _ in range(rng.randint(0, 5)):
        k = rng.choice(_KEYS) if rng.random() < 0.85 else rng.choice([1, None, "zzz", (1, 2)])
        out[k] = random_value(rng, depth + 1)
    return out


def mutate_relations(rng: random.Random, data: dict[str, Any]) -> dict[str, Any]:
    """A real relations dict with one to three entries changed to random values."""
    import copy

    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        target: Any = data
        path: list[Any] = []
        while isinstance(target, (dict, list)) and target and rng.random() < 0.75:
            k = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
            path.append(k)
            if not isinstance(target[k], (dict, list)):
                break
            target = target[k]
        if not path:
            return random_value(rng)  # type: ignore[no-any-return]
        parent: Any = data
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = random_value(rng) if rng.random() < 0.5 else rng.choice([0, 1, 2, 3, 5, 8, -1, "duplicate", "sharded", "partial", [0], [[0, 1]], [64, 32, 32]])
    return data


# -- the front end's config, the GitHub event, the pull request's patches --------------------------

_WORK: str | None = None


def _scratch(name: str) -> str:
    """A file path in a per-process scratch folder (in memory where there is one)."""
    global _WORK
    if _WORK is None:
        _WORK = tempfile.mkdtemp(prefix="shardproof-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    return os.path.join(_WORK, name)


def _write(path: str, data: str | bytes) -> None:
    with open(path, "wb") as f:
        # Lone surrogates go out as the (invalid UTF-8) bytes they would be: the reader must cope.
        f.write(data if isinstance(data, bytes) else data.encode("utf-8", errors="surrogatepass"))


def _text_of(data: str | bytes) -> str:
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


def _line_within(text: str, where: str) -> str | None:
    """None when ``where`` is empty, a line or line:column inside ``text``; else what is wrong.
    Lines are counted as YAML counts them (it also breaks at \\r, \\x85, U+2028, U+2029), which
    is at least as many as "\\n" gives."""
    m = re.fullmatch(r"(\d+)(?::(\d+))?", where)
    if not where:
        return None
    if not m:
        return f"where {where!r} is not a line"
    line, lines = int(m.group(1)), len(_YAML_BREAK.split(text))
    if not 1 <= line <= lines + 1:
        return f"line {line} outside 1..{lines}"
    if m.group(2) is not None and int(m.group(2)) < 1:
        return f"column {m.group(2)} < 1"
    return None


def config_target(data: str | bytes) -> Outcome:
    """``.shardproof.yml`` through ``load_config``: a Config, or an InputError that names the
    file and, when it names a line, a line of the file."""
    from shardproof.engine.frontend.config import load_config

    path = _scratch(".shardproof.yml")
    _write(path, data)
    text = _text_of(data)

    def locate(e: Any) -> str | None:
        if not str(e.path).endswith(".shardproof.yml"):
            return f"names {e.path!r}, not the config file"
        if not e.message:
            return "empty message"
        return _line_within(text, e.where)

    return run(lambda: load_config(path), text, locate=locate)


def event_target(data: str | bytes, name: str | None = None, pr_event: Any = None) -> Outcome:
    """A GitHub Actions event file through ``load_event`` and ``read_target`` (``name`` None: as
    the bot guesses it): a Target the bot can use, or an InputError naming the file and a
    line in it, or the field (``pull_request.head.sha``)."""
    from shardproof.bot.event import guess_name, load_event, read_target

    path = _scratch("event.json")
    _write(path, data)
    text = _text_of(data)

    def go() -> None:
        payload = load_event(Path(path))
        t = read_target(name or guess_name(payload), payload, None, None, pr_event)
        # What the bot does with a target next: URLs from the repo and sha, an int PR number.
        if not (isinstance(t.sha, str) and t.sha and isinstance(t.repo, str) and t.repo):
            raise Wrong("wrong@event.py:read_target", f"target without a sha or repository: {t}")
        if t.pr is not None and not (type(t.pr) is int and t.pr >= 1):
            raise Wrong("wrong@event.py:read_target", f"pull request number {t.pr!r}")

    def locate(e: Any) -> str | None:
        if not e.message:
            return "empty message"
        if e.path == path:
            return _line_within(text, e.where)
        if e.path != "event":
            return f"names {e.path!r}, neither the event file nor 'event'"
        # A field of the payload; only "which event is this" concerns the payload as a whole.
        if not e.where and "event" not in e.message:
            return "names no field"
        return None

    return run(go, text, locate=locate)


def patch_target(patch: str, expect: tuple[set[int], set[int]] | None = None) -> Outcome:
    """A file's ``patch`` from ``GET /pulls/{n}/files`` through ``parse_patch`` and
    ``DiffIndex``: commentable lines, or a PatchError naming a line of the patch, which the
    index turns into "no inline comments for this file" without failing. With ``expect``
    (the added and context lines of a valid patch), any other answer is wrong."""
    from shardproof.bot.diff import DiffIndex, PatchError, parse_patch

    lines = len(patch.split("\n"))

    def go() -> None:
        index = DiffIndex.from_entries([{"filename": "f.py", "status": "modified", "patch": patch, "previous_filename": None}])
        fd = index.files["f.py"]
        try:
            added, context, hunks = parse_patch(patch)
        except PatchError as e:
            if expect is not None:
                raise Wrong("wrong@diff.py:parse_patch", f"a valid patch refused: {e}") from e
            if fd.has_patch or not index.problems:
                raise Wrong("wrong@diff.py:DiffIndex", "an unreadable patch kept its lines") from e
            raise
        if added & context:
            raise Wrong("wrong@diff.py:parse_patch", f"lines both added and context: {sorted(added & context)[:5]}")
        outside = [n for n in added | context if not any(a <= n <= b for a, b in hunks)]
        if outside:
            raise Wrong("wrong@diff.py:parse_patch", f"lines outside every hunk: {sorted(outside)[:5]}")
        if (fd.added, fd.context) != (added, context) or index.problems:
            raise Wrong("wrong@diff.py:DiffIndex", "the index disagrees with parse_patch")
        if expect is not None and (set(added), set(context)) != expect:
            raise Wrong("wrong@diff.py:parse_patch", f"added {sorted(added)[:8]} context {sorted(context)[:8]}, expected {sorted(expect[0])[:8]} {sorted(expect[1])[:8]}")

    def locate(e: Any) -> str | None:
        if str(e) == "the last hunk is shorter than its header declares":
            return None
        m = re.match(r"line (\d+): ", str(e))
        if not m:
            return "names no line"
        return None if 1 <= int(m.group(1)) <= lines else f"line {m.group(1)} outside 1..{lines}"

    return run(go, patch, clean=(PatchError,), locate=locate)


# -- seeds and mutators for those ---------------------------------------------------------------


def config_seeds() -> list[str]:
    files = sorted((REPO / "tests").rglob(".shardproof.yml")) + sorted((REPO / "examples").rglob(".shardproof.yml"))
    return [p.read_text() for p in files]


def event_seeds() -> list[dict[str, Any]]:
    """The event payloads the bot's tests use (tests/bot_scenarios.py)."""
    from bot_scenarios import HEAD, pr_event

    wr = {"action": "completed", "workflow_run": {"head_sha": HEAD, "head_branch": "fix-mlp", "pull_requests": [{"number": 9}], "head_repository": {"full_name": "outsider/models", "owner": {"login": "outsider"}}}, "repository": {"full_name": "acme/models"}}
    return [
        pr_event(),
        pr_event(head_repo="outsider/models"),
        pr_event(number=9, head_repo="outsider/models"),
        {"ref": "refs/heads/main", "before": "a" * 40, "after": HEAD, "repository": {"full_name": "acme/models"}},
        {"ref": "refs/heads/gone", "before": "a" * 40, "after": "0" * 40, "repository": {"full_name": "acme/models"}},
        wr,
    ]


EVENT_NAMES = (None, "pull_request", "pull_request_target", "push", "workflow_run", "issue_comment")
_CONFIG_KEYS = ("version", "root", "python_path", "hide_frames", "defaults", "models", "name", "entry", "tp", "groups", "size", "outputs", "timeout", "memory_mb", "layer_pattern", "verify", "env", "variant", "expect", "description", "reference", "max_iterations", "partition", "shard", "blocks", "like", "hidden", "on")
_CONFIG_VALUES = (
    None, True, False, 0, 1, -1, 2, 3, 4, 7, 2**31, 2**64, 10**400, 1.5, float("nan"), float("inf"), "", "x", ".", "..", "/", "a\x00b", "~",
    "m:f", "models:mlp", "pkg.mod:fn", ":", "m:", "1m:f", "verified", "diverged", "replicate", "partial", "duplicate",
    "(\\d+)", "layers\\.(\\d+)\\.", "(", "a{4294967296}", "(" * 300 + ")" * 300, "(?P<x>", "[", "2001-13-45", "0x_", "on", "yes",
    [], [[]], [[0, 1]], [[0, 1], [2, 3]], [[0, 1], [1, 2]], [[0], [1, 2]], [[0, 2], [1, 3]], [[-1, 0]], [[0, 0]], [[0, 1, 2, 3]], [list(range(64))],
    {}, {"shard": 0}, {"shard": 1, "blocks": [2, 2]}, {"shard": -1}, {"like": "x"}, {"like": "x", "shard": 0}, {"hidden": 16}, {1: 2}, {True: 1}, {"timeout": 0.0},
)  # fmt: skip


def mutate_tree(rng: random.Random, data: Any, keys: tuple[Any, ...], values: tuple[Any, ...], changes: int = 3) -> Any:
    """Parsed JSON/YAML data with 1..``changes`` edits at random paths: a value replaced (by one
    of ``values`` or a random one), a key renamed, deleted or added, a value wrapped in a list,
    a list item duplicated or dropped."""
    import copy

    def pick() -> Any:  # a copy: later edits must not change the vocabulary (or make cycles)
        return copy.deepcopy(rng.choice(values))

    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, changes)):
        parent: Any = None
        key: Any = None
        node: Any = data
        while isinstance(node, (dict, list)) and node and rng.random() < 0.7:
            parent = node
            key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
            node = node[key]
        if parent is None:
            if isinstance(data, dict):
                data[rng.choice(keys)] = pick()
                continue
            return pick()
        r = rng.random()
        if r < 0.5:
            parent[key] = pick() if rng.random() < 0.8 else random_value(rng)
        elif r < 0.6:
            parent[key] = [parent[key]]
        elif isinstance(parent, dict) and r < 0.75:
            value = parent.pop(key)
            if rng.random() < 0.6:
                parent[rng.choice(keys) if rng.random() < 0.8 else rng.choice((1, None, True, 2.5))] = value
        elif isinstance(parent, dict):
            parent[rng.choice(keys)] = pick()
        elif rng.random() < 0.5:
            parent.insert(key, copy.deepcopy(parent[key]))
        else:
            del parent[key]
    return data


def mutate_config(rng: random.Random, text: str) -> str:
    """A config with well-formed YAML but changed content: keys, values, types, models."""
    import yaml

    data = yaml.safe_load(text)
    data = mutate_tree(rng, data, _CONFIG_KEYS, _CONFIG_VALUES)
    try:
        out = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError):  # data PyYAML cannot write: keep the text
        out = text
    if rng.random() < 0.15:  # YAML's own features: anchors, merges, tags, documents
        out = rng.choice(("x: &a {tp: 2}\n", "<<: {models: []}\n", "!!map\n", "--- \n", "%YAML 1.1\n---\n", "? [a, b]\n: c\n", "x: !!binary '%%'\n", "x: !!python/name:os.system\n")) + out
    return mutate_text(rng, out) if rng.random() < 0.3 else out


_EVENT_KEYS = ("action", "number", "pull_request", "head", "base", "sha", "ref", "repo", "full_name", "repository", "after", "before", "workflow_run", "head_sha", "head_branch", "head_repository", "owner", "login", "pull_requests")
_EVENT_VALUES = (
    None, True, False, 0, -1, 1, 7, 2**63, 2**70, 1.5, 7.0, float("inf"), float("nan"), "", "7", "x", "acme/models", "a" * 40, "0" * 40, "1" * 40, "../../x",
    [], [{}], [{"number": 9}], [{"number": "abc"}], [7], {}, {"full_name": 7}, {"full_name": None}, {"sha": None}, {"login": 5}, {"owner": "x"}, {"0": 1},
)  # fmt: skip


def mutate_event(rng: random.Random, payload: dict[str, Any]) -> str:
    """An event payload as JSON text, its structure changed (``mutate_tree``) and sometimes its
    text too (truncation, odd characters, a number too long for ``int()``)."""
    import json

    data = mutate_tree(rng, payload, _EVENT_KEYS, _EVENT_VALUES)
    text = json.dumps(data, allow_nan=True, skipkeys=True)  # random_value may make tuple keys
    r = rng.random()
    if r < 0.2:
        text = mutate_text(rng, text)
    elif r < 0.25:
        nums = list(_NUMBER.finditer(text))
        if nums:
            m = rng.choice(nums)
            text = text[: m.start()] + rng.choice(("9" * 5000, "1e999", "-0", "1E400", "0.5")) + text[m.end() :]
    elif r < 0.3:
        text = rng.choice(("[" * 5000 + "]" * 5000, '"x"', "null", "[]", "{}", "\ufeff" + text, text + "\x00"))
    return text


_LINE_CHARS = "ab \t+-@\\#\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\u00e9\U0001f600"


def _random_line(rng: random.Random) -> str:
    return "".join(rng.choice(_LINE_CHARS) for _ in range(rng.randint(0, 6)))


def valid_patch(rng: random.Random) -> tuple[str, set[int], set[int]]:
    """A patch as GitHub gives it (hunks, no file header) between two random files whose lines
    hold every character ``str.splitlines`` breaks at; and its new-side added and context lines,
    from difflib's opcodes (not from the patch text)."""
    import difflib

    old = [_random_line(rng) for _ in range(rng.randint(0, 30))]
    new = list(old)
    for _ in range(rng.randint(1, 6)):
        op, i = rng.random(), rng.randint(0, len(new))
        if op < 0.4:
            new.insert(i, _random_line(rng))
        elif new and op < 0.7:
            del new[min(i, len(new) - 1)]
        elif new:
            new[min(i, len(new) - 1)] = _random_line(rng)
    n = rng.randint(0, 3)
    text = list(difflib.unified_diff(old, new, lineterm="", n=n))[2:]
    added: set[int] = set()
    context: set[int] = set()
    for group in difflib.SequenceMatcher(None, old, new, autojunk=False).get_grouped_opcodes(n):
        for tag, _i1, _i2, j1, j2 in group:
            (context if tag == "equal" else added).update(range(j1 + 1, j2 + 1))
    if text and rng.random() < 0.2:
        text.append("\\ No newline at end of file")
    return "\n".join(text), added, context


def patch_seeds() -> list[str]:
    rng = random.Random(7)
    seeds = [valid_patch(rng)[0] for _ in range(20)]
    source = (REPO / "tests" / "pairs" / "models.py").read_text().splitlines()
    import difflib

    for k in range(10):  # real source, edited
        new = list(source)
        for _ in range(rng.randint(1, 5)):
            new.insert(rng.randrange(len(new)), f"    x = {k}  # changed")
        seeds.append("\n".join(list(difflib.unified_diff(source, new, lineterm="", n=3))[2:]))
    seeds += [
        "@@ -10,4 +10,5 @@ def f():\n a\n-b\n+B\n+C\n c\n d",
        "@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n\\ No newline at end of file",
        "@@ -1,2 +1,1 @@\n a\n-b\n@@ -20,3 +19,0 @@\n-x\n-y\n-z\n@@ -40,0 +39,2 @@\n+p\n+q",
        "@@ -0,0 +1,3 @@\n+a\n+b\n+c",
    ]
    return [s for s in seeds if s]


_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", re.M)


def mutate_patch(rng: random.Random, patch: str) -> str:
    """Broken hunks: headers that lie about their counts, huge or malformed numbers, a header
    cut short or moved, "no newline" markers anywhere, CRLF, binary junk, unprefixed lines."""
    lines = patch.split("\n")
    r = rng.random()
    headers = list(_HEADER.finditer(patch))
    if r < 0.3 and headers:  # a count or start that lies
        m = rng.choice(headers)
        g = rng.choice([k for k in (1, 2, 3, 4) if m.group(k) is not None])
        value = int(m.group(g)) if len(m.group(g)) < 100 else 0
        new = str(rng.choice([0, 1, value + 1, max(0, value - 1), value * 2, 2**31, 10**30])) if rng.random() < 0.9 else "9" * 5000
        return patch[: m.start(g)] + new + patch[m.end(g) :]
    if r < 0.4 and headers:  # a header broken or removed
        m = rng.choice(headers)
        bad = rng.choice(("", "@@ -1,2 +1 @", "@@@ -1 +1 @@@", "@@ -a,b +c,d @@", "@@ -1,2 +1,2", "@@  -1 +1 @@", "@@ -1 +1 @@@@", "@@ -1, +1, @@", "@@ -+1 +-1 @@"))
        return patch[: m.start()] + bad + patch[m.end() :]
    if r < 0.5:  # a header in the middle of a hunk, or twice
        i = rng.randrange(len(lines) + 1)
        lines.insert(i, rng.choice(lines) if headers and rng.random() < 0.5 else f"@@ -{rng.randint(0, 50)},{rng.randint(0, 5)} +{rng.randint(0, 50)},{rng.randint(0, 5)} @@")
        return "\n".join(lines)
    if r < 0.6:  # "\ No newline at end of file" anywhere, or a lookalike
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(("\\ No newline at end of file", "\\", "\\x", "\\ No newline at end of file\r")))
        return "\n".join(lines)
    if r < 0.65:
        return patch.replace("\n", "\r\n")
    if r < 0.7:  # context lines without their leading space (some tools strip it)
        return "\n".join(line[1:] if line.startswith(" ") and rng.random() < 0.5 else line for line in lines)
    if r < 0.8:  # binary: what a diff of a binary file may look like when GitHub sends one
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))).decode("latin-1")
        return rng.choice(("Binary files a/w.bin and b/w.bin differ", junk, patch + "\n+" + junk, "GIT binary patch\nliteral 12\n" + junk))
    if r < 0.85:  # drop or repeat a line
        i = rng.randrange(len(lines))
        if rng.random() < 0.5:
            del lines[i]
        else:
            lines.insert(i, lines[i])
        return "\n".join(lines)
    return mutate_text(rng, patch, max_len=20_000)
