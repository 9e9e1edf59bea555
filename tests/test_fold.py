"""Folding repeated layers in the text (hlo.fold) before parsing: same verdicts as the unfolded
and whole-graph runs on every pair, classes that only names, metadata and channel ids may
share, strings compared whole, locations kept, and every doubt answered by not folding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis import partition
from shardproof.engine.analysis.check import check_files
from shardproof.engine.analysis.partition import DEFAULT_LAYER_PATTERN
from shardproof.engine.analysis.verify import Budget, Result
from shardproof.engine.errors import InputError
from shardproof.engine.hlo import fold as F
from shardproof.engine.relations import load_relations
from shardproof.engine.sourcemap import SourceMap

PAIRS = Path(__file__).parent / "pairs"
NAMES = sorted(p.name for p in PAIRS.iterdir() if (p / "expect.yaml").exists())
DEEP = PAIRS / "deep_mlp_tp4"
META_OP_NAME = {"baseline": lambda name, md: md, "distributed": lambda name, md: md}


def _check(d: Path, base: Path | None = None, dist: Path | None = None, **budget: object) -> Result:
    sm = SourceMap.load(d / "sourcemap.json") if (d / "sourcemap.json").exists() else None
    return check_files(load_relations(d / "relations.yaml"), base or d / "baseline.hlo", dist or d / "distributed.hlo", sm, Budget(**budget))  # type: ignore[arg-type]


def _sites(r: Result) -> list[tuple[str, int]]:
    return sorted((x["source"]["file"], x["source"]["line"]) for x in r.divergences)


def _fold(base: str, dist: str) -> F.Fold | None:
    return F.fold(base, dist, META_OP_NAME, DEFAULT_LAYER_PATTERN)


def _texts() -> tuple[str, str]:
    return (DEEP / "baseline.hlo").read_text(), (DEEP / "distributed.hlo").read_text()


def _edit_layer(text: str, layer: int, old: str, new: str, count: int = 1) -> str:
    """Replace ``old`` by ``new`` in the first ``count`` lines of ``layer`` that hold it."""
    lines = text.split("\n")
    done = 0
    for i, line in enumerate(lines):
        if done < count and f"layers.{layer}." in line and old in line:
            lines[i] = line.replace(old, new, 1)
            done += 1
    assert done == count, (layer, old)
    return "\n".join(lines)


@pytest.mark.parametrize("name", NAMES)
def test_folded_partitioned_and_whole_graph_runs_agree(name: str) -> None:
    d = PAIRS / name
    folded = _check(d)
    cut = _check(d, fold=False)
    whole = _check(d, fold=False, partition=False)
    assert folded.verdict == cut.verdict == whole.verdict == yaml.safe_load((d / "expect.yaml").read_text())["verdict"]
    assert _sites(folded) == _sites(cut) == _sites(whole)


def test_repeated_layers_are_folded_and_proven_from_their_blocks() -> None:
    r = _check(DEEP)
    assert r.verdict == "verified"
    # Layers 0-6 are one class: all folded, the first too (layer 7 differs: kept whole).
    assert r.stats["fold"] == {"folded_layers": 7}
    folded = [s for s in r.stats["segment_report"] if s.get("folded")]
    assert [s["layer"] for s in folded] == [0, 1, 2, 3, 4, 5, 6]
    # Each layer reads the facts its predecessor's block proof gave: one block proof serves
    # them when those facts repeat (input facts are part of the memo key).
    assert 1 <= sum(not s["reused"] for s in folded) <= 2
    # The trace runs through the placeholders and names the layer a proof was reused from.
    rules = [s["rule"] for t in r.trace for s in t["steps"]]
    assert any("up to names" in x for x in rules)


def test_a_bug_layer_is_not_folded_and_the_pair_is_checked_again_whole() -> None:
    d = PAIRS / "bug_deep_mlp_late_layer"
    f = _fold((d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text())
    assert f is not None and 6 not in f.layers and {1, 2, 3, 4, 5} <= set(f.layers)
    expect = yaml.safe_load((d / "expect.yaml").read_text())["bug_site"]
    # Rules alone: the folded run's divergence is asked again of the whole pair.
    sm = SourceMap.load(d / "sourcemap.json")
    rules_only = check_files(load_relations(d / "relations.yaml"), d / "baseline.hlo", d / "distributed.hlo", sm, Budget(), witness="never")
    assert rules_only.verdict == "diverged"
    assert rules_only.stats["fold"]["unfolded_because"].startswith("folded run diverged")
    assert (expect["file"], expect["line"]) in _sites(rules_only)
    # With the witness, a folded divergence it confirms stands without the unfolded run (its
    # facts are proven; the witness's values are the evidence), at the same line.
    r = _check(d)
    assert r.verdict == "diverged" and r.stats["fold"].get("witnessed_folded") is True
    assert r.witness is not None and r.witness["status"] == "confirmed"
    assert (expect["file"], expect["line"]) in _sites(r)


def test_memo_fingerprint_collisions_change_no_folded_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every segment and block gets the same fingerprint: the memo compares its keys in full.
    monkeypatch.setattr(partition, "fingerprint", lambda text: "collide")
    assert _check(DEEP).verdict == "verified"
    d = PAIRS / "bug_deep_mlp_late_layer"
    assert _check(d).verdict == "diverged"
    _, dist = _texts()
    # A folded layer whose block differs (a changed constant) under colliding fingerprints.
    r = _check(DEEP, dist=_write(DEEP, "distributed.hlo", _edit_layer(dist, 4, "constant(0.5)", "constant(0.25)")))
    assert r.verdict == "diverged"
    assert {s["fingerprint"] for s in r.stats["segment_report"]} == {"collide"}


_TMP: list[Path] = []


def _write(d: Path, name: str, text: str) -> Path:
    """A mutated copy next to nothing of the repository: a temporary folder per test run."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="shardproof-fold-"))
    _TMP.append(folder)
    p = folder / name
    p.write_text(text)
    return p


