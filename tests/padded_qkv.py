"""HLO pairs of multi-head attention with a fused, padded QKV projection (relation ``padded``
with ``blocks``), laid out as neuronx-distributed-inference lays it out when the heads do not
divide over the ranks (GroupQueryAttention_QKV with GQA.CONVERT_TO_MHA and fused_qkv=True):
q, k and v each padded at their tail to a multiple of the ranks with zero heads
(maybe_pad_tail), concatenated into one Wqkv, each block split over the ranks by
ColumnParallelLinear; the forward cuts the rank's [q | k | v] with tensor_split at the per-rank
widths, and the output projection (RowParallelLinear over the padded heads, zero columns)
ends in an all-reduce.

Written by hand in the form torch-xla lowers ``F.linear``/``tensor_split``/``view``/``softmax``
to (dot, slice, reshape, transpose, reduce, exponential, divide), shared by tests/test_padded_blocks.py
and the property family in tests/laws/families.py.

Variants of the distributed program (the baseline is always the same):

- ``correct``: the layout above;
- ``bias``: the same with a fused bias padded like the weight (also correct);
- ``whole_pad``: the distributed program of ``correct``, the fused weight padded once after its
  last block instead of per block (the layout bug: k read from q's heads);
- ``split``: q, k and v split off by a reshape to (S, 3, heads, hd), permuted and unbound
  (timm's Attention), not by slices (correct); ``split_whole``: that program with the fused
  weight padded once after its last block (the layout bug);
- ``swap_kv``: the rank reads its k and v blocks swapped (a bug at the k/v slices);
- ``bias_repeat``: q, k and v each get their block of a fused bias after the cut (both
  programs); the ranks get the bias whole (duplicate) and pick their columns of each block at
  rank·w + arange(w), the pick clamped to the block's last column past its end (padding by
  repeating the last value instead of zeros): the padded heads' q, k and v are non-zero, but
  the output projection is zero-padded (correct);
- ``leak``: as ``bias_repeat`` and the output projection's columns picked the same way from the
  whole weight: the padded heads have non-zero weights on both sides and their contexts reach
  the output (a bug at the output projection).
"""

from __future__ import annotations

