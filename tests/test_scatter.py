"""Scatter laws (rules/scatter.egg) on real torch-xla builds, with soundness pairs.

Built with the front end (torch-xla, placeholders, the rank an ``s32[]`` input):
- ``emb``: an embedding table's gradient under vocabulary parallelism (tests/scatter_project):
  the backward of the masked lookup is a scatter-add into the rank's rows;
- ``iadd_partial`` / ``iadd_dup``: index_add of partial products (then all-reduced) and of
  identical ones into zeros;
- ``kvpick``: tplm's training step with fewer KV heads than ranks (TP 4, 2 KV heads): each rank
  picks its KV head by index_select at floor(r/2), whose backward is index_add into zeros.

Each correct pair verifies through the law it exercises; single-point mutants of the scatter
(its index offset, its combiner, its attributes) are never verified, and XLA's CPU runtime (the
numeric oracle) confirms that the ones changing the value do change it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from config_runs import run_template

from shardproof.engine.analysis.scatter import read_scatter
from shardproof.engine.analysis.verify import Result, verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

ROOT = Path(__file__).parents[1]

CONFIG = """\
version: 1
root: {root}
python_path: [{examples}, {project}]
hide_frames: ["examples/tplm/parallel.py"]
defaults: {{tp: 4, timeout: 300, memory_mb: 4096}}
models:
  - {{name: emb, entry: "scatter_models:embedding_grad", size: {{vocab: 32, hidden: 8, tokens: 12}}}}
  - {{name: iadd_partial, entry: "scatter_models:index_add"}}
  - {{name: iadd_dup, entry: "scatter_models:index_add", size: {{mode: dup}}}}
  - {{name: kvpick, entry: "tplm.models:train_step", size: {{hidden: 64, heads: 8, kv_heads: 2, ffn: 64, layers: 1, seq: 8, batch: 2}}}}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scatter")
    doc, _ = run_template(folder, "scatter.shardproof.yml", CONFIG, verify=False, project=ROOT / "tests" / "scatter_project")
    errors = {m["name"]: m["build"]["error"] for m in doc["models"] if m["build"]["error"]}
    assert not errors, errors
    return folder / "out"


def _pair(built: Path, name: str) -> tuple[str, str, dict[str, Any]]:
    d = built / name
    return (d / "baseline.hlo").read_text(), (d / "distributed.hlo").read_text(), yaml.safe_load((d / "relations.yaml").read_text())


def _verify(baseline: str, distributed: str, relations: dict[str, Any]) -> Result:
    return verify(parse_relations(relations, "relations.yaml"), parse_hlo(baseline, "baseline.hlo"), parse_hlo(distributed, "distributed.hlo"))


def _rules(result: Result) -> set[str]:
    return {s["rule"] for t in result.trace for s in t["steps"]}


# ---- mutations of the distributed program's scatter ------------------------------------------

SCATTER = re.compile(r"^(?P<indent>[ \t]*)%(?P<name>scatter\.\d+) = .*? scatter\((?P<ops>.*?)\), update_window_dims", re.M)
OPERAND = re.compile(r"(?P<type>[a-z0-9]+\[[0-9,]*\](?:\{[0-9,]*\})?) (?P<name>%[\w.\-]+)")


def _scatter(text: str) -> tuple[re.Match[str], list[re.Match[str]]]:
    matches = list(SCATTER.finditer(text))
    assert len(matches) == 1, f"expected one scatter, found {len(matches)}"
    ops = list(OPERAND.finditer(matches[0].group("ops")))
    assert len(ops) == 3, matches[0].group(0)
    return matches[0], ops


def _with_index(text: str, lines: list[str], new_index: str) -> str:
    """The scatter reads ``new_index`` (defined by ``lines``, inserted right before it) as its
    indices."""
    m, ops = _scatter(text)
    idx = ops[1]
    line_start = m.start()
    line_end = text.index("\n", line_start)
    line = text[line_start:line_end]
    head, _, tail = line.partition(" scatter(")
    tail = tail.replace(f"{idx.group('type')} {idx.group('name')}", new_index, 1)
    block = "".join(f"{m.group('indent')}{x}\n" for x in lines)
    return text[:line_start] + block + head + " scatter(" + tail + text[line_end:]