@pytest.fixture(autouse=True)
def _cleanup() -> object:
    yield
    import shutil

    while _TMP:
        shutil.rmtree(_TMP.pop(), ignore_errors=True)


def test_the_folded_text_keeps_every_line_in_place() -> None:
    base, dist = _texts()
    f = _fold(base, dist)
    assert f is not None
    for original, folded in ((base, f.baseline_text), (dist, f.distributed_text)):
        a, b = original.split("\n"), folded.split("\n")
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert y in ("", x) or F.FOLD_TARGET in y
            if F.FOLD_TARGET in y:
                assert y.split(" = ")[0] == x.split(" = ")[0]  # the placeholder takes its output's line


def test_metadata_and_channel_ids_do_not_separate_layers() -> None:
    base, dist = _texts()
    dist = _edit_layer(dist, 4, "source_line=384", "source_line=999", count=3)
    dist = _edit_layer(dist, 4, "channel_id=1", "channel_id=77")
    f = _fold(base, dist)
    assert f is not None and set(f.layers) == {0, 1, 2, 3, 4, 5, 6}  # a class's first layer is folded too
    assert len({fl.cls for fl in f.layers.values()}) == 1


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("channel_id=1, ", ""),  # a collective without a channel id reads its groups otherwise
        ("constant(0.5)", "constant(0.25)"),  # a literal
        ("dimensions={1,0}", "dimensions={0,1}"),  # an attribute
        ("replica_groups={{0,1,2,3}}", "replica_groups={{0,1},{2,3}}"),
        ("dot(f32[8,32]{1,0} %multiply.137,", "dot(f32[8,32]{1,0} %dot.126,"),  # wiring
    ],
)
def test_a_layer_that_differs_in_value_is_not_folded(old: str, new: str) -> None:
    base, dist = _texts()
    dist2 = _edit_layer(dist, 4, old, new)
    assert dist2 != dist
    f = _fold(base, dist2)
    assert f is not None and 4 not in f.layers


def test_strings_are_compared_whole_and_names_inside_them_are_not_renamed() -> None:
    base, dist = _texts()

    def tag(text: str, layer: int, value: str) -> str:
        return _edit_layer(text, layer, "rhs_contracting_dims={0}", f'rhs_contracting_dims={{0}}, frontend_attributes={{note="{value}"}}')

    # The same string in every layer: still one class.
    same = dist
    for k in range(8):
        same = tag(same, k, "%dot.1, metadata={op_name=\\\"x\\\"}")
    f = _fold(base, same)
    assert f is not None and set(f.layers) == {0, 1, 2, 3, 4, 5, 6}
    # Strings that differ only by a %name or by what follows a metadata-like text inside them.
    for v4, v5 in (("%dot.1", "%dot.2"), ("a, metadata={op_name=\\\"x\\\"}", "a, metadata={op_name=\\\"y\\\"}")):
        text = dist
        for k in range(8):
            text = tag(text, k, v5 if k == 5 else v4)
        f = _fold(base, text)
        assert f is not None and 5 not in f.layers and 4 in f.layers


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("f32[8,32]{1,0} %add.125,", "f32[8,32]{1,0} add.125,"),  # an operand without %
        ("%transpose.20)", "%transpose.999)"),  # used before (never) defined
    ],
)
def test_text_not_in_the_printers_form_is_not_folded(old: str, new: str) -> None:
    base, dist = _texts()
    assert _fold(base, dist.replace(old, new, 1)) is None