import math
from typing import Any

ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%max (ma: f32[], mb: f32[]) -> f32[] {
  %ma = f32[] parameter(0)
  %mb = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %ma, f32[] %mb)
}
"""


def _attention(
    h: int,
    hd: int,
    s: int,
    hidden: int,
    bias: bool,
    widths: tuple[int, int, int],
    cut: tuple[int, int, int],
    pick_bias: bool = False,
    split: bool = False,
) -> str:
    """Body from the fused projection to the context (s, h·hd): ``widths`` the fused dim's
    three blocks (q, k, v) and ``cut`` the offsets of the blocks read as q, k, v; ``pick_bias``:
    each block cut without bias, then %qbias, %kbias, %vbias added (the rank's own picks);
    ``split``: the blocks split off by a reshape to (S, 3, heads, hd) instead of slices."""
    f = sum(widths)
    hh = h * hd
    lines = [
        f"  %qkv0 = f32[{s},{f}]{{1,0}} dot(f32[{s},{hidden}]{{1,0}} %x, f32[{f},{hidden}]{{1,0}} %W), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}"
    ]
    if bias:
        lines += [
            f"  %bb = f32[{s},{f}]{{1,0}} broadcast(f32[{f}]{{0}} %b), dimensions={{1}}",
            f"  %qkv = f32[{s},{f}]{{1,0}} add(f32[{s},{f}]{{1,0}} %qkv0, f32[{s},{f}]{{1,0}} %bb)",
        ]
    else:
        lines.append(f"  %qkv = f32[{s},{f}]{{1,0}} copy(f32[{s},{f}]{{1,0}} %qkv0)")
    if split:
        # timm's Attention: qkv.reshape(S, 3, heads, hd).permute(1, 2, 0, 3), then q, k, v =
        # its three entries along the first dim (unbind).
        lines += [
            f"  %qkv4 = f32[{s},3,{h},{hd}]{{3,2,1,0}} reshape(f32[{s},{f}]{{1,0}} %qkv)",
            f"  %qkvt = f32[3,{h},{s},{hd}]{{3,2,1,0}} transpose(f32[{s},3,{h},{hd}]{{3,2,1,0}} %qkv4), dimensions={{1,2,0,3}}",
        ]
        for i, name in enumerate("qkv"):
            lines += [
                f"  %{name}1 = f32[1,{h},{s},{hd}]{{3,2,1,0}} slice(f32[3,{h},{s},{hd}]{{3,2,1,0}} %qkvt), slice={{[{i}:{i + 1}], [0:{h}], [0:{s}], [0:{hd}]}}",
                f"  %{name}t = f32[{h},{s},{hd}]{{2,1,0}} reshape(f32[1,{h},{s},{hd}]{{3,2,1,0}} %{name}1)",
            ]
    for name, at in zip("" if split else "qkv", cut if not split else (), strict=True):
        if pick_bias:
            lines += [
                f"  %{name}0 = f32[{s},{hh}]{{1,0}} slice(f32[{s},{f}]{{1,0}} %qkv), slice={{[0:{s}], [{at}:{at + hh}]}}",
                f"  %{name}bb = f32[{s},{hh}]{{1,0}} broadcast(f32[{hh}]{{0}} %{name}bias), dimensions={{1}}",
                f"  %{name} = f32[{s},{hh}]{{1,0}} add(f32[{s},{hh}]{{1,0}} %{name}0, f32[{s},{hh}]{{1,0}} %{name}bb)",
            ]
        else:
            lines.append(
                f"  %{name} = f32[{s},{hh}]{{1,0}} slice(f32[{s},{f}]{{1,0}} %qkv), slice={{[0:{s}], [{at}:{at + hh}]}}"
            )
        lines += [
            f"  %{name}3 = f32[{s},{h},{hd}]{{2,1,0}} reshape(f32[{s},{hh}]{{1,0}} %{name})",
            f"  %{name}t = f32[{h},{s},{hd}]{{2,1,0}} transpose(f32[{s},{h},{hd}]{{2,1,0}} %{name}3), dimensions={{1,0,2}}",
        ]
    scale = 1.0 / math.sqrt(hd)
    lines += [
        f"  %sc0 = f32[{h},{s},{s}]{{2,1,0}} dot(f32[{h},{s},{hd}]{{2,1,0}} %qt, f32[{h},{s},{hd}]{{2,1,0}} %kt), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{0}}, rhs_contracting_dims={{2}}",
        f"  %scale = f32[] constant({scale!r})",
        f"  %scb = f32[{h},{s},{s}]{{2,1,0}} broadcast(f32[] %scale), dimensions={{}}",
        f"  %sc = f32[{h},{s},{s}]{{2,1,0}} multiply(f32[{h},{s},{s}]{{2,1,0}} %sc0, f32[{h},{s},{s}]{{2,1,0}} %scb)",
        "  %ninf = f32[] constant(-inf)",
        f"  %mx = f32[{h},{s}]{{1,0}} reduce(f32[{h},{s},{s}]{{2,1,0}} %sc, f32[] %ninf), dimensions={{2}}, to_apply=%max",
        f"  %mxb = f32[{h},{s},{s}]{{2,1,0}} broadcast(f32[{h},{s}]{{1,0}} %mx), dimensions={{0,1}}",
        f"  %dif = f32[{h},{s},{s}]{{2,1,0}} subtract(f32[{h},{s},{s}]{{2,1,0}} %sc, f32[{h},{s},{s}]{{2,1,0}} %mxb)",
        f"  %ex = f32[{h},{s},{s}]{{2,1,0}} exponential(f32[{h},{s},{s}]{{2,1,0}} %dif)",
        "  %zero = f32[] constant(0)",
        f"  %sm = f32[{h},{s}]{{1,0}} reduce(f32[{h},{s},{s}]{{2,1,0}} %ex, f32[] %zero), dimensions={{2}}, to_apply=%add",
        f"  %smb = f32[{h},{s},{s}]{{2,1,0}} broadcast(f32[{h},{s}]{{1,0}} %sm), dimensions={{0,1}}",
        f"  %p = f32[{h},{s},{s}]{{2,1,0}} divide(f32[{h},{s},{s}]{{2,1,0}} %ex, f32[{h},{s},{s}]{{2,1,0}} %smb)",
        f"  %ctx = f32[{h},{s},{hd}]{{2,1,0}} dot(f32[{h},{s},{s}]{{2,1,0}} %p, f32[{h},{s},{hd}]{{2,1,0}} %vt), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_batch_dims={{0}}, rhs_contracting_dims={{1}}",
        f"  %ct = f32[{s},{h},{hd}]{{2,1,0}} transpose(f32[{h},{s},{hd}]{{2,1,0}} %ctx), dimensions={{1,0,2}}",
        f"  %c2 = f32[{s},{hh}]{{1,0}} reshape(f32[{s},{h},{hd}]{{2,1,0}} %ct)",
    ]
    return "\n".join(lines) + "\n"


def pair(
    n: int = 6, c: int = 4, hd: int = 2, s: int = 4, hidden: int = 8, variant: str = "correct"
) -> tuple[str, str, dict[str, Any]]:
    """(baseline, distributed, relations) for ``n`` heads over ``c`` ranks (w = ceil(n/c)
    heads per rank, padded at each block's tail)."""
    w = -(-n // c)
    bias = variant in ("bias", "bias_repeat", "leak")
    pick = variant in ("bias_repeat", "leak")
    nn, ww = n * hd, w * hd
    bparams = f"x: f32[{s},{hidden}], W: f32[{3 * nn},{hidden}], Wo: f32[{hidden},{nn}]" + (
        f", b: f32[{3 * nn}]" if bias else ""
    )
    bdecl = f"  %x = f32[{s},{hidden}]{{1,0}} parameter(0)\n  %W = f32[{3 * nn},{hidden}]{{1,0}} parameter(1)\n  %Wo = f32[{hidden},{nn}]{{1,0}} parameter(2)\n"
    if bias:
        bdecl += f"  %b = f32[{3 * nn}]{{0}} parameter(3)\n"
    if pick:
        # q, k and v each get their block of the fused bias after the cut.
        for i, name in enumerate("qkv"):
            bdecl += f"  %{name}bias = f32[{nn}]{{0}} slice(f32[{3 * nn}]{{0}} %b), slice={{[{i * nn}:{(i + 1) * nn}]}}\n"
    base = (
        f"HloModule padded_qkv_base\n\n{ADD}\nENTRY %main ({bparams}) -> f32[{s},{hidden}] {{\n{bdecl}"
        + _attention(
            n, hd, s, hidden, bias and not pick, (nn, nn, nn), (0, nn, 2 * nn), pick_bias=pick, split=variant in ("split", "split_whole")
        )
        + f"  ROOT %o = f32[{s},{hidden}]{{1,0}} dot(f32[{s},{nn}]{{1,0}} %c2, f32[{hidden},{nn}]{{1,0}} %Wo), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}\n}}\n"
    )
    groups = "{" + ",".join(map(str, range(c))) + "}"
    cut = (0, 2 * ww, ww) if variant == "swap_kv" else (0, ww, 2 * ww)
    fused = {"relation": "padded", "dim": 0, "blocks": [nn, nn, nn], "width": [ww, ww, ww]}
    if variant in ("whole_pad", "split_whole"):
        # The fused weight padded once at its tail (q, k, v, then the padding) and split over
        # the ranks, while the forward cuts each rank's piece per block: rank 0's k is q's
        # heads w..2w-1, and the padding lands in the last ranks' v.
        fused = {"relation": "padded", "dim": 0, "width": 3 * ww}
    if variant in ("leak", "bias_repeat"):
        # The fused weight as declared (zero padding); the fused bias whole, the rank's heads of
        # each block picked at rank·w + arange(w), clamped to the last head past the end; the
        # output projection zero-padded (bias_repeat) or picked the same way (leak).
        leak = variant == "leak"
        dparams = (
            f"x: f32[{s},{hidden}], W: f32[{3 * ww},{hidden}], "
            + (f"Wofull: f32[{hidden},{nn}]" if leak else f"Wo: f32[{hidden},{ww}]")
            + f", bfull: f32[{3 * nn}], r: s32[]"
        )
        ddecl = (
            f"  %x = f32[{s},{hidden}]{{1,0}} parameter(0)\n  %W = f32[{3 * ww},{hidden}]{{1,0}} parameter(1)\n"
            + (
                f"  %Wofull = f32[{hidden},{nn}]{{1,0}} parameter(2)\n"
                if leak
                else f"  %Wo = f32[{hidden},{ww}]{{1,0}} parameter(2)\n"
            )
            + f"  %bfull = f32[{3 * nn}]{{0}} parameter(3)\n  %r = s32[] parameter(4)\n"
            f"  %wr = s32[] constant({ww})\n  %rw = s32[] multiply(s32[] %r, s32[] %wr)\n"
            f"  %rb = s32[{ww}]{{0}} broadcast(s32[] %rw), dimensions={{}}\n  %io = s32[{ww}]{{0}} iota(), iota_dimension=0\n"
            f"  %ix = s32[{ww}]{{0}} add(s32[{ww}]{{0}} %rb, s32[{ww}]{{0}} %io)\n"
        )
        for i, name in enumerate("qkv"):
            ddecl += (
                f"  %{name}bs = f32[{nn}]{{0}} slice(f32[{3 * nn}]{{0}} %bfull), slice={{[{i * nn}:{(i + 1) * nn}]}}\n"
                f"  %{name}bias = f32[{ww}]{{0}} gather(f32[{nn}]{{0}} %{name}bs, s32[{ww}]{{0}} %ix), offset_dims={{}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, slice_sizes={{1}}\n"
            )
        if leak:
            ddecl += f"  %Wo = f32[{hidden},{ww}]{{1,0}} gather(f32[{hidden},{nn}]{{1,0}} %Wofull, s32[{ww}]{{0}} %ix), offset_dims={{0}}, collapsed_slice_dims={{1}}, start_index_map={{1}}, index_vector_dim=1, slice_sizes={{{hidden},1}}\n"
        inputs = [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, **fused},
            {
                "baseline": 2,
                "distributed": 2,
                **(
                    {"relation": "duplicate"}
                    if leak
                    else {"relation": "padded", "dim": 1, "width": ww}
                ),
            },
            {"baseline": 3, "distributed": 3, "relation": "duplicate"},
            {"distributed": 4, "relation": "rank"},
        ]
    else:
        dparams = f"x: f32[{s},{hidden}], W: f32[{3 * ww},{hidden}], Wo: f32[{hidden},{ww}]" + (
            f", b: f32[{3 * ww}]" if bias else ""
        )
        ddecl = f"  %x = f32[{s},{hidden}]{{1,0}} parameter(0)\n  %W = f32[{3 * ww},{hidden}]{{1,0}} parameter(1)\n  %Wo = f32[{hidden},{ww}]{{1,0}} parameter(2)\n"
        if bias:
            ddecl += f"  %b = f32[{3 * ww}]{{0}} parameter(3)\n"
        inputs = [
            {"baseline": 0, "distributed": 0, "relation": "duplicate"},
            {"baseline": 1, "distributed": 1, **fused},
            {"baseline": 2, "distributed": 2, "relation": "padded", "dim": 1, "width": ww},
        ]
        if bias:
            inputs.append(
                {
                    "baseline": 3,
                    "distributed": 3,
                    "relation": "padded",
                    "dim": 0,
                    "blocks": [nn, nn, nn],
                    "width": [ww, ww, ww],
                }
            )
    dist = (
        f"HloModule padded_qkv_dist\n\n{ADD}\nENTRY %main ({dparams}) -> f32[{s},{hidden}] {{\n{ddecl}"
        + _attention(
            w,
            hd,
            s,
            hidden,
            variant == "bias",
            (ww, ww, ww),
            cut,
            pick_bias=variant in ("leak", "bias_repeat"),
            split=variant in ("split", "split_whole"),
        )
        + f"  %o = f32[{s},{hidden}]{{1,0}} dot(f32[{s},{ww}]{{1,0}} %c2, f32[{hidden},{ww}]{{1,0}} %Wo), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}\n"
        + f"  ROOT %ar = f32[{s},{hidden}]{{1,0}} all-reduce(f32[{s},{hidden}]{{1,0}} %o), replica_groups={{{groups}}}, to_apply=%add\n}}\n"
    )
    rel = {
        "groups": [list(range(c))],
        "inputs": inputs,
        "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}],
    }
    return base, dist, rel
