""".shardproof.yml and sharding plans: what loads, what is rejected, and that every error names
the file, the line, the key and what was expected. None of this imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardproof.engine.cli import main
from shardproof.engine.errors import InputError
from shardproof.engine.frontend.config import load_config
from shardproof.engine.frontend.plan import Plan, PlanError, relation_for
from shardproof.engine.frontend.schema import config_schema, validate

ROOT = Path(__file__).parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / ".shardproof.yml"
    path.write_text(text)
    return path


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# What loads.


def test_defaults_merge_into_models(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
defaults: {tp: 4, timeout: 30, size: {hidden: 64, layers: 2}, verify: {timeout: 10}}
models:
  - {name: a, entry: "pkg.mod:fn"}
  - {name: b, entry: "pkg.mod:fn", groups: [[0, 1], [2, 3]], size: {layers: 8}, expect: diverged, variant: bug1}
"""))
    a, b = config.models
    assert a.groups == [[0, 1, 2, 3]] and a.tp == 4 and a.timeout == 30.0 and a.size == {"hidden": 64, "layers": 2}
    assert b.groups == [[0, 1], [2, 3]] and b.tp == 2 and b.size == {"hidden": 64, "layers": 8}
    assert b.own_size == ["layers"] and b.expect == "diverged" and b.variant == "bug1"
    assert b.verify == {"timeout": 10}
    assert config.root == tmp_path.resolve() or (config.root / ".git").exists()


def test_verify_budgets_reach_the_verifier(tmp_path: Path) -> None:
    from shardproof.engine.frontend.runner import verify_model

    config = load_config(write(tmp_path, "models:\n  - {name: a, entry: 'm:f', tp: 4, verify: {max_nodes: 200}}\n"))
    status, result, _ = verify_model(config.models[0], ROOT / "tests" / "pairs" / "deep_mlp_tp4")  # verified by default
    assert status == "inconclusive" and result is not None
    assert "node budget (max_nodes=200)" in result["reason"], result["reason"]


def test_the_example_config_is_valid() -> None:
    config = load_config(ROOT / "examples" / ".shardproof.yml")
    assert config.root == ROOT
    assert config.display_path == "examples/.shardproof.yml"
    bugs = [m for m in config.models if m.variant]
    assert len(bugs) >= 12 and all(m.expect == "diverged" and m.reference for m in bugs)
    assert all(m.expect == "verified" for m in config.models if not m.variant)


def test_the_schema_file_is_json_schema_and_describes_every_key() -> None:
    schema = config_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    settings = schema["$defs"]["settings"]["properties"]
    model = schema["$defs"]["model"]["properties"]
    assert set(settings) <= set(model)
    for key, node in model.items():
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node
        assert node.get("description"), f"{key} has no description"
    assert validate({"models": [{"name": "a", "entry": "m:f", "tp": 2}]}) == []