def test_bad_input_in_a_repeated_layer_is_reported_at_its_line() -> None:
    _, dist = _texts()
    lines = dist.split("\n")
    n = next(i for i, x in enumerate(lines) if "layers.5." in x and "multiply(" in x)
    lines[n] = lines[n].replace("f32[8,32]{1,0} multiply", "f33[8,32]{1,0} multiply", 1)
    bad = _write(DEEP, "distributed.hlo", "\n".join(lines))
    with pytest.raises(InputError) as e:
        _check(DEEP, dist=bad)
    assert re.search(rf":{n + 1}:\d+", str(e.value)) and "f33" in str(e.value)


def test_fold_can_be_turned_off() -> None:
    r = _check(DEEP, fold=False)
    assert r.verdict == "verified" and r.stats["fold"] == {"folded_layers": 0}
    assert not any(s.get("folded") for s in r.stats["segment_report"])


def test_a_reducer_with_another_body_separates_layers() -> None:
    # Layer 4's all-reduce calls its own computation; make it a max instead of an add.
    base, dist = _texts()
    changed = dist.replace("ROOT %add.142 = f32[] add(f32[] %x.140, f32[] %y.141)", "ROOT %add.142 = f32[] maximum(f32[] %x.140, f32[] %y.141)")
    assert changed != dist and "to_apply=%AddComputation.139" in changed
    f = _fold(base, changed)
    assert f is not None and 4 not in f.layers and {5, 6} <= set(f.layers)
    r = _check(DEEP, dist=_write(DEEP, "distributed.hlo", changed))
    assert r.verdict == "diverged"


def test_the_block_proof_reads_only_the_block() -> None:
    # The text a folded layer is proven from: its own lines, outside values as parameters, the
    # ROOT a tuple of its outputs, every kept line at its original number.
    base, dist = _texts()
    f = _fold(base, dist)
    assert f is not None
    fl = f.layers[3]
    text = f.block_text("distributed", fl)
    lines, original = text.split("\n"), dist.split("\n")
    kept = [i for i, x in enumerate(lines) if x.strip() and not x.startswith(("HloModule", "%", "ENTRY", "}", "  ROOT %shardproof"))]
    body = {i for i in kept if lines[i].startswith("  %") and i > next(j for j, x in enumerate(lines) if x.startswith("ENTRY"))}
    assert body and all("layers.3." in original[i] or " parameter(" in lines[i] or "constant(" in lines[i] for i in body)
    assert f"tuple({', '.join('%' + o for o in fl.distributed.outputs)})" in text


def test_mutated_texts_fold_cleanly_and_never_verify_what_the_whole_pair_does_not() -> None:
    # Seeded single-point mutations of the layered pair's distributed text: the fold never
    # crashes, and a folded "verified" is never an unfolded "diverged" (the fold may only save
    # time, never change the answer).
    import random

    base, dist = _texts()
    lines = dist.split("\n")
    body = [i for i, x in enumerate(lines) if "layers." in x and " = " in x]
    rng = random.Random(1125)
    edits = [("constant(0.5)", "constant(0.75)"), ("add(", "subtract("), ("{1,0}", "{0,1}"), ("multiply(", "maximum("), ("%", ""), ("f32[8,32]", "f32[32,8]"), ("), ", ") "), ("channel_id=1, ", "")]
    disagreements = []
    tried = 0
    for n in range(60):
        i = rng.choice(body)
        fits = [e for e in edits if e[0] in lines[i]]
        if not fits:
            continue
        old, new = rng.choice(fits)
        tried += 1
        mutated = list(lines)
        mutated[i] = mutated[i].replace(old, new, 1)
        text = "\n".join(mutated)
        _fold(base, text)  # never raises
        path = _write(DEEP, "distributed.hlo", text)
        try:
            folded = _check(DEEP, dist=path)
        except InputError:
            with pytest.raises(InputError):
                _check(DEEP, dist=path, fold=False)
            continue
        if folded.verdict == "verified" and _check(DEEP, dist=path, fold=False).verdict != "verified":
            disagreements.append((n, i, old, new))
    assert tried >= 50 and disagreements == []


