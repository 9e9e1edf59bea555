"""Fuzzing the other inputs shardproof reads: the front end's ``.shardproof.yml``, the GitHub
Actions event file and the pull request patches the bot gets from the API. Arbitrary bytes and
text, and structured mutations of the repository's own configs, the tests' event payloads and
real patches, yield a result or the module's clean error — an ``InputError`` naming the file and
a line in it or a field, a ``PatchError`` naming a line of the patch — within a second; never
another exception, never a hang. Valid patches (between random files whose lines hold every
character ``str.splitlines`` breaks at) must give exactly the lines difflib says.

Seeded and bounded so the suite stays fast; the million-input run is ``python bench/fuzz.py``
(targets config, event, patch). The regression tests at the end pin the bugs this found."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutation import fuzzing

from shardproof.bot.diff import DiffIndex, PatchError, parse_patch
from shardproof.bot.event import load_event, read_target
from shardproof.engine.errors import InputError
from shardproof.engine.frontend.config import load_config

CONFIGS = fuzzing.config_seeds()
EVENTS = fuzzing.event_seeds()
PATCHES = fuzzing.patch_seeds()
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MANY = settings(FUZZ, max_examples=300)  # the cheap targets (events, patches): ~1 ms an input

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12) | st.sampled_from(["1" * 40, "acme/models", "7"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8) | st.sampled_from(fuzzing._EVENT_KEYS), kids, max_size=5),
    max_leaves=25,
)


def _assert_clean(again: Callable[[], fuzzing.Outcome]) -> None:
    out = again()
    if out.status == "slow":  # a loaded machine can stall one call: only a repeat counts
        out = again()
    assert out.status in ("ok", "error"), f"{out.status} {out.key}: {out.detail} ({out.seconds:.2f}s)"


def test_the_seeds_are_what_the_repository_uses() -> None:
    # The fuzzers start from real inputs: every seed config loads or fails only for a folder
    # the scratch copy lacks, every test event reads, every seed patch parses.
    assert len(CONFIGS) >= 3 and any("tplm.models:llama" in c for c in CONFIGS)
    assert [fuzzing.event_target(json.dumps(e)).status for e in EVENTS] == ["ok"] * len(EVENTS)
    assert all(fuzzing.patch_target(p).status == "ok" for p in PATCHES)


# -- .shardproof.yml --------------------------------------------------------------------------------


@FUZZ
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=2000))
def test_config_arbitrary_text(text: str) -> None:
    _assert_clean(lambda: fuzzing.config_target(text))


@FUZZ
@given(st.binary(max_size=2000))
def test_config_arbitrary_bytes(data: bytes) -> None:
    _assert_clean(lambda: fuzzing.config_target(data))


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("models:- name entry: m:f tp: 2 groups[[0,1]]{}\n  #&*!<>|'\"\t.")), max_size=400))
def test_config_yaml_soup(text: str) -> None:
    _assert_clean(lambda: fuzzing.config_target("version: 1\n" + text))


@FUZZ
@given(st.sampled_from(CONFIGS), st.integers(0, 2**32))
def test_config_mutated_text(seed_text: str, seed: int) -> None:
    mutated = fuzzing.mutate_text(random.Random(seed), seed_text)
    _assert_clean(lambda: fuzzing.config_target(mutated))


@settings(FUZZ, max_examples=250)
@given(st.sampled_from(CONFIGS), st.integers(0, 2**32))
def test_config_mutated_structure(seed_text: str, seed: int) -> None:
    mutated = fuzzing.mutate_config(random.Random(seed), seed_text)
    _assert_clean(lambda: fuzzing.config_target(mutated))


# -- the event file ------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=1500), st.sampled_from(fuzzing.EVENT_NAMES))
def test_event_arbitrary_bytes(data: bytes, name: str | None) -> None:
    _assert_clean(lambda: fuzzing.event_target(data, name))


@MANY
@given(_json, st.sampled_from(fuzzing.EVENT_NAMES), st.none() | _json.filter(lambda v: isinstance(v, dict)))
def test_event_arbitrary_json(payload: Any, name: str | None, pr_event: Any) -> None:
    _assert_clean(lambda: fuzzing.event_target(json.dumps(payload), name, pr_event))


@MANY
@given(st.sampled_from(EVENTS), st.integers(0, 2**32), st.sampled_from(fuzzing.EVENT_NAMES), st.sampled_from([None, *EVENTS, {"pull_request": "x"}, {"number": 1e999}]))
def test_event_mutated(payload: dict[str, Any], seed: int, name: str | None, pr_event: Any) -> None:
    text = fuzzing.mutate_event(random.Random(seed), payload)
    _assert_clean(lambda: fuzzing.event_target(text, name, pr_event))


# -- patches -------------------------------------------------------------------------------------------


@MANY
@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=1500))
def test_patch_arbitrary_text(text: str) -> None:
    _assert_clean(lambda: fuzzing.patch_target(text))


@MANY
@given(st.text(alphabet=st.sampled_from(list("@@ -+,0123456789\n \\Nonewline\r\x0c\u2028")), max_size=300))
def test_patch_alphabet_soup(text: str) -> None:
    _assert_clean(lambda: fuzzing.patch_target("@@ -1,2 +1,2 @@\n" + text))


@MANY
@given(st.sampled_from(PATCHES), st.integers(0, 2**32))
def test_patch_mutated(patch: str, seed: int) -> None:
    mutated = fuzzing.mutate_patch(random.Random(seed), patch)
    _assert_clean(lambda: fuzzing.patch_target(mutated))


@MANY
@given(st.integers(0, 2**32))
def test_valid_patches_give_exactly_their_lines(seed: int) -> None:
    patch, added, context = fuzzing.valid_patch(random.Random(seed))
    _assert_clean(lambda: fuzzing.patch_target(patch, (added, context)))


# -- regressions: bugs this fuzzing found, fixed ------------------------------------------------------


def _config_error(tmp_path: Path, data: str | bytes, limit: float = 1.0) -> InputError:
    path = tmp_path / ".shardproof.yml"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        load_config(path)
    assert time.perf_counter() - t0 < limit
    assert e.value.path.endswith(".shardproof.yml")
    return e.value


MODEL = "version: 1\nmodels:\n  - {name: a, entry: 'm:f', tp: 2"


def test_config_not_utf8_names_the_byte(tmp_path: Path) -> None:
    e = _config_error(tmp_path, b"version: 1\nmodels:\n  - {name: caf\xe9, entry: 'm:f', tp: 2}\n")
    assert (e.where, e.message) == ("3:15", "not UTF-8 text (byte 0xe9)")


@pytest.mark.parametrize("value", ["2001-13-45", "2002-12-14t21:59:43.10-99:99", "0x_", "0b_", "!!int abc", "!!float ''", "!!timestamp abc", "!!bool maybe"])
def test_config_yaml_values_pyyaml_cannot_construct(tmp_path: Path, value: str) -> None:
    # PyYAML raises ValueError/KeyError/AttributeError/IndexError for these, not a YAMLError.
    e = _config_error(tmp_path, f"{MODEL}}}\n  - {{name: b, entry: 'm:f', tp: 2, description: {value}}}\n")
    assert e.where.startswith("4:") and "not valid YAML: cannot read" in e.message


def test_config_characters_yaml_refuses_name_their_line(tmp_path: Path) -> None:
    e = _config_error(tmp_path, f"{MODEL}}}\n# \x00\n")
    assert e.where == "4:3" and "unacceptable character #x0000" in e.message and "position" not in e.message


@pytest.mark.parametrize("nest", ["[", "{a: "])
def test_config_deep_flow_nesting_is_refused_fast(tmp_path: Path, nest: str) -> None:
    # PyYAML's scanner is quadratic in the depth (1.6 s at 2,000), then runs out of stack.
    close = "]" if nest == "[" else "}"
    e = _config_error(tmp_path, f"{MODEL}, size: {{x: {nest * 5000}1{close * 5000}}}}}\n", limit=0.5)
    assert e.where.startswith("3:") and "nested more than 100 levels deep" in e.message


def test_config_deep_block_nesting_is_a_clean_error(tmp_path: Path) -> None:
    e = _config_error(tmp_path, "x:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(900)))
    assert e.message == "not valid YAML: nested too deeply to read"


def test_config_billion_laughs_is_refused_fast(tmp_path: Path) -> None:
    # 9^8 values once expanded: the schema check and the line-number walk took forever.
    anchors = "x0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 8))
    e = _config_error(tmp_path, f"{anchors}{MODEL}, size: {{k: *a7}}}}\n")
    # Named at the first anchor that grows past the bound: x4, 9^5 values.
    assert e.where == "5" and e.message == "too large: more than 50000 values once aliases are expanded"


def test_config_recursive_alias_is_refused(tmp_path: Path) -> None:
    e = _config_error(tmp_path, "version: 1\nmodels: &m\n  - {name: a, entry: 'm:f', tp: 2, size: *m}\n")
    assert e.where == "2" and "an alias refers to a value that contains the alias" in e.message  # at &m


@pytest.mark.parametrize(("setting", "key"), [
    ("timeout: " + "9" * 400, "models[0].timeout"),  # float() of it overflowed
    ("timeout: .inf", "models[0].timeout"),
    ("timeout: .nan", "models[0].timeout"),
    ("verify: {timeout: .inf}", "models[0].verify.timeout"),
    ("tp: 1000000000000", "models[0].tp"),  # a group list of 10^12 ranks: a hang
])  # fmt: skip
def test_config_absurd_numbers_are_refused(tmp_path: Path, setting: str, key: str) -> None:
    e = _config_error(tmp_path, f"{MODEL}, {setting}}}\n")  # a second tp: the last one counts
    assert e.where == "3" and e.message.startswith(f"{key}: expected at most")


@pytest.mark.parametrize(("setting", "key"), [
    ('python_path: ["a\\0b"]', "python_path[0]"),
    ('root: "a\\0b"', "root"),
])  # fmt: skip
def test_config_paths_with_a_nul_are_not_folders(tmp_path: Path, setting: str, key: str) -> None:
    e = _config_error(tmp_path, f"{setting}\n{MODEL}}}\n")
    assert e.where == "1" and e.message.startswith(f"{key}: expected a folder")


@pytest.mark.parametrize("pattern", ["a{4294967296}", "(" * 2000 + ")" * 2000])
def test_config_layer_patterns_re_cannot_compile(tmp_path: Path, pattern: str) -> None:
    # OverflowError and RecursionError from re.compile, not re.error.
    e = _config_error(tmp_path, f"{MODEL}, layer_pattern: '{pattern}'}}\n")
    assert e.message.startswith("models[0].layer_pattern: expected a regular expression")


@pytest.mark.parametrize(("mapping", "key", "shown"), [
    ("size: {1: 2, a: 3}", "size[1]", "1"),  # sorting the knob names failed
    ("size: {on: 2}", "size.true", "true"),
    ("env: {2001-01-01: x}", "env.2001-01-01", "2001-01-01"),
])  # fmt: skip
def test_config_knob_names_that_yaml_reads_as_other_types(tmp_path: Path, mapping: str, key: str, shown: str) -> None:
    e = _config_error(tmp_path, f"{MODEL}, {mapping}}}\n")
    assert e.message == f"models[0].{key}: expected a name, got {shown}; quote it to make it one"


def test_config_a_null_key_is_named(tmp_path: Path) -> None:
    e = _config_error(tmp_path, f"null: 1\n{MODEL}}}\n")  # key_text() of None failed
    assert e.where == "1" and e.message.startswith("null: unknown key")


def _event_error(tmp_path: Path, data: str | bytes, name: str = "pull_request", pr_event: Any = None) -> InputError:
    path = tmp_path / "event.json"
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    with pytest.raises(InputError) as e:
        read_target(name, load_event(path), None, None, pr_event)
    return e.value


@pytest.mark.parametrize(("data", "message"), [
    (b'{"a": "caf\xe9"}', "the event file is not UTF-8 (byte 0xe9)"),
    ("[" * 100_000 + "]" * 100_000, "the event file is not usable JSON: nested too deeply"),
    ('{"number": ' + "1" * 5000 + "}", "the event file is not usable JSON: Exceeds the limit (4300 digits) for integer string conversion"),
])  # fmt: skip
def test_event_files_json_cannot_load(tmp_path: Path, data: str | bytes, message: str) -> None:
    e = _event_error(tmp_path, data)
    assert e.path == str(tmp_path / "event.json") and e.message == message


HEAD = "1" * 40
PR = {"head": {"sha": HEAD}, "number": 7}
REPO = {"full_name": "acme/models"}


@pytest.mark.parametrize(("name", "payload", "field"), [
    ("pull_request", {"pull_request": {**PR, "number": 1e999}, "repository": REPO}, "pull_request.number"),  # OverflowError
    ("pull_request", {"pull_request": {**PR, "number": True}, "repository": REPO}, "pull_request.number"),
    ("pull_request", {"pull_request": {"head": {"sha": None}, "number": 7}, "repository": REPO}, "pull_request.head.sha"),  # read as "None"
    ("pull_request", {"pull_request": {**PR, "base": "main"}}, "repository.full_name"),  # AttributeError
    ("workflow_run", {"workflow_run": {"head_sha": HEAD, "pull_requests": [{"number": "abc"}]}, "repository": REPO}, "workflow_run.pull_requests[0].number"),  # ValueError
    ("workflow_run", {"workflow_run": [HEAD], "repository": REPO}, "workflow_run"),
    ("push", {"after": {"sha": HEAD}, "repository": REPO}, "after"),  # read as "{'sha': ...}"
])  # fmt: skip
def test_event_fields_of_the_wrong_type_are_named(tmp_path: Path, name: str, payload: dict[str, Any], field: str) -> None:
    assert _event_error(tmp_path, json.dumps(payload), name).where == field


@pytest.mark.parametrize("wr", [
    {"head_sha": HEAD, "head_repository": "outsider/models"},  # AttributeError
    {"head_sha": HEAD, "head_repository": {"owner": "outsider"}},  # AttributeError
    {"head_sha": HEAD, "pull_requests": 5},  # TypeError
    {"head_sha": HEAD, "pull_requests": {"0": {"number": 9}}},  # KeyError
])  # fmt: skip
def test_event_workflow_run_odd_fields_count_as_missing(tmp_path: Path, wr: dict[str, Any]) -> None:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"workflow_run": wr, "repository": REPO}))
    t = read_target("workflow_run", load_event(path), None, None, {"pull_request": "x"})  # an odd artifact too
    assert (t.sha, t.pr, t.head_ref) == (HEAD, None, None)


@pytest.mark.parametrize("odd", ["\x0c", "\r", "\x0b", "\x1c", "\x85", "\u2028", "\u2029"])
def test_patch_lines_holding_what_splitlines_breaks_at(odd: str) -> None:
    # A form feed in a source line made the file lose every inline comment ("unexpected line").
    patch = f"@@ -1,3 +1,4 @@\n a{odd}b\n-c\n+d{odd}\n+e\n f"
    assert parse_patch(patch)[:2] == ({2, 3}, {1, 4})


def test_patch_with_a_count_too_long_for_int() -> None:
    patch = "@@ -1," + "9" * 5000 + " +1 @@\n+x"
    with pytest.raises(PatchError, match=r"^line 1: a number in the hunk header is too long$"):
        parse_patch(patch)
    # DiffIndex (what the bot calls) let the bare ValueError through: the whole report failed.
    index = DiffIndex.from_entries([{"filename": "a.py", "status": "modified", "patch": patch}, {"filename": "b.py", "status": "modified", "patch": "@@ -1 +1 @@\n-a\n+b"}])
    assert not index.files["a.py"].has_patch and index.commentable("b.py", 1)


def test_patch_with_overlapping_hunks() -> None:
    with pytest.raises(PatchError, match=r"^line 4: hunk starts at line 2, inside the previous hunk$"):
        parse_patch("@@ -1,2 +1,2 @@\n a\n b\n@@ -2,1 +2,1 @@\n-b\n+c")