def shift_index(text: str, delta: int) -> str:
    """Indices + delta (rows off by delta; out-of-range ones dropped by XLA)."""
    _, ops = _scatter(text)
    t = ops[1].group("type").split("{")[0]
    dtype = t.split("[")[0]
    lines = [
        f"%mut.c = {dtype}[] constant({delta})",
        f"%mut.b = {t} broadcast({dtype}[] %mut.c), dimensions={{}}",
        f"%mut.i = {t} add({t} {ops[1].group('name')}, {t} %mut.b)",
    ]
    return _with_index(text, lines, f"{t} %mut.i")


def constant_index(text: str, value: int) -> str:
    """The one index a literal (every rank writes at the same place)."""
    _, ops = _scatter(text)
    t = ops[1].group("type").split("{")[0]
    assert t.endswith("[1]"), t
    return _with_index(text, [f"%mut.i = {t} constant({{{value}}})"], f"{t} %mut.i")


def unmasked_updates(text: str) -> str:
    """The rank scatters the whole incoming gradient (parameter 2, g), masked rows included."""
    m, ops = _scatter(text)
    g = re.search(r"^\s*(%[\w.\-]+) = (\S+) parameter\(2\)", text, re.M)
    assert g is not None
    end = text.index("\n", m.start())
    upd = ops[2]
    line = text[m.start() : end].replace(f"{upd.group('type')} {upd.group('name')})", f"{g.group(2)} {g.group(1)})", 1)
    assert line != text[m.start() : end]
    return text[: m.start()] + line + text[end:]


def overwrite_combiner(text: str) -> str:
    """The combiner returns the update (an overwrite) instead of adding it."""
    m, _ = _scatter(text)
    comb = re.search(r"to_apply=%([\w.\-]+)", text[m.start() : text.index("\n", m.start())])
    assert comb is not None
    body = re.search(rf"%{re.escape(comb.group(1))} \(.*?\n\}}", text, re.S)
    assert body is not None
    root = re.search(r"ROOT (%[\w.\-]+) = (\w+)\[\] add\(\w+\[\] %[\w.\-]+, (\w+\[\] %[\w.\-]+)\)", body.group(0))
    assert root is not None, body.group(0)
    new_body = body.group(0).replace(root.group(0), f"ROOT {root.group(1)} = {root.group(2)}[] copy({root.group(3)})")
    return text.replace(body.group(0), new_body)


def with_attribute(text: str, attr: str) -> str:
    m, _ = _scatter(text)
    end = text.index("\n", m.start())
    line = text[m.start() : end].replace(", update_window_dims", f", {attr}, update_window_dims", 1)
    return text[: m.start()] + line + text[end:]


def _differs(baseline: str, mutant: str, relations: dict[str, Any]) -> bool:
    oracle = pytest.importorskip("oracle")
    return not all(oracle.run_pair(baseline, mutant, relations, seed=s).equal for s in (0, 1, 2))


# ---- correct pairs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("emb", "scatter/vocab-parallel-embedding-backward"),
        ("iadd_partial", "scatter/partial-updates-into-zeros"),
        ("iadd_dup", "partition/dup-variadic"),
        ("kvpick", "scatter/index-select-backward"),
    ],
)
def test_correct_pairs_verify_by_the_scatter_laws(built: Path, name: str, rule: str) -> None:
    baseline, distributed, relations = _pair(built, name)
    assert len(SCATTER.findall(distributed)) == 1, "the pair no longer has its scatter"
    result = _verify(baseline, distributed, relations)
    assert result.verdict == "verified", result.reason
    assert rule in _rules(result), sorted(_rules(result))
    assert not _differs(baseline, distributed, relations)


def test_kv_pick_backward_goes_through_the_group_partial_sum(built: Path) -> None:
    """The K ranks sharing a KV head each hold part of its gradient (attention's dK/dV contract
    the query heads, split over the group) until the scatter makes it a partial sum."""
    result = _verify(*_pair(built, "kvpick"))
    rules = _rules(result)
    assert {"scatter/group-partial-dot", "scatter/group-partial-update-slice"} <= rules, sorted(rules)


# ---- soundness pairs: the scatter changed, never verified; the oracle sees the change ---------

