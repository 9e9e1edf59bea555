"""A fused QKV padded per block (relation ``padded`` with ``blocks``; rules/padded.egg padb):
q, k and v each padded at their tail to a multiple of the ranks and split over them, as
neuronx-distributed-inference lays out a fused Wqkv whose heads do not divide (6 heads at TP 4:
each block padded to 8, 2 heads per rank, rank 3 holding only padding). The pairs are in
tests/padded_qkv.py; the rules decide, and XLA's CPU runtime (tests/oracle.py) is the truth.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from padded_qkv import pair

from shardproof.engine.analysis.verify import verify
from shardproof.engine.errors import InputError
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations


def _verdict(baseline: str, distributed: str, relations: dict[str, Any]) -> str:
    return verify(
        parse_relations(relations, "relations.yaml"),
        parse_hlo(baseline, "baseline.hlo"),
        parse_hlo(distributed, "distributed.hlo"),
    ).verdict


def _equal(
    baseline: str, distributed: str, relations: dict[str, Any], seeds: tuple[int, ...] = (0, 1000)
) -> bool:
    oracle = pytest.importorskip("oracle")
    return all(oracle.run_pair(baseline, distributed, relations, seed=s).equal for s in seeds)


@pytest.mark.parametrize(("n", "c"), [(6, 4), (5, 4), (3, 2), (8, 4)])
def test_fused_qkv_padded_per_block_verifies(n: int, c: int) -> None:
    """6 or 5 heads at TP 4 (padded to 8), 3 at TP 2 (to 4), 8 at TP 4 (no padding: the
    relation is then plain block sharding)."""
    base, dist, rel = pair(n=n, c=c)
    assert _verdict(base, dist, rel) == "verified"
    assert _equal(base, dist, rel)


@pytest.mark.parametrize("variant", ["bias", "bias_repeat", "split"])
def test_fused_bias_and_non_zero_padding_meeting_zero_weights_verify(variant: str) -> None:
    """A fused bias padded like the weight; each block's bias picked per rank with the pick
    clamped (the padded heads non-zero) while the output projection is zero-padded; the blocks
    split off by a reshape (timm's qkv.reshape(B, N, 3, heads, hd)) instead of slices."""
    base, dist, rel = pair(variant=variant)
    assert _verdict(base, dist, rel) == "verified"
    assert _equal(base, dist, rel)


@pytest.mark.parametrize("variant", ["whole_pad", "split_whole", "swap_kv", "leak"])
def test_fused_qkv_padding_bugs_do_not_verify_and_differ(variant: str) -> None:
    base, dist, rel = pair(variant=variant)
    assert _verdict(base, dist, rel) == "diverged"
    oracle = pytest.importorskip("oracle")
    assert not oracle.run_pair(base, dist, rel, seed=0).equal


def test_check_reports_the_bug_lines_with_a_confirmed_witness(tmp_path: Any) -> None:
    """Through ``check`` (rules, localization, witness): the padding after the whole fused
    weight stops at the rank's cuts of its piece (k reads q's heads), the leaking heads at the
    output projection that sums over the non-zero padding."""
    from shardproof.engine.analysis.check import check_files

    for variant, where in (("whole_pad", {"%q", "%k", "%v"}), ("leak", {"%o"})):
        base, dist, rel = pair(variant=variant)
        d = tmp_path / variant
        d.mkdir()
        (d / "b.hlo").write_text(base)
        (d / "d.hlo").write_text(dist)
        res = check_files(parse_relations(rel, "r.yaml"), d / "b.hlo", d / "d.hlo")
        assert res.verdict == "diverged", res.reason
        assert res.witness is not None and res.witness["status"] == "confirmed"
        found = {x["instruction"] for x in res.divergences}
        assert found and found <= where, found


def test_padded_blocks_relation_errors_name_the_key() -> None:
    base, dist, rel = pair()
    fused = rel["inputs"][1]

    def bad(**kw: Any) -> dict[str, Any]:
        return {**rel, "inputs": [rel["inputs"][0], {**fused, **kw}, *rel["inputs"][2:]]}

    def run(r: dict[str, Any]) -> None:
        verify(
            parse_relations(r, "relations.yaml"), parse_hlo(base, "b.hlo"), parse_hlo(dist, "d.hlo")
        )

    with pytest.raises(InputError, match=r"inputs\[1\]\.width.*3 positive integers"):
        run(bad(width=[4, 4]))
    with pytest.raises(
        InputError, match=r"inputs\[1\]\.blocks.*sum to 30, but dim 0 of baseline W"
    ):
        run(bad(blocks=[12, 12, 6]))
    with pytest.raises(
        InputError,
        match=r"inputs\[1\]\.width.*block 1 \(12 elements\) with width 2.*expected width >= 3",
    ):
        run(bad(width=[4, 2, 6]))
    with pytest.raises(
        InputError, match=r"inputs\[1\]: distributed W is f32\[12,8\].*needs f32\[16,8\]"
    ):
        run(bad(width=[4, 4, 8]))
    with pytest.raises(InputError, match=r"inputs\[0\]\.blocks.*sharded or padded"):
        parse_relations(
            {**rel, "inputs": [{**rel["inputs"][0], "blocks": [4, 4]}, *rel["inputs"][1:]]},
            "relations.yaml",
        )
    # One block is the plain padded layout (the pair of 4 heads over 4 ranks, one each).
    b1, d1, r1 = pair(n=4, c=4)
    one = {**r1["inputs"][2], "blocks": [8], "width": [2]}
    assert _verdict(b1, d1, {**r1, "inputs": [*r1["inputs"][:2], one]}) == "verified"
    # One width for every block is the same relation.
    same = parse_relations(bad(width=4), "relations.yaml").inputs[1].relation
    assert same == parse_relations(rel, "relations.yaml").inputs[1].relation
    assert same.describe() == "padded(dim=0, blocks=[12, 12, 12], width=[4, 4, 4])"


def test_witness_gives_each_rank_its_piece_of_every_padded_block() -> None:
    from shardproof.engine.witness.inputs import padded_pieces

    x = np.arange(10 * 2).reshape(10, 2)  # blocks of 6 and 4 rows, widths 2 and 1 at c = 3/4
    pieces = padded_pieces(x, 0, 4, [2, 1], "w", [6, 4])
    assert [p.shape for p in pieces] == [(3, 2)] * 4
    assert pieces[0][:, 0].tolist() == [0, 2, 12]  # q rows 0, 1 then k row 0 (x row 6)
    assert pieces[3][:, 0].tolist() == [0, 0, 18]  # q padding (rows 6, 7 of 8), k row 3
    with pytest.raises(ValueError, match="do not tile"):
        padded_pieces(x, 0, 4, [2, 1], "w", [6, 3])


# ---- the torchdist front end: the layout built as neuronx-distributed-inference builds it ----


def test_torchdist_padded_fused_qkv_verifies_and_the_whole_weight_padding_diverges_at_its_line(tmp_path: Any) -> None:
    """examples/torchdist/padded_qkv.py through the front end: the plan's ``padded`` with
    ``blocks`` writes the relation; the correct layouts (with and without a fused bias) are
    verified, and so is a bias whose padded heads repeat the last one (non-zero) meeting the
    zero-padded output projection; padding the whole fused weight once (the plan without blocks)
    diverges at the rank's tensor_split, and repeating the last head in the output projection
    too (the padded heads leak) at the output projection, each with a confirmed witness."""
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("torch_xla") is None:
        pytest.skip("needs the frontend extra")
    from bug_sites import bug_sites

    from shardproof.engine.frontend.runner import run_models

    root = Path(__file__).parents[1]
    names = ["padded_fused_qkv_tp4", "padded_fused_qkv_bias_tp4", "padded_fused_qkv_bias_repeat_tp4", "bug_padded_qkv_whole_pad", "bug_padded_qkv_head_leak"]
    rows = {m["name"]: m for m in run_models(root / "examples" / "torchdist" / ".shardproof.yml", tmp_path, names)["models"]}
    for name in names[:3]:
        assert rows[name]["status"] == "verified", (rows[name]["build"]["error"], rows[name].get("result", {}).get("reason"))
    relations = (tmp_path / "padded_fused_qkv_bias_tp4" / "relations.yaml").read_text()
    assert "relation: padded, dim: 0, blocks: [24, 24, 24], width: [8, 8, 8]}  # Wqkv.weight: f32[72,16] -> f32[24,16]" in relations
    assert "Wqkv.bias: f32[72] -> f32[24]" in relations
    sites = bug_sites([root / "examples" / "torchdist" / "padded_qkv.py"], root)
    for variant in ("whole_pad", "head_leak"):
        bug = rows[f"bug_padded_qkv_{variant}"]
        assert bug["status"] == "diverged" and bug["result"]["witness"]["status"] == "confirmed"
        src = bug["result"]["divergences"][0]["source"]
        assert (src["file"], src["line"]) == sites[variant]


def _fused_mlp(f: int, c: int, w: int, dist: bool, cut_up_at: int | None = None) -> str:
    """SwiGLU with a fused [gate | up] projection of f features each (w per rank, padded per
    block), the down projection contracting the padded features."""
    n = w if dist else f
    up_at = n if cut_up_at is None else cut_up_at
    groups = ",".join(map(str, range(c)))
    root = f"  %o = f32[4,8]{{1,0}} dot(f32[4,{n}]{{1,0}} %h, f32[8,{n}]{{1,0}} %Wd), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}\n"
    if dist:
        root += f"  ROOT %ar = f32[4,8]{{1,0}} all-reduce(f32[4,8]{{1,0}} %o), replica_groups={{{{{groups}}}}}, to_apply=%add\n"
    else:
        root += "  ROOT %r = f32[4,8]{1,0} copy(f32[4,8]{1,0} %o)\n"
    return f"""HloModule fused_mlp

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}}

ENTRY %main (x: f32[4,8], Wgu: f32[{2 * n},8], Wd: f32[8,{n}]) -> f32[4,8] {{
  %x = f32[4,8]{{1,0}} parameter(0)
  %Wgu = f32[{2 * n},8]{{1,0}} parameter(1)
  %Wd = f32[8,{n}]{{1,0}} parameter(2)
  %gu = f32[4,{2 * n}]{{1,0}} dot(f32[4,8]{{1,0}} %x, f32[{2 * n},8]{{1,0}} %Wgu), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}
  %g = f32[4,{n}]{{1,0}} slice(f32[4,{2 * n}]{{1,0}} %gu), slice={{[0:4], [0:{n}]}}
  %u = f32[4,{n}]{{1,0}} slice(f32[4,{2 * n}]{{1,0}} %gu), slice={{[0:4], [{up_at}:{up_at + n}]}}
  %sg = f32[4,{n}]{{1,0}} logistic(f32[4,{n}]{{1,0}} %g)
  %si = f32[4,{n}]{{1,0}} multiply(f32[4,{n}]{{1,0}} %g, f32[4,{n}]{{1,0}} %sg)
  %h = f32[4,{n}]{{1,0}} multiply(f32[4,{n}]{{1,0}} %si, f32[4,{n}]{{1,0}} %u)
{root}}}
"""


@pytest.mark.parametrize("cut_up_at", [None, 2])
def test_fused_gate_up_padded_per_block(cut_up_at: int | None) -> None:
    """FFN features that do not divide (10 over 4 ranks, 3 each, padded to 12 per block) in a
    fused [gate | up] projection: silu(0)·0 = 0 on the padding, so the down projection's sum is
    the baseline's; reading up one feature early (offset 2 instead of 3) is not verified."""
    f, c, w = 10, 4, 3
    base, dist = _fused_mlp(f, c, w, False), _fused_mlp(f, c, w, True, cut_up_at)
    rel = {
        "groups": [list(range(c))],
        "inputs": [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, "relation": "padded", "dim": 0, "blocks": [f, f], "width": w},
            {"baseline": 2, "distributed": 2, "relation": "padded", "dim": 1, "width": w},
        ],
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    correct = cut_up_at is None
    assert (_verdict(base, dist, rel) == "verified") is correct
    assert _equal(base, dist, rel) is correct
