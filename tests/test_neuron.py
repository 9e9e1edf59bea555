"""Neuron's dumps as they are, and the explicit assumption for elided constants (issue 26).

The Entangle pairs under tests/neuron/ are real transformers-neuronx output (Apache-2.0, see
tests/neuron/README.md): their printer elided the rotary ``inv_freq`` constant as ``{...}``. Without
an assumption such a pair is ``unsupported``; with ``--assume elided-constants`` (relations
``assume:``, ``.shardproof.yml`` ``verify: {assume: [...]}``) the distributed constant is the
baseline's of the same name, shape and type, and the verdict says so. The witness part (fill
the assumed pair alike, execute Neuron's custom-calls spelled out) runs on a small hand-written
Neuron-style pair: the Entangle pairs take about a minute to execute (bench/neuron_table.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from shardproof.engine.analysis.check import check_files, executable_text
from shardproof.engine.cli import main
from shardproof.engine.errors import InputError
from shardproof.engine.hlo.flavours import neuron_executable
from shardproof.engine.hlo.literals import ASSUMED_EQUAL, assume_elided_equal
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import load_relations, parse_relations, with_assumptions

DATA = Path(__file__).parent / "neuron"
BASE = DATA / "tp1_layer1.hlo"


def _check(capsys: pytest.CaptureFixture[str], tmp_path: Path, dist: str, relations: Path, *extra: str) -> tuple[int, list[str], dict]:
    out = tmp_path / "result.json"
    code = main(["check", str(BASE), str(DATA / dist), "--relations", str(relations), "--json", str(out), *extra])
    return code, capsys.readouterr().out.splitlines(), json.loads(out.read_text())


def test_an_entangle_pair_is_unsupported_without_the_assumption(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, lines, doc = _check(capsys, tmp_path, "tp2_layer1.hlo", DATA / "tp2_layer1.relations.yaml", "--witness", "never")
    assert code == 2 and doc["verdict"] == "unsupported" and doc["assumptions"] == []
    assert lines[0].startswith("unsupported: distributed %constant.22 (constant): constant f32[32] is printed as {...}")
    assert "--assume elided-constants" in lines[0]  # the way out, named where the proof stops
    assert {(u["side"], u["instruction"]) for u in doc["unsupported"]} == {("baseline", "constant.22"), ("distributed", "constant.22")}


def test_an_entangle_pair_verifies_under_the_assumption_and_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, lines, doc = _check(capsys, tmp_path, "tp2_layer1.hlo", DATA / "tp2_layer1.relations.yaml", "--assume", "elided-constants")
    assert code == 0 and doc["verdict"] == "verified"
    assert lines[0] == "verified (assuming elided constants equal by name): all 3 output(s) have their expected relation"
    [a] = doc["assumptions"]
    assert a["name"] == "elided-constants" and a["text"] == "elided constants equal by name" and a["not_assumed"] == []
    assert a["constants"] == [{"name": "%constant.22", "shape": "f32[32]", "baseline_line": 40, "distributed_line": 52}]


def test_assume_in_the_relations_file_verifies_tp8(tmp_path: Path) -> None:
    spec = load_relations(DATA / "tp8_layer1.relations.yaml")
    assert spec.assume == ("elided-constants",)
    result = check_files(spec, BASE, DATA / "tp8_layer1.hlo", witness="never")
    assert result.verdict == "verified", result.reason
    assert [c["name"] for c in result.assumptions[0]["constants"]] == ["%constant.22"]


def test_the_broken_entangle_pair_diverges_at_its_qkv_slice(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, lines, doc = _check(capsys, tmp_path, "tp2_layer1.broken.hlo", DATA / "tp2_layer1.relations.yaml", "--assume", "elided-constants", "--witness", "never")
    assert code == 1 and doc["verdict"] == "diverged" and doc["assumptions"]
    assert lines[0].startswith("diverged (assuming elided constants equal by name): ")
    [d] = doc["divergences"]
    # slice={[0:256], [0:256]}: the K block read from the queries' columns (correct: [1024:1280]).
    assert d["instruction"] == "%slice.54" and d["opcode"] == "slice"
    assert d["source"]["file"].endswith("transformers_neuronx/hlo.py") and d["source"]["line"] == 1935


def test_only_namesakes_of_the_same_shape_and_type_are_equated() -> None:
    def prog(consts: str) -> str:
        return f"HloModule m\n\nENTRY %e () -> f32[] {{\n{consts}  ROOT %z = f32[] constant(0)\n}}\n"

    base = parse_hlo(prog("  %a = f32[32]{0} constant({...})\n  %b = f32[16]{0} constant({...})\n  %c = f32[16]{0} constant({...})\n"), "b.hlo")
    dist = parse_hlo(prog("  %a = f32[32]{0} constant({...})\n  %b = f32[8]{0} constant({...})\n  %d = f32[16]{0} constant({...})\n  %c = f16[16]{0} constant({...})\n"), "d.hlo")
    pairs, left = assume_elided_equal(base, dist)
    assert [p.name for p in pairs] == ["a"]
    assert any("%b is f32[8], the baseline's is f32[16]" in s for s in left)
    assert any("%d" in s and "no elided constant of that name" in s for s in left)
    assert any("%c is f16[16]" in s for s in left)
    assert base.entry["a"].parsed[ASSUMED_EQUAL] == "a" and dist.entry["a"].parsed[ASSUMED_EQUAL] == "a"
    assert ASSUMED_EQUAL not in dist.entry["d"].parsed and ASSUMED_EQUAL not in base.entry["b"].parsed


def test_assumptions_in_relations_are_checked() -> None:
    base = {"groups": [[0, 1]], "inputs": [], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    with pytest.raises(InputError, match=r"assume.*unknown assumption 'constants'; expected one of elided-constants"):
        parse_relations({**base, "assume": ["constants"]}, "r.yaml")
    with pytest.raises(InputError, match=r"assume.*expected a list of assumption names"):
        parse_relations({**base, "assume": "elided-constants"}, "r.yaml")
    spec = parse_relations(base, "r.yaml")
    assert spec.assume == () and with_assumptions(spec, ["elided-constants"]).assume == ("elided-constants",)


# ---- a small Neuron-style pair the witness executes ----------------------------------------

def _pair(rows: int, bug: str = "") -> str:
    """exp(rmsnorm(transfer(x), w) * c): rows of x split over 4 ranks and gathered back; ``c``
    an elided f32[16] constant. ``bug``: ``reverse`` scales by c reversed on the ranks."""
    scale = "  %cr = f32[16]{0} reverse(%c), dimensions={0}\n" if bug == "reverse" else ""
    use = "%cr" if bug == "reverse" else "%c"
    gather = "  ROOT %g = f32[8,16]{1,0} all-gather(%e), dimensions={0}, replica_groups={{0,1,2,3}}\n" if rows != 8 else ""
    root = "" if rows != 8 else "ROOT "
    return f"""HloModule neuron_style