MUTANTS = [
    ("emb", "index + 1", lambda t: shift_index(t, 1)),
    ("emb", "index - 1", lambda t: shift_index(t, -1)),
    ("emb", "index + w (every row dropped)", lambda t: shift_index(t, 8)),
    ("emb", "updates not masked", unmasked_updates),
    ("iadd_partial", "index + 1", lambda t: shift_index(t, 1)),
    ("iadd_dup", "index + 1", lambda t: shift_index(t, 1)),
    ("kvpick", "KV head 0 on every rank", lambda t: constant_index(t, 0)),
    ("kvpick", "KV head 1 on every rank", lambda t: constant_index(t, 1)),
]


@pytest.mark.parametrize(("name", "what", "mutate"), MUTANTS, ids=[f"{n}: {w}" for n, w, _ in MUTANTS])
def test_wrong_scatter_offsets_are_never_verified(built: Path, name: str, what: str, mutate: Any) -> None:
    baseline, distributed, relations = _pair(built, name)
    mutant = mutate(distributed)
    assert mutant != distributed
    result = _verify(baseline, mutant, relations)
    assert result.verdict != "verified", what
    assert _differs(baseline, mutant, relations), f"the oracle does not see {what}"


def test_kv_gradient_without_its_all_reduce_is_diverged(built: Path) -> None:
    """tplm before its fix: the replicated KV projection's gradient is the scatter's partial
    sum, so an update without the all-reduce differs from the baseline on every rank."""
    baseline, distributed, relations = _pair(built, "kvpick")
    kv = re.compile(r"^(\s*%all-reduce\.\d+ = (f32\[32,64\]\S*)) all-reduce\((f32\[32,64\]\S* %[\w.\-]+)\), .*$", re.M)
    assert len(kv.findall(distributed)) == 1, "the KV gradient's all-reduce is not where expected"
    mutant = kv.sub(r"\1 copy(\3)", distributed)
    result = _verify(baseline, mutant, relations)
    assert result.verdict == "diverged", result.reason
    assert any("partial sum" in str(d.get("message", d)) for d in result.divergences), result.divergences
    assert _differs(baseline, mutant, relations)


def test_overwrite_combiner_is_unsupported(built: Path) -> None:
    baseline, distributed, relations = _pair(built, "kvpick")
    result = _verify(baseline, overwrite_combiner(distributed), relations)
    assert result.verdict == "unsupported"
    assert any("overwrite" in u["reason"] for u in result.to_json()["unsupported"]), result.reason


def test_unknown_attribute_never_verifies(built: Path) -> None:
    baseline, distributed, relations = _pair(built, "emb")
    result = _verify(baseline, with_attribute(distributed, "mystery_dims={0}"), relations)
    assert result.verdict == "unsupported"
    assert any("mystery_dims" in u["reason"] for u in result.to_json()["unsupported"]), result.reason


@pytest.mark.parametrize("attr", ["unique_indices=true", "indices_are_sorted=true"])
def test_broken_promises_of_the_rank_scatter_are_not_verified(built: Path, attr: str) -> None:
    """The rank's masked indices repeat (every foreign token lands on row 0) and are unsorted:
    a scatter promising otherwise is implementation-defined and must not verify."""
    baseline, distributed, relations = _pair(built, "emb")
    assert _verify(baseline, with_attribute(distributed, attr), relations).verdict != "verified"


# ---- the reader -------------------------------------------------------------------------------


def test_read_scatter_reads_the_dimension_numbers(built: Path) -> None:
    _, distributed, _ = _pair(built, "kvpick")
    module = parse_hlo(distributed)
    ins = next(i for i in module.entry.instructions if i.opcode == "scatter")
    shapes = [module.entry[o].shape for o in ins.operands]
    ins.parsed = {**ins.parsed, "reducer": "add"}  # what hlo.normalize's classify_reducers writes
    form = read_scatter(ins, shapes)
    assert not isinstance(form, str), form
    assert form.inserted_window_dims == (3,) and form.scatter_dims_to_operand_dims == (3,)
    assert form.index_add_dim(tuple(shapes[0].dims), tuple(shapes[1].dims), tuple(shapes[2].dims)) == (3, 1)
    ins.parsed = {**ins.parsed, "reducer": "body:ROOT p1"}
    assert "overwrite" in str(read_scatter(ins, shapes))


