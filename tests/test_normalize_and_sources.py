"""The normalizer's passes and where sources come from (source map, metadata, Neuron stacks)."""

from __future__ import annotations

import json
from pathlib import Path

from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.sourcemap import SourceMap, from_metadata

TOKEN_HLO = """HloModule m
%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %main (x: f32[4], tok: f32[]) -> f32[4] {
  %x = f32[4] parameter(0)
  %tok = f32[] parameter(1)
  %bt = f32[4] broadcast(%tok), dimensions={}
  %xt = f32[4] add(%x, %bt)
  %ar = (f32[4], f32[]) all-reduce(%xt, %tok), replica_groups={{0,1}}, to_apply=%sum
  %g0 = f32[4] get-tuple-element(%ar), index=0
  %g1 = f32[] get-tuple-element(%ar), index=1
  %c = f32[4] convert(%g0)
  %cp = f32[4] copy(%c)
  %r1 = f32[2,2] reshape(%cp)
  %r2 = f32[4] reshape(%r1)
  ROOT %out = f32[4] negate(%r2)
}
"""


def test_tokens_are_stripped_only_when_declared() -> None:
    module = parse_hlo(TOKEN_HLO)
    kept = normalize(module).entry
    stripped = normalize(module, frozenset({"tok"})).entry
    names = [i.name for i in stripped.instructions]
    assert "xt" in [i.name for i in kept.instructions]  # undeclared: the add stays
    assert "xt" not in names and "bt" not in names
    (ar,) = [i for i in stripped.instructions if i.opcode == "all-reduce"]
    assert ar.operands == ["x"] and not ar.shape.is_tuple  # one all-reduce per operand, dead token part gone
    assert ar.parsed["reducer"] == "add"
    out = stripped.root
    assert out.name == "out" and out.operands == [ar.name]  # get-tuple-element, convert, copy, reshape pair folded
    assert [i.opcode for i in stripped.instructions] == ["parameter", "parameter", "all-reduce", "negate"]


def test_neuron_stack_in_source_file_gives_the_innermost_user_frame() -> None:
    stack = (
        'File "train.py", line 10, in main\\n    step()\\n'
        'File "models/llama.py", line 88, in forward\\n    h = self.mlp(x)\\n'
        'File "/opt/venv/lib/python3.10/site-packages/torch/nn/modules/linear.py", line 117, in forward\\n'
    )
    escaped = stack.replace('"', '\\"')
    text = TOKEN_HLO.replace("ROOT %out = f32[4] negate(%r2)", f'ROOT %out = f32[4] negate(%r2), metadata={{op_type="aten__neg" source_file="{escaped}" source_line=117}}')
    out = parse_hlo(text).entry["out"]
    src = from_metadata(out)
    assert (src.file, src.line, src.function) == ("models/llama.py", 88, "forward")


def test_source_map_wins_over_metadata(tmp_path: Path) -> None:
    text = TOKEN_HLO.replace("ROOT %out = f32[4] negate(%r2)", 'ROOT %out = f32[4] negate(%r2), metadata={source_file="lib.py" source_line=3}')
    out = parse_hlo(text).entry["out"]
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"instructions": {"out": {"frames": [{"file": "model/mlp.py", "line": 42, "function": "fwd"}], "op_name": "mlp/neg"}}}))
    sm = SourceMap.load(path)
    assert str(sm.source(out)) == "model/mlp.py:42"
    assert sm.op_name(out) == "mlp/neg"
    assert str(SourceMap().source(out)) == "lib.py:3"


def test_token_add_that_is_the_root_is_stripped() -> None:
    """A token add with no users (the entry's ROOT itself): the root moves to the value the add
    stands for, so the result is x, not x + tok (the add used to stay as the root)."""
    text = """HloModule m
ENTRY %main (x: f32[4], tok: f32[]) -> f32[4] {
  %x = f32[4] parameter(0)
  %tok = f32[] parameter(1)
  %n = f32[4] negate(%x)
  %bt = f32[4] broadcast(%tok), dimensions={}
  ROOT %xt = f32[4] add(%n, %bt)
}
"""
    entry = normalize(parse_hlo(text), frozenset({"tok"})).entry
    assert entry.root.name == "n"
    assert "xt" not in [i.name for i in entry.instructions]
    assert sum(1 for i in entry.instructions if i.is_root) == 1
    kept = normalize(parse_hlo(text)).entry  # undeclared: the add stays the root
    assert kept.root.name == "xt"
