"""Mesh replica groups against XLA itself, and the device id as the rank (hlo.rank) against
exhaustive ground truth, including the readings that must NOT become the rank."""

from __future__ import annotations

import numpy as np
import pytest

from shardproof.engine.hlo.flavours import flatten
from shardproof.engine.hlo.meshgroups import MeshGroupError, mesh_groups
from shardproof.engine.hlo.normalize import normalize
from shardproof.engine.hlo.parser import parse_hlo
from shardproof.engine.hlo.rank import bind_device_ids

MESHES = [
    # (mesh replica-group list, devices)
    ("mesh['axis_0'=1,'axis_1'=4] {'axis_1'}", 4),  # what jaxlib 0.10 prints for a 1x4 mesh
    ("mesh['a'=2,'b'=4] {'a'}", 8),
    ("mesh['a'=2,'b'=4] {'b'}", 8),
    ("mesh['a'=2,'b'=4] {'b','a'}", 8),
    ("mesh['a'=2,'b'=2,'c'=2] {'c','a'}", 8),
    ("mesh['a'=8] {'a':(2)2}", 8),
    ("mesh['a'=8] {'a':(1)2,'a':(4)2}", 8),
    ("mesh['a'=2,'b'=2] {'a','b'}", 4),
]


@pytest.mark.parametrize(("groups", "n"), MESHES)
def test_mesh_groups_are_the_groups_xla_runs(groups: str, n: int) -> None:
    """Each device all-gathers the replica ids of its group over XLA's CPU runtime: the result is
    its group, in XLA's order, which must be the group mesh_groups computes."""
    from shardproof.engine.witness import runtime

    mine = mesh_groups(groups)
    size = len(mine[0])
    hlo = f"""HloModule m, replica_count={n}

ENTRY e {{
  p = f32[] parameter(0)
  r = u32[] replica-id()
  b = u32[1] reshape(r)
  ROOT g = u32[{size}] all-gather(b), channel_id=1, replica_groups={groups}, use_global_device_ids=true, dimensions={{0}}
}}
"""
    # The text as written, not through runtime.read (which writes mesh lists out with
    # mesh_groups itself): a module of one mesh is one XLA's importer keeps intact.
    out = runtime.execute(hlo, [[np.float32(0)] * n], n)
    for d in range(n):
        (group,) = [g for g in mine if d in g]
        assert list(out[0][d]) == group, (d, list(out[0][d]), group)


def test_mesh_groups_with_a_device_order() -> None:
    """The device order is the mesh's device array (what JAX executes: checked against JAX's
    own runs in tests/test_witness_vs_jax.py)."""
    assert mesh_groups("mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2], device_ids=([2,2]T(1,0)) {'axis_2'}") == [[0, 1], [2, 3]]
    assert mesh_groups("mesh['axis_0'=1,'axis_1'=1,'axis_2'=2,'axis_3'=2] {'axis_2'}") == [[0, 2], [1, 3]]
    assert mesh_groups("mesh['a'=2,'b'=4], device_ids=(0,2,4,6,1,3,5,7) {'b'}") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert mesh_groups("mesh['a'=4], device_ids=([4]<=[2,2]T(1,0)) {'a'}") == [[0, 2, 1, 3]]


