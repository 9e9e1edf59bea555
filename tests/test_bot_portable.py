"""result.json as the bot writes it names no path of the machine that ran the check, and the
patch reader knows the removed lines a LEFT-side comment can sit on."""

from __future__ import annotations

from pathlib import Path

from shardproof.bot.diff import parse_patch_lines
from shardproof.bot.portable import NO_LINE, portable_doc


def _doc(ws: Path) -> dict:
    steps = [
        {"distributed": "%p0", "source": f"{ws}/models/jax_model.py:41"},
        {"distributed": "%p1", "source": "<no source: a parameter of the entry computation>"},
        {"distributed": "%d", "source": "/usr/lib/python3/site-packages/flax/linen/linear.py:260 (in the backward of)"},
        {"distributed": "%e", "source": "<frozen runpy>:88"},
    ]
    return {"version": 1, "repository_root": str(ws), "models": [{
        "name": "m", "status": "diverged",
        "artifacts": {"baseline": f"{ws}/shardproof-report/m/baseline.hlo"},
        "result": {
            "trace": [{"output": 0, "steps": steps}],
            "divergences": [{"instruction": "%d", "source": {"file": f"{ws}/models/jax_model.py", "line": 44, "function": "f"},
                             "operands": [{"instruction": "%p0", "source": {"file": "<frozen runpy>", "line": 88, "function": ""}}]}],
            "witness": {"command": f"shardproof witness {ws}/shardproof-report/m/baseline.hlo --seed 0"},
        },
    }]}  # fmt: skip


def test_sources_commands_and_artifacts_are_repository_relative(tmp_path: Path) -> None:
    ws = tmp_path / "workspace"
    out = portable_doc(_doc(ws), str(ws), ws / "shardproof-report")
    assert str(tmp_path) not in repr(out)
    m = out["models"][0]
    steps = m["result"]["trace"][0]["steps"]
    assert [s["source"] for s in steps] == ["models/jax_model.py:41", NO_LINE, "flax/linen/linear.py:260 (in the backward of)", NO_LINE]
    assert steps[1]["no_source"] == "a parameter of the entry computation" and "frozen runpy" in steps[3]["no_source"]
    d = m["result"]["divergences"][0]
    assert d["source"]["file"] == "models/jax_model.py"
    assert d["operands"][0]["source"]["file"] == "" and "no file" in d["operands"][0]["source"]["why"]
    assert m["result"]["witness"]["command"] == "shardproof witness shardproof-report/m/baseline.hlo --seed 0"
    assert m["artifacts"]["baseline"] == "shardproof-report/m/baseline.hlo"
    assert out["repository_root"] == "."
    assert _doc(ws)["models"][0]["result"]["trace"][0]["steps"][0]["source"].startswith(str(ws))


def test_removed_lines_carry_their_old_numbers_and_where_they_sat() -> None:
    patch = "@@ -20,5 +20,4 @@ class Block:\n     def forward(self, x):\n         out = self.fc2(h)\n-        out = all_reduce(out, self.groups)\n         return x + out\n \n"
    added, context, _, deleted, _ = parse_patch_lines(patch)
    assert added == frozenset() and context == {20, 21, 22, 23}
    assert deleted == ((22, 22, "        out = all_reduce(out, self.groups)"),)  # before new line 22
    # A pure deletion's header "+N,0" names the line before the gap.
    _, _, _, deleted, _ = parse_patch_lines("@@ -22,1 +21,0 @@\n-        out = all_reduce(out, self.groups)\n")
    assert deleted == ((22, 22, "        out = all_reduce(out, self.groups)"),)


def test_a_rank_specific_model_blocks_at_its_line(tmp_path: Path) -> None:
    """An int-rank model whose ranks run different code (frontend/torchdist/lift.py) is a finding
    at the Python line that differs, and fails the gate like a divergence."""
    from shardproof.bot.app import blocking
    from shardproof.bot.diff import DiffIndex
    from shardproof.bot.findings import collect, gate, load_run, place

    (tmp_path / "layers.py").write_text("a = 1\nself.vocab_start_index = 33\n")
    entry = {"name": "vocab", "status": "rank-specific", "build": {}, "artifacts": {},
             "result": {"verdict": "verified", "outputs": [], "divergences": []},
             "rank_specific": [{"instruction": "%constant.3", "where": "layers.py:2", "ranks": [2], "message": "self.vocab_start_index = 33 on rank 2 where 16·r+0 gives 32"}]}  # fmt: skip
    run = load_run({"version": 1, "repository_root": ".", "models": [entry]})
    assert run.overall() == "rank-specific" and gate(run, "diverged") == ("failure", 1)
    [f] = collect(run, str(tmp_path))
    assert f.verdict_class == "rank-specific" and f.source is not None and (f.source.path, f.source.line) == ("layers.py", 2)
    assert blocking(run, [f])
    p = place([f], DiffIndex.from_entries([{"filename": "layers.py", "status": "modified", "patch": "@@ -1,2 +1,2 @@\n a = 1\n-x\n+self.vocab_start_index = 33\n"}]), "added", 30)
    assert [g[0].anchor for g in p.inline] == [f.source] and f.on_change
