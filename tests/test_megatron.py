"""examples/megatron/.shardproof.yml end to end, on unmodified megatron-core from PyPI.

Megatron reads the rank as a Python int: every model is declared ``rank: int``, built once per
rank with torch.distributed started on the front end's own backend, and the per-rank programs
are lifted into one (frontend/torchdist). One run builds all models in one worker (one import
of torch-xla and Megatron); the lifting itself is tested on hand-written texts, without torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shardproof.engine.frontend.config import load_config
from shardproof.engine.frontend.torchdist.lift import lift

ROOT = Path(__file__).parents[1]
CONFIG = ROOT / "examples" / "megatron" / ".shardproof.yml"

# Where each bug variant must be reported: the Megatron line. The patches' own frames are hidden
# (hide_frames), so an op a patch adds is reported where Megatron calls the patched function.
BUG_SITES = {
    "bug_missing_all_reduce": "megatron/core/tensor_parallel/layers.py:1296",
    "bug_redundant_all_reduce": "megatron/core/tensor_parallel/mappings.py:31",
    "bug_wrong_group": "megatron/core/tensor_parallel/mappings.py:31",
    "bug_sp_gather_dim": "megatron/core/tensor_parallel/mappings.py:94",
    "bug_precision": "megatron/core/tensor_parallel/layers.py:1294",
    "bug_wrong_vocab_offset": "megatron/core/tensor_parallel/layers.py:276",
    # the shift by the rank's own (un-reduced) max: vocab_parallel_logits -= logits_max
    "bug_ce_missing_max_all_reduce": "megatron/core/tensor_parallel/cross_entropy.py:45",
}
# Correct models the rules cannot prove yet (the witness finds them equal): name -> the form.
RULE_GAPS: dict[str, tuple[str, str]] = {}


# ---- lifting, on texts ----------------------------------------------------------------------

_PROGRAM = """HloModule IrToHlo.9

