"""``framework: jax`` models through the runner and the bot, like torch ones: the result.json
contract (verdicts, sources, witness, artifacts per model folder), builds isolated in forked
children under the model's caps (a crash, an exception or a hang is ``build-failed``), and a
bot run over real HTTP that comments at the Python line of examples/jax/models.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import bot_scenarios as sc
import bot_support as bs
import pytest
from fake_github import FakeGitHub

from shardproof.engine.cli import main
from shardproof.engine.errors import InputError
from shardproof.engine.frontend.config import load_config
from shardproof.engine.frontend.runner import run_models

pytest.importorskip("jax")

CONFIG = bs.ROOT / "examples/jax/.shardproof.yml"
MODELS_PY = "examples/jax/models.py"


def _bug_site(variant: str) -> int:
    for n, text in enumerate((bs.ROOT / MODELS_PY).read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# BUG-SITE: {variant}"):
            return n
    raise LookupError(variant)


def test_the_bot_comments_at_the_jax_line(fake: FakeGitHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = _bug_site("loss_scaled_by_tp")
    fake.add_pr(7, sc.HEAD, [{"filename": MODELS_PY, "status": "modified", "patch": sc.patch_adding(MODELS_PY, line)}])
    (tmp_path / "event.json").write_text(json.dumps(sc.pr_event()))
    for k, v in {
        "GITHUB_EVENT_PATH": str(tmp_path / "event.json"), "GITHUB_EVENT_NAME": "pull_request", "GITHUB_REPOSITORY": fake.repo,
        "GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_RUN_ID": "42", "GITHUB_SHA": "f" * 40,
        "INPUT_GITHUB-TOKEN": fake.token, "GITHUB_OUTPUT": str(tmp_path / "out.txt"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_WORKSPACE": str(bs.ROOT), "SHARDPROOF_WRITE_INTERVAL": "0",
    }.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    out = tmp_path / "report"
    code = main(["github", "--config", str(CONFIG), "--models", "gspmd_mlp,gspmd_mlp_scaled", "--sandbox", "subprocess", "--review-event", "COMMENT", "--out", str(out)])
    doc = json.loads((out / "result.json").read_text())
    assert [(m["name"], m["status"]) for m in doc["models"]] == [("gspmd_mlp", "verified"), ("gspmd_mlp_scaled", "diverged")], doc
    assert code == 1
    bug = doc["models"][1]
    assert bug["result"]["witness"]["status"] == "confirmed"
    assert bug["result"]["divergences"][0]["source"] == {"file": MODELS_PY, "line": line, "function": "gspmd_mlp.<locals>.model"}
    for kind in ("baseline", "distributed", "relations", "sourcemap"):
        assert Path(bug["artifacts"][kind]).parent.name == "gspmd_mlp_scaled"
    [review] = fake.reviews
    assert review["state"] == "COMMENTED"
    assert [(c["path"], c["line"]) for c in fake.review_comments] == [(MODELS_PY, line)]
    assert fake.statuses[-1]["state"] == "failure"
    # JAX records absolute paths in its stack frames: none of them reaches what the bot posts.
    posted = json.dumps([fake.reviews, fake.review_comments, fake.statuses, fake.check_runs])
    assert str(bs.ROOT) not in posted


BROKEN = '''
import os
import time

from shardproof.engine.frontend.jax.declare import JaxContext, JaxInput, JaxModel


def raises(ctx: JaxContext) -> JaxModel:
    raise RuntimeError("no such layer: attn_2")


def hangs(ctx: JaxContext) -> JaxModel:
    time.sleep(600)


def aborts(ctx: JaxContext) -> JaxModel:
    os.abort()


def bad_spec(ctx: JaxContext) -> JaxModel:
    mesh = ctx.mesh({"tp": 2})
    return JaxModel(lambda x: x, lambda x: x, mesh, [JaxInput("x", (3, 4), spec=("tp", None))])
'''


def test_a_broken_jax_build_is_build_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken.py").write_text(BROKEN)
    (tmp_path / ".shardproof.yml").write_text(
        "version: 1\nframework: jax\ndefaults: {devices: 2, timeout: 4}\nmodels:\n"
        + "".join(f"  - {{name: {n}, entry: 'broken:{n}'}}\n" for n in ("raises", "hangs", "aborts", "bad_spec"))
    )
    monkeypatch.chdir(tmp_path)
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    by = {m["name"]: m for m in doc["models"]}
    # bad_spec's shapes do not divide over the mesh: bad input, not a failure of the model's code
    assert {n: m["status"] for n, m in by.items()} == {"raises": "build-failed", "hangs": "build-failed", "aborts": "build-failed", "bad_spec": "bad-input"}
    assert "RuntimeError: no such layer: attn_2" in by["raises"]["build"]["error"]
    assert "broken.py" in by["raises"]["build"]["error"]  # the traceback's user frame
    assert "exceeded its time cap of 4 s" in by["hangs"]["build"]["error"]
    assert "crashed (signal 6 (SIGABRT))" in by["aborts"]["build"]["error"]
    assert "input x: dim 0 of (3, 4) does not divide over axis tp (2)" in by["bad_spec"]["build"]["error"] and "models[3].entry" in by["bad_spec"]["build"]["error"]


@pytest.mark.parametrize(("text", "key"), [
    ("version: 1\nframework: jax\nmodels: [{name: a, entry: 'm:f', tp: 4}]\n", "models[0].tp"),
    ("version: 1\nframework: jax\ndefaults: {outputs: [partial]}\nmodels: [{name: a, entry: 'm:f'}]\n", "defaults.outputs"),
    ("version: 1\nmodels: [{name: a, entry: 'm:f', tp: 2, devices: 4}]\n", "models[0].devices"),
    ("version: 1\nframework: flax\nmodels: [{name: a, entry: 'm:f'}]\n", "framework"),
])
def test_keys_of_the_other_framework_are_refused(tmp_path: Path, text: str, key: str) -> None:
    p = tmp_path / ".shardproof.yml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        load_config(p)
    assert key in str(e.value)


def test_jax_models_load_without_groups() -> None:
    config = load_config(CONFIG)
    assert config.framework == "jax"
    assert {(m.framework, m.devices, tuple(map(tuple, m.groups))) for m in config.models} == {("jax", 4, ())}
    assert os.path.basename(config.display_path) == ".shardproof.yml"



FSDP = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardproof.engine.frontend.jax.declare import JaxContext, JaxModel


def mlp(params, x):
    return jnp.tanh(x @ params["up"]) @ params["down"]


def _decl(ctx: JaxContext, state):
    mesh = ctx.mesh({"data": 2, "model": 2})
    params = {"up": jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=NamedSharding(mesh, P("data", "model"))),
              "down": jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=NamedSharding(mesh, P("model", "data")))}
    x = jax.ShapeDtypeStruct((4, 16), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    return JaxModel(mlp, mlp, mesh, [params, x], outputs=[P("data", None)], group_axes=("model",), gspmd=True, state=state)


def as_data(ctx: JaxContext) -> JaxModel:
    return _decl(ctx, None)


def as_state(ctx: JaxContext) -> JaxModel:
    return _decl(ctx, [0])
'''


def test_fsdp_in_plain_jax_is_declared_as_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP x TP in plain JAX (NamedShardings, no flax): weights split over 'data' as well as
    'model' verify once declared model state (state=[0]); declared as data, the baseline gets
    one group's part of each weight and the build failure says what to declare."""
    (tmp_path / "fsdp.py").write_text(FSDP)
    (tmp_path / ".shardproof.yml").write_text(
        "version: 1\nframework: jax\ndefaults: {devices: 4}\nmodels:\n"
        "  - {name: as_data, entry: 'fsdp:as_data'}\n  - {name: as_state, entry: 'fsdp:as_state'}\n"
    )
    monkeypatch.chdir(tmp_path)
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    by = {m["name"]: m for m in doc["models"]}
    assert by["as_state"]["status"] == "verified", by["as_state"]
    relations = (tmp_path / "out" / "as_state" / "relations.yaml").read_text()
    assert relations.count("gathered") == 2
    assert by["as_data"]["status"] == "build-failed"
    assert "dot_general requires contracting dimensions to have the same shape" in by["as_data"]["build"]["error"]
    assert "declare it model state: JaxModel(state=[argument index])" in by["as_data"]["build"]["error"]
