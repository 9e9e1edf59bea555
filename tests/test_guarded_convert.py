"""Float->int converts whose out-of-range values a select drops (engine/analysis/ranges.py
guarded_fits_int; T5's relative-position buckets: log(0) = -inf where `where(is_small, rel,
large)` keeps rel). The convert is accepted only when every use reaches one guarding select's
branch element for element and, on the elements that branch keeps, its operand is in range;
anything else stays `unsupported` (implementation-defined values could be observed)."""

from __future__ import annotations

import pytest

from shardproof.engine.analysis.verify import verify
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.relations import parse_relations

REL = {"groups": [[0, 1, 2, 3]], "inputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0, "int_range": [0, 64]}],
       "outputs": [{"baseline": 0, "distributed": 0, "relation": "sharded", "dim": 0}]}


def _bucket(n: int, k: int, guard: str, keep: str = "false", extra: str = "", src: str = "%a") -> str:
    """rel -> where(rel < k, rel, min(2 + int(log(rel / 2) / log(8) * 2), 3)) on s64[n]."""
    t, p = f"s64[{n}]", f"pred[{n}]"
    pick = f"{p} %small, {t} %a, {t} %m" if keep == "false" else f"{p} %big, {t} %m, {t} %a"
    root = "%s" if not extra else "%t"
    return f"""HloModule bucket
ENTRY %main (x: s64[{n}]) -> s64[{n}] {{
  %x = s64[{n}] parameter(0)
  %a = s64[{n}] abs(s64[{n}] %x)
  %r = s64[{n}] reverse(s64[{n}] %a), dimensions={{0}}
  %f = f32[{n}] convert(s64[{n}] {src})
  %two = f32[] constant(2)
  %twos = f32[{n}] broadcast(f32[] %two), dimensions={{}}
  %d = f32[{n}] divide(f32[{n}] %f, f32[{n}] %twos)
  %l = f32[{n}] log(f32[{n}] %d)
  %lc = f32[] constant(2.07944155)
  %lcs = f32[{n}] broadcast(f32[] %lc), dimensions={{}}
  %q = f32[{n}] divide(f32[{n}] %l, f32[{n}] %lcs)
  %c = s64[{n}] convert(f32[{n}] %q)
  %three = s64[] constant(3)
  %threes = s64[{n}] broadcast(s64[] %three), dimensions={{}}
  %m = s64[{n}] minimum(s64[{n}] %c, s64[{n}] %threes)
  %k = s64[] constant({k})
  %ks = s64[{n}] broadcast(s64[] %k), dimensions={{}}
  %small = pred[{n}] compare(s64[{n}] %a, s64[{n}] %ks), direction={guard}
  %big = pred[{n}] compare(s64[{n}] %a, s64[{n}] %ks), direction=GE
  %s = s64[{n}] select({pick})
{extra}  ROOT %out = s64[{n}] copy(s64[{n}] {root})
}}
"""


def _verdict(text_b: str, text_d: str) -> tuple[str, str]:
    r = verify(parse_relations(REL, "relations.yaml"), parse_hlo(text_b, "baseline.hlo"), parse_hlo(text_d, "distributed.hlo"))
    return r.verdict, r.reason


@pytest.mark.parametrize("guard,keep", [("LT", "false"), ("LE", "false"), ("LT", "true")])
def test_guarded_convert_is_accepted(guard: str, keep: str) -> None:
    # the zeros (log -> -inf) sit where the guard keeps rel; keep="true" selects the convert's
    # branch where a >= 2 (the negated compare)
    verdict, reason = _verdict(_bucket(64, 2, guard, keep), _bucket(16, 2, guard, keep))
    assert verdict == "verified", reason


def test_guard_that_keeps_the_infinite_values_is_unsupported() -> None:
    # rel < 0 never holds for abs values: log(0) = -inf reaches the output's convert branch
    verdict, reason = _verdict(_bucket(64, 0, "LT"), _bucket(16, 0, "LT"))
    assert verdict == "unsupported" and "implementation-defined" in reason, reason


def test_convert_that_also_reaches_the_output_is_unsupported() -> None:
    extra = "  %t0 = s64[{n}] add(s64[{n}] %s, s64[{n}] %c)\n  %t = s64[{n}] copy(s64[{n}] %t0)\n"
    verdict, reason = _verdict(_bucket(64, 2, "LT", extra=extra.format(n=64)), _bucket(16, 2, "LT", extra=extra.format(n=16)))
    assert verdict == "unsupported", reason


def test_operand_not_elementwise_in_the_guarded_value_is_unsupported() -> None:
    # the log reads the reversed rel: its zeros are not where the guard looks
    verdict, reason = _verdict(_bucket(64, 2, "LT", src="%r"), _bucket(16, 2, "LT", src="%r"))
    assert verdict == "unsupported", reason
