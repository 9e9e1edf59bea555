"""A crash of shardproof is never a verdict: exit 4, the phase and what it was working on named,
result.json ``error``, and the bot's commit status ``error`` (never ``failure``).

Crashes are injected with SHARDPROOF_FAULT=<phase> (engine/errors.phase raises inside that phase)
and, for the locator, by making one real function of the verifier raise on one instruction. The
pairs are the committed torch-xla ones; verification is real (egglog), only the crash is made.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import bot_scenarios as sc
import bot_support as bs
import pytest
from fake_github import FakeGitHub

from shardproof.engine.analysis import egg, graph
from shardproof.engine.cli import build_parser, main
from shardproof.engine.errors import REPORT_PLEA, InternalError, phase
from shardproof.engine.frontend import runner
from shardproof.engine.frontend.runner import BuildOutcome, exit_code

PAIRS = Path(__file__).parent / "pairs"
# Phases a `check` of a pair passes through, each of which must turn a crash into exit 4.
CHECK_PHASES = ("read", "rules", "parse", "normalize", "partition", "build", "saturate", "localize", "report")


def _check_args(pair: str, out: Path) -> list[str]:
    d = PAIRS / pair
    return ["check", str(d / "baseline.hlo"), str(d / "distributed.hlo"), "--relations", str(d / "relations.yaml"), "--sourcemap", str(d / "sourcemap.json"), "--json", str(out)]


@pytest.mark.parametrize("name", CHECK_PHASES)
def test_check_crash_in_each_phase_exits_4_naming_the_phase(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SHARDPROOF_FAULT", name)
    out = tmp_path / "result.json"
    assert main(_check_args("deep_mlp_tp4", out)) == 4
    err = capsys.readouterr().err
    assert f"(phase {name})" in err and REPORT_PLEA in err
    assert "deep_mlp_tp4/distributed.hlo" in err  # the files to attach are named
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "error" and doc["error"]["phase"] == name and doc["error"]["where"]
    assert "fault injected" in doc["error"]["message"]


def test_witness_crash_exits_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The witness runs on a pair the rules did not verify: a crash there is ours too."""
    monkeypatch.setenv("SHARDPROOF_FAULT", "witness")
    out = tmp_path / "result.json"
    assert main(_check_args("bug_missing_allreduce", out)) == 4
    assert "(phase witness)" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "error" and doc["error"]["phase"] == "witness"


def test_saturate_crash_names_the_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDPROOF_FAULT", "saturate")
    out = tmp_path / "result.json"
    assert main([*_check_args("deep_mlp_tp4", out), "--no-fold"]) == 4
    assert json.loads(out.read_text())["error"]["where"].startswith("layer ")


def test_a_fold_crash_falls_back_to_the_whole_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold is a shortcut by design: its crash is recorded and the unfolded run answers."""
    monkeypatch.setenv("SHARDPROOF_FAULT", "fold")
    out = tmp_path / "result.json"
    assert main(_check_args("deep_mlp_tp4", out)) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "verified" and "phase fold" in doc["stats"]["fold"]["unfolded_because"]


def test_a_real_crash_names_the_instruction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Not injected by the phase helper: a verifier function raising on one instruction."""
    real = graph._check_supported

    def crashing(g: Any, side: str, ins: Any, module: Any) -> Any:
        if side == "distributed" and ins.opcode == "all-reduce":
            raise KeyError("boom")
        return real(g, side, ins, module)

    monkeypatch.setattr(graph, "_check_supported", crashing)
    out = tmp_path / "result.json"
    assert main([*_check_args("mlp_tp2", out), "--no-fold"]) == 4
    err = json.loads(out.read_text())["error"]
    assert err["phase"] == "build" and err["message"] == "KeyError: 'boom'"
    assert err["where"].startswith("distributed %all-reduce") and "(all-reduce)" in err["where"]
    assert "mlp_tp2/distributed.hlo:" in err["where"]  # the instruction's line in the file
    assert "phase build" in capsys.readouterr().err


def test_a_real_parser_crash_names_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardproof.engine.hlo import parser

    real = parser._read_metadata

    def crashing(raw: str) -> Any:
        if "aten__add" in raw:
            raise IndexError("bad index")
        return real(raw)

    monkeypatch.setattr(parser, "_read_metadata", crashing)
    out = tmp_path / "result.json"
    assert main([*_check_args("mlp_tp2", out), "--no-fold"]) == 4
    err = json.loads(out.read_text())["error"]
    d = PAIRS / "mlp_tp2"
    first = next(n for n, line in enumerate((d / "baseline.hlo").read_text().splitlines(), 1) if "aten__add" in line)
    assert err["phase"] == "parse" and err["message"] == "IndexError: bad index"
    assert err["where"].startswith(f"{d / 'baseline.hlo'}:{first}:")  # file:line:column of the crash