ENTRY %IrToHlo.9 (p0.1: s64[4]) -> (s64[4]) {{
  %p0.1 = s64[4]{{0}} parameter(0)
  %constant.2 = s64[] constant({offset}), metadata={{op_type="prim__Constant" op_name="prim__Constant" source_file="model.py" source_line=7}}
  %broadcast.3 = s64[4]{{0}} broadcast(s64[] %constant.2), dimensions={{}}
  %subtract.4 = s64[4]{{0}} subtract(s64[4]{{0}} %p0.1, s64[4]{{0}} %broadcast.3)
  %all-reduce.5 = s64[4]{{0}} all-reduce(s64[4]{{0}} %subtract.4), channel_id=1, replica_groups={groups}, use_global_device_ids=true, to_apply=%add
  ROOT %tuple.6 = (s64[4]{{0}}) tuple(s64[4]{{0}} %all-reduce.5)
}}
"""


def _texts(offsets: list[int], groups: list[list[int]]) -> list[str]:
    own = {r: g for g in groups for r in g}
    return [_PROGRAM.format(offset=o, groups="{{" + ",".join(map(str, own[r])) + "}}") for r, o in enumerate(offsets)]


def test_affine_literals_become_a_rank_table_and_groups_merge() -> None:
    groups = [[0, 1], [2, 3]]
    lifted = lift(_texts([0, 16, 0, 16], groups), [0, 1, 2, 3], groups)
    assert lifted.findings == []
    assert (lifted.tables, lifted.affine, lifted.merged_groups) == (1, 1, 1)
    assert "%constant.2.rank_table = s64[4]{0} constant({0, 16, 0, 16})" in lifted.text
    assert "dynamic-slice(%constant.2.rank_table, %constant.2.rank_id)" in lifted.text
    assert "replica_groups={{0,1},{2,3}}" in lifted.text


def test_a_literal_off_the_line_names_the_odd_rank() -> None:
    groups = [[0, 1, 2, 3]]
    lifted = lift(_texts([0, 16, 33, 48], groups), [0, 1, 2, 3], groups)
    assert [(f.ranks, f.where) for f in lifted.findings] == [([2], "model.py:7")]
    assert "= 33 on rank 2 where 16·r+0 gives 32" in lifted.findings[0].message
    # The lifted program still computes what each rank computes: the table keeps rank 2's 33.
    assert "constant({0, 16, 33, 48})" in lifted.text


def test_the_odd_literal_is_named_by_the_python_expression_it_was_traced_from() -> None:
    # The literal is the right operand of a subtract: on model.py:7 that is `self.offset`.
    source = "\n" * 6 + "ids = x.clone() - self.offset  # line 7\n"
    groups = [[0, 1, 2, 3]]
    lifted = lift(_texts([0, 16, 33, 48], groups), [0, 1, 2, 3], groups, read_source=lambda path: source if path == "model.py" else None)
    (finding,) = lifted.findings
    assert finding.message == "`self.offset` = 33 on rank 2 where 16·r+0 gives 32 (constant.2, model.py:7)"
    # Two right operands of a subtract on the line: no guess, the instruction names it.
    ambiguous = "\n" * 6 + "ids = (x - self.offset) - self.base\n"
    (finding,) = lift(_texts([0, 16, 33, 48], groups), [0, 1, 2, 3], groups, read_source=lambda path: ambiguous).findings
    assert finding.message.startswith("constant.2 = 33 on rank 2")


def test_literals_that_depend_on_the_group_are_rank_specific() -> None:
    groups = [[0, 1], [2, 3]]
    lifted = lift(_texts([0, 16, 32, 48], groups), [0, 1, 2, 3], groups)
    assert lifted.findings and lifted.affine == 0


def test_other_differences_are_findings() -> None:
    groups = [[0, 1]]
    texts = _texts([0, 0], groups)
    texts[1] = texts[1].replace("subtract(", "add(").replace("%subtract.4 =", "%subtract.4 =")
    lifted = lift(texts, [0, 1], groups)
    assert [(f.instruction, f.ranks) for f in lifted.findings] == [("subtract.4", [0])] or [(f.instruction, f.ranks) for f in lifted.findings] == [("subtract.4", [1])]
    crossing = lift(_texts([0, 0, 0, 0], [[0, 1], [2, 3]])[:2] + _texts([0, 0, 0, 0], [[0, 2], [1, 3]])[2:], [0, 1, 2, 3], [[0, 1], [2, 3]])
    assert any("do not partition" in f.message for f in crossing.findings)


# ---- the example, built and checked ----------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("megatron.core", reason="pip install -e '.[megatron]'")
    from shardproof.engine.frontend.runner import run_models

    return run_models(CONFIG, tmp_path_factory.mktemp("megatron"))


def _entry(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in report["models"] if m["name"] == name)


def test_config_declares_the_models_of_the_issue() -> None:
    models = load_config(CONFIG).models
    assert all(m.rank == "int" for m in models)
    assert {m.variant for m in models if m.variant} == {"missing_all_reduce", "redundant_all_reduce", "wrong_vocab_offset", "wrong_group", "sp_gather_dim", "precision", "ce_missing_max_all_reduce"}
    assert load_config(CONFIG).source_packages == ["megatron"]


@pytest.mark.parametrize("name", [m.name for m in load_config(CONFIG).models])
def test_verdict(report: dict[str, Any], name: str) -> None:
    model = _entry(report, name)
    assert model["build"]["error"] is None, model["build"]["error"]
    if name in RULE_GAPS:
        # Not verified, never diverged: the witness finds the outputs equal.
        assert model["status"] == RULE_GAPS[name][0], model["result"]["reason"]
        assert model["result"]["witness"]["status"] == "equal"
        return
    assert model["status"] == model["expect"], model.get("result", {}).get("reason")


@pytest.mark.parametrize("name", sorted(BUG_SITES))
def test_bug_is_witnessed_at_megatrons_line(report: dict[str, Any], name: str) -> None:
    model = _entry(report, name)
    result = model["result"]
    assert result["witness"]["status"] == "confirmed", result["witness"]
    if name == "bug_wrong_vocab_offset":
        (finding, *_) = model["rank_specific"]
        assert finding["ranks"] == [2]
        assert BUG_SITES[name] in finding["where"]
        # Named by Megatron's attribute on that line, not by the HLO constant.
        assert finding["message"].startswith("`self.vocab_start_index` = 33 on rank 2 where 16·r+0 gives 32"), finding
        return
    source = result["divergences"][0]["source"]
    assert BUG_SITES[name] in f"{source['file']}:{source['line']}", (source, BUG_SITES[name])
    if name == "bug_precision":  # a lossy cast before the reduction, not a missing reduction
        assert "this convert to bf16 changes each rank's piece before the reduction" in result["divergences"][0]["cause"]
        assert result["divergences"][0]["hint"] is None


def test_rank_builds_are_timed_and_artifacts_name_no_machine_path(report: dict[str, Any]) -> None:
    for model in report["models"]:
        assert 0 < model["build"]["seconds"] < 60, model["build"]
        # One child per rank of the model's world, each timed.
        assert len(model["build"]["rank_seconds"]) == 4, model["build"]
        for key in ("distributed", "sourcemap", "relations"):
            path = Path(model["artifacts"][key])
            text = (path if path.is_absolute() else ROOT / path).read_text()
            assert str(ROOT) not in text and str(Path.home()) not in text and "/tmp/" not in text


# ---- a rank that crashes, a form the shims refuse: located build errors ---------------------

_CRASHING = '''
import os
import signal

import torch

from shardproof.engine.frontend.declare import Input, Model


class Scale(torch.nn.Module):
    def __init__(self, rank: int = 0, bad_index: bool = False) -> None:
        super().__init__()
        self.rank, self.bad_index = rank, bad_index

    def forward(self, x):
        if self.bad_index:
            mask = x > 0
            x = x.clone()
            x[mask, 0] = 1.0
        return x * 2.0


def crash(ctx):
    def distributed(rank):
        if rank == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        return Scale(rank)

    return Model(baseline=Scale(), distributed=distributed, inputs=[Input("x", (4, 4))])


def bad_index(ctx):
    return Model(baseline=Scale(), distributed=lambda rank: Scale(rank, bad_index=True), inputs=[Input("x", (4, 4))])


class CpuTable(torch.nn.Module):
    def forward(self, x):
        # A CPU tensor moved to the device inside forward, the CUDA way: a constant, not an input.
        return x * torch.tensor([1.0, 2.0, 3.0, 4.0]).cuda() + torch.ones(4, device="cuda")


def cpu_table(ctx):
    return Model(baseline=CpuTable(), distributed=lambda rank: CpuTable(), inputs=[Input("x", (4, 4))])
'''


def test_located_build_failures_and_cpu_tensors_as_constants(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    from shardproof.engine.frontend.runner import run_models

    (tmp_path / "crashing.py").write_text(_CRASHING)
    (tmp_path / ".shardproof.yml").write_text(
        "version: 1\npython_path: ['.']\nroot: .\ndefaults: {tp: 2, rank: int, timeout: 120}\n"
        "models:\n  - {name: crash, entry: 'crashing:crash'}\n  - {name: bad_index, entry: 'crashing:bad_index'}\n"
        "  - {name: cpu_table, entry: 'crashing:cpu_table'}\n"
    )
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    crash, bad, table = doc["models"]
    assert table["status"] == "verified", table
    assert crash["status"] == bad["status"] == "build-failed"
    assert "rank 1's build crashed (signal 11)" in crash["build"]["error"], crash["build"]["error"]
    assert "rank 0: " in bad["build"]["error"] and "boolean tensor" in bad["build"]["error"], bad["build"]["error"]


# ---- all-to-all: the backend's lowering, and the sp2hp / hp2sp laws on JAX-built pairs -------


def test_all_to_all_is_lowered_token_free_over_the_real_group(report: dict[str, Any]) -> None:
    model = _entry(report, "sp2hp_tp4")
    path = Path(model["artifacts"]["distributed"])
    text = (path if path.is_absolute() else ROOT / path).read_text()
    (line,) = [x for x in text.splitlines() if " all-to-all(" in x]
    assert "replica_groups={{0,1,2,3}}, dimensions={0}" in line, line
    # No token: the program's only parameter is the input, and no call is left.
    assert text.count(" parameter(") == 1 and " call(" not in text and "token" not in (path.parent / "relations.yaml").read_text()
    # The op keeps the source of the call it replaced: Megatron's all_to_all_single line.
    # The output is proven through an all-to-all law: the reshard law of rules/alltoall.egg, or
    # rules/labelmove.egg's per-rank element labels (both hold; which fires last is saturation's).
    rules = [step["rule"] for step in model["result"]["trace"][0]["steps"]]
    assert rules[-1] == "alltoall/split-concat-all-to-all-reshards" or rules[-1].startswith("labelmove/"), rules


def test_inlining_puts_the_collective_in_place_of_its_call() -> None:
    from shardproof.engine.frontend.torchdist.backend import inline_collectives

    text = """HloModule IrToHlo.6

