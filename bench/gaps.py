"""The gaps outside users found (issue 25), each as a correct form and its bug twins, checked now.

    python bench/gaps.py [--out DIR] [--only SUBSTRING] [--json FILE]

Each row of ``GAPS`` is one program shape that real code writes and the rules once left
``unproven``: its correct forms must be ``verified`` (or the verdict the row names, with why) and
each bug twin must be ``diverged`` with the witness ``confirmed``, reported at its ``# BUG-SITE``
line when the twin is an example model (the hand-written pairs of tests/adversarial carry their
line in the HLO metadata only: the reported line is printed). A program is named
``<source>:<model>`` for the example configurations (built here with the real front end, into
``--out``) or ``pair:<name>`` for tests/adversarial/pairs (checked as stored). Exit status 1 when
any row is not as stated, so the table cannot drift from the tree silently.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
CONFIGS = {
    "jax": ROOT / "examples/jax/.shardproof.yml",
    "megatron": ROOT / "examples/megatron/.shardproof.yml",
    "torchdist": ROOT / "examples/torchdist/.shardproof.yml",
    "dtensor": ROOT / "examples/dtensor/.shardproof.yml",
}
PAIRS = ROOT / "tests/adversarial/pairs"


@dataclass(frozen=True)
class Gap:
    name: str
    correct: tuple[str, ...]
    twins: tuple[str, ...]
    # The verdict the correct forms must have when it is not ``verified``, and why (a program
    # that is not equal in floating point is not proven, on purpose).
    expect: str = "verified"
    why: str = ""


GAPS: tuple[Gap, ...] = (
    Gap("flax nn.Embed, vocabulary sharded under GSPMD (clamp + masked gather)",
        ("jax:flax_linen_embedding", "jax:flax_linen_embedding_shard_map"), ("jax:flax_linen_embedding_rows_unmasked",)),
    Gap("JAX collective matmul, chunk index (idx - i) % c", ("jax:jax_collective_matmul_minus",), ("jax:jax_collective_matmul_minus_sign",)),
    Gap("JAX collective matmul, chunk index (idx + i + 1) % c", ("jax:jax_collective_matmul_plus1",), ("jax:jax_collective_matmul_plus1_dropped",)),
    Gap("ring attention (shard_map, online softmax)", ("jax:jax_ring_attention",), ("jax:jax_ring_attention_scale_by_d",)),
    Gap("ring attention in bf16 (bf16 q/k/v, f32 scores and running statistics, one cast back)",
        ("jax:jax_ring_attention_bf16", "jax:jax_ring_attention_bf16_f32_logits", "jax:jax_ring_attention_bf16_scores_upcast", "jax:jax_ring_attention_bf16_max"),
        ("jax:jax_ring_attention_bf16_no_rescale",)),
    Gap("the jnp.roll ring all-reduce", ("jax:jax_ring_allreduce_roll",), ("jax:jax_ring_allreduce_roll_back_off_by_one",)),
    Gap("ring attention with a causal mask (per-rank, per-step mask blocks; -inf or finfo.min fill)",
        ("jax:jax_ring_attention_causal", "jax:jax_ring_attention_causal_finfo", "jax:jax_ring_attention_causal_bias"),
        ("jax:jax_ring_attention_causal_gt", "jax:jax_ring_attention_causal_offset")),
    Gap("vmapped jnp.argmax in MoE routing (tuple-shaped reduce)", ("jax:jax_moe_argmax_routing",), ("jax:jax_moe_argmax_routing_argmin",)),
    Gap("JAX Ulysses, untiled all-to-all", ("jax:jax_ulysses_untiled",), ("jax:jax_ulysses_untiled_seq_interleaved",)),
    Gap("ring all-reduce forwarding its running sum", ("jax:jax_ring_running_sum",), ("jax:jax_ring_running_sum_doubled",)),
    Gap("fairscale list-form all_gather on the last dim (ParallelEmbedding)", ("torchdist:fairscale_embedding_tp4",), ("torchdist:bug_fairscale_gather_reversed",)),
    Gap("fairscale VocabParallelEmbedding (degree-1 baseline keeps an always-false mask)",
        ("torchdist:fairscale_vocab_embedding_tp4",), ("torchdist:bug_fairscale_vocab_range_reversed",)),
    Gap("DeepSpeed Ulysses (5-D reshape/permute around the all-to-all)", ("pair:c_deepspeed_ulysses_5d",), ("pair:b_deepspeed_ulysses_5d_post_permute",)),
    Gap("DeepSpeed top1gating (F.one_hot -> scatter)", ("pair:c_onehot_rank_select",), ("pair:b_onehot_rotated",)),
    Gap("DeepSpeed MoE layer, sparse dispatch (routed slots distinct)", ("torchdist:deepspeed_moe_ep4",), ()),
    Gap("MoE top-1 with local experts (experts as a ModuleList)", ("pair:c_moe_top1_local_experts", "torchdist:moe_expert_list_ep4"),
        ("pair:b_moe_expert_offset", "torchdist:bug_moe_experts_reversed", "torchdist:bug_moe_chunks_reversed")),
    Gap("DTensor sequence parallelism (reduce-scatter as slice/concat/reduce-scatter)",
        ("dtensor:block_sp_tp4", "dtensor:decoder_sp_tp4"), ("dtensor:bug_wrong_output_layouts",)),
    Gap("T5 relative-position buckets (float->int convert bounded through log)", ("pair:c_t5_relative_buckets_sp",), ("pair:b_t5_relative_buckets_sp_offset",)),
    Gap("argmax index offset: a reshaped constant plus a broadcast of w*r", ("pair:c_vocab_argmax_offset_table",), ("pair:b_vocab_argmax_offset_table_stride",)),
    Gap("GQA with tiled KV (r mod K)", ("pair:c_gqa_tiled_kv_rank_mod",), ("pair:b_gqa_tiled_kv_rank_div",)),
    Gap("the GQA merge's backward", ("pair:c_gqa_merge_backward", "pair:c_gqa_tiled_merge_backward"),
        ("pair:b_gqa_merge_backward_mod", "pair:b_gqa_tiled_merge_backward_div")),
    Gap("LayerNorm hidden-sharded as E[x^2] - E[x]^2 (and both statistics in one all-reduce)",
        ("pair:c_layernorm_hidden_sharded_sumsq", "pair:c_layernorm_hidden_sharded_fused_stats"),
        ("pair:b_layernorm_sumsq_local_mean", "pair:b_layernorm_fused_stats_swapped")),
    Gap("LayerNorm E[(x - m)^2] against torch's E[x^2] - E[x]^2", ("pair:c_layernorm_hidden_sharded",), ("pair:b_layernorm_local_var",),
        expect="unproven", why="not equal in floating point: rows of mean 3000 and spread 2 give XLA outputs 1.29 apart"),
    Gap("cumsum along the sharded dim: local cumsum plus the gathered totals of ranks k < r", ("pair:c_cumsum_sharded_dim_carry",),
        ("pair:b_cumsum_sharded_dim_inclusive_carry", "pair:b_cumsum_sharded_dim_local")),
    Gap("cumsum carry as a scan of gathered totals, int positions", ("pair:c_positions_sp_scan_carry",), ("pair:b_positions_sp_scan_inclusive",)),
    Gap("cumsum carry as a scan of gathered totals, f32", ("pair:c_cumsum_sharded_dim_scan_carry",), ("pair:b_cumsum_sharded_dim_scan_inclusive",),
        expect="unproven", why="not equal in floating point: the exclusive scan's carry (s + t) - t loses an ulp of s + t"),
    Gap("split / concat / all-to-all on a third dim", ("pair:c_a2a_chunk_cat_third_dim",), ("pair:b_a2a_chunk_cat_third_dim_reversed",)),
    Gap("a tuple all-to-all of unrelated operands", ("pair:c_hlo_tuple_a2a_row_col_blocks",), ("pair:b_hlo_tuple_a2a_rows_swapped", "pair:b_hlo_tuple_a2a_same_block")),
    Gap("a padded fused QKV (heads that do not divide, each block padded at its tail as neuronx-distributed-inference lays Wqkv out)",
        ("torchdist:padded_fused_qkv_tp4", "torchdist:padded_fused_qkv_bias_tp4", "torchdist:padded_fused_qkv_bias_repeat_tp4"),
        ("torchdist:bug_padded_qkv_whole_pad", "torchdist:bug_padded_qkv_head_leak")),
    Gap("a flattened gradient bucket in one all-reduce", ("pair:c_flat_bucket_allreduce",), ("pair:b_flat_bucket_allreduce_offset",)),
    Gap("GQA with KV heads replicated per rank (neuronx-distributed-inference's REPLICATE_TO_TP_DEGREE: q padded within each KV group)", ("torchdist:gqa_replicated_kv_tp4", "torchdist:gqa_replicated_kv_tp8", "torchdist:gqa_replicated_kv_bias_tp4"), ("torchdist:bug_gqa_kv_tail", "torchdist:bug_gqa_kv_sum")),
)


@dataclass
class Outcome:
    ref: str
    role: str  # correct | twin
    verdict: str
    where: str = "-"  # the first divergence's source line
    site: str = "-"  # the twin's BUG-SITE line, for example models
    stack: tuple[str, ...] = ()  # the frames of the first divergence's instruction (its callers)
    witness: str = "-"
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def _where(result: dict[str, Any] | None) -> str:
    for d in (result or {}).get("divergences") or []:
        src = d.get("source") or {}
        if isinstance(src, dict) and src.get("file"):
            return f"{src['file']}:{src.get('line')}"
    return "-"


def _stack(folder: Path, result: dict[str, Any] | None) -> tuple[str, ...]:
    """The source frames the build recorded for the first divergence's instruction: the bot puts
    its comment on the frame a pull request changed, so a bug in a caller (the line that picks
    which expert a chunk goes to) is at its line when it is one of these frames."""
    divergences = (result or {}).get("divergences") or []
    path = folder / "sourcemap.json"
    if not divergences or not path.is_file():
        return ()
    entry = json.loads(path.read_text()).get("instructions", {}).get(str(divergences[0].get("instruction", "")).lstrip("%"), {})
    return tuple(f"{f['file']}:{f['line']}" for f in entry.get("frames", []) if isinstance(f, dict) and f.get("file"))


def _witness(result: dict[str, Any] | None) -> str:
    w = (result or {}).get("witness")
    return str(w.get("status", "-")) if isinstance(w, dict) else "-"


def run_configs(refs: list[str], out: Path) -> dict[str, Outcome]:
    from bug_sites import bug_sites

    from shardproof.engine.frontend.config import load_config
    from shardproof.engine.frontend.runner import run_models

    outcomes: dict[str, Outcome] = {}
    by_source: dict[str, list[str]] = {}
    for ref in refs:
        source, name = ref.split(":", 1)
        by_source.setdefault(source, []).append(name)
    for source, names in by_source.items():
        config = CONFIGS[source]
        variants = {m.name: m.variant for m in load_config(config).models}
        sites = bug_sites(sorted(config.parent.rglob("*.py")), ROOT)
        print(f"[{source}] building and checking {len(names)} model(s)", file=sys.stderr, flush=True)
        doc = run_models(config, out / source, names)
        for entry in doc["models"]:
            result = entry.get("result") or {}
            o = Outcome(f"{source}:{entry['name']}", "", str(entry["status"]), _where(result), witness=_witness(result), seconds=float(entry.get("seconds") or 0.0),
                        stack=_stack(out / source / entry["name"], result))
            variant = variants.get(entry["name"])
            if variant and variant in sites:
                file, line = sites[variant]
                o.site = f"{file}:{line}"
            outcomes[o.ref] = o
    return outcomes


def run_pair(ref: str) -> Outcome:
    from shardproof.engine.analysis.check import check_files
    from shardproof.engine.relations import load_relations

    folder = PAIRS / ref.split(":", 1)[1]
    t = time.perf_counter()
    try:
        result = check_files(load_relations(folder / "relations.yaml"), folder / "baseline.hlo", folder / "distributed.hlo").to_json()
    except Exception as e:  # a crash is a row of its own, never a pass
        return Outcome(ref, "", "error", seconds=time.perf_counter() - t, problems=[f"{type(e).__name__}: {e}"])
    return Outcome(ref, "", str(result["verdict"]), _where(result), witness=_witness(result), seconds=time.perf_counter() - t)


def judge(gap: Gap, o: Outcome) -> list[str]:
    problems = list(o.problems)
    if o.role == "correct" and o.verdict != gap.expect:
        problems.append(f"correct form is {o.verdict}, expected {gap.expect}")
    if o.role == "twin":
        if o.verdict != "diverged":
            problems.append(f"bug twin is {o.verdict}, expected diverged")
        elif o.witness != "confirmed":
            problems.append(f"witness {o.witness}, expected confirmed")
        if o.site != "-" and o.where != o.site and o.site not in o.stack:
            problems.append(f"reported at {o.where} (frames {', '.join(o.stack) or 'none'}), its BUG-SITE is {o.site}")
    return problems


def _caller(o: Outcome) -> str:
    return f" (called from {o.site})" if o.site != "-" and o.site != o.where and o.site in o.stack else ""


def table(rows: list[tuple[Gap, list[Outcome]]]) -> str:
    lines = ["| gap | correct | bug twin (line reported; witness) | as stated |", "|---|---|---|---|"]
    for gap, outs in rows:
        correct = "<br>".join(f"`{o.ref}` {o.verdict}" for o in outs if o.role == "correct")
        if gap.why:
            correct += f" ({gap.why})"
        twins = "<br>".join(f"`{o.ref}` {o.verdict} at {o.where}{_caller(o)}; {o.witness}" for o in outs if o.role == "twin") or "-"
        ok = "yes" if not any(o.problems for o in outs) else "NO: " + "; ".join(p for o in outs for p in o.problems)
        lines.append(f"| {gap.name} | {correct} | {twins} | {ok} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("gaps-out"), help="where the example models are built (default gaps-out/)")
    ap.add_argument("--only", default="", help="only the gaps whose name contains this")
    ap.add_argument("--json", type=Path, help="write the outcomes here")
    args = ap.parse_args(argv)
    gaps = [g for g in GAPS if args.only.lower() in g.name.lower()]
    refs = [r for g in gaps for r in (*g.correct, *g.twins)]
    outcomes = run_configs([r for r in refs if not r.startswith("pair:")], args.out.absolute())
    for ref in refs:
        if ref.startswith("pair:"):
            outcomes[ref] = run_pair(ref)
            print(f"  {ref:50} {outcomes[ref].verdict}", file=sys.stderr, flush=True)
    rows = []
    for gap in gaps:
        outs = []
        for role, group in (("correct", gap.correct), ("twin", gap.twins)):
            for ref in group:
                o = Outcome(**{**asdict(outcomes[ref]), "role": role})
                o.problems = judge(gap, o)
                outs.append(o)
        rows.append((gap, outs))
    print(table(rows))
    bad = sum(bool(o.problems) for _, outs in rows for o in outs)
    print(f"\n{len(rows)} gap(s), {sum(len(outs) for _, outs in rows)} program(s): {bad} not as stated")
    if args.json:
        args.json.write_text(json.dumps([{"gap": g.name, "outcomes": [asdict(o) for o in outs]} for g, outs in rows], indent=2) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