ENTRY %main (x: f32[{rows},16], w: f32[16]) -> f32[8,16] {{
  %x = f32[{rows},16]{{1,0}} parameter(0)
  %w = f32[16]{{0}} parameter(1)
  %t = f32[{rows},16]{{1,0}} custom-call(%x), custom_call_target="AwsNeuronTransferWithStaticRing", api_version=API_VERSION_UNSPECIFIED
  %eps = f32[] constant(1e-05)
  %n = f32[{rows},16]{{1,0}} custom-call(%t, %w, %eps), custom_call_target="AwsNeuronRmsNorm", api_version=API_VERSION_UNSPECIFIED, backend_config="1"
  %c = f32[16]{{0}} constant({{...}})
{scale}  %cb = f32[{rows},16]{{1,0}} broadcast({use}), dimensions={{1}}
  %m = f32[{rows},16]{{1,0}} multiply(%n, %cb)
  {root}%e = f32[{rows},16]{{1,0}} exponential(%m)
{gather}}}
"""


RELATIONS = {
    "groups": [[0, 1, 2, 3]],
    "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}, {"baseline": 1, "distributed": 1, "relation": "duplicate"}],
    "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    "custom_calls": [{"target": "AwsNeuronTransferWithStaticRing", "keeps": "all"}, {"target": "AwsNeuronRmsNorm", "keeps": ["duplicate", "sharded"], "reduces": [1]}],
}


def _files(tmp_path: Path, bug: str = "", assume: bool = False) -> tuple[Path, Path, Path]:
    (tmp_path / "b.hlo").write_text(_pair(8))
    (tmp_path / "d.hlo").write_text(_pair(2, bug))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({**RELATIONS, **({"assume": ["elided-constants"]} if assume else {})}))
    return tmp_path / "b.hlo", tmp_path / "d.hlo", tmp_path / "r.yaml"


def test_neuron_calls_spelled_out_are_plain_hlo_xla_runs() -> None:
    text = neuron_executable(_pair(8))
    assert "AwsNeuron" not in text and "custom-call" not in text
    assert "rsqrt(" in text and "reduce(" in text and "%t = f32[8,16]{1,0} copy(%x)" in text
    module = parse_hlo(text, "spelled.hlo")
    assert module.entry["n"].opcode == "convert"  # the call's value keeps its name
    assert neuron_executable("HloModule x\n") == "HloModule x\n"


def test_the_witness_executes_the_assumption_equal_pair_verified_and_executed(tmp_path: Path) -> None:
    b, d, r = _files(tmp_path, assume=True)
    result = check_files(load_relations(r), b, d, witness="always")
    assert result.verdict == "verified", result.reason
    assert result.witness is not None and result.witness["status"] == "equal", result.witness
    filled = executable_text(b.read_text(), ["c"])
    assert "{...}" not in filled and filled.count("constant({") == 1


def test_a_divergence_under_the_assumption_is_confirmed_and_reproduced(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    b, d, r = _files(tmp_path, bug="reverse")
    out = tmp_path / "result.json"
    code = main(["check", str(b), str(d), "--relations", str(r), "--assume", "elided-constants", "--json", str(out)])
    lines = capsys.readouterr().out.splitlines()
    doc = json.loads(out.read_text())
    assert code == 1 and lines[0].startswith("diverged (assuming elided constants equal by name)"), lines
    assert doc["witness"]["status"] == "confirmed" and doc["witness"]["command"].endswith("--assume elided-constants")
    assert doc["divergences"][0]["instruction"] in ("%cr", "%m")  # where the reversed constant enters
    # The reproducing command: the same values in both programs, the same difference.
    assert main(["witness", str(b), str(d), "--relations", str(r), "--assume", "elided-constants", "--seed", "0"]) == 1
    # Without the assumption the witness refuses to invent the constant's values: no verdict.
    assert main(["witness", str(b), str(d), "--relations", str(r), "--seed", "0"]) == 2


def test_without_the_assumption_the_small_pair_is_unsupported(tmp_path: Path) -> None:
    b, d, r = _files(tmp_path)
    result = check_files(load_relations(r), b, d, witness="never")
    assert result.verdict == "unsupported" and result.assumptions == []


def test_shardproof_yml_verify_assume_reaches_the_verdict(tmp_path: Path) -> None:
    from shardproof.engine.frontend.config import load_config
    from shardproof.engine.frontend.runner import verify_model

    (tmp_path / ".shardproof.yml").write_text("version: 1\nmodels:\n  - name: neuron_tp2\n    entry: m:f\n    tp: 2\n    verify: {assume: [elided-constants], witness: never}\n")
    [model] = load_config(tmp_path / ".shardproof.yml").models
    folder = tmp_path / "neuron_tp2"
    folder.mkdir()
    shutil.copy(BASE, folder / "baseline.hlo")
    shutil.copy(DATA / "tp2_layer1.hlo", folder / "distributed.hlo")
    shutil.copy(DATA / "tp2_layer1.relations.yaml", folder / "relations.yaml")
    (folder / "sourcemap.json").write_text("{}")
    status, doc, err = verify_model(model, folder)
    assert err is None and status == "verified" and doc is not None and doc["assumptions"][0]["name"] == "elided-constants"
    (tmp_path / ".shardproof.yml").write_text("version: 1\nmodels:\n  - name: m\n    entry: m:f\n    verify: {assume: [elided]}\n")
    with pytest.raises(InputError, match=r"\.shardproof\.yml:5: models\[0\]\.verify\.assume\[0\]: expected one of elided-constants, got 'elided'"):
        load_config(tmp_path / ".shardproof.yml")


def test_the_review_summary_and_sarif_name_the_assumption(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _check(capsys, tmp_path, "tp2_layer1.hlo", DATA / "tp2_layer1.relations.yaml", "--assume", "elided-constants", "--witness", "never")
    out = tmp_path / "report"
    assert main(["report", "--result", str(tmp_path / "result.json"), "--out", str(out)]) == 0
    for name in ("review.md", "summary.md", "check.md"):
        assert "verified (assuming elided constants equal by name)" in (out / name).read_text(), name
    assert "verified equivalent to the single-device baseline (1 of 1 assuming elided constants equal by name)" in (out / "review.md").read_text()
    sarif = json.loads((out / "report.sarif").read_text())["runs"][0]
    assert sarif["properties"]["models"][0]["assumptions"] == ["elided constants equal by name"]
    notes = [n["message"]["text"] for n in sarif["invocations"][0]["toolExecutionNotifications"] if n["level"] == "note"]
    assert any(n.endswith("verified (assuming elided constants equal by name)") for n in notes), notes


def test_fill_elided_writes_namesakes_alike_and_nothing_else() -> None:
    from shardproof.engine.witness.inputs import fill_elided

    base = "  %ba = f32[2]{0} constant({...})\n  %a = f32[2]{0} constant({...})\n  %c = s32[2,2] constant({...})\n"
    dist = "  %a = f32[2]{0} constant({...}), metadata={op_name=\"x\"}\n  %c = s32[2,2]{1,0} constant({...})\n"
    fb, fd = fill_elided(base, ["a", "c"]), fill_elided(dist, ["a", "c"])
    assert "%ba = f32[2]{0} constant({...})" in fb  # not the tail of another name
    lit = fb.split("%a = f32[2]{0} constant(")[1].split(")")[0]
    assert lit != "{...}" and f"%a = f32[2]{{0}} constant({lit}), metadata" in fd
    assert "{{" in fb.split("%c = s32[2,2] constant(")[1] and "{...}" not in fd


def _two_constants(use: str, rows: int) -> str:
    gather = "  ROOT %g = f32[8,16]{1,0} all-gather(%m), dimensions={0}, replica_groups={{0,1,2,3}}\n" if rows != 8 else ""
    root = "ROOT " if rows == 8 else ""
    return f"""HloModule two_constants