# Rule files half edited: egglog refuses the form. A rule name defined twice makes egglog panic
# (pyo3's PanicException, a BaseException: it once passed every handler, exit 1 and no
# result.json); an unbound function is an ordinary egglog error.
BROKEN_RULES = {
    "panic": ('(rule ((leafrow id)) ((N id)) :name "load-leaf")', "PanicException: Rule 'load-leaf' was already present"),
    "unbound": ("(rule ((leafrowx id)) ((N id)))", "Unbound function leafrowx"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_RULES))
def test_a_broken_rule_file_is_an_internal_error(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    form, message = BROKEN_RULES[kind]
    real = egg.rule_text
    core = real("core.egg").rstrip("\n") + "\n"
    line = core.count("\n") + 1  # the appended form's line

    def edited(name: str) -> str:
        return core + form + "\n" if name == "core.egg" else real(name)

    monkeypatch.setattr(egg, "rule_text", edited)
    monkeypatch.setattr(egg._LOCAL, "sessions", {}, raising=False)  # no rules-loaded e-graph of this thread
    out = tmp_path / "result.json"
    assert main(_check_args("deep_mlp_tp4", out)) == 4
    err = json.loads(out.read_text())["error"]
    assert err["phase"] == "rules" and err["where"] == f"rules/core.egg:{line}"
    assert message in err["message"]
    assert "(phase rules)" in capsys.readouterr().err


def test_an_egglog_panic_while_saturating_is_an_internal_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real panic in a worker thread: egglog asked to read rows into a table no rule declares."""
    real = egg.Session.load

    def into_unknown_table(self: egg.Session, table: str, rows: Any) -> int:
        return real(self, "nosuchtable", rows)

    monkeypatch.setattr(egg.Session, "load", into_unknown_table)
    out = tmp_path / "result.json"
    assert main(_check_args("deep_mlp_tp4", out)) == 4
    err = json.loads(out.read_text())["error"]
    assert err["phase"] == "saturate" and err["where"].startswith("layer ")
    assert err["message"].startswith("PanicException: ") and "nosuchtable" in err["message"]


def test_a_crash_outside_every_phase_still_writes_the_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from shardproof.engine.analysis import verify

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("budget")

    monkeypatch.setattr(verify, "Budget", broken)
    out = tmp_path / "result.json"
    assert main(_check_args("mlp_tp2", out)) == 4
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "error" and doc["error"]["phase"] == "check" and doc["error"]["message"] == "TypeError: budget"
    assert "(phase check)" in capsys.readouterr().err


def test_a_verified_check_never_imports_the_witness(tmp_path: Path) -> None:
    """The witness (numpy, XLA) is imported only when it runs: ~50 ms of every verified check."""
    import subprocess
    import sys

    code = "import sys; from shardproof.engine.cli import main; code = main(sys.argv[1:]); print(code, 'numpy' in sys.modules, 'shardproof.engine.witness' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, *_check_args("mlp_tp2", tmp_path / "r.json")], capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-3:] == ["0", "False", "False"], out.stdout + out.stderr


def test_bad_input_stays_exit_3_inside_a_phase(tmp_path: Path) -> None:
    with pytest.raises(InternalError) as e, phase("build", "x.hlo"):
        raise ValueError("inner")
    assert (e.value.phase, e.value.where, e.value.message) == ("build", "x.hlo", "ValueError: inner")
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  p = f32[2] parameter(0\n}\n")
    d = PAIRS / "mlp_tp2"
    assert main(["check", str(bad), str(d / "distributed.hlo"), "--relations", str(d / "relations.yaml")]) == 3


def test_help_carries_the_exit_code_table(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["check", "--help"], ["run", "--help"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)
        text = capsys.readouterr().out
        assert "exit codes" in text and "4  internal error" in text, argv


# -- `shardproof run` and the bot: a real verifier on copied torch-xla artifacts --------------


CONFIG = """version: 1
defaults: {tp: 2}
models:
  - {name: mlp, entry: "models:mlp", expect: verified}
  - {name: bug, entry: "models:mlp", expect: diverged}
"""
COPIED = {"mlp": "mlp_tp2", "bug": "bug_missing_allreduce"}


def _copying_builder(config: Any, models: list[Any], out: Path, on_built: Any) -> dict[str, float]:
    """Stands in for the torch-xla build: the committed artifacts of a pair, as a build leaves them."""
    for m in models:
        folder = out / m.name
        folder.mkdir(parents=True, exist_ok=True)
        for f in ("baseline.hlo", "distributed.hlo", "relations.yaml", "sourcemap.json"):
            shutil.copy(PAIRS / COPIED[m.name] / f, folder / f)
        on_built(m, BuildOutcome(True, 0.1, 1.0))
    return {}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "models.py").write_text("def mlp(ctx):\n    raise NotImplementedError\n")
    (tmp_path / ".shardproof.yml").write_text(CONFIG)
    monkeypatch.setattr(runner, "build_all", _copying_builder)
    return tmp_path


def test_run_crash_exits_4_and_records_error(project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--config", str(project / ".shardproof.yml"), "--out", str(project / "report")]) == 0
    monkeypatch.setenv("SHARDPROOF_FAULT", "localize")
    assert main(["run", "--config", str(project / ".shardproof.yml"), "--out", str(project / "report")]) == 4
    out = capsys.readouterr()
    assert "internal error in phase localize" in out.out
    assert REPORT_PLEA in out.err
    doc = json.loads((project / "report" / "result.json").read_text())
    assert [m["status"] for m in doc["models"]] == ["error", "error"]
    assert all(m["result"]["verdict"] == "error" and m["result"]["error"]["phase"] == "localize" for m in doc["models"])


def test_run_crash_outside_a_model_exits_4(project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SHARDPROOF_FAULT", "report")  # writing result.json, after every model
    assert main(["run", "--config", str(project / ".shardproof.yml"), "--out", str(project / "report")]) == 4
    err = capsys.readouterr().err
    assert "(phase report) at " in err and "result.json" in err and REPORT_PLEA in err


def test_run_exit_code_error_beats_every_verdict() -> None:
    doc = {"models": [{"status": "diverged", "expect": None}, {"status": "error", "expect": None}, {"status": "build-failed"}]}
    assert exit_code(doc) == 4
    assert exit_code({"models": [{"status": "error", "expect": "diverged"}]}) == 4


def _action_env(monkeypatch: pytest.MonkeyPatch, fake: FakeGitHub, tmp: Path) -> None:
    (tmp / "event.json").write_text(json.dumps(sc.pr_event()))
    for k, v in {
        "GITHUB_EVENT_PATH": str(tmp / "event.json"), "GITHUB_EVENT_NAME": "pull_request", "GITHUB_REPOSITORY": fake.repo,
        "GITHUB_API_URL": fake.url, "GITHUB_SERVER_URL": "https://github.test", "GITHUB_RUN_ID": "42",
        "INPUT_GITHUB-TOKEN": fake.token, "GITHUB_OUTPUT": str(tmp / "out.txt"), "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "GITHUB_WORKSPACE": str(tmp), "SHARDPROOF_WRITE_INTERVAL": "0",
    }.items():  # fmt: skip
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("name", ["build", "saturate"])
def test_github_sets_status_error_for_a_crash(name: str, project: Path, fake: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The action's own path: models run by the front end in-process, reported over real HTTP."""
    fake.add_pr(7, sc.HEAD, [])
    _action_env(monkeypatch, fake, project)
    monkeypatch.setenv("SHARDPROOF_FAULT", name)
    args = ["github", "--config", str(project / ".shardproof.yml"), "--out", str(project / "report"), "--sandbox", "subprocess"]
    assert main([*args, "--fail-on", "never"]) == 4  # fail-on governs findings, not our crashes
    final = fake.statuses[-1]
    assert final["state"] == "error" and final["state"] != "failure"
    assert "not in this PR" in final["description"]
    [summary] = fake.issue_comments  # the sticky summary says whose fault it is
    assert "shardproof crashed on 2 of 2 models: a bug in shardproof, not in this pull request" in summary["body"]
    assert "not this PR's fault" in fake.check_runs[-1]["output"]["title"]
    assert not fake.reviews  # no review requests changes of the author for our crash
    doc = json.loads((project / "report" / "result.json").read_text())
    assert {m["result"]["error"]["phase"] for m in doc["models"]} == {name}


def test_github_without_crash_is_not_an_error(project: Path, fake: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same project and path with no fault: the expected verdicts, so the error test can fail."""
    fake.add_pr(7, sc.HEAD, [])
    _action_env(monkeypatch, fake, project)
    assert main(["github", "--config", str(project / ".shardproof.yml"), "--out", str(project / "report"), "--sandbox", "subprocess"]) == 1
    assert fake.statuses[-1]["state"] == "failure"  # the bug model diverged: the PR's finding


def test_github_on_a_result_with_an_error_model(tmp_path: Path, fake: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflow_run split: a result.json written elsewhere with a crashed model."""
    fake.add_pr(7, sc.HEAD, [])
    _action_env(monkeypatch, fake, tmp_path)
    crashed = bs.model("mlp_tp2")
    crashed["status"] = "error"
    crashed["result"] = {**crashed["result"], "verdict": "error", "reason": "internal error in phase build", "error": {"phase": "build", "where": "distributed %x", "message": "KeyError: 'x'"}}
    result = tmp_path / "result.json"
    result.write_text(json.dumps(bs.run_doc(crashed, bs.model("bug_missing_allreduce"))))
    assert main(["github", "--result", str(result), "--out", str(tmp_path / "report")]) == 4
    assert fake.statuses[-1]["state"] == "error"
