"""Every finding has a source, or says why it has none: JAX stack_frame_id through the module's
stack-frame tables, Neuron stack strings, parts of a split tuple all-reduce, hidden files in
the HLO-metadata fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardproof.engine.cli import main
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo, parse_hlo_file
from shardproof.engine.ir import Instruction
from shardproof.engine.sourcemap import SourceMap, from_metadata

PAIRS = Path(__file__).parent / "pairs"
HERE = Path(__file__).resolve()


def _line(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    for n, text in enumerate(HERE.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}") and "_line(" not in text:
            return n
    raise LookupError(marker)


# -- JAX: stack_frame_id through FileNames/FunctionNames/FileLocations/StackFrames ------------


def _inner(x):  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    return jnp.sin(x) * 2.0  # SRC-inner


def _outer(x, w):  # type: ignore[no-untyped-def]
    import jax.numpy as jnp

    y = _inner(x @ w)  # SRC-call
    return jnp.tanh(y)  # SRC-tanh


def _jax_text(fn, *shapes: tuple[int, ...], compiled: bool = False) -> str:  # type: ignore[no-untyped-def]
    """A real JAX dump: pre-optimization HLO printed with metadata (the tables come with it), or
    the compiled module's text."""
    jax = pytest.importorskip("jax")
    hlo = pytest.importorskip("jaxlib._hlo")
    import jax.numpy as jnp

    lowered = jax.jit(fn).lower(*[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes])
    if compiled:
        return str(lowered.compile().as_text())
    options = hlo.HloPrintOptions()
    options.print_metadata = True
    return str(lowered.compiler_ir(dialect="hlo").get_hlo_module().to_string(options))


@pytest.mark.parametrize("compiled", [False, True])
def test_jax_stack_frame_ids_resolve_to_the_users_lines(compiled: bool) -> None:
    text = _jax_text(_outer, (4, 8), (8, 6), compiled=compiled)
    assert "StackFrames" in text and "stack_frame_id=" in text
    module = parse_hlo(text)
    by_op = {}
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.metadata.stack_frame_id:
                by_op.setdefault(ins.opcode, []).append(ins)
    [sine] = by_op["sine"]
    frames = sine.metadata.frames
    # The whole stack, innermost first: _inner's line, then the call in _outer.
    assert (frames[0][0], frames[0][1], frames[0][2]) == (str(HERE), _line("SRC-inner"), "_inner")
    assert (frames[1][1], frames[1][2]) == (_line("SRC-call"), "_outer")
    assert str(from_metadata(sine)) == f"{HERE}:{_line('SRC-inner')}"
    [tanh] = by_op["tanh"]
    assert from_metadata(tanh).line == _line("SRC-tanh")
    for ins in [i for group in by_op.values() for i in group]:
        assert from_metadata(ins).file == str(HERE), ins.name  # no `<no source>` where the HLO has one


def test_jax_divergence_names_the_source_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A JAX pair whose rank-local matmul lacks its all-reduce: the finding is on the user's line."""

    def matmul(x, w):  # type: ignore[no-untyped-def]
        import jax.numpy as jnp

        return jnp.tanh(x @ w)  # SRC-jax-bug

    (tmp_path / "b.hlo").write_text(_jax_text(matmul, (8, 16), (16, 32)))
    (tmp_path / "d.hlo").write_text(_jax_text(matmul, (8, 8), (8, 32)))
    (tmp_path / "r.yaml").write_text(
        "groups: [[0, 1]]\ninputs:\n  - {baseline: 0, distributed: 0, relation: sharded, dim: 1}\n"
        "  - {baseline: 1, distributed: 1, relation: sharded, dim: 0}\noutputs:\n  - {baseline: 0, distributed: 0, relation: duplicate}\n"
    )
    out = tmp_path / "result.json"
    code = main(["check", str(tmp_path / "b.hlo"), str(tmp_path / "d.hlo"), "--relations", str(tmp_path / "r.yaml"), "--json", str(out), "--root", str(HERE.parent)])
    assert code == 1
    [d] = json.loads(out.read_text())["divergences"]
    # JAX recorded this file's absolute path; result.json names it relative to --root.
    assert (d["source"]["file"], d["source"]["line"]) == (HERE.name, _line("SRC-jax-bug"))
    doc = json.loads(out.read_text())  # the inputs and witness command keep the paths as typed
    assert '"/' not in json.dumps([doc["trace"], doc["divergences"]]), doc["trace"]
    assert "<no source" not in capsys.readouterr().out


STACK_TABLES_PLAIN = """HloModule m

FileNames
1 "model/a.py"

FunctionNames
1 "outer"
2 "inner"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=0 end_column=1}
2 {file_name_id=1 function_name_id=2 line=20 end_line=20 column=0 end_column=1}

StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=1}

ENTRY %e (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  ROOT %n = f32[] negate(%p), metadata={op_name="jit(f)/neg" stack_frame_id=2}
}
"""