%shardproof_all_to_all.3 (x.4: f32[8,2]) -> f32[8,2] {
  %x.4 = f32[8,2]{1,0} parameter(0)
  ROOT %a2a.5 = f32[8,2]{1,0} all-to-all(f32[8,2]{1,0} %x.4), replica_groups={{0,1},{2,3}}, dimensions={0}
}

ENTRY %IrToHlo.6 (p0.1: f32[8,2]) -> (f32[8,2]) {
  %p0.1 = f32[8,2]{1,0} parameter(0)
  %call.2 = f32[8,2]{1,0} call(f32[8,2]{1,0} %p0.1), to_apply=%shardproof_all_to_all.3, metadata={op_type="xla__all_to_all" source_line=7}
  ROOT %tuple.7 = (f32[8,2]{1,0}) tuple(f32[8,2]{1,0} %call.2)
}
"""
    sourcemap = {"instructions": {"call.2": {"frames": [{"file": "m.py", "line": 7}]}}}
    out = inline_collectives(text, sourcemap)
    assert "shardproof_all_to_all" not in out and " call(" not in out
    assert '%all-to-all.2 = f32[8,2]{1,0} all-to-all(f32[8,2]{1,0} %p0.1), replica_groups={{0,1},{2,3}}, dimensions={0}, metadata={op_type="xla__all_to_all" source_line=7}' in out
    assert "tuple(f32[8,2]{1,0} %all-to-all.2)" in out
    assert sourcemap["instructions"] == {"all-to-all.2": {"frames": [{"file": "m.py", "line": 7}]}}


_ALL_TO_ALL_FORMS = """
import torch, torch_xla
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from shardproof.engine.frontend.torchdist import backend