def _routing_hlo(variant: str, tokens: int = 8, experts: int = 4, capacity: int = 2) -> str:
    """Top-1 routing onto expert slots, written as a MoE's sparse dispatch spells it (one-hot of
    the argmax, a top-k capacity mask, locations cumsum(mask) - 1, slot = expert*C + location
    where kept, else the scratch slot E*C, token ids scattered into a buffer of E*C + 1 whose
    scratch slot is dropped), lowered by torch-xla; ``variant`` breaks one step."""
    torch = pytest.importorskip("torch")
    torch_xla = pytest.importorskip("torch_xla")
    from shardproof.engine.frontend.capture import keep_scalars_constant

    before = torch_xla._XLAC._get_xla_all_numbers_special_scalars()
    keep_scalars_constant()  # as the front end builds: E and C lower to constants
    try:
        return _routing_text(torch, torch_xla, variant, tokens, experts, capacity)
    finally:
        torch_xla._XLAC._set_xla_all_numbers_special_scalars(before)  # other tests lower in this process


def _routing_text(torch: Any, torch_xla: Any, variant: str, tokens: int, experts: int, capacity: int) -> str:
    F = torch.nn.functional
    dev = torch_xla.device()
    logits = torch.randn(tokens, experts, device=dev)
    index = torch.argmax(F.softmax(logits, dim=1), dim=1)
    mask = F.one_hot(index, num_classes=experts)
    top = torch.topk(mask, k=capacity, dim=0)[1]
    keep = torch.zeros_like(mask).scatter_(0, top, 1)
    mask = keep if variant == "no_onehot_factor" else mask * keep
    expert = torch.min(index, mask.sum(dim=1) * experts - 1)
    cum = torch.cumsum(mask, dim=0)
    location = torch.sum((cum if variant == "no_minus_one" else cum - 1) * mask, dim=1)
    stride = capacity - 1 if variant == "narrow_stride" else capacity + 1 if variant == "wide_stride" else capacity
    if variant == "int32_roundtrip":  # DeepSpeed returns both as int32 and widens them again
        expert, location = expert.to(torch.int32).long(), location.to(torch.int32).long()
    if variant == "int8_expert":  # a narrowing that could wrap a dropped row's index
        expert = expert.to(torch.int8).long()
    slots = torch.where(expert >= 0, expert * stride + location, torch.full_like(expert, experts * capacity))
    source = torch.full((experts * capacity + 1,), tokens, dtype=torch.long, device=dev)
    source.scatter_(0, slots, torch.arange(tokens, device=dev))
    read = source if variant == "reads_scratch" else source[:-1]
    out = torch.cat([logits, logits.new_zeros(1, experts)]).index_select(0, read)
    return torch_xla._XLAC._get_xla_tensors_hlo([out])


def _slot_scatter_form(text: str) -> object:
    """read_scatter's answer for the 1-D overwrite scatter (the dispatch) of a routing program."""
    from shardproof.engine.hlo.normalize import normalize

    module = normalize(parse_hlo(text))
    found = [i for i in module.entry.instructions if i.opcode == "scatter" and len(i.shape.dims) == 1]
    assert len(found) == 1
    ins = found[0]
    return read_scatter(ins, [module.entry[o].shape for o in ins.operands], module)


def test_routed_slots_are_read_only_when_the_kept_slots_are_distinct() -> None:
    """The dispatch overwrite is read (engine/analysis/scatter.overwrite_slots_distinct) when
    its kept slots are provably distinct and the scratch slot is never read; each broken step
    (no -1 on the cumsum, a slot stride below the capacity, the scratch slot read, a mask
    whose rows are not one-hot) leaves it unsupported."""
    for variant in ("ok", "wide_stride", "int32_roundtrip"):
        form = _slot_scatter_form(_routing_hlo(variant))
        assert not isinstance(form, str) and form.combiner == "overwrite", (variant, form)
    for variant in ("no_minus_one", "narrow_stride", "reads_scratch", "no_onehot_factor", "int8_expert"):
        assert isinstance(_slot_scatter_form(_routing_hlo(variant)), str), variant