ENTRY %main (x: f32[{rows},16]) -> f32[8,16] {{
  %x = f32[{rows},16]{{1,0}} parameter(0)
  %c1 = f32[16]{{0}} constant({{...}})
  %c2 = f32[16]{{0}} constant({{...}})
  %cb = f32[{rows},16]{{1,0}} broadcast(%{use}), dimensions={{1}}
  {root}%m = f32[{rows},16]{{1,0}} multiply(%x, %cb)
{gather}}}
"""


def test_the_assumption_equates_namesakes_only(tmp_path: Path) -> None:
    # Both programs hold two elided f32[16] constants; the ranks scale by the other one.
    # Assumed: c1 = c1 and c2 = c2, nothing about c1 against c2, so no proof; the witness
    # fills c1 and c2 with different values and shows the difference.
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}],
           "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}], "assume": ["elided-constants"]}
    (tmp_path / "b.hlo").write_text(_two_constants("c1", 8))
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(rel))
    for use, verdict in (("c1", "verified"), ("c2", "diverged")):
        (tmp_path / "d.hlo").write_text(_two_constants(use, 2))
        result = check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo")
        assert result.verdict == verdict, (use, result.reason)
        assert [c["name"] for c in result.assumptions[0]["constants"]] == ["%c1", "%c2"]
    assert result.witness is not None and result.witness["status"] == "confirmed"
    # A namesake of another shape stays unknown, and the reason says why.
    (tmp_path / "d.hlo").write_text(_two_constants("c1", 2).replace("%c1 = f32[16]{0}", "%c1 = f32[16,1]{1,0}").replace("broadcast(%c1), dimensions={1}", "broadcast(%c1), dimensions={1,0}").replace("%cb = f32[2,16]{1,0} broadcast(%c1), dimensions={1,0}", "%c1r = f32[16]{0} reshape(%c1)\n  %cb = f32[2,16]{1,0} broadcast(%c1r), dimensions={1}"))
    result = check_files(load_relations(tmp_path / "r.yaml"), tmp_path / "b.hlo", tmp_path / "d.hlo", witness="never")
    assert result.verdict == "unsupported" and "%c1 is f32[16,1], the baseline's is f32[16]" in result.reason


def test_a_neuron_decoder_is_cut_at_its_layers() -> None:
    from shardproof.engine.hlo.flavours import neuron_layers

    module = parse_hlo(BASE.read_text(), "tp1_layer1.hlo")
    labelled = neuron_layers(module)
    norms = [i for i in labelled.entry.instructions if i.parsed.get("custom_call_target") == "AwsNeuronRmsNorm"]
    # attention and MLP norm of layer 0, then the final norm of the head
    assert [i.metadata.op_name.split("/")[0] for i in norms] == ["layers.0", "layers.0", "layers.1"]
    assert all(not i.metadata.op_name for i in module.entry.instructions)  # the input is not changed
    assert neuron_layers(labelled) is labelled  # a program that names its layers keeps them
    spec = load_relations(DATA / "tp8_layer1.relations.yaml")
    result = check_files(spec, BASE, DATA / "tp8_layer1.hlo", witness="never")
    assert result.verdict == "verified" and result.stats["segments"] == 3 and result.stats["saturated"]