def test_stack_tables_with_plain_parent_ids() -> None:
    """A dump that prints parents as plain ids (0 = outermost) reads as such."""
    ins = parse_hlo(STACK_TABLES_PLAIN).entry.root
    assert ins.metadata.frames == (("model/a.py", 20, "inner"), ("model/a.py", 10, "outer"))
    # XLA's own printing (parent id plus one; 1 = outermost), as in the committed JAX dumps:
    shifted = STACK_TABLES_PLAIN.replace("parent_frame_id=0}", "parent_frame_id=1}").replace("2 {file_location_id=2 parent_frame_id=1}", "2 {file_location_id=2 parent_frame_id=2}")
    assert parse_hlo(shifted).entry.root.metadata.frames == ins.metadata.frames


def test_an_unresolvable_frame_says_why() -> None:
    text = STACK_TABLES_PLAIN.replace("stack_frame_id=2", "stack_frame_id=9")
    src = from_metadata(parse_hlo(text).entry.root)
    assert not src.file and "stack frame 9" in src.why and "<no source: " in str(src)
    bare = parse_hlo("HloModule m\nENTRY %e (p: f32[]) -> f32[] {\n  %p = f32[] parameter(0)\n  ROOT %n = f32[] negate(%p)\n}\n").entry.root
    assert "neither a source map entry nor its HLO metadata" in SourceMap().source(bare).why


def test_committed_jax_dumps_have_a_source_for_every_located_instruction() -> None:
    for path in sorted((Path(__file__).parent / "hlo").glob("jax_*_compiled.hlo")):
        module = parse_hlo_file(path)
        located = [i for c in module.computations.values() for i in c.instructions if i.metadata.stack_frame_id]
        assert located, path.name
        assert all(from_metadata(i).file.endswith(".py") for i in located), path.name


# -- Neuron stack strings -----------------------------------------------------------------------

NEURON = """HloModule m
ENTRY %e (p: f32[4]) -> f32[4] {
  %p = f32[4] parameter(0)
  ROOT %n = f32[4] negate(%p), metadata={op_type="aten__neg" source_file="SOURCE" source_line=909}
}
"""


def _neuron(source_file: str) -> Instruction:
    return parse_hlo(NEURON.replace("SOURCE", source_file.replace('"', '\\"'))).entry.root


@pytest.mark.parametrize(
    ("source_file", "want"),
    [
        ("['/opt/aws_neuron_venv/lib/python3.10/site-packages/neuronx_distributed/hlo.py:909', 'models/llama.py:55']", ("models/llama.py", 55)),
        ("'/opt/neuron/tools/hlo.py:909'", ("/opt/neuron/tools/hlo.py", 909)),
        ('"models/llama.py:55 (forward)"', ("models/llama.py", 55)),
        ("train.py:71 models/llama.py:55", ("models/llama.py", 55)),  # a function never eats the next frame
    ],
)
def test_neuron_stack_strings_lose_their_quotes(source_file: str, want: tuple[str, int]) -> None:
    src = from_metadata(_neuron(source_file))
    assert (src.file, src.line) == want
    assert "'" not in src.file and "[" not in src.file


# -- a split tuple all-reduce, and hidden files in the metadata fallback -------------------------


def test_split_all_reduce_keeps_its_source() -> None:
    """mlp_tp2's tuple all-reduce (value and token) is split per operand by the normalizer; each
    part reports the user's line of the all-reduce, not the metadata's library frame."""
    d = PAIRS / "mlp_tp2"
    sm = SourceMap.load(d / "sourcemap.json")
    module = normalize(parse_hlo_file(d / "distributed.hlo"))
    parts = [i for i in module.entry.instructions if i.opcode == "all-reduce"]
    assert parts and all(i.origin == "all-reduce.36" and i.name != i.origin for i in parts)
    want = sm.instructions["all-reduce.36"]["frames"][0]
    for part in parts:
        assert "xla_model.py" in from_metadata(part).file  # what the metadata alone says
        src = sm.source(part)
        assert (src.file, src.line) == (want["file"], want["line"])
        assert sm.op_name(part) == sm.instructions["all-reduce.36"]["op_name"]


def test_hidden_files_are_skipped_in_the_metadata_fallback() -> None:
    text = NEURON.replace('source_file="SOURCE" source_line=909', 'source_file="<external>/build.py" source_line=189')
    ins = parse_hlo(text).entry.root
    assert str(SourceMap().source(ins)) == "<external>/build.py:189"  # without the hide list
    src = SourceMap({"instructions": {}, "hidden": ["<external>/build.py"]}).source(ins)
    assert not src.file and "hidden files (<external>/build.py)" in src.why
    # In a whole stack the hidden wrapper is skipped and the next frame names the instruction.
    stack = 'File "models/llama.py", line 55, in forward\n    h = comm.reduce(x)\nFile "mylib/comm.py", line 12, in reduce\n    return xm.all_reduce(x)\n'
    ins = _neuron(stack.replace("\n", "\\n"))
    assert (from_metadata(ins).file, from_metadata(ins).line) == ("mylib/comm.py", 12)
    hiding = SourceMap({"instructions": {}, "hidden": ["mylib/comm.py"]})
    assert (hiding.source(ins).file, hiding.source(ins).line) == ("models/llama.py", 55)


def test_source_map_hidden_list_is_validated(tmp_path: Path) -> None:
    from shardproof.engine.errors import InputError

    bad = tmp_path / "map.json"
    bad.write_text('{"instructions": {}, "hidden": "build.py"}')
    with pytest.raises(InputError, match="hidden"):
        SourceMap.load(bad)