backend.start(1, 4)
group = dist.new_group([0, 1])
x = torch.ones(8, 4, dtype=torch.bfloat16).to(torch_xla.device())
single = torch.empty_like(x)
dist.all_to_all_single(single, x, group=group)
outs = [torch.empty(2, 4, dtype=torch.bfloat16, device=x.device) for _ in range(4)]
dist.all_to_all(outs, list(x.chunk(4, 0)))
functional = fc.all_to_all_single(x, None, None, group)
text = torch_xla._XLAC._get_xla_tensors_hlo([single, torch.cat(outs, 0), functional * 1])
print(backend.inline_collectives(text, {"instructions": {}}))
"""


def test_every_all_to_all_form_is_token_free_over_its_group() -> None:
    """all_to_all_single, the list form (default group) and the functional all_to_all_single
    (torch-xla's own kernel would bypass the group) all become one all-to-all each."""
    pytest.importorskip("torch_xla")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_HLO_DEBUG": "1"}
    proc = subprocess.run([sys.executable, "-c", _ALL_TO_ALL_FORMS], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if " all-to-all(" in x]
    groups = sorted(re.search(r"replica_groups=(\{\{[\d,]*\}\})", x).group(1) for x in lines)
    assert groups == ["{{0,1,2,3}}", "{{0,1}}", "{{0,1}}"], lines
    assert all(x.split(" = ")[1].startswith("bf16[") for x in lines)
    assert " call(" not in proc.stdout and "f32[] parameter" not in proc.stdout, proc.stdout


_FUNCTIONAL_FORMS = '''
import json

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import torch.distributed.nn.functional as nnf
import torch_xla

from shardproof.engine.frontend import capture
from shardproof.engine.frontend.torchdist import backend

capture.keep_scalars_constant()
backend.start(1, 4)
groups = {"world": dist.group.WORLD, "sub": dist.new_group([0, 1])}
x = torch.ones(8, 4).to(torch_xla.device())
ops = torch.ops._c10d_functional


def forms(g):
    name = g.group_name
    return {
        "all_reduce_sum": lambda: fc.all_reduce(x, "sum", g),
        "all_reduce_avg": lambda: fc.all_reduce(x, "avg", g),
        "all_reduce_max": lambda: fc.all_reduce(x, "max", g),
        "all_reduce_min": lambda: fc.all_reduce(x, "min", g),
        "all_reduce_product": lambda: fc.all_reduce(x, "product", g),
        "all_reduce_inplace": lambda: fc.all_reduce_inplace(x.clone(), "sum", g),
        "all_reduce_coalesced": lambda: torch.cat(fc.all_reduce_coalesced([x, x * 2], "sum", g)),
        "all_gather_into_tensor": lambda: fc.all_gather_tensor(x, 0, g),
        "all_gather_inplace": lambda: fc.all_gather_tensor_inplace(torch.empty(8 * g.size(), 4, device=x.device), x, g),
        "all_gather_into_tensor_coalesced": lambda: fc.all_gather_into_tensor_coalesced([x], g)[0],
        "all_gather_autograd": lambda: fc.all_gather_tensor_autograd(x, 0, g),
        "reduce_scatter_tensor": lambda: fc.reduce_scatter_tensor(x, "sum", 0, g),
        "reduce_scatter_tensor_coalesced": lambda: fc.reduce_scatter_tensor_coalesced([x], "sum", [0], g)[0],
        "reduce_scatter_autograd": lambda: fc.reduce_scatter_tensor_autograd(x, "sum", 0, g),
        "broadcast": lambda: fc.broadcast(x, 1, g),
        "reduce_scatter_inplace": lambda: fc.reduce_scatter_tensor_inplace(torch.empty(8 // g.size(), 4, device=x.device), x, "sum", g),
        "wait_tensor": lambda: fc.wait_tensor(ops.all_reduce(x, "sum", name)),
        "nn_all_reduce": lambda: nnf.all_reduce(x, group=g),
        "nn_all_gather": lambda: torch.cat(nnf.all_gather(x, group=g)),
    }


texts = {}
for where, g in groups.items():
    for op, make in forms(g).items():
        text = torch_xla._XLAC._get_xla_tensors_hlo([make() * 1])
        texts[f"{op}@{where}"] = backend.inline_collectives(text, {"instructions": {}})
# The name torch-xla's own xm.all_reduce passes for every replica: the world.
texts["all_reduce_sum@unnamed"] = backend.inline_collectives(torch_xla._XLAC._get_xla_tensors_hlo([ops.all_reduce(x, "sum", "") * 1]), {})

errors = {}
refused = {
    "bxor": lambda: fc.all_reduce(x, "bxor", groups["sub"]),
    "avg_int": lambda: fc.all_reduce(torch.ones(8, 4, dtype=torch.int32, device=x.device), "avg", groups["sub"]),
    "group_size": lambda: ops.all_gather_into_tensor(x, 4, groups["sub"].group_name),
    "uneven": lambda: ops.reduce_scatter_tensor(torch.ones(3, 4, device=x.device), "sum", 2, groups["sub"].group_name),
    "broadcast_root": lambda: fc.broadcast(x, 2, groups["sub"]),
}
for what, call in refused.items():
    try:
        call()
    except NotImplementedError as e:
        errors[what] = str(e)
print(json.dumps({"texts": texts, "errors": errors}))
'''

# Functional op -> (opcode, instructions of it, the reduction of its to_apply if any).
_FUNCTIONAL_OPCODES: dict[str, tuple[str, int, str | None]] = {
    "all_reduce_sum": ("all-reduce", 1, "add"),
    "all_reduce_avg": ("all-reduce", 1, "add"),
    "all_reduce_max": ("all-reduce", 1, "maximum"),
    "all_reduce_min": ("all-reduce", 1, "minimum"),
    "all_reduce_product": ("all-reduce", 1, "multiply"),
    "all_reduce_inplace": ("all-reduce", 1, "add"),
    "all_reduce_coalesced": ("all-reduce", 2, "add"),
    "all_gather_into_tensor": ("all-gather", 1, None),
    "all_gather_inplace": ("all-gather", 1, None),
    "all_gather_into_tensor_coalesced": ("all-gather", 1, None),
    "all_gather_autograd": ("all-gather", 1, None),
    "reduce_scatter_tensor": ("reduce-scatter", 1, "add"),
    "reduce_scatter_tensor_coalesced": ("reduce-scatter", 1, "add"),
    "reduce_scatter_autograd": ("reduce-scatter", 1, "add"),
    "broadcast": ("all-gather", 1, None),
    "reduce_scatter_inplace": ("reduce-scatter", 1, "add"),
    "wait_tensor": ("all-reduce", 1, "add"),
    "nn_all_reduce": ("all-reduce", 1, "add"),
    "nn_all_gather": ("all-gather", 1, None),
}
_COLLECTIVE = re.compile(r"^\s*(?:ROOT )?%\S+ = (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|all-gather-start|all-reduce-start)\((.*)$", re.M)


def _reduction(text: str, line: str) -> str:
    """The opcode of the ROOT of the computation a collective's ``to_apply`` names."""
    callee = re.search(r"to_apply=%(\S+?)[,\s]", line + " ").group(1)
    body = text[text.index(f"%{callee} (") :]
    return re.search(r"ROOT %\S+ = \S+ ([a-z-]+)\(", body).group(1)


def test_every_functional_collective_is_token_free_over_its_group(tmp_path: Path) -> None:
    """torch.distributed._functional_collectives (and its autograd, in-place and coalesced
    forms; torch.distributed.nn.functional) lower through this backend: torch-xla's own kernels
    would write token-carrying ops with replica_groups={} and ignore the group."""
    pytest.importorskip("torch_xla")
    script = tmp_path / "functional_forms.py"
    script.write_text(_FUNCTIONAL_FORMS)
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    texts = doc["texts"]
    expected_groups = {"world": "{{0,1,2,3}}", "sub": "{{0,1}}"}
    assert set(texts) == {f"{op}@{g}" for op in _FUNCTIONAL_OPCODES for g in expected_groups} | {"all_reduce_sum@unnamed"}
    for key, text in texts.items():
        op, where = key.split("@")
        opcode, count, reduction = _FUNCTIONAL_OPCODES[op]
        size = 2 if where == "sub" else 4
        lines = _COLLECTIVE.findall(text)
        assert [x[1] for x in lines] == [opcode] * count, (key, text)
        for shape, _, rest in lines:
            assert f"replica_groups={expected_groups.get(where, '{{0,1,2,3}}')}" in rest, (key, rest)
            if reduction is not None:
                assert _reduction(text, rest) == reduction, (key, text)
            if opcode == "all-gather":
                assert "dimensions={0}" in rest and shape.split("{")[0] in (f"f32[{8 * size},4]", f"f32[{size},8,4]"), (key, shape)
            if opcode == "reduce-scatter":
                assert shape.startswith(f"f32[{8 // size},4]"), (key, shape)
        # Token-free: the program's only parameter is the input, no call is left.
        entry = text[text.index("\nENTRY ") :]
        params = [x for x in entry.splitlines() if " parameter(" in x]
        assert len(params) == 1 and "f32[8,4]" in params[0], (key, params)
        assert " call(" not in text and "token" not in text and "after-all" not in text, (key, text)
    assert " divide(" in texts["all_reduce_avg@sub"] and " divide(" not in texts["all_reduce_sum@sub"]
    # broadcast from group rank 1: the gathered piece of rank 1, on the world and on [0, 1].
    assert "slice={[32:64]}" in texts["broadcast@world"] and "slice={[32:64]}" in texts["broadcast@sub"]
    # Refusals are NotImplementedError naming the caller's line.
    errors = doc["errors"]
    assert set(errors) == {"bxor", "avg_int", "group_size", "uneven", "broadcast_root"}, errors
    source = _FUNCTIONAL_FORMS.splitlines()  # starts with a newline: index i is line i + 1
    for what, message in errors.items():
        line = 1 + next(i for i, x in enumerate(source) if x.strip().startswith(f'"{what}": lambda'))
        assert "has no XLA lowering in the shardproof backend" in message, message
        assert message.endswith(f"(called at {script}:{line})"), (what, message, line)
    assert "'bxor'" in errors["bxor"] and "torch.int32" in errors["avg_int"] and "group_size=4 over a group of 2" in errors["group_size"]


_FUNCOL_MODELS = '''
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from shardproof.engine.frontend.declare import Input, Model


def _own(groups, rank):
    # Every rank creates every group, in the same order, as torch.distributed requires.
    made = [dist.new_group(g) for g in groups]
    return next(group for group, ranks in zip(made, groups) if rank in ranks)


class RowParallel(torch.nn.Module):
    """y = x W^T + b with W split along its input dim: partial sums, one all-reduce, the bias."""

    def __init__(self, inp, out, group=None):
        super().__init__()
        self.proj = torch.nn.Linear(inp, out, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(out))
        self.group = group

    def forward(self, x):
        y = self.proj(x)
        if self.group is not None:
            y = funcol.all_reduce(y, "sum", self.group)
        return y + self.bias


class SequenceParallelMlp(torch.nn.Module):
    """Tokens sharded: all-gather them, fc1 by columns, gelu, fc2 by rows, reduce-scatter."""

    def __init__(self, hidden, ffn, group=None, c=1):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, ffn // c, bias=False)
        self.fc2 = torch.nn.Linear(ffn // c, hidden, bias=False)
        self.group = group

    def forward(self, x):
        if self.group is not None:
            x = funcol.all_gather_tensor(x, 0, self.group)
        y = self.fc2(torch.nn.functional.gelu(self.fc1(x)))
        if self.group is not None:
            y = funcol.reduce_scatter_tensor(y, "sum", 0, self.group)
        return y * 1.0


def row_parallel(ctx):
    def distributed(rank):
        groups = ctx.groups
        if ctx.variant == "wrong_group":  # reduces over halves of the group: a wrong group
            groups = [g[i : i + len(g) // 2] for g in ctx.groups for i in (0, len(g) // 2)]
        return RowParallel(16 // ctx.tp, 8, _own(groups, rank))

    return Model(baseline=RowParallel(16, 8), distributed=distributed, inputs=[Input("x", (4, 16), shard=1)], plan={"proj": "rowwise"})


def sp_mlp(ctx):
    return Model(
        baseline=SequenceParallelMlp(8, 16),
        distributed=lambda rank: SequenceParallelMlp(8, 16, _own(ctx.groups, rank), ctx.tp),
        inputs=[Input("x", (8, 8), shard=0)],
        plan={"fc1": "colwise", "fc2": "rowwise"},
        outputs=[{"shard": 0}],
    )
'''


def test_functional_collectives_verify_end_to_end_and_a_wrong_group_is_witnessed(tmp_path: Path) -> None:
    """Models that talk through torch.distributed._functional_collectives, built per rank
    (rank: int) on this backend and checked: correct ones verified, the wrong group diverged."""
    pytest.importorskip("torch_xla")
    from shardproof.engine.frontend.runner import run_models

    (tmp_path / "funcol_models.py").write_text(_FUNCOL_MODELS)
    (tmp_path / ".shardproof.yml").write_text(
        "version: 1\npython_path: ['.']\nroot: .\ndefaults: {tp: 4, rank: int, timeout: 300}\nmodels:\n"
        "  - {name: row_parallel, entry: 'funcol_models:row_parallel'}\n"
        "  - {name: sp_mlp, entry: 'funcol_models:sp_mlp'}\n"
        "  - {name: row_parallel_wrong_group, entry: 'funcol_models:row_parallel', variant: wrong_group, expect: diverged}\n"
    )
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    models = {m["name"]: m for m in doc["models"]}
    for name in ("row_parallel", "sp_mlp"):
        assert models[name]["status"] == "verified", (name, models[name].get("result", models[name]["build"]))
    distributed = Path(models["row_parallel"]["artifacts"]["distributed"])
    text = (distributed if distributed.is_absolute() else tmp_path / distributed).read_text()
    (line,) = [x for x in text.splitlines() if " all-reduce(" in x]
    assert "replica_groups={{0,1,2,3}}" in line, line
    wrong = models["row_parallel_wrong_group"]
    assert wrong["status"] == "diverged", wrong.get("result", wrong["build"])
    assert wrong["result"]["witness"]["status"] == "confirmed", wrong["result"]["witness"]
    assert any(not o["equal"] for o in wrong["result"]["witness"]["outputs"])
    # Named at the model's own line: the funcol.all_reduce call.
    source = wrong["result"]["divergences"][0]["source"]
    call = 1 + _FUNCOL_MODELS.splitlines().index('            y = funcol.all_reduce(y, "sum", self.group)')
    assert source["file"].endswith("funcol_models.py") and source["line"] == call, source


# (name, whole input shape, dtype, input sharded dim, output sharded dim, verdict); built by
# _produce_all_to_all below with JAX (shard_map over 4 CPU devices), checked by the rules and
# the numeric witness.
A2A_PAIRS = [
    ("c_sp2hp", (16, 32), "float32", 0, 1, "verified"),
    ("c_sp2hp_int32", (16, 32), "int32", 0, 1, "verified"),
    # Megatron's own input: (s, b, h) sharded along s, flattened to (s·b, h) first.
    ("c_sp2hp_3d", (8, 2, 32), "float32", 0, 1, "verified"),
    ("c_hp2sp", (16, 32), "float32", 1, 0, "verified"),
    # The all-to-all splits (and concatenates) the hidden dim instead of the tokens.
    ("b_sp2hp_all_to_all_dim", (16, 32), "float32", 0, 1, "diverged"),
    # The hidden dim is cut into strided chunks (reshape (h/c, c), chunk = last dim).
    ("b_sp2hp_strided_chunks", (16, 32), "float32", 0, 1, "diverged"),
    # hp2sp joins the received pieces in reverse rank order.
    ("b_hp2sp_reversed", (16, 32), "float32", 1, 0, "diverged"),
]


def _produce_all_to_all(out: Path) -> None:  # in a subprocess: python tests/test_megatron.py OUT
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    sys.path.insert(0, str(Path(__file__).parent / "adversarial"))
    import jax
    import jax.numpy as jnp
    import jax_pairs
    from jax_pairs import AXIS, C, JaxPair

    def sp2hp(x: Any, chunks: str = "contiguous", dim: int = 0) -> Any:
        x = x.reshape(-1, x.shape[-1])
        if chunks == "strided":
            n, h = x.shape
            z = x.reshape(n, h // C, C).transpose(2, 0, 1).reshape(C * n, h // C)
        else:
            z = jnp.concatenate(jnp.split(x, C, axis=1), axis=0)
        return jax.lax.all_to_all(z, AXIS, dim, dim, tiled=True)

    def hp2sp(x: Any, reverse: bool = False) -> Any:
        pieces = jnp.split(jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True), C, axis=0)
        return jnp.concatenate(pieces[::-1] if reverse else pieces, axis=1)

    bodies = {
        "c_sp2hp": sp2hp, "c_sp2hp_int32": sp2hp, "c_sp2hp_3d": sp2hp, "c_hp2sp": hp2sp,
        "b_sp2hp_all_to_all_dim": lambda x: sp2hp(x, dim=1),
        "b_sp2hp_strided_chunks": lambda x: sp2hp(x, chunks="strided"),
        "b_hp2sp_reversed": lambda x: hp2sp(x, reverse=True),
    }
    for name, shape, dtype, d_in, d_out, _ in A2A_PAIRS:
        spec_in = tuple(AXIS if d == d_in else None for d in range(len(shape)))
        spec_out = tuple(AXIS if d == d_out else None for d in range(2))  # every output is (tokens, hidden)
        pair = JaxPair(name, name, (shape,), (spec_in,), spec_out, lambda x: x.reshape(-1, x.shape[-1]), bodies[name], dtypes=(dtype,), int_ranges=((0, (-100, 100)),) if dtype == "int32" else ())
        jax_pairs.write(pair, out / name)


@pytest.fixture(scope="module")
def a2a_pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("jax")
    out = tmp_path_factory.mktemp("a2a")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    subprocess.run([sys.executable, __file__, str(out)], check=True, env=env, timeout=600)
    return out


@pytest.mark.parametrize(("name", "verdict"), [(p[0], p[-1]) for p in A2A_PAIRS])
def test_all_to_all_resharding_laws_on_jax_pairs(a2a_pairs: Path, name: str, verdict: str) -> None:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    folder = a2a_pairs / name
    result = check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo")
    assert result.verdict == verdict, result.reason
    if verdict == "diverged":
        # A bug is diverged only with a numeric witness: an output element that differs.
        assert result.witness is not None and result.witness["status"] == "confirmed", result.witness
        assert any(not o["equal"] for o in result.witness["outputs"]), result.witness


# Mutants of the correct sp2hp program, each a way to get the exchange wrong; none may verify.
A2A_MUTANTS = [
    ("pieces out of order", "concatenate(split.4, split.5, split.6, split.7)", "concatenate(split.5, split.4, split.6, split.7)"),
    ("one piece twice", "concatenate(split.4, split.5, split.6, split.7)", "concatenate(split.4, split.5, split.5, split.7)"),
    ("ranks in another order", "replica_groups={{0,1,2,3}}", "replica_groups={{1,0,2,3}}"),
    ("exchange within halves", "replica_groups={{0,1,2,3}}", "replica_groups={{0,1},{2,3}}"),
]


@pytest.mark.parametrize(("what", "old", "new"), A2A_MUTANTS, ids=[m[0] for m in A2A_MUTANTS])
def test_a_wrong_sp2hp_exchange_is_diverged_with_a_witness(a2a_pairs: Path, tmp_path: Path, what: str, old: str, new: str) -> None:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    folder = a2a_pairs / "c_sp2hp"
    text = (folder / "distributed.hlo").read_text()
    assert old in text, "JAX wrote the sp2hp program differently; update the mutant"
    (tmp_path / "distributed.hlo").write_text(text.replace(old, new))
    result = check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", tmp_path / "distributed.hlo")
    assert result.verdict == "diverged", result.reason
    assert result.witness is not None and result.witness["status"] == "confirmed", result.witness


# ---- grouped-query attention: KV heads repeated, merged with the batch ------------------------

# The distributed build's KV heads tiled (head i reads KV head i mod g) where Megatron
# interleaves them (head i reads KV head floor(i/K)), spelled like torch-xla lowers
# repeat_interleave: a broadcast into a new dim, then a merge.
_GQA_MUTANTS = '''
import dataclasses

import torch

import mcore_models


def _tiled(self, repeats, dim=None, **kw):
    shape = list(self.shape)
    x = self.unsqueeze(dim).expand(*shape[:dim], repeats, *shape[dim:])
    return x.reshape(*shape[:dim], repeats * shape[dim], *shape[dim + 1 :])


def tiled(ctx):
    model = mcore_models.transformer_layer(ctx)
    build = model.distributed

    def distributed(rank):
        torch.Tensor.repeat_interleave = _tiled
        return build(rank)

    return dataclasses.replace(model, distributed=distributed)
'''


def test_merged_run_blocks_is_the_fused_block_sharding_of_the_merge() -> None:
    """The law of rules/partition.egg sh-merge-run, element by element: for every row the table
    writes, each rank's reshape of its block along d is its piece of the baseline's reshape under
    the fused-block spec along e (the witness's own split). GQA's shapes must give rows."""
    import itertools

    import numpy as np

    from shardproof.engine.analysis.laws.core import merged_run_blocks
    from shardproof.engine.analysis.signature import scale
    from shardproof.engine.witness.inputs import split

    def rows(src: tuple[int, ...], out: tuple[int, ...], c: int) -> list[tuple[int, int, tuple[int, ...]]]:
        found = merged_run_blocks(src, out, c)
        x = np.arange(int(np.prod(src))).reshape(src)
        for d, e, spec in found:
            want = split(x.reshape(out), e, c, spec, "z")
            for r, piece in enumerate(split(x, d, c, None, "x")):
                per_rank = scale(out, e, c)
                assert per_rank is not None
                assert np.array_equal(piece.reshape(per_rank), want[r]), (src, out, c, d, e, spec, r)
        return found

    # [s, b, g, K, hd] -> [s, b·h, hd] (keys after repeat_interleave), [s, b, g, K·hd] -> [s, b·h, hd]
    # (a group's queries), at 4 KV heads over 2 and 4 ranks.
    assert rows((3, 2, 4, 2, 5), (3, 16, 5), 2) == [(2, 1, (8, 8))]
    assert rows((3, 2, 4, 10), (3, 16, 5), 4) == [(2, 1, (8, 8))]
    def shapes(total: int, k: int) -> list[tuple[int, ...]]:
        """Every k-dim shape of ``total`` elements."""
        if k == 1:
            return [(total,)]
        return [(a, *rest) for a in range(1, total + 1) if total % a == 0 for rest in shapes(total // a, k - 1)]

    # Every reshape of small 4-dim shapes into 2 or 3 dims: whatever rows come out obey the law.
    checked = 0
    for src in itertools.product((1, 2, 3, 4), repeat=4):
        for c in (2, 4):
            for k in (2, 3):
                for out in shapes(int(np.prod(src)), k):
                    checked += len(rows(src, out, c))
    assert checked > 50
    # A merge that keeps the sharded dim last (T = 1) is merged_blocks' row, not this table's.
    assert merged_run_blocks((3, 2, 4, 5), (3, 8, 5), 2) == []


def test_gqa_layer_verifies_and_a_tiled_kv_repeat_is_witnessed(tmp_path: Path) -> None:
    """Megatron's TransformerLayer with 8 query heads and 4 KV groups at TP 2 (two KV heads per
    rank, each repeated twice) verifies through the merge of repeated KV heads; the same layer
    whose distributed build tiles the KV heads is diverged at Megatron's repeat_interleave
    line, with a numeric witness."""
    pytest.importorskip("megatron.core", reason="pip install -e '.[megatron]'")
    from shardproof.engine.frontend.runner import run_models

    (tmp_path / "gqa_mutants.py").write_text(_GQA_MUTANTS)
    size = "{hidden: 32, ffn: 64, seq: 8, batch: 2, heads: 8, num_query_groups: 4}"
    (tmp_path / ".shardproof.yml").write_text(
        f"version: 1\npython_path: ['.', {str(CONFIG.parent)!r}]\nroot: .\nsource_packages: [megatron]\n"
        "hide_frames: [gqa_mutants.py]\ndefaults: {tp: 2, rank: int, timeout: 300}\nmodels:\n"
        f"  - {{name: gqa_tp2, entry: 'mcore_models:transformer_layer', size: {size}}}\n"
        f"  - {{name: gqa_tiled_tp2, entry: 'gqa_mutants:tiled', size: {size}, expect: diverged}}\n"
    )
    doc = run_models(tmp_path / ".shardproof.yml", tmp_path / "out")
    models = {m["name"]: m for m in doc["models"]}
    good = models["gqa_tp2"]
    assert good["status"] == "verified", good.get("result", good["build"])
    rules = {step["rule"] for trace in good["result"]["trace"] for step in trace["steps"]}
    assert "partition/merge-run-into-fused-blocks" in rules
    bad = models["gqa_tiled_tp2"]
    assert bad["status"] == "diverged", bad.get("result", bad["build"])
    assert bad["result"]["witness"]["status"] == "confirmed", bad["result"]["witness"]
    assert any(not o["equal"] for o in bad["result"]["witness"]["outputs"])
    source = bad["result"]["divergences"][0]["source"]
    assert f"{source['file']}:{source['line']}".endswith("megatron/core/transformer/dot_product_attention.py:170"), source



if __name__ == "__main__":
    _produce_all_to_all(Path(sys.argv[1]))