# Counterexamples a review found (each was folded "verified", unfolded not): regressions.


def _disagree(dist_text: str) -> tuple[str, str]:
    path = _write(DEEP, "distributed.hlo", dist_text)
    return _check(DEEP, dist=path).verdict, _check(DEEP, dist=path, fold=False).verdict


def test_a_comment_across_lines_is_read_as_the_parser_reads_it() -> None:
    # Dead lines after each layer open and close a comment; in layer 6 the comment swallows
    # layer 7 and the ROOT, so the program computes 7 layers. The fold must see that too.
    _, dist = _texts()
    lines = dist.split("\n")
    e = next(i for i, x in enumerate(lines) if x.startswith("ENTRY"))
    c = next(i for i in range(e, len(lines)) if lines[i] == "}")
    layers: dict[int, list[str]] = {}
    root = ""
    for x in lines[e + 1 : c]:
        if x.strip().startswith("ROOT"):
            root = x
            continue
        layers.setdefault(int(re.search(r'op_name="model\.layers\.(\d+)\.', x).group(1)), []).append(x)  # type: ignore[union-attr]
    early7 = [x for x in layers[7] if " parameter(" in x or " transpose(" in x or " constant(" in x]
    out: list[str] = []
    for k in range(7):
        out += layers[k] + (early7 if k == 6 else [])
        last = re.match(r"\s*%([\w.\-]+) = ", layers[k][-1]).group(1)  # type: ignore[union-attr]
        out.append(f"  %deadA.{k} = (f32[8,32]{{1,0}}) tuple(f32[8,32]{{1,0}} %{last}), /*")
        if k == 6:
            out += [x for x in layers[7] if x not in early7] + [root]
        out.append(f"  %deadB.{k} = f32[8,32]{{1,0}} negate(f32[8,32]{{1,0}} %{last}), foo=*/ metadata={{}}")
    folded, whole = _disagree("\n".join(lines[: e + 1] + out + lines[c:]))
    assert folded == whole != "verified"


def test_metadata_inside_a_comment_never_hides_an_attribute() -> None:
    _, dist = _texts()
    lines = dist.split("\n")
    n = 0
    for i, x in enumerate(lines):
        m = re.match(r'(\s*%transpose\.\d+ = \S+ transpose\([^)]*\)), dimensions=\{1,0\}, metadata=\{[^\n]*op_name="model\.layers\.(\d+)\.', x)
        if m:
            dims = "{0,1}" if (m.group(2) == "4" and n == 0) else "{1,0}"
            n += m.group(2) == "4"
            lines[i] = m.group(1) + ', sharding={replicated} /* , metadata={op_name="*/, dimensions=' + dims + ', backend_config="}"'
    folded, whole = _disagree("\n".join(lines))
    assert folded == whole != "verified"


def test_instruction_names_equal_to_computation_names_are_not_folded() -> None:
    # Reducer parameters renamed like dummy computations, and layer 4's reducer made x + x.
    _, dist = _texts()
    dummies: list[str] = []

    def rename(m: re.Match[str]) -> str:
        n, body = m.group(1), m.group(0)
        x, y = re.search(r"%(x\.\d+)", body).group(1), re.search(r"%(y\.\d+)", body).group(1)  # type: ignore[union-attr]
        body = body.replace(x, f"Dx{n}").replace(y, f"Dy{n}")
        if n == "139":
            body = body.replace(f"%Dy{n})", f"%Dx{n})")
        dummies.extend(f"%{d} (p.{d}: f32[]) -> f32[] {{\n  ROOT %q.{d} = f32[] parameter(0)\n}}\n" for d in (f"Dx{n}", f"Dy{n}"))
        return body

    text = re.sub(r"%AddComputation\.(\d+) \(.*?\n}\n", rename, dist, flags=re.S)
    head, rest = text.split("\n\n", 1)
    text = head + "\n\n" + "\n".join(dummies) + "\n" + rest
    assert _fold(_texts()[0], text) is None
    folded, whole = _disagree(text)
    assert folded == whole != "verified"