def test_parser_reads_mesh_groups_in_an_instruction() -> None:
    m = parse_hlo("""HloModule m, num_partitions=8

ENTRY e {
  p = f32[4] parameter(0)
  ROOT a = f32[4] all-reduce(p), channel_id=1, replica_groups=mesh['a'=2,'b'=4] {'a'}, use_global_device_ids=true, to_apply=add
}

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
""", "t.hlo")
    assert m.entry["a"].parsed["replica_groups"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("bad", ["mesh['a'=2] {'b'}", "mesh['a'=4] {'a':(2)4}", "mesh['a'=2,'a'=2] {'a'}",
                                 "mesh['a'=4], device_ids=(0,1,2,2) {'a'}", "mesh['a'=8] {'a','a':(2)2}",
                                 "mesh['a'=2,'b'=4] {}", "mesh['a'=4], device_ids=([2,3]T(1,0)) {'a'}",
                                 "mesh['a'=4], device_ids=(0,1,2,x) {'a'}"])
def test_bad_mesh_groups_are_errors(bad: str) -> None:
    with pytest.raises(MeshGroupError):
        mesh_groups(bad)


def _dist(body: str, extra: str = "") -> str:
    return f"""HloModule m, num_partitions=8

ENTRY e {{
  x = f32[8] parameter(0)
  pid = u32[] partition-id()
{body}
}}
{extra}"""


def _ranked(text: str, groups: list[list[int]]) -> tuple[set[str], dict[str, object]]:
    m = normalize(parse_hlo(text, "t.hlo"))
    ranks = bind_device_ids(m, groups)
    return ranks, {i.name: i for i in m.entry.instructions}


def test_jax_axis_index_is_the_rank_in_contiguous_groups() -> None:
    """axis_index('tp') on a (dp=2, tp=4) mesh: (pid / 1) % 4 is rank r of groups {0..3},{4..7}."""
    text = _dist("""  one = u32[] constant(1)
  four = u32[] constant(4)
  d = u32[] divide(pid, one)
  r = u32[] remainder(d, four)
  ai = s32[] convert(r)
  f = f32[] convert(ai)
  ROOT y = f32[8] broadcast(f), dimensions={}""")
    ranks, by = _ranked(text, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert ranks == {"rank.s32"}
    assert by["f"].operands == ["rank.s32"]


def test_group_index_is_not_the_rank() -> None:
    """axis_index('dp') = pid / 4 differs between the groups {0..3},{4..7} at the same rank: it
    is no function of the rank and must stay the (unrelated) device id."""
    text = _dist("""  four = u32[] constant(4)
  dp = u32[] divide(pid, four)
  ai = s32[] convert(dp)
  f = f32[] convert(ai)
  ROOT y = f32[8] broadcast(f), dimensions={}""")
    ranks, by = _ranked(text, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert ranks == set()
    assert by["ai"].opcode == "convert"


def test_strided_groups_make_the_rank_pid_div_stride() -> None:
    """Groups {0,2,4,6},{1,3,5,7} (the dp axis of a (dp=4, tp=2) mesh): rank r holds ids 2r and
    2r+1, so pid / 2 is the rank and pid % 4 is not."""
    text = _dist("""  two = u32[] constant(2)
  four = u32[] constant(4)
  a = u32[] divide(pid, two)
  b = u32[] remainder(pid, four)
  fa = f32[] convert(a)
  fb = f32[] convert(b)
  s = f32[] add(fa, fb)
  ROOT y = f32[8] broadcast(s), dimensions={}""")
    ranks, by = _ranked(text, [[0, 2, 4, 6], [1, 3, 5, 7]])
    assert ranks == {"rank.u32"}
    assert by["fa"].operands == ["rank.u32"] and by["fb"].operands == ["b"]


def test_partitioner_offset_table_becomes_affine_rank_arithmetic() -> None:
    """dynamic-slice(constant({0,2,4,6}), pid) is 2·r: written as rank × 2 (exact in s32)."""
    text = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[8] parameter(0)
  pid = u32[] partition-id()
  t = s32[4] constant({0, 2, 4, 6})
  s = s32[1] dynamic-slice(t, pid), dynamic_slice_sizes={1}
  o = s32[] reshape(s)
  ROOT y = f32[2] dynamic-slice(x, o), dynamic_slice_sizes={2}
}
"""
    ranks, by = _ranked(text, [[0, 1, 2, 3]])
    assert ranks == {"rank.s32"}
    assert by["o"].opcode == "multiply" and by["o"].operands[0] == "rank.s32"


def test_wrapping_arithmetic_is_evaluated_as_the_machine_does() -> None:
    """u32: 0 - pid wraps to 2^32 - pid; + pid·0 ... the value is exact machine arithmetic, so
    (0 - pid) + 5 is 5 - r (wrapping twice), never a wrong affine law."""
    text = _dist("""  z = u32[] constant(0)
  five = u32[] constant(5)
  n = u32[] subtract(z, pid)
  v = u32[] add(n, five)
  f = f32[] convert(v)
  ROOT y = f32[8] broadcast(f), dimensions={}""")
    _, by = _ranked(text, [[0, 1, 2, 3]])
    assert by["v"].opcode == "subtract" and by["v"].operands[1] == "rank.u32"
    # Beyond rank 5 the value wraps, so over 8 ranks it is not affine: left alone.
    _, by8 = _ranked(text, [list(range(8))])
    assert by8["v"].opcode == "add" and "rank.u32" not in by8


def test_pre_partitioning_custom_calls_are_refused() -> None:
    text = """HloModule m

ENTRY e {
  x = f32[8] parameter(0)
  ROOT s = f32[8] custom-call(x), custom_call_target="Sharding", sharding={devices=[4]<=[4]}
}
"""
    from shardproof.engine.errors import InputError

    with pytest.raises(InputError, match=r"GSPMD global program before SPMD partitioning.*compile\(\)\.as_text\(\)"):
        flatten(parse_hlo(text, "t.hlo"))


def test_cross_replica_and_partition_groups_span_all_partitions() -> None:
    """XLA: channel_id without use_global_device_ids on an all-reduce names replicas; with one
    replica each group spans every partition."""
    text = """HloModule m, num_partitions=4

ENTRY e {
  x = f32[8] parameter(0)
  ROOT a = f32[8] all-reduce(x), channel_id=1, replica_groups={{0}}, to_apply=add
}

add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}
"""
    m = flatten(parse_hlo(text, "t.hlo"))
    assert m.entry["a"].parsed["replica_groups"] == [[0, 1, 2, 3]]
    # Without channel_id it is cross-replica: a group of one partition, never read as {0}.
    m2 = flatten(parse_hlo(text.replace("channel_id=1, ", ""), "t.hlo"))
    assert m2.entry["a"].opcode == "all-reduce.cross-replica"



def test_loop_without_a_known_trip_count_stays_a_loop() -> None:
    """lax.while_loop on data: the condition is no constant, so nothing is unrolled (the loop is
    reported unsupported by the analysis, never guessed)."""
    text = """HloModule m

cond {
  s = (s32[], f32[4]) parameter(0)
  v = f32[4] get-tuple-element(s), index=1
  z = f32[] constant(0)
  r = f32[] reduce(v, z), dimensions={0}, to_apply=add
  lim = f32[] constant(100)
  ROOT c = pred[] compare(r, lim), direction=LT
}

body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  w = f32[4] add(v, v)
  ROOT t = (s32[], f32[4]) tuple(j, w)
}

