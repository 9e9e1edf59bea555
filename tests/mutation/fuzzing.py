"""Robustness fuzzing of the inputs the verifier reads: HLO text, relations files (text and
parsed data) and whole pairs through ``verify()``.

The contract under test: an input yields a result (a Module, a RelationSpec, a verdict) or a
clean ``InputError``/``HloParseError`` that points inside the input (``line:column`` within the
text, or a key), within a second; never any other exception and never a hang.

Exceptions are classified by a *crash key*: the exception type and the innermost frame inside
``engine/`` (``TypeError@relations.py:_binding``). Keys of engine bugs this campaign found and
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
# Inputs that would hang (not raise) in the parser: skipped and counted as known.
_IOTA_BOMB = re.compile(r"\[\s*(\d+)\s*,\s*(\d+)\s*\]\s*<=")
IOTA_BOMB_KEY = "hang@parser.py:_iota_groups"
KNOWN[IOTA_BOMB_KEY] = "iota replica groups with a huge device count take seconds to minutes and GBs"
# Deeply nested YAML: the pure-Python loader takes ~1 s at 800 levels and raises RecursionError;
# the C loader (used since 1b67376) takes 2 s at 20,000 levels and segfaults from ~30,000. Such
# inputs are never loaded in-process here (a segfault would end the fuzzer), only counted.
DEEP_YAML_KEY = "hang@relations.py:load_relations"
KNOWN[DEEP_YAML_KEY] = "relations YAML nested thousands of levels deep: seconds, then RecursionError or SIGSEGV"


@dataclass
class Outcome:
    status: str  # ok | error (clean InputError) | known | crash | slow
    key: str = ""
    detail: str = ""
    seconds: float = 0.0


def crash_key(exc: BaseException) -> str:
    """``Type@file:function`` of the innermost engine frame (comprehensions skipped); for a
    RecursionError the engine function that recursed most, since the innermost frame is
    wherever the stack happened to run out."""
    frames = [f"{os.path.basename(f.filename)}:{f.name}" for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(ENGINE) and not f.name.startswith("<")]
    if not frames:
        return f"{type(exc).__name__}@outside-engine"
    if isinstance(exc, RecursionError):
        return f"RecursionError@{Counter(frames).most_common(1)[0][0]}"
    return f"{type(exc).__name__}@{frames[-1]}"


def hazard(text: str) -> str | None:
    """Key of a known hang this HLO text would trigger, or None."""
    for m in _IOTA_BOMB.finditer(text):
        if int(m.group(1)) * int(m.group(2)) > 1 << 16:
            return IOTA_BOMB_KEY
    return None


def nesting(text: str) -> int:
    """Deepest bracket nesting of a text (quotes ignored: an over-estimate is fine here)."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]})" and depth:
            depth -= 1
    return deepest


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


def run(fn: Callable[[], Any], text: str = "") -> Outcome:
    """Call ``fn`` and classify what happens (``text`` is the input, for location checks)."""
    from shardproof.engine.errors import InputError

    t0 = time.perf_counter()
    try:
        fn()
        out = Outcome("ok")
    except InputError as e:
        bad = _located(text, e) if text else None
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

    if (key := hazard(text)) is not None:
        return Outcome("known", key)

    def go() -> None:
        check_module(parse_hlo(text, "fuzz.hlo"))

    return run(go, text)


_RELDIR: str | None = None


def relations_text_target(text: str) -> Outcome:
    """The relations file as a user writes it (YAML text, through ``load_relations``)."""
    from shardproof.engine.relations import load_relations

    if nesting(text) > 300:
        return Outcome("known", DEEP_YAML_KEY)
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

    if hazard(distributed) is not None:
        return Outcome("known", IOTA_BOMB_KEY)
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