def test_yaml_merge_keys_and_anchors(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
models:
  - &base {name: a, entry: "m:f", tp: 2, size: {hidden: 8}}
  - {<<: *base, name: b}
"""))
    assert [m.name for m in config.models] == ["a", "b"] and config.models[1].size == {"hidden": 8}


# ---------------------------------------------------------------------------------------------
# What is rejected, and how the message reads.


@pytest.mark.parametrize(
    ("text", "where", "expected"),
    [
        ("models: []\n", ":1: models", "at least 1 item"),
        ("defaults: {tp: 2}\n", ":1", "missing required key 'models'"),
        ("models:\n  - {name: a, entry: 'm:f', tp: four}\n", ":2: models[0].tp", "expected an integer >= 1, got 'four'"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 0}\n", ":2: models[0].tp", "expected an integer >= 1, got 0"),
        ("models:\n  - {name: a, entry: 'just_a_module', tp: 2}\n", ":2: models[0].entry", "module:function"),
        ("models:\n  - {name: a, tp: 2}\n", ":2: models[0]", "missing required key 'entry'"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, colour: red}\n", ":2: models[0].colour", "unknown key; expected one of"),
        ("modles: []\n", ":1: modles", "unknown key"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, expect: build-failed}\n", ":2: models[0].expect", "one of verified, diverged"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, timeout: -1}\n", ":2: models[0].timeout", "a number > 0"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, size: {hidden: [1]}}\n", ":2: models[0].size.hidden", "a number, string or boolean"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, outputs: [maybe]}\n", ":2: models[0].outputs[0]", "replicate, partial"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, outputs: [{shard: x}]}\n", ":2: models[0].outputs[0].shard", "a dimension >= 0"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, verify: {partition: maybe}}\n", ":2: models[0].verify.partition", "true or false"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, verify: {max_nodes: 0}}\n", ":2: models[0].verify.max_nodes", "an integer >= 1"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2}\n  - {name: a, entry: 'm:g', tp: 2}\n", ":3: models[1].name", "unique name; 'a' is also models[0]"),
        ("models:\n  - {name: a, entry: 'm:f'}\n", ":2: models[0]", "expected 'tp' or 'groups'"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, groups: [[0, 1]]}\n", ":2: models[0].groups", "either 'tp' or 'groups'"),
        ("models:\n  - {name: a, entry: 'm:f', groups: [[0, 1], [2]]}\n", ":2: models[0].groups", "groups of one size"),
        ("models:\n  - {name: a, entry: 'm:f', groups: [[0, 1], [1, 2]]}\n", ":2: models[0].groups", "every rank in one group"),
        ("models:\n  - {name: a, entry: 'm:f', groups: [[1, 2]]}\n", ":2: models[0].groups", "cover ranks 0..1"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, layer_pattern: 'layers\\.\\d+'}\n", ":2: models[0].layer_pattern", "group 1 captures the layer number"),
        ("models:\n  - {name: a, entry: 'm:f', tp: 2, layer_pattern: '(('}\n", ":2: models[0].layer_pattern", "a regular expression"),
        ("python_path: [no_such_folder]\nmodels:\n  - {name: a, entry: 'm:f', tp: 2}\n", ":1: python_path[0]", "does not exist"),
        ("defaults: {tp: 2, groups: [[0, 1]]}\nmodels:\n  - {name: a, entry: 'm:f'}\n", ":1: defaults.groups", "either 'tp' or 'groups'"),
        ("hide_frames: [/abs/comm.py]\nmodels:\n  - {name: a, entry: 'm:f', tp: 2}\n", ":1: hide_frames[0]", "relative to the repository root"),
    ],
)
def test_errors_name_file_line_key_and_expectation(tmp_path: Path, text: str, where: str, expected: str) -> None:
    message = error(tmp_path, text)
    assert ".shardproof.yml" in message
    assert where in message, message
    assert expected in message, message


def test_invalid_yaml_names_line_and_column(tmp_path: Path) -> None:
    message = error(tmp_path, "models:\n  - {name: a, entry: 'm:f'\n")
    assert ".shardproof.yml:3:" in message and "not valid YAML" in message


def test_unknown_model_name_is_a_usage_error(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "models:\n  - {name: a, entry: 'm:f', tp: 2}\n"))
    with pytest.raises(InputError, match="no model named b; declared: a"):
        config.select(["b"])


def test_run_with_a_bad_config_exits_3_without_importing_torch(tmp_path: Path) -> None:
    config = write(tmp_path, "models:\n  - {name: a, entry: 'm:f', tp: zero}\n")
    script = (
        "import sys\n"
        "from shardproof.engine.cli import main\n"
        f"code = main(['run', '--config', {str(config)!r}, '--out', {str(tmp_path / 'out')!r}])\n"
        "assert 'torch' not in sys.modules, 'the front end imported torch in the CLI process'\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "models[0].tp: expected an integer >= 1, got 'zero'" in proc.stderr


def test_build_and_run_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--config" in out and "--models" in out and "--out" in out and "--json" in out and "--timings" in out
    assert main(["build", "--help"]) == 0


def test_missing_config_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run"]) == 3
    assert "no .shardproof.yml here or in any parent folder" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Sharding plans.


def rel(plan: dict, param: str, full: tuple[int, ...], local: tuple[int, ...], kind: str = "linear", c: int = 4) -> tuple:
    r = relation_for(Plan.parse(plan), param, kind, full, local, c)
    return (r.relation, r.dim, r.blocks)


def test_plan_styles_follow_pytorch_semantics() -> None:
    assert rel({"layers.*.up": "colwise"}, "layers.3.up.weight", (64, 16), (16, 16)) == ("sharded", 0, ())
    assert rel({"layers.*.up": "colwise"}, "layers.3.up.bias", (64,), (16,)) == ("sharded", 0, ())
    assert rel({"layers.*.down": "rowwise"}, "layers.0.down.weight", (16, 64), (16, 16)) == ("sharded", 1, ())
    assert rel({"layers.*.down": "rowwise"}, "layers.0.down.bias", (16,), (16,)) == ("duplicate", None, ())
    assert rel({"embed": "rowwise"}, "embed.weight", (256, 16), (64, 16), kind="embedding") == ("sharded", 0, ())
    assert rel({"embed": "colwise"}, "embed.weight", (256, 16), (256, 4), kind="embedding") == ("sharded", 1, ())
    assert rel({"norm": "sequence_parallel"}, "norm.weight", (16,), (16,)) == ("duplicate", None, ())
    assert rel({"moe.w1": "expert"}, "moe.w1", (8, 32, 16), (2, 32, 16)) == ("sharded", 0, ())
    assert rel({"x.w": {"shard": 2}}, "x.w", (4, 4, 8), (4, 4, 2)) == ("sharded", 2, ())
    assert rel({"attn.qkv": {"style": "colwise", "blocks": [64, 32, 32]}}, "attn.qkv.weight", (128, 16), (32, 16)) == ("sharded", 0, (64, 32, 32))
    assert rel({}, "norm.weight", (16,), (16,)) == ("duplicate", None, ())


def test_a_parameter_entry_wins_over_its_module_entry() -> None:
    plan = {"attn": "replicate", "attn.weight": "colwise"}
    assert rel(plan, "attn.weight", (64, 16), (16, 16)) == ("sharded", 0, ())


@pytest.mark.parametrize(
    ("plan", "param", "full", "local", "expected"),
    [
        ({"up": "colwise"}, "up.weight", (64, 16), (64, 16), "each rank should hold [16, 16] of the baseline's [64, 16], but the distributed module holds [64, 16]"),
        ({"up": "replicate"}, "up.weight", (64, 16), (16, 16), "is replicate (replicated) but is [64, 16] in the baseline and [16, 16] per rank"),
        ({}, "up.weight", (64, 16), (16, 16), "no plan entry names it or its module"),
        ({"qkv": {"style": "colwise", "blocks": [64, 32]}}, "qkv.weight", (128, 16), (32, 16), "sum to 96, but dim 0 has 128"),
        ({"qkv": {"style": "colwise", "blocks": [66, 31, 31]}}, "qkv.weight", (128, 16), (32, 16), "not divisible by 4 ranks"),
        ({"up": "diagonal"}, "up.weight", (64, 16), (16, 16), "expected one of colwise, rowwise"),
        ({"up": {"style": "colwise", "shard": 0}}, "up.weight", (64, 16), (16, 16), "exactly one of 'style' or 'shard'"),
        ({"up": {"shard": 3}}, "up.weight", (64, 16), (16, 16), "has 2 dim(s)"),
    ],
)
def test_plan_errors_name_the_entry_and_the_shapes(plan: dict, param: str, full: tuple, local: tuple, expected: str) -> None:
    with pytest.raises(PlanError) as info:
        relation_for(Plan.parse(plan), param, "linear", full, local, 4)
    assert expected in str(info.value)


def test_unused_plan_keys_are_found() -> None:
    plan = Plan.parse({"layers.*.attn.qkv": "colwise", "layers.*.atn.out": "rowwise"})
    assert plan.unused(["layers.0.attn.qkv.weight", "layers.0.attn.out.weight"]) == ["layers.*.atn.out"]


def test_schema_validator_reports_in_key_order() -> None:
    errors = validate({"models": [{"name": "a", "entry": "m:f", "tp": "x", "size": {"h": None}}]})
    assert [(e.path, e.message.split(",")[0]) for e in errors] == [
        (("models", 0, "tp"), "expected an integer >= 1"),
        (("models", 0, "size", "h"), "expected a number"),
    ]
    assert json.dumps(config_schema())  # serializable: the shipped file is plain JSON


def test_every_config_error_is_reported_each_with_its_line(tmp_path: Path) -> None:
    # Schema errors: all of them, not only the first.
    message = error(tmp_path, "version: 1\ndefaults: {tp: four}\nmodels:\n  - {name: a, entry: 'm:f', expect: verfied}\n")
    assert ".shardproof.yml:2: defaults.tp: expected an integer >= 1, got 'four'" in message, message
    assert ".shardproof.yml:4: models[0].expect: expected one of verified" in message, message
    # Checks beyond the schema: a duplicate name, a missing degree and a bad group, all at once.
    message = error(
        tmp_path,
        "models:\n  - {name: a, entry: 'm:f', tp: 2}\n  - {name: a, entry: 'm:g', tp: 2}\n"
        "  - {name: b, entry: 'm:h'}\n  - {name: c, entry: 'm:i', groups: [[0, 1], [2]]}\n",
    )
    lines = message.splitlines()
    assert len(lines) == 3, message
    assert ":3: models[1].name: expected a unique name" in lines[0]
    assert ":4: models[2]: expected 'tp' or 'groups'" in lines[1]
    assert ":5: models[3].groups: expected groups of one size" in lines[2]
