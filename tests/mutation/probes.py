"""Small correct pairs that put *partial* values (sums and maxima spread over ranks) where twin
mutations can reach them, with inputs that take negative values on some ranks.

The torch-xla pairs reduce partial values right away, and the local maxima they form (over 16
values) are positive on every rank for any realistic input, so a rule that is only right for
non-negative partial values is never contradicted by the oracle there. These pairs make the
contradiction observable: the oracle feeds partial inputs whose pieces are random (the owner
rank holds the maximum, the others something lower, negative values included), and shards a
tensor so finely that a rank's local maximum is negative now and then.
"""

from __future__ import annotations

from .campaign import Pair

_REDUCER = """%{name} (a: {t}[], b: {t}[]) -> {t}[] {{
  %a = {t}[] parameter(0)
  %b = {t}[] parameter(1)
  ROOT %c = {t}[] {op}(%a, %b)
}}
"""


def _reducer(name: str, t: str, op: str) -> str:
    return _REDUCER.format(name=name, t=t, op=op)


def _partial_input(t: str, op: str) -> Pair:
    """x is partial(op) over 4 ranks; the baseline copies it, the rank all-reduces it."""
    hlo_op = {"add": "add", "max": "maximum"}[op]
    base = f"HloModule probe_base\nENTRY %main (x: {t}[8]) -> {t}[8] {{\n  %x = {t}[8] parameter(0)\n  ROOT %y = {t}[8] copy(%x)\n}}\n"
    dist = (
        f"HloModule probe_dist\n{_reducer('red', t, hlo_op)}\n"
        f"ENTRY %main (x: {t}[8]) -> {t}[8] {{\n  %x = {t}[8] parameter(0)\n  %y = {t}[8] copy(%x)\n"
        f"  ROOT %s = {t}[8] all-reduce(%y), replica_groups={{{{0,1,2,3}}}}, to_apply=%red\n}}\n"
    )
    entry = {"baseline": 0, "distributed": 0, "relation": "partial", "op": op}
    if t[0] in "su":
        entry["int_range"] = [-3, 3]
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [entry], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Pair(f"probe_partial_{op}_{t}", base, dist, rel)


def _sharded_reduce(op: str) -> Pair:
    """x f32[8,8] sharded along 1 (2 columns per rank); reduce(op) over dim 1: the rank reduces
    its 2 columns, then all-reduces. Local maxima of 2 normal values are negative 1/4 of the time."""
    hlo_op, init = {"add": ("add", "0"), "max": ("maximum", "-inf")}[op]

    def body(cols: int) -> str:
        return (
            f"  %x = f32[8,{cols}] parameter(0)\n  %z = f32[] constant({init})\n"
            "  %r = f32[8] reduce(%x, %z), dimensions={1}, to_apply=%red\n  %y = f32[8] copy(%r)\n"
        )

    base = f"HloModule probe_base\n{_reducer('red', 'f32', hlo_op)}\nENTRY %main (x: f32[8,8]) -> f32[8] {{\n{body(8)}  ROOT %o = f32[8] copy(%y)\n}}\n"
    dist = (
        f"HloModule probe_dist\n{_reducer('red', 'f32', hlo_op)}\nENTRY %main (x: f32[8,2]) -> f32[8] {{\n{body(2)}"
        "  ROOT %s = f32[8] all-reduce(%y), replica_groups={{0,1,2,3}}, to_apply=%red\n}\n"
    )
    rel = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 1}], "outputs": [{"baseline": 0, "distributed": 0, "relation": "duplicate"}]}
    return Pair(f"probe_sharded_reduce_{op}", base, dist, rel)


def probe_pairs() -> list[Pair]:
    return [
        _partial_input("f32", "add"), _partial_input("f32", "max"),
        _partial_input("s32", "add"), _partial_input("s32", "max"),
        _sharded_reduce("add"), _sharded_reduce("max"),
    ]  # fmt: skip