add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT a = f32[] add(p, q)
}

ENTRY e {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[4]) tuple(zero, x)
  w = (s32[], f32[4]) while(t), condition=cond, body=body
  ROOT y = f32[4] get-tuple-element(w), index=1
}
"""
    m = flatten(parse_hlo(text, "t.hlo"))
    assert [i.opcode for i in m.entry.instructions].count("while") == 1
    # With a counter condition it unrolls: the same loop, 3 trips.
    counted = text.replace("  r = f32[] reduce(v, z), dimensions={0}, to_apply=add\n  lim = f32[] constant(100)\n  ROOT c = pred[] compare(r, lim), direction=LT",
                           "  i = s32[] get-tuple-element(s), index=0\n  lim = s32[] constant(3)\n  ROOT c = pred[] compare(i, lim), direction=LT")
    m3 = flatten(parse_hlo(counted, "t.hlo"))
    ops = [i.opcode for i in m3.entry.instructions]
    assert "while" not in ops and sum(1 for i in m3.entry.instructions if i.opcode == "add" and i.shape.dims == (4,)) == 3


@pytest.mark.parametrize(("edit", "message"), [
    (("fusion(x, x)", "fusion(x)"), "passes 1 operand"),
    (("p1 = f32[4] parameter(1)", "p1 = f32[5] parameter(1)"), "as parameter 1"),
    (("index=1", "index=2"), "takes index 2"),
])
def test_inlined_bodies_are_checked_like_xla_checks_them(edit: tuple[str, str], message: str) -> None:
    """A call whose operands do not fit its callee, or a get-tuple-element past its tuple, is bad
    input at the caller's line (found by fuzzing the flattener), never a crash."""
    from shardproof.engine.errors import HloParseError

    text = """HloModule m

f {
  p0 = f32[4] parameter(0)
  p1 = f32[4] parameter(1)
  ROOT t = (f32[4], f32[4]) tuple(p0, p1)
}

ENTRY e {
  x = f32[4] parameter(0)
  c = (f32[4], f32[4]) fusion(x, x), kind=kLoop, calls=f
  ROOT y = f32[4] get-tuple-element(c), index=1
}
"""
    flatten(parse_hlo(text, "t.hlo"))  # the unedited text is fine
    with pytest.raises(HloParseError, match=message) as e:
        flatten(parse_hlo(text.replace(*edit), "t.hlo"))
    assert e.value.where.startswith(("11:", "12:"))
