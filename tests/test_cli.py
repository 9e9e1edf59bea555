"""The check command's contract: verdict lines, exit codes, JSON, and clear bad-input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardproof.engine.cli import main

HERE = Path(__file__).parent / "hlo_handwritten"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_verified_pair_exits_0_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code, stdout, _ = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(HERE / "mlp_distributed.hlo"), "--relations", str(HERE / "mlp_relations.yaml"), "--json", str(out))
    assert code == 0
    assert stdout.splitlines()[0].startswith("verified:")
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "verified" and doc["divergences"] == []
    rules = [s["rule"] for s in doc["trace"][0]["steps"]]
    assert "partition/dot-contract-sharded" in rules
    assert "collectives/all-reduce-discharges-partial" in rules


def test_wrong_groups_diverges_with_source_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = tmp_path / "d.hlo"
    dist.write_text((HERE / "mlp_distributed.hlo").read_text().replace("replica_groups={{0,1}}", "replica_groups={{0},{1}}"))
    out = tmp_path / "r.json"
    code, stdout, _ = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(dist), "--relations", str(HERE / "mlp_relations.yaml"), "--json", str(out))
    assert code == 1
    lines = stdout.splitlines()
    assert lines[0].startswith("diverged:")
    assert lines[1].startswith("model.py:13  %r  ")
    d = json.loads(out.read_text())["divergences"][0]
    assert d["instruction"] == "%r" and d["opcode"] == "all-reduce"
    assert d["source"] == {"file": "model.py", "line": 13, "function": ""}
    assert "replica groups" in d["cause"]


def test_unknown_opcode_is_unsupported_never_verified(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = tmp_path / "d.hlo"
    dist.write_text((HERE / "mlp_distributed.hlo").read_text().replace("tanh(%h)", "frobnicate(%h)"))
    code, stdout, _ = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(dist), "--relations", str(HERE / "mlp_relations.yaml"))
    assert code == 2
    assert stdout.startswith("unsupported:") and "frobnicate" in stdout


def test_undeclared_custom_call_is_unsupported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = tmp_path / "d.hlo"
    dist.write_text((HERE / "mlp_distributed.hlo").read_text().replace("tanh(%h)", 'custom-call(%h), custom_call_target="MyNorm"'))
    code, stdout, _ = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(dist), "--relations", str(HERE / "mlp_relations.yaml"))
    assert code == 2 and "MyNorm" in stdout


def test_malformed_hlo_exits_3_with_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.hlo"
    text = (HERE / "mlp_distributed.hlo").read_text().replace("%a = f32[4,8]{1,0} tanh", "%a = f33[4,8]{1,0} tanh")
    bad.write_text(text)
    code, _, err = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(bad), "--relations", str(HERE / "mlp_relations.yaml"))
    assert code == 3
    lineno, line = next((i, line) for i, line in enumerate(text.splitlines(), 1) if "f33" in line)
    assert f"bad.hlo:{lineno}:{line.index('f33') + 1}:" in err
    assert "f33" in err


@pytest.mark.parametrize(
    ("yaml_text", "where"),
    [
        ("groups: [[0, 1]]\ninputs: []\noutputs: [{baseline: 0, distributed: 0, relation: duplicate}]\n", "has no relation"),
        ("groups: 4\ninputs: []\noutputs: []\n", ":groups:"),
        ("groups: [[0, 1]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: shardded}\noutputs: []\n", "inputs[0].relation"),
        ("groups: [[0, 1]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded}\noutputs: []\n", "inputs[0].dim"),
        ("groups: [[0, 1]\n", "not valid YAML"),
    ],
)
def test_bad_relations_exit_3_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, where: str) -> None:
    rel = tmp_path / "rel.yaml"
    rel.write_text(yaml_text)
    code, _, err = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(HERE / "mlp_distributed.hlo"), "--relations", str(rel))
    assert code == 3
    assert "rel.yaml" in err and where in err


def test_shape_mismatch_in_relations_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rel = tmp_path / "rel.yaml"
    rel.write_text((HERE / "mlp_relations.yaml").read_text().replace("relation: sharded, dim: 0", "relation: sharded, dim: 1"))
    code, _, err = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(HERE / "mlp_distributed.hlo"), "--relations", str(rel))
    assert code == 3 and "inputs[1]" in err and "f32[16,4]" in err


def test_usage_error_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "check", "only-one.hlo")
    assert code == 3


def test_layout_path_uses_bijection_and_bug_is_blamed_on_the_layout_op(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "check", str(HERE / "layout_baseline.hlo"), str(HERE / "layout_distributed.hlo"), "--relations", str(HERE / "layout_relations.yaml"))
    assert code == 0
    out = tmp_path / "r.json"
    code, _, _ = run(capsys, "check", str(HERE / "layout_baseline.hlo"), str(HERE / "layout_bug_distributed.hlo"), "--relations", str(HERE / "layout_relations.yaml"), "--json", str(out))
    assert code == 1
    doc = json.loads(out.read_text())
    assert doc["divergences"][0]["instruction"] == "%tr"
    assert "transpose(1,0,2)" in doc["divergences"][0]["cause"]
    assert doc["outputs"][0]["found"] == ["layout(dup, bijection=[reshape(64,4,32), transpose(1,0,2), reshape(256,32)])"]


def test_ill_typed_hlo_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text((HERE / "mlp_distributed.hlo").read_text().replace("%o = f32[4,8]{1,0} dot(%a, %w2)", "%o = f32[4,9]{1,0} dot(%a, %w2)"))
    code, _, err = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(bad), "--relations", str(HERE / "mlp_relations.yaml"))
    assert code == 3
    assert "bad.hlo:" in err and "%o (dot) is ill-typed" in err and "[4, 8]" in err


def test_global_device_ids_without_groups_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by the mutation campaign: XLA refuses this module, so it must not be "verified".
    pair = Path(__file__).parent / "pairs" / "attention_tp4"
    bad = tmp_path / "distributed.hlo"
    text = (pair / "distributed.hlo").read_text()
    assert "replica_groups={{0,1,2,3}}, use_global_device_ids=true" in text
    bad.write_text(text.replace("replica_groups={{0,1,2,3}}, use_global_device_ids=true", "replica_groups={}, use_global_device_ids=true", 1))
    code, _, err = run(capsys, "check", str(pair / "baseline.hlo"), str(bad), "--relations", str(pair / "relations.yaml"))
    assert code == 3
    assert "distributed.hlo:" in err and "use_global_device_ids=true needs explicit replica_groups" in err


def test_exhausted_budget_is_inconclusive_naming_the_layers(capsys: pytest.CaptureFixture[str]) -> None:
    d = Path(__file__).parent / "pairs" / "deep_mlp_tp4"
    code, stdout, _ = run(capsys, "check", str(d / "baseline.hlo"), str(d / "distributed.hlo"), "--relations", str(d / "relations.yaml"), "--max-iterations", "3")
    assert code == 2
    assert stdout.startswith("inconclusive:") and "budget exhausted in layer(s) 0" in stdout


def test_exhausted_node_budget_is_inconclusive_naming_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    d = Path(__file__).parent / "pairs" / "deep_mlp_tp4"  # verified with the default budgets
    code, stdout, _ = run(capsys, "check", str(d / "baseline.hlo"), str(d / "distributed.hlo"), "--relations", str(d / "relations.yaml"), "--max-nodes", "200")
    assert code == 2
    assert stdout.startswith("inconclusive:") and "budget exhausted in layer(s) 0" in stdout and "node budget (max_nodes=200)" in stdout


def test_missing_close_paren_says_what_was_expected_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.hlo"
    text = (HERE / "mlp_distributed.hlo").read_text().replace("dot(%x, %w1), lhs_contracting_dims", "dot(%x, %w1, lhs_contracting_dims")
    assert text != (HERE / "mlp_distributed.hlo").read_text()
    bad.write_text(text)
    code, _, err = run(capsys, "check", str(HERE / "mlp_baseline.hlo"), str(bad), "--relations", str(HERE / "mlp_relations.yaml"))
    assert code == 3
    lineno, line = next((i, line) for i, line in enumerate(text.splitlines(), 1) if "%w1, lhs" in line)
    assert f"bad.hlo:{lineno}:{line.index('lhs_contracting_dims') + 1}: expected ')' closing the operands of %h before attribute 'lhs_contracting_dims'" in err, err
    assert "is not defined" not in err


_ENTRIES = '''
import jax.numpy as jnp
from shardproof.engine.frontend.jax.declare import JaxInput, JaxModel


def raises(ctx):
    raise RuntimeError("boom from user code")


def bad_return(ctx):
    return 42


def bad_spec(ctx):
    f = lambda x: jnp.tanh(x)
    return JaxModel(f, f, ctx.mesh({"tp": 2}), [JaxInput("x", (3, 4), spec=("tp", None))], gspmd=True)
'''


def test_run_an_entry_that_cannot_be_resolved_is_bad_input_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.py").write_text(_ENTRIES)
    (tmp_path / "broken_import.py").write_text("import no_such_dependency_of_the_user\n")
    names = {"nosuchfn": "m:nosuch", "nosuchmod": "nosuchmod:f", "badreturn": "m:bad_return", "badspec": "m:bad_spec", "raises": "m:raises", "importfails": "broken_import:f"}
    (tmp_path / ".shardproof.yml").write_text("version: 1\nframework: jax\npython_path: ['.']\ndefaults: {devices: 2}\nmodels:\n" + "".join(f"  - {{name: {n}, entry: '{e}'}}\n" for n, e in names.items()))
    monkeypatch.chdir(tmp_path)
    code, stdout, _ = run(capsys, "run", "--config", ".shardproof.yml", "--out", str(tmp_path / "out"))
    assert code == 3, stdout
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    by = {m["name"]: m for m in doc["models"]}
    # The config names what does not exist or is not a model: bad input, located at its line.
    for name, line in (("nosuchfn", 6), ("nosuchmod", 7), ("badreturn", 8), ("badspec", 9)):
        assert by[name]["status"] == "bad-input", by[name]
        assert by[name]["build"]["error"].startswith(f".shardproof.yml:{line}: models[{line - 6}].entry: "), by[name]["build"]["error"]
    assert "has no function 'nosuch'" in by["nosuchfn"]["build"]["error"]
    assert "cannot import 'nosuchmod'" in by["nosuchmod"]["build"]["error"]
    # The user's own code failing (also while importing its module) stays build-failed.
    assert by["raises"]["status"] == "build-failed" and "RuntimeError: boom from user code" in by["raises"]["build"]["error"]
    assert by["importfails"]["status"] == "build-failed" and "no_such_dependency_of_the_user" in by["importfails"]["build"]["error"]
    # Only the user-code failures: exit 2, not 3.
    code, stdout, _ = run(capsys, "run", "--config", ".shardproof.yml", "--models", "raises,importfails", "--out", str(tmp_path / "out2"))
    assert code == 2, stdout
